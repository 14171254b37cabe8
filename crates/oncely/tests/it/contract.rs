//! CONTRACT.md read as a black-box tester would: each test names the contract line it
//! checks, found deviating when the binary was exercised from outside, and runs the real
//! binary.

use std::process::Stdio;

use crate::common::{assert_usage_error, get, oncely, post, run, stderr, upstream, Gateway};

/// "A bad argument or bad config exits 2 with a one-line reason on standard error":
/// a command family called without its command is a bad argument too (clap would print
/// its whole help to standard error).
#[test]
fn a_missing_command_exits_2_with_one_line_naming_the_commands() {
    let o = run(&[]);
    assert_usage_error(&o, "serve");
    let o = run(&["ledger"]);
    assert_usage_error(&o, "list, show, resolve, reconcile, purge");
    let o = run(&["webhooks"]);
    assert_usage_error(&o, "dead, redeliver");
}

/// `oncely ledger list | head -1`: a reader that stops reading is not a crash (no panic
/// and backtrace on standard error), and the command ends quietly.
#[test]
fn a_closed_standard_output_ends_a_command_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("l.db").display());
    for args in [
        vec!["ledger", "list", "--store", &store],
        vec!["usage", "--store", &store],
        vec!["ledger", "list", "--json", "--store", &store],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        // The reader is gone before the command writes a byte: every write is EPIPE.
        drop(reader);
        let o = oncely()
            .args(&args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(0), "{args:?}: {err}");
    }
}

/// Starts a gateway whose `POST /act` is an `action` route in front of an upstream that
/// answers 500 (so every first request leaves an `outcome_unknown` record), with the
/// admin API open to `Bearer t0ken`.
async fn gateway_with_unknown_outcomes(dir: &std::path::Path) -> Gateway {
    let up = upstream(
        axum::Router::new()
            .fallback(|| async { (http::StatusCode::INTERNAL_SERVER_ERROR, "maybe") }),
    )
    .await;
    let file = dir.join("c.toml");
    std::fs::write(
        &file,
        format!(
            "upstream = \"http://{up}\"\nstore = \"sqlite://{}\"\n\n\
             [[routes]]\nmethod = \"POST\"\npath = \"/act\"\nclass = \"action\"\n",
            dir.join("l.db").display()
        ),
    )
    .unwrap();
    Gateway::start(
        &["--config", file.to_str().unwrap()],
        &[("ONCELY_ADMIN_TOKEN", "t0ken")],
    )
}

/// "`POST /records/ID/resolve` (same meaning as the CLI)": the CLI's `--header 'Name:
/// value'` is also taken as a list of such lines, the verdict also as
/// `{"state": "released" | "completed"}`; and `GET /records?principal=P` takes the raw
/// principal as `ledger list --principal P` does, not only its hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_reads_principals_and_resolutions_as_the_cli_does() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway_with_unknown_outcomes(dir.path()).await;
    let auth = [("authorization", "Bearer t0ken")];
    let mut ids = Vec::new();
    for body in ["one", "two", "three"] {
        let res = post(&gw.url("/act"), body, &[("authorization", "Bearer alice")]).await;
        assert_eq!(res.status, 500, "{}", res.text());
        ids.push(res.header("oncely-record").to_owned());
    }
    let res = post(&gw.url("/act"), "other", &[("authorization", "Bearer bob")]).await;
    assert_eq!(res.status, 500);

    let list = get(&gw.admin_url("/records?principal=Bearer%20alice"), &auth).await;
    assert_eq!(list.status, 200, "{}", list.text());
    assert_eq!(list.json().as_array().unwrap().len(), 3, "{}", list.text());
    let hash = list.json()[0]["principal"].as_str().unwrap().to_owned();
    let by_hash = get(&gw.admin_url(&format!("/records?principal={hash}")), &auth).await;
    assert_eq!(by_hash.json().as_array().unwrap().len(), 3);

    let res = post(
        &gw.admin_url(&format!("/records/{}/resolve", ids[0])),
        r#"{"completed": true, "status": 201, "body": "made", "headers": ["Content-Type: text/plain", "X-Order: 7"]}"#,
        &auth,
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["state"], "completed");
    let again = post(&gw.url("/act"), "one", &[("authorization", "Bearer alice")]).await;
    assert_eq!(again.status, 201);
    assert_eq!(again.text(), "made");
    assert_eq!(again.header("x-order"), "7");
    assert_eq!(again.header("content-type"), "text/plain");

    let res = post(
        &gw.admin_url(&format!("/records/{}/resolve", ids[1])),
        r#"{"state": "released"}"#,
        &auth,
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["state"], "released");
    let res = post(
        &gw.admin_url(&format!("/records/{}/resolve", ids[2])),
        r#"{"state": "completed", "status": 200, "headers": {"X-A": "b"}}"#,
        &auth,
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.json()["response"]["headers"][0][0], "x-a");

    // Contradictions and nonsense are still refused.
    for bad in [
        r#"{"state": "released", "completed": true, "status": 200}"#,
        r#"{"state": "maybe"}"#,
        r#"{"completed": true, "status": 200, "headers": ["no colon"]}"#,
    ] {
        let res = post(
            &gw.admin_url(&format!("/records/{}/resolve", ids[2])),
            bad,
            &auth,
        )
        .await;
        assert_eq!(res.status, 400, "{bad}: {}", res.text());
    }
}

