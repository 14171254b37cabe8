//! `oncely demo`: a self-contained showcase of what the gateway is for, one concept: the
//! scripted story (the service, the gateway, the agent and the table it prints), read top
//! to bottom.
//!
//! Everything runs in this process, on 127.0.0.1 only:
//!
//! - a slow, billed render service (an axum server on port 0): every request it receives
//!   is one render of a few seconds, charged per character of its `text`, whoever sent it
//!   and whether or not its caller still waits;
//! - the gateway ([`crate::serve::run`]) in front of it, on port 0, with a ledger in a
//!   temporary SQLite file, guarding `POST /v1/render` as a `write` keyed by fingerprint;
//! - a scripted agent (a hyper-util client) that behaves like an assistant calling a tool:
//!   it gives up on a slow render and asks again, asks for results it already had, and
//!   fires a burst of identical calls.
//!
//! The agent's script runs twice, once straight against the render service and once
//! through the gateway, and the table compares what the service executed and charged.
//! Every number printed is measured in this run: the service's own meter, the
//! `Oncely-Status` header of each answer, the agent's clock, and the ledger's usage.
//!
//! Hidden option, for tests: `--render-time DURATION` (default 2s); the agent gives up
//! after half of it.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;

use crate::config::{Config, Overrides};
use crate::outcome::{Failure, Outcome};

/// How long one render takes unless `--render-time` says otherwise.
const DEFAULT_RENDER_TIME: Duration = Duration::from_secs(2);
/// The identical requests of the burst.
const BURST: usize = 20;
/// The agent's account.
const AGENT_KEY: &str = "Bearer sk_demo_agent";

/// `oncely demo [--render-time DURATION]`.
pub(crate) async fn cli(args: Vec<String>) -> Outcome {
    let render_time = parse_args(&args).map_err(Failure::usage)?;
    let report = run(render_time)
        .await
        .map_err(|e| Failure::runtime(format!("the demo failed: {e:#}")))?;
    print!("{report}");
    Ok(())
}

fn parse_args(args: &[String]) -> Result<Duration, String> {
    let mut render_time = DEFAULT_RENDER_TIME;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let value = match arg.split_once('=') {
            Some(("--render-time", v)) => v.to_owned(),
            _ if arg == "--render-time" => it
                .next()
                .cloned()
                .ok_or("--render-time needs a duration, e.g. 2s")?,
            _ => return Err(format!("demo takes no argument {arg:?}")),
        };
        render_time = oncely_core::parse_duration(&value)
            .map_err(|e| format!("--render-time {value:?}: {e}"))?;
        if render_time < Duration::from_millis(100) || render_time > Duration::from_secs(60) {
            return Err("--render-time must be between 100ms and 60s".into());
        }
    }
    Ok(render_time)
}

/// The render service's meter: what it executed and charged.
#[derive(Debug, Default)]
struct Meter {
    renders: AtomicU64,
    characters: AtomicU64,
}

impl Meter {
    fn read(&self) -> (u64, u64) {
        (
            self.renders.load(Ordering::SeqCst),
            self.characters.load(Ordering::SeqCst),
        )
    }
}

#[derive(Clone)]
struct Service {
    meter: Arc<Meter>,
    render_time: Duration,
}

/// `POST /v1/render {"text", "voice"}`: charged when accepted (like a real provider, it
/// does the work whether or not the caller is still there), answered after the render.
async fn render(
    State(service): State<Service>,
    axum::Json(req): axum::Json<serde_json::Value>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let text = req["text"].as_str().unwrap_or_default();
    let characters = text.chars().count() as u64;
    let n = service.meter.renders.fetch_add(1, Ordering::SeqCst) + 1;
    service
        .meter
        .characters
        .fetch_add(characters, Ordering::SeqCst);
    tokio::time::sleep(service.render_time).await;
    let id = format!("rnd_{n:03}");
    (
        [("x-request-id", id.clone())],
        axum::Json(serde_json::json!({
            "render_id": id,
            "audio_url": format!("http://127.0.0.1/audio/{id}.mp3"),
            "voice": req["voice"],
            "characters": characters,
        })),
    )
        .into_response()
}

/// One request the agent sent, as it saw it.
#[derive(Debug, Clone)]
struct Sent {
    /// The `Oncely-Status` header; `None` straight to the service, or when it gave up.
    status: Option<String>,
    latency: Duration,
    gave_up: bool,
    /// Which step of the script sent it.
    step: usize,
}

/// The scripted agent.
#[derive(Clone)]
struct Agent {
    client: Client<HttpConnector, Full<Bytes>>,
    url: String,
    give_up_after: Duration,
}

