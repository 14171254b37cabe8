//! Issue 37, through the real binary with the real SDKs as the clients: the Python
//! packages `openai`, `anthropic` and `stripe` (pinned; `crates/oncely/tests/setup.sh`
//! installs them in `target/sdk-venv`) and the npm `openai` (pinned in
//! `crates/oncely/tests/sdk/node`, installed there by the same script) run the scripts in
//! `crates/oncely/tests/sdk/` against a gateway in front of a test provider that is
//! slower than the SDK's timeout.
//!
//! - an upload the OpenAI SDK (Python, npm) retries (a new multipart boundary each
//!   attempt) executes once, with and without a key of its own; a JSON call the OpenAI or Anthropic SDK
//!   retries, and a Stripe create retried with the Stripe SDK's own key, execute once;
//! - form bodies are one intention whatever their field order or space encoding, but
//!   not when repeated names change order (plain HTTP, and the Stripe SDK);
//! - each `errors` dialect makes its SDK raise its own typed error with oncely's code;
//! - an `outcome_unknown` is attempted once by SDKs that would otherwise retry a 409 or
//!   a 5xx (`X-Should-Retry: false`, `Stripe-Should-Retry: false`);
//! - a gzip answer is replayed decoded to a caller that accepts only `identity`.
//!
//! Without the venv or the npm packages these tests fail and say to run the setup script.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{json, Value};

use crate::common::{post as http_post, upstream, Answer, Gateway};

/// How long the provider takes on a `/SDK/slow/...` path: longer than the SDK's timeout
/// (`SDK_TIMEOUT`), shorter than the SDK's second attempt's end.
const SLOW: Duration = Duration::from_millis(1600);
/// The SDK's own timeout in the retry tests, in seconds.
const SDK_TIMEOUT: f64 = 1.0;
/// How long the provider takes on a `/SDK/action/...` path, whose gateway `timeout` is
/// 500 ms: the gateway times out, and the action's outcome is unknown.
const ACTION_DELAY: Duration = Duration::from_millis(1500);

const PLAIN_TEXT: &str = "the plain text of a gzip answer, long enough to compress well, \
                          long enough to compress well, long enough to compress well";

// ---------------------------------------------------------------------------------------
// The harness: the SDKs' Python, the provider, the gateway.

/// The Python of `target/sdk-venv` (or `ONCELY_SDK_PYTHON`). Missing: the test fails
/// and says how to make it.
pub(crate) fn sdk_python() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let venv = target.join("sdk-venv/bin/python");
    std::env::var_os("ONCELY_SDK_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([venv.clone()])
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "the SDK client tests need the real SDKs in {}: run crates/oncely/tests/setup.sh",
                venv.display()
            )
        })
}

fn sdk_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/sdk")
}

/// `node` and the npm SDKs of `crates/oncely/tests/sdk/node` (`node_modules`, which the
/// setup script installs with `npm ci`). Missing: the test fails and says how to make it.
fn npm_sdks() -> PathBuf {
    let node = sdk_dir().join("node");
    assert!(
        node.join("node_modules/openai/package.json").exists(),
        "the npm SDK client tests need {}/node_modules: run crates/oncely/tests/setup.sh \
         (it needs Node.js and npm)",
        node.display()
    );
    node
}

/// Runs `crates/oncely/tests/sdk/SCRIPT` (a Python script for the venv's Python; one under
/// `node/` for `node`) with `calls` and returns its results, one per call (each with
/// `attempts`: what the SDK's retry loop sent and got).
async fn sdk(script: &str, calls: Value) -> Vec<Value> {
    let mut cmd = if script.ends_with(".mjs") {
        let mut c = tokio::process::Command::new("node");
        c.current_dir(npm_sdks());
        c
    } else {
        tokio::process::Command::new(sdk_python())
    };
    let out = cmd
        .arg(sdk_dir().join(script))
        .arg(json!({ "calls": calls }).to_string())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("OPENAI_BASE_URL")
        .env_remove("ANTHROPIC_BASE_URL")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!("{script} does not run ({e}): run crates/oncely/tests/setup.sh")
        });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} failed ({}; are the SDKs installed? run crates/oncely/tests/setup.sh):\n{stderr}",
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let report: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("{script} printed no JSON line ({e}): {stdout}\n{stderr}"));
    let results = report["results"].as_array().unwrap().clone();
    for r in &results {
        assert!(
            r.get("harness_error").is_none(),
            "{script} ({} {}) failed in the harness: {}",
            report["sdk"],
            report["version"],
            r["traceback"].as_str().unwrap_or_default()
        );
    }
    results
}

