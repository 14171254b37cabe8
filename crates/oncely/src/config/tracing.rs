//! The `[tracing]` section: what the file says about OpenTelemetry export. Every key is
//! optional and overrides its `OTEL_*` variable (the `telemetry` module merges the two);
//! the section's presence turns traces on.
//!
//! ```toml
//! [tracing]
//! otlp_endpoint = "http://127.0.0.1:4318"  # OTEL_EXPORTER_OTLP_ENDPOINT (HTTP: /v1/traces appended)
//! protocol = "grpc"                        # OTEL_EXPORTER_OTLP_PROTOCOL: grpc | http/protobuf | http/json
//! headers = { "x-team" = "edge" }          # OTEL_EXPORTER_OTLP_HEADERS
//! headers_env = "OTLP_HEADERS"             # more, from this variable: name=value,name=value
//! compression = "gzip"                     # OTEL_EXPORTER_OTLP_COMPRESSION: gzip | none
//! export_timeout = "10s"                   # OTEL_EXPORTER_OTLP_TIMEOUT: one export's limit
//! certificate = "ca.pem"                   # OTEL_EXPORTER_OTLP_CERTIFICATE (and client_key,
//! client_certificate = "me.pem"            #   client_certificate, for mutual TLS)
//! service_name = "oncely"                  # OTEL_SERVICE_NAME
//! resource = { "deployment.environment.name" = "prod" }  # OTEL_RESOURCE_ATTRIBUTES
//! sampler = "parentbased_traceidratio"     # OTEL_TRACES_SAMPLER
//! sampler_arg = 0.25                       # OTEL_TRACES_SAMPLER_ARG
//! sample_ratio = 0.25                      # shorthand: parentbased_traceidratio with this ratio
//! max_queue = 2048                         # OTEL_BSP_MAX_QUEUE_SIZE: spans waiting; more are dropped
//! max_batch = 512                          # OTEL_BSP_MAX_EXPORT_BATCH_SIZE
//! schedule_delay = "5s"                    # OTEL_BSP_SCHEDULE_DELAY
//! metrics = true                           # also export metrics over OTLP (as OTEL_EXPORTER_OTLP_ENDPOINT would)
//! metrics_interval = "60s"                 # OTEL_METRIC_EXPORT_INTERVAL
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{HeaderName, HeaderValue};
use toml::Table;

use super::read::{self, at, Mistakes};

/// How spans and metrics travel to the collector (`OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC.
    Grpc,
    /// OTLP/HTTP with protobuf bodies (the default).
    HttpProtobuf,
    /// OTLP/HTTP with JSON bodies.
    HttpJson,
}

impl Protocol {
    /// The value as the variable writes it, or `None` for an unknown one.
    pub fn parse(text: &str) -> Option<Protocol> {
        match text.trim() {
            "grpc" => Some(Protocol::Grpc),
            "http/protobuf" => Some(Protocol::HttpProtobuf),
            "http/json" => Some(Protocol::HttpJson),
            _ => None,
        }
    }

    /// What an unknown value is told.
    pub const EXPECTED: &'static str = "one of grpc, http/protobuf, http/json";
}

/// Which new traces are sampled (`OTEL_TRACES_SAMPLER`), ratios in millionths so that
/// the config stays comparable (`Eq`) for a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampler {
    /// Every span.
    AlwaysOn,
    /// None.
    AlwaysOff,
    /// This share of traces, by trace id, whatever the parent says.
    TraceIdRatio(u32),
    /// The parent's decision; a root is sampled (the default).
    ParentBasedAlwaysOn,
    /// The parent's decision; a root is not sampled.
    ParentBasedAlwaysOff,
    /// The parent's decision; a root by trace id ratio.
    ParentBasedTraceIdRatio(u32),
}

impl Sampler {
    /// The sampler named `name` with its argument (a ratio, 0 to 1, default 1), or the
    /// reason it cannot be used: `Err(true)` names the sampler, `Err(false)` its argument.
    pub fn parse(name: &str, arg: Option<f64>) -> Result<Sampler, bool> {
        let ratio = match arg {
            None => 1_000_000,
            Some(r) if (0.0..=1.0).contains(&r) => (r * 1_000_000.0).round() as u32,
            Some(_) => return Err(false),
        };
        Ok(match name.trim() {
            "always_on" => Sampler::AlwaysOn,
            "always_off" => Sampler::AlwaysOff,
            "traceidratio" => Sampler::TraceIdRatio(ratio),
            "parentbased_always_on" => Sampler::ParentBasedAlwaysOn,
            "parentbased_always_off" => Sampler::ParentBasedAlwaysOff,
            "parentbased_traceidratio" => Sampler::ParentBasedTraceIdRatio(ratio),
            _ => return Err(true),
        })
    }

