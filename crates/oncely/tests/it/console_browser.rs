//! The operator console in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`, which `scripts/test` installs) driven over WebDriver with
//! `fantoccini`, against the real binary. One browser session walks through what a
//! person on call does: log in (a wrong token first), find the `outcome_unknown`
//! record, resolve it through the confirmation and see it change, search, read the
//! usage, watch calls in flight, redeliver a dead webhook delivery.
//!
//! With `ONCELY_SCREENSHOTS=DIR` the pages' screenshots are written there
//! (`ONCELY_SCREENSHOTS=docs/screenshots` refreshes the ones in the repository).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};

use super::console::{dead_letter, eventually, record, setup, unknown_order, TOKEN};
use crate::common::{get, post as http_post};

/// chromedriver on a free port; killed on drop.
struct Driver {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    /// Kills chromedriver and the Chromium processes it started (its descendants, found
    /// in /proc, each by its own positive pid), even when the test failed before closing
    /// its session.
    fn drop(&mut self) {
        let root = self.child.id();
        let mut doomed = descendants(root);
        doomed.reverse();
        let _ = self.child.kill();
        let _ = self.child.wait();
        for pid in doomed {
            // A positive pid only: never a process group, never -1.
            assert!(pid > 1);
            let _ = Command::new("kill")
                .args(["-s", "KILL", "--", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The pids of every descendant of `root`, parents before children.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // /proc/PID/stat: "PID (COMM) STATE PPID ..."; COMM may hold spaces.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|(pid, ppid)| *ppid == parent && *pid != root)
                .map(|(pid, _)| *pid),
        );
        i += 1;
    }
    found.remove(0);
    found
}

fn find_program(names: &[&str]) -> String {
    for name in names {
        for dir in ["/usr/bin", "/usr/lib/chromium", "/usr/local/bin"] {
            let p = format!("{dir}/{name}");
            if std::path::Path::new(&p).exists() {
                return p;
            }
        }
    }
    panic!(
        "{names:?} not found: install Debian's chromium and chromium-driver (scripts/test does)"
    );
}

async fn browser() -> (Driver, Client) {
    let chromedriver = find_program(&["chromedriver"]);
    let chromium = find_program(&["chromium"]);
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(chromedriver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver starts");
    let profile = tempfile::tempdir().unwrap();
    let driver = Driver {
        child,
        port,
        _profile: profile,
    };
    // It answers once it listens.
    let mut up = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "chromedriver did not listen on port {port} within 10 s");
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,900",
                format!("--user-data-dir={}", driver._profile.path().display()),
            ],
        }),
    );
    let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a Chromium session");
    (driver, client)
}

/// Saves a screenshot when `ONCELY_SCREENSHOTS` names a directory; checks it is a PNG.
async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    if let Ok(dir) = std::env::var("ONCELY_SCREENSHOTS") {
        let dir = std::path::Path::new(&dir);
        let dir = if dir.is_relative() {
            // Relative to the workspace, not to the crate the test runs in.
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join(dir)
        } else {
            dir.to_owned()
        };
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }
}

/// The text of an element, waiting (up to 10 s) for it to be on the page.
async fn text_of(c: &Client, css: &str) -> String {
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .text()
        .await
        .unwrap()
}

/// Waits (up to 10 s) until the page's URL contains `part`.
async fn wait_url(c: &Client, part: &str) {
    for _ in 0..200 {
        if c.current_url().await.unwrap().as_str().contains(part) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the browser did not get to a URL with {part:?}");
}

async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap();
}