/// "One structured log line per guarded request (JSON with `--log-format json`), with:
/// `record`, `route`, `principal`, `status`, `attempt`, `workflow_id`,
/// `upstream_status`, `provider_request_id`, `duration_ms`": every line has every key,
/// `null` when the request has no such value (no `X-Workflow-Id`, an upstream without a
/// request id, a bypassed request without a record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_log_line_has_every_contract_field() {
    let up = upstream(axum::Router::new().fallback(|| async { "plain" })).await;
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("l.db").display());
    let gw = Gateway::start(
        &[
            "--upstream",
            &format!("http://{up}"),
            "--store",
            &store,
            "--log-format",
            "json",
        ],
        &[],
    );
    let fresh = post(&gw.url("/a"), "x", &[("authorization", "Bearer a")]).await;
    assert_eq!(fresh.header("oncely-status"), "fresh");
    let replayed = post(&gw.url("/a"), "x", &[("authorization", "Bearer a")]).await;
    assert_eq!(replayed.header("oncely-status"), "replayed");
    let bypassed = post(&gw.url("/a"), "x", &[]).await;
    assert_eq!(bypassed.header("oncely-status"), "bypassed");

    let mut events = Vec::new();
    for _ in 0..50 {
        let lines = gw.lines.lock().unwrap().clone();
        events = lines
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["message"] == "guarded request")
            .collect();
        if events.len() == 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(events.len(), 3, "{events:#?}");
    for e in &events {
        for field in [
            "record",
            "route",
            "principal",
            "status",
            "attempt",
            "workflow_id",
            "upstream_status",
            "provider_request_id",
            "duration_ms",
        ] {
            assert!(e.get(field).is_some(), "{field} missing: {e}");
        }
    }
    assert_eq!(events[0]["status"], "fresh");
    assert_eq!(events[0]["workflow_id"], serde_json::Value::Null);
    assert_eq!(events[0]["provider_request_id"], serde_json::Value::Null);
    assert_eq!(events[0]["upstream_status"], 200);
    assert_eq!(events[2]["status"], "bypassed");
    assert_eq!(events[2]["record"], serde_json::Value::Null);
}

/// "`oncely ledger list [--route R]`": `R` as the record's `route` shows it
/// ("POST /act"), or as the config file writes the route's `path` ("/act").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_list_route_takes_the_route_name_or_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway_with_unknown_outcomes(dir.path()).await;
    for body in ["one", "two"] {
        let res = post(&gw.url("/act"), body, &[("authorization", "Bearer a")]).await;
        assert_eq!(res.status, 500, "{}", res.text());
    }
    let store = format!("sqlite://{}", dir.path().join("l.db").display());
    let count = |route: &str, extra: &[&str]| {
        let mut args = vec![
            "ledger", "list", "--json", "--store", &store, "--route", route,
        ];
        args.extend_from_slice(extra);
        let o = run(&args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v.as_array().unwrap().len()
    };
    assert_eq!(count("POST /act", &[]), 2);
    assert_eq!(count("/act", &[]), 2);
    assert_eq!(count("/act", &["--limit", "1"]), 1);
    assert_eq!(count("/other", &[]), 0);
    assert_eq!(count("GET /act", &[]), 0);
}
