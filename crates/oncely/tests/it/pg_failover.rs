//! PostgreSQL with several hosts, through the real binary, on a real primary and a real
//! streaming standby that it replicates to synchronously (`PgCluster`):
//!
//! - the primary's postmaster SIGKILLed while 16 callers (4 intentions, each at both of
//!   two gateways) wait on a slow upstream, then the standby promoted: no intention runs
//!   twice, every caller answered 2xx for one intention got the same body, each replays
//!   afterwards, new requests in the outage get 503 `store_unavailable` at once, and both
//!   gateways (pool and LISTEN connection) move to the new primary without a restart;
//! - a failover longer than a route's lease lets no other gateway take a live owner's
//!   record over as soon as the standby is promoted (the owner renews first);
//! - with `target_session_attrs=read-write`, a standby or a host that is down listed
//!   first is passed over for the primary;
//! - without it (libpq's default `any`), a URL whose first host is a standby is refused
//!   by `migrate` and `serve` in one line that says to add it; one whose first host is the
//!   primary works, and answers 503 during a failover until the standby is promoted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use oncely_store_conformance::testing::PgCluster;

use crate::common::{assert_usage_error, oncely, post as http_post, run, stderr, upstream};
use crate::common::{Answer, Gateway};

pub(crate) const AUTH: [(&str, &str); 1] = [("authorization", "Bearer sk_failover")];

/// An upstream whose `POST /v1/render` takes `delay`, answers `render #N: BODY` (N counts
/// every execution), and counts the executions of each body (an intention).
#[derive(Clone)]
pub(crate) struct Renders {
    pub(crate) url: String,
    runs: Arc<Mutex<HashMap<String, usize>>>,
}

impl Renders {
    pub(crate) async fn start(delay: Duration) -> Renders {
        let runs: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let counter = runs.clone();
        let addr = upstream(axum::Router::new().route(
            "/v1/render",
            post(move |body: String| {
                let n = {
                    let mut runs = counter.lock().unwrap();
                    *runs.entry(body.clone()).or_default() += 1;
                    runs.values().sum::<usize>()
                };
                async move {
                    tokio::time::sleep(delay).await;
                    format!("render #{n}: {body}")
                }
            }),
        ))
        .await;
        Renders {
            url: format!("http://{addr}"),
            runs,
        }
    }

    /// How many times `intention` was executed (begun) upstream.
    pub(crate) fn runs(&self, intention: &str) -> usize {
        self.runs
            .lock()
            .unwrap()
            .get(intention)
            .copied()
            .unwrap_or(0)
    }

    /// Executions begun upstream, of every intention.
    pub(crate) fn total(&self) -> usize {
        self.runs.lock().unwrap().values().sum()
    }