async fn type_into(c: &Client, css: &str, text: &str) {
    let e = c.find(Locator::Css(css)).await.unwrap();
    e.clear().await.unwrap();
    e.send_keys(text).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_resolves_an_outcome_unknown_record_in_the_browser() {
    let s = setup().await;
    let gw = &s.gw;
    // What an incident leaves: two unknown orders, a render with its repeats, a dead
    // webhook delivery.
    let unknown = unknown_order(gw, "Bearer sk_alice", "order-42").await;
    let other = unknown_order(gw, "Bearer sk_bob", "order-43").await;
    for _ in 0..3 {
        let r = http_post(
            &gw.url("/v1/render"),
            "{\"text\":\"chapter one\"}",
            &[("authorization", "Bearer sk_carol")],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let delivery = dead_letter(&s, "msg_evt_1").await;
    // Repeats are written every 200 ms: wait for carol's two.
    let mut carol = None;
    for _ in 0..200 {
        let usage = get(
            &gw.admin_url("/usage"),
            &[("authorization", &format!("Bearer {TOKEN}"))],
        )
        .await
        .json();
        carol = usage["by_principal"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["repeats"] == 2)
            .map(|r| r["principal"].as_str().unwrap().to_owned());
        if carol.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let carol = carol.expect("carol's two repeats are counted");

    let (_driver, c) = browser().await;
    let base = format!("http://{}", gw.admin);

    // Log in: a wrong token first.
    c.goto(&format!("{base}/console/")).await.unwrap();
    assert!(c
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with("/console/login"));
    screenshot(&c, "login").await;
    type_into(&c, "#token", "not-the-token").await;
    click(&c, "#login").await;
    assert!(text_of(&c, "#login-error")
        .await
        .contains("not the admin token"));
    assert!(c.get_all_cookies().await.unwrap().is_empty());
    type_into(&c, "#token", TOKEN).await;
    click(&c, "#login").await;
    c.wait()
        .for_element(Locator::Css("#records"))
        .await
        .unwrap();
    let cookies = c.get_all_cookies().await.unwrap();
    let session = cookies
        .iter()
        .find(|k| k.name() == "oncely_console")
        .unwrap_or_else(|| panic!("the session cookie in {cookies:?}"));
    assert_eq!(session.http_only(), Some(true));
    assert_eq!(format!("{:?}", session.same_site()), "Some(Strict)");
    assert_eq!(session.path(), Some("/console"));
    // Script cannot read it.
    assert_eq!(
        c.execute("return document.cookie", vec![]).await.unwrap(),
        ""
    );

    // The outcome_unknown records come first, with their age.
    let rows = c.find_all(Locator::Css("#records tbody tr")).await.unwrap();
    assert_eq!(
        rows[0].attr("data-state").await.unwrap().as_deref(),
        Some("outcome_unknown")
    );
    assert_eq!(
        rows[0].attr("data-record").await.unwrap().as_deref(),
        Some(unknown.as_str())
    );
    assert_eq!(
        rows[1].attr("data-record").await.unwrap().as_deref(),
        Some(other.as_str())
    );
    screenshot(&c, "records").await;

    // Search by key.
    type_into(&c, "#q-key", "order-43").await;
    click(&c, "#q-go").await;
    wait_url(&c, "key=order-43").await;
    c.wait()
        .for_element(Locator::Css("#records"))
        .await
        .unwrap();
    let found = c.find_all(Locator::Css("#records tbody tr")).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].attr("data-record").await.unwrap().as_deref(),
        Some(other.as_str())
    );
    c.goto(&format!("{base}/console/")).await.unwrap();

    // Open it, resolve it as completed, through the confirmation.
    click(&c, &format!("tr[data-record=\"{unknown}\"] a")).await;
    c.wait()
        .for_element(Locator::Css("#history"))
        .await
        .unwrap();
    assert!(text_of(&c, "#record-state")
        .await
        .contains("outcome_unknown"));
    screenshot(&c, "record-outcome-unknown").await;
    click(&c, "#resolve").await;
    c.wait()
        .for_element(Locator::Css("#resolve-form"))
        .await
        .unwrap();
    click(&c, "#v-completed").await;
    type_into(&c, "#r-status", "201").await;
    type_into(&c, "#r-headers", "content-type: application/json").await;
    type_into(&c, "#r-body", "{\"order\":\"ord_42\"}").await;
    screenshot(&c, "resolve").await;
    click(&c, "#r-next").await;
    c.wait()
        .for_element(Locator::Css("#confirm-form"))
        .await
        .unwrap();
    assert!(text_of(&c, "#confirm-text")
        .await
        .contains("completed with status 201"));
    screenshot(&c, "resolve-confirm").await;
    // Nothing has changed before the confirmation.
    assert_eq!(record(gw, &unknown).await["state"], "outcome_unknown");
    click(&c, "#confirm").await;
    c.wait()
        .for_element(Locator::Css("#history"))
        .await
        .unwrap();
    assert!(text_of(&c, "#record-state").await.contains("completed"));
    assert!(text_of(&c, ".notice")
        .await
        .contains("resolved as completed"));
    assert!(text_of(&c, "#reason").await.contains("(console)"));
    let r = record(gw, &unknown).await;
    assert_eq!(r["state"], "completed");
    assert_eq!(r["response"]["status"], 201);
    assert_eq!(r["response"]["body"], "{\"order\":\"ord_42\"}");
    // And a duplicate now gets that answer without reaching the upstream.
    let dup = http_post(
        &gw.url("/v1/orders"),
        r#"{"item":"chair"}"#,
        &[
            ("authorization", "Bearer sk_alice"),
            ("idempotency-key", "order-42"),
        ],
    )
    .await;
    assert_eq!(dup.status, 201);
    assert_eq!(dup.text(), "{\"order\":\"ord_42\"}");
    assert_eq!(s.up.orders.load(Ordering::SeqCst), 2);

    // A POST from the page without the CSRF token is refused (the cookie alone is not
    // enough).
    let status = c
        .execute_async(
            "const done = arguments[0]; fetch('/console/purge', {method: 'POST', \
             headers: {'content-type': 'application/x-www-form-urlencoded'}, body: 'confirmed=1'}) \
             .then(r => done(r.status), e => done(String(e)));",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(status, 403);

    // Usage shows the principal, with the chart.
    click(&c, "nav a[href=\"/console/usage\"]").await;
    c.wait()
        .for_element(Locator::Css("#usage-chart svg"))
        .await
        .unwrap();
    let row = c
        .find(Locator::Css(&format!(
            "#usage tr[data-principal=\"{carol}\"]"
        )))
        .await
        .unwrap();
    assert!(row.text().await.unwrap().contains(&carol));
    assert!(!c
        .find_all(Locator::Css("#usage-chart rect.repeats"))
        .await
        .unwrap()
        .is_empty());
    screenshot(&c, "usage").await;

    // In flight: a slow render appears on the open page without reloading it.
    click(&c, "nav a[href=\"/console/inflight\"]").await;
    c.wait()
        .for_element(Locator::Css("#inflight-count"))
        .await
        .unwrap();
    assert_eq!(
        c.find(Locator::Css("#inflight-count"))
            .await
            .unwrap()
            .attr("data-count")
            .await
            .unwrap()
            .as_deref(),
        Some("0")
    );
    let slow = {
        let url = gw.url("/v1/render");
        tokio::spawn(async move {
            http_post(
                &url,
                "{\"text\":\"slow\"}",
                &[("authorization", "Bearer sk_dave")],
            )
            .await
        })
    };
    c.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("#inflight-count[data-count=\"1\"]"))
        .await
        .unwrap();
    screenshot(&c, "inflight").await;
    assert_eq!(slow.await.unwrap().status, 200);

    // A dead webhook delivery, redelivered through the confirmation.
    s.up.fail_hooks.store(false, Ordering::SeqCst);
    let before = s.up.deliveries.load(Ordering::SeqCst);
    click(&c, "nav a[href=\"/console/webhooks\"]").await;
    c.wait().for_element(Locator::Css("#dead")).await.unwrap();
    screenshot(&c, "webhooks").await;
    click(&c, &format!("tr[data-delivery=\"{delivery}\"] a.redeliver")).await;
    c.wait()
        .for_element(Locator::Css("#confirm-form"))
        .await
        .unwrap();
    click(&c, "#confirm").await;
    c.wait().for_element(Locator::Css(".notice")).await.unwrap();
    eventually("the redelivery arrives", || async {
        s.up.deliveries.load(Ordering::SeqCst) > before
    })
    .await;

    // Logging out ends the session: the console asks for the token again.
    click(&c, "#logout").await;
    c.wait().for_element(Locator::Css("#token")).await.unwrap();
    c.goto(&format!("{base}/console/")).await.unwrap();
    assert!(c
        .current_url()
        .await
        .unwrap()
        .path()
        .ends_with("/console/login"));
    c.close().await.unwrap();
}

/// The usage page after the records it counts have been purged: the figures (and the
/// chart) come from the usage history, the same as before the purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_usage_page_shows_the_history_after_a_purge() {
    use axum::routing::post;
    let up = crate::common::upstream(
        axum::Router::new().route("/v1/render", post(|body: String| async move { body })),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("oncely.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"
store = "sqlite://{}"
upstream = "http://{up}"

[[routes]]
method = "POST"
path = "/v1/render"
class = "write"
units = "json:/text"
window = "2s"
"#,
            dir.path().join("ledger.db").display()
        ),
    )
    .unwrap();
    let gw = crate::common::Gateway::start(
        &["--config", cfg.to_str().unwrap()],
        &[("ONCELY_ADMIN_TOKEN", TOKEN)],
    );
    let auth = format!("Bearer {TOKEN}");
    let h = [("authorization", auth.as_str())];
    // Erin: one render of 5 units and two repeats of it.
    for _ in 0..3 {
        let r = http_post(
            &gw.url("/v1/render"),
            "{\"text\":\"hello\"}",
            &[("authorization", "Bearer sk_erin")],
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let want = serde_json::json!({"fresh": 1, "fresh_units": 5, "repeats": 2, "repeat_units": 10});
    eventually("the two repeats are counted", || async {
        get(&gw.admin_url("/usage"), &h).await.json()["totals"] == want
    })
    .await;
    let erin = get(&gw.admin_url("/records"), &h).await.json()[0]["principal"]
        .as_str()
        .unwrap()
        .to_owned();
    // The window ends (the server's own purge waits a minute).
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let (_driver, c) = browser().await;
    let base = format!("http://{}", gw.admin);
    c.goto(&format!("{base}/console/")).await.unwrap();
    type_into(&c, "#token", TOKEN).await;
    click(&c, "#login").await;
    c.wait()
        .for_element(Locator::Css("#records"))
        .await
        .unwrap();
    // Purge, through the confirmation.
    c.goto(&format!("{base}/console/purge")).await.unwrap();
    click(&c, "#confirm").await;
    assert!(text_of(&c, ".notice")
        .await
        .contains("purged 1 expired records"));
    let left = get(&gw.admin_url("/records"), &h).await.json();
    assert_eq!(left, serde_json::json!([]), "the record is gone");

    // The usage page: Erin's row and the totals, from the history.
    click(&c, "nav a[href=\"/console/usage\"]").await;
    c.wait()
        .for_element(Locator::Css("#usage-chart svg"))
        .await
        .unwrap();
    let cells = |css: String| {
        let c = c.clone();
        async move {
            let row = c.find(Locator::Css(&css)).await.unwrap();
            let mut out = Vec::new();
            for td in row.find_all(Locator::Css("td")).await.unwrap() {
                out.push(td.text().await.unwrap());
            }
            out
        }
    };
    let row = cells(format!("#usage tr[data-principal=\"{erin}\"]")).await;
    assert_eq!(row[1..], ["1", "5", "2", "10"], "{row:?}");
    let total = cells("#usage tfoot tr".to_owned()).await;
    assert_eq!(total, ["1", "5", "2", "10"], "{total:?}");
    // The chart's bars (one hour, or two if the calls straddled the turn of an hour).
    let bars = |css: &'static str| {
        let c = c.clone();
        async move {
            let mut sum = 0;
            for t in c.find_all(Locator::Css(css)).await.unwrap() {
                let text = t.html(true).await.unwrap();
                sum += text
                    .split(' ')
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("{text:?}"));
            }
            sum
        }
    };
    assert_eq!(bars("#usage-chart rect.fresh title").await, 1);
    assert_eq!(bars("#usage-chart rect.repeats title").await, 2);
    assert!(text_of(&c, "#usage-period")
        .await
        .contains("the start of its first hour"));
    // The admin API says the same.
    assert_eq!(
        get(&gw.admin_url("/usage"), &h).await.json()["totals"],
        want
    );
    c.close().await.unwrap();
}