/// The HTTP attempts one SDK call made.
fn attempts(r: &Value) -> &[Value] {
    r["attempts"].as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// One execution the provider saw.
#[derive(Clone, Debug)]
struct Execution {
    path: String,
    content_type: String,
    body: Bytes,
}

/// The test provider: counts its executions and answers each SDK's shape; slow on
/// `/SDK/slow/...` and `/SDK/action/...`.
#[derive(Clone, Default)]
struct Provider {
    seen: Arc<Mutex<Vec<Execution>>>,
}

impl Provider {
    /// The executions of one path.
    fn of(&self, path: &str) -> Vec<Execution> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.path == path)
            .cloned()
            .collect()
    }

    fn count(&self, path: &str) -> usize {
        self.of(path).len()
    }
}

async fn provide(State(p): State<Provider>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let path = parts.uri.path().to_owned();
    let header = |n: &str| {
        parts
            .headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let n = {
        let mut seen = p.seen.lock().unwrap();
        seen.push(Execution {
            path: path.clone(),
            content_type: header("content-type").unwrap_or_default(),
            body,
        });
        seen.iter().filter(|e| e.path == path).count()
    };
    let kind = path.split('/').nth(2).unwrap_or_default();
    match kind {
        "slow" => tokio::time::sleep(SLOW).await,
        "action" => tokio::time::sleep(ACTION_DELAY).await,
        _ => {}
    }
    let json = |v: Value| {
        http::Response::builder()
            .header("content-type", "application/json")
            .body(axum::body::Body::from(v.to_string()))
            .unwrap()
    };
    if path.starts_with("/gzip/") {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(PLAIN_TEXT.as_bytes()).unwrap();
        return http::Response::builder()
            .header("content-type", "text/plain")
            .header("content-encoding", "gzip")
            .body(axum::body::Body::from(gz.finish().unwrap()))
            .unwrap();
    }
    if path.ends_with("/audio/transcriptions") {
        return json(json!({ "text": format!("transcript {n}") }));
    }
    if path.ends_with("/chat/completions") {
        return json(json!({
            "id": format!("chatcmpl-{n}"),
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-test",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": format!("answer {n}")},
                "finish_reason": "stop",
            }],
        }));
    }
    if path.ends_with("/v1/messages") {
        return json(json!({
            "id": format!("msg_{n}"),
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [{"type": "text", "text": format!("answer {n}")}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }));
    }
    if path.ends_with("/v1/customers") {
        return json(json!({"id": format!("cus_{n}"), "object": "customer"}));
    }
    if path.ends_with("/v1/products") {
        return json(json!({"id": format!("prod_{n}"), "object": "product"}));
    }
    http::Response::builder()
        .header("content-type", "text/plain")
        .body(axum::body::Body::from(format!("execution {n}")))
        .unwrap()
}

/// The provider and a gateway in front of it.
///
/// Routes, for each SDK (`openai`, `anthropic`, `stripe`, and `plain`, which has no
/// `errors` dialect; the principal is `Authorization`, which all three SDKs send):
/// `/SDK/slow/{*rest}` (write, provider slower than the SDK), `/SDK/write/{*rest}`
/// (write, provider quick), `/SDK/action/{*rest}` (action, gateway `timeout` 500 ms,
/// provider slower); and `/stripe/fp/{*rest}` (`key = "fingerprint"`), `/form/{*rest}`,
/// `/gzip/{*rest}`. Each SDK's routes carry `errors = "SDK"`, but for the one named by
/// `errors_in_defaults`, whose dialect is set in `[defaults]` instead.
struct Setup {
    gw: Gateway,
    provider: Provider,
    _dir: tempfile::TempDir,
}

