//! The operator console (`/console/` on the admin listener) through the real binary.
//! Plain HTTP here: the token, the cookie, CSRF, the confirmation step, the actions and
//! their log lines. `console_browser.rs` drives the same pages in headless Chromium.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;

use crate::common::{get, post as http_post, send, upstream, Answer, Gateway};

pub(crate) const TOKEN: &str = "console-s3cret";
pub(crate) const WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The upstream's counters and switches.
#[derive(Clone, Default)]
pub(crate) struct Upstream {
    /// `POST /v1/orders` calls (each hangs past the route's timeout).
    pub(crate) orders: Arc<AtomicUsize>,
    /// `GET /v1/orders?reference=` lookups (each answers 404: never placed).
    pub(crate) lookups: Arc<AtomicUsize>,
    /// `POST /v1/render` calls.
    pub(crate) renders: Arc<AtomicUsize>,
    /// Webhook deliveries to `/internal/events`.
    pub(crate) deliveries: Arc<AtomicUsize>,
    /// While set, the webhook handler fails.
    pub(crate) fail_hooks: Arc<AtomicBool>,
}

/// A gateway with an `action` route whose upstream hangs past its timeout (so its calls
/// end `outcome_unknown`), a quick `write` route, and a webhook endpoint; the admin token
/// set. The server's own reconciliation waits an hour, so only the console resolves.
pub(crate) struct Setup {
    pub(crate) up: Upstream,
    pub(crate) gw: Gateway,
    pub(crate) config: std::path::PathBuf,
    pub(crate) _dir: tempfile::TempDir,
}

pub(crate) async fn setup() -> Setup {
    setup_on(None).await
}

/// [`setup`] on this store (default: a SQLite file in the test's directory); answers
/// the config file too, for more instances.
pub(crate) async fn setup_on(store: Option<String>) -> Setup {
    let up = Upstream::default();
    let router = axum::Router::new()
        .route(
            "/v1/orders",
            post(|State(u): State<Upstream>| async move {
                u.orders.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(3)).await;
                "placed"
            })
            .get(|State(u): State<Upstream>| async move {
                u.lookups.fetch_add(1, Ordering::SeqCst);
                StatusCode::NOT_FOUND
            }),
        )
        .route(
            "/v1/render",
            post(|State(u): State<Upstream>, body: String| async move {
                u.renders.fetch_add(1, Ordering::SeqCst);
                // "slow": long enough for the browser's refresh to see it; "brief": for
                // plain HTTP polling.
                if body.contains("slow") {
                    tokio::time::sleep(Duration::from_secs(6)).await;
                } else if body.contains("brief") {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                format!("{{\"rendered\":{}}}", body.len())
            }),
        )
        .route(
            "/internal/events",
            post(|State(u): State<Upstream>| async move {
                u.deliveries.fetch_add(1, Ordering::SeqCst);
                if u.fail_hooks.load(Ordering::SeqCst) {
                    StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    StatusCode::OK
                }
            }),
        )
        .with_state(up.clone());
    let addr = upstream(router).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
store = "{store}"
upstream = "http://{addr}"

[[routes]]
method = "POST"
path = "/v1/orders"
class = "action"
timeout = "300ms"
reconcile = "GET /v1/orders?reference={{key}}"
reconcile_after = "1h"

[[routes]]
method = "POST"
path = "/v1/render"
class = "write"
units = "body_bytes"
timeout = "10s"

[[webhooks]]
path = "/hooks/events"
verify = "standard"
secret_env = "TEST_WEBHOOK_SECRET"
tolerance = "5m"
deliver_to = "http://{addr}/internal/events"
deliver_timeout = "2s"
max_attempts = 1
retry_backoff = "20ms"
"#,
            store = store
                .unwrap_or_else(|| format!("sqlite://{}", dir.path().join("ledger.db").display()))
        ),
    )
    .unwrap();
    let gw = Gateway::start(
        &["--config", cfg.to_str().unwrap(), "--log-format", "json"],
        &[
            ("ONCELY_ADMIN_TOKEN", TOKEN),
            ("TEST_WEBHOOK_SECRET", WEBHOOK_SECRET),
        ],
    );
    Setup {
        up,
        gw,
        config: cfg,
        _dir: dir,
    }
}

