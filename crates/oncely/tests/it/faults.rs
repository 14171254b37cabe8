//! The guarantee under faults, through the real binary: callers that stall or vanish, a
//! ledger that refuses writes for a while (a SQLite write lock held past the busy
//! timeout, a stopped PostgreSQL), many joiners of one large answer, a shutdown with a
//! stream still open, requests queued for a route's `concurrency` slot, and sustained
//! fresh load on the embedded ledger.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::{get, post};
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oncely_store_conformance::testing::PgServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{get as http_get, post as http_post, run, stderr, stdout, upstream, Gateway};

const AUTH: [(&str, &str); 1] = [("authorization", "Bearer sk_faults")];

/// Writes `oncely.toml` in `dir`: `top` lines, then one `[[routes]]` table on
/// `/v1/call` with `route` lines. Returns its path.
fn config(dir: &Path, store: &str, upstream: &str, top: &str, route: &str) -> String {
    let path = dir.join("oncely.toml");
    std::fs::write(
        &path,
        format!(
            r#"
store = "{store}"
upstream = "{upstream}"
{top}

[[routes]]
method = "POST"
path = "/v1/call"
key = "header-or-fingerprint"
principal = "header:authorization"
{route}
"#
        ),
    )
    .unwrap();
    path.display().to_string()
}

fn sqlite(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("ledger.db").display())
}

