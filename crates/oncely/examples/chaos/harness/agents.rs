//! The callers: agents that pick intentions and send them again and again like an
//! assistant whose calls time out (some give up early, then retry), key-churn agents that
//! make up a new `Idempotency-Key` for every attempt (see [`churn_agent`]), a stalled
//! caller that reads an answer's head and stops, and the settling sweep that asks every
//! intention once more until it has a final answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use oncely_webhooks::{sign, Scheme, Secrets};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::gateway::Instances;
use super::journal::{Attempt, Class, Intent, Journal, Outcome};
use super::Fault;

/// The webhook signing secret (Standard Webhooks).
pub(crate) const WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A new generation of intentions starts this often.
const GENERATION: Duration = Duration::from_secs(8);
/// Intentions per generation, by class.
const PER_GENERATION: [(Class, usize); 4] = [
    (Class::Write, 8),
    (Class::Action, 6),
    (Class::Job, 4),
    (Class::Event, 6),
];

pub(crate) type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub(crate) fn client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(5))
        .build_http()
}

/// What is shared by every caller of a phase.
#[derive(Clone)]
pub(crate) struct Callers {
    pub(crate) journal: Arc<Journal>,
    pub(crate) instances: Arc<Instances>,
    pub(crate) client: HttpClient,
    pub(crate) stop: Arc<AtomicBool>,
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn request(
    intent: &Intent,
    key: Option<&str>,
    addr: std::net::SocketAddr,
) -> http::Request<Full<Bytes>> {
    let body = intent.body();
    let mut b = http::Request::post(format!("http://{addr}{}", intent.path()))
        .header("content-type", "application/json");
    if intent.class == Class::Event {
        let scheme: Scheme = "standard".parse().expect("scheme");
        let secrets = Secrets::parse(&scheme, WEBHOOK_SECRET).expect("secret");
        for (n, v) in sign(
            &scheme,
            secrets.primary(),
            &intent.event_id(),
            unix_now(),
            body.as_bytes(),
        ) {
            b = b.header(n, v);
        }
    } else {
        b = b.header("authorization", intent.authorization());
        if let Some(k) = key {
            b = b.header("idempotency-key", k);
        }
    }
    b.body(Full::new(Bytes::from(body))).expect("request")
}

#[derive(serde::Deserialize)]
struct ExecBody {
    intent: String,
    exec: u64,
}

/// Sends `intent` once to instance `i` under its own key, giving up after `patience`, and
/// journals it.
pub(crate) async fn send(
    c: &Callers,
    intent: &Intent,
    i: usize,
    patience: Duration,
    sweep: bool,
) -> Outcome {
    send_as(c, intent, None, i, patience, sweep).await
}

/// [`send`], under `made_up` (a key-churn attempt's key) when given.
pub(crate) async fn send_as(
    c: &Callers,
    intent: &Intent,
    made_up: Option<String>,
    i: usize,
    patience: Duration,
    sweep: bool,
) -> Outcome {
    let at = c.journal.now();
    let key = made_up.clone().or_else(|| intent.idempotency_key());
    let outcome = match c.instances.addr(i) {
        None => Outcome::NoAnswer("instance down".into()),
        Some(addr) => {
            let req = request(intent, key.as_deref(), addr);
            let call = async {
                let res = c.client.request(req).await.map_err(|e| {
                    use std::error::Error as _;
                    match e.source() {
                        Some(s) => format!("{e}: {s}"),
                        None => e.to_string(),
                    }
                })?;
                let (parts, body) = res.into_parts();
                let body = body
                    .collect()
                    .await
                    .map_err(|e| format!("body: {e}"))?
                    .to_bytes();
                Ok::<_, String>((parts, body))
            };
            match tokio::time::timeout(patience, call).await {
                Err(_) => Outcome::NoAnswer("caller gave up".into()),
                Ok(Err(e)) => Outcome::NoAnswer(e),
                Ok(Ok((parts, body))) => classify(&parts, &body),
            }
        }
    };
    c.journal.attempt(Attempt {
        intent: intent.id.clone(),
        instance: i,
        at,
        end: c.journal.now(),
        patience: patience.as_secs_f64(),
        outcome: outcome.clone(),
        sweep,
        key: made_up,
    });
    outcome
}

fn classify(parts: &http::response::Parts, body: &[u8]) -> Outcome {
    let header = |n: &str| {
        parts
            .headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let status = parts.status.as_u16();
    let mut code = String::new();
    let (mut exec, mut answered) = (None, None);
    if header("content-type").starts_with("application/problem+json") {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        code = v["code"].as_str().unwrap_or("").to_owned();
    } else if (200..300).contains(&status) && status != 202 {
        if let Ok(b) = serde_json::from_slice::<ExecBody>(body) {
            exec = Some(b.exec);
            answered = Some(b.intent);
        }
    }
    let retry = match header("x-should-retry").as_str() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    };
    Outcome::Answer {
        status,
        oncely: header("oncely-status"),
        code,
        exec,
        answered,
        retry,
        churned: header("oncely-key-churn"),
    }
}

/// Whether a key-churn caller tries again (under a new key) after `o`: only when it got
/// no answer of the intention — no answer at all (it gave up, the connection was reset or
/// refused, the instance was down), or a refusal of the gateway's own that says to retry
/// (`X-Should-Retry: true`: 409 `in_flight`, 503 `store_unavailable`, a 502/504 of an
/// upstream failure whose record was released). Any other answer — a result, a refusal
/// that says not to retry (`outcome_unknown`, a 504 whose outcome is unknown) — reached its
/// caller: a request under a new key after it is, by contract, a new intention, so the
/// caller stops.
pub(crate) fn churn_retries(o: &Outcome) -> bool {
    match o {
        Outcome::NoAnswer(_) => true,
        Outcome::Answer { status, retry, .. } => {
            !(200..300).contains(status) && *retry == Some(true)
        }
    }
}

/// A version 4 UUID made of `rng`: a key-churn attempt's `Idempotency-Key`.
pub(crate) fn new_key(rng: &mut StdRng) -> String {
    let mut b: [u8; 16] = rng.random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Whether an outcome ends the caller's interest in the intention.
pub(crate) fn is_final(class: Class, o: &Outcome) -> bool {
    match o {
        Outcome::Answer { status, code, .. } => match class {
            Class::Event => *status == 200,
            Class::Action => {
                ((200..300).contains(status) && *status != 202) || code == "outcome_unknown"
            }
            _ => (200..300).contains(status) && *status != 202,
        },
        Outcome::NoAnswer(_) => false,
    }
}

fn pick(rng: &mut StdRng, seed: u64, elapsed: Duration) -> Intent {
    let mut generation = elapsed.as_secs() / GENERATION.as_secs();
    if generation > 0 && rng.random_bool(0.25) {
        generation -= rng.random_range(1..=generation.min(3));
    }
    let total: usize = PER_GENERATION.iter().map(|(_, n)| n).sum();
    let mut k = rng.random_range(0..total);
    for (class, n) in PER_GENERATION {
        if k < n {
            return Intent::new(seed, class, generation, k);
        }
        k -= n;
    }
    unreachable!("k < total")
}

/// One agent: picks an intention, sends it up to four times (waiting a little between),
/// until it has a final answer, then picks another; until told to stop.
pub(crate) async fn agent(c: Callers, index: u64, began: std::time::Instant) {
    let mut rng = StdRng::seed_from_u64(c.journal.seed.wrapping_add(index * 7919));
    while !c.stop.load(Ordering::SeqCst) {
        let intent = pick(&mut rng, c.journal.seed, began.elapsed());
        c.journal.intent(&intent);
        let tries = rng.random_range(1..=4);
        for _ in 0..tries {
            // An agent that could not reach one instance tries another.
            let mut i = rng.random_range(0..c.instances.len());
            if c.instances.addr(i).is_none() {
                i = (i + 1) % c.instances.len();
            }
            // Most callers give up after a few seconds, some after less than one; a few
            // wait as long as it takes, so that an answer that comes past its bound
            // (`check::ANSWER_LIMIT`) is seen.
            let patience = if rng.random_bool(0.25) {
                Duration::from_millis(rng.random_range(300..1500))
            } else if rng.random_bool(0.1) {
                Duration::from_secs(40)
            } else {
                Duration::from_millis(rng.random_range(2000..8000))
            };
            let o = send(&c, &intent, i, patience, false).await;
            if is_final(intent.class, &o) || c.stop.load(Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(50..600))).await;
        }
    }
}

/// A key-churn agent: like an SDK whose retry loop makes up a new `Idempotency-Key` (a
/// UUID) for every attempt. Each of its intentions is a write or an action that only it
/// sends (one business intention = one body), on routes of their own (`/cw/`, `/ca/`). It
/// gives up on an attempt by timing out and dropping the connection (so the gateway sees
/// its caller leave), then retries under a new key — but only while it has no answer
/// ([`churn_retries`]); the first answer ends the intention for it. It sends each one up to
/// six times; what is still unanswered when the faults stop, the sweep goes on with, the
/// same way.
///
/// What it may expect ("once"): the gateway joins a new key to the record of an earlier
/// one whose caller never got its answer (`Oncely-Key-Churn`), so every intention runs at
/// most once — a write again only after a kill or an upstream failure, as for every
/// agent — with one exception the gateway cannot help: when the instance that served an
/// attempt is SIGKILLed while the attempt ran (or just after its caller left), the evidence
/// that its caller left dies with it; the next key is a new request to the gateway, runs
/// again, and the record of the killed attempt stays `processing` (nobody sends its key
/// again). The checker counts those as "churn lost to a kill", not as violations, and shows
/// them.
pub(crate) async fn churn_agent(c: Callers, index: u64) {
    let mut rng = StdRng::seed_from_u64(c.journal.seed.wrapping_add(index * 104_729 + 17));
    let mut n = 0;
    while !c.stop.load(Ordering::SeqCst) {
        let class = if rng.random_bool(0.5) {
            Class::Write
        } else {
            Class::Action
        };
        let intent = Intent::churn(c.journal.seed, class, index, n);
        n += 1;
        c.journal.intent(&intent);
        for _ in 0..6 {
            let mut i = rng.random_range(0..c.instances.len());
            if c.instances.addr(i).is_none() {
                i = (i + 1) % c.instances.len();
            }
            // Often less than a run of the upstream takes (10 ms to 2 s, more through
            // proxy faults), so that it leaves while its attempt runs.
            let patience = if rng.random_bool(0.5) {
                Duration::from_millis(rng.random_range(100..1200))
            } else {
                Duration::from_millis(rng.random_range(1500..6000))
            };
            let key = new_key(&mut rng);
            let o = send_as(&c, &intent, Some(key), i, patience, false).await;
            if !churn_retries(&o) || c.stop.load(Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(50..600))).await;
        }
    }
}

