//! The suite's sections stand alone: a store that implements only `Ledger` and `Waiting`
//! (no task queue, no administration) runs just those two sections.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use oncely_core::{
    ClaimSpec, Completion, Fence, Record, RecordId, Resolution, Scope, TakeOverOutcome, Timestamp,
};
use oncely_store::memory::MemoryStore;
use oncely_store::{Claim, Ledger, ManualClock, Repeat, Result, Waiting};
use oncely_store_conformance::Harness;

/// A ledger with wake-ups and nothing else: the memory store seen through two traits.
#[derive(Debug, Clone)]
struct LedgerOnly(MemoryStore);

#[async_trait]
impl Ledger for LedgerOnly {
    async fn claim(&self, spec: &ClaimSpec) -> Result<Claim> {
        self.0.claim(spec).await
    }
    async fn complete(&self, fence: &Fence, completion: Completion) -> Result<Record> {
        self.0.complete(fence, completion).await
    }
    async fn release(
        &self,
        fence: &Fence,
        error: Option<String>,
        window: Duration,
    ) -> Result<Record> {
        self.0.release(fence, error, window).await
    }
    async fn mark_unknown(&self, fence: &Fence, error: String) -> Result<Record> {
        self.0.mark_unknown(fence, error).await
    }
    async fn renew(&self, fence: &Fence, lease: Duration) -> Result<()> {
        self.0.renew(fence, lease).await
    }
    async fn take_over(
        &self,
        id: &RecordId,
        expected_attempt: u32,
        owner: &str,
        lease: Duration,
    ) -> Result<TakeOverOutcome> {
        self.0.take_over(id, expected_attempt, owner, lease).await
    }
    async fn get(&self, id: &RecordId) -> Result<Option<Record>> {
        self.0.get(id).await
    }
    async fn lookup(&self, scope: &Scope, key: &str) -> Result<Option<Record>> {
        self.0.lookup(scope, key).await
    }
    async fn resolve(&self, id: &RecordId, resolution: Resolution) -> Result<Record> {
        self.0.resolve(id, resolution).await
    }
    async fn record_repeats(
        &self,
        id: &RecordId,
        principal: &str,
        route: &str,
        repeats: &[Repeat],
    ) -> Result<()> {
        self.0.record_repeats(id, principal, route, repeats).await
    }
    async fn now(&self) -> Result<Timestamp> {
        self.0.now().await
    }
    async fn ping(&self) -> Result<()> {
        self.0.ping().await
    }
}

#[async_trait]
impl Waiting for LedgerOnly {
    async fn wait_for(&self, id: &RecordId, timeout: Duration) -> Result<Record> {
        self.0.wait_for(id, timeout).await
    }
}

#[derive(Default)]
struct LedgerOnlyHarness {
    clock: ManualClock,
    last: Mutex<Option<LedgerOnly>>,
}

#[async_trait]
impl Harness for LedgerOnlyHarness {
    type Store = LedgerOnly;

    async fn store(&self) -> Arc<LedgerOnly> {
        let store = LedgerOnly(MemoryStore::new(Arc::new(self.clock.clone())));
        *self.last.lock().unwrap() = Some(store.clone());
        Arc::new(store)
    }

    async fn second(&self) -> Arc<LedgerOnly> {
        // A clone shares the data and the waiters, as two instances share one database.
        Arc::new(self.last.lock().unwrap().clone().expect("store() first"))
    }

    fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }
}

oncely_store_conformance::ledger_tests!(LedgerOnlyHarness::default());
oncely_store_conformance::waiting_tests!(LedgerOnlyHarness::default());