impl Agent {
    async fn send(&self, step: usize, chapter: usize, patient: bool) -> anyhow::Result<Sent> {
        let body = serde_json::json!({ "text": chapter_text(chapter), "voice": "narrator" });
        let req = Request::post(&self.url)
            .header("authorization", AGENT_KEY)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))?;
        let started = Instant::now();
        let exchange = async {
            let res = self.client.request(req).await?;
            let status = res
                .headers()
                .get("oncely-status")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let code = res.status();
            let body = res.into_body().collect().await?.to_bytes();
            anyhow::ensure!(
                code.is_success(),
                "the render answered {code}: {}",
                String::from_utf8_lossy(&body)
            );
            Ok::<_, anyhow::Error>(status)
        };
        if patient {
            let status = exchange.await?;
            return Ok(Sent {
                status,
                latency: started.elapsed(),
                gave_up: false,
                step,
            });
        }
        match tokio::time::timeout(self.give_up_after, exchange).await {
            Ok(status) => Ok(Sent {
                status: status?,
                latency: started.elapsed(),
                gave_up: false,
                step,
            }),
            // Dropping the exchange closes the connection: the agent has given up.
            Err(_) => Ok(Sent {
                status: None,
                latency: started.elapsed(),
                gave_up: true,
                step,
            }),
        }
    }

    /// The script. Steps are numbered from 1 as printed.
    async fn script(&self) -> anyhow::Result<Vec<Sent>> {
        let mut sent = Vec::new();
        // 1. Chapter 1 feels slow: the agent gives up and asks again at once.
        sent.push(self.send(1, 1, false).await?);
        sent.push(self.send(1, 1, true).await?);
        // 2. Chapters 2 and 3, side by side.
        let (a, b) = tokio::join!(self.send(2, 2, true), self.send(2, 3, true));
        sent.push(a?);
        sent.push(b?);
        // 3. It lost track of its results and asks for chapters 1 to 3 again.
        let (a, b, c) = tokio::join!(
            self.send(3, 1, true),
            self.send(3, 2, true),
            self.send(3, 3, true)
        );
        sent.extend([a?, b?, c?]);
        // 4. A burst of identical calls for chapter 4 (parallel tool calls, a retry loop).
        let burst: Vec<_> = (0..BURST)
            .map(|_| {
                let agent = self.clone();
                tokio::spawn(async move { agent.send(4, 4, true).await })
            })
            .collect();
        for task in burst {
            sent.push(task.await.context("a burst request panicked")??);
        }
        Ok(sent)
    }
}

/// The text of a chapter: a few lines of dialogue, different lengths per chapter.
fn chapter_text(chapter: usize) -> String {
    const LINES: [&str; 6] = [
        "NARRATOR: The lighthouse keeper had not spoken to anyone in eleven days.",
        "MIRA: Is anyone there? The lamp is out and the ships are close.",
        "KEEPER: The lamp is never out. You are looking at the wrong tower.",
        "MIRA: Then which tower is burning on the cliff behind you?",
        "NARRATOR: He turned, slowly, and for the first time in years he was afraid.",
        "KEEPER: Stay here. Whatever you hear, do not follow me up the stairs.",
    ];
    let lines = 6 + chapter * 4;
    let mut text = format!("Chapter {chapter}.\n");
    for i in 0..lines {
        text.push_str(LINES[(i + chapter) % LINES.len()]);
        text.push('\n');
    }
    text
}

/// A temporary directory for the ledger, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<TempDir> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!("oncely-demo-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What one run of the script measured.
struct Run {
    sent: Vec<Sent>,
    renders: u64,
    characters: u64,
    elapsed: Duration,
}

impl Run {
    fn count(&self, status: &str) -> usize {
        self.sent
            .iter()
            .filter(|s| s.status.as_deref() == Some(status))
            .count()
    }

    fn gave_up(&self) -> usize {
        self.sent.iter().filter(|s| s.gave_up).count()
    }

    fn step_summary(&self, step: usize, through_gateway: bool) -> String {
        let mine: Vec<&Sent> = self.sent.iter().filter(|s| s.step == step).collect();
        let mut parts: Vec<String> = Vec::new();
        let gave_up = mine.iter().filter(|s| s.gave_up).count();
        if gave_up > 0 {
            parts.push(format!("{gave_up} given up"));
        }
        if through_gateway {
            for status in ["fresh", "joined", "replayed"] {
                let n = mine
                    .iter()
                    .filter(|s| s.status.as_deref() == Some(status))
                    .count();
                if n > 0 {
                    parts.push(format!("{n} {status}"));
                }
            }
        } else {
            let answered = mine.len() - gave_up;
            parts.push(format!("{answered} answered"));
        }
        parts.join(", ")
    }
}