    /// What an unknown sampler is told.
    pub const EXPECTED: &'static str = "one of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio";
}

/// The validated `[tracing]` section: `None` is "not said in the file".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tracing {
    /// The generic endpoint (`otlp_endpoint`).
    pub endpoint: Option<String>,
    /// The protocol.
    pub protocol: Option<Protocol>,
    /// Headers sent with every export, in the file's order.
    pub headers: Vec<(String, String)>,
    /// The environment variable holding more headers (`name=value,name=value`, as
    /// `OTEL_EXPORTER_OTLP_HEADERS`), for secrets such as API keys; read at start.
    pub headers_env: Option<String>,
    /// gzip (`true`) or none.
    pub gzip: Option<bool>,
    /// One export's time limit.
    pub export_timeout: Option<Duration>,
    /// The collector's CA certificate (PEM).
    pub certificate: Option<PathBuf>,
    /// The client's private key (PEM), with `client_certificate`.
    pub client_key: Option<PathBuf>,
    /// The client's certificate chain (PEM).
    pub client_certificate: Option<PathBuf>,
    /// The resource's `service.name`.
    pub service_name: Option<String>,
    /// More resource attributes.
    pub resource: Vec<(String, String)>,
    /// The sampler.
    pub sampler: Option<Sampler>,
    /// Most spans waiting for export.
    pub max_queue: Option<usize>,
    /// Most spans in one export.
    pub max_batch: Option<usize>,
    /// How often waiting spans are sent.
    pub schedule_delay: Option<Duration>,
    /// Metrics over OTLP too (or not).
    pub metrics: Option<bool>,
    /// How often metrics are exported.
    pub metrics_interval: Option<Duration>,
}

const KEYS: &[&str] = &[
    "otlp_endpoint",
    "endpoint",
    "protocol",
    "headers",
    "headers_env",
    "compression",
    "export_timeout",
    "certificate",
    "client_key",
    "client_certificate",
    "service_name",
    "resource",
    "sampler",
    "sampler_arg",
    "sample_ratio",
    "max_queue",
    "max_batch",
    "schedule_delay",
    "metrics",
    "metrics_interval",
];

/// Reads `[tracing]`, or `None` when it is absent or has problems (each reported).
/// Relative file paths are taken relative to `base` (the config file's directory).
pub(crate) fn section(table: &Table, base: Option<&Path>, p: &mut Mistakes) -> Option<Tracing> {
    let loc = "tracing";
    let t = read::table(table, "", loc, p)?;
    read::unknown_keys(t, loc, KEYS, p);
    let before = p.0.len();
    let mut out = Tracing::default();

    if t.contains_key("otlp_endpoint") && t.contains_key("endpoint") {
        p.add(
            at(loc, "endpoint"),
            "set once: otlp_endpoint and endpoint are one key",
        );
    }
    for key in ["otlp_endpoint", "endpoint"] {
        if let Some(text) = read::string(t, loc, key, p) {
            match check_url(text) {
                Ok(()) => out.endpoint = Some(text.to_string()),
                Err(e) => p.add(at(loc, key), e),
            }
        }
    }
    if let Some(text) = read::string(t, loc, "protocol", p) {
        match Protocol::parse(text) {
            Some(protocol) => out.protocol = Some(protocol),
            None => p.add(
                at(loc, "protocol"),
                format!("{text:?} is not {}", Protocol::EXPECTED),
            ),
        }
    }
    if let Some(h) = read::table(t, loc, "headers", p) {
        for (name, value) in h {
            let here = format!("{loc}.headers.{name}");
            if HeaderName::from_bytes(name.as_bytes()).is_err() {
                p.add(here, "not a valid header name");
                continue;
            }
            match value.as_str() {
                Some(v) if HeaderValue::from_str(v).is_ok() => {
                    out.headers.push((name.to_ascii_lowercase(), v.to_string()));
                }
                _ => p.add(here, "must be a string that is a valid header value"),
            }
        }
    }
    out.headers_env = read::string(t, loc, "headers_env", p).map(str::to_string);
    if let Some(Err(e)) = out.headers_env.as_deref().map(super::values::env_name) {
        p.add(at(loc, "headers_env"), e);
    }
    if let Some(text) = read::string(t, loc, "compression", p) {
        match text {
            "gzip" => out.gzip = Some(true),
            "none" => out.gzip = Some(false),
            _ => p.add(
                at(loc, "compression"),
                format!("{text:?} is not gzip or none"),
            ),
        }
    }
    out.export_timeout = positive(t, loc, "export_timeout", p);
    let path = |key: &str, p: &mut Mistakes| {
        read::string(t, loc, key, p).map(|s| super::values::relative(base, s))
    };
    out.certificate = path("certificate", p);
    out.client_key = path("client_key", p);
    out.client_certificate = path("client_certificate", p);
    if out.client_key.is_some() != out.client_certificate.is_some() {
        p.add(
            at(loc, "client_key"),
            "client_key and client_certificate go together",
        );
    }
    out.service_name = read::string(t, loc, "service_name", p).map(str::to_string);
    if out
        .service_name
        .as_deref()
        .is_some_and(|s| s.trim().is_empty())
    {
        p.add(at(loc, "service_name"), "is empty");
    }
    if let Some(r) = read::table(t, loc, "resource", p) {
        for (key, value) in r {
            match value.as_str() {
                Some(v) => out.resource.push((key.clone(), v.to_string())),
                None => p.add(format!("{loc}.resource.{key}"), "must be a string"),
            }
        }
    }
    out.sampler = sampler(t, loc, p);
    out.max_queue = count(t, loc, "max_queue", p);
    out.max_batch = count(t, loc, "max_batch", p);
    out.schedule_delay = positive(t, loc, "schedule_delay", p);
    match t.get("metrics") {
        None => {}
        Some(toml::Value::Boolean(b)) => out.metrics = Some(*b),
        Some(_) => p.add(at(loc, "metrics"), "must be true or false"),
    }
    out.metrics_interval = positive(t, loc, "metrics_interval", p);

    (p.0.len() == before).then_some(out)
}

