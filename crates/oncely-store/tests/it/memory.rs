//! The conformance suite against the in-memory store.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use oncely_store::memory::MemoryStore;
use oncely_store::{ManualClock, Store};
use oncely_store_conformance::Harness;

#[derive(Default)]
struct MemoryHarness {
    clock: ManualClock,
    last: Mutex<Option<MemoryStore>>,
}

#[async_trait]
impl Harness for MemoryHarness {
    type Store = dyn Store;

    async fn store(&self) -> Arc<dyn Store> {
        let store = MemoryStore::new(Arc::new(self.clock.clone()));
        *self.last.lock().unwrap() = Some(store.clone());
        Arc::new(store)
    }

    async fn second(&self) -> Arc<dyn Store> {
        // A clone shares the data and the waiters, as two instances share one database.
        Arc::new(self.last.lock().unwrap().clone().expect("store() first"))
    }

    fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }
}

oncely_store_conformance::conformance_tests!(MemoryHarness::default());
