//! The short chaos run, with a fixed seed: the real binary (one instance on SQLite, then two
//! on one PostgreSQL of its own) under SIGKILLs and restarts, a fault proxy before the
//! upstream, SQLite write locks and clock steps, with agents retrying many write, action,
//! job and webhook intentions; the history checker must find nothing. The harness is
//! `examples/chaos/harness`; the long run is `scripts/chaos`.
//!
//! Left out of this short run until their fixes land (the long run keeps them; see
//! RELIABILITY.md): stalled callers (the owner loses its lease while its caller does not
//! read, and the write runs twice), PostgreSQL restarts and SQLite write locks longer than
//! the store's 5 s busy timeout (an owner's failed `complete` is dropped: the record runs
//! again, callers get two different results, an action's answer is lost to
//! `outcome_unknown`).

#[path = "../../examples/chaos/harness/mod.rs"]
#[allow(dead_code)]
mod harness;

use std::time::Duration;

use harness::{Fault, Options};

/// The fault kinds the short run injects.
const SHORT_RUN_FAULTS: [Fault; 8] = [
    Fault::Kill,
    Fault::ProxyDelay,
    Fault::ProxyResetBefore,
    Fault::ProxyResetAfter,
    Fault::ProxySlow,
    Fault::ProxyStall,
    Fault::SqliteLock,
    Fault::ClockStep,
];

#[test]
fn a_short_chaos_run_with_a_fixed_seed_breaks_no_promise() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = Options::new(
        env!("CARGO_BIN_EXE_oncely").into(),
        20261201,
        Duration::from_secs(50),
        dir.path().to_owned(),
    );
    options.faults = SHORT_RUN_FAULTS.to_vec();
    // Under the store's busy timeout (5 s).
    options.max_lock = Duration::from_secs(4);
    // Longer than a webhook delivery's fixed 120 s task lease, which a delivery cut off by
    // a SIGKILL waits for today.
    options.settle = Duration::from_secs(150);
    let report = harness::run(&options);
    println!("{report}");
    if report.violations() > 0 {
        // The ledgers and the gateways' logs stay for a look.
        let _ = dir.keep();
    }
    assert_eq!(report.violations(), 0, "{report}");
    assert!(
        report.phases.iter().all(|p| p.requests > 500),
        "too few requests to mean anything: {report}"
    );
}
