//! Logging: tracing-subscriber on standard error, text by default, or one JSON object a
//! line with the event's fields at the top level (`record`, `route`, `principal`,
//! `status`, `attempt`, `workflow_id`, `upstream_status`, `provider_request_id`,
//! `duration_ms`). `RUST_LOG` filters as usual (default `info`).
//!
//! In JSON, the one line per guarded request (target `oncely::request`) carries every one
//! of those keys, `null` when the request has no such value (tracing leaves an absent
//! `Option` out), so a reader can rely on each key being there. That line is written by
//! `request_line` straight into the output buffer (it is the one line per request, and
//! the general JSON formatter was a tenth of a replay's CPU); every other event goes
//! through tracing-subscriber's JSON format. In text, the request line is written by
//! `text_request_line`, byte for byte tracing-subscriber's `Full` line at two thirds of
//! its cost; every other event goes through that format.
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

use clap::ValueEnum;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

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
        LogFormat::Text => builder
            .with_ansi(false)
            .event_format(RequestLines::text(
                tracing_subscriber::fmt::format().with_ansi(false),
            ))
            .try_init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(RequestLines::json(
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

/// An event format that writes the one request line (target `oncely::request`) itself,
/// with `line` ([`request_line`] in JSON, [`text_request_line`] in text), and every
/// other event with tracing-subscriber's format `inner`. The general formatters cost a
/// tenth of a replay's CPU (JSON), or half again the direct line (text).
struct RequestLines<F> {
    inner: F,
    line: fn(&mut Writer<'_>, std::time::SystemTime, &Event<'_>) -> fmt::Result,
    /// Inside a span, the text format writes the span's context first: such a line is
    /// left to `inner` (the JSON format here writes no span).
    spans_to_inner: bool,
}

impl<F> RequestLines<F> {
    /// JSON: request lines complete with `null` for their absent keys.
    fn json(inner: F) -> RequestLines<F> {
        RequestLines {
            inner,
            line: |w, now, e| request_line(w, now, e),
            spans_to_inner: false,
        }
    }

    /// Text: request lines byte for byte tracing-subscriber's `Full` line.
    fn text(inner: F) -> RequestLines<F> {
        RequestLines {
            inner,
            line: |w, now, e| text_request_line(w, now, e),
            spans_to_inner: true,
        }
    }
}

impl<S, N, F> FormatEvent<S, N> for RequestLines<F>
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
        let in_span = self.spans_to_inner && ctx.lookup_current().is_some();
        if event.metadata().target() != REQUEST_TARGET || in_span {
            return self.inner.format_event(ctx, writer, event);
        }
        (self.line)(&mut writer, std::time::SystemTime::now(), event)
    }
}

/// Writes the text line of a request event exactly as tracing-subscriber's `Full` format
/// does without colours: the timestamp, the level padded to 5, the target, then the
/// message and `name=value` for each field as they come, values as `Debug` writes them.
fn text_request_line(
    out: &mut impl fmt::Write,
    now: std::time::SystemTime,
    event: &Event<'_>,
) -> fmt::Result {
    rfc3339_micros(out, now)?;
    write!(out, " {:>5} {REQUEST_TARGET}: ", event.metadata().level())?;
    let mut fields = TextVisitor {
        out: &mut *out,
        first: true,
        result: Ok(()),
    };
    event.record(&mut fields);
    fields.result?;
    out.write_str("\n")
}

/// Writes each field as tracing-subscriber's default visitor does: the message alone,
/// every other field as `name=value` (`Debug`), separated by one space.
struct TextVisitor<'a, W> {
    out: &'a mut W,
    first: bool,
    result: fmt::Result,
}

impl<W: fmt::Write> TextVisitor<'_, W> {
    fn padded(&mut self, args: fmt::Arguments<'_>) {
        if self.result.is_ok() {
            let pad = if std::mem::take(&mut self.first) {
                ""
            } else {
                " "
            };
            self.result = self
                .out
                .write_str(pad)
                .and_then(|()| self.out.write_fmt(args));
        }
    }
}

impl<W: fmt::Write> tracing::field::Visit for TextVisitor<'_, W> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.padded(format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        let name = field.name();
        if name == "message" {
            self.padded(format_args!("{value:?}"));
        } else if !name.starts_with("log.") {
            let name = name.strip_prefix("r#").unwrap_or(name);
            self.padded(format_args!("{name}={value:?}"));
        }
    }
}

