//! Logging: tracing-subscriber on standard error, text by default, or one JSON object a
//! line with the event's fields at the top level (`record`, `route`, `principal`,
//! `status`, `attempt`, `workflow_id`, `upstream_status`, `provider_request_id`,
//! `duration_ms`). `RUST_LOG` filters as usual (default `info`).
//!
//! In JSON, the one line per guarded request (target `oncely::request`) carries every one
//! of those keys, `null` when the request has no such value (tracing leaves an absent
//! `Option` out), so a reader can rely on each key being there.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, JsonFields, Writer};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// The target of the per-request log line (oncely-tower's).
const REQUEST_TARGET: &str = "oncely::request";

/// The keys every JSON request line carries.
pub const REQUEST_FIELDS: [&str; 9] = [
    "record",
    "route",
    "principal",
    "status",
    "attempt",
    "workflow_id",
    "upstream_status",
    "provider_request_id",
    "duration_ms",
];

/// Installs the global subscriber; a second call (tests) is a no-op.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(CompleteRequestLines(
                tracing_subscriber::fmt::format()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(false),
            ))
            .try_init(),
    };
}

/// A JSON event format that completes request lines with `null` for their absent keys.
struct CompleteRequestLines<F>(F);

impl<S, N, F> FormatEvent<S, N> for CompleteRequestLines<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if event.metadata().target() != REQUEST_TARGET {
            return self.0.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        match complete(&line) {
            Some(done) => writeln!(writer, "{done}"),
            None => writer.write_str(&line),
        }
    }
}

/// The JSON object on `line` with every [`REQUEST_FIELDS`] key (absent ones `null`), or
/// `None` when the line is not a JSON object.
fn complete(line: &str) -> Option<String> {
    let mut object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(line.trim_end()).ok()?;
    for key in REQUEST_FIELDS {
        object
            .entry(key.to_owned())
            .or_insert(serde_json::Value::Null);
    }
    Some(serde_json::Value::Object(object).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_request_fields_become_null_and_present_ones_stay() {
        let line = r#"{"message":"guarded request","status":"fresh","attempt":2}"#;
        let done: serde_json::Value = serde_json::from_str(&complete(line).unwrap()).unwrap();
        assert_eq!(done["attempt"], 2);
        assert_eq!(done["status"], "fresh");
        assert_eq!(done["message"], "guarded request");
        for key in REQUEST_FIELDS {
            assert!(done.get(key).is_some(), "{key}");
        }
        assert_eq!(done["workflow_id"], serde_json::Value::Null);
        assert!(complete("not json\n").is_none());
    }
}
