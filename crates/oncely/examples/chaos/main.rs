//! The chaos run: the real `oncely` binary under faults (SIGKILL and restart, a fault proxy
//! before the upstream, stalled callers, SQLite write locks, PostgreSQL restarts and
//! failovers, clock steps), with agents retrying many intentions, then a check of the
//! whole history.
//! Loopback only; stops by itself.
//!
//! Run with: `scripts/chaos --minutes 10 --seed 7`
//! (or `cargo run -p oncely --example chaos -- --oncely target/debug/oncely --minutes 1`).
//!
//! Options: `--minutes N` / `--seconds N` (time under faults, default 2 minutes), `--seed N`,
//! `--stores sqlite,postgres`, `--faults kill,proxy-delay,...` (default every kind),
//! `--agents N`, `--churn-agents N` (callers that make up a new `Idempotency-Key` for every
//! attempt, default 3), `--settle-seconds N`, `--max-lock-ms N`, `--dir DIR` (ledgers and gateway
//! logs; default a new directory under the system's temporary directory),
//! `--oncely PATH` (default: `oncely` beside this program's directory).
//! Exits 1 when the checker found a violation, 2 on a bad argument.

#[path = "harness/mod.rs"]
mod harness;

use std::path::PathBuf;
use std::time::Duration;

use harness::{Fault, Options, StoreKind};

fn usage(why: &str) -> ! {
    eprintln!("chaos: {why}");
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut seconds = 120.0_f64;
    let mut seed = 1_u64;
    let mut stores = vec![StoreKind::Sqlite, StoreKind::Postgres];
    let mut faults = Fault::ALL.to_vec();
    let mut agents = 12;
    let mut churn_agents = 3;
    let mut settle = 150_u64;
    let mut max_lock = 8000_u64;
    let mut dir: Option<PathBuf> = None;
    let mut oncely: Option<PathBuf> = None;
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{a} needs a value")))
        };
        let number = |v: String| -> f64 {
            v.parse()
                .unwrap_or_else(|_| usage(&format!("{a}: not a number: {v}")))
        };
        match a.as_str() {
            "--minutes" => seconds = number(value()) * 60.0,
            "--seconds" => seconds = number(value()),
            "--seed" => seed = number(value()) as u64,
            "--agents" => agents = number(value()) as usize,
            "--churn-agents" => churn_agents = number(value()) as usize,
            "--settle-seconds" => settle = number(value()) as u64,
            "--max-lock-ms" => max_lock = number(value()) as u64,
            "--dir" => dir = Some(value().into()),
            "--oncely" => oncely = Some(value().into()),
            "--stores" => {
                stores = value()
                    .split(',')
                    .map(|s| match s {
                        "sqlite" => StoreKind::Sqlite,
                        "postgres" => StoreKind::Postgres,
                        other => usage(&format!("unknown store {other}")),
                    })
                    .collect();
            }
            "--faults" => {
                let v = value();
                faults = if v == "all" {
                    Fault::ALL.to_vec()
                } else if v == "none" {
                    Vec::new()
                } else {
                    v.split(',')
                        .map(|s| {
                            Fault::parse(s).unwrap_or_else(|| usage(&format!("unknown fault {s}")))
                        })
                        .collect()
                };
            }
            "-h" | "--help" => {
                println!(
                    "{}",
                    include_str!("main.rs")
                        .lines()
                        .take_while(|l| l.starts_with("//!"))
                        .map(|l| l.trim_start_matches("//!").trim_start())
                        .collect::<Vec<_>>()
                        .join("\n")
                );
                return;
            }
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if seconds.is_nan() || seconds <= 0.0 {
        usage("--minutes/--seconds must be positive");
    }
    let oncely = oncely.unwrap_or_else(|| {
        let me = std::env::current_exe().unwrap_or_else(|e| usage(&format!("own path: {e}")));
        // target/PROFILE/examples/chaos -> target/PROFILE/oncely
        me.parent()
            .and_then(|p| p.parent())
            .map(|p| p.join("oncely"))
            .unwrap_or_else(|| usage("pass --oncely PATH"))
    });
    if !oncely.exists() {
        usage(&format!(
            "{} does not exist (build it, or pass --oncely PATH)",
            oncely.display()
        ));
    }
    let dir = dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("oncely-chaos-{seed}-{}", std::process::id()))
    });
    let mut options = Options::new(oncely, seed, Duration::from_secs_f64(seconds), dir);
    options.stores = stores;
    options.faults = faults;
    options.agents = agents;
    options.churn_agents = churn_agents;
    options.settle = Duration::from_secs(settle);
    options.max_lock = Duration::from_millis(max_lock);
    let report = harness::run(&options);
    println!("{report}");
    if report.violations() > 0 {
        std::process::exit(1);
    }
}