/// `oncely ledger list --json` on `store`.
fn ledger(store: &str) -> Vec<serde_json::Value> {
    let out = run(&["ledger", "list", "--json", "--store", store]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_str::<serde_json::Value>(&stdout(&out))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// Waits (up to 15s) until the ledger's only record leaves `processing`; returns it.
async fn settled(store: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let records = ledger(store);
        assert_eq!(records.len(), 1, "{records:?}");
        if records[0]["state"] != "processing" || Instant::now() > deadline {
            return records[0].clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn ledger_show(store: &str, id: &str) -> serde_json::Value {
    let out = run(&["ledger", "show", id, "--json", "--store", store]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

/// Calls per request body, as the upstream saw them.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<String>>>);

impl Calls {
    fn of(&self, body: &str) -> usize {
        self.0.lock().unwrap().iter().filter(|b| *b == body).count()
    }

    fn total(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    async fn wait_for(&self, body: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.of(body) == 0 {
            assert!(
                Instant::now() < deadline,
                "{body:?} never reached the upstream"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// An upstream on `/v1/call` that records each body, waits `delay` (only for bodies
/// that start with "slow" when `only_slow`), and answers `answer(body)`.
async fn recording(delay: Duration, answer: fn(&str) -> Bytes) -> (String, Calls) {
    recording_with(delay, false, answer).await
}

async fn recording_with(
    delay: Duration,
    only_slow: bool,
    answer: fn(&str) -> Bytes,
) -> (String, Calls) {
    let calls = Calls::default();
    let seen = calls.clone();
    let addr = upstream(axum::Router::new().route(
        "/v1/call",
        post(move |body: String| {
            seen.0.lock().unwrap().push(body.clone());
            async move {
                if !only_slow || body.starts_with("slow") {
                    tokio::time::sleep(delay).await;
                }
                answer(&body)
            }
        }),
    ))
    .await;
    (format!("http://{addr}"), calls)
}

fn echo(body: &str) -> Bytes {
    Bytes::from(format!("done: {body}"))
}

/// A request on a connection of its own, written by hand.
fn raw_request(body: &str) -> String {
    format!(
        "POST /v1/call HTTP/1.1\r\nhost: gw\r\nauthorization: {}\r\ncontent-type: text/plain\r\n\
         content-length: {}\r\n\r\n{body}",
        AUTH[0].1,
        body.len()
    )
}

// Item 1: a caller that stops reading holds up neither the recording nor the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_stops_reading_a_large_answer_does_not_lose_the_lease() {
    const SIZE: usize = 40 << 20;
    fn big(_: &str) -> Bytes {
        Bytes::from(vec![b'x'; SIZE])
    }
    let (up, calls) = recording(Duration::ZERO, big).await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path());
    let cfg = config(
        dir.path(),
        &store,
        &up,
        r#"max_response = "64MiB""#,
        "class = \"write\"\nlease = \"1s\"\nwait = \"10s\"",
    );
    let gw = Gateway::start(&["--config", &cfg], &[]);

    // The caller reads the head, then nothing more, and keeps its connection open.
    let mut stalled = TcpStream::connect(gw.addr).await.unwrap();
    stalled
        .write_all(raw_request("render it").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stalled.read(&mut buf).await.unwrap();
        assert!(n > 0, "the gateway closed the connection");
        head.extend_from_slice(&buf[..n]);
    }
    let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut rest = head.len() - end;
    let head = String::from_utf8_lossy(&head[..end]).to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("oncely-status: fresh"), "{head}");

    // Several leases later, a duplicate gets the recorded answer: no second execution.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let dup = http_post(&gw.url("/v1/call"), "render it", &AUTH).await;
    assert_eq!(dup.status, 200);
    // Replayed, or joined if this machine was too busy to record 40 MB in 3s.
    let status = dup.header("oncely-status");
    assert!(status == "replayed" || status == "joined", "{status}");
    assert_eq!(dup.body.len(), SIZE);
    assert_eq!(calls.of("render it"), 1);
    let records = ledger(&store);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["state"], "completed", "{:?}", records[0]);
    assert_eq!(records[0]["attempt"], 1);

    // The stalled caller still gets the whole answer once it reads.
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = stalled.read(&mut chunk).await.unwrap();
        rest += n;
        if n == 0 || rest >= SIZE {
            break;
        }
    }
    assert_eq!(rest, SIZE, "the body after the head");
}

/// Holds SQLite's write lock on `db` (`BEGIN IMMEDIATE` in the sqlite3 shell) for
/// `hold`, from a thread; returns once the lock is taken.
pub(crate) fn lock_sqlite(db: &Path, hold: Duration) -> std::thread::JoinHandle<()> {
    use std::io::{BufRead, BufReader, Write};
    let mut child = std::process::Command::new("sqlite3")
        .arg(db)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the sqlite3 shell runs");
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b".timeout 10000\nBEGIN IMMEDIATE;\nSELECT 'locked';\n")
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "locked");
    std::thread::spawn(move || {
        std::thread::sleep(hold);
        stdin.write_all(b"COMMIT;\n.quit\n").unwrap();
        drop(stdin);
        child.wait().unwrap();
    })
}

fn retries_counted(metrics: &str, op: &str) -> bool {
    metrics.lines().any(|l| {
        l.starts_with("oncely_ledger_write_retries_total")
            && l.contains(&format!("op=\"{op}\""))
            && l.rsplit(' ').next().and_then(|n| n.parse::<f64>().ok()) > Some(0.0)
    })
}

// Item 2: an owner's write that fails (SQLite busy past its timeout) is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_past_the_busy_timeout_delays_the_record_but_loses_nothing() {
    let (up, calls) = recording(Duration::from_secs(1), echo).await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path());
    let cfg = config(
        dir.path(),
        &store,
        &up,
        "",
        "class = \"write\"\nlease = \"6s\"\nwait = \"1s\"",
    );
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let url = gw.url("/v1/call");
    let original = tokio::spawn({
        let url = url.clone();
        async move { http_post(&url, "pay 1", &AUTH).await }
    });
    calls.wait_for("pay 1").await;
    // Held for longer than the store's busy timeout (5s) and the lease (6s, renewed
    // every 2s): the `complete` (after 1s) and the renewals fail until it is let go.
    let db = dir.path().join("ledger.db");
    let lock = tokio::task::spawn_blocking(move || lock_sqlite(&db, Duration::from_secs(7)))
        .await
        .unwrap();
    let original = original.await.unwrap();
    assert_eq!(original.status, 200, "{}", original.text());
    assert_eq!(original.header("oncely-status"), "fresh");
    assert_eq!(original.text(), "done: pay 1");
    tokio::task::spawn_blocking(move || lock.join().unwrap())
        .await
        .unwrap();

    // The answer may reach its caller before the ledger is free again (the body is
    // whole by its content-length); the record follows as soon as it is.
    let record = settled(&store).await;
    let log = gw.lines.lock().unwrap().join("\n");
    assert_eq!(record["state"], "completed", "{record}\n{log}");
    let dup = http_post(&url, "pay 1", &AUTH).await;
    assert_eq!(dup.status, 200, "{}", dup.text());
    assert_eq!(dup.header("oncely-status"), "replayed");
    assert_eq!(dup.text(), "done: pay 1");
    assert_eq!(calls.of("pay 1"), 1);
    let metrics = http_get(&gw.admin_url("/metrics"), &[]).await.text();
    assert!(retries_counted(&metrics, "complete"), "{metrics}");
    let log = gw.lines.lock().unwrap().join("\n");
    assert!(log.contains("ledger write failed; retrying"), "{log}");
}

// Item 2: the same with PostgreSQL stopped while the upstream call runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_during_the_call_delays_the_record_but_loses_nothing() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let (up, calls) = recording(Duration::from_millis(1500), echo).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        &pg.url,
        &up,
        "",
        "class = \"action\"\nlease = \"1s\"\nwait = \"1s\"",
    );
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let url = gw.url("/v1/call");
    let original = tokio::spawn({
        let url = url.clone();
        async move { http_post(&url, "order 1", &AUTH).await }
    });
    calls.wait_for("order 1").await;
    let pg = tokio::task::spawn_blocking(move || {
        pg.stop();
        std::thread::sleep(Duration::from_secs(3));
        pg.start_again();
        pg
    })
    .await
    .unwrap();
    let original = original.await.unwrap();
    assert_eq!(original.status, 200, "{}", original.text());
    assert_eq!(original.header("oncely-status"), "fresh");

    let record = settled(&pg.url).await;
    let log = gw.lines.lock().unwrap().join("\n");
    assert_eq!(record["state"], "completed", "{record}\n{log}");
    assert_eq!(record["attempt"], 1);
    let dup = http_post(&url, "order 1", &AUTH).await;
    assert_eq!(dup.status, 200, "{}", dup.text());
    assert_eq!(dup.header("oncely-status"), "replayed");
    assert_eq!(dup.text(), "done: order 1");
    assert_eq!(calls.of("order 1"), 1);
    let metrics = http_get(&gw.admin_url("/metrics"), &[]).await.text();
    assert!(retries_counted(&metrics, "complete"), "{metrics}");
    drop(gw);
    tokio::task::spawn_blocking(move || drop(pg)).await.unwrap();
}

