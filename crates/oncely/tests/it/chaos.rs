//! The short chaos run, with a fixed seed: the real binary (one instance on SQLite, then two
//! on one PostgreSQL of its own, a primary with a synchronous standby) under SIGKILLs and
//! restarts, PostgreSQL restarts and failovers, and a fault proxy before the
//! upstream (delays, resets before and after sending, slow and stalled answers), with
//! agents retrying many write, action, job and webhook intentions; the history checker
//! must find nothing. The harness is `examples/chaos/harness`; the long run is
//! `scripts/chaos`, with every fault kind.
//!
//! Every fault kind of the long run is injected here too, only for less time.

#[path = "../../examples/chaos/harness/mod.rs"]
#[allow(dead_code)]
mod harness;

use std::time::Duration;

use harness::{Fault, Options};

/// The fault kinds the short run injects.
const SHORT_RUN_FAULTS: [Fault; 11] = [
    Fault::Kill,
    Fault::ProxyDelay,
    Fault::ProxyResetBefore,
    Fault::ProxyResetAfter,
    Fault::ProxySlow,
    Fault::ProxyStall,
    Fault::StalledCaller,
    Fault::SqliteLock,
    Fault::PgRestart,
    Fault::PgFailover,
    Fault::ClockStep,
];

#[test]
fn a_short_chaos_run_with_a_fixed_seed_breaks_no_promise() {
    let dir = tempfile::tempdir().unwrap();
    let mut options = Options::new(
        env!("CARGO_BIN_EXE_oncely").into(),
        20261201,
        Duration::from_secs(40),
        dir.path().to_owned(),
    );
    options.faults = SHORT_RUN_FAULTS.to_vec();
    // A delivery or job cut off by a kill is taken up again about one lease later.
    options.settle = Duration::from_secs(40);
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