fn sampler(t: &Table, loc: &str, p: &mut Mistakes) -> Option<Sampler> {
    let number = |key: &str, p: &mut Mistakes| -> Option<Option<f64>> {
        match t.get(key) {
            None => Some(None),
            Some(toml::Value::Float(f)) => Some(Some(*f)),
            Some(toml::Value::Integer(i)) => Some(Some(*i as f64)),
            Some(_) => {
                p.add(at(loc, key), "must be a number from 0 to 1 (e.g. 0.25)");
                None
            }
        }
    };
    let arg = number("sampler_arg", p)?;
    let ratio = number("sample_ratio", p)?;
    let name = read::string(t, loc, "sampler", p);
    if let (Some(_), Some(_)) = (name, ratio) {
        p.add(
            at(loc, "sample_ratio"),
            "is a shorthand for sampler = \"parentbased_traceidratio\": set one of the two",
        );
        return None;
    }
    let (name, arg, key) = match (name, ratio) {
        (Some(name), _) => (name, arg, "sampler_arg"),
        (None, Some(r)) => ("parentbased_traceidratio", Some(r), "sample_ratio"),
        (None, None) if arg.is_some() => {
            p.add(at(loc, "sampler_arg"), "needs sampler");
            return None;
        }
        (None, None) => return None,
    };
    match Sampler::parse(name, arg) {
        Ok(s) => Some(s),
        Err(true) => {
            p.add(
                at(loc, "sampler"),
                format!("{name:?} is not {}", Sampler::EXPECTED),
            );
            None
        }
        Err(false) => {
            p.add(at(loc, key), "must be a number from 0 to 1 (e.g. 0.25)");
            None
        }
    }
}

fn count(t: &Table, loc: &str, key: &str, p: &mut Mistakes) -> Option<usize> {
    match read::integer(t, loc, key, p) {
        Some(0) => {
            p.add(at(loc, key), "must be at least 1");
            None
        }
        n => n.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
    }
}

fn positive(t: &Table, loc: &str, key: &str, p: &mut Mistakes) -> Option<Duration> {
    match read::duration(t, loc, key, p) {
        Some(d) if d.is_zero() => {
            p.add(at(loc, key), "must be longer than 0");
            None
        }
        d => d,
    }
}