// Item 2, across instances: PostgreSQL restarted for longer than the lease while one
// instance's owner runs an action, and duplicates keep arriving at the other instance.
// Once the database is back, the other instance must not take the live owner's record
// over (the lease only lapsed because nobody could renew it): the owner renews, records
// its answer, and the action is never `outcome_unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_longer_than_the_lease_lets_no_other_instance_take_over() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let (up, calls) = recording(Duration::from_millis(4500), echo).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        &pg.url,
        &up,
        "",
        "class = \"action\"\nlease = \"1s\"\nwait = \"1s\"",
    );
    let owner_gw = Gateway::start(&["--config", &cfg], &[]);
    let other_gw = Gateway::start(&["--config", &cfg], &[]);
    let original = tokio::spawn({
        let url = owner_gw.url("/v1/call");
        async move { http_post(&url, "order 1", &AUTH).await }
    });
    calls.wait_for("order 1").await;
    let pg = tokio::task::spawn_blocking(move || {
        pg.stop();
        std::thread::sleep(Duration::from_secs(2));
        pg.start_again();
        pg
    })
    .await
    .unwrap();
    // Duplicates at the other instance from the moment the database is back.
    let dup_url = other_gw.url("/v1/call");
    let mut seen = Vec::new();
    while !original.is_finished() {
        let dup = http_post(&dup_url, "order 1", &AUTH).await;
        seen.push(format!("{} {}", dup.status, dup.header("oncely-status")));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let original = original.await.unwrap();
    assert_eq!(original.status, 200, "{}", original.text());
    assert_eq!(original.header("oncely-status"), "fresh");
    let record = settled(&pg.url).await;
    assert_eq!(
        record["state"], "completed",
        "{record}\nduplicates: {seen:?}"
    );
    assert_eq!(record["attempt"], 1, "{record}");
    assert!(
        !seen
            .iter()
            .any(|s| s.contains("outcome_unknown") || s.contains("fresh")),
        "{seen:?}"
    );
    let dup = http_post(&dup_url, "order 1", &AUTH).await;
    assert_eq!(dup.header("oncely-status"), "replayed");
    assert_eq!(dup.text(), "done: order 1");
    assert_eq!(calls.of("order 1"), 1);
    drop(owner_gw);
    drop(other_gw);
    tokio::task::spawn_blocking(move || drop(pg)).await.unwrap();
}