impl Setup {
    async fn start(errors_in_defaults: Option<&str>) -> Setup {
        let provider = Provider::default();
        let up = upstream(
            axum::Router::new()
                .fallback(provide)
                .with_state(provider.clone()),
        )
        .await;
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = format!(
            "store = \"sqlite://{}\"\nupstream = \"http://{up}\"\n\n[defaults]\nwindow = \"1h\"\nwait = \"10s\"\n",
            dir.path().join("ledger.db").display()
        );
        if let Some(d) = errors_in_defaults {
            cfg.push_str(&format!("errors = \"{d}\"\n"));
        }
        for sdk in ["openai", "anthropic", "stripe", "plain"] {
            let errors = match (sdk, errors_in_defaults) {
                (_, Some(d)) if d == sdk => String::new(),
                ("plain", _) => "errors = \"problem\"\n".to_owned(),
                _ => format!("errors = \"{sdk}\"\n"),
            };
            for (kind, class, timeout) in [
                ("slow", "write", "10s"),
                ("write", "write", "10s"),
                ("action", "action", "500ms"),
            ] {
                cfg.push_str(&format!(
                    "\n[[routes]]\nmethod = \"POST\"\npath = \"/{sdk}/{kind}/{{*rest}}\"\n\
                     class = \"{class}\"\nkey = \"header-or-fingerprint\"\n\
                     principal = \"header:authorization\"\ntimeout = \"{timeout}\"\n{errors}"
                ));
            }
        }
        cfg.push_str(
            r#"
[[routes]]
method = "POST"
path = "/stripe/fp/{*rest}"
class = "write"
key = "fingerprint"
errors = "stripe"

[[routes]]
method = "POST"
path = "/form/{*rest}"
class = "write"
key = "header-or-fingerprint"

[[routes]]
method = "POST"
path = "/gzip/{*rest}"
class = "write"
key = "header-or-fingerprint"
"#,
        );
        let path = dir.path().join("oncely.toml");
        std::fs::write(&path, cfg).unwrap();
        let gw = Gateway::start(&["--config", path.to_str().unwrap()], &[]);
        Setup {
            gw,
            provider,
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        self.gw.url(path)
    }
}

// ---------------------------------------------------------------------------------------
// 1. An upload retried by the SDK runs once; so do JSON calls.

/// The OpenAI SDK uploads a file with a 1 s timeout to a provider that takes 1.6 s: it
/// retries, each attempt with a new multipart boundary, and a later attempt gets the
/// first one's answer. The provider transcribes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_upload_retried_by_the_sdk_executes_once() {
    let s = Setup::start(None).await;
    let r = &sdk(
        "openai_calls.py",
        json!([{
            "op": "upload",
            "base_url": s.url("/openai/slow/v1"),
            "timeout": SDK_TIMEOUT,
            "max_retries": 3,
            "content": "RIFF one upload's audio",
        }]),
    )
    .await[0];
    let tries = attempts(r);
    assert!(tries.len() >= 2, "the SDK did not retry: {r}");
    let boundaries: std::collections::HashSet<_> =
        tries.iter().map(|a| a["boundary"].to_string()).collect();
    assert_eq!(
        boundaries.len(),
        tries.len(),
        "the SDK reused a boundary: {r}"
    );
    let runs = s.provider.of("/openai/slow/v1/audio/transcriptions");
    assert_eq!(
        runs.len(),
        1,
        "the provider transcribed {} times for {} SDK attempts, each with a new multipart \
         boundary (the fingerprint must read the parts, not the bytes); the SDK got {r}",
        runs.len(),
        tries.len()
    );
    assert!(runs[0].content_type.starts_with("multipart/form-data"));
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["text"], "transcript 1", "{r}");
    assert!(
        matches!(r["oncely_status"].as_str(), Some("joined" | "replayed")),
        "{r}"
    );
}

/// The same upload with a key of the caller's own (`extra_headers`) on a
/// `header-or-fingerprint` route: each attempt has the key and a new boundary, which is
/// the same request, so no 422 `key_reused`, and one execution.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_upload_with_its_own_key_executes_once_without_key_reused() {
    let s = Setup::start(None).await;
    let r = &sdk(
        "openai_calls.py",
        json!([{
            "op": "upload",
            "base_url": s.url("/openai/slow/v1"),
            "timeout": SDK_TIMEOUT,
            "max_retries": 3,
            "key": "upload-7",
            "content": "RIFF one keyed upload's audio",
        }]),
    )
    .await[0];
    let tries = attempts(r);
    assert!(tries.len() >= 2, "the SDK did not retry: {r}");
    assert!(
        tries.iter().all(|a| a["idempotency_key"] == "upload-7"),
        "{r}"
    );
    assert_ne!(
        r["code"], "key_reused",
        "a retried upload (same parts, new boundary) was taken for another request \
         under the same key (the fingerprint must read the parts): {r}"
    );
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["text"], "transcript 1", "{r}");
    assert_eq!(
        s.provider.count("/openai/slow/v1/audio/transcriptions"),
        1,
        "{r}"
    );
}

/// The OpenAI TypeScript SDK (npm `openai`, on Node's fetch and FormData, whose multipart
/// writer is not Python's) retries an upload the same way, with a new boundary each
/// attempt: without a key and with one of the caller's own, each upload executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_npm_upload_retried_by_the_sdk_executes_once_with_and_without_a_key() {
    let s = Setup::start(None).await;
    let base = s.url("/openai/slow/v1");
    let contents = [
        "RIFF the npm upload's audio",
        "RIFF the npm keyed upload's audio",
    ];
    let rs = sdk(
        "node/openai_calls.mjs",
        json!([
            {"op": "upload", "base_url": base, "timeout": SDK_TIMEOUT, "max_retries": 3,
             "content": contents[0]},
            {"op": "upload", "base_url": base, "timeout": SDK_TIMEOUT, "max_retries": 3,
             "key": "npm-upload-1", "content": contents[1]},
        ]),
    )
    .await;
    let runs = s.provider.of("/openai/slow/v1/audio/transcriptions");
    for (i, r) in rs.iter().enumerate() {
        let tries = attempts(r);
        assert!(tries.len() >= 2, "the SDK did not retry: {r}");
        let boundaries: std::collections::HashSet<_> =
            tries.iter().map(|a| a["boundary"].to_string()).collect();
        assert_eq!(
            boundaries.len(),
            tries.len(),
            "the SDK reused a boundary: {r}"
        );
        let mine = runs
            .iter()
            .filter(|e| String::from_utf8_lossy(&e.body).contains(contents[i]))
            .count();
        assert_eq!(
            mine,
            1,
            "the provider transcribed upload {i} {mine} times for {} SDK attempts, each \
             with a new multipart boundary (the fingerprint must read the parts, not the \
             bytes); the SDK got {r}",
            tries.len()
        );
        assert_eq!(r["ok"], true, "{r}");
    }
}