/// A caller that sends a large intention nobody sent before, reads the answer's head, then
/// stops reading for `stall` and goes away; meanwhile, from one lease on, duplicates of it
/// arrive as they would from an agent that retries.
pub(crate) async fn stalled_caller(
    c: &Callers,
    rng: &mut StdRng,
    n: usize,
    lease: Duration,
    stall: Duration,
) {
    let intent = Intent::stalled(c.journal.seed, n);
    c.journal.intent(&intent);
    let i = rng.random_range(0..c.instances.len());
    let Some(addr) = c.instances.addr(i) else {
        return;
    };
    let body = intent.body();
    let mut head = format!(
        "POST {} HTTP/1.1\r\nhost: {addr}\r\nauthorization: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        intent.path(),
        intent.authorization(),
        body.len()
    );
    if let Some(k) = intent.idempotency_key() {
        head.push_str(&format!("idempotency-key: {k}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(&body);
    let Ok(mut conn) = tokio::net::TcpStream::connect(addr).await else {
        return;
    };
    if conn.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    // Read until the end of the head (at most 10 s), then stop reading.
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let read_head = async {
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        true
    };
    if let Ok(true) = tokio::time::timeout(Duration::from_secs(10), read_head).await {
        let line = String::from_utf8_lossy(&got);
        let line = line.lines().next().unwrap_or("").to_owned();
        c.journal.fault(
            Fault::StalledCaller,
            None,
            format!(
                "{}: read the head ({line}), then stalled {stall:?}",
                intent.id
            ),
        );
        let duplicates = async {
            tokio::time::sleep(lease).await;
            for _ in 0..3 {
                let j = rng.random_range(0..c.instances.len());
                send(c, &intent, j, Duration::from_secs(8), false).await;
                tokio::time::sleep(lease).await;
            }
        };
        tokio::join!(duplicates, tokio::time::sleep(stall));
    }
}

/// Sends every intention until it has a final answer or `deadline` passes; answers the
/// intentions that never got one.
pub(crate) async fn sweep(c: &Callers, deadline: tokio::time::Instant) -> Vec<String> {
    use futures::StreamExt;
    let intents = c.journal.intents();
    let results: Vec<Option<String>> = futures::stream::iter(intents)
        .map(|intent| {
            let c = c.clone();
            async move {
                if intent.churn {
                    return sweep_churn(&c, &intent, deadline).await;
                }
                let mut n = 0usize;
                loop {
                    let i = n % c.instances.len();
                    n += 1;
                    let o = send(&c, &intent, i, Duration::from_secs(10), true).await;
                    if is_final(intent.class, &o) {
                        return None;
                    }
                    if tokio::time::Instant::now() > deadline {
                        return Some(intent.id.clone());
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    results.into_iter().flatten().collect()
}

/// The sweep of a key-churn intention: nothing when its caller already got an answer (a
/// new key now would be a new intention); else its retry loop goes on, a new key each time,
/// until an answer.
async fn sweep_churn(
    c: &Callers,
    intent: &Intent,
    deadline: tokio::time::Instant,
) -> Option<String> {
    if c.journal
        .outcomes(&intent.id)
        .iter()
        .any(|o| !churn_retries(o))
    {
        return None;
    }
    let seed = intent.id.bytes().fold(c.journal.seed ^ 0xC4u64, |h, b| {
        h.wrapping_mul(31).wrapping_add(b as u64)
    });
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0usize;
    loop {
        let i = n % c.instances.len();
        n += 1;
        let key = new_key(&mut rng);
        let o = send_as(c, intent, Some(key), i, Duration::from_secs(10), true).await;
        if !churn_retries(&o) {
            return None;
        }
        if tokio::time::Instant::now() > deadline {
            return Some(intent.id.clone());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
