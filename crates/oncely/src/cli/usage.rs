//! `oncely usage [--since DURATION] [--json]`.

use std::time::Duration;

use super::ledger::store_failure;
use super::store::open;
use super::{Outcome, StoreArgs};
use crate::records;

pub(crate) async fn run(since: Option<Duration>, json: bool, args: &StoreArgs) -> Outcome {
    let ledger = open(args).await?;
    let since = match since {
        Some(d) => Some(ledger.store.now().await.map_err(store_failure)?.minus(d)),
        None => None,
    };
    let usage = ledger.store.usage(since).await.map_err(store_failure)?;
    if json {
        println!("{}", records::usage(&usage));
        return Ok(());
    }
    println!(
        "{:<64} {:>8} {:>12} {:>8} {:>12}",
        "PRINCIPAL", "FRESH", "FRESH_UNITS", "REPEATS", "REPEAT_UNITS"
    );
    for r in &usage.by_principal {
        println!(
            "{:<64} {:>8} {:>12} {:>8} {:>12}",
            r.principal, r.fresh, r.fresh_units, r.repeats, r.repeat_units
        );
    }
    let t = &usage.totals;
    println!(
        "{:<64} {:>8} {:>12} {:>8} {:>12}",
        "TOTAL", t.fresh, t.fresh_units, t.repeats, t.repeat_units
    );
    Ok(())
}