/// Writes the JSON line of a request event: `timestamp`, `level`, the event's fields as
/// they come (`message` and those of [`REQUEST_FIELDS`] it has), every absent one of
/// [`REQUEST_FIELDS`] as `null`, and `target`; the same object tracing-subscriber's JSON
/// format and [`complete`] made, without building it twice.
fn request_line(
    out: &mut impl fmt::Write,
    now: std::time::SystemTime,
    event: &Event<'_>,
) -> fmt::Result {
    out.write_str("{\"timestamp\":\"")?;
    rfc3339_micros(out, now)?;
    write!(out, "\",\"level\":\"{}\"", event.metadata().level())?;
    let mut fields = JsonVisitor {
        out: &mut *out,
        seen: 0,
        result: Ok(()),
    };
    event.record(&mut fields);
    let (seen, result) = (fields.seen, fields.result);
    result?;
    write!(out, ",\"target\":\"{REQUEST_TARGET}\"")?;
    for (i, key) in REQUEST_FIELDS.iter().enumerate() {
        if seen & (1 << i) == 0 {
            write!(out, ",\"{key}\":null")?;
        }
    }
    out.write_str("}\n")
}

/// Writes each field as `,"name":value`, noting which of [`REQUEST_FIELDS`] it saw.
struct JsonVisitor<'a, W> {
    out: &'a mut W,
    seen: u16,
    result: fmt::Result,
}

impl<W: fmt::Write> JsonVisitor<'_, W> {
    fn key(&mut self, field: &tracing::field::Field) -> fmt::Result {
        if let Some(i) = REQUEST_FIELDS.iter().position(|k| *k == field.name()) {
            self.seen |= 1 << i;
        }
        self.out.write_str(",\"")?;
        self.out.write_str(field.name())?;
        self.out.write_str("\":")
    }

    fn value(&mut self, field: &tracing::field::Field, write: impl FnOnce(&mut W) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = self.key(field).and_then(|()| write(self.out));
        }
    }
}

impl<W: fmt::Write> tracing::field::Visit for JsonVisitor<'_, W> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.value(field, |out| json_string(out, format_args!("{value}")));
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.value(field, |out| write!(out, "{value}"));
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.value(field, |out| write!(out, "{value}"));
    }

    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.value(field, |out| write!(out, "{value}"));
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        self.value(field, |out| json_string(out, format_args!("{value:?}")));
    }
}

/// Writes `text` as a JSON string, escaped as serde_json does.
fn json_string(out: &mut impl fmt::Write, text: fmt::Arguments<'_>) -> fmt::Result {
    struct Escaped<'a, W>(&'a mut W);
    impl<W: fmt::Write> fmt::Write for Escaped<'_, W> {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            let mut plain = 0;
            for (i, b) in s.bytes().enumerate() {
                let escape = match b {
                    b'"' => "\\\"",
                    b'\\' => "\\\\",
                    b'\n' => "\\n",
                    b'\r' => "\\r",
                    b'\t' => "\\t",
                    0x08 => "\\b",
                    0x0c => "\\f",
                    0..=0x1f => "",
                    _ => continue,
                };
                self.0.write_str(&s[plain..i])?;
                if escape.is_empty() {
                    write!(self.0, "\\u{b:04x}")?;
                } else {
                    self.0.write_str(escape)?;
                }
                plain = i + 1;
            }
            self.0.write_str(&s[plain..])
        }
    }
    out.write_char('"')?;
    fmt::write(&mut Escaped(&mut *out), text)?;
    out.write_char('"')
}

