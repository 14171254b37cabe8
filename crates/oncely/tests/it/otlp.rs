//! A real OTLP receiver for the telemetry tests: `tests/otlp/receiver.py`, built on the
//! PyPI `opentelemetry-proto` and `grpcio` packages (installed by `tests/setup.sh` in
//! `target/otlp-venv`), serving OTLP/gRPC and OTLP/HTTP (protobuf, JSON, gzip) on
//! 127.0.0.1. It writes each export it got as a JSON line; [`Receiver`] reads them back
//! and decodes them with opentelemetry-proto's types.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::metrics::v1::Metric;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// How the receiver answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Takes every export.
    Ok,
    /// Refuses each (HTTP 503, gRPC UNAVAILABLE).
    Refuse,
    /// Never answers.
    Hang,
}

/// One export as it arrived.
#[derive(Clone, Debug)]
pub(crate) struct Export {
    pub(crate) signal: String,
    pub(crate) transport: String,
    pub(crate) path: String,
    pub(crate) content_type: String,
    pub(crate) content_encoding: String,
    pub(crate) headers: serde_json::Map<String, serde_json::Value>,
    /// The bytes as they came over the wire (HTTP), or as decoded (gRPC).
    pub(crate) raw: Vec<u8>,
    /// The request as protobuf.
    pub(crate) body: Vec<u8>,
}

impl Export {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.as_str())
    }
}

/// A span as received, with its resource.
#[derive(Clone, Debug)]
pub(crate) struct Got {
    pub(crate) resource: Vec<KeyValue>,
    pub(crate) span: Span,
}

pub(crate) fn attr_of(list: &[KeyValue], key: &str) -> Option<Value> {
    list.iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.clone())
        .and_then(|v| v.value)
}

impl Got {
    pub(crate) fn attr(&self, key: &str) -> Option<Value> {
        attr_of(&self.span.attributes, key)
    }

    pub(crate) fn str(&self, key: &str) -> String {
        match self.attr(key) {
            Some(Value::StringValue(s)) => s,
            other => panic!("{key} is {other:?} on {:?}", self.span),
        }
    }

    pub(crate) fn int(&self, key: &str) -> i64 {
        match self.attr(key) {
            Some(Value::IntValue(i)) => i,
            other => panic!("{key} is {other:?} on {:?}", self.span),
        }
    }

    pub(crate) fn service(&self) -> String {
        match attr_of(&self.resource, "service.name") {
            Some(Value::StringValue(s)) => s,
            other => panic!("service.name is {other:?}"),
        }
    }
}

/// The Python of `target/otlp-venv` (made by `crates/oncely/tests/setup.sh`).
fn python() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let py = target.join("otlp-venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run crates/oncely/tests/setup.sh (scripts/test does)",
        py.display()
    );
    py
}

/// The running receiver; killed when dropped.
pub(crate) struct Receiver {
    child: Child,
    _dir: tempfile::TempDir,
    out: PathBuf,
    /// Its OTLP/gRPC port.
    pub(crate) grpc: u16,
    /// Its OTLP/HTTP port.
    pub(crate) http: u16,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    pub(crate) fn start(mode: Mode) -> Receiver {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("exports.jsonl");
        let ready = dir.path().join("ready.json");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/otlp/receiver.py");
        let mode = match mode {
            Mode::Ok => "ok",
            Mode::Refuse => "refuse",
            Mode::Hang => "hang",
        };
        let child = Command::new(python())
            .arg(&script)
            .args(["--out", out.to_str().unwrap()])
            .args(["--ready", ready.to_str().unwrap()])
            .args(["--mode", mode])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("the OTLP receiver starts");
        let start = Instant::now();
        let ports: serde_json::Value = loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                break serde_json::from_str(&text).unwrap();
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the receiver never got ready"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Receiver {
            child,
            _dir: dir,
            out,
            grpc: ports["grpc"].as_u64().unwrap() as u16,
            http: ports["http"].as_u64().unwrap() as u16,
        }
    }

    /// `http://127.0.0.1:PORT` of the HTTP side.
    pub(crate) fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    /// `http://127.0.0.1:PORT` of the gRPC side.
    pub(crate) fn grpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc)
    }

    /// Every export received so far.
    pub(crate) fn exports(&self) -> Vec<Export> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let b64 = base64::engine::general_purpose::STANDARD;
        text.lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
                Export {
                    signal: s("signal"),
                    transport: s("transport"),
                    path: s("path"),
                    content_type: s("content_type"),
                    content_encoding: s("content_encoding"),
                    headers: v["headers"].as_object().cloned().unwrap_or_default(),
                    raw: b64.decode(s("raw")).unwrap(),
                    body: b64.decode(s("body")).unwrap(),
                }
            })
            .collect()
    }

    /// Every span received so far.
    pub(crate) fn spans(&self) -> Vec<Got> {
        let mut out = Vec::new();
        for e in self.exports().into_iter().filter(|e| e.signal == "traces") {
            let req = ExportTraceServiceRequest::decode(e.body.as_slice()).unwrap();
            for rs in req.resource_spans {
                let resource = rs.resource.map(|r| r.attributes).unwrap_or_default();
                for ss in rs.scope_spans {
                    for span in ss.spans {
                        out.push(Got {
                            resource: resource.clone(),
                            span,
                        });
                    }
                }
            }
        }
        out
    }

    /// Every metric data point batch received so far, by name (the last export's).
    pub(crate) fn metrics(&self) -> Vec<Metric> {
        let mut out = Vec::new();
        for e in self.exports().into_iter().filter(|e| e.signal == "metrics") {
            let req = ExportMetricsServiceRequest::decode(e.body.as_slice()).unwrap();
            for rm in req.resource_metrics {
                for sm in rm.scope_metrics {
                    out.extend(sm.metrics);
                }
            }
        }
        out
    }

    /// Waits (up to 30 s, a guard against a hang, not a speed claim) until `n` spans
    /// match `pick`, and returns them.
    pub(crate) async fn wait_for(&self, n: usize, pick: impl Fn(&Got) -> bool) -> Vec<Got> {
        let start = Instant::now();
        loop {
            let got: Vec<Got> = self.spans().into_iter().filter(|g| pick(g)).collect();
            if got.len() >= n {
                return got;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{n} spans never came; got {:#?}",
                self.spans()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until a metric named `name` arrived.
    pub(crate) async fn wait_for_metric(&self, name: &str) -> Metric {
        let start = Instant::now();
        loop {
            if let Some(m) = self.metrics().into_iter().rev().find(|m| m.name == name) {
                return m;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "metric {name} never came; got {:?}",
                self.metrics()
                    .iter()
                    .map(|m| m.name.clone())
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