/// An absolute `http` or `https` URL with a host and no query or fragment.
pub(crate) fn check_url(text: &str) -> Result<(), String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("{text:?} is not a URL ({e}): use e.g. \"http://127.0.0.1:4318\""))?;
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err(format!("{text:?} must start with http:// or https://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{text:?} has no host"));
    }
    if uri.query().is_some() || text.contains('#') {
        return Err(format!("{text:?}: a query or fragment is not allowed"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Option<Tracing>, Vec<String>> {
        let table: Table = text.parse().unwrap();
        let mut p = Mistakes::default();
        let t = section(&table, Some(Path::new("/etc/oncely")), &mut p);
        if p.0.is_empty() {
            Ok(t)
        } else {
            Err(p.0.iter().map(ToString::to_string).collect())
        }
    }

    #[test]
    fn absent_is_none_and_an_empty_table_says_nothing() {
        assert_eq!(read("").unwrap(), None);
        assert_eq!(read("[tracing]\n").unwrap(), Some(Tracing::default()));
    }

    #[test]
    fn every_field_is_read() {
        let t = read(
            r#"[tracing]
otlp_endpoint = "https://otel.example/prefix/"
protocol = "grpc"
headers = { "X-Api-Key" = "k1" }
headers_env = "TRACES_TEST_HEADERS"
compression = "gzip"
export_timeout = "2s"
certificate = "ca.pem"
client_key = "/k.pem"
client_certificate = "c.pem"
service_name = "edge"
resource = { "deployment.environment.name" = "prod" }
sampler = "traceidratio"
sampler_arg = 0.25
max_queue = 10
max_batch = 5
schedule_delay = "100ms"
metrics = true
metrics_interval = "5s"
"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.endpoint.as_deref(), Some("https://otel.example/prefix/"));
        assert_eq!(t.protocol, Some(Protocol::Grpc));
        assert_eq!(t.headers, vec![("x-api-key".into(), "k1".into())]);
        assert_eq!(t.headers_env.as_deref(), Some("TRACES_TEST_HEADERS"));
        assert_eq!(t.gzip, Some(true));
        assert_eq!(t.export_timeout, Some(Duration::from_secs(2)));
        assert_eq!(t.certificate, Some(PathBuf::from("/etc/oncely/ca.pem")));
        assert_eq!(t.client_key, Some(PathBuf::from("/k.pem")));
        assert_eq!(t.service_name.as_deref(), Some("edge"));
        assert_eq!(t.resource.len(), 1);
        assert_eq!(t.sampler, Some(Sampler::TraceIdRatio(250_000)));
        assert_eq!((t.max_queue, t.max_batch), (Some(10), Some(5)));
        assert_eq!(t.schedule_delay, Some(Duration::from_millis(100)));
        assert_eq!(t.metrics, Some(true));
        assert_eq!(t.metrics_interval, Some(Duration::from_secs(5)));
        let t = read("[tracing]\nsample_ratio = 0.5\n").unwrap().unwrap();
        assert_eq!(t.sampler, Some(Sampler::ParentBasedTraceIdRatio(500_000)));
    }

    #[test]
    fn bad_values_are_reported_each_with_its_place() {
        let problems = read(
            r#"[tracing]
otlp_endpoint = "grpc://127.0.0.1:4317"
protocol = "thrift"
sample_ratio = 1.5
headers = { "bad header" = "x" }
max_queue = 0
headers_env = "not a name"
schedule_delay = "soon"
compression = "zstd"
client_key = "k.pem"
colour = "blue"
"#,
        )
        .unwrap_err();
        for needle in [
            "tracing.otlp_endpoint: \"grpc://127.0.0.1:4317\" must start with http:// or https://",
            "tracing.protocol: \"thrift\" is not one of grpc",
            "tracing.sample_ratio: must be a number from 0 to 1",
            "tracing.headers.bad header: not a valid header name",
            "tracing.max_queue: must be at least 1",
            "tracing.headers_env: \"not a name\" is not an environment variable name",
            "tracing.schedule_delay",
            "tracing.compression: \"zstd\" is not gzip or none",
            "tracing.client_key: client_key and client_certificate go together",
            "tracing.colour: unknown key",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(needle)),
                "{needle:?} not in {problems:#?}"
            );
        }
        let both = read("[tracing]\nsampler = \"always_on\"\nsample_ratio = 0.5\n").unwrap_err();
        assert!(both[0].starts_with("tracing.sample_ratio: is a shorthand"));
        let bad = read("[tracing]\nsampler = \"sometimes\"\n").unwrap_err();
        assert!(bad[0].starts_with("tracing.sampler: \"sometimes\" is not one of"));
        for bad in ["not a url", "http://", "http://h:4318/?x=1", "/v1/traces"] {
            let text = format!("[tracing]\notlp_endpoint = {bad:?}\n");
            assert!(read(&text).is_err(), "{bad}");
        }
    }
}