fn median(mut xs: Vec<Duration>) -> Option<Duration> {
    if xs.is_empty() {
        return None;
    }
    xs.sort();
    Some(xs[xs.len() / 2])
}

fn show(d: Option<Duration>) -> String {
    match d {
        None => "-".into(),
        Some(d) if d >= Duration::from_secs(1) => format!("{:.2} s", d.as_secs_f64()),
        Some(d) => format!("{:.1} ms", d.as_secs_f64() * 1e3),
    }
}

/// `12345` → `12,345`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

async fn run(render_time: Duration) -> anyhow::Result<String> {
    let started = Instant::now();
    // The render service.
    let meter = Arc::new(Meter::default());
    let service = Service {
        meter: meter.clone(),
        render_time,
    };
    let up_listener = TcpListener::bind("127.0.0.1:0").await?;
    let up_addr = up_listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let upstream = {
        let mut stop = stop_rx.clone();
        let app = axum::Router::new()
            .route("/v1/render", post(render))
            .with_state(service);
        tokio::spawn(async move {
            axum::serve(up_listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.changed().await;
                })
                .await
        })
    };

    // The gateway, on a temporary SQLite ledger.
    let dir = TempDir::new()?;
    let store = format!("sqlite://{}", dir.0.join("demo.db").display());
    let config = Config::resolve(
        &format!(
            r#"
store = {store:?}
upstream = "http://{up_addr}"

[[routes]]
method = "POST"
path = "/v1/render"
class = "write"
key = "header-or-fingerprint"
principal = "header:authorization"
units = "json:/text"
window = "3h"
wait = "60s"
"#
        ),
        None,
        &Overrides::default(),
    )
    .map_err(|e| anyhow::anyhow!("the demo's config: {e}"))?;
    let gw_listener = TcpListener::bind("127.0.0.1:0").await?;
    let gw_addr: SocketAddr = gw_listener.local_addr()?;
    let admin_listener = TcpListener::bind("127.0.0.1:0").await?;
    let gateway = {
        let mut stop = stop_rx.clone();
        tokio::spawn(crate::serve::run(
            gw_listener,
            admin_listener,
            config,
            async move {
                let _ = stop.changed().await;
            },
        ))
    };

    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build_http();
    let give_up_after = render_time / 2;
    let agent = |addr: SocketAddr| Agent {
        client: client.clone(),
        url: format!("http://{addr}/v1/render"),
        give_up_after,
    };

    // The script straight against the service, then through the gateway.
    let measure = |agent: Agent| {
        let meter = meter.clone();
        async move {
            let before = meter.read();
            let t = Instant::now();
            let sent = agent.script().await?;
            let elapsed = t.elapsed();
            let after = meter.read();
            Ok::<_, anyhow::Error>(Run {
                sent,
                renders: after.0 - before.0,
                characters: after.1 - before.1,
                elapsed,
            })
        }
    };
    let direct = measure(agent(up_addr)).await.context("the direct run")?;
    // A render the agent gave up on still runs on the service and was charged when it
    // arrived; wait for it so that the runs do not overlap.
    tokio::time::sleep(render_time / 2).await;
    let guarded = match measure(agent(gw_addr)).await {
        Ok(run) => run,
        Err(e) => {
            if gateway.is_finished() {
                if let Ok(Err(serve)) = gateway.await {
                    return Err(serve.context("the gateway stopped"));
                }
            }
            return Err(e.context("the run through oncely"));
        }
    };

    let _ = stop_tx.send(true);
    gateway
        .await
        .context("the gateway task")?
        .context("the gateway")?;
    let _ = upstream.await;
    // The gateway drained before it returned: every repeat is counted in the ledger.
    let ledger = oncely_store::open(&store, oncely_store::StoreOptions::default())
        .await
        .context("reopening the demo's ledger")?;
    let usage = ledger.usage(None).await.context("reading usage")?;
    drop(ledger);

    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(
        w,
        "oncely demo: a render service that takes {:.1} s a render and charges per character,",
        render_time.as_secs_f64()
    );
    let _ = writeln!(
        w,
        "oncely in front of it (ledger: a temporary SQLite file), and an agent that retries."
    );
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "The agent's script, run once straight against the service and once through oncely:"
    );
    let steps = [
        format!(
            "1. render chapter 1, give up after {:.1} s, ask again at once",
            give_up_after.as_secs_f64()
        ),
        "2. render chapters 2 and 3, side by side".to_string(),
        "3. ask for chapters 1, 2 and 3 again (it lost track of them)".to_string(),
        format!("4. a burst of {BURST} identical requests for chapter 4"),
    ];
    let (without, with) = ("without oncely", "with oncely");
    let _ = writeln!(w, "  {:<62} {without:<24} {with}", "");
    for (i, step) in steps.iter().enumerate() {
        let _ = writeln!(
            w,
            "  {:<62} {:<24} {}",
            step,
            direct.step_summary(i + 1, false),
            guarded.step_summary(i + 1, true)
        );
    }
    let _ = writeln!(w);

    let fresh_latency = |run: &Run, through_gateway: bool| {
        median(
            run.sent
                .iter()
                .filter(|s| !s.gave_up && s.step != 3)
                .filter(|s| !through_gateway || s.status.as_deref() == Some("fresh"))
                .map(|s| s.latency)
                .collect(),
        )
    };
    let repeat_latency = |run: &Run| {
        median(
            run.sent
                .iter()
                .filter(|s| s.step == 3)
                .map(|s| s.latency)
                .collect(),
        )
    };
    let rows: Vec<(&str, String, String)> = vec![
        (
            "requests sent",
            direct.sent.len().to_string(),
            guarded.sent.len().to_string(),
        ),
        (
            "upstream executions (renders)",
            direct.renders.to_string(),
            guarded.renders.to_string(),
        ),
        (
            "  answered by a new render",
            (direct.sent.len() - direct.gave_up()).to_string(),
            guarded.count("fresh").to_string(),
        ),
        (
            "  replayed (a completed render)",
            "-".into(),
            guarded.count("replayed").to_string(),
        ),
        (
            "  joined (waited for one in flight)",
            "-".into(),
            guarded.count("joined").to_string(),
        ),
        (
            "  given up by the agent",
            direct.gave_up().to_string(),
            guarded.gave_up().to_string(),
        ),
        (
            "characters charged",
            thousands(direct.characters),
            thousands(guarded.characters),
        ),
        (
            "latency of a fresh render (p50)",
            show(fresh_latency(&direct, false)),
            show(fresh_latency(&guarded, true)),
        ),
        (
            "latency of a repeat, step 3 (p50)",
            show(repeat_latency(&direct)),
            show(repeat_latency(&guarded)),
        ),
        (
            "time for the whole script",
            show(Some(direct.elapsed)),
            show(Some(guarded.elapsed)),
        ),
    ];
    let _ = writeln!(w, "  {:<38} {without:>16} {with:>16}", "");
    for (label, a, b) in &rows {
        let _ = writeln!(w, "  {label:<38} {a:>16} {b:>16}");
    }
    let _ = writeln!(w);
    let t = &usage.totals;
    let _ = writeln!(
        w,
        "The ledger (what `oncely usage` reports): {} fresh executions, {} characters charged; \
         {} repeats, {} characters not charged.",
        t.fresh,
        thousands(t.fresh_units),
        t.repeats,
        thousands(t.repeat_units)
    );
    let saved = direct.characters.saturating_sub(guarded.characters);
    let percent = if direct.characters > 0 {
        saved as f64 * 100.0 / direct.characters as f64
    } else {
        0.0
    };
    let _ = writeln!(
        w,
        "Conclusion: the same {} requests cost {} renders instead of {}, and {} characters \
         instead of {} ({percent:.0}% not charged twice); a repeat came back in {} instead of {}.",
        guarded.sent.len(),
        guarded.renders,
        direct.renders,
        thousands(guarded.characters),
        thousands(direct.characters),
        show(repeat_latency(&guarded)),
        show(repeat_latency(&direct)),
    );
    let _ = writeln!(w, "(finished in {:.1} s)", started.elapsed().as_secs_f64());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked() {
        assert_eq!(parse_args(&[]).unwrap(), DEFAULT_RENDER_TIME);
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_args(&args(&["--render-time", "500ms"])).unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(
            parse_args(&args(&["--render-time=3s"])).unwrap(),
            Duration::from_secs(3)
        );
        assert!(parse_args(&args(&["--render-time"])).is_err());
        assert!(parse_args(&args(&["--render-time", "1ms"])).is_err());
        assert!(parse_args(&args(&["--fast"])).is_err());
    }

    #[test]
    fn numbers_are_grouped_and_chapters_differ() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_ne!(chapter_text(1), chapter_text(2));
        assert!(chapter_text(4).len() > chapter_text(1).len());
    }
}
