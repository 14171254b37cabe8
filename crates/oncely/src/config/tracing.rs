//! The `[tracing]` section: OpenTelemetry traces over OTLP/HTTP (protobuf). Off unless
//! the section is there.
//!
//! ```toml
//! [tracing]
//! otlp_endpoint = "http://127.0.0.1:4318"  # required; spans are POSTed to ENDPOINT/v1/traces
//! service_name = "oncely"                  # the resource's service.name
//! sample_ratio = 1.0                       # of new traces (a caller's sampled flag is kept)
//! headers = { "x-team" = "edge" }          # sent with every export
//! headers_env = "OTLP_HEADERS"      # more, from the environment: name=value,name=value
//! max_queue = 2048                         # spans waiting for export; more are dropped
//! max_batch = 512                          # spans per export request
//! schedule_delay = "5s"                    # how often waiting spans are sent
//! export_timeout = "10s"                   # one export request's limit
//! ```

use std::time::Duration;

use http::{HeaderName, HeaderValue, Uri};
use toml::Table;

use super::read::{self, at, Mistakes};

/// The validated `[tracing]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tracing {
    /// Where spans are POSTed: the configured endpoint with `/v1/traces` appended (unless
    /// it already ends so).
    pub traces_url: Uri,
    /// The resource's `service.name`.
    pub service_name: String,
    /// The share of new traces that are sampled, in millionths (1.0 = 1_000_000).
    pub sample_millionths: u32,
    /// Headers sent with every export request.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The environment variable holding more headers (`name=value,name=value`, as
    /// `OTEL_EXPORTER_OTLP_HEADERS`), for secrets such as API keys; read when `serve`
    /// starts.
    pub headers_env: Option<String>,
    /// Most spans waiting for export; a span that finds the queue full is dropped.
    pub max_queue: usize,
    /// Most spans in one export request.
    pub max_batch: usize,
    /// How often waiting spans are sent (sooner when a batch is full).
    pub schedule_delay: Duration,
    /// One export request's time limit.
    pub export_timeout: Duration,
}

impl Tracing {
    /// The sample ratio, 0 to 1.
    pub fn sample_ratio(&self) -> f64 {
        f64::from(self.sample_millionths) / 1_000_000.0
    }
}

const KEYS: &[&str] = &[
    "otlp_endpoint",
    "service_name",
    "sample_ratio",
    "headers",
    "headers_env",
    "max_queue",
    "max_batch",
    "schedule_delay",
    "export_timeout",
];

/// The default `service_name`.
pub const DEFAULT_SERVICE_NAME: &str = "oncely";

