//! The short chaos run, with a fixed seed: the real binary (one instance on SQLite, then two
//! on one PostgreSQL of its own) under SIGKILLs and restarts and a fault proxy before the
//! upstream (delays, resets before and after sending, slow and stalled answers), with
//! agents retrying many write, action, job and webhook intentions; the history checker
//! must find nothing. The harness is `examples/chaos/harness`; the long run is
//! `scripts/chaos`, with every fault kind.
//!
//! Left out of this short run until their fixes land (see RELIABILITY.md): stalled callers
//! (the owner loses its lease while its caller does not read: the write runs twice),
//! PostgreSQL restarts and SQLite write locks (an owner's failed ledger write is dropped:
//! the record runs again, callers get two different results, an action's answer is lost
//! to `outcome_unknown`, an action that never ran becomes `outcome_unknown`), and clock
//! steps (a forward step lets a live job or record be taken over and run twice).

#[path = "../../examples/chaos/harness/mod.rs"]
#[allow(dead_code)]
mod harness;

use std::time::Duration;

use harness::{Fault, Options};

/// The fault kinds the short run injects.
const SHORT_RUN_FAULTS: [Fault; 6] = [
    Fault::Kill,
    Fault::ProxyDelay,
    Fault::ProxyResetBefore,
    Fault::ProxyResetAfter,
    Fault::ProxySlow,
    Fault::ProxyStall,
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
    // Longer than a webhook delivery's fixed 120 s task lease, which a delivery cut off by
    // a SIGKILL waits for today (issue 10, item 4); 30 s is plenty once that is fixed.
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
