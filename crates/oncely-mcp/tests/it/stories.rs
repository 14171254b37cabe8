//! The stories, each through the gateway and, where the gateway is what makes the
//! difference, directly against the server to show the failure it prevents.

use std::time::Duration;

use oncely_mcp::McpConfig;
use serde_json::json;

use crate::harness::{py_client, python, replay_status, text, Gateway, PaidServer};

const AUTH: &str = "Bearer sk_test_alice";

fn config(upstream: &str) -> McpConfig {
    McpConfig::new("/mcp", upstream)
        .unwrap()
        .with_duration("wait", "20s")
        .unwrap()
}

/// (a) A client times out during a slow paid render and cancels (2025-11-25:
/// `notifications/cancelled`; 2026-07-28: closes the stream); its retry with the same
/// arguments gets the original's result, and the tool ran once, to its end.
async fn timeout_cancel_then_retry(mode: &str) {
    let Some(py) = python() else { return };
    let plan = json!([
        {"call": "render", "args": {"text": "chapter one"}, "timeout": 0.8},
        {"call": "render", "args": {"text": "chapter one"}}
    ]);

    let direct = PaidServer::start(&py, 2.0);
    let out = py_client(&py, &direct.url, mode, AUTH, plan.clone()).await;
    assert_eq!(out["steps"][0]["error"]["kind"], "timeout", "{out}");
    let (starts, _, cancels) = direct.executions("render");
    assert_eq!(
        (starts, cancels),
        (2, 1),
        "direct: the cancel abandons the paid work and the retry pays again"
    );

    let server = PaidServer::start(&py, 2.0);
    let gw = Gateway::start(config(&server.url)).await;
    let out = py_client(&py, &gw.url, mode, AUTH, plan).await;
    assert_eq!(out["steps"][0]["error"]["kind"], "timeout", "{out}");
    let retry = &out["steps"][1];
    assert!(
        text(retry).contains("render #1"),
        "the retry gets the original's result: {retry}"
    );
    assert_eq!(replay_status(retry).as_deref(), Some("joined"), "{retry}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        server.executions("render"),
        (1, 1, 0),
        "executed once, never cancelled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_runs_once_and_its_retry_gets_the_result_session_era() {
    timeout_cancel_then_retry("legacy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stream_runs_once_and_its_retry_gets_the_result_stateless_era() {
    timeout_cancel_then_retry("2026-07-28").await;
}

/// (b) replay after completion, (g) different `_meta`/progressToken/id still dedupe while
/// different arguments do not, (e) a read-only tool executes every time.
async fn replay_keys_and_read_only(mode: &str) {
    let Some(py) = python() else { return };
    let plan = json!([
        {"list_tools": true},
        {"call": "render", "args": {"text": "hello", "voice": {"b": 2, "a": 1}}, "meta": {"trace": "one"}},
        {"call": "render", "args": {"voice": {"a": 1, "b": 2}, "text": "hello"}, "meta": {"trace": "two"}, "progress": true},
        {"call": "render", "args": {"text": "hello!"}},
        {"call": "balance"},
        {"call": "balance"}
    ]);

    let direct = PaidServer::start(&py, 0.3);
    py_client(&py, &direct.url, mode, AUTH, plan.clone()).await;
    assert_eq!(
        direct.executions("render").0,
        3,
        "direct: every repeat is charged"
    );

    let server = PaidServer::start(&py, 0.3);
    let gw = Gateway::start(config(&server.url)).await;
    let out = py_client(&py, &gw.url, mode, AUTH, plan).await;
    let steps = &out["steps"];
    let (first, repeat, other) = (&steps[1], &steps[2], &steps[3]);
    assert_eq!(replay_status(first), None, "{first}");
    assert_eq!(
        replay_status(repeat).as_deref(),
        Some("replayed"),
        "{repeat}"
    );
    assert_eq!(text(first), text(repeat), "the stored result");
    assert!(
        repeat["result"]["_meta"]["dev.oncely/replay"]["original_at"]
            .as_str()
            .is_some_and(|t| oncely_core::Timestamp::parse_rfc3339(t).is_ok()),
        "{repeat}"
    );
    assert_eq!(
        replay_status(other),
        None,
        "different arguments execute: {other}"
    );
    assert_eq!(server.executions("render").0, 2);
    assert_eq!(
        server.executions("balance").0,
        2,
        "read-only tools are never deduplicated"
    );

    let records = gw.store.list(&Default::default()).await.unwrap();
    let hello = records
        .iter()
        .find(|r| r.repeats == 1)
        .expect("a record with one repeat");
    assert_eq!(hello.route, "/mcp#render");
    assert_eq!(hello.units, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_replay_whatever_the_meta_and_read_only_tools_run_every_time_session_era() {
    replay_keys_and_read_only("legacy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_replay_whatever_the_meta_and_read_only_tools_run_every_time_stateless_era() {
    replay_keys_and_read_only("2026-07-28").await;
}

/// (c) a concurrent repeat joins the original.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_repeat_joins_the_original() {
    let Some(py) = python() else { return };
    let plan = json!([{"parallel": [
        {"call": "render", "args": {"text": "together"}},
        {"call": "render", "args": {"text": "together"}}
    ]}]);
    let direct = PaidServer::start(&py, 1.0);
    py_client(&py, &direct.url, "legacy", AUTH, plan.clone()).await;
    assert_eq!(direct.executions("render").0, 2, "direct: both run");

    let server = PaidServer::start(&py, 1.0);
    let gw = Gateway::start(config(&server.url)).await;
    let out = py_client(&py, &gw.url, "legacy", AUTH, plan).await;
    let both = out["steps"][0]["parallel"].as_array().unwrap();
    let statuses: Vec<_> = both.iter().map(replay_status).collect();
    assert!(
        statuses.contains(&None) && statuses.contains(&Some("joined".into())),
        "{statuses:?}"
    );
    assert_eq!(text(&both[0]), text(&both[1]));
    assert_eq!(server.executions("render").0, 1);
}

/// (d) a repeat that outwaits `wait` gets an isError result telling the model to call
/// again after N seconds; calling again then gets the result.
async fn repeat_after_wait(mode: &str) {
    let Some(py) = python() else { return };
    let server = PaidServer::start(&py, 3.0);
    let config = config(&server.url).with_duration("wait", "1s").unwrap();
    let gw = Gateway::start(config).await;
    let plan = json!([
        {"parallel": [
            {"call": "render", "args": {"text": "long"}},
            {"call": "render", "args": {"text": "long"}}
        ]},
        {"call": "render", "args": {"text": "long"}}
    ]);
    let out = py_client(&py, &gw.url, mode, AUTH, plan).await;
    let both = out["steps"][0]["parallel"].as_array().unwrap();
    let waiting = both
        .iter()
        .find(|s| replay_status(s).as_deref() == Some("in_flight"))
        .unwrap_or_else(|| panic!("one repeat is told to wait: {out}"));
    assert_eq!(waiting["result"]["isError"], true);
    let t = text(waiting);
    assert!(
        t.contains("still running")
            && t.contains("will not run twice")
            && t.contains("after 1 second to receive"),
        "{t}"
    );
    assert_eq!(replay_status(&out["steps"][1]).as_deref(), Some("replayed"));
    assert_eq!(server.executions("render").0, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_after_wait_is_told_the_original_still_runs() {
    repeat_after_wait("legacy").await;
}

/// Issue 12 (2): the official 2026-07-28 client accepts the still-running answer (it
/// carries `resultType`) and shows the model its text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_after_wait_is_told_the_original_still_runs_stateless_era() {
    repeat_after_wait("2026-07-28").await;
}

/// (f) a JSON-RPC error is not stored: the next identical call runs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_rpc_errors_are_not_stored() {
    let Some(py) = python() else { return };
    let server = PaidServer::start(&py, 0.1);
    let gw = Gateway::start(config(&server.url)).await;
    let plan = json!([
        {"call": "flaky", "args": {"text": "x"}},
        {"call": "flaky", "args": {"text": "x"}},
        {"call": "flaky", "args": {"text": "x"}}
    ]);
    let out = py_client(&py, &gw.url, "legacy", AUTH, plan).await;
    assert_eq!(out["steps"][0]["error"]["code"], -32050, "{out}");
    assert!(text(&out["steps"][1]).contains("run #2"));
    assert_eq!(replay_status(&out["steps"][2]).as_deref(), Some("replayed"));
    assert_eq!(server.executions("flaky").0, 2);
}

/// Two accounts never share a result; a call without a principal passes unguarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn principals_are_kept_apart() {
    let Some(py) = python() else { return };
    let server = PaidServer::start(&py, 0.1);
    let gw = Gateway::start(config(&server.url)).await;
    let plan = json!([{"call": "render", "args": {"text": "same"}}]);
    py_client(&py, &gw.url, "legacy", "Bearer alice", plan.clone()).await;
    let bob = py_client(&py, &gw.url, "legacy", "Bearer bob", plan.clone()).await;
    assert_eq!(replay_status(&bob["steps"][0]), None);
    let again = py_client(&py, &gw.url, "legacy", "Bearer bob", plan).await;
    assert_eq!(
        replay_status(&again["steps"][0]).as_deref(),
        Some("replayed"),
        "a new session, same account"
    );
    assert_eq!(server.executions("render").0, 2);
    // One account is one principal everywhere: the gateway's hash of the raw header value,
    // as HTTP routes store it and `oncely ledger list --principal` looks it up.
    let records = gw.store.list(&Default::default()).await.unwrap();
    let mut principals: Vec<_> = records.iter().map(|r| r.principal.clone()).collect();
    principals.sort();
    let mut expected = vec![
        gw.guard.principal_hash(b"Bearer alice"),
        gw.guard.principal_hash(b"Bearer bob"),
    ];
    expected.sort();
    assert_eq!(principals, expected);
}

/// Issue 12 (1): a 2025-11-25 client whose call times out (read timeout 0.5 s on a 2 s
/// paid tool) cancels it and ends its session (`DELETE` with `Mcp-Session-Id`); another
/// session retries. The session's end never reaches the upstream while the guarded call
/// runs on it, so the tool runs once, to its end, and the retry gets its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_times_out_and_ends_its_session_pays_once() {
    let Some(py) = python() else { return };
    let give_up = json!([{"call": "render", "args": {"text": "chapter two"}, "timeout": 0.5}]);
    let retry = json!([{"call": "render", "args": {"text": "chapter two"}}]);

    let direct = PaidServer::start(&py, 2.0);
    let out = py_client(&py, &direct.url, "legacy", AUTH, give_up.clone()).await;
    assert_eq!(out["steps"][0]["error"]["kind"], "timeout", "{out}");
    py_client(&py, &direct.url, "legacy", AUTH, retry.clone()).await;
    assert_eq!(
        direct.executions("render").0,
        2,
        "direct: the session's end aborts the paid work and the retry pays again"
    );

    let server = PaidServer::start(&py, 2.0);
    let gw = Gateway::start(config(&server.url)).await;
    let out = py_client(&py, &gw.url, "legacy", AUTH, give_up).await;
    assert_eq!(out["steps"][0]["error"]["kind"], "timeout", "{out}");
    let out = py_client(&py, &gw.url, "legacy", AUTH, retry).await;
    let step = &out["steps"][0];
    assert!(text(step).contains("render #1"), "{step}");
    assert!(
        matches!(replay_status(step).as_deref(), Some("joined" | "replayed")),
        "the retry gets the replay _meta: {step}"
    );
    // The held session end reaches the server once the call is recorded.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        server.executions("render"),
        (1, 1, 0),
        "started once, ran to its end, never cancelled"
    );
    let records = gw.store.list(&Default::default()).await.unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].state, oncely_core::State::Completed);
}