/// Another instance on the same config (and so the same ledger).
pub(crate) fn another_instance(s: &Setup) -> Gateway {
    Gateway::start(
        &[
            "--config",
            s.config.to_str().unwrap(),
            "--log-format",
            "json",
        ],
        &[
            ("ONCELY_ADMIN_TOKEN", TOKEN),
            ("TEST_WEBHOOK_SECRET", WEBHOOK_SECRET),
        ],
    )
}

/// An order whose answer never comes in time: its record is `outcome_unknown`.
pub(crate) async fn unknown_order(gw: &Gateway, principal: &str, key: &str) -> String {
    let res = http_post(
        &gw.url("/v1/orders"),
        r#"{"item":"chair"}"#,
        &[("authorization", principal), ("idempotency-key", key)],
    )
    .await;
    assert_eq!(res.status, 504, "{}", res.text());
    let id = res.header("oncely-record").to_owned();
    assert_eq!(record(gw, &id).await["state"], "outcome_unknown");
    id
}

/// A record as the admin API shows it.
pub(crate) async fn record(gw: &Gateway, id: &str) -> serde_json::Value {
    let res = get(
        &gw.admin_url(&format!("/records/{id}")),
        &[("authorization", &format!("Bearer {TOKEN}"))],
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    res.json()
}

/// Polls `check` every 50 ms for up to 10 s.
pub(crate) async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

/// A signed webhook event that the failing handler dead-letters (max_attempts = 1);
/// answers the delivery id once it is dead.
pub(crate) async fn dead_letter(s: &Setup, event: &str) -> String {
    s.up.fail_hooks.store(true, Ordering::SeqCst);
    let body = format!(r#"{{"type":"order.created","id":"{event}"}}"#);
    let scheme: oncely_webhooks::Scheme = "standard".parse().unwrap();
    let secrets = oncely_webhooks::Secrets::parse(&scheme, WEBHOOK_SECRET).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let headers = oncely_webhooks::sign(&scheme, secrets.primary(), event, now, body.as_bytes());
    let mut h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    h.push(("content-type", "application/json"));
    let r = http_post(&s.gw.url("/hooks/events"), &body, &h).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let auth = format!("Bearer {TOKEN}");
    for _ in 0..200 {
        let dead = get(
            &s.gw.admin_url("/webhooks/dead"),
            &[("authorization", &auth)],
        )
        .await
        .json();
        if let Some(d) = dead.as_array().and_then(|a| a.first()) {
            return d["id"].as_str().unwrap().to_owned();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the delivery was not dead-lettered");
}

/// The log lines of the console's `action` (JSON log format), once there are `n` (the log
/// is written by a thread of its own: give it a moment).
pub(crate) async fn action_lines(gw: &Gateway, action: &str, n: usize) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    for _ in 0..100 {
        lines = gw
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["action"] == action)
            .collect();
        if lines.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(lines.len(), n, "{action} lines: {lines:?}");
    lines
}

fn cookie_of(res: &Answer) -> String {
    let set = res.header("set-cookie");
    set.split(';').next().unwrap().trim().to_owned()
}

async fn form(url: &str, body: &str, headers: &[(&str, &str)]) -> Answer {
    let mut b = Request::post(url).header("content-type", "application/x-www-form-urlencoded");
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    send(b.body(Full::new(Bytes::from(body.to_owned()))).unwrap()).await
}

/// The CSRF token a page's forms carry.
fn csrf_in(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .unwrap_or_else(|| panic!("no CSRF field in {page}"));
    let rest = &page[at + "name=\"csrf\" value=\"".len()..];
    rest[..rest.find('"').unwrap()].to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_console_is_closed() {
    let up = upstream(axum::Router::new()).await;
    let gw = Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", "memory:"],
        &[],
    );
    for path in ["/console/", "/console/login", "/console/usage"] {
        let res = get(&gw.admin_url(path), &[]).await;
        assert_eq!(res.status, 403, "{path}");
        assert!(res.text().contains("ONCELY_ADMIN_TOKEN"), "{}", res.text());
    }
    let res = form(&gw.admin_url("/console/login"), "token=anything", &[]).await;
    assert_eq!(res.status, 403);
    assert!(res.headers.get("set-cookie").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_asked_once_and_kept_in_a_strict_http_only_cookie() {
    let s = setup().await;
    let gw = &s.gw;
    // Not logged in: to the login form, remembering where to go.
    let res = get(&gw.admin_url("/console/usage?since=7d"), &[]).await;
    assert_eq!(res.status, 303);
    assert_eq!(
        res.header("location"),
        "/console/login?next=%2Fconsole%2Fusage%3Fsince%3D7d"
    );
    // A wrong token: the form again, with an error, and no cookie.
    let wrong = form(
        &gw.admin_url("/console/login"),
        "token=nope&next=%2Fconsole%2F",
        &[],
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert!(
        wrong.text().contains("That is not the admin token"),
        "{}",
        wrong.text()
    );
    assert!(wrong.text().contains("name=\"token\""));
    assert!(wrong.headers.get("set-cookie").is_none());
    // The token: a session cookie, HttpOnly, SameSite=Strict, Path=/console.
    let ok = form(
        &gw.admin_url("/console/login"),
        &format!("token={TOKEN}&next=%2Fconsole%2Fusage%3Fsince%3D7d"),
        &[],
    )
    .await;
    assert_eq!(ok.status, 303, "{}", ok.text());
    assert_eq!(ok.header("location"), "/console/usage?since=7d");
    let set = ok.header("set-cookie").to_owned();
    for part in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
        assert!(set.contains(part), "{part} not in {set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    let cookie = cookie_of(&ok);
    let page = get(&gw.admin_url("/console/"), &[("cookie", &cookie)]).await;
    assert_eq!(page.status, 200, "{}", page.text());
    assert!(page.text().contains("id=\"records\""));
    assert_eq!(page.header("content-type"), "text/html; charset=utf-8");
    assert!(page
        .header("content-security-policy")
        .contains("default-src 'none'"));
    // Behind a TLS-terminating proxy the cookie is Secure too.
    let tls = form(
        &gw.admin_url("/console/login"),
        &format!("token={TOKEN}"),
        &[("x-forwarded-proto", "https")],
    )
    .await;
    assert!(tls.header("set-cookie").contains("; Secure"));
    // A bearer header works without a session; a wrong one is refused.
    let bearer = get(
        &gw.admin_url("/console/"),
        &[("authorization", &format!("Bearer {TOKEN}"))],
    )
    .await;
    assert_eq!(bearer.status, 200);
    let bad = get(
        &gw.admin_url("/console/"),
        &[("authorization", "Bearer nope")],
    )
    .await;
    assert_eq!(bad.status, 401);
    let forged = get(
        &gw.admin_url("/console/"),
        &[("cookie", "oncely_console=forged")],
    )
    .await;
    assert_eq!(forged.status, 303);
    // Logging out ends the session.
    let csrf = csrf_in(&page.text());
    let out = form(
        &gw.admin_url("/console/logout"),
        &format!("csrf={csrf}"),
        &[("cookie", &cookie)],
    )
    .await;
    assert_eq!(out.status, 303);
    assert!(out.header("set-cookie").contains("Max-Age=0"));
    let after = get(&gw.admin_url("/console/"), &[("cookie", &cookie)]).await;
    assert_eq!(after.status, 303);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_needs_the_csrf_token_and_a_confirmation_and_is_logged() {
    let s = setup().await;
    let gw = &s.gw;
    let id = unknown_order(gw, "Bearer sk_alice", "order-1").await;
    let ok = form(
        &gw.admin_url("/console/login"),
        &format!("token={TOKEN}"),
        &[],
    )
    .await;
    let cookie = cookie_of(&ok);
    let page = get(
        &gw.admin_url(&format!("/console/records/{id}")),
        &[("cookie", &cookie)],
    )
    .await;
    assert_eq!(page.status, 200);
    assert!(page.text().contains("data-state=\"outcome_unknown\""));
    let resolve_form = get(
        &gw.admin_url(&format!("/console/records/{id}/resolve")),
        &[("cookie", &cookie)],
    )
    .await;
    let csrf = csrf_in(&resolve_form.text());
    let url = gw.admin_url(&format!("/console/records/{id}/resolve"));
    let verdict = "verdict=completed&status=201&headers=content-type%3A+application%2Fjson&body=%7B%22order%22%3A1%7D&confirmed=1";

    // Without the token, with another session's token, from another origin: refused.
    let none = form(&url, verdict, &[("cookie", &cookie)]).await;
    assert_eq!(none.status, 403, "{}", none.text());
    let other = form(
        &url,
        &format!("{verdict}&csrf=0000"),
        &[("cookie", &cookie)],
    )
    .await;
    assert_eq!(other.status, 403);
    let cross = form(
        &url,
        &format!("{verdict}&csrf={csrf}"),
        &[("cookie", &cookie), ("origin", "http://evil.example")],
    )
    .await;
    assert_eq!(cross.status, 403);
    // Without the cookie: not logged in.
    let anon = form(&url, &format!("{verdict}&csrf={csrf}"), &[]).await;
    assert_eq!(anon.status, 401);
    assert_eq!(record(gw, &id).await["state"], "outcome_unknown");

    // Without `confirmed`: a confirmation page, nothing changed yet.
    let review = form(
        &url,
        &format!("verdict=completed&status=201&body=x&csrf={csrf}"),
        &[("cookie", &cookie)],
    )
    .await;
    assert_eq!(review.status, 200);
    assert!(
        review.text().contains("id=\"confirm\""),
        "{}",
        review.text()
    );
    assert!(review.text().contains("status <strong>201</strong>"));
    assert_eq!(record(gw, &id).await["state"], "outcome_unknown");
    // A bad status: the form again with the error.
    let bad = form(
        &url,
        &format!("verdict=completed&status=99&csrf={csrf}&confirmed=1"),
        &[("cookie", &cookie)],
    )
    .await;
    assert_eq!(bad.status, 400);
    assert!(bad.text().contains("100 to 599"));
    assert_eq!(record(gw, &id).await["state"], "outcome_unknown");

    // Confirmed, with the token and the same origin: resolved, and logged.
    let host = gw.admin.to_string();
    let done = form(
        &url,
        &format!("{verdict}&csrf={csrf}"),
        &[("cookie", &cookie), ("origin", &format!("http://{host}"))],
    )
    .await;
    assert_eq!(done.status, 303, "{}", done.text());
    let r = record(gw, &id).await;
    assert_eq!(r["state"], "completed");
    assert_eq!(r["response"]["status"], 201);
    assert_eq!(r["response"]["body"], "{\"order\":1}");
    assert_eq!(
        r["last_error"],
        "resolved as completed by an operator (console)"
    );
    let lines = action_lines(gw, "resolve", 1).await;
    assert_eq!(lines[0]["record"], id.as_str());
    assert_eq!(lines[0]["by"], "console");
    // A duplicate now gets that answer; the upstream was called once.
    let dup = http_post(
        &gw.url("/v1/orders"),
        r#"{"item":"chair"}"#,
        &[
            ("authorization", "Bearer sk_alice"),
            ("idempotency-key", "order-1"),
        ],
    )
    .await;
    assert_eq!(dup.status, 201);
    assert_eq!(dup.header("oncely-status"), "replayed");
    assert_eq!(s.up.orders.load(Ordering::SeqCst), 1);
    // Resolving again: refused, the record unchanged.
    let again = form(
        &url,
        &format!("verdict=released&csrf={csrf}&confirmed=1"),
        &[("cookie", &cookie)],
    )
    .await;
    assert_eq!(again.status, 409);
    assert_eq!(record(gw, &id).await["state"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_now_purge_and_search_with_a_bearer_header() {
    let s = setup().await;
    let gw = &s.gw;
    let auth = format!("Bearer {TOKEN}");
    let h = [("authorization", auth.as_str())];
    let a = unknown_order(gw, "Bearer sk_alice", "order-a").await;
    let b = unknown_order(gw, "Bearer sk_bob", "order-b").await;
    let fresh = http_post(
        &gw.url("/v1/render"),
        "{\"text\":\"hi\"}",
        &[("authorization", "Bearer sk_alice")],
    )
    .await;
    assert_eq!(fresh.status, 200);
    let rendered = fresh.header("oncely-record").to_owned();

    // outcome_unknown first (the longest waiting at the top), then the rest.
    eventually("the render is recorded", || async {
        record(gw, &rendered).await["state"] == "completed"
    })
    .await;
    // Its page counts the repeats answered from it, by kind.
    for _ in 0..2 {
        let again = http_post(
            &gw.url("/v1/render"),
            "{\"text\":\"hi\"}",
            &[("authorization", "Bearer sk_alice")],
        )
        .await;
        assert_eq!(again.header("oncely-status"), "replayed");
    }
    let page_url = gw.admin_url(&format!("/console/records/{rendered}"));
    eventually("the record page counts two replays", || async {
        get(&page_url, &h)
            .await
            .text()
            .contains("2 answered from this record (26 units not charged): 0 joined, 2 replayed")
    })
    .await;
    let list = get(&gw.admin_url("/console/"), &h).await.text();
    let (pa, pb, pr) = (
        list.find(&format!("data-record=\"{a}\"")).unwrap(),
        list.find(&format!("data-record=\"{b}\"")).unwrap(),
        list.find(&format!("data-record=\"{rendered}\"")).unwrap(),
    );
    assert!(pa < pb && pb < pr, "order: {pa} {pb} {pr}");
    assert!(list.contains("<strong>2 outcome_unknown</strong>"));
    // Search by key, principal (raw), route and state.
    let by_key = get(&gw.admin_url("/console/?key=order-b"), &h).await.text();
    assert!(by_key.contains(&b) && !by_key.contains(&a), "{by_key}");
    let by_principal = get(&gw.admin_url("/console/?principal=Bearer+sk_bob"), &h)
        .await
        .text();
    assert!(
        by_principal.contains(&b)
            && !by_principal.contains(&a)
            && !by_principal.contains(&rendered)
    );
    let by_route = get(&gw.admin_url("/console/?route=%2Fv1%2Frender"), &h)
        .await
        .text();
    assert!(by_route.contains(&rendered) && !by_route.contains(&a));
    let by_state = get(&gw.admin_url("/console/?state=completed"), &h)
        .await
        .text();
    assert!(by_state.contains(&rendered) && !by_state.contains(&b));
    assert_eq!(
        get(&gw.admin_url("/console/?state=nope"), &h).await.status,
        400
    );

    // Reconcile now: a confirmation first (nothing asked), then one lookup; 404 releases.
    let confirm = get(
        &gw.admin_url(&format!("/console/records/{a}/reconcile")),
        &h,
    )
    .await;
    assert_eq!(confirm.status, 200);
    assert!(confirm.text().contains("id=\"confirm\""));
    assert_eq!(s.up.lookups.load(Ordering::SeqCst), 0);
    let done = form(
        &gw.admin_url(&format!("/console/records/{a}/reconcile")),
        "confirmed=1",
        &h,
    )
    .await;
    assert_eq!(done.status, 303, "{}", done.text());
    assert_eq!(s.up.lookups.load(Ordering::SeqCst), 1);
    let r = record(gw, &a).await;
    assert_eq!(r["state"], "released", "{r}");
    let lines = action_lines(gw, "reconcile", 1).await;
    assert_eq!(lines[0]["by"], "console");
    assert_eq!(lines[0]["record"], a.as_str());
    // The record page shows what happened.
    let page = get(&gw.admin_url(&format!("/console/records/{a}?done=x")), &h)
        .await
        .text();
    assert!(page.contains("reconciled: GET"), "{page}");

    // Purge: confirmation, then done and logged (nothing has expired yet).
    let confirm = get(&gw.admin_url("/console/purge"), &h).await;
    assert!(confirm.text().contains("id=\"confirm\""));
    let done = form(&gw.admin_url("/console/purge"), "confirmed=1", &h).await;
    assert_eq!(done.status, 303);
    action_lines(gw, "purge", 1).await;
    assert_eq!(record(gw, &b).await["state"], "outcome_unknown");

    // An unknown record: 404 page.
    assert_eq!(
        get(&gw.admin_url("/console/records/rec_nope"), &h)
            .await
            .status,
        404
    );
    // The in-flight fragment and the usage page answer.
    let frag = get(&gw.admin_url("/console/inflight/fragment"), &h).await;
    assert_eq!(frag.status, 200);
    assert!(frag.text().contains("data-count=\"0\""), "{}", frag.text());
    let usage = get(&gw.admin_url("/console/usage"), &h).await;
    assert_eq!(usage.status, 200);
    assert!(usage.text().contains("<svg"));

    // Paging: 50 a page, newest first, each record on one page only.
    for i in 0..55 {
        let r = http_post(
            &gw.url("/v1/render"),
            &format!("{{\"text\":\"page {i}\"}}"),
            &[("authorization", "Bearer sk_erin")],
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let rows = |page: &str| {
        page.match_indices("<tr data-record=\"")
            .map(|(i, _)| page[i + 18..i + 18 + 36].to_owned())
            .collect::<Vec<_>>()
    };
    let first = get(&gw.admin_url("/console/?principal=Bearer+sk_erin"), &h)
        .await
        .text();
    assert!(first.contains("page 1 <a"), "{first}");
    assert!(first.contains("id=\"next-page\""));
    let second = get(
        &gw.admin_url("/console/?principal=Bearer+sk_erin&page=2"),
        &h,
    )
    .await
    .text();
    assert!(second.contains("page 2</nav>"), "{second}");
    let (one, two) = (rows(&first), rows(&second));
    assert_eq!((one.len(), two.len()), (50, 5));
    assert!(one.iter().all(|id| !two.contains(id)));
}

/// PostgreSQL, two instances: one instance's console sees the other's records, its calls
/// in flight, and resolves them in the shared ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_the_console_of_one_instance_sees_and_resolves_another_s_records() {
    let store = oncely_store_conformance::testing::fresh_pg_schema(
        &oncely_store_conformance::testing::shared_pg_url(),
    )
    .await;
    let s = setup_on(Some(store)).await;
    let other = another_instance(&s);
    let auth = format!("Bearer {TOKEN}");
    let h = [("authorization", auth.as_str())];
    let id = unknown_order(&s.gw, "Bearer sk_alice", "order-pg").await;
    let list = get(&other.admin_url("/console/?state=outcome_unknown"), &h)
        .await
        .text();
    assert!(
        list.contains(&format!(
            "data-record=\"{id}\" data-state=\"outcome_unknown\""
        )),
        "{list}"
    );
    let page = get(&other.admin_url(&format!("/console/records/{id}")), &h)
        .await
        .text();
    assert!(
        page.contains("0 so far"),
        "the schedule kept in PostgreSQL: {page}"
    );

    // A call running on the first instance is in flight on the second's page.
    let slow = {
        let url = s.gw.url("/v1/render");
        tokio::spawn(async move {
            http_post(
                &url,
                "{\"text\":\"brief\"}",
                &[("authorization", "Bearer sk_dave")],
            )
            .await
        })
    };
    let frag_url = other.admin_url("/console/inflight/fragment");
    eventually("the second instance shows the call in flight", || {
        let url = frag_url.clone();
        let auth = auth.clone();
        async move {
            get(&url, &[("authorization", &auth)])
                .await
                .text()
                .contains("data-count=\"1\"")
        }
    })
    .await;

    // Resolved on the second instance; the first one's ledger says so.
    let done = form(
        &other.admin_url(&format!("/console/records/{id}/resolve")),
        "verdict=released&confirmed=1",
        &h,
    )
    .await;
    assert_eq!(done.status, 303, "{}", done.text());
    let r = record(&s.gw, &id).await;
    assert_eq!(r["state"], "released");
    assert_eq!(
        r["last_error"],
        "resolved as released by an operator (console)"
    );
    action_lines(&other, "resolve", 1).await;
    assert_eq!(slow.await.unwrap().status, 200);
}