// Item 3: callers that vanish right after sending never orphan a claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_vanish_after_sending_leave_no_record_without_an_owner() {
    const N: usize = 120;
    let (up, calls) = recording(Duration::from_millis(50), echo).await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path());
    // A long lease: an orphaned claim would stay processing for the whole test.
    let cfg = config(
        dir.path(),
        &store,
        &up,
        "",
        "class = \"action\"\nlease = \"60s\"",
    );
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let addr = gw.addr;
    let tasks: Vec<_> = (0..N)
        .map(|i| {
            tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                s.write_all(raw_request(&format!("order {i}")).as_bytes())
                    .await
                    .unwrap();
                // Gone at once, at a slightly different moment each time; every tenth
                // after its call has surely been read and claimed (on a loaded machine
                // the others can all be gone before the gateway reads any of them).
                if i % 10 == 0 {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                } else if i % 3 == 1 {
                    tokio::task::yield_now().await;
                } else if i % 3 == 2 {
                    tokio::time::sleep(Duration::from_micros(200 * (i as u64 % 7))).await;
                }
                drop(s);
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // Let every call that was claimed finish and be recorded.
    let deadline = Instant::now() + Duration::from_secs(30);
    let records = loop {
        let records = ledger(&store);
        if records.iter().all(|r| r["state"] != "processing") {
            break records;
        }
        assert!(
            Instant::now() < deadline,
            "records left processing: {:?}",
            records
                .iter()
                .filter(|r| r["state"] == "processing")
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(!records.is_empty(), "no request was claimed at all");
    for r in &records {
        assert_eq!(r["state"], "completed", "{r}");
        assert_eq!(r["attempt"], 1, "{r}");
    }
    // Each claimed intention executed once; nothing unclaimed was executed.
    assert_eq!(calls.total(), records.len());
    for i in 0..N {
        assert!(calls.of(&format!("order {i}")) <= 1);
    }
    eprintln!(
        "{} of {N} vanished callers were claimed; each ran once",
        records.len()
    );
}

/// Peak resident memory of a process (`VmHWM`), in MiB.
pub(crate) fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb / 1024
}

// Item 7: many joiners of one large answer share it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_joiners_of_an_8_mb_answer_share_one_copy() {
    const JOINERS: usize = 200;
    const SIZE: usize = 8 << 20;
    fn big(_: &str) -> Bytes {
        Bytes::from(vec![b'y'; SIZE])
    }
    crate::process::raise_fd_limit();
    let (up, calls) = recording(Duration::from_secs(3), big).await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path());
    let cfg = config(
        dir.path(),
        &store,
        &up,
        "",
        "class = \"write\"\nwait = \"30s\"",
    );
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let before = peak_rss_mib(gw.pid());
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(JOINERS + 1)
        .build_http();
    let send = |client: Client<_, Full<Bytes>>, url: String| async move {
        let mut b = Request::post(url);
        for (n, v) in AUTH {
            b = b.header(n, v);
        }
        let res = client
            .request(b.body(Full::new(Bytes::from_static(b"render"))).unwrap())
            .await
            .expect("answered");
        let status = res.headers()["oncely-status"].to_str().unwrap().to_owned();
        // Counted, not kept: the test's own memory is not the point.
        let mut body = res.into_body();
        let mut n = 0usize;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                n += data.len();
            }
        }
        (status, n)
    };
    let url = gw.url("/v1/call");
    let original = tokio::spawn(send(client.clone(), url.clone()));
    calls.wait_for("render").await;
    let joiners: Vec<_> = (0..JOINERS)
        .map(|_| tokio::spawn(send(client.clone(), url.clone())))
        .collect();
    let (status, n) = original.await.unwrap();
    assert_eq!((status.as_str(), n), ("fresh", SIZE));
    let mut joined = 0;
    for j in joiners {
        let (status, n) = j.await.unwrap();
        assert_eq!(n, SIZE);
        assert!(status == "joined" || status == "replayed", "{status}");
        joined += usize::from(status == "joined");
    }
    assert_eq!(calls.of("render"), 1);
    let peak = peak_rss_mib(gw.pid());
    eprintln!(
        "peak RSS of the gateway: {peak} MiB (at start {before} MiB), \
         {joined} of {JOINERS} joined an 8 MiB answer"
    );
    assert!(joined > JOINERS / 2, "most duplicates joined: {joined}");
    // One copy per joiner would be 1600 MiB.
    assert!(peak < before + 200, "peak RSS {peak} MiB");
}

// Item 7: the budget bounds what answers in flight hold; an answer that would overrun
// it is recorded without its body (duplicates are refused, never executed again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_over_the_in_flight_budget_is_recorded_without_its_body() {
    fn big(_: &str) -> Bytes {
        Bytes::from(vec![b'z'; 4 << 20])
    }
    let (up, calls) = recording(Duration::ZERO, big).await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path());
    let cfg = config(
        dir.path(),
        &store,
        &up,
        r#"max_inflight_bytes = "1MiB""#,
        "class = \"write\"",
    );
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let url = gw.url("/v1/call");
    // Its caller may be cut off (even before the head) if it lags a whole budget
    // behind; not asserted.
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut b = Request::post(url.clone());
    for (n, v) in AUTH {
        b = b.header(n, v);
    }
    let res = client
        .request(b.body(Full::new(Bytes::from_static(b"big"))).unwrap())
        .await;
    if let Ok(res) = res {
        assert_eq!(res.headers()["oncely-status"], "fresh");
        let _ = res.into_body().collect().await;
    }
    let record = settled(&store).await;
    assert_eq!(record["state"], "completed", "{record}");
    let dup = http_post(&url, "big", &AUTH).await;
    assert_eq!(dup.status, 409, "{}", dup.text());
    assert_eq!(dup.json()["code"], "result_too_large");
    assert_eq!(calls.of("big"), 1);
    let log = gw.lines.lock().unwrap().join("\n");
    assert!(log.contains("max_inflight_bytes"), "{log}");
}

