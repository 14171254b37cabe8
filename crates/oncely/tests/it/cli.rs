//! The ledger commands against a real SQLite file, and the CLI's exit codes.

use std::path::Path;
use std::time::Duration;

use oncely_core::{
    ClaimSpec, Class, Completion, Fingerprint, Identity, Record, State, StoredResponse,
};
use oncely_store::{Claim, Repeat, RepeatKind, StoreOptions};

use crate::common::{assert_usage_error, oncely, run, stderr, stdout};

#[test]
fn an_unknown_store_scheme_exits_2_with_one_line() {
    let o = run(&["ledger", "list", "--store", "redis://localhost/x"]);
    assert_usage_error(&o, "unknown store");
    // The environment variable is read too.
    let o = oncely()
        .args(["usage"])
        .env("ONCELY_STORE", "mysql://x")
        .output()
        .unwrap();
    assert_usage_error(&o, "unknown store");
}

#[test]
fn an_unreachable_store_exits_2_with_one_line() {
    let o = run(&[
        "ledger",
        "list",
        "--store",
        "postgres://nobody@127.0.0.1:1/x",
    ]);
    assert_usage_error(&o, "");
    let o = run(&[
        "migrate",
        "--store",
        "sqlite:///nonexistent-dir/x/oncely.db",
    ]);
    assert_usage_error(&o, "");
}

#[test]
fn bad_arguments_exit_2_with_one_line() {
    let o = run(&["ledger", "list", "--status", "done", "--store", "memory:"]);
    assert_usage_error(&o, "done");
    let o = run(&["usage", "--since", "5x", "--store", "memory:"]);
    assert_usage_error(&o, "5x");
    let o = run(&[
        "ledger",
        "resolve",
        "rec_1",
        "--completed",
        "--store",
        "memory:",
    ]);
    assert_usage_error(&o, "--status");
    let o = run(&["ledger", "frobnicate"]);
    assert_usage_error(&o, "frobnicate");
    let o = run(&["serve"]);
    assert_usage_error(&o, "--upstream");
}

#[test]
fn an_unknown_record_id_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("x.db").display());
    for args in [
        vec!["ledger", "show", "rec_nope"],
        vec!["ledger", "resolve", "rec_nope", "--released"],
        vec!["ledger", "reconcile", "rec_nope"],
    ] {
        let mut args = args.clone();
        args.extend(["--store", &store]);
        let o = run(&args);
        assert_usage_error(&o, "no ledger record rec_nope");
    }
}

#[test]
fn no_command_is_a_stub_any_more() {
    // `audit` and `webhooks` without their arguments are usage errors of real commands
    // (`demo` without arguments runs the demo: see tests/it/demo.rs).
    let o = run(&["audit"]);
    assert_usage_error(&o, "<FILE>");
    let o = run(&["webhooks"]);
    assert_usage_error(&o, "dead, redeliver");
    for cmd in ["demo", "audit", "webhooks"] {
        let help = run(&[cmd, "--help"]);
        assert_eq!(help.status.code(), Some(0));
        assert!(!stdout(&help).contains("not available"), "{cmd}");
    }
}

/// Puts records in a SQLite ledger the way a gateway would: one completed, one
/// outcome_unknown, one processing.
async fn seed(path: &Path) -> (Record, Record, Record) {
    let store = oncely_store::open(
        &format!("sqlite://{}", path.display()),
        StoreOptions::default(),
    )
    .await
    .unwrap();
    let spec = |key: &str, class: Class, principal: &str| ClaimSpec {
        identity: Identity::new(
            principal.to_owned(),
            "POST /v1/render".into(),
            class,
            Some(key.to_owned()),
            Fingerprint([7; 32]),
            Some("wf-1".into()),
        ),
        owner: "test/1".into(),
        lease: Duration::from_secs(30),
    };
    let owned = |c: Claim| match c {
        Claim::Owned(r) => r,
        Claim::Existing(r) => panic!("existing {r:?}"),
    };
    let done = owned(
        store
            .claim(&spec("k1", Class::Write, "alice"))
            .await
            .unwrap(),
    );
    let done = store
        .complete(
            &done.fence().unwrap(),
            Completion {
                response: StoredResponse {
                    status: 201,
                    headers: vec![("content-type".into(), "text/plain".into())],
                    body: Some(bytes::Bytes::from_static(b"rendered")),
                },
                units: 12,
                window: Duration::from_secs(3600),
                replay_until: None,
                provider_request_id: Some("req_1".into()),
                trace: None,
            },
        )
        .await
        .unwrap();
    let repeats = Repeat {
        at: done.completed_at.unwrap(),
        kind: RepeatKind::Replayed,
        count: 2,
        units: 24,
    };
    store
        .record_repeats(&done.id, &done.principal, &done.route, &[repeats])
        .await
        .unwrap();
    let unknown = owned(
        store
            .claim(&spec("k2", Class::Action, "bob"))
            .await
            .unwrap(),
    );
    let unknown = store
        .mark_unknown(&unknown.fence().unwrap(), "timeout".into())
        .await
        .unwrap();
    let running = owned(store.claim(&spec("k3", Class::Write, "bob")).await.unwrap());
    (done, unknown, running)
}

