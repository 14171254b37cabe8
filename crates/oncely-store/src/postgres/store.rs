//! The PostgreSQL store's handle: what its clones share (the pool, the listener, the
//! waiters, the claim and completion groups, the replay cache), how it is opened, and
//! the statement helpers every part of the store runs its SQL with.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::task::JoinHandle;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::batch::Batcher;
use super::connection::{checkout, Conn, Connector};
use super::error::unavailable;
use super::{listener, migrations, server};
use crate::replays::{Limits, ReplayCache};
use crate::waiters::Waiters;
use crate::{Clock, Result, StoreOptions};

/// The PostgreSQL store. Clones share the pool, the listener and the waiters.
#[derive(Clone)]
pub struct PgStore {
    pub(super) inner: Arc<Inner>,
}

/// What the clones of a store share.
pub(super) struct Inner {
    pub(super) pool: Pool,
    pub(super) waiters: Arc<Waiters>,
    clock: Arc<dyn Clock>,
    listener: JoinHandle<()>,
    pub(super) batcher: Batcher,
    /// Completed records, served to `claim` (see `crate::replays`): a claim that finds a
    /// completed record is answered from memory, on any instance sharing the database,
    /// for as long as the record is replayable. It stays honest this way:
    ///
    /// - it answers only [`Ledger::claim`](crate::Ledger::claim) (not `get`, `lookup` or `list`, which show the
    ///   repeat counters, which a claim answered from a completed record does not read),
    ///   and only with records that were read completed, i.e. from a durable completion;
    /// - its time is the database's time of an entry's read carried forward on this
    ///   host's monotonic clock ([`Now::SinceRead`](crate::replays::Now::SinceRead)): a step of this host's wall clock
    ///   cannot stretch a record's window;
    /// - within [`REPLAY_LIMITS`]: an entry counts as expired a margin before the record
    ///   does, so that the drift between this host's monotonic clock and the database's
    ///   clock cannot serve a record that another instance already purged, and is read
    ///   again from the database after an age limit at the latest.
    ///
    /// A record enters when a claim reads it completed, not when this instance completes
    /// it.
    pub(super) replays: ReplayCache,
    /// What this instance knows of the churn table (`super::churn`), kept by the listener.
    pub(super) churn: Arc<crate::ChurnFilter>,
}

/// The replay cache's limits on PostgreSQL: an entry counts as expired 1 s before its
/// record does, and is read again after a minute at the latest.
const REPLAY_LIMITS: Limits = Limits {
    margin: Duration::from_secs(1),
    max_age: Some(Duration::from_secs(60)),
    ..Limits::DEFAULT
};

impl Drop for Inner {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.inner.pool.status();
        f.debug_struct("PgStore")
            .field("pool_size", &status.max_size)
            .field("clock", &self.inner.clock)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to `url` (`postgres://USER[:PASS]@HOST[:PORT]/DB[?options=...]`), starts
    /// listening for wake-ups, and applies pending migrations. A server that does not take
    /// writes (a standby), or a session whose notifications do not reach the listener (a
    /// pooler in transaction mode), is refused first with [`StoreError::Config`](crate::StoreError::Config).
    pub async fn connect(url: &str, options: StoreOptions) -> Result<PgStore> {
        let connector = Connector::parse(url)?;
        let pool = connector.pool(options.pool_size)?;
        {
            let client = checkout(&pool).await?;
            server::refuse_read_only(&client).await?;
        }
        let waiters = Arc::new(Waiters::default());
        let several_hosts_without_read_write = connector.several_hosts_without_read_write();
        let churn = Arc::new(crate::ChurnFilter::default());
        churn.blind();
        let listener = listener::start(connector, waiters.clone(), churn.clone()).await?;
        let ready = async {
            listener::check_delivery(&pool, &waiters).await?;
            let mut client = checkout(&pool).await?;
            migrations::migrate(&mut client).await?;
            listener::reload(&client, &churn).await
        };
        if let Err(e) = ready.await {
            listener.abort();
            return Err(e);
        }
        if several_hosts_without_read_write {
            tracing::warn!(
                "the store URL lists several hosts without target_session_attrs=read-write: \
                 a new connection goes to the first host that answers, which after a \
                 failover may be a standby (guarded requests then get 503 until it is \
                 promoted); add target_session_attrs=read-write"
            );
        }
        // Fewer statements in flight than connections make bigger groups, and fewer
        // commits: with the plain statements of schema 8, an eighth of the pool (16
        // connections: 2 groups at a time) took 102-138 us of the server's CPU per fresh
        // request against 180-219 us at a quarter, with more requests a second
        // (`scripts/pg-write-cost`, BENCHMARKS.md).
        let batcher = Batcher::start(pool.clone(), (options.pool_size / 8).max(1));
        Ok(PgStore {
            inner: Arc::new(Inner {
                batcher,
                replays: ReplayCache::new(REPLAY_LIMITS),
                pool,
                waiters,
                clock: options.clock,
                listener,
                churn,
            }),
        })
    }

    /// The connection pool, for other tables on the same database (job and delivery
    /// queues); their schema belongs in [`migrations::MIGRATIONS`].
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The clock's offset from system time, in milliseconds: added to the database's
    /// clock in every statement that reads or writes a time.
    pub(super) fn offset(&self) -> i64 {
        self.inner.clock.offset().as_millis().min(i64::MAX as u128) as i64
    }

    /// This process's monotonic time, by which leases are watched (`crate::watch`).
    pub(super) fn monotonic(&self) -> Duration {
        self.inner.clock.monotonic()
    }

    /// A connection from the pool.
    pub(super) async fn client(&self) -> Result<Conn> {
        checkout(&self.inner.pool).await
    }

    /// Runs one cached statement and returns its rows.
    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(sql).await.map_err(unavailable)?;
        client.query(&stmt, params).await.map_err(unavailable)
    }

    /// Runs one cached statement and returns its row, if any.
    /// Returns once everything the server has committed is as durable as a write of
    /// this instance's own: it commits a write (`SQL.durable`), and a commit waits until
    /// the synchronous standbys have the WAL up to it, so everything before it too. A
    /// primary restarted while commits waited for a standby shows them before any standby
    /// has them; a write retried after its answer was lost that finds itself applied
    /// confirms it this way before its writer acts on it (and stops), so that a failover
    /// cannot take back what an owner was told it had written. (A transaction that only
    /// takes an id writes no WAL of its own, and PostgreSQL lets it commit without
    /// waiting: it must write a row.)
    pub(super) async fn durable(&self) -> Result<()> {
        self.query_opt(&super::sql::SQL.durable, &[&self.offset()])
            .await
            .map(|_| ())
    }

    pub(super) async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(sql).await.map_err(unavailable)?;
        client.query_opt(&stmt, params).await.map_err(unavailable)
    }
}