// Item 8: SIGTERM with a stream still open ends within the drain deadline, and the
// repeats counted before are in the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_stream_open_exits_within_the_drain_deadline() {
    let (up_calls, _) = recording(Duration::ZERO, echo).await;
    // A streaming read route on another upstream: one chunk, then nothing, forever.
    let stream_up = upstream(axum::Router::new().route(
        "/v1/events",
        get(|| async {
            let first = futures::stream::once(async {
                Ok::<_, std::io::Error>(Bytes::from_static(b"event: 1\n\n"))
            });
            let never = futures::stream::pending();
            axum::body::Body::from_stream(futures::StreamExt::chain(first, never))
        }),
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path());
    let cfg = config(
        dir.path(),
        &store,
        &up_calls,
        "drain_timeout = \"2s\"",
        "class = \"write\"",
    );
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "\n[[routes]]\nmethod = \"GET\"\npath = \"/v1/events\"\nclass = \"read\"\nupstream = \"http://{stream_up}\"\n"
    ));
    std::fs::write(&cfg, text).unwrap();
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let url = gw.url("/v1/call");
    let first = http_post(&url, "hello", &AUTH).await;
    assert_eq!(first.header("oncely-status"), "fresh");
    let id = first.header("oncely-record").to_owned();

    // The stream: head and first event read, then left open.
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let res = client
        .request(
            Request::get(gw.url("/v1/events"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    let mut events = res.into_body();
    let frame = events.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "event: 1\n\n");

    for _ in 0..5 {
        let r = http_post(&url, "hello", &AUTH).await;
        assert_eq!(r.header("oncely-status"), "replayed");
    }
    let started = Instant::now();
    let status = gw.terminate();
    let took = started.elapsed();
    assert!(status.success(), "{status:?}");
    // 2s of drain, then a second at most for the last chores: far from "never".
    assert!(took < Duration::from_secs(8), "exit took {took:?}");
    assert!(
        took >= Duration::from_millis(1500),
        "the stream was given its deadline: {took:?}"
    );
    drop(events);
    let record = ledger_show(&store, &id);
    assert_eq!(record["repeats"], 5, "{record}");
}

/// An upstream on `/v1/call`: "slow ..." hangs 4 s before it answers; "hold ..." answers
/// at once and sends the last byte of its body 3 s later (a caller's slot stays taken
/// until then); anything else answers at once. Each answer is `done: BODY.`.
async fn holding_upstream() -> (String, Calls) {
    let calls = Calls::default();
    let seen = calls.clone();
    let up = upstream(axum::Router::new().route(
        "/v1/call",
        post(move |body: String| {
            seen.0.lock().unwrap().push(body.clone());
            async move {
                if body.starts_with("slow") {
                    tokio::time::sleep(Duration::from_secs(4)).await;
                }
                let rest = body.starts_with("hold");
                let first = futures::stream::iter([Ok::<_, std::io::Error>(echo(&body))]);
                let last = futures::stream::once(async move {
                    if rest {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                    }
                    Ok(Bytes::from_static(b"."))
                });
                let chunks = futures::StreamExt::chain(first, last);
                axum::body::Body::from_stream(chunks)
            }
        }),
    ))
    .await;
    (format!("http://{up}"), calls)
}

/// A `read` route (and a bypassed caller of a guarded route) is not guarded, but its
/// `timeout` holds all the same: a hanging upstream gets the caller a 504
/// `upstream_timeout` at the timeout, and a caller that finds no slot for all of it a 503
/// `upstream_busy`, never sent. Retries stay within it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unguarded_requests_keep_their_route_timeout() {
    let (up, calls) = holding_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path());
    let cfg = config(
        dir.path(),
        &store,
        &up,
        "",
        "class = \"read\"\nconcurrency = 1\ntimeout = \"1s\"\nretries = 3\nretry_backoff = \"10ms\"",
    );
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let url = gw.url("/v1/call");

    // A quick answer passes through, executed now (a read route forwards every time).
    let quick = http_post(&url, "quick", &AUTH).await;
    assert_eq!(quick.status, 200, "{}", quick.text());
    assert_eq!(quick.text(), "done: quick.");
    assert_eq!(quick.header("oncely-status"), "fresh");
    let again = http_post(&url, "quick", &AUTH).await;
    assert_eq!(again.header("oncely-status"), "fresh");
    assert_eq!(calls.of("quick"), 2, "a read runs every time");

    // A hanging upstream: 504 at the timeout, not the upstream's 4 s.
    let started = Instant::now();
    let slow = http_post(&url, "slow read", &AUTH).await;
    let took = started.elapsed();
    assert_eq!(slow.status, 504, "{}", slow.text());
    assert_eq!(slow.header("content-type"), "application/problem+json");
    assert_eq!(slow.json()["code"], "upstream_timeout", "{}", slow.text());
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
    assert_eq!(calls.of("slow read"), 1, "a timeout is not retried");

    // While a slow call holds the one slot, another caller waits at most the timeout,
    // then gets 503 upstream_busy; it never reaches the upstream.
    let holder = tokio::spawn({
        let url = url.clone();
        async move { http_post(&url, "hold the slot", &AUTH).await }
    });
    calls.wait_for("hold the slot").await;
    let started = Instant::now();
    let waited = http_post(&url, "queued", &AUTH).await;
    let took = started.elapsed();
    assert_eq!(waited.status, 503, "{}", waited.text());
    assert_eq!(waited.json()["code"], "upstream_busy", "{}", waited.text());
    assert_eq!(waited.header("retry-after"), "1");
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
    assert_eq!(calls.of("queued"), 0, "it never reached the upstream");
    // The holder's answer began in time: it is passed on whole, however long it takes.
    let holder = holder.await.unwrap();
    assert_eq!(holder.status, 200);
    assert_eq!(holder.text(), "done: hold the slot.");
    drop(gw);

    // A bypassed caller (no principal) of a guarded route is timed the same way.
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path());
    let cfg = config(
        dir.path(),
        &store,
        &up,
        "",
        "class = \"write\"\ntimeout = \"1s\"",
    );
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let started = Instant::now();
    let bypassed = http_post(&gw.url("/v1/call"), "slow bypass", &[]).await;
    assert_eq!(bypassed.status, 504, "{}", bypassed.text());
    // The gateway's own error: its code, bypassed or not.
    assert_eq!(bypassed.header("oncely-status"), "upstream_timeout");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// A store that pauses (a frozen PostgreSQL: its connections stay open and nothing