/// `2026-12-01T10:45:19.146343Z`: UTC, microseconds, as tracing-subscriber writes it.
fn rfc3339_micros(out: &mut impl fmt::Write, at: std::time::SystemTime) -> fmt::Result {
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        day_secs / 3600,
        day_secs / 60 % 60,
        day_secs % 60,
        since.subsec_micros()
    )
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    /// Lines written by a subscriber with the gateway's JSON format.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Runs `emit` under the gateway's JSON format; returns each line parsed.
    fn json_lines(emit: impl FnOnce()) -> Vec<serde_json::Value> {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .fmt_fields(JsonFields::new())
            .event_format(RequestLines::json(
                tracing_subscriber::fmt::format()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(false),
            ))
            .finish();
        tracing::subscriber::with_default(subscriber, emit);
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }

    #[test]
    fn a_request_line_has_every_key_with_values_escaped_as_json() {
        let route = "POST /v1/\"quoted\"\\path\n\u{1}é";
        let lines = json_lines(|| {
            tracing::info!(
                target: "oncely::request",
                record = Some("rec_1"),
                route,
                principal = None::<&str>,
                status = "fresh",
                attempt = Some(2u32),
                workflow_id = None::<&str>,
                upstream_status = Some(201u16),
                provider_request_id = None::<&str>,
                duration_ms = 7u64,
                "{}",
                "guarded request"
            );
            tracing::info!(target: "oncely::request", status = "replayed", "guarded request");
            tracing::info!(target: "oncely::serve", port = 1, "another line");
        });
        assert_eq!(lines.len(), 3);
        let full = &lines[0];
        assert_eq!(full["record"], "rec_1");
        assert_eq!(full["route"], route);
        assert_eq!(full["status"], "fresh");
        assert_eq!(full["attempt"], 2);
        assert_eq!(full["upstream_status"], 201);
        assert_eq!(full["duration_ms"], 7);
        assert_eq!(full["principal"], serde_json::Value::Null);
        assert_eq!(full["message"], "guarded request");
        assert_eq!(full["level"], "INFO");
        assert_eq!(full["target"], "oncely::request");
        let stamp = full["timestamp"].as_str().unwrap();
        assert_eq!(stamp.len(), "2026-12-01T10:45:19.146343Z".len(), "{stamp}");
        assert_eq!(full.as_object().unwrap().len(), REQUEST_FIELDS.len() + 4);

        // Absent keys are there, as null.
        let short = &lines[1];
        assert_eq!(short["status"], "replayed");
        for key in REQUEST_FIELDS {
            assert!(short.get(key).is_some(), "{key}");
        }
        assert_eq!(short["record"], serde_json::Value::Null);
        assert_eq!(short.as_object().unwrap().len(), REQUEST_FIELDS.len() + 4);

        // Other lines keep tracing-subscriber's format, without the request keys.
        assert_eq!(lines[2]["message"], "another line");
        assert_eq!(lines[2]["port"], 1);
        assert!(lines[2].get("record").is_none());
    }

    /// Runs `emit` under tracing-subscriber's own text format and under the gateway's;
    /// returns both outputs' lines, each without its timestamp.
    fn text_lines(emit: impl Fn()) -> (Vec<String>, Vec<String>) {
        let run = |ours: bool| {
            let lines = Lines::default();
            let writer = lines.clone();
            let builder = tracing_subscriber::fmt()
                .with_writer(move || writer.clone())
                .with_ansi(false);
            if ours {
                let subscriber = builder
                    .event_format(RequestLines::text(
                        tracing_subscriber::fmt::format().with_ansi(false),
                    ))
                    .finish();
                tracing::subscriber::with_default(subscriber, &emit);
            } else {
                tracing::subscriber::with_default(builder.finish(), &emit);
            }
            let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
            text.lines()
                .map(|l| {
                    let (stamp, rest) = l.split_once(' ').unwrap_or_default();
                    assert_eq!(stamp.len(), "2026-12-01T10:45:19.146343Z".len(), "{l}");
                    assert!(stamp.ends_with('Z') && stamp.as_bytes()[10] == b'T', "{l}");
                    rest.to_owned()
                })
                .collect::<Vec<_>>()
        };
        (run(false), run(true))
    }

    #[test]
    fn the_text_request_line_is_tracing_subscribers_own() {
        let route = "POST /v1/\"quoted\"\\path\n\u{1}é";
        let (theirs, ours) = text_lines(|| {
            tracing::info!(
                target: "oncely::request",
                record = Some("rec_1"),
                route,
                principal = None::<&str>,
                status = "fresh",
                attempt = Some(2u32),
                upstream_status = Some(201u16),
                duration_ms = 7u64,
                hit = true,
                "{}",
                "guarded request"
            );
            tracing::warn!(target: "oncely::request", status = "replayed", "mcp tools/call");
            tracing::info!(target: "oncely::serve", port = 1, "another line");
            let span = tracing::info_span!("inside", n = 1);
            let _entered = span.enter();
            tracing::info!(target: "oncely::request", status = "fresh", "in a span");
        });
        assert_eq!(theirs.len(), 4);
        assert_eq!(ours, theirs);
    }

    #[test]
    fn timestamps_are_utc_with_microseconds() {
        let at = |secs: u64, micros: u64| {
            let mut s = String::new();
            rfc3339_micros(
                &mut s,
                UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros),
            )
            .unwrap();
            s
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.000005Z");
        assert_eq!(at(1_709_164_799, 999_999), "2024-02-28T23:59:59.999999Z");
        assert_eq!(at(1_796_121_919, 146_343), "2026-12-01T10:45:19.146343Z");
        assert_eq!(at(4_102_444_799, 0), "2099-12-31T23:59:59.000000Z");
    }
}