/// A SQLite ledger in a new directory, seeded ([`seed`]): the directory, the store URL
/// and the records.
pub(crate) async fn seeded() -> (tempfile::TempDir, String, (Record, Record, Record)) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let records = seed(&db).await;
    (dir, format!("sqlite://{}", db.display()), records)
}

fn json(o: &std::process::Output) -> serde_json::Value {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(o));
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_list_show_resolve_purge_and_usage_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let (done, unknown, running) = seed(&db).await;
    let store = format!("sqlite://{}", db.display());

    // list: newest first, every contract field.
    let all = json(&run(&["ledger", "list", "--json", "--store", &store]));
    let ids: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [running.id.as_str(), unknown.id.as_str(), done.id.as_str()]
    );
    for field in [
        "id",
        "state",
        "route",
        "class",
        "attempt",
        "created_at",
        "completed_at",
        "expires_at",
        "units",
        "repeats",
    ] {
        assert!(all[0].get(field).is_some(), "{field} missing in {}", all[0]);
    }
    let first_done = &all[2];
    assert_eq!(first_done["state"], "completed");
    assert_eq!(first_done["units"], 12);
    assert_eq!(first_done["repeats"], 2);
    assert!(
        oncely_core::Timestamp::parse_rfc3339(first_done["completed_at"].as_str().unwrap()).is_ok()
    );
    assert_eq!(all[0]["completed_at"], serde_json::Value::Null);

    // Filters: status, principal (hash), route; the env var names the store.
    let unknowns = json(
        &oncely()
            .args(["ledger", "list", "--json", "--status", "outcome_unknown"])
            .env("ONCELY_STORE", &store)
            .output()
            .unwrap(),
    );
    assert_eq!(unknowns.as_array().unwrap().len(), 1);
    assert_eq!(unknowns[0]["id"], unknown.id.as_str());
    let none = json(&run(&[
        "ledger",
        "list",
        "--json",
        "--route",
        "GET /other",
        "--store",
        &store,
    ]));
    assert_eq!(none, serde_json::json!([]));
    // Text output lists every record.
    let text = run(&["ledger", "list", "--store", &store]);
    assert_eq!(stdout(&text).lines().count(), 4, "{}", stdout(&text));

    // show: every field, the body as text.
    let shown = json(&run(&[
        "ledger",
        "show",
        done.id.as_str(),
        "--json",
        "--store",
        &store,
    ]));
    assert_eq!(shown["response"]["status"], 201);
    assert_eq!(shown["response"]["body"], "rendered");
    assert_eq!(shown["response"]["body_encoding"], "utf8");
    assert_eq!(shown["provider_request_id"], "req_1");
    assert_eq!(shown["workflow_id"], "wf-1");
    assert_eq!(shown["repeat_units"], 24);

    // resolve --completed with a body file and headers.
    let body = dir.path().join("body.json");
    std::fs::write(&body, br#"{"order":"o_1"}"#).unwrap();
    let o = run(&[
        "ledger",
        "resolve",
        unknown.id.as_str(),
        "--completed",
        "--status",
        "200",
        "--body-file",
        body.to_str().unwrap(),
        "--header",
        "Content-Type: application/json",
        "--store",
        &store,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let after = json(&run(&[
        "ledger",
        "show",
        unknown.id.as_str(),
        "--json",
        "--store",
        &store,
    ]));
    assert_eq!(after["state"], "completed");
    assert_eq!(after["response"]["body"], r#"{"order":"o_1"}"#);
    assert_eq!(
        after["response"]["headers"],
        serde_json::json!([["content-type", "application/json"]])
    );
    // Resolving it again is refused: it is no longer outcome_unknown.
    let again = run(&[
        "ledger",
        "resolve",
        unknown.id.as_str(),
        "--released",
        "--store",
        &store,
    ]);
    assert_usage_error(&again, "completed");
    // A processing record cannot be released by an operator either.
    let busy = run(&[
        "ledger",
        "resolve",
        running.id.as_str(),
        "--released",
        "--store",
        &store,
    ]);
    assert_usage_error(&busy, "processing");

    // usage: the contract's shape.
    let usage = json(&run(&["usage", "--json", "--store", &store]));
    assert!(usage["totals"]["fresh"].as_u64().unwrap() >= 1, "{usage}");
    assert_eq!(usage["totals"]["repeats"], 2);
    assert_eq!(usage["totals"]["repeat_units"], 24);
    let rows = usage["by_principal"].as_array().unwrap();
    assert!(
        rows.iter()
            .any(|r| r["principal"] == "alice" && r["fresh_units"] == 12),
        "{usage}"
    );
    for key in [
        "principal",
        "fresh",
        "fresh_units",
        "repeats",
        "repeat_units",
    ] {
        assert!(rows[0].get(key).is_some(), "{key} missing: {usage}");
    }
    let recent = json(&run(&[
        "usage", "--json", "--since", "1h", "--store", &store,
    ]));
    assert_eq!(recent["totals"]["repeats"], 2);

    // purge: nothing has expired yet.
    let o = run(&["ledger", "purge", "--expired", "--store", &store]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("purged 0"), "{}", stdout(&o));
    let o = run(&["migrate", "--store", &store]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));

    // The store comes from --config too.
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        format!("store = {store:?}\nupstream = \"http://127.0.0.1:1\"\n"),
    )
    .unwrap();
    let via_config = json(&run(&[
        "ledger",
        "list",
        "--json",
        "--config",
        cfg.to_str().unwrap(),
    ]));
    assert_eq!(via_config.as_array().unwrap().len(), 3);
    let _ = State::Completed;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_reconcile_asks_the_route_and_resolves() {
    use axum::routing::get;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("ledger.db");
    let (_, unknown, _) = seed(&db).await;
    let store = format!("sqlite://{}", db.display());
    let expected_key = oncely_core::DownstreamKey::derive(&unknown.scope, &unknown.key);
    let want = expected_key.as_str().to_owned();
    let up = crate::common::upstream(axum::Router::new().route(
        "/v1/orders",
        get(
            move |q: axum::extract::Query<std::collections::HashMap<String, String>>| {
                let want = want.clone();
                async move {
                    if q.get("reference") == Some(&want) {
                        (http::StatusCode::OK, "{\"order\":\"found\"}")
                    } else {
                        (http::StatusCode::NOT_FOUND, "")
                    }
                }
            },
        ),
    ))
    .await;
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
store = {store:?}
upstream = "http://{up}"
[[routes]]
method = "POST"
path = "/v1/render"
class = "action"
reconcile = "GET /v1/orders?reference={{key}}"
"#
        ),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap().to_owned();
    let id = unknown.id.as_str().to_owned();
    let o = {
        let id = id.clone();
        tokio::task::spawn_blocking(move || run(&["ledger", "reconcile", &id, "--config", &cfg]))
            .await
            .unwrap()
    };
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("completed"), "{}", stdout(&o));
    let shown = json(&run(&["ledger", "show", &id, "--json", "--store", &store]));
    assert_eq!(shown["state"], "completed");
    assert_eq!(shown["response"]["status"], 200);
    assert_eq!(shown["response"]["body"], "{\"order\":\"found\"}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolve_refuses_a_record_that_is_not_outcome_unknown_whatever_the_verdict() {
    let (dir, store, (done, _, running)) = seeded().await;
    let body = dir.path().join("body.txt");
    std::fs::write(&body, b"other").unwrap();
    // A completed record is not resolved again, whatever the verdict says: the check
    // that it is outcome_unknown comes first, as in the admin API and the console.
    let completed = format!("record {} is completed, not outcome_unknown", done.id);
    let cases = [
        (&done, vec!["--released"], completed.as_str()),
        (
            &done,
            vec![
                "--completed",
                "--status",
                "200",
                "--body-file",
                body.to_str().unwrap(),
            ],
            &completed,
        ),
        (
            &running,
            vec!["--released"],
            "is processing, not outcome_unknown",
        ),
    ];
    for (record, verdict, refused) in cases {
        let mut args = vec!["ledger", "resolve", record.id.as_str()];
        args.extend(verdict);
        args.extend(["--store", &store]);
        assert_usage_error(&run(&args), refused);
    }
    // Nothing changed.
    let show = |id: &str| json(&run(&["ledger", "show", id, "--json", "--store", &store]));
    let shown = show(done.id.as_str());
    assert_eq!(shown["state"], "completed");
    assert_eq!(shown["response"]["body"], "rendered");
    assert_eq!(show(running.id.as_str())["state"], "processing");
}
