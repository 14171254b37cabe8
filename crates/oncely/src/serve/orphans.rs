//! Which records a key made up for each attempt may join, by the gateway's routes: what
//! the engine's sweep (`oncely_engine::sweep`) asks of a record whose owner went away. On
//! SQLite, the gateway that opens the ledger has the engine mark every record still
//! processing (their owner was the process before it) before it listens; on any store,
//! the sweep marks a processing record whose lease has lapsed and whose owner is not of
//! this instance.

use oncely_core::{Class, Record};
use oncely_store::Churn;

use crate::config::Config;

/// The churn windows of `r`'s route, when a made-up key may join it: a `write` or `action`
/// under a client key on a route whose `churn_window` is not zero.
pub(crate) fn churn_of(r: &Record, config: &Config) -> Option<Churn> {
    let route = config.route_named(&r.route)?;
    let keyed = r.key != r.fingerprint.to_hex();
    let class = matches!(r.class, Class::Write | Class::Action);
    (keyed && class && !route.churn_window.is_zero()).then_some(Churn {
        window: route.churn_window,
        keep: route.window,
    })
}
