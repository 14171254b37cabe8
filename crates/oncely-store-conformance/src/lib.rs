//! The conformance suite of oncely stores: the same tests, run against every backend,
//! organised per small trait of `oncely_store`, and a test PostgreSQL ([`testing`]).
//!
//! A backend's test file implements [`Harness`] and calls [`conformance_tests!`] to get
//! one `#[tokio::test]` per rule of every section, or only the sections its store
//! implements:
//!
//! | macro | section | the store implements |
//! |-------|---------|----------------------|
//! | [`ledger_tests!`] | [`ledger`]: claims, fencing, take-over, resolution | `Ledger` |
//! | [`waiting_tests!`] | [`waiting`]: wake-ups, also across instances | `Ledger + Waiting` |
//! | [`admin_tests!`] | [`admin`]: expiry, listing, usage, secrets, schedules | `Ledger + Admin` |
//! | [`task_queue_tests!`] | [`task_queue`]: claims with tasks, leases, retries, caps | `Ledger + TaskQueue` |
//!
//! ```ignore
//! oncely_store_conformance::conformance_tests!(my_backend_harness());
//! // a backend with only a ledger and wake-ups:
//! oncely_store_conformance::ledger_tests!(my_backend_harness());
//! oncely_store_conformance::waiting_tests!(my_backend_harness());
//! ```
//!
//! Each test asserts one behaviour the ledger promises: atomic claims under contention,
//! fencing of stale owners, expiry, wake-ups across instances, reconciliation, and that
//! one principal never sees another's record.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use oncely_core::{ClaimSpec, Class, Completion, FingerprintBuilder, Identity, StoredResponse};
use oncely_store::{Claim, NewTask};

pub mod admin;
pub mod churn;
pub mod ledger;
pub mod task_queue;
pub mod testing;
pub mod waiting;

/// How the suite gets stores of one backend.
#[async_trait]
pub trait Harness: Send + Sync {
    /// The store type: `dyn oncely_store::Store`, a backend type, or any type that
    /// implements the traits of the sections it runs.
    type Store: ?Sized + Send + Sync + 'static;
    /// A store on a fresh, empty database, with a clock the harness can move.
    async fn store(&self) -> Arc<Self::Store>;
    /// A second, independent instance on the same database as the last [`Harness::store`]
    /// (another process would see it like this): its own connections and waiters.
    async fn second(&self) -> Arc<Self::Store>;
    /// Moves the clock of every store this harness made forward.
    fn advance(&self, by: Duration);
}

/// The lease used by the suite.
pub const LEASE: Duration = Duration::from_secs(30);
/// The replay window used by the suite.
pub const WINDOW: Duration = Duration::from_secs(3 * 3600);

/// A claim spec for `principal`'s `key` on route `POST /v1/render` with `body`.
pub fn spec(principal: &str, key: &str, body: &str, class: Class, owner: &str) -> ClaimSpec {
    let route = "POST /v1/render";
    ClaimSpec {
        identity: Identity::new(
            principal.to_string(),
            route.to_string(),
            class,
            Some(key.to_string()),
            FingerprintBuilder::new(principal, "POST", "/v1/render").body(body.as_bytes(), &[]),
            Some("wf-1".into()),
        ),
        owner: owner.to_string(),
        lease: LEASE,
    }
}

/// One fresh request as the benchmarks make it (`writer_cost`, `pg_write_cost`,
/// `ledger_scale`): a claim of `key` under `principal` (an `action`, the body naming
/// request `i`), then its completion with a small body. Panics when the key was taken or
/// the store fails: a benchmark measures fresh requests only.
pub async fn fresh_request<L: oncely_store::Ledger + ?Sized>(
    store: &L,
    principal: &str,
    key: &str,
    i: u64,
) {
    let Claim::Owned(record) = store
        .claim(&spec(
            principal,
            key,
            &format!("{{\"prompt\":{i}}}"),
            Class::Action,
            "owner-1",
        ))
        .await
        .expect("claim")
    else {
        panic!("fresh key found existing")
    };
    store
        .complete(
            &record.fence().expect("owned"),
            completion("{\"id\":\"r-1\"}", 1),
        )
        .await
        .expect("complete");
}

/// A completion with a small JSON body and one header.
pub fn completion(body: &str, units: u64) -> Completion {
    Completion {
        response: StoredResponse {
            status: 201,
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("x-render-id".into(), "r-9".into()),
            ],
            body: Some(bytes::Bytes::copy_from_slice(body.as_bytes())),
        },
        units,
        window: WINDOW,
        replay_until: None,
        provider_request_id: Some("req_123".into()),
        trace: None,
    }
}

