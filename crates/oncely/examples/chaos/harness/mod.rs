//! The chaos harness: runs the real `oncely` binary (one instance on a SQLite ledger, then
//! two instances on one PostgreSQL database, a primary with a synchronous standby when
//! failovers are injected: see `pg`) against a recording upstream behind a fault
//! proxy, with agents that retry many intentions concurrently, injects faults at seeded
//! random points, lets the run settle, and checks the history (see `check`).
//!
//! Shared by `examples/chaos` (`scripts/chaos`) and the short fixed-seed run in
//! `tests/it/chaos.rs`.

mod agents;
mod check;
mod gateway;
mod journal;
mod pg;
mod proxy;
mod upstream;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

pub(crate) use check::PhaseReport;

use agents::Callers;
use gateway::{Instances, Launch, Timing};
use pg::Pg;
use proxy::{Proxy, ProxyFault};

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Fault {
    /// SIGKILL of a gateway instance, restarted shortly after.
    Kill,
    ProxyDelay,
    ProxyResetBefore,
    ProxyResetAfter,
    ProxySlow,
    ProxyStall,
    /// A caller reads the head of a large answer and stops reading.
    StalledCaller,
    /// Another connection holds `BEGIN IMMEDIATE` on the SQLite ledger for a while.
    SqliteLock,
    /// PostgreSQL stopped, then started again.
    PgRestart,
    /// Every process of PostgreSQL (the primary) SIGSTOPped for 1 to 15 s, then
    /// SIGCONTed: connections stay open and nothing answers on them.
    PgPause,
    /// The PostgreSQL primary SIGKILLed and its synchronous standby promoted (then a new
    /// standby made of the dead node).
    PgFailover,
    /// The gateways' wall clock steps (libfaketime).
    ClockStep,
}

impl Fault {
    pub(crate) const ALL: [Fault; 12] = [
        Fault::Kill,
        Fault::ProxyDelay,
        Fault::ProxyResetBefore,
        Fault::ProxyResetAfter,
        Fault::ProxySlow,
        Fault::ProxyStall,
        Fault::StalledCaller,
        Fault::SqliteLock,
        Fault::PgRestart,
        Fault::PgPause,
        Fault::PgFailover,
        Fault::ClockStep,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::ProxyDelay => "proxy-delay",
            Fault::ProxyResetBefore => "proxy-reset-before",
            Fault::ProxyResetAfter => "proxy-reset-after",
            Fault::ProxySlow => "proxy-slow",
            Fault::ProxyStall => "proxy-stall",
            Fault::StalledCaller => "stalled-caller",
            Fault::SqliteLock => "sqlite-lock",
            Fault::PgRestart => "pg-restart",
            Fault::PgPause => "pg-pause",
            Fault::PgFailover => "pg-failover",
            Fault::ClockStep => "clock-step",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == s)
    }

    fn applies_to(self, store: StoreKind) -> bool {
        match self {
            Fault::SqliteLock => store == StoreKind::Sqlite,
            Fault::PgRestart | Fault::PgPause | Fault::PgFailover => store == StoreKind::Postgres,
            _ => true,
        }
    }
}

/// A ledger backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreKind {
    /// One instance on a SQLite file.
    Sqlite,
    /// Two instances on one PostgreSQL database.
    Postgres,
}

impl StoreKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            StoreKind::Sqlite => "sqlite",
            StoreKind::Postgres => "postgres",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// The `oncely` binary.
    pub(crate) oncely: PathBuf,
    pub(crate) seed: u64,
    /// Time under faults, shared between the stores.
    pub(crate) duration: Duration,
    pub(crate) stores: Vec<StoreKind>,
    pub(crate) faults: Vec<Fault>,
    /// Concurrent agents.
    pub(crate) agents: usize,
    /// Concurrent key-churn agents (a new `Idempotency-Key` per attempt:
    /// `agents::churn_agent`), besides `agents`.
    pub(crate) churn_agents: usize,
    /// How long the run may take to settle after the faults stop.
    pub(crate) settle: Duration,
    /// The longest SQLite write lock (the store's busy timeout is 5 s).
    pub(crate) max_lock: Duration,
    /// Where the ledgers and the gateways' logs go (kept).
    pub(crate) dir: PathBuf,
}