/// Reads `[tracing]`, or `None` when it is absent or has problems (each reported).
pub(crate) fn section(table: &Table, p: &mut Mistakes) -> Option<Tracing> {
    let loc = "tracing";
    let t = read::table(table, "", loc, p)?;
    read::unknown_keys(t, loc, KEYS, p);
    let mut ok = true;

    let traces_url = match read::string(t, loc, "otlp_endpoint", p) {
        Some(text) => match traces_url(text) {
            Ok(u) => Some(u),
            Err(e) => {
                p.add(at(loc, "otlp_endpoint"), e);
                None
            }
        },
        None => {
            if !t.contains_key("otlp_endpoint") {
                p.add(
                    at(loc, "otlp_endpoint"),
                    "missing (e.g. otlp_endpoint = \"http://127.0.0.1:4318\")",
                );
            }
            None
        }
    };

    let service_name = read::string(t, loc, "service_name", p)
        .unwrap_or(DEFAULT_SERVICE_NAME)
        .to_string();
    if service_name.trim().is_empty() {
        p.add(at(loc, "service_name"), "is empty");
        ok = false;
    }

    let sample_millionths = match t.get("sample_ratio") {
        None => 1_000_000,
        Some(v) => {
            let ratio = match v {
                toml::Value::Float(f) => Some(*f),
                toml::Value::Integer(i) => Some(*i as f64),
                _ => None,
            };
            match ratio {
                Some(r) if (0.0..=1.0).contains(&r) => (r * 1_000_000.0).round() as u32,
                _ => {
                    p.add(
                        at(loc, "sample_ratio"),
                        "must be a number from 0 to 1 (e.g. 0.25)",
                    );
                    ok = false;
                    0
                }
            }
        }
    };

    let mut headers = Vec::new();
    if let Some(h) = read::table(t, loc, "headers", p) {
        for (name, value) in h {
            let here = format!("{loc}.headers.{name}");
            let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
                p.add(here, "not a valid header name");
                ok = false;
                continue;
            };
            let value = match value.as_str().map(HeaderValue::from_str) {
                Some(Ok(v)) => v,
                _ => {
                    p.add(here, "must be a string that is a valid header value");
                    ok = false;
                    continue;
                }
            };
            headers.push((name, value));
        }
    }

    let headers_env = read::string(t, loc, "headers_env", p).map(str::to_string);
    if let Some(Err(e)) = headers_env.as_deref().map(super::values::env_name) {
        p.add(at(loc, "headers_env"), e);
        ok = false;
    }

    let count = |key: &str, default: usize, p: &mut Mistakes| -> Option<usize> {
        match read::integer(t, loc, key, p) {
            None if t.contains_key(key) => None,
            None => Some(default),
            Some(0) => {
                p.add(at(loc, key), "must be at least 1");
                None
            }
            Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        }
    };
    let max_queue = count("max_queue", 2048, p);
    let max_batch = count("max_batch", 512, p);
    let duration = |key: &str, default: Duration, p: &mut Mistakes| -> Option<Duration> {
        match read::duration(t, loc, key, p) {
            None if t.contains_key(key) => None,
            None => Some(default),
            Some(d) if d.is_zero() => {
                p.add(at(loc, key), "must be longer than 0");
                None
            }
            Some(d) => Some(d),
        }
    };
    let schedule_delay = duration("schedule_delay", Duration::from_secs(5), p);
    let export_timeout = duration("export_timeout", Duration::from_secs(10), p);

    if !ok {
        return None;
    }
    Some(Tracing {
        traces_url: traces_url?,
        service_name,
        sample_millionths,
        headers,
        headers_env,
        max_queue: max_queue?,
        max_batch: max_batch?,
        schedule_delay: schedule_delay?,
        export_timeout: export_timeout?,
    })
}

impl Tracing {
    /// Every header an export sends: `headers`, then those of `headers_env` (which must
    /// be set). The error names the variable, never its value.
    pub fn export_headers(&self) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
        let mut all = self.headers.clone();
        let Some(var) = &self.headers_env else {
            return Ok(all);
        };
        let text = std::env::var(var)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| format!("tracing.headers_env: ${var} is not set"))?;
        for (i, pair) in text.split(',').enumerate() {
            let pair = pair.trim();
            if pair.is_empty() {
                continue;
            }
            let bad = || {
                format!(
                    "tracing.headers_env: entry {} of ${var} is not name=value with a valid header name and value",
                    i + 1
                )
            };
            let (name, value) = pair.split_once('=').ok_or_else(bad)?;
            let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| bad())?;
            let value = HeaderValue::from_str(value.trim()).map_err(|_| bad())?;
            all.push((name, value));
        }
        Ok(all)
    }
}