    /// Waits (at most 20 s) until `n` executions have begun.
    pub(crate) async fn until_begun(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.total() < n {
            assert!(
                Instant::now() < deadline,
                "only {} executions began",
                self.total()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// `oncely serve --upstream UP --store STORE`.
pub(crate) fn serve(up: &str, store: &str) -> Gateway {
    Gateway::start(&["--upstream", up, "--store", store], &[])
}

/// `oncely migrate --store URL`, which must succeed.
pub(crate) fn migrate(url: &str) {
    let out = run(&["migrate", "--store", url]);
    assert!(out.status.success(), "migrate: {}", stderr(&out));
}

/// A caller's answer: which intention, at which gateway, and how long it took.
pub(crate) struct Call {
    pub(crate) intention: String,
    pub(crate) answer: Answer,
    pub(crate) took: Duration,
}

/// `callers` concurrent callers over `intentions` distinct bodies: caller `i` sends
/// intention `i % intentions` to gateway `(i / intentions) % urls.len()`, so that each
/// intention reaches every gateway.
pub(crate) fn callers(
    urls: &[String],
    prefix: &str,
    intentions: usize,
    callers: usize,
) -> Vec<tokio::task::JoinHandle<Call>> {
    (0..callers)
        .map(|i| {
            let url = urls[(i / intentions) % urls.len()].clone();
            let intention = format!("{prefix} {}", i % intentions);
            tokio::spawn(async move {
                let started = Instant::now();
                let answer = http_post(&url, &intention, &AUTH).await;
                Call {
                    intention,
                    answer,
                    took: started.elapsed(),
                }
            })
        })
        .collect()
}

/// The calls, once all have answered (each within 60 s).
pub(crate) async fn answers(calls: Vec<tokio::task::JoinHandle<Call>>) -> Vec<Call> {
    let mut out = Vec::new();
    for c in calls {
        out.push(
            tokio::time::timeout(Duration::from_secs(60), c)
                .await
                .expect("every caller is answered within 60 s")
                .unwrap(),
        );
    }
    out
}

/// The body every 2xx answer of each intention had (they must agree), by intention.
pub(crate) fn agreed_bodies(calls: &[Call]) -> HashMap<String, bytes::Bytes> {
    let mut bodies: HashMap<String, bytes::Bytes> = HashMap::new();
    for c in calls.iter().filter(|c| c.answer.status.is_success()) {
        let body = bodies
            .entry(c.intention.clone())
            .or_insert_with(|| c.answer.body.clone());
        assert_eq!(
            *body, c.answer.body,
            "two different 2xx answers for {:?}",
            c.intention
        );
    }
    bodies
}

/// Waits (at most 30 s) until `gw` has logged a line containing `needle`.
pub(crate) async fn logged(gw: &Gateway, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if gw.lines.lock().unwrap().iter().any(|l| l.contains(needle)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the gateway never logged {needle:?}: {}",
            gw.lines.lock().unwrap().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts the 503 `store_unavailable` problem.
#[track_caller]
fn assert_store_unavailable(a: &Answer) {
    assert_eq!(a.status, 503, "{}", a.text());
    assert_eq!(a.json()["code"], "store_unavailable", "{}", a.text());
}

/// A duplicate at `b` of an original running at `a` joins it, woken by the original's
/// NOTIFY (well before `wait`, 20 s, runs out); both get one execution's answer.
pub(crate) async fn a_duplicate_joins_across(a: &Gateway, b: &Gateway, up: &Renders, body: &str) {
    let before = up.total();
    let url_a = a.url("/v1/render");
    let original = {
        let body = body.to_owned();
        tokio::spawn(async move { http_post(&url_a, &body, &AUTH).await })
    };
    up.until_begun(before + 1).await;
    let started = Instant::now();
    let dup = http_post(&b.url("/v1/render"), body, &AUTH).await;
    let waited = started.elapsed();
    let original = original.await.unwrap();
    assert_eq!(original.status, 200, "{}", original.text());
    assert_eq!(original.header("oncely-status"), "fresh");
    assert_eq!(dup.status, 200, "{}", dup.text());
    assert_eq!(dup.header("oncely-status"), "joined");
    assert_eq!(dup.body, original.body);
    assert_eq!(up.runs(body), 1);
    assert!(waited < Duration::from_secs(8), "the join took {waited:?}");
}

/// Runs `oncely ARGS` and gives its output, killing it after 30 s (a `serve` that should
/// have refused to start but did not).
fn run_bounded(args: &[&str]) -> std::process::Output {
    let child = oncely()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(30));
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    });
    let out = child.wait_with_output().expect("its output");
    drop(watchdog);
    out
}

/// `serve` with `store`, which must refuse to start: exit 2, one line with `needle`.
pub(crate) fn assert_serve_refuses(store: &str, needle: &str) {
    let out = run_bounded(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--upstream",
        "http://127.0.0.1:9",
        "--store",
        store,
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "serve: {err}");
    let last = err.lines().last().unwrap_or("");
    assert!(last.contains(needle), "{needle:?} not in {last:?}");
    assert!(
        !err.contains("listening on"),
        "serve listened before it refused: {err}"
    );
    assert_eq!(err.lines().count(), 1, "one line expected: {err:?}");
}

/// `migrate` with `store`, which must refuse: exit 2, one line with `needle`.
pub(crate) fn assert_migrate_refuses(store: &str, needle: &str) {
    assert_usage_error(&run_bounded(&["migrate", "--store", store]), needle);
}

/// Two gateways on `cluster` (the URL lists both hosts, with read-write), migrated, with
/// a `write` route at `/v1/render` keyed by fingerprint, of lease `lease` and a wait of
/// 20 s; the directory holds their config.
pub(crate) async fn two_gateways(
    cluster: &PgCluster,
    up: &Renders,
    lease: &str,
) -> (Gateway, Gateway, tempfile::TempDir) {
    let url = cluster.url(
        &[cluster.port(0), cluster.port(1)],
        "target_session_attrs=read-write",
    );
    migrate(&url);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("oncely.toml");
    std::fs::write(
        &config,
        format!(
            "upstream = \"{}\"\nstore = \"{url}\"\n\n[[routes]]\nmethod = \"POST\"\n\
             path = \"/v1/render\"\nclass = \"write\"\nkey = \"fingerprint\"\n\
             lease = \"{lease}\"\nwait = \"20s\"\n",
            up.url
        ),
    )
    .unwrap();
    let config = config.display().to_string();
    let a = Gateway::start(&["--config", &config], &[]);
    let b = Gateway::start(&["--config", &config], &[]);
    (a, b, dir)
}

pub(crate) async fn cluster() -> Arc<PgCluster> {
    Arc::new(
        tokio::task::spawn_blocking(PgCluster::start)
            .await
            .expect("the cluster starts"),
    )
}

/// Runs a blocking step of the cluster's (kill, promote) off the test's runtime.
pub(crate) async fn on_cluster(cluster: &Arc<PgCluster>, step: fn(&PgCluster)) {
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || step(&c)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_primary_killed_mid_call_runs_nothing_twice_and_both_gateways_follow_the_promotion() {
    let cluster = cluster().await;
    let url = cluster.url(
        &[cluster.port(0), cluster.port(1)],
        "target_session_attrs=read-write",
    );
    migrate(&url);
    let up = Renders::start(Duration::from_secs(2)).await;
    let a = serve(&up.url, &url);
    let b = serve(&up.url, &url);
    let urls = [a.url("/v1/render"), b.url("/v1/render")];

    // 16 callers of 4 intentions, each intention at both gateways; the 4 originals are
    // running upstream when the primary dies, and answer while it is still lost.
    let calls = callers(&urls, "chapter", 4, 16);
    up.until_begun(4).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    on_cluster(&cluster, PgCluster::kill_primary).await;
    let lost = Instant::now();

    // In the outage, a new intention is refused at once, and never forwarded.
    for (i, url) in urls.iter().cycle().take(4).enumerate() {
        let started = Instant::now();
        let refused = http_post(url, &format!("in the outage {i}"), &AUTH).await;
        assert_store_unavailable(&refused);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "a refusal took {:?}",
            started.elapsed()
        );
    }
    // The outage outlasts the upstream calls (the owners cannot record their answers),
    // but not the lease (30 s).
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(lost.elapsed())).await;
    on_cluster(&cluster, PgCluster::promote).await;

    let calls = answers(calls).await;
    for c in &calls {
        match c.answer.status.as_u16() {
            200 => assert!(
                ["fresh", "joined", "replayed"].contains(&c.answer.header("oncely-status")),
                "{:?}",
                c.answer.headers
            ),
            409 => assert_eq!(c.answer.json()["code"], "in_flight", "{}", c.answer.text()),
            503 => assert_store_unavailable(&c.answer),
            other => panic!("{}: {other} {}", c.intention, c.answer.text()),
        }
    }
    let bodies = agreed_bodies(&calls);
    for i in 0..4 {
        let intention = format!("chapter {i}");
        assert_eq!(up.runs(&intention), 1, "{intention} ran once");
        // Its original's caller got the upstream's answer.
        let fresh: Vec<_> = calls
            .iter()
            .filter(|c| c.intention == intention && c.answer.status == 200)
            .filter(|c| c.answer.header("oncely-status") == "fresh")
            .collect();
        assert_eq!(fresh.len(), 1, "{intention}: one fresh answer");
        assert!(bodies[&intention].ends_with(intention.as_bytes()));
    }
    let slowest = calls.iter().map(|c| c.took).max().unwrap();
    assert!(
        slowest < Duration::from_secs(30),
        "a caller took {slowest:?}"
    );
    for i in 0..4 {
        assert_eq!(up.runs(&format!("in the outage {i}")), 0);
    }

    // The owners kept trying to record their answers, and did on the new primary; both
    // listeners found the new primary, by themselves.
    let retried = |gw: &Gateway| {
        let lines = gw.lines.lock().unwrap();
        lines
            .iter()
            .filter(|l| l.contains("ledger write failed") && l.contains("op=\"complete\""))
            .count()
    };
    assert!(
        retried(&a) + retried(&b) > 0,
        "no owner had to retry its completion"
    );
    for gw in [&a, &b] {
        logged(gw, "PostgreSQL listener reconnected").await;
    }
    // Every intention replays its one answer at both gateways (its completion was
    // written to the new primary: no record was left processing).
    for i in 0..4 {
        let intention = format!("chapter {i}");
        for url in &urls {
            let replay = http_post(url, &intention, &AUTH).await;
            assert_eq!(replay.status, 200, "{}", replay.text());
            assert_eq!(replay.header("oncely-status"), "replayed");
            assert_eq!(replay.body, bodies[&intention]);
        }
        assert_eq!(up.runs(&intention), 1);
    }
    // New work runs once at either gateway, and a duplicate at one joins the original
    // at the other (LISTEN/NOTIFY on the new primary).
    let after = http_post(&urls[1], "after the failover", &AUTH).await;
    assert_eq!(after.status, 200, "{}", after.text());
    assert_eq!(after.header("oncely-status"), "fresh");
    let again = http_post(&urls[0], "after the failover", &AUTH).await;
    assert_eq!(again.header("oncely-status"), "replayed");
    assert_eq!(again.body, after.body);
    a_duplicate_joins_across(&a, &b, &up, "joined after the failover").await;
    a_duplicate_joins_across(&b, &a, &up, "joined the other way").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_read_write_a_standby_or_a_host_that_is_down_listed_first_is_passed_over() {
    let cluster = cluster().await;
    let (primary, standby) = (cluster.port(0), cluster.port(1));
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let standby_first = cluster.url(&[standby, primary], "target_session_attrs=read-write");
    let down_first = cluster.url(
        &[down, standby, primary],
        "target_session_attrs=read-write&connect_timeout=2",
    );
    migrate(&standby_first);
    migrate(&down_first);
    let up = Renders::start(Duration::from_millis(1500)).await;
    let a = serve(&up.url, &standby_first);
    let b = serve(&up.url, &down_first);
    let urls = [a.url("/v1/render"), b.url("/v1/render")];

    let calls = answers(callers(&urls, "scene", 2, 12)).await;
    let bodies = agreed_bodies(&calls);
    for i in 0..2 {
        let intention = format!("scene {i}");
        assert_eq!(up.runs(&intention), 1, "{intention} ran once");
        for url in &urls {
            let replay = http_post(url, &intention, &AUTH).await;
            assert_eq!(replay.header("oncely-status"), "replayed");
            assert_eq!(replay.body, bodies[&intention]);
        }
    }
    assert!(calls.iter().all(|c| c.answer.status == 200));
    a_duplicate_joins_across(&a, &b, &up, "joined a to b").await;
    a_duplicate_joins_across(&b, &a, &up, "joined b to a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_target_session_attrs_a_standby_first_is_refused_and_a_failover_answers_503() {
    let cluster = cluster().await;
    let (primary, standby) = (cluster.port(0), cluster.port(1));
    // A URL whose first host is the standby: refused before anything is written, in one
    // line that says what to add.
    for store in [
        cluster.url(&[standby, primary], ""),
        cluster.url(&[standby], ""),
        cluster.url(&[standby, primary], "target_session_attrs=any"),
    ] {
        let store2 = store.clone();
        tokio::task::spawn_blocking(move || {
            assert_migrate_refuses(&store2, "is a read-only standby");
            assert_migrate_refuses(&store2, "add target_session_attrs=read-write");
            assert_serve_refuses(&store2, "target_session_attrs=read-write");
        })
        .await
        .unwrap();
    }

    // The primary first: it works, and the gateway warns that a failover may land on
    // the standby.
    let store = cluster.url(&[primary, standby], "");
    migrate(&store);
    let up = Renders::start(Duration::ZERO).await;
    let gw = serve(&up.url, &store);
    logged(&gw, "without target_session_attrs=read-write").await;
    let render = gw.url("/v1/render");
    let first = http_post(&render, "before", &AUTH).await;
    assert_eq!(first.header("oncely-status"), "fresh");

    // The primary lost: new connections go to the standby, which takes no writes.
    on_cluster(&cluster, PgCluster::kill_primary).await;
    for i in 0..3 {
        let refused = http_post(&render, &format!("during {i}"), &AUTH).await;
        assert_store_unavailable(&refused);
    }
    logged(&gw, "the server is read-only: a standby").await;
    assert_eq!(up.total(), 1, "nothing was forwarded in the outage");

    // Promoted, the standby takes writes on the same connections: no restart needed.
    on_cluster(&cluster, PgCluster::promote).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let back = loop {
        let a = http_post(&render, "after", &AUTH).await;
        if a.status == 200 || Instant::now() > deadline {
            break a;
        }
        assert_store_unavailable(&a);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(back.status, 200, "{}", back.text());
    assert_eq!(back.header("oncely-status"), "fresh");
    let replay = http_post(&render, "before", &AUTH).await;
    assert_eq!(replay.header("oncely-status"), "replayed");
    assert_eq!(replay.body, first.body);
    assert_eq!(up.total(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_longer_than_the_lease_lets_no_other_gateway_take_a_live_owners_record() {
    let cluster = cluster().await;
    let up = Renders::start(Duration::from_secs(7)).await;
    let (a, b, _dir) = two_gateways(&cluster, &up, "2s").await;
    let url_a = a.url("/v1/render");
    let original = tokio::spawn(async move { http_post(&url_a, "a long call", &AUTH).await });
    up.until_begun(1).await;
    // The primary is lost for twice the lease: the owner cannot renew meanwhile.
    on_cluster(&cluster, PgCluster::kill_primary).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    on_cluster(&cluster, PgCluster::promote).await;
    // A duplicate right after the promotion finds the owner's lease lapsed by the
    // database's clock; the owner is alive, and renews as soon as it can.
    let dup = http_post(&b.url("/v1/render"), "a long call", &AUTH).await;
    let original = original.await.unwrap();
    assert_eq!(original.status, 200, "{}", original.text());
    assert_eq!(original.header("oncely-status"), "fresh");
    assert_eq!(up.runs("a long call"), 1, "the live owner's call ran again");
    assert_eq!(dup.status, 200, "{}", dup.text());
    assert_eq!(dup.header("oncely-status"), "joined");
    assert_eq!(dup.body, original.body);
}
