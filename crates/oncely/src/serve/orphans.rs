//! Records whose owner went away (a gateway killed mid-call) never answered their callers:
//! for keys made up for each attempt (`oncely_store::churn`) they are undelivered, and a
//! retry under a new key joins them as it would join a record whose caller left a live
//! owner. On SQLite, the gateway that opens the ledger marks every record still processing
//! (their owner was the process before it) before it listens; on any store, the sweep marks
//! a processing record whose lease has lapsed and whose owner is not of this instance.

use oncely_core::{Class, Record, State};
use oncely_store::{churn, Churn, ListFilter, StoreError};
use oncely_tower::Guard;

use crate::config::Config;

/// Marks the processing records of routes with a `churn_window` undelivered: every one
/// (`lapsed_only` false: at start on SQLite) or those whose lease lapsed. Answers how many
/// it marked.
pub(crate) async fn mark_undelivered(
    guard: &Guard,
    config: &Config,
    lapsed_only: bool,
) -> Result<usize, StoreError> {
    let store = guard.store();
    let Some(filter) = store.churn_filter() else {
        return Ok(0);
    };
    let listed = store
        .list(&ListFilter {
            state: Some(State::Processing),
            ..ListFilter::default()
        })
        .await?;
    if listed.is_empty() {
        return Ok(0);
    }
    let now = store.now().await?;
    let mut marked = 0;
    for r in listed {
        let Some(c) = churn_of(&r, config) else {
            continue;
        };
        let ours = r
            .owner
            .as_deref()
            .is_some_and(|o| o.starts_with(guard.instance()));
        if ours || (lapsed_only && !r.lease_lapsed(now)) || filter.undelivered(&r.id) {
            continue;
        }
        let entry = churn::undelivered(&r, c, now);
        if entry.until > now && store.churn_put(&entry).await? {
            tracing::info!(record = %r.id, route = %r.route,
                "a record whose owner went away did not answer its caller: a retry under a new key joins it");
            marked += 1;
        }
    }
    Ok(marked)
}

/// The churn windows of `r`'s route, when a made-up key may join it: a `write` or `action`
/// under a client key on a route whose `churn_window` is not zero.
fn churn_of(r: &Record, config: &Config) -> Option<Churn> {
    let route = config.route_named(&r.route)?;
    let keyed = r.key != r.fingerprint.to_hex();
    let class = matches!(r.class, Class::Write | Class::Action);
    (keyed && class && !route.churn_window.is_zero()).then_some(Churn {
        window: route.churn_window,
        keep: route.window,
    })
}
