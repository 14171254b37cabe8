//! OpenTelemetry as operators configure it: only `OTEL_*` variables (no config file, no
//! `[tracing]`), through the real binary, against a real OTLP receiver
//! ([`crate::otlp`]): each protocol (gRPC, HTTP protobuf, HTTP JSON), headers, gzip, a
//! signal's own endpoint, the resource, each sampler, `OTEL_SDK_DISABLED`, a refusing and
//! a hanging collector over gRPC, bad values (exit 2 naming the variable), and no secret
//! in any exported byte.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use http::HeaderMap;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;

use crate::common::{get, oncely, post as http_post, upstream, Gateway};
use crate::otlp::{attr_of, Mode, Receiver};

const SECRET_KEY: &str = "sk_live_vendor_api_key_4242";
const CALLER: &str = "Bearer sk_alice_caller_secret_77";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// An upstream that answers 201 and keeps each call's `traceparent`.
async fn render() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    let app = axum::Router::new().route(
        "/{*rest}",
        post(move |headers: HeaderMap, body: String| {
            let kept = kept.clone();
            async move {
                let tp = headers
                    .get("traceparent")
                    .map(|v| v.to_str().unwrap().to_string())
                    .unwrap_or_default();
                kept.lock().unwrap().push(tp);
                (
                    http::StatusCode::CREATED,
                    format!("{{\"ok\":{}}}", body.len()),
                )
            }
        }),
    );
    (upstream(app).await, seen)
}

/// `oncely serve --upstream URL --store sqlite://...` with these variables (and a short
/// batch delay, so that spans come within a test's patience).
fn gateway(up: SocketAddr, dir: &std::path::Path, envs: &[(&str, &str)]) -> Gateway {
    let mut all = vec![
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
    ];
    all.extend_from_slice(envs);
    let store = format!("sqlite://{}", dir.join("ledger.db").display());
    Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", &store],
        &all,
    )
}

async fn call(gw: &Gateway, body: &str, traceparent: Option<&str>) -> u16 {
    let mut headers = vec![
        ("authorization", CALLER),
        ("content-type", "application/json"),
    ];
    if let Some(tp) = traceparent {
        headers.push(("traceparent", tp));
    }
    let a = http_post(&gw.url("/v1/render"), body, &headers).await;
    assert_eq!(a.status, 201, "{}", a.text());
    a.status.as_u16()
}