/// answers on them) gets a guarded request a 503 `store_unavailable` in bounded time, not
/// a hang; the request is never sent, not even once the store answers again (its late
/// claim is released), and sending it again then executes it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_store_answers_503_in_bounded_time_and_sends_nothing() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let (up, calls) = recording(Duration::ZERO, echo).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &pg.url, &up, "", "class = \"write\"");
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let url = gw.url("/v1/call");
    // Warm the pool: these connections are open when the server freezes.
    for i in 0..4 {
        let warm = http_post(&url, &format!("warm {i}"), &AUTH).await;
        assert_eq!(warm.status, 200, "{}", warm.text());
    }

    pg.pause();
    let started = Instant::now();
    let refused = tokio::time::timeout(
        Duration::from_secs(40),
        http_post(&url, "while paused", &AUTH),
    )
    .await;
    let took = started.elapsed();
    pg.resume();
    let refused = refused.expect("the request hung on the paused store");
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(
        refused.json()["code"],
        "store_unavailable",
        "{}",
        refused.text()
    );
    assert!(took < Duration::from_secs(20), "answered after {took:?}");

    // The store answers again; the late claim lands and is released, never sent.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(calls.of("while paused"), 0, "the refused request was sent");
    let again = http_post(&url, "while paused", &AUTH).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.header("oncely-status"), "fresh");
    assert_eq!(calls.of("while paused"), 1);
    let dup = http_post(&url, "while paused", &AUTH).await;
    assert_eq!(dup.header("oncely-status"), "replayed");
    assert_eq!(calls.of("while paused"), 1);
}

/// A TCP proxy on 127.0.0.1 to `target` whose connections pass bytes while `open` says
/// so, and hold them (reading, not writing on) while it does not: a network path that
/// went dark for one gateway, not for the others.
async fn switchable_proxy(target: String, open: tokio::sync::watch::Receiver<bool>) -> u16 {
    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut open: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if open.wait_for(|o| *o).await.is_err() {
                return;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(&target).await else {
                continue;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::spawn(pump(cr, sw, open.clone()));
            tokio::spawn(pump(sr, cw, open.clone()));
        }
    });
    port
}

