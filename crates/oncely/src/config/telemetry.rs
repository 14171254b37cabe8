//! OpenTelemetry's environment, merged with the file's `[tracing]` ([`super::tracing`]):
//! one validated [`Telemetry`], or each problem naming its variable (or key).
//!
//! The variables are those of the OpenTelemetry specification ("Environment Variable
//! Specification" and "OTLP Exporter Configuration"), read the way the SDKs read them:
//! a signal's own variable (`OTEL_EXPORTER_OTLP_TRACES_*`, `..._METRICS_*`) over the
//! generic one, an empty value as unset, and a value set in the file over both. Unlike
//! the SDKs, which ignore a value they cannot use with a warning, a bad value is an
//! error here: `serve`, `mcp` and `check-config` exit 2 naming the variable (never
//! echoing a header's value, which may be a vendor's API key).
//!
//! The `opentelemetry-otlp` exporters are then configured with what is resolved here, so
//! that the file's precedence holds (the crate's own reading of the variables is
//! overridden by a value given to its builders).

use std::path::PathBuf;
use std::time::Duration;

use super::tracing::{check_url, Protocol, Sampler, Tracing};

/// The default `service.name`.
pub const DEFAULT_SERVICE_NAME: &str = "oncely";

/// How one signal (traces or metrics) is exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    /// The protocol.
    pub protocol: Protocol,
    /// Where to: for HTTP the whole URL (`.../v1/traces`), for gRPC the collector's.
    pub endpoint: String,
    /// Headers (gRPC metadata) sent with every export, names lower case.
    pub headers: Vec<(String, String)>,
    /// Bodies gzip-compressed.
    pub gzip: bool,
    /// The variable asking for gzip that the file's `compression = "none"` overrode
    /// (`OTEL_EXPORTER_OTLP_COMPRESSION`): an exporter that reads it itself cannot follow
    /// the file, and says so.
    pub overridden_gzip: Option<String>,
    /// One export's limit.
    pub timeout: Duration,
    /// The collector's CA certificate (PEM), trusted besides the system's roots.
    pub certificate: Option<PathBuf>,
    /// The client's key and certificate chain (PEM), for mutual TLS.
    pub client_identity: Option<(PathBuf, PathBuf)>,
}

/// The batch span processor's limits (`OTEL_BSP_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Most spans waiting; a span that finds the queue full is dropped and counted.
    pub max_queue: usize,
    /// Most spans in one export.
    pub max_batch: usize,
    /// How often waiting spans are sent.
    pub schedule_delay: Duration,
    /// The processor's bound on one export (`OTEL_BSP_EXPORT_TIMEOUT`).
    pub export_timeout: Duration,
}

/// What is exported, where, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Telemetry {
    /// The resource: `service.name` first, then `OTEL_RESOURCE_ATTRIBUTES` and the file's
    /// `resource` (`service.version` and `service.instance.id` are added at start).
    pub resource: Vec<(String, String)>,
    /// Traces, when on.
    pub traces: Option<Export>,
    /// Metrics, when on.
    pub metrics: Option<Export>,
    /// Which new traces are sampled.
    pub sampler: Sampler,
    /// The span queue.
    pub batch: Batch,
    /// How often metrics are exported (`OTEL_METRIC_EXPORT_INTERVAL`).
    pub metrics_interval: Duration,
    /// One metrics export's limit (`OTEL_METRIC_EXPORT_TIMEOUT`).
    pub metrics_timeout: Duration,
}

/// A signal: its name in variables and its HTTP path.
#[derive(Clone, Copy)]
struct Signal {
    upper: &'static str,
    path: &'static str,
}

const TRACES: Signal = Signal {
    upper: "TRACES",
    path: "/v1/traces",
};
const METRICS: Signal = Signal {
    upper: "METRICS",
    path: "/v1/metrics",
};