/// `ENDPOINT/v1/traces` (or the endpoint itself when it already ends so): an absolute
/// `http` or `https` URL with a host, no query or fragment.
fn traces_url(text: &str) -> Result<Uri, String> {
    let uri: Uri = text
        .parse()
        .map_err(|e| format!("not a URL ({e}): use e.g. \"http://127.0.0.1:4318\""))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => {
            return Err(format!(
                "{text:?} must start with http:// or https:// (OTLP over HTTP)"
            ))
        }
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{text:?} has no host"));
    }
    if uri.query().is_some() || text.contains('#') {
        return Err(format!("{text:?}: a query or fragment is not allowed"));
    }
    let path = uri.path().trim_end_matches('/');
    let path = if path.ends_with("/v1/traces") {
        path.to_string()
    } else {
        format!("{path}/v1/traces")
    };
    let mut parts = uri.into_parts();
    parts.path_and_query = Some(path.parse().map_err(|e| format!("{text:?}: {e}"))?);
    Uri::from_parts(parts).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Option<Tracing>, Vec<String>> {
        let table: Table = text.parse().unwrap();
        let mut p = Mistakes::default();
        let t = section(&table, &mut p);
        if p.0.is_empty() {
            Ok(t)
        } else {
            Err(p.0.iter().map(ToString::to_string).collect())
        }
    }

    #[test]
    fn absent_is_off_and_defaults_apply() {
        assert_eq!(read("").unwrap(), None);
        let t = read("[tracing]\notlp_endpoint = \"http://127.0.0.1:4318\"\n")
            .unwrap()
            .unwrap();
        assert_eq!(t.traces_url, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(t.service_name, "oncely");
        assert_eq!(t.sample_ratio(), 1.0);
        assert_eq!((t.max_queue, t.max_batch), (2048, 512));
        assert_eq!(t.schedule_delay, Duration::from_secs(5));
        assert_eq!(t.export_timeout, Duration::from_secs(10));
    }

    #[test]
    fn every_field_is_read() {
        let t = read(
            r#"[tracing]
otlp_endpoint = "https://otel.example/prefix/"
service_name = "edge"
sample_ratio = 0.25
headers = { "x-api-key" = "k1" }
headers_env = "TRACES_TEST_HEADERS"
max_queue = 10
max_batch = 5
schedule_delay = "100ms"
export_timeout = "2s"
"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.traces_url, "https://otel.example/prefix/v1/traces");
        assert_eq!(t.service_name, "edge");
        assert_eq!(t.sample_ratio(), 0.25);
        assert_eq!(t.headers.len(), 1);
        assert_eq!(t.headers[0].0, "x-api-key");
        assert_eq!(t.headers_env.as_deref(), Some("TRACES_TEST_HEADERS"));
        // The variable is read when the exporter starts; unset, it is an error.
        assert_eq!(
            t.export_headers().unwrap_err(),
            "tracing.headers_env: $TRACES_TEST_HEADERS is not set"
        );
        assert_eq!((t.max_queue, t.max_batch), (10, 5));
        assert_eq!(t.schedule_delay, Duration::from_millis(100));
        let t = read("[tracing]\notlp_endpoint = \"http://c:4318/v1/traces\"\n")
            .unwrap()
            .unwrap();
        assert_eq!(t.traces_url, "http://c:4318/v1/traces");
    }

    #[test]
    fn bad_values_are_reported_each_with_its_place() {
        let problems = read(
            r#"[tracing]
otlp_endpoint = "grpc://127.0.0.1:4317"
sample_ratio = 1.5
headers = { "bad header" = "x" }
max_queue = 0
headers_env = "not a name"
schedule_delay = "soon"
colour = "blue"
"#,
        )
        .unwrap_err();
        for needle in [
            "tracing.otlp_endpoint: \"grpc://127.0.0.1:4317\" must start with http://",
            "tracing.sample_ratio: must be a number from 0 to 1",
            "tracing.headers.bad header: not a valid header name",
            "tracing.max_queue: must be at least 1",
            "tracing.headers_env: \"not a name\" is not an environment variable name",
            "tracing.schedule_delay",
            "tracing.colour: unknown key",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(needle)),
                "{needle:?} not in {problems:#?}"
            );
        }
        let missing = read("[tracing]\nservice_name = \"x\"\n").unwrap_err();
        assert!(missing[0].starts_with("tracing.otlp_endpoint: missing"));
        for bad in ["not a url", "http://", "http://h:4318/?x=1", "/v1/traces"] {
            let text = format!("[tracing]\notlp_endpoint = {bad:?}\n");
            assert!(read(&text).is_err(), "{bad}");
        }
    }
}