/// Issue 8's partition: the ledger goes dark for the gateway that owns an action, past
/// its lease, while another gateway on the same PostgreSQL ledger marks it
/// `outcome_unknown` at a duplicate. When the owner's upstream answers and the ledger is
/// back, the owner's answer is kept: the record is completed with it (not left for an
/// operator to reconcile), and later duplicates get it. The action ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_that_knows_the_outcome_keeps_it_after_a_partition() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let (up, calls) = recording(Duration::from_secs(5), echo).await;
    let authority = pg
        .url
        .split('@')
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("host:port in the URL")
        .to_string();
    let (open_tx, open_rx) = tokio::sync::watch::channel(true);
    let port = switchable_proxy(authority.clone(), open_rx).await;
    let through_proxy = pg.url.replace(&authority, &format!("127.0.0.1:{port}"));
    let route = "class = \"action\"\nlease = \"1s\"\nwait = \"1s\"\ntimeout = \"30s\"";
    let dir_a = tempfile::tempdir().unwrap();
    let cfg_a = config(dir_a.path(), &through_proxy, &up, "", route);
    let dir_b = tempfile::tempdir().unwrap();
    let cfg_b = config(dir_b.path(), &pg.url, &up, "", route);
    let owner = Gateway::start(&["--config", &cfg_a], &[]);
    let other = Gateway::start(&["--config", &cfg_b], &[]);

    let original = tokio::spawn({
        let url = owner.url("/v1/call");
        async move { http_post(&url, "order 9", &AUTH).await }
    });
    calls.wait_for("order 9").await;
    // The owner's ledger goes dark: it cannot renew; its lease lapses.
    open_tx.send_replace(false);
    let started = Instant::now();
    let id = loop {
        let dup = http_post(&other.url("/v1/call"), "order 9", &AUTH).await;
        if dup.status == 409 && dup.json()["code"] == "outcome_unknown" {
            break dup.header("oncely-record").to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never outcome_unknown: {} {}",
            dup.status,
            dup.text()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // The ledger is back for the owner before its upstream answers.
    open_tx.send_replace(true);
    let original = original.await.unwrap();
    assert_eq!(original.status, 200, "{}", original.text());
    assert_eq!(original.text(), "done: order 9");

    let started = Instant::now();
    loop {
        let record = ledger_show(&pg.url, &id);
        if record["state"] == "completed" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the owner's answer was not kept: {record}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let replay = http_post(&other.url("/v1/call"), "order 9", &AUTH).await;
    assert_eq!(replay.status, 200, "{}", replay.text());
    assert_eq!(replay.header("oncely-status"), "replayed");
    assert_eq!(replay.text(), "done: order 9");
    assert_eq!(calls.of("order 9"), 1, "the action ran once");
}

// Item 9: waiting for a route's slot is not an upstream call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waits_for_a_slot_past_its_timeout_is_released_not_unknown() {
    let (up, calls) = holding_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path());
    let cfg = config(
        dir.path(),
        &store,
        &up,
        "",
        "class = \"action\"\nconcurrency = 1\ntimeout = \"1s\"",
    );
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let url = gw.url("/v1/call");
    // An unguarded caller (no principal: bypassed) takes the route's one slot for 3s: its
    // answer begins at once (within its timeout) and ends 3s later.
    let holder = tokio::spawn({
        let url = url.clone();
        async move { http_post(&url, "hold the slot", &[]).await }
    });
    calls.wait_for("hold the slot").await;

    let waited = http_post(&url, "order 2", &AUTH).await;
    assert_eq!(waited.status, 503, "{}", waited.text());
    assert_eq!(waited.header("content-type"), "application/problem+json");
    assert_eq!(waited.json()["code"], "upstream_busy", "{}", waited.text());
    assert_eq!(waited.header("retry-after"), "1");
    let id = waited.header("oncely-record").to_owned();
    assert_eq!(ledger_show(&store, &id)["state"], "released");
    assert_eq!(calls.of("order 2"), 0, "it never reached the upstream");

    let holder = holder.await.unwrap();
    assert_eq!(holder.header("oncely-status"), "bypassed");
    // The slot is free now: sending it again executes it, once.
    let again = http_post(&url, "order 2", &AUTH).await;
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(again.header("oncely-status"), "fresh");
    assert_eq!(again.header("oncely-record"), id);
    assert_eq!(calls.of("order 2"), 1);
}

/// An upstream that answers `done: BODY` after `delay`, streamed (no content-length), so
/// that the caller sees its body end only when the gateway ends it.
async fn streaming(delay: Duration) -> (String, Calls) {
    let calls = Calls::default();
    let seen = calls.clone();
    let addr = upstream(axum::Router::new().route(
        "/v1/call",
        post(move |body: String| {
            seen.0.lock().unwrap().push(body.clone());
            async move {
                tokio::time::sleep(delay).await;
                let chunk: Result<Bytes, std::io::Error> = Ok(echo(&body));
                axum::body::Body::from_stream(futures::stream::iter([chunk]))
            }
        }),
    ))
    .await;
    (format!("http://{addr}"), calls)
}