/// No export's bytes hold a secret: the caller's credential, the vendor key.
fn assert_no_secret(rx: &Receiver) {
    for e in rx.exports() {
        for bytes in [&e.raw, &e.body] {
            let text = String::from_utf8_lossy(bytes);
            for secret in [SECRET_KEY, "sk_alice_caller_secret_77"] {
                assert!(
                    !text.contains(secret),
                    "{secret} in an export of {}",
                    e.signal
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_alone_exports_over_each_protocol_with_headers_gzip_and_the_resource() {
    let (up, _) = render().await;
    for (protocol, gzip) in [
        ("grpc", true),
        ("http/protobuf", true),
        ("http/json", false),
    ] {
        let rx = Receiver::start(Mode::Ok);
        let dir = tempfile::tempdir().unwrap();
        let endpoint = if protocol == "grpc" {
            rx.grpc_url()
        } else {
            rx.http_url()
        };
        let headers = format!("x-api-key={SECRET_KEY},x-team=edge%20one");
        let mut envs = vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_EXPORTER_OTLP_HEADERS", headers.as_str()),
            ("OTEL_SERVICE_NAME", "payments-edge"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment.name=test,team=pay",
            ),
        ];
        if gzip {
            envs.push(("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"));
        }
        let gw = gateway(up, dir.path(), &envs);
        call(&gw, &format!("{{\"p\":\"{protocol}\"}}"), None).await;
        let spans = rx
            .wait_for(1, |g| g.span.kind == SpanKind::Server as i32)
            .await;
        let s = &spans[0];
        assert_eq!(s.service(), "payments-edge", "{protocol}");
        assert_eq!(
            attr_of(&s.resource, "deployment.environment.name"),
            Some(Value::StringValue("test".into()))
        );
        assert!(attr_of(&s.resource, "service.instance.id").is_some());
        assert!(attr_of(&s.resource, "service.version").is_some());
        let e = rx
            .exports()
            .into_iter()
            .find(|e| e.signal == "traces")
            .unwrap();
        assert_eq!(e.header("x-api-key"), Some(SECRET_KEY), "{protocol}");
        assert_eq!(e.header("x-team"), Some("edge one"), "{protocol}");
        match protocol {
            "grpc" => assert_eq!(e.transport, "grpc"),
            "http/protobuf" => {
                assert_eq!(
                    (e.path.as_str(), e.content_type.as_str()),
                    ("/v1/traces", "application/x-protobuf")
                );
                assert_eq!(e.content_encoding, "gzip");
            }
            _ => {
                assert_eq!(e.content_type, "application/json");
                assert_eq!(e.content_encoding, "");
            }
        }
        // Metrics go to the same collector: the server's request duration, and the
        // instruments of /metrics under their OpenTelemetry names.
        let duration = rx.wait_for_metric("http.server.request.duration").await;
        assert_eq!(duration.unit, "s");
        let requests = rx.wait_for_metric("oncely.requests").await;
        let text = format!("{requests:?}");
        for needle in ["\"http.route\"", "\"oncely.status\"", "\"fresh\""] {
            assert!(text.contains(needle), "{needle} not in {text}");
        }
        assert_no_secret(&rx);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_s_own_endpoint_is_used_as_it_is_and_only_that_signal_is_exported() {
    let (up, _) = render().await;
    let rx = Receiver::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let own = format!("{}/custom/traces-in", rx.http_url());
    let gw = gateway(
        up,
        dir.path(),
        &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &own)],
    );
    call(&gw, "{}", None).await;
    rx.wait_for(1, |_| true).await;
    let exports = rx.exports();
    assert!(
        exports.iter().all(|e| e.path == "/custom/traces-in"),
        "{exports:?}"
    );
    // (A pause, not a timing claim: several metric intervals, had metrics been on.)
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(rx.exports().iter().all(|e| e.signal == "traces"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sampler_decides_as_the_specification_says() {
    let (up, _) = render().await;
    let sampled = format!("00-{TRACE}-00f067aa0ba902b7-01");
    let unsampled = format!("00-{TRACE}-00f067aa0ba902b7-00");
    // (sampler, arg, traceparent, exported?)
    let cases: &[(&str, &str, Option<&str>, bool)] = &[
        ("always_on", "", Some(&unsampled), true),
        ("always_off", "", Some(&sampled), false),
        ("traceidratio", "0", Some(&sampled), false),
        ("traceidratio", "1", None, true),
        ("parentbased_always_on", "", Some(&unsampled), false),
        ("parentbased_always_on", "", None, true),
        ("parentbased_always_off", "", Some(&sampled), true),
        ("parentbased_always_off", "", None, false),
        ("parentbased_traceidratio", "0", Some(&sampled), true),
        ("parentbased_traceidratio", "0", None, false),
    ];
    for (i, (sampler, arg, tp, exported)) in cases.iter().enumerate() {
        let rx = Receiver::start(Mode::Ok);
        let dir = tempfile::tempdir().unwrap();
        let endpoint = rx.http_url();
        let mut envs = vec![
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                format!("{endpoint}/v1/traces"),
            ),
            ("OTEL_TRACES_SAMPLER", sampler.to_string()),
        ];
        if !arg.is_empty() {
            envs.push(("OTEL_TRACES_SAMPLER_ARG", arg.to_string()));
        }
        let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let gw = gateway(up, dir.path(), &envs);
        call(&gw, &format!("{{\"case\":{i}}}"), *tp).await;
        // A marker request that is always exported tells the batch has gone... not with
        // always_off; so the exporter's own counter says what was sent.
        let start = Instant::now();
        let counted = loop {
            let text = get(&gw.admin_url("/metrics"), &[]).await.text();
            let n = exported_count(&text);
            if n > 0.0 || start.elapsed() > Duration::from_millis(1500) {
                break n;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let got = rx.spans();
        assert_eq!(
            !got.is_empty(),
            *exported,
            "{sampler} {arg} {tp:?}: {} spans, {counted} counted",
            got.len()
        );
    }
}

fn exported_count(text: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with("oncely_trace_spans_exported_total "))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_sdk_disabled_exports_nothing_and_passes_traceparent_as_it_came() {
    let (up, seen) = render().await;
    let rx = Receiver::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let endpoint = rx.http_url();
    let gw = gateway(
        up,
        dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SDK_DISABLED", "true"),
        ],
    );
    let tp = format!("00-{TRACE}-00f067aa0ba902b7-01");
    call(&gw, "{}", Some(&tp)).await;
    assert_eq!(seen.lock().unwrap()[0], tp);
    // (A pause, not a timing claim: several export rounds, had there been an exporter.)
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(rx.exports().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_or_hanging_grpc_collector_costs_requests_nothing_and_drops_are_counted() {
    let (up, seen) = render().await;
    for mode in [Mode::Refuse, Mode::Hang] {
        let rx = Receiver::start(mode);
        let dir = tempfile::tempdir().unwrap();
        let endpoint = rx.grpc_url();
        let gw = Arc::new(gateway(
            up,
            dir.path(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
                ("OTEL_BSP_MAX_QUEUE_SIZE", "4"),
                ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2"),
                ("OTEL_BSP_SCHEDULE_DELAY", "20"),
                ("OTEL_METRICS_EXPORTER", "none"),
            ],
        ));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..40 {
            let gw = gw.clone();
            tasks.push(tokio::spawn(async move {
                call(&gw, &format!("{{\"{mode:?}\":{i}}}"), None).await
            }));
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .unwrap_or_else(|_| panic!("a request hung with a {mode:?} collector"))
                .unwrap();
        }
        // Not a speed claim: 40 requests on loopback are far below the 60 s timeout an
        // export would wait, had a request waited for one.
        assert!(started.elapsed() < Duration::from_secs(30));
        let start = Instant::now();
        loop {
            let text = get(&gw.admin_url("/metrics"), &[]).await.text();
            let dropped: f64 = text
                .lines()
                .filter(|l| l.starts_with("oncely_trace_spans_dropped_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            if dropped > 0.0 {
                assert_eq!(exported_count(&text), 0.0, "{mode:?}");
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{mode:?}: nothing dropped:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(seen.lock().unwrap().len(), 80);
}

#[test]
fn a_bad_variable_exits_2_naming_it_in_serve_and_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(&cfg, "upstream = \"http://127.0.0.1:1\"\n").unwrap();
    for (var, value) in [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift"),
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"),
        ("OTEL_EXPORTER_OTLP_HEADERS", "broken"),
    ] {
        let mut envs = vec![(var, value)];
        if var != "OTEL_EXPORTER_OTLP_ENDPOINT" {
            envs.push(("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"));
        }
        let check = oncely()
            .args(["check-config", cfg.to_str().unwrap()])
            .envs(envs.iter().copied())
            .output()
            .unwrap();
        assert_eq!(check.status.code(), Some(2), "check-config {var}");
        let err = String::from_utf8_lossy(&check.stderr);
        assert!(err.contains(var), "check-config {var}: {err}");
        let serve = oncely()
            .args([
                "serve",
                "--config",
                cfg.to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ])
            .envs(envs.iter().copied())
            .output()
            .unwrap();
        assert_eq!(serve.status.code(), Some(2), "serve {var}");
        let err = String::from_utf8_lossy(&serve.stderr);
        assert!(err.contains(var), "serve {var}: {err}");
    }
}

/// The file's `compression = "none"` wins over `OTEL_EXPORTER_OTLP_COMPRESSION=gzip` for
/// the spans (OTLP/HTTP protobuf: oncely's own exporter), and the metrics exporter, which
/// the OpenTelemetry crate configures from the variable itself, is said to stay gzip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_s_compression_none_wins_over_the_variable_and_what_cannot_follow_is_said() {
    let (up, _) = render().await;
    let rx = Receiver::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            "store = \"sqlite://{db}\"\nupstream = \"http://{up}\"\n[tracing]\notlp_endpoint = \"{endpoint}\"\ncompression = \"none\"\nschedule_delay = \"100ms\"\n",
            db = dir.path().join("ledger.db").display(),
            endpoint = rx.http_url(),
        ),
    )
    .unwrap();
    let endpoint = rx.http_url();
    let gw = Gateway::start(
        &["--config", cfg.to_str().unwrap()],
        &[
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            (
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                &format!("{endpoint}/v1/metrics"),
            ),
            ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
        ],
    );
    call(&gw, "{\"compression\":\"none\"}", None).await;
    rx.wait_for(1, |g| g.span.kind == SpanKind::Server as i32)
        .await;
    let traces: Vec<_> = rx
        .exports()
        .into_iter()
        .filter(|e| e.signal == "traces")
        .collect();
    assert!(!traces.is_empty());
    for e in &traces {
        assert_eq!(e.content_encoding, "", "spans are not compressed");
    }
    rx.wait_for_metric("http.server.request.duration").await;
    let metrics = rx
        .exports()
        .into_iter()
        .find(|e| e.signal == "metrics")
        .unwrap();
    assert_eq!(
        metrics.content_encoding, "gzip",
        "the crate read the variable"
    );
    let lines = gw.lines.lock().unwrap().join("\n");
    assert!(
        lines.contains("cannot override OTEL_EXPORTER_OTLP_COMPRESSION=gzip")
            && lines.contains("metrics"),
        "{lines}"
    );
}

/// `oncely_trace_spans_dropped_total{reason=...}` from `/metrics` text.
fn dropped_count(text: &str, reason: &str) -> f64 {
    let line = format!("oncely_trace_spans_dropped_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find(|l| l.starts_with(&line))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// A collector that answers OTLP/HTTP protobuf exports with 503 (busy): each batch is sent
/// again with backoff within the export timeout, then dropped and counted, and the
/// exporter goes on with the next batch (its pauses run where a timer exists: the batch
/// processor's own thread has none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_http_collector_gets_each_batch_again_then_it_is_dropped_and_export_goes_on() {
    let (up, _) = render().await;
    let rx = Receiver::start(Mode::Refuse);
    let dir = tempfile::tempdir().unwrap();
    let endpoint = rx.http_url();
    let gw = gateway(
        up,
        dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
            ("OTEL_METRICS_EXPORTER", "none"),
        ],
    );
    let traces = |rx: &Receiver| rx.exports().iter().filter(|e| e.signal == "traces").count();
    let mut dropped = 0.0;
    for round in 1..=2 {
        call(&gw, &format!("{{\"round\":{round}}}"), None).await;
        let start = Instant::now();
        loop {
            let text = get(&gw.admin_url("/metrics"), &[]).await.text();
            let now = dropped_count(&text, "export_failed");
            if now > dropped {
                dropped = now;
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "round {round}: the refused batch was never counted dropped \
                 ({} exports seen):\n{text}",
                traces(&rx)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            exported_count(&get(&gw.admin_url("/metrics"), &[]).await.text()),
            0.0
        );
    }
    // Both batches were sent more than once (resends), and the second came at all.
    assert!(traces(&rx) >= 4, "{} trace exports", traces(&rx));
    let names: std::collections::HashSet<Vec<u8>> = rx
        .exports()
        .iter()
        .filter(|e| e.signal == "traces")
        .map(|e| e.raw.clone())
        .collect();
    assert_eq!(names.len(), 2, "two batches, each sent again unchanged");
}