pub(crate) fn owned(c: Claim) -> oncely_core::Record {
    match c {
        Claim::Owned(r) => r,
        Claim::Existing(r) => panic!("expected to own the claim, found existing {r:?}"),
    }
}

pub(crate) fn existing(c: Claim) -> oncely_core::Record {
    match c {
        Claim::Existing(r) => r,
        Claim::Owned(r) => panic!("expected an existing record, the claim was granted: {r:?}"),
    }
}

/// A webhook-like task for the queue tests.
pub fn new_task(body: &str, max_attempts: u32) -> NewTask {
    NewTask {
        kind: "webhook".into(),
        target: "http://127.0.0.1:9/hook".into(),
        method: "POST".into(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("idempotency-key".into(), "evt_1".into()),
        ],
        body: body.as_bytes().to_vec(),
        max_attempts,
        timeout: Duration::from_secs(5),
        backoff: Duration::from_millis(10),
    }
}

/// Generates one `#[tokio::test]` per conformance rule of every section for a harness
/// expression (its store implements `oncely_store::Store`).
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::ledger_tests!($harness);
        $crate::waiting_tests!($harness);
        $crate::admin_tests!($harness);
        $crate::task_queue_tests!($harness);
        $crate::churn_tests!($harness);
    };
}

/// Generates the [`churn`] section's tests (the store implements `Ledger`).
#[macro_export]
macro_rules! churn_tests {
    ($harness:expr) => {
        $crate::section_tests!(churn $harness;
            a_made_up_key_joins_an_undelivered_record,
            an_undelivered_record_past_the_window_is_not_joined,
            a_made_up_key_claims_a_released_undelivered_record_again,
        );
    };
}

/// Generates the [`ledger`] section's tests (the store implements `Ledger`).
#[macro_export]
macro_rules! ledger_tests {
    ($harness:expr) => {
        $crate::section_tests!(ledger $harness;
            claim_new_then_existing,
            concurrent_claims_have_one_owner,
            concurrent_claims_across_instances_have_one_owner,
            complete_then_replay,
            a_retried_transition_is_answered_as_written,
            replay_until_shortens_the_window,
            release_then_reclaim,
            stale_owner_refused_after_take_over,
            renew_keeps_the_lease,
            resolve_out_of_outcome_unknown,
        );
    };
}

/// Generates the [`waiting`] section's tests (the store implements `Ledger + Waiting`).
#[macro_export]
macro_rules! waiting_tests {
    ($harness:expr) => {
        $crate::section_tests!(waiting $harness;
            wait_for_wakes_and_times_out,
            waiter_on_second_instance_wakes_quickly,
        );
    };
}

/// Generates the [`admin`] section's tests (the store implements `Ledger + Admin`).
#[macro_export]
macro_rules! admin_tests {
    ($harness:expr) => {
        $crate::section_tests!(admin $harness;
            expiry_frees_the_key,
            released_records_expire_with_their_window,
            lapsed_action_becomes_outcome_unknown,
            principals_are_isolated,
            list_filters_newest_first,
            repeats_and_usage,
            repeat_events_for_statements,
            many_repeat_events_in_one_write_are_all_kept,
            secrets_are_stable_and_shared,
            reconcile_schedule_is_shared_and_compared,
            usage_outlives_the_records,
            concurrent_purges_fold_each_count_once,
            a_purge_larger_than_a_step_takes_every_record_once,
        );
    };
}

/// Generates the [`task_queue`] section's tests (the store implements
/// `Ledger + TaskQueue`).
#[macro_export]
macro_rules! task_queue_tests {
    ($harness:expr) => {
        $crate::section_tests!(task_queue $harness;
            queue_claim_with_task_is_all_or_nothing,
            queue_concurrent_claims_enqueue_once,
            queue_concurrent_leases_never_share,
            queue_lapsed_lease_is_leased_again_and_fenced,
            queue_renewed_lease_holds_then_lapses,
            queue_retry_schedules_next_at,
            queue_dead_after_max_attempts_then_requeue,
            queue_capped_leases_share_one_cap,
            queue_released_record_is_reclaimed_with_a_new_task,
        );
    };
}

/// One `#[tokio::test]` per named rule of a section.
#[doc(hidden)]
#[macro_export]
macro_rules! section_tests {
    ($section:ident $harness:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let harness = $harness;
                $crate::$section::$name(&harness).await;
            }
        )*
    };
}