/// A chat completion the OpenAI SDK retries after its timeout (no key: the fingerprint
/// of the JSON body) executes once, and the retry gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_chat_retried_by_the_sdk_executes_once() {
    let s = Setup::start(None).await;
    let r = &sdk(
        "openai_calls.py",
        json!([{
            "op": "chat",
            "base_url": s.url("/openai/slow/v1"),
            "timeout": SDK_TIMEOUT,
            "max_retries": 3,
            "content": "write one haiku",
        }]),
    )
    .await[0];
    assert!(attempts(r).len() >= 2, "the SDK did not retry: {r}");
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["text"], "answer 1", "{r}");
    assert_eq!(s.provider.count("/openai/slow/v1/chat/completions"), 1);
}

/// The same with the Anthropic SDK's `messages.create`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_message_retried_by_the_sdk_executes_once() {
    let s = Setup::start(None).await;
    let r = &sdk(
        "anthropic_calls.py",
        json!([{
            "op": "messages",
            "base_url": s.url("/anthropic/slow"),
            "timeout": SDK_TIMEOUT,
            "max_retries": 3,
            "content": "write one haiku",
        }]),
    )
    .await[0];
    assert!(attempts(r).len() >= 2, "the SDK did not retry: {r}");
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["text"], "answer 1", "{r}");
    assert_eq!(s.provider.count("/anthropic/slow/v1/messages"), 1);
}

// ---------------------------------------------------------------------------------------
// 2. Form bodies.

const FORM: (&str, &str) = ("content-type", "application/x-www-form-urlencoded");
const ALICE: (&str, &str) = ("authorization", "Bearer sk_alice");

async fn form(s: &Setup, path: &str, body: &str) -> Answer {
    http_post(&s.url(path), body, &[FORM, ALICE]).await
}

/// Plain HTTP: fields in another order, and `%20` against `+`, are the same request (one
/// execution, the second replayed); repeated names in another order are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn form_bodies_are_one_intention_whatever_their_field_order_or_space_encoding() {
    let s = Setup::start(None).await;

    let a = form(
        &s,
        "/form/reordered",
        "name=Ada&email=ada%40example.com&plan=pro",
    )
    .await;
    let b = form(
        &s,
        "/form/reordered",
        "plan=pro&email=ada%40example.com&name=Ada",
    )
    .await;
    assert_eq!(a.header("oncely-status"), "fresh", "{}", a.text());
    assert_eq!(
        s.provider.count("/form/reordered"),
        1,
        "fields in another order executed again (the fingerprint must read the form's \
         pairs ordered by name): {} {}",
        b.header("oncely-status"),
        b.text()
    );
    assert_eq!(b.header("oncely-status"), "replayed");
    assert_eq!(b.text(), a.text());

    let a = form(&s, "/form/space", "note=hello%20world&to=Ada%20L").await;
    let b = form(&s, "/form/space", "note=hello+world&to=Ada+L").await;
    assert_eq!(a.header("oncely-status"), "fresh", "{}", a.text());
    assert_eq!(
        s.provider.count("/form/space"),
        1,
        "`+` against `%20` executed again (the fingerprint must percent-decode the \
         form, `+` being a space): {}",
        b.header("oncely-status")
    );
    assert_eq!(b.header("oncely-status"), "replayed");

    let a = form(&s, "/form/repeated", "a=1&a=2&b=3").await;
    let b = form(&s, "/form/repeated", "a=2&a=1&b=3").await;
    assert_eq!(a.header("oncely-status"), "fresh", "{}", a.text());
    assert_eq!(
        b.header("oncely-status"),
        "fresh",
        "repeated names in another order are another request: {}",
        b.text()
    );
    assert_eq!(s.provider.count("/form/repeated"), 2);
}

