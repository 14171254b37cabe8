//! Logging: tracing-subscriber on standard error, text by default, or one JSON object a
//! line with the event's fields at the top level (`record`, `route`, `principal`,
//! `status`, `attempt`, `workflow_id`, `upstream_status`, `provider_request_id`,
//! `duration_ms`). `RUST_LOG` filters as usual (default `info`).
//!
//! In JSON, the one line per guarded request (target `oncely::request`) carries every one
//! of those keys, `null` when the request has no such value (tracing leaves an absent
//! `Option` out), so a reader can rely on each key being there.
//!
//! Lines are written by a background thread (`tracing-appender`'s non-blocking writer,
//! not lossy: a full buffer makes the logging call wait rather than drop the line), so a
//! request never waits on standard error. [`init`] returns the [`LogGuard`] that flushes
//! every buffered line when dropped; keep it for the life of the process.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, JsonFields, Writer};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// The target of the per-request log line (`oncely_http::request_log`'s).
const REQUEST_TARGET: &str = oncely_http::request_log::TARGET;

/// The keys every JSON request line carries.
pub const REQUEST_FIELDS: [&str; 9] = oncely_http::request_log::FIELDS;

/// Flushes the buffered log lines when dropped (see [`init`]).
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard(#[allow(dead_code)] Option<tracing_appender::non_blocking::WorkerGuard>);

impl fmt::Debug for LogGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogGuard").finish_non_exhaustive()
    }
}

/// Installs the global subscriber, writing through a non-blocking buffer; a second call
/// (tests) is a no-op. Keep the returned guard until the process ends: dropping it writes
/// every line still buffered.
pub fn init(format: LogFormat) -> LogGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let (writer, worker) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("oncely-log")
        .finish(std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    let installed = match format {
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
    LogGuard(installed.is_ok().then_some(worker))
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
///
/// Done on the text, without parsing: in the formatter's output a `"key":` can only be a
/// key (a quote inside a string value is escaped), and the event's fields are at the top
/// level, so the absent keys are appended before the closing brace.
fn complete(line: &str) -> Option<String> {
    let object = line.trim_end();
    let inner = object.strip_prefix('{')?.strip_suffix('}')?;
    let mut done = String::with_capacity(object.len() + 64);
    done.push('{');
    done.push_str(inner);
    let mut empty = inner.trim().is_empty();
    for key in REQUEST_FIELDS {
        let present = {
            let mut pattern = [0u8; 32];
            let needle = format_key(key, &mut pattern);
            inner.contains(needle)
        };
        if !present {
            if !empty {
                done.push(',');
            }
            done.push('"');
            done.push_str(key);
            done.push_str("\":null");
            empty = false;
        }
    }
    done.push('}');
    Some(done)
}

/// `"key":` in `buf`, without allocating.
fn format_key<'a>(key: &str, buf: &'a mut [u8; 32]) -> &'a str {
    let n = key.len();
    buf[0] = b'"';
    buf[1..=n].copy_from_slice(key.as_bytes());
    buf[n + 1] = b'"';
    buf[n + 2] = b':';
    std::str::from_utf8(&buf[..n + 3]).expect("ASCII keys")
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

        // A value that spells a key does not count as the key.
        let tricky = r#"{"route":"a\"record\":b","record":"rec_1"}"#;
        let done: serde_json::Value = serde_json::from_str(&complete(tricky).unwrap()).unwrap();
        assert_eq!(done["record"], "rec_1");
        assert_eq!(done["route"], "a\"record\":b");
        assert_eq!(done["attempt"], serde_json::Value::Null);
        let tricky = r#"{"route":"a\"attempt\":1"}"#;
        let done: serde_json::Value = serde_json::from_str(&complete(tricky).unwrap()).unwrap();
        assert_eq!(done["attempt"], serde_json::Value::Null);
        assert_eq!(done.as_object().unwrap().len(), REQUEST_FIELDS.len());
    }
}