impl Options {
    pub(crate) fn new(oncely: PathBuf, seed: u64, duration: Duration, dir: PathBuf) -> Options {
        Options {
            oncely,
            seed,
            duration,
            stores: vec![StoreKind::Sqlite, StoreKind::Postgres],
            faults: Fault::ALL.to_vec(),
            agents: 12,
            churn_agents: 3,
            settle: Duration::from_secs(45),
            max_lock: Duration::from_secs(8),
            dir,
        }
    }
}

/// The libfaketime preload library, when installed.
pub(crate) fn faketime_library() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
}

/// The outcome of a run.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) options: Options,
    pub(crate) phases: Vec<PhaseReport>,
    /// Fault kinds asked for that could not be injected, with why.
    pub(crate) skipped: Vec<String>,
}

impl Report {
    pub(crate) fn violations(&self) -> usize {
        self.phases.iter().map(|p| p.violations.len()).sum()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        let names: Vec<&str> = o.faults.iter().map(|f| f.name()).collect();
        writeln!(
            f,
            "chaos run: seed {}, {} s under faults over {} store(s), {} agents (+{} key-churn), faults: {}",
            o.seed,
            o.duration.as_secs(),
            o.stores.len(),
            o.agents,
            o.churn_agents,
            names.join(", ")
        )?;
        for s in &self.skipped {
            writeln!(f, "  not injected: {s}")?;
        }
        for p in &self.phases {
            write!(f, "{p}")?;
        }
        let requests: usize = self.phases.iter().map(|p| p.requests).sum();
        let lost: usize = self.phases.iter().map(|p| p.lost).sum();
        writeln!(
            f,
            "total: {requests} requests, {} violations, {lost} answers lost; logs and ledgers in {}",
            self.violations(),
            o.dir.display()
        )
    }
}

/// Runs the chaos phases and checks them.
pub(crate) fn run(options: &Options) -> Report {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let mut skipped = Vec::new();
    let mut options = options.clone();
    if options.faults.contains(&Fault::ClockStep) && faketime_library().is_none() {
        options.faults.retain(|f| *f != Fault::ClockStep);
        skipped.push("clock-step (libfaketime is not installed: apt-get install faketime)".into());
    }
    let share = options.duration / options.stores.len().max(1) as u32;
    let mut phases = Vec::new();
    for (n, store) in options.stores.iter().enumerate() {
        let dir = options.dir.join(store.name());
        std::fs::create_dir_all(&dir).expect("the phase directory");
        let seed = options.seed.wrapping_add(n as u64 * 1_000_003);
        phases.push(rt.block_on(phase(&options, *store, seed, share, &dir)));
    }
    rt.shutdown_timeout(Duration::from_secs(2));
    Report {
        options,
        phases,
        skipped,
    }
}

/// What the fault injector works on.
struct Target {
    callers: Callers,
    proxy: Proxy,
    pg: Option<Arc<Pg>>,
    /// Held by a PostgreSQL restart or failover: one waits for the other to end.
    pg_faults: tokio::sync::Mutex<()>,
    ledger: PathBuf,
    clock_file: PathBuf,
    timing: Timing,
    max_lock: Duration,
    /// Stalled callers so far.
    stalled: std::sync::atomic::AtomicUsize,
}