/// `stripe.Customer.create` with a 1 s timeout (a requests client of its own) and
/// `max_network_retries = 3`, against a provider that takes 1.6 s: the SDK retries with
/// the key it generated, and the provider creates one customer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_create_retried_by_the_sdk_executes_once() {
    let s = Setup::start(None).await;
    let r = &sdk(
        "stripe_calls.py",
        json!([{
            "op": "customer",
            "api_base": s.url("/stripe/slow"),
            "timeout": SDK_TIMEOUT,
            "max_network_retries": 3,
            "params": [["name", "Ada Lovelace"], ["metadata", [["plan", "pro"], ["ref", "42"]]]],
        }]),
    )
    .await[0];
    let tries = attempts(r);
    assert!(tries.len() >= 2, "the SDK did not retry: {r}");
    let key = &tries[0]["idempotency_key"];
    assert!(key.is_string(), "the SDK sent no key of its own: {r}");
    assert!(tries.iter().all(|a| &a["idempotency_key"] == key), "{r}");
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["id"], "cus_1", "{r}");
    let runs = s.provider.of("/stripe/slow/v1/customers");
    assert_eq!(runs.len(), 1, "{r}");
    assert_eq!(runs[0].content_type, "application/x-www-form-urlencoded");
    let sent = String::from_utf8_lossy(&runs[0].body);
    assert!(sent.contains("name=Ada+Lovelace"), "{sent}");
}

/// The Stripe SDK form-encodes its parameters in the caller's order. On a
/// `key = "fingerprint"` route (the SDK's generated keys differ per call), the same
/// customer created with its parameters in another order is the same request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_params_in_another_order_are_one_intention() {
    let s = Setup::start(None).await;
    let base = s.url("/stripe/fp");
    let rs = sdk(
        "stripe_calls.py",
        json!([
            {
                "op": "product",
                "api_base": base,
                "params": [["name", "Render credits"], ["metadata", [["tier", "gold"], ["seats", "5"]]]],
            },
            {
                "op": "product",
                "api_base": base,
                "params": [["metadata", [["seats", "5"], ["tier", "gold"]]], ["name", "Render credits"]],
            },
        ]),
    )
    .await;
    let sent: Vec<_> = rs.iter().map(|r| &attempts(r)[0]["body"]).collect();
    assert_ne!(
        sent[0], sent[1],
        "the SDK sent the same bytes twice: {rs:?}"
    );
    let bodies: Vec<String> = s
        .provider
        .of("/stripe/fp/v1/products")
        .iter()
        .map(|e| String::from_utf8_lossy(&e.body).into_owned())
        .collect();
    assert_eq!(
        bodies.len(),
        1,
        "the same product in another parameter order was created again (the fingerprint \
         must read the form's pairs ordered by name): {bodies:?}; the SDK got {rs:?}"
    );
    assert_eq!(rs[0]["ok"], true, "{}", rs[0]);
    assert_eq!(rs[1]["ok"], true, "{}", rs[1]);
    assert_eq!(rs[1]["id"], "prod_1");
    assert_eq!(rs[1]["oncely_status"], "replayed", "{}", rs[1]);
}

// ---------------------------------------------------------------------------------------
// 3. Each dialect raises the SDK's own typed error with oncely's code.

/// The calls that provoke `key_reused` (the same key, another body) and
/// `upstream_timeout` then `outcome_unknown` (an action whose provider is slower than
/// the route's `timeout`, then its repeat), without the SDK's retries.
fn provoking(sdk: &str, gw: &Setup, make: impl Fn(&str, &str) -> Value) -> Value {
    let write = gw.url(&format!("/{sdk}/write"));
    let action = gw.url(&format!("/{sdk}/action"));
    let mut calls = Vec::new();
    for (base, content) in [
        (&write, "the first body"),
        (&write, "another body"),
        (&action, "place the order"),
        (&action, "place the order"),
    ] {
        let mut c = make(base, content);
        c["max_retries"] = 0.into();
        c["max_network_retries"] = 0.into();
        calls.push(c);
    }
    Value::Array(calls)
}

fn stainless_call(op: &'static str, base_suffix: &'static str) -> impl Fn(&str, &str) -> Value {
    move |base, content| {
        let mut c =
            json!({"op": op, "base_url": format!("{base}{base_suffix}"), "content": content});
        if base.ends_with("/write") {
            c["key"] = "same-key".into();
        }
        c
    }
}

fn stripe_call(base: &str, content: &str) -> Value {
    let key = if base.ends_with("/write") {
        "same-key"
    } else {
        "order-1"
    };
    json!({
        "op": "customer",
        "api_base": base,
        "idempotency_key": key,
        "params": [["name", content]],
    })
}

