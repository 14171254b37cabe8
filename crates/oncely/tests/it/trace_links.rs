//! The span that executed an original is kept with its record: a `joined` and a
//! `replayed` answer's span links to it, also when another instance on the same
//! PostgreSQL executed it (two `oncely serve` processes exporting to one real OTLP
//! receiver, `tests/otlp/receiver.py`).

use std::time::Duration;

use opentelemetry_proto::tonic::trace::v1::span::SpanKind;

use crate::common::{post as http_post, upstream, Gateway};
use crate::otlp::{attr_of, Got, Mode, Receiver};

const AUTH: [(&str, &str); 1] = [("authorization", "Bearer sk_links")];

fn instance(g: &Got) -> String {
    match attr_of(&g.resource, "service.instance.id") {
        Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => s,
        other => panic!("service.instance.id is {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_and_a_replay_at_another_instance_link_to_the_span_that_executed_the_original() {
    let store = crate::cluster::fresh_schema(&crate::cluster::shared_url()).await;
    let up = upstream(axum::Router::new().route(
        "/v1/render",
        axum::routing::post(|body: String| async move {
            tokio::time::sleep(Duration::from_millis(1200)).await;
            format!("rendered {body}")
        }),
    ))
    .await;
    let up = format!("http://{up}");
    let rx = Receiver::start(Mode::Ok);
    let endpoint = rx.http_url();
    let envs = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ("OTEL_METRICS_EXPORTER", "none"),
    ];
    let a = Gateway::start(&["--upstream", &up, "--store", &store], &envs);
    let b = Gateway::start(&["--upstream", &up, "--store", &store], &envs);
    let original = {
        let url = a.url("/v1/render");
        tokio::spawn(async move { http_post(&url, "chapter 9", &AUTH).await })
    };
    // The original's span at A is the one that executes; B's duplicate joins it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let joined = http_post(&b.url("/v1/render"), "chapter 9", &AUTH).await;
    assert_eq!(
        joined.header("oncely-status"),
        "joined",
        "{}",
        joined.text()
    );
    let fresh = original.await.unwrap();
    assert_eq!(fresh.header("oncely-status"), "fresh");
    let replayed = http_post(&b.url("/v1/render"), "chapter 9", &AUTH).await;
    assert_eq!(replayed.header("oncely-status"), "replayed");

    let servers = rx
        .wait_for(3, |g| g.span.kind == SpanKind::Server as i32)
        .await;
    let by = |status: &str| {
        servers
            .iter()
            .find(|g| g.str("oncely.status") == status)
            .unwrap_or_else(|| panic!("no {status} span: {servers:#?}"))
            .clone()
    };
    let (fresh, joined, replayed) = (by("fresh"), by("joined"), by("replayed"));
    assert_ne!(instance(&fresh), instance(&joined), "two instances");
    assert_eq!(instance(&joined), instance(&replayed));
    for repeat in [&joined, &replayed] {
        assert_eq!(repeat.span.links.len(), 1, "{:?}", repeat.span);
        let link = &repeat.span.links[0];
        assert_eq!(link.trace_id, fresh.span.trace_id);
        assert_eq!(link.span_id, fresh.span.span_id);
        assert_ne!(
            repeat.span.trace_id, fresh.span.trace_id,
            "a trace of its own"
        );
    }
    assert!(fresh.span.links.is_empty());
}