async fn phase(
    options: &Options,
    store: StoreKind,
    seed: u64,
    duration: Duration,
    dir: &Path,
) -> PhaseReport {
    let journal = Arc::new(journal::Journal::new(seed));
    let up = upstream::start(journal.clone()).await;
    let proxy = Proxy::start(up, journal.clone()).await;
    let pg = match store {
        StoreKind::Postgres => {
            let failovers = options.faults.contains(&Fault::PgFailover);
            Some(Arc::new(
                tokio::task::spawn_blocking(move || Pg::start(failovers))
                    .await
                    .expect("PostgreSQL starts"),
            ))
        }
        StoreKind::Sqlite => None,
    };
    let ledger = dir.join("ledger.db");
    let store_url = match &pg {
        Some(pg) => pg.url(),
        None => format!("sqlite://{}", ledger.display()),
    };
    let timing = Timing {
        wait: Duration::from_millis(1000),
        lease: Duration::from_millis(1000),
        timeout: Duration::from_millis(3000),
    };
    let config = dir.join("oncely.toml");
    std::fs::write(&config, gateway::config(&store_url, proxy.addr, &timing))
        .expect("write the config");
    let clock_file = dir.join("clock-offset");
    std::fs::write(&clock_file, "+0").expect("write the clock offset");
    let mut envs = vec![
        (
            "CHAOS_WEBHOOK_SECRET".to_owned(),
            agents::WEBHOOK_SECRET.to_owned(),
        ),
        (
            "ONCELY_SECRET_KEY".to_owned(),
            "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".to_owned(),
        ),
    ];
    if options.faults.contains(&Fault::ClockStep) {
        if let Some(lib) = faketime_library() {
            envs.push(("LD_PRELOAD".into(), lib.display().to_string()));
            envs.push((
                "FAKETIME_TIMESTAMP_FILE".into(),
                clock_file.display().to_string(),
            ));
            envs.push(("FAKETIME_CACHE_DURATION".into(), "1".into()));
            envs.push(("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()));
            envs.push(("FAKETIME_DONT_RESET".into(), "1".into()));
        }
    }
    let launch = Launch {
        oncely: options.oncely.clone(),
        config,
        envs,
        logs: dir.to_owned(),
    };
    let n = match store {
        StoreKind::Sqlite => 1,
        StoreKind::Postgres => 2,
    };
    let instances = match tokio::task::spawn_blocking(move || Instances::start(launch, n))
        .await
        .expect("start the gateways")
    {
        Ok(i) => Arc::new(i),
        Err(e) => return PhaseReport::failed(store, e),
    };
    let callers = Callers {
        journal: journal.clone(),
        instances: instances.clone(),
        client: agents::client(),
        stop: Arc::new(AtomicBool::new(false)),
    };
    let began = Instant::now();
    let mut agents_running = Vec::new();
    for i in 0..options.agents {
        agents_running.push(tokio::spawn(agents::agent(
            callers.clone(),
            i as u64,
            began,
        )));
    }
    for i in 0..options.churn_agents {
        agents_running.push(tokio::spawn(agents::churn_agent(callers.clone(), i as u64)));
    }
    let target = Arc::new(Target {
        callers: callers.clone(),
        proxy: proxy.clone(),
        pg: pg.clone(),
        pg_faults: tokio::sync::Mutex::new(()),
        ledger,
        clock_file,
        timing,
        max_lock: options.max_lock,
        stalled: Default::default(),
    });
    let kinds: Vec<Fault> = options
        .faults
        .iter()
        .copied()
        .filter(|f| f.applies_to(store))
        .collect();
    let injections = inject_until(target.clone(), kinds, seed, began + duration).await;
    callers.stop.store(true, Ordering::SeqCst);
    for a in agents_running {
        let _ = a.await;
    }
    for i in injections {
        let _ = i.await;
    }
    proxy.disarm();
    let settling = journal.now();
    // Settle: every instance up, every intention asked once more until it has a final
    // answer, every acknowledged event delivered, no record left processing.
    for i in 0..instances.len() {
        let inst = instances.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || inst.restart(i)).await {
            return PhaseReport::failed(store, e);
        }
    }
    let deadline = tokio::time::Instant::now() + options.settle;
    let unresolved = agents::sweep(&callers, deadline).await;
    let mut undelivered;
    loop {
        undelivered = journal
            .acknowledged_events()
            .into_iter()
            .filter(|e| !journal.delivered(e))
            .collect::<Vec<_>>();
        if undelivered.is_empty() || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let processing = loop {
        let left = processing_records(&options.oncely, &store_url).await;
        if left.is_empty() || tokio::time::Instant::now() > deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let settled_in = journal.now() - settling;
    let stop = instances.clone();
    let _ = tokio::task::spawn_blocking(move || stop.stop_all()).await;
    check::check(
        store,
        duration,
        settled_in,
        journal.take(),
        unresolved,
        undelivered,
        processing,
    )
}

/// `oncely ledger list --json`: the records still `processing`, one line each.
async fn processing_records(oncely: &Path, store: &str) -> Vec<String> {
    let out = tokio::process::Command::new(oncely)
        .args([
            "ledger",
            "list",
            "--json",
            "--status",
            "processing",
            "--store",
            store,
        ])
        .output()
        .await;
    let Ok(out) = out else {
        return vec!["`oncely ledger list` did not run".into()];
    };
    if !out.status.success() {
        return vec![format!(
            "`oncely ledger list` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )];
    }
    let records: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    records
        .iter()
        .filter(|r| r["state"] == "processing")
        .map(|r| {
            format!(
                "{} route {} class {} attempt {} created {}",
                r["id"], r["route"], r["class"], r["attempt"], r["created_at"]
            )
        })
        .collect()
}

/// Injects faults of `kinds` at random points until `end`; gives back the injections
/// still running.
async fn inject_until(
    target: Arc<Target>,
    kinds: Vec<Fault>,
    seed: u64,
    end: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xFA17);
    let busy: Arc<BTreeMap<Fault, AtomicBool>> = Arc::new(
        Fault::ALL
            .iter()
            .map(|f| (*f, AtomicBool::new(false)))
            .collect(),
    );
    let mut running = Vec::new();
    if kinds.is_empty() {
        tokio::time::sleep_until(end.into()).await;
        return running;
    }
    loop {
        let pause = Duration::from_millis(rng.random_range(150..1200));
        if Instant::now() + pause >= end {
            tokio::time::sleep_until(end.into()).await;
            return running;
        }
        tokio::time::sleep(pause).await;
        let kind = *kinds.choose(&mut rng).expect("some kinds");
        let slow_kind = matches!(
            kind,
            Fault::Kill
                | Fault::SqliteLock
                | Fault::PgRestart
                | Fault::PgPause
                | Fault::PgFailover
                | Fault::StalledCaller
        );
        if slow_kind && busy[&kind].swap(true, Ordering::SeqCst) {
            continue;
        }
        let target = target.clone();
        let busy = busy.clone();
        let rng = StdRng::seed_from_u64(rng.random());
        running.push(tokio::spawn(async move {
            inject(&target, kind, rng).await;
            busy[&kind].store(false, Ordering::SeqCst);
        }));
        running.retain(|h| !h.is_finished());
    }
}

async fn inject(t: &Target, kind: Fault, mut rng: StdRng) {
    let journal = &t.callers.journal;
    let ms = |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..hi));
    match kind {
        Fault::Kill => {
            let i = rng.random_range(0..t.callers.instances.len());
            journal.fault(Fault::Kill, None, format!("SIGKILL instance {i}"));
            let inst = t.callers.instances.clone();
            let _ = tokio::task::spawn_blocking(move || inst.kill(i)).await;
            tokio::time::sleep(ms(&mut rng, 100, 1500)).await;
            // A gateway cannot start while its PostgreSQL is down: try again until it does.
            for _ in 0..120 {
                let inst = t.callers.instances.clone();
                match tokio::task::spawn_blocking(move || inst.restart(i)).await {
                    Ok(Err(e)) => {
                        journal.fault(Fault::Kill, None, format!("restart failed: {e}"));
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    _ => break,
                }
            }
        }
        Fault::ProxyDelay => t.proxy.arm(ProxyFault::Delay(ms(&mut rng, 200, 1500))),
        Fault::ProxyResetBefore => t.proxy.arm(ProxyFault::ResetBefore),
        Fault::ProxyResetAfter => t.proxy.arm(ProxyFault::ResetAfter(ms(&mut rng, 0, 300))),
        Fault::ProxySlow => t.proxy.arm(ProxyFault::Slow(ms(&mut rng, 2, 10))),
        Fault::ProxyStall => t
            .proxy
            .arm(ProxyFault::Stall(t.timing.timeout + Duration::from_secs(1))),
        Fault::StalledCaller => {
            let stall = t.timing.lease * 5 + Duration::from_secs(1);
            let n = t.stalled.fetch_add(1, Ordering::SeqCst);
            agents::stalled_caller(&t.callers, &mut rng, n, t.timing.lease, stall).await;
        }
        Fault::SqliteLock => {
            let hold = ms(&mut rng, 300, t.max_lock.as_millis().max(301) as u64);
            let path = t.ledger.clone();
            journal.fault(
                Fault::SqliteLock,
                None,
                format!("BEGIN IMMEDIATE held {hold:?}"),
            );
            let r = tokio::task::spawn_blocking(move || -> rusqlite::Result<()> {
                let conn = rusqlite::Connection::open(&path)?;
                conn.busy_timeout(Duration::from_secs(30))?;
                conn.execute_batch("BEGIN IMMEDIATE")?;
                std::thread::sleep(hold);
                conn.execute_batch("COMMIT")
            })
            .await;
            if let Ok(Err(e)) = r {
                journal.fault(Fault::SqliteLock, None, format!("lock failed: {e}"));
            }
        }
        Fault::PgRestart => {
            let Some(pg) = t.pg.clone() else { return };
            let _one_at_a_time = t.pg_faults.lock().await;
            let down = ms(&mut rng, 500, 4000);
            journal.fault(
                Fault::PgRestart,
                None,
                format!("PostgreSQL stopped for {down:?}"),
            );
            let p = pg.clone();
            let _ = tokio::task::spawn_blocking(move || p.stop()).await;
            tokio::time::sleep(down).await;
            let _ = tokio::task::spawn_blocking(move || pg.start_again()).await;
        }
        Fault::PgPause => {
            let Some(pg) = t.pg.clone() else { return };
            let _one_at_a_time = t.pg_faults.lock().await;
            let paused = ms(&mut rng, 1000, 15000);
            journal.fault(
                Fault::PgPause,
                None,
                format!("PostgreSQL paused (SIGSTOP) for {paused:?}"),
            );
            /// Resumes the server however the pause ends (the task cancelled too).
            struct Resume(Arc<Pg>);
            impl Drop for Resume {
                fn drop(&mut self) {
                    self.0.resume();
                }
            }
            let p = pg.clone();
            let _ = tokio::task::spawn_blocking(move || p.pause()).await;
            let _resume = Resume(pg);
            tokio::time::sleep(paused).await;
        }
        Fault::PgFailover => {
            let Some(pg) = t.pg.clone() else { return };
            let _one_at_a_time = t.pg_faults.lock().await;
            let down = ms(&mut rng, 300, 3000);
            journal.fault(
                Fault::PgFailover,
                None,
                format!("primary SIGKILLed, its standby promoted after {down:?}"),
            );
            let _ = tokio::task::spawn_blocking(move || pg.fail_over(down)).await;
        }
        Fault::ClockStep => {
            let now: i64 = std::fs::read_to_string(&t.clock_file)
                .ok()
                .and_then(|s| s.trim().trim_start_matches('+').parse().ok())
                .unwrap_or(0);
            // Steps of up to 30 s either way, the offset kept within -30 s..+60 s.
            let next = (now + rng.random_range(-30..=30)).clamp(-30, 60);
            let change = if next == now { " (unchanged)" } else { "" };
            journal.fault(
                Fault::ClockStep,
                None,
                format!("wall clock offset {now:+} s -> {next:+} s{change}"),
            );
            let _ = std::fs::write(&t.clock_file, format!("{next:+}"));
        }
    }
}