/// `[defaults] errors = "openai"`: `UnprocessableEntityError` (422) for `key_reused`,
/// `InternalServerError` (504) for the action's `upstream_timeout`, `ConflictError`
/// (409) for `outcome_unknown`, each with `.code` oncely's code and `.type` as OpenAI's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_raises_its_typed_errors_with_oncelys_codes() {
    let s = Setup::start(Some("openai")).await;
    let rs = sdk(
        "openai_calls.py",
        provoking("openai", &s, stainless_call("chat", "/v1")),
    )
    .await;
    assert_eq!(rs[0]["ok"], true, "{}", rs[0]);
    let expect = [
        (
            &rs[1],
            "UnprocessableEntityError",
            422,
            "key_reused",
            "invalid_request_error",
        ),
        (
            &rs[2],
            "InternalServerError",
            504,
            "upstream_timeout",
            "server_error",
        ),
        (
            &rs[3],
            "ConflictError",
            409,
            "outcome_unknown",
            "invalid_request_error",
        ),
    ];
    for (r, class, status, code, kind) in expect {
        assert_eq!(
            (&r["error"], &r["status"], &r["code"], &r["type"]),
            (&json!(class), &json!(status), &json!(code), &json!(kind)),
            "{r}"
        );
        assert_eq!(r["oncely_problem"], code, "{r}");
        assert!(r["message"].as_str().is_some_and(|m| !m.is_empty()), "{r}");
    }
    assert_eq!(s.provider.count("/openai/write/v1/chat/completions"), 1);
    assert_eq!(s.provider.count("/openai/action/v1/chat/completions"), 1);
}

/// `errors = "anthropic"` on the routes: `UnprocessableEntityError` (422),
/// `GatewayTimeoutError` (504), `ConflictError` (409), each with the body's
/// `error.type` and `error.message` (the SDK's `.type` and `.api_message`) and oncely's
/// code in `Oncely-Problem`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sdk_raises_its_typed_errors_with_oncelys_codes() {
    let s = Setup::start(None).await;
    let rs = sdk(
        "anthropic_calls.py",
        provoking("anthropic", &s, stainless_call("messages", "")),
    )
    .await;
    assert_eq!(rs[0]["ok"], true, "{}", rs[0]);
    let expect = [
        (
            &rs[1],
            "UnprocessableEntityError",
            422,
            "key_reused",
            "invalid_request_error",
        ),
        (
            &rs[2],
            "GatewayTimeoutError",
            504,
            "upstream_timeout",
            "api_error",
        ),
        (
            &rs[3],
            "ConflictError",
            409,
            "outcome_unknown",
            "invalid_request_error",
        ),
    ];
    for (r, class, status, code, kind) in expect {
        assert_eq!(
            (&r["error"], &r["status"], &r["type"], &r["oncely_problem"]),
            (&json!(class), &json!(status), &json!(kind), &json!(code)),
            "{r}"
        );
        assert!(
            r["message"].as_str().is_some_and(|m| !m.is_empty()),
            "no error.message in the body: {r}"
        );
    }
    assert_eq!(s.provider.count("/anthropic/write/v1/messages"), 1);
    assert_eq!(s.provider.count("/anthropic/action/v1/messages"), 1);
}

/// `errors = "stripe"` on the routes: `IdempotencyError` (400, as Stripe answers a key
/// reused with other parameters) for `key_reused`, and `APIError` (the class the Stripe
/// SDK raises for a 409 and a 5xx) for `upstream_timeout` and `outcome_unknown`, with
/// oncely's code as the error's `code` and `Stripe-Should-Retry: false`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_sdk_raises_its_typed_errors_with_oncelys_codes() {
    let s = Setup::start(None).await;
    let rs = sdk("stripe_calls.py", provoking("stripe", &s, stripe_call)).await;
    assert_eq!(rs[0]["ok"], true, "{}", rs[0]);
    let expect = [
        (
            &rs[1],
            "IdempotencyError",
            400,
            "key_reused",
            "idempotency_error",
        ),
        (&rs[2], "APIError", 504, "upstream_timeout", "api_error"),
        (
            &rs[3],
            "APIError",
            409,
            "outcome_unknown",
            "invalid_request_error",
        ),
    ];
    for (r, class, status, code, kind) in expect {
        assert_eq!(
            (
                &r["error"],
                &r["status"],
                &r["error_code"],
                &r["error_type"]
            ),
            (&json!(class), &json!(status), &json!(code), &json!(kind)),
            "{r}"
        );
        assert_eq!(r["oncely_problem"], code, "{r}");
        assert!(r["message"].as_str().is_some_and(|m| !m.is_empty()), "{r}");
        let last = attempts(r).last().unwrap();
        assert_eq!(last["stripe-should-retry"], "false", "{r}");
    }
    assert_eq!(s.provider.count("/stripe/write/v1/customers"), 1);
    assert_eq!(s.provider.count("/stripe/action/v1/customers"), 1);
}