// Issue 13: `answer = "before_record"` ends a fresh answer's body before its completion
// is durable (here: while the ledger is locked); by default it ends only after. That
// holds for a streamed answer and for one with a `content-length`, whose caller has the
// whole answer once it has the last byte: by default that byte waits for the record.
// A ledger that cannot take the outcome for long (a full disk, a lock) does not keep the
// answer from its caller past 10 s: the record follows once the ledger is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answer_before_record_ends_the_body_before_the_completion_is_written() {
    // (answer before the record, a streamed answer, how long the ledger stays locked)
    let four = Duration::from_secs(4);
    for (before, streamed, hold) in [
        (true, true, four),
        (false, true, four),
        (true, false, four),
        (false, false, four),
        // Locked past the store's 10 s bound: the caller no longer waits for the record.
        (false, false, Duration::from_secs(20)),
    ] {
        let (up, calls) = if streamed {
            streaming(Duration::from_millis(500)).await
        } else {
            recording(Duration::from_millis(500), echo).await
        };
        let dir = tempfile::tempdir().unwrap();
        let store = sqlite(dir.path());
        let answer = if before {
            "before_record"
        } else {
            "after_record"
        };
        let cfg = config(
            dir.path(),
            &store,
            &up,
            "",
            &format!("class = \"write\"\nlease = \"10s\"\nwait = \"1s\"\nanswer = \"{answer}\""),
        );
        let gw = Gateway::start(&["--config", &cfg], &[]);
        let url = gw.url("/v1/call");
        let original = tokio::spawn({
            let url = url.clone();
            async move { http_post(&url, "render 1", &AUTH).await }
        });
        calls.wait_for("render 1").await;
        // The claim is committed (the upstream was called); the completion cannot be
        // written while this lock is held.
        let db = dir.path().join("ledger.db");
        let lock = tokio::task::spawn_blocking(move || lock_sqlite(&db, hold))
            .await
            .unwrap();
        let original = original.await.unwrap();
        let locked_then = !lock.is_finished();
        let gave_up = hold > Duration::from_secs(10);
        assert_eq!(original.status, 200, "{}", original.text());
        assert_eq!(original.header("oncely-status"), "fresh");
        assert_eq!(original.text(), "done: render 1");
        assert_eq!(
            original.headers.get("content-length").is_none(),
            streamed,
            "the answer keeps its framing"
        );
        if before || gave_up {
            assert!(
                locked_then,
                "streamed {streamed}, held {hold:?}: the answer ended only after the ledger \
                 was free"
            );
        } else {
            // Ended after the completion was written: the record is completed already.
            assert!(
                !locked_then,
                "streamed {streamed}: the caller had the whole answer while the ledger was locked"
            );
            assert_eq!(ledger(&store)[0]["state"], "completed");
        }
        tokio::task::spawn_blocking(move || lock.join().unwrap())
            .await
            .unwrap();
        let record = settled(&store).await;
        assert_eq!(record["state"], "completed", "{record}");
        let dup = http_post(&url, "render 1", &AUTH).await;
        assert_eq!(dup.header("oncely-status"), "replayed");
        assert_eq!(dup.text(), "done: render 1");
        assert_eq!(calls.of("render 1"), 1);
    }
}

/// Sustained fresh load on the embedded ledger: its WAL is started over, not grown by
/// every frame ever written (before, ten seconds of fresh requests left a 1.1 GB WAL, and
/// a gateway under steady load would have filled its disk). 32 callers send 8,000 new
/// intentions; each executes once, and the WAL stays near the size where the writer
/// starts it over (16 MiB) while the requests write several times that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sustained_fresh_load_keeps_the_sqlite_wal_bounded() {
    const CALLERS: usize = 32;
    const EACH: usize = 250;
    let (up, calls) = recording(Duration::ZERO, echo).await;
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite(dir.path());
    let cfg = config(dir.path(), &store, &up, "", "class = \"write\"");
    let gw = Gateway::start(&["--config", &cfg], &[]);
    let wal = dir.path().join("ledger.db-wal");
    let wal_len = || std::fs::metadata(&wal).map_or(0, |m| m.len());
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(CALLERS)
        .build_http();
    let largest = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..CALLERS {
        let (client, url, largest) = (client.clone(), gw.url("/v1/call"), largest.clone());
        let wal = wal.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                // A body of about 1 KiB: each record fills a good part of a page.
                let body = format!(
                    "{{\"caller\":{c},\"n\":{i},\"text\":\"{}\"}}",
                    "x".repeat(1000)
                );
                let mut b = Request::post(url.as_str());
                for (n, v) in AUTH {
                    b = b.header(n, v);
                }
                let res = client
                    .request(b.body(Full::new(Bytes::from(body))).unwrap())
                    .await
                    .expect("answered");
                assert_eq!(res.status(), 200);
                assert_eq!(res.headers()["oncely-status"], "fresh");
                res.into_body().collect().await.unwrap();
                let len = std::fs::metadata(&wal).map_or(0, |m| m.len());
                largest.fetch_max(len, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(calls.total(), CALLERS * EACH, "each intention ran once");
    let largest = largest
        .load(std::sync::atomic::Ordering::Relaxed)
        .max(wal_len());
    // Without restarts these requests left 117 MB of WAL.
    assert!(
        largest < 40 * 1024 * 1024,
        "the WAL grew to {largest} bytes: it is not started over"
    );
    gw.terminate();
    let records = ledger(&store);
    assert_eq!(records.len(), CALLERS * EACH);
    assert!(records.iter().all(|r| r["state"] == "completed"));
}
