//! Metrics over OTLP: the SDK's meter provider with a periodic reader and the OTLP metric
//! exporter of the configured protocol.
//!
//! The instruments are those of `/metrics`, mirrored: the process's `metrics` recorder is
//! a [`Mirror`] of the Prometheus one, which, once export is on, records each series on
//! an OpenTelemetry instrument too, under its OpenTelemetry name ([`otel_name`]:
//! `oncely_requests_total` is `oncely.requests`, with `http.route` and `oncely.status`;
//! [`otel_attribute`] for the labels). `/metrics` is unchanged. Beside them,
//! `http.server.request.duration` (histogram, seconds), recorded by the server for every
//! answered request ([`request_finished`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use opentelemetry::metrics::{self as otel, Meter};
use opentelemetry::KeyValue;

use anyhow::Context as _;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;

use crate::config::telemetry::{Export, Telemetry};
use crate::config::tracing::Protocol;

/// The running metrics export.
pub struct MetricsExport {
    provider: SdkMeterProvider,
}

impl MetricsExport {
    /// Starts exporting every `metrics_interval`.
    pub(super) fn start(
        telemetry: &Telemetry,
        export: &Export,
        resource: &Resource,
    ) -> anyhow::Result<MetricsExport> {
        let builder = opentelemetry_otlp::MetricExporter::builder();
        let exporter = match export.protocol {
            Protocol::Grpc => {
                super::transport::grpc_builder(builder.with_tonic(), export, "metrics")?.build()
            }
            Protocol::HttpProtobuf | Protocol::HttpJson => {
                super::transport::http_builder(builder.with_http(), export, "metrics")?.build()
            }
        }
        .context("the OTLP metric exporter")?;
        let reader = PeriodicReader::builder(exporter)
            .with_interval(telemetry.metrics_interval)
            .build();
        let provider = SdkMeterProvider::builder()
            .with_resource(resource.clone())
            .with_reader(reader)
            .build();
        let export = MetricsExport { provider };
        install(export.meter());
        Ok(export)
    }

    /// The meter oncely's instruments are made with.
    pub fn meter(&self) -> opentelemetry::metrics::Meter {
        use opentelemetry::metrics::MeterProvider as _;
        self.provider.meter("oncely")
    }

    /// Exports once more and stops (blocking: called off the runtime).
    pub(super) fn stop(self, limit: Duration) {
        let _ = self.provider.shutdown_with_timeout(limit);
    }
}

/// The OTel instruments, once metrics over OTLP are on (empty otherwise: the mirror and
/// [`request_finished`] then cost one atomic load).
static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();

struct Instruments {
    meter: Meter,
    duration: otel::Histogram<f64>,
    counters: RwLock<HashMap<String, otel::Counter<u64>>>,
    gauges: RwLock<HashMap<String, otel::Gauge<f64>>>,
    histograms: RwLock<HashMap<String, otel::Histogram<f64>>>,
    /// A gauge's current value per series (OTel gauges record values, `metrics` gauges
    /// are moved up and down).
    values: Mutex<HashMap<Key, Arc<Mutex<f64>>>>,
}

/// Installs the instruments of `meter` for the rest of the process.
fn install(meter: Meter) {
    let duration = meter
        .f64_histogram("http.server.request.duration")
        .with_unit("s")
        .with_description("Duration of HTTP server requests (to the answer's head)")
        .with_boundaries(vec![
            0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        ])
        .build();
    let _ = INSTRUMENTS.set(Instruments {
        meter,
        duration,
        counters: RwLock::default(),
        gauges: RwLock::default(),
        histograms: RwLock::default(),
        values: Mutex::default(),
    });
}

/// Whether metrics go over OTLP (so that the server measures requests).
pub fn enabled() -> bool {
    INSTRUMENTS.get().is_some()
}

/// Records `http.server.request.duration` of one answered request (HTTP semantic
/// conventions: `http.request.method`, `http.route` when a route matched,
/// `http.response.status_code`, `error.type` for a 5xx).
pub fn request_finished(method: &http::Method, route: Option<&str>, status: u16, seconds: f64) {
    let Some(i) = INSTRUMENTS.get() else { return };
    let mut attrs = Vec::with_capacity(4);
    attrs.push(KeyValue::new(
        "http.request.method",
        method.as_str().to_string(),
    ));
    if let Some(route) = route {
        attrs.push(KeyValue::new("http.route", route.to_string()));
    }
    attrs.push(KeyValue::new(
        "http.response.status_code",
        i64::from(status),
    ));
    if status >= 500 {
        attrs.push(KeyValue::new("error.type", status.to_string()));
    }
    i.duration.record(seconds, &attrs);
}

/// The OpenTelemetry name of a `/metrics` instrument: `oncely_requests_total` is
/// `oncely.requests`, `oncely_upstream_seconds` is `oncely.upstream.duration` (seconds).
pub fn otel_name(name: &str) -> String {
    let name = name.strip_suffix("_total").unwrap_or(name);
    let name = match name.strip_suffix("_seconds") {
        Some(base) => format!("{base}.duration"),
        None => name.to_string(),
    };
    match name.strip_prefix("oncely_") {
        Some(rest) => format!("oncely.{rest}"),
        None => name,
    }
}