/// The npm Stripe SDK picks its error from the body's `error` member and never checks the
/// status: with `errors = "stripe"` it raises `StripeIdempotencyError` (400) for
/// `key_reused` and `StripeAPIError` for `upstream_timeout` and `outcome_unknown`, each
/// attempted once with its retries on (`Stripe-Should-Retry: false`); with the default
/// `problem` errors it takes oncely's 422 for a created customer. Hence the dialect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_npm_raises_its_typed_errors_only_with_the_stripe_dialect() {
    let s = Setup::start(None).await;
    let call = |route: &str, key: &str, name: &str| {
        json!({"op": "customer", "api_base": s.url(route), "max_network_retries": 2,
               "idempotency_key": key, "params": [["name", name]]})
    };
    let rs = sdk(
        "node/stripe_calls.mjs",
        json!([
            call("/stripe/write", "same-key", "the first body"),
            call("/stripe/write", "same-key", "another body"),
            call("/stripe/action", "order-3", "place the order"),
            call("/stripe/action", "order-3", "place the order"),
            call("/plain/write", "plain-key", "the first body"),
            call("/plain/write", "plain-key", "another body"),
        ]),
    )
    .await;
    assert_eq!(rs[0]["ok"], true, "{}", rs[0]);
    let expect = [
        (
            &rs[1],
            "StripeIdempotencyError",
            400,
            "key_reused",
            "idempotency_error",
        ),
        (
            &rs[2],
            "StripeAPIError",
            504,
            "upstream_timeout",
            "api_error",
        ),
        (
            &rs[3],
            "StripeAPIError",
            409,
            "outcome_unknown",
            "invalid_request_error",
        ),
    ];
    for (r, class, status, code, kind) in expect {
        assert_eq!(
            (&r["error"], &r["status"], &r["code"], &r["error_type"]),
            (&json!(class), &json!(status), &json!(code), &json!(kind)),
            "{r}"
        );
        assert_eq!(r["oncely_problem"], code, "{r}");
        assert_eq!(attempts(r).len(), 1, "retried although told not to: {r}");
    }
    assert_eq!(s.provider.count("/stripe/write/v1/customers"), 1);
    assert_eq!(s.provider.count("/stripe/action/v1/customers"), 1);

    // Without the dialect: the problem document has no `error` member, and the SDK
    // resolves with it as if it were the customer.
    assert_eq!(rs[4]["ok"], true, "{}", rs[4]);
    assert_eq!(
        (&rs[5]["ok"], &rs[5]["resolved_code"]),
        (&json!(true), &json!("key_reused")),
        "{}",
        rs[5]
    );
    assert_eq!(attempts(&rs[5])[0]["status"], 422, "{}", rs[5]);
}

// ---------------------------------------------------------------------------------------
// 4. An outcome_unknown is attempted once by SDKs that would otherwise retry it.

/// With their retries on, the OpenAI SDK (on an `openai` route and on one with the
/// default `problem` errors; and the npm one), the Anthropic SDK and the Stripe SDK each send the action
/// once when the gateway answers its `upstream_timeout` (a 504, which they retry unless
/// told not to), and its repeat once when the gateway answers `outcome_unknown` (a 409,
/// which they retry unless told not to).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcome_unknown_is_attempted_once_by_sdks_that_retry_409() {
    let s = Setup::start(None).await;
    let twice = |make: &dyn Fn() -> Value| json!([make(), make()]);
    let (openai, plain, anthropic, stripe, npm) = tokio::join!(
        sdk(
            "openai_calls.py",
            twice(
                &|| json!({"op": "chat", "base_url": s.url("/openai/action/v1"),
                            "max_retries": 2, "content": "place the order"})
            ),
        ),
        sdk(
            "openai_calls.py",
            twice(
                &|| json!({"op": "chat", "base_url": s.url("/plain/action/v1"),
                            "max_retries": 2, "content": "place the order"})
            ),
        ),
        sdk(
            "anthropic_calls.py",
            twice(
                &|| json!({"op": "messages", "base_url": s.url("/anthropic/action"),
                            "max_retries": 2, "content": "place the order"})
            ),
        ),
        sdk(
            "stripe_calls.py",
            twice(
                &|| json!({"op": "customer", "api_base": s.url("/stripe/action"),
                            "max_network_retries": 2, "idempotency_key": "order-9",
                            "params": [["name", "place the order"]]})
            ),
        ),
        sdk(
            "node/openai_calls.mjs",
            twice(
                &|| json!({"op": "chat", "base_url": s.url("/openai/action/v1"),
                            "max_retries": 2, "content": "place the npm order"})
            ),
        ),
    );
    let cases = [
        (
            "openai",
            &openai,
            "/openai/action/v1/chat/completions",
            "ConflictError",
            "place the order",
        ),
        (
            "openai, problem errors",
            &plain,
            "/plain/action/v1/chat/completions",
            "ConflictError",
            "place the order",
        ),
        (
            "anthropic",
            &anthropic,
            "/anthropic/action/v1/messages",
            "ConflictError",
            "place the order",
        ),
        (
            "stripe",
            &stripe,
            "/stripe/action/v1/customers",
            "APIError",
            "place+the+order",
        ),
        (
            "openai (npm)",
            &npm,
            "/openai/action/v1/chat/completions",
            "ConflictError",
            "place the npm order",
        ),
    ];
    for (name, rs, path, conflict, order) in cases {
        let runs = s
            .provider
            .of(path)
            .iter()
            .filter(|e| String::from_utf8_lossy(&e.body).contains(order))
            .count();
        assert_eq!(runs, 1, "{name}: {rs:?}");
        let (first, repeat) = (&rs[0], &rs[1]);
        assert_eq!(
            attempts(first).len(),
            1,
            "{name} retried the action's upstream_timeout (X-Should-Retry: false missing?): {first}"
        );
        assert_eq!(first["status"], 504, "{name}: {first}");
        assert_eq!(
            attempts(repeat).len(),
            1,
            "{name} retried outcome_unknown (X-Should-Retry: false missing?): {repeat}"
        );
        assert_eq!(repeat["error"], conflict, "{name}: {repeat}");
        assert_eq!(repeat["status"], 409, "{name}: {repeat}");
        assert_eq!(
            repeat["oncely_problem"], "outcome_unknown",
            "{name}: {repeat}"
        );
        let hint = &attempts(repeat)[0];
        assert_eq!(hint["x-should-retry"], "false", "{name}: {repeat}");
    }
    // OpenAI reads `code` from the problem document too.
    assert_eq!(plain[1]["code"], "outcome_unknown", "{}", plain[1]);
}

