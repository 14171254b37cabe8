//! The PostgreSQL store: several gateway instances share one ledger.
//!
//! - A claim is one plain `INSERT ... ON CONFLICT (claim) DO NOTHING` on the key's claim
//!   hash (`Scope::claim_hash`, a 16-byte unique index); a held key costs a read of the
//!   row holding it (which must hold the same scope and key); only a released row
//!   (reclaim) or an expired one (renew) costs a conditional `UPDATE`, so two claimants
//!   can never both win. Lists are newest first by id (a UUIDv7) through the primary key;
//!   the states the gateway polls have a partial index (`records_open`).
//! - Concurrent claims, and concurrent completions, of one instance are grouped into one
//!   statement and one commit each (`batch`); a lone call runs its own statement at once.
//! - Owner transitions (`complete`, `release`, `mark_unknown`, `renew`) are one `UPDATE`
//!   fenced by `owner`, `attempt` and `state`; when it matches no row, the row is read and
//!   the pure transition of `oncely_core::record` names the exact refusal.
//! - Rare transitions (`take_over`, `resolve`) lock the row (`SELECT ... FOR UPDATE`),
//!   apply the pure transition, and write the row back, in one transaction.
//! - A claim that meets a completed record is answered from an in-memory cache of
//!   completed records until shortly before the record expires (`crate::replays`):
//!   a completed record is final, so every instance may replay it without a round trip.
//! - Every time comes from the database's clock (`clock_timestamp()`), plus the offset of
//!   the store's [`Clock`](crate::Clock) (zero outside tests), so that instances with
//!   skewed clocks agree on leases and windows.
//! - A lease counts as lapsed only once the server has been the primary it is now for a
//!   whole lease: since its postmaster started (a restart), or since this database was
//!   first seen on its WAL timeline (a promoted standby), whichever is later, so that an
//!   owner that could not renew while the database was away renews before anyone takes
//!   its record or task over.
//! - `wait_for` counts itself in the row's `waiting` column; a transition out of
//!   `processing` sends `NOTIFY` only when that count is above zero, and the listener
//!   of every instance (`listener`) wakes its local waiters.
//! - Schema changes are the versioned [`migrations`], applied by [`PgStore::connect`],
//!   which first refuses a server that does not take writes (a standby reached without
//!   `target_session_attrs=read-write`) and a session that notifications do not reach (a
//!   pooler in transaction mode), each in one line that says what to change.
//!
//! Connections use TLS as libpq's `sslmode` says (`prefer` by default; `verify-full`
//! checks the certificate and the host), with rustls; see `connection`.
//!
//! The parts: `connection` (the only one that knows how a connection is made: the URL
//! and its libpq parameters, TLS, the pool, the listener's own connection), `server` (the
//! server reached must take writes: a standby is refused), `store` (the [`PgStore`] handle and its
//! statement helpers), `rows` and `sql` (records as rows, and the statements),
//! [`migrations`] (the schema), the traits' impls `ledger` (with `batch`, the grouped
//! claims and completions), `waiting` (with `listener`, LISTEN/NOTIFY), `queue` (with
//! `enqueue`, the claims that enqueue a task), `admin` (with `reconcile`), and `error`.

use std::sync::Arc;

use crate::{Result, Store, StoreOptions};

mod admin;
mod batch;
mod churn;
mod connection;
mod enqueue;
mod error;
mod ledger;
mod listener;
pub mod migrations;
mod queue;
mod reconcile;
mod rows;
mod server;
mod sql;
mod store;
mod usage;
mod waiting;

pub use store::PgStore;

/// Opens (and migrates) the PostgreSQL store at `url`.
pub async fn open(url: &str, options: StoreOptions) -> Result<Arc<dyn Store>> {
    Ok(Arc::new(PgStore::connect(url, options).await?))
}
