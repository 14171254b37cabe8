//! `fingerprint_fields`: the intention is made of the fields a route names, so a retry
//! that rewords a note (or makes up a reference) is the same call, and one that changes
//! a named field is another; in JSON, in a form, under a client key.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::common::{post, upstream, Gateway};

/// An upstream that counts its executions at `/v1/payments`.
async fn counting() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let router = axum::Router::new().route(
        "/v1/payments",
        axum::routing::post(move || {
            let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
            async move { format!("{{\"payment\": {n}}}") }
        }),
    );
    (upstream(router).await, calls)
}

fn gateway(up: std::net::SocketAddr, key: &str) -> (Gateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    let store = format!("sqlite://{}", dir.path().join("ledger.db").display());
    std::fs::write(
        &cfg,
        format!(
            "store = \"{store}\"\nupstream = \"http://{up}\"\n[[routes]]\nmethod = \"POST\"\n\
             path = \"/v1/payments\"\nkey = \"{key}\"\n\
             fingerprint_fields = [\"/amount\", \"/to\"]\n"
        ),
    )
    .unwrap();
    (
        Gateway::start(&["--config", cfg.to_str().unwrap()], &[]),
        dir,
    )
}

const JSON: (&str, &str) = ("content-type", "application/json");
const FORM: (&str, &str) = ("content-type", "application/x-www-form-urlencoded");
const ALICE: (&str, &str) = ("authorization", "Bearer sk_alice");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reworded_note_is_the_same_call_and_a_changed_amount_another() {
    let (up, calls) = counting().await;
    let (gw, _dir) = gateway(up, "fingerprint");
    let url = gw.url("/v1/payments");
    let send = |body: &'static str, kind: (&'static str, &'static str)| {
        let url = url.clone();
        async move { post(&url, body, &[ALICE, kind]).await }
    };
    let first = send(r#"{"amount": 100, "to": "bob", "note": "rent"}"#, JSON).await;
    assert_eq!(first.header("oncely-status"), "fresh", "{}", first.text());
    let reworded = send(
        r#"{"note": "rent for May, as agreed", "to": "bob", "amount": 1e2}"#,
        JSON,
    )
    .await;
    assert_eq!(
        reworded.header("oncely-status"),
        "replayed",
        "{}",
        reworded.text()
    );
    assert_eq!(reworded.body, first.body);
    let other = send(r#"{"amount": 200, "to": "bob", "note": "rent"}"#, JSON).await;
    assert_eq!(other.header("oncely-status"), "fresh", "{}", other.text());
    let no_to = send(r#"{"amount": 100, "note": "rent"}"#, JSON).await;
    assert_eq!(
        no_to.header("oncely-status"),
        "fresh",
        "an absent field counts as absent"
    );
    // A form: its fields by name.
    let form = send("amount=100&to=bob&note=rent", FORM).await;
    assert_eq!(form.header("oncely-status"), "fresh", "{}", form.text());
    let form_again = send("note=rent+for+May&to=bob&amount=100", FORM).await;
    assert_eq!(form_again.header("oncely-status"), "replayed");
    assert_eq!(calls.load(Ordering::SeqCst), 4, "fresh four times, no more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_client_key_a_reworded_note_replays_and_a_changed_amount_is_refused() {
    let (up, calls) = counting().await;
    let (gw, _dir) = gateway(up, "header");
    let url = gw.url("/v1/payments");
    let key = ("idempotency-key", "pay-1");
    let first = post(
        &url,
        r#"{"amount": 100, "to": "bob", "note": "rent"}"#,
        &[ALICE, JSON, key],
    )
    .await;
    assert_eq!(first.header("oncely-status"), "fresh", "{}", first.text());
    let reworded = post(
        &url,
        r#"{"amount": 100, "to": "bob", "note": "May"}"#,
        &[ALICE, JSON, key],
    )
    .await;
    assert_eq!(
        reworded.header("oncely-status"),
        "replayed",
        "{}",
        reworded.text()
    );
    let changed = post(
        &url,
        r#"{"amount": 300, "to": "bob", "note": "rent"}"#,
        &[ALICE, JSON, key],
    )
    .await;
    assert_eq!(changed.status, 422, "{}", changed.text());
    assert_eq!(changed.json()["code"], "key_reused");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
