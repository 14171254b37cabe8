//! The engine's own periodic work on records whose owner went away: what holds for every
//! embedder of the engine (the gateway, an application that mounts the tower layer), so
//! it is here and not in the binary. [`Engine::sweep`] is one round; [`Engine::sweeping`]
//! runs a round every [`SWEEP_EVERY`] until told to stop.
//!
//! - An `action` whose owner went away (a gateway killed mid-call, its caller gone with
//!   it) becomes `outcome_unknown` once the owner's lease has lapsed, whether or not a
//!   duplicate ever comes: the operator sees it (`ledger list --status outcome_unknown`,
//!   the gauge) and reconciliation asks about it. Each processing action goes through the
//!   claim loop as [`Claimant::Sweep`]: `oncely_core::decide` says when the sweep calls an
//!   owner gone (later than a duplicate does: its lease past by a whole lease more, at
//!   least [`oncely_core::SWEEP_GRACE`], so an owner whose renewals a store outage held up
//!   renews first), and the loop leaves this instance's own running owners alone. The
//!   store takes it over atomically, on its own clock and fenced by the attempt, and of
//!   several instances sweeping only one takes it. A `write` left so is run again by its
//!   next duplicate (attempt + 1, same downstream key); a `job` by its queue.
//! - A record whose owner went away never answered its caller: on a route that
//!   recognises keys made up for each attempt (`oncely_store::churn`) it is undelivered,
//!   and a retry under a new key joins it as it would join a record whose caller left a
//!   live owner ([`Engine::mark_undelivered`]). The embedder says which routes those are
//!   ([`ChurnOf`]); on SQLite, the process that opens the ledger marks every record still
//!   processing (their owner was the process before it) before it serves.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use oncely_core::{Claimant, Class, Record, RecordId, State};
use oncely_store::{churn, Churn, ListFilter, Store, StoreError};

use crate::claim::{Claimed, Claimer, Claiming, Verdict};
use crate::engine::Engine;

/// How often the sweep runs.
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The churn windows of a record's route, when a made-up key may join it (`None`: its route
/// does not recognise made-up keys, or is gone). The embedder's routes, read afresh on
/// every round (a gateway's reloaded config).
pub type ChurnOf = Arc<dyn Fn(&Record) -> Option<Churn> + Send + Sync>;

impl Engine {
    /// Runs [`Engine::sweep`] every [`SWEEP_EVERY`] until `stop` completes.
    pub async fn sweeping(&self, churn_of: ChurnOf, stop: impl Future<Output = ()>) {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = every.tick() => self.sweep(&*churn_of).await,
            }
        }
    }

    /// One round: orphaned actions become `outcome_unknown`, and records of orphaned
    /// owners whose lease lapsed are marked undelivered. Failures are logged; the next
    /// round looks again.
    pub async fn sweep(&self, churn_of: &(dyn Fn(&Record) -> Option<Churn> + Sync)) {
        if let Err(e) = self.sweep_orphaned_actions().await {
            tracing::warn!(error = %e, "looking for orphaned actions failed");
        }
        if let Err(e) = self.mark_undelivered(churn_of, true).await {
            tracing::warn!(error = %e, "marking orphaned records undelivered failed");
        }
    }

    /// Orphaned actions become `outcome_unknown` (see the module docs).
    pub async fn sweep_orphaned_actions(&self) -> Result<(), StoreError> {
        let store = self.store();
        let filter = ListFilter {
            state: Some(State::Processing),
            ..ListFilter::default()
        };
        let processing = store.list(&filter).await?;
        if processing.is_empty() {
            return Ok(());
        }
        // One read of the ledger's clock for every record of this round.
        let now = store.now().await?;
        for listed in processing.into_iter().filter(|r| r.class == Class::Action) {
            let claiming = Claiming {
                claimant: Claimant::Sweep,
                fingerprint: None,
                deadline: tokio::time::Instant::now(),
                now: Some(now),
            };
            let mut sweep = Sweep {
                store,
                id: listed.id.clone(),
                listed: Some(listed),
            };
            match self.claim(&mut sweep, claiming).await {
                Verdict::Unknown(r) => {
                    tracing::warn!(record = %r.id, route = %r.route, attempt = r.attempt,
                        "an action's owner went away before recording it: outcome_unknown");
                }
                Verdict::Owned(taken) => {
                    tracing::error!(record = %taken.id, "the sweep took over an action as its owner");
                }
                // Still live (here, or by the store's watch of it), renewed, finished or
                // taken by someone else meanwhile, or the ledger away: the next round
                // looks again.
                _ => {}
            }
        }
        Ok(())
    }

    /// Marks the processing records of routes that recognise made-up keys (`churn_of`)
    /// undelivered: every one (`lapsed_only` false: on SQLite, before serving) or those
    /// whose lease lapsed, leaving this instance's own owners alone. Answers how many it
    /// marked.
    pub async fn mark_undelivered(
        &self,
        churn_of: &(dyn Fn(&Record) -> Option<Churn> + Sync),
        lapsed_only: bool,
    ) -> Result<usize, StoreError> {
        let store = self.store();
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
            let Some(c) = churn_of(&r) else {
                continue;
            };
            let ours = r
                .owner
                .as_deref()
                .is_some_and(|o| o.starts_with(self.instance()));
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
}

/// The sweep's claimer for one listed record: it claims nothing (the record as listed is
/// what it found; read again when the loop asks again), and takes over as
/// `oncely-sweep` for [`SWEEP_EVERY`].
struct Sweep<'a> {
    store: &'a Arc<dyn Store>,
    id: RecordId,
    listed: Option<Record>,
}

impl Claimer for Sweep<'_> {
    type Owned = Record;

    fn claim(&mut self) -> BoxFuture<'_, Result<Claimed<Record>, StoreError>> {
        Box::pin(async move {
            let found = match self.listed.take() {
                Some(listed) => Some(listed),
                None => self.store.get(&self.id).await?,
            };
            Ok(found.map_or(Claimed::Gone, Claimed::Found))
        })
    }

    fn take_over<'b>(
        &'b mut self,
        found: &'b Record,
    ) -> BoxFuture<'b, Result<Claimed<Record>, StoreError>> {
        Box::pin(async move {
            self.store
                .take_over(&found.id, found.attempt, "oncely-sweep", SWEEP_EVERY)
                .await
                .map(Claimed::from)
        })
    }
}