/// The OpenTelemetry attribute of a `/metrics` label: `route` is `http.route` (the
/// route's path), `status` `oncely.status`, `tool` `gen_ai.tool.name`, any other
/// `oncely.LABEL`.
pub fn otel_attribute(label: &str, value: &str) -> KeyValue {
    match label {
        "route" => {
            let path = match value.split_once(' ') {
                Some((method, path))
                    if method == "*" || method.bytes().all(|b| b.is_ascii_uppercase()) =>
                {
                    path
                }
                _ => value,
            };
            KeyValue::new("http.route", path.to_string())
        }
        "status" => KeyValue::new("oncely.status", value.to_string()),
        "tool" => KeyValue::new("gen_ai.tool.name", value.to_string()),
        other => KeyValue::new(format!("oncely.{other}"), value.to_string()),
    }
}

fn attributes(key: &Key) -> Vec<KeyValue> {
    key.labels()
        .map(|l| otel_attribute(l.key(), l.value()))
        .collect()
}

/// The process's `metrics` recorder: Prometheus (what `/metrics` renders), and the same
/// instruments over OTLP once [`MetricsExport::start`] installed them.
pub struct Mirror<R> {
    inner: R,
}

impl<R> Mirror<R> {
    /// Mirrors what `inner` records.
    pub fn new(inner: R) -> Mirror<R> {
        Mirror { inner }
    }
}

fn cached<T: Clone>(map: &RwLock<HashMap<String, T>>, name: &str, make: impl FnOnce() -> T) -> T {
    if let Some(t) = map.read().expect("not poisoned").get(name) {
        return t.clone();
    }
    map.write()
        .expect("not poisoned")
        .entry(name.to_string())
        .or_insert_with(make)
        .clone()
}

impl<R: Recorder> Recorder for Mirror<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        let prom = self.inner.register_counter(key, metadata);
        let Some(i) = INSTRUMENTS.get() else {
            return prom;
        };
        let otel = cached(&i.counters, key.name(), || {
            i.meter.u64_counter(otel_name(key.name())).build()
        });
        Counter::from_arc(Arc::new(Both {
            prom,
            otel,
            attrs: attributes(key),
            value: None,
        }))
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        let prom = self.inner.register_gauge(key, metadata);
        let Some(i) = INSTRUMENTS.get() else {
            return prom;
        };
        let otel = cached(&i.gauges, key.name(), || {
            i.meter.f64_gauge(otel_name(key.name())).build()
        });
        let value = i
            .values
            .lock()
            .expect("not poisoned")
            .entry(key.clone())
            .or_default()
            .clone();
        Gauge::from_arc(Arc::new(Both {
            prom,
            otel,
            attrs: attributes(key),
            value: Some(value),
        }))
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        let prom = self.inner.register_histogram(key, metadata);
        let Some(i) = INSTRUMENTS.get() else {
            return prom;
        };
        let name = key.name();
        let otel = cached(&i.histograms, name, || {
            let b = i.meter.f64_histogram(otel_name(name));
            if name.ends_with("_seconds") {
                b.with_unit("s")
            } else {
                b
            }
            .build()
        });
        Histogram::from_arc(Arc::new(Both {
            prom,
            otel,
            attrs: attributes(key),
            value: None,
        }))
    }
}

/// One series on both sides.
struct Both<P, O> {
    prom: P,
    otel: O,
    attrs: Vec<KeyValue>,
    /// A gauge's value.
    value: Option<Arc<Mutex<f64>>>,
}

impl CounterFn for Both<Counter, otel::Counter<u64>> {
    fn increment(&self, value: u64) {
        self.prom.increment(value);
        self.otel.add(value, &self.attrs);
    }

    fn absolute(&self, value: u64) {
        self.prom.absolute(value);
    }
}

impl Both<Gauge, otel::Gauge<f64>> {
    fn change(&self, f: impl FnOnce(f64) -> f64) {
        if let Some(v) = &self.value {
            let mut v = v.lock().expect("not poisoned");
            *v = f(*v);
            self.otel.record(*v, &self.attrs);
        }
    }
}

impl GaugeFn for Both<Gauge, otel::Gauge<f64>> {
    fn increment(&self, value: f64) {
        self.prom.increment(value);
        self.change(|v| v + value);
    }

    fn decrement(&self, value: f64) {
        self.prom.decrement(value);
        self.change(|v| v - value);
    }

    fn set(&self, value: f64) {
        self.prom.set(value);
        self.change(|_| value);
    }
}

impl HistogramFn for Both<Histogram, otel::Histogram<f64>> {
    fn record(&self, value: f64) {
        self.prom.record(value);
        self.otel.record(value, &self.attrs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_take_their_opentelemetry_form() {
        assert_eq!(otel_name("oncely_requests_total"), "oncely.requests");
        assert_eq!(
            otel_name("oncely_upstream_seconds"),
            "oncely.upstream.duration"
        );
        assert_eq!(otel_name("oncely_in_flight"), "oncely.in_flight");
        assert_eq!(
            otel_attribute("route", "POST /v1/render"),
            KeyValue::new("http.route", "/v1/render")
        );
        assert_eq!(
            otel_attribute("route", "* /v1/{*rest}"),
            KeyValue::new("http.route", "/v1/{*rest}")
        );
        assert_eq!(
            otel_attribute("status", "fresh").key.as_str(),
            "oncely.status"
        );
        assert_eq!(
            otel_attribute("result", "dead").key.as_str(),
            "oncely.result"
        );
    }
}