// ---------------------------------------------------------------------------------------
// 5. A gzip answer, replayed to a caller that accepts only identity.

fn gunzip(body: &[u8]) -> String {
    let mut out = String::new();
    flate2::read::GzDecoder::new(body)
        .read_to_string(&mut out)
        .expect("a gzip body");
    out
}

/// The provider answers gzip to the first caller, which accepts it; a repeat with
/// `Accept-Encoding: identity` gets the replay decoded (no `Content-Encoding: gzip`, a
/// `Content-Length` that matches, or none), so does one that sends no `Accept-Encoding`,
/// and one that accepts gzip gets it as stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_answer_is_replayed_decoded_to_a_caller_that_accepts_only_identity() {
    let s = Setup::start(None).await;
    let url = s.url("/gzip/v1/report");
    let body = r#"{"report": "weekly"}"#;
    let json_ct = ("content-type", "application/json");

    let first = http_post(&url, body, &[ALICE, json_ct, ("accept-encoding", "gzip")]).await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("oncely-status"), "fresh");
    assert_eq!(first.header("content-encoding"), "gzip");
    assert_eq!(gunzip(&first.body), PLAIN_TEXT);

    let plain = http_post(
        &url,
        body,
        &[ALICE, json_ct, ("accept-encoding", "identity")],
    )
    .await;
    assert_eq!(plain.status, 200, "{}", plain.text());
    assert_eq!(plain.header("oncely-status"), "replayed");
    let coding = plain
        .headers
        .get("content-encoding")
        .map(|v| v.to_str().unwrap().to_ascii_lowercase());
    assert!(
        coding.is_none() || coding.as_deref() == Some("identity"),
        "a caller that accepts only identity got Content-Encoding {coding:?} (the replay \
         must be decoded)"
    );
    assert_eq!(plain.text(), PLAIN_TEXT, "the replay was not decoded");
    if let Some(len) = plain.headers.get("content-length") {
        assert_eq!(
            len.to_str().unwrap(),
            plain.body.len().to_string(),
            "Content-Length of the encoded body on the decoded one"
        );
    }

    // No Accept-Encoding at all (the npm Stripe SDK sends none and does not decode): as
    // servers answer such a request, uncompressed.
    let none = http_post(&url, body, &[ALICE, json_ct]).await;
    assert_eq!(none.header("oncely-status"), "replayed");
    assert!(
        none.headers.get("content-encoding").is_none(),
        "{:?}",
        none.headers
    );
    assert_eq!(none.text(), PLAIN_TEXT);

    let gz = http_post(
        &url,
        body,
        &[ALICE, json_ct, ("accept-encoding", "gzip, br")],
    )
    .await;
    assert_eq!(gz.header("oncely-status"), "replayed");
    assert_eq!(gz.header("content-encoding"), "gzip");
    assert_eq!(gunzip(&gz.body), PLAIN_TEXT);
    assert_eq!(s.provider.count("/gzip/v1/report"), 1);
}