/// Reads a variable: `None` when unset or empty.
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process's environment, as [`resolve`] reads it.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `file` and the environment merged: `Ok(None)` when nothing is exported (no
/// endpoint, no `[tracing]`, or `OTEL_SDK_DISABLED=true`), else what is, or every
/// problem found.
pub fn resolve(file: Option<&Tracing>, env: Env<'_>) -> Result<Option<Telemetry>, Vec<String>> {
    let mut p = Vec::new();
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let exporter_on = |var: &str, p: &mut Vec<String>| -> bool {
        match env(var) {
            None => true,
            Some(v) => {
                let mut on = false;
                for name in v.split(',').map(str::trim) {
                    match name {
                        "otlp" => on = true,
                        "none" => {}
                        _ => p.push(format!(
                            "{var}: {name:?} is not an exporter oncely has (otlp or none)"
                        )),
                    }
                }
                on
            }
        }
    };
    let traces_exporter = exporter_on("OTEL_TRACES_EXPORTER", &mut p);
    let metrics_exporter = exporter_on("OTEL_METRICS_EXPORTER", &mut p);
    let generic = env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some();
    let traces_on = traces_exporter
        && (file.is_some() || generic || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some());
    let metrics_on = metrics_exporter
        && match file.and_then(|f| f.metrics) {
            Some(on) => on,
            None => generic || env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").is_some(),
        };

    let default = Tracing::default();
    let f = file.unwrap_or(&default);
    let traces = traces_on.then(|| export(f, TRACES, env, &mut p));
    let metrics = metrics_on.then(|| export(f, METRICS, env, &mut p));

    let mut resource = Vec::new();
    if let Some(text) = env("OTEL_RESOURCE_ATTRIBUTES") {
        match pairs(&text) {
            Some(kv) => resource.extend(kv),
            None => p.push(
                "OTEL_RESOURCE_ATTRIBUTES: not a list of key=value separated by commas".into(),
            ),
        }
    }
    for (k, v) in &f.resource {
        set(&mut resource, k, v.clone());
    }
    let service = f
        .service_name
        .clone()
        .or_else(|| env("OTEL_SERVICE_NAME"))
        .or_else(|| {
            resource
                .iter()
                .find(|(k, _)| k == "service.name")
                .map(|(_, v)| v.clone())
        })
        .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string());
    resource.retain(|(k, _)| k != "service.name");
    resource.insert(0, ("service.name".into(), service));

    let sampler = match f.sampler {
        Some(s) => s,
        None => {
            let arg = match env("OTEL_TRACES_SAMPLER_ARG") {
                None => None,
                Some(text) => match text.trim().parse::<f64>() {
                    Ok(r) => Some(r),
                    Err(_) => {
                        p.push(format!(
                            "OTEL_TRACES_SAMPLER_ARG: {text:?} is not a number from 0 to 1"
                        ));
                        None
                    }
                },
            };
            let name = env("OTEL_TRACES_SAMPLER");
            match Sampler::parse(name.as_deref().unwrap_or("parentbased_always_on"), arg) {
                Ok(s) => s,
                Err(true) => {
                    p.push(format!(
                        "OTEL_TRACES_SAMPLER: {:?} is not {}",
                        name.unwrap_or_default(),
                        Sampler::EXPECTED
                    ));
                    Sampler::ParentBasedAlwaysOn
                }
                Err(false) => {
                    p.push(format!(
                        "OTEL_TRACES_SAMPLER_ARG: {} is not a number from 0 to 1",
                        arg.unwrap_or_default()
                    ));
                    Sampler::ParentBasedAlwaysOn
                }
            }
        }
    };

    let batch = Batch {
        max_queue: f
            .max_queue
            .or_else(|| count(env, "OTEL_BSP_MAX_QUEUE_SIZE", &mut p))
            .unwrap_or(2048),
        max_batch: f
            .max_batch
            .or_else(|| count(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", &mut p))
            .unwrap_or(512),
        schedule_delay: f
            .schedule_delay
            .or_else(|| millis(env, "OTEL_BSP_SCHEDULE_DELAY", &mut p))
            .unwrap_or(Duration::from_secs(5)),
        export_timeout: millis(env, "OTEL_BSP_EXPORT_TIMEOUT", &mut p)
            .unwrap_or(Duration::from_secs(30)),
    };
    let metrics_interval = f
        .metrics_interval
        .or_else(|| millis(env, "OTEL_METRIC_EXPORT_INTERVAL", &mut p))
        .unwrap_or(Duration::from_secs(60));
    let metrics_timeout =
        millis(env, "OTEL_METRIC_EXPORT_TIMEOUT", &mut p).unwrap_or(Duration::from_secs(30));

    if !p.is_empty() {
        return Err(p);
    }
    if traces.is_none() && metrics.is_none() {
        return Ok(None);
    }
    Ok(Some(Telemetry {
        resource,
        traces,
        metrics,
        sampler,
        batch: Batch {
            // The SDK requires a batch no larger than the queue.
            max_batch: batch.max_batch.min(batch.max_queue),
            ..batch
        },
        metrics_interval,
        metrics_timeout,
    }))
}

/// One signal's export: each setting from the file, else the signal's variable, else
/// the generic one, else the default.
fn export(f: &Tracing, s: Signal, env: Env<'_>, p: &mut Vec<String>) -> Export {
    let own = |suffix: &str| format!("OTEL_EXPORTER_OTLP_{}_{suffix}", s.upper);
    let generic = |suffix: &str| format!("OTEL_EXPORTER_OTLP_{suffix}");
    // The first of the signal's and the generic variable that is set: (name, value).
    let pick = |suffix: &str| -> Option<(String, String)> {
        let (a, b) = (own(suffix), generic(suffix));
        env(&a).map(|v| (a, v)).or_else(|| env(&b).map(|v| (b, v)))
    };

    let protocol = match f.protocol {
        Some(proto) => proto,
        None => match pick("PROTOCOL") {
            None => Protocol::HttpProtobuf,
            Some((var, v)) => Protocol::parse(&v).unwrap_or_else(|| {
                p.push(format!("{var}: {v:?} is not {}", Protocol::EXPECTED));
                Protocol::HttpProtobuf
            }),
        },
    };
    let http = protocol != Protocol::Grpc;
    let with_path = |base: &str| -> String {
        if !http {
            return base.to_string();
        }
        let trimmed = base.trim_end_matches('/');
        if trimmed.ends_with(s.path) {
            trimmed.to_string()
        } else {
            format!("{trimmed}{}", s.path)
        }
    };
    let endpoint = if let Some(e) = &f.endpoint {
        with_path(e)
    } else if let Some(e) = env(&own("ENDPOINT")) {
        if let Err(why) = check_url(&e) {
            p.push(format!("{}: {why}", own("ENDPOINT")));
        }
        e
    } else if let Some(e) = env(&generic("ENDPOINT")) {
        if let Err(why) = check_url(&e) {
            p.push(format!("{}: {why}", generic("ENDPOINT")));
        }
        with_path(&e)
    } else if http {
        with_path("http://localhost:4318")
    } else {
        "http://localhost:4317".to_string()
    };

    let mut headers = Vec::new();
    for var in [generic("HEADERS"), own("HEADERS")] {
        if let Some(text) = env(&var) {
            match pairs(&text) {
                Some(kv) => {
                    for (k, v) in kv {
                        if !valid_header(&k, &v) {
                            p.push(format!("{var}: {k:?} is not a valid header name and value"));
                        }
                        set(&mut headers, &k.to_ascii_lowercase(), v);
                    }
                }
                None => p.push(format!(
                    "{var}: not a list of name=value separated by commas"
                )),
            }
        }
    }
    if let Some(var) = &f.headers_env {
        match env(var) {
            None => p.push(format!("tracing.headers_env: ${var} is not set")),
            Some(text) => match pairs(&text) {
                Some(kv) if kv.iter().all(|(k, v)| valid_header(k, v)) => {
                    for (k, v) in kv {
                        set(&mut headers, &k.to_ascii_lowercase(), v);
                    }
                }
                _ => p.push(format!(
                    "tracing.headers_env: ${var} is not name=value,... with valid header names and values"
                )),
            },
        }
    }
    for (k, v) in &f.headers {
        set(&mut headers, k, v.clone());
    }

    let overridden_gzip = match (f.gzip, pick("COMPRESSION")) {
        (Some(false), Some((var, v))) if v.trim() == "gzip" => Some(var),
        _ => None,
    };
    let gzip = match f.gzip {
        Some(g) => g,
        None => match pick("COMPRESSION") {
            None => false,
            Some((_, v)) if v.trim() == "gzip" => true,
            Some((_, v)) if v.trim() == "none" => false,
            Some((var, v)) => {
                p.push(format!("{var}: {v:?} is not gzip or none"));
                false
            }
        },
    };
    let timeout = match f.export_timeout {
        Some(t) => t,
        None => match pick("TIMEOUT") {
            None => Duration::from_secs(10),
            Some((var, v)) => parse_millis(&var, &v, p).unwrap_or(Duration::from_secs(10)),
        },
    };
    let file_or = |from_file: &Option<PathBuf>, suffix: &str| -> Option<PathBuf> {
        from_file
            .clone()
            .or_else(|| pick(suffix).map(|(_, v)| PathBuf::from(v)))
    };
    let certificate = file_or(&f.certificate, "CERTIFICATE");
    let key = file_or(&f.client_key, "CLIENT_KEY");
    let cert = file_or(&f.client_certificate, "CLIENT_CERTIFICATE");
    let client_identity = match (key, cert) {
        (Some(k), Some(c)) => Some((k, c)),
        (None, None) => None,
        _ => {
            p.push(format!(
                "{} and {} go together (mutual TLS needs both)",
                generic("CLIENT_KEY"),
                generic("CLIENT_CERTIFICATE")
            ));
            None
        }
    };
    Export {
        protocol,
        endpoint,
        headers,
        gzip,
        overridden_gzip,
        timeout,
        certificate,
        client_identity,
    }
}

/// `k=v,k2=v2` as the W3C Baggage-like lists of the OTEL variables: keys and values
/// trimmed, values percent-decoded; `None` when an entry has no `=` or an empty key.
fn pairs(text: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    for entry in text.split(',') {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let (k, v) = entry.split_once('=')?;
        let k = k.trim();
        if k.is_empty() {
            return None;
        }
        out.push((k.to_string(), percent_decode(v.trim())?));
    }
    Some(out)
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn valid_header(name: &str, value: &str) -> bool {
    http::HeaderName::from_bytes(name.as_bytes()).is_ok()
        && http::HeaderValue::from_str(value).is_ok()
}

/// Sets `key` in `list`, replacing an earlier value.
fn set(list: &mut Vec<(String, String)>, key: &str, value: String) {
    match list.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value,
        None => list.push((key.to_string(), value)),
    }
}

fn count(env: Env<'_>, var: &str, p: &mut Vec<String>) -> Option<usize> {
    let text = env(var)?;
    match text.trim().parse::<usize>() {
        Ok(n) if n > 0 => Some(n),
        _ => {
            p.push(format!("{var}: {text:?} is not a whole number above 0"));
            None
        }
    }
}

fn millis(env: Env<'_>, var: &str, p: &mut Vec<String>) -> Option<Duration> {
    let text = env(var)?;
    parse_millis(var, &text, p)
}

fn parse_millis(var: &str, text: &str, p: &mut Vec<String>) -> Option<Duration> {
    match text.trim().parse::<u64>() {
        Ok(n) if n > 0 => Some(Duration::from_millis(n)),
        _ => {
            p.push(format!(
                "{var}: {text:?} is not a number of milliseconds above 0"
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn run(
        file: Option<&Tracing>,
        vars: &[(&str, &str)],
    ) -> Result<Option<Telemetry>, Vec<String>> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let env = move |name: &str| map.get(name).filter(|v| !v.is_empty()).cloned();
        resolve(file, &env)
    }

    #[test]
    fn nothing_set_is_off_and_the_generic_endpoint_turns_both_signals_on() {
        assert_eq!(run(None, &[]).unwrap(), None);
        assert_eq!(
            run(None, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "")]).unwrap(),
            None
        );
        let t = run(None, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")])
            .unwrap()
            .unwrap();
        let traces = t.traces.unwrap();
        assert_eq!(traces.endpoint, "http://c:4318/v1/traces");
        assert_eq!(traces.protocol, Protocol::HttpProtobuf);
        assert_eq!(traces.timeout, Duration::from_secs(10));
        assert_eq!(t.metrics.unwrap().endpoint, "http://c:4318/v1/metrics");
        assert_eq!(t.resource[0], ("service.name".into(), "oncely".into()));
        assert_eq!(t.sampler, Sampler::ParentBasedAlwaysOn);
        assert_eq!(t.batch.max_queue, 2048);
        assert_eq!(t.metrics_interval, Duration::from_secs(60));
    }

    #[test]
    fn a_signal_s_own_endpoint_is_used_as_it_is_and_turns_only_that_signal_on() {
        let t = run(
            None,
            &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:9/custom")],
        )
        .unwrap()
        .unwrap();
        assert_eq!(t.traces.unwrap().endpoint, "http://c:9/custom");
        assert!(t.metrics.is_none());
        let t = run(
            None,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json"),
                ("OTEL_METRICS_EXPORTER", "otlp"),
                ("OTEL_TRACES_EXPORTER", "none"),
            ],
        )
        .unwrap()
        .unwrap();
        assert!(t.traces.is_none());
        let m = t.metrics.unwrap();
        assert_eq!(
            (m.protocol, m.endpoint.as_str()),
            (Protocol::HttpJson, "http://c:4317/v1/metrics")
        );
    }

    #[test]
    fn the_file_wins_over_the_environment() {
        let file = Tracing {
            endpoint: Some("http://file:4318".into()),
            headers: vec![("x-key".into(), "from-file".into())],
            service_name: Some("edge".into()),
            sampler: Some(Sampler::AlwaysOff),
            max_queue: Some(7),
            ..Tracing::default()
        };
        let t = run(
            Some(&file),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "x-key=from-env,x-other=b%20c"),
                ("OTEL_SERVICE_NAME", "env-name"),
                ("OTEL_RESOURCE_ATTRIBUTES", "service.name=x,team=pay"),
                ("OTEL_TRACES_SAMPLER", "always_on"),
                ("OTEL_BSP_MAX_QUEUE_SIZE", "99"),
                ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "100"),
            ],
        )
        .unwrap()
        .unwrap();
        let traces = t.traces.unwrap();
        assert_eq!(traces.endpoint, "http://file:4318/v1/traces");
        assert_eq!(
            traces.headers,
            vec![
                ("x-key".to_string(), "from-file".to_string()),
                ("x-other".to_string(), "b c".to_string())
            ]
        );
        assert_eq!(
            t.resource,
            vec![
                ("service.name".to_string(), "edge".to_string()),
                ("team".to_string(), "pay".to_string())
            ]
        );
        assert_eq!(t.sampler, Sampler::AlwaysOff);
        assert_eq!((t.batch.max_queue, t.batch.max_batch), (7, 7));
        // The table alone turns traces on (to the default endpoint); metrics stay off.
        let t = run(Some(&Tracing::default()), &[]).unwrap().unwrap();
        assert_eq!(
            t.traces.unwrap().endpoint,
            "http://localhost:4318/v1/traces"
        );
        assert!(t.metrics.is_none());
        // OTEL_SDK_DISABLED turns everything off, the file's table too.
        assert_eq!(
            run(Some(&Tracing::default()), &[("OTEL_SDK_DISABLED", "TRUE")]).unwrap(),
            None
        );
        // OTEL_SERVICE_NAME over the resource's service.name.
        let t = run(
            None,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
                ("OTEL_SERVICE_NAME", "env-name"),
                ("OTEL_RESOURCE_ATTRIBUTES", "service.name=x"),
            ],
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            t.resource,
            vec![("service.name".to_string(), "env-name".to_string())]
        );
    }

    #[test]
    fn each_bad_value_names_its_variable_and_never_a_header_value() {
        let problems = run(
            None,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift"),
                ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "zstd"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "authorization=Bearer sk_secret\n,broken",
                ),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
                ("OTEL_TRACES_SAMPLER", "sometimes"),
                ("OTEL_TRACES_SAMPLER_ARG", "2"),
                ("OTEL_BSP_MAX_QUEUE_SIZE", "-1"),
                ("OTEL_RESOURCE_ATTRIBUTES", "=x"),
                ("OTEL_METRICS_EXPORTER", "prometheus"),
            ],
        )
        .unwrap_err();
        for needle in [
            "OTEL_EXPORTER_OTLP_ENDPOINT: ",
            "OTEL_EXPORTER_OTLP_PROTOCOL: \"thrift\" is not one of grpc",
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION: \"zstd\" is not gzip or none",
            "OTEL_EXPORTER_OTLP_HEADERS: not a list",
            "OTEL_EXPORTER_OTLP_TIMEOUT: \"10s\" is not a number of milliseconds",
            "OTEL_TRACES_SAMPLER_ARG: 2 is not a number from 0 to 1",
            "OTEL_BSP_MAX_QUEUE_SIZE: \"-1\"",
            "OTEL_RESOURCE_ATTRIBUTES: ",
            "OTEL_METRICS_EXPORTER: \"prometheus\"",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(needle)),
                "{needle:?} not in {problems:#?}"
            );
        }
        assert!(
            problems.iter().all(|p| !p.contains("sk_secret")),
            "{problems:#?}"
        );
        let problems = run(
            None,
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:1"),
                ("OTEL_TRACES_SAMPLER", "sometimes"),
            ],
        )
        .unwrap_err();
        assert!(problems[0].starts_with("OTEL_TRACES_SAMPLER: \"sometimes\" is not one of"));
    }
}
