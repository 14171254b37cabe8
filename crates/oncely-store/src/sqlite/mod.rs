//! The SQLite store: the embedded default (`sqlite://oncely.db`).
//!
//! - One **writer thread** owns the only writing connection and commits the commands
//!   waiting for it in groups ([`writer`]): one transaction and one fsync per group, and
//!   an answer only after the commit, so `synchronous=FULL` stays fast under load.
//! - **Read connections** ([`readers`]) answer `get`, `lookup`, `list` and `usage` on
//!   tokio's blocking threads; WAL lets them read while the writer writes.
//! - **Wake-ups**: the writer wakes this instance's waiters after each commit; a watcher
//!   notices commits of other instances on the same file (`PRAGMA data_version`) while
//!   anyone waits.
//! - **Checkpoints** of the WAL run on a thread of their own ([`checkpoint`]), not inside
//!   the writer's commits.
//! - A **replay cache** (`crate::replays`) answers repeats of completed records without a
//!   blocking thread; only repeat counters can be briefly stale across instances.
//! - The **schema** is a list of migrations applied on open ([`schema::MIGRATIONS`]).
//! - The ledger's files are owner-only (0600) and `secure_delete` is on, so a deleted
//!   row (a finished job's payload, a delivered webhook's body) does not linger.
//!
//! Every transition is the pure one of `oncely_core::record`, run inside the writer's
//! transaction; the single writer (and `BEGIN IMMEDIATE` between processes) makes each
//! read-decide-write atomic. Nothing here blocks a tokio worker.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use oncely_core::{
    ClaimSpec, Completion, Fence, Record, RecordId, Resolution, Scope, State, TakeOverOutcome,
    Timestamp, TransitionError,
};
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension};

use crate::memory::usage_from_rows;
use crate::plan::plan_claims;
use crate::replays::{Now, ReplayCache};
use crate::waiters::{wait_until_settled, Waiters};
use crate::{
    new_record_id, Admin, Claim, Clock, Ledger, ListFilter, ReconcileSchedule, Repeat,
    RepeatEvents, Result, Store, StoreError, StoreOptions, Usage, Waiting,
};

mod checkpoint;
mod durable;
mod leases;
mod queue;
mod readers;
mod reconcile;
mod repeats;
mod rows;
pub mod schema;
mod writer;

use readers::{Readers, Watcher};
use writer::{Applied, Shared, Writer};

pub use schema::{Migration, MIGRATIONS, SCHEMA_VERSION};

/// Opens (creating and migrating) the SQLite ledger at `location`, the part of
/// `sqlite://PATH` after the scheme.
pub async fn open(location: &str, options: StoreOptions) -> Result<Arc<dyn Store>> {
    Ok(Arc::new(SqliteStore::open(location, options).await?))
}

/// Tuning of the SQLite store beyond [`StoreOptions`]; the defaults suit a gateway.
#[derive(Debug, Clone)]
pub struct SqliteSettings {
    /// How long a connection waits for another one's lock (another process writing)
    /// before the operation fails as unavailable.
    pub busy_timeout: Duration,
    /// The most commands the writer commits in one transaction.
    pub group_size: usize,
    /// The most reads at once, and so the most read connections open.
    pub readers: usize,
    /// How often a waiter's instance checks for commits of other instances.
    pub watch_interval: Duration,
    /// How often the checkpointer copies committed WAL frames into the database file.
    pub checkpoint_every: Duration,
    /// The WAL length, in pages, past which the writer finishes a checkpoint between two
    /// groups so that its next write starts the WAL over (under steady load a passive
    /// checkpoint alone never lets it, and the file would grow without end).
    pub wal_restart_pages: u32,
}

impl Default for SqliteSettings {
    fn default() -> SqliteSettings {
        SqliteSettings {
            busy_timeout: schema::DEFAULT_BUSY_TIMEOUT,
            group_size: 256,
            readers: 8,
            watch_interval: readers::WATCH_INTERVAL,
            checkpoint_every: checkpoint::EVERY,
            wal_restart_pages: checkpoint::RESTART_PAGES,
        }
    }
}

/// The SQLite ledger. Several instances (in one process or several) may open the same
/// file; each has its own writer thread, and SQLite's write lock orders them.
pub struct SqliteStore {
    path: PathBuf,
    writer: Writer,
    readers: Arc<Readers>,
    waiters: Arc<Waiters>,
    watcher: Watcher,
    /// Completed records, served to `claim` and `lookup` without a blocking thread while
    /// replayable at the store clock's `now` (see `crate::replays`). They stay honest
    /// this way:
    ///
    /// - `add_repeats` and `record_repeats` forget the record after their commit;
    /// - the writer clears the cache whenever another connection (another instance or
    ///   process) has committed, which it sees from `PRAGMA data_version` after each
    ///   group and every few milliseconds while the cache is not empty; so counters
    ///   another instance added show up within that interval;
    /// - the cache's epoch, bumped by every forget and clear, stops a read that started
    ///   before an invalidation from putting its older copy back.
    ///
    /// A record enters when a claim or a lookup reads it, not when it completes.
    cache: Arc<ReplayCache>,
    clock: Arc<dyn Clock>,
    migrated: Vec<u32>,
    durability: Arc<durable::Durability>,
    _checkpointer: checkpoint::Checkpointer,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens the ledger at `path` with default [`SqliteSettings`].
    pub async fn open(path: impl AsRef<Path>, options: StoreOptions) -> Result<SqliteStore> {
        SqliteStore::open_with(path, options, SqliteSettings::default()).await
    }

    /// Opens the ledger at `path`: creates the file if needed, switches it to WAL,
    /// applies pending migrations and starts the writer and watcher threads.
    pub async fn open_with(
        path: impl AsRef<Path>,
        options: StoreOptions,
        settings: SqliteSettings,
    ) -> Result<SqliteStore> {
        let path = path.as_ref().to_path_buf();
        let synchronous = schema::synchronous_mode(&options.sqlite_synchronous)?;
        let clock = options.clock;
        tokio::task::spawn_blocking(move || open_blocking(path, synchronous, clock, settings))
            .await
            .map_err(|e| StoreError::Unavailable(format!("opening the ledger failed: {e}")))?
    }

    /// The file this store writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema versions this open applied (empty when the file was current).
    pub fn migrated(&self) -> &[u32] {
        &self.migrated
    }

    async fn read<T, F>(&self, read: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let found = self.readers.run(read).await?;
        // What the read saw may be committed but not yet synced ([`durable`]).
        self.durability.settled().await?;
        Ok(found)
    }

    /// Offers a record read since `epoch` to the replay cache.
    fn offer(&self, epoch: u64, record: &Record) {
        let offset = self.clock.offset().as_millis().min(i64::MAX as u128) as i64;
        self.cache.offer(epoch, record, self.clock.now(), offset);
    }

    /// Applies a fenced or guarded transition to one record inside the writer.
    async fn transition<T, F>(&self, id: &RecordId, change: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Record, Timestamp) -> Result<T, TransitionError> + Send + 'static,
    {
        let id = id.clone();
        self.writer
            .run(move |conn, now| mutate(conn, &id, now, change))
            .await
    }
}

fn open_blocking(
    path: PathBuf,
    synchronous: &'static str,
    clock: Arc<dyn Clock>,
    settings: SqliteSettings,
) -> Result<SqliteStore> {
    let cannot_open = |e: StoreError| {
        StoreError::Config(format!(
            "cannot open the SQLite ledger at {}: {e} (does its directory exist, and may \
             oncely write there?)",
            path.display()
        ))
    };
    owner_only(&path).map_err(|e| cannot_open(StoreError::Unavailable(e.to_string())))?;
    let mut conn = Connection::open_with_flags(
        &path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| cannot_open(sql_error(e)))?;
    schema::configure_common(&conn, settings.busy_timeout).map_err(cannot_open)?;
    // With FULL, the WAL's fsync runs on the syncer thread after SQLite's commit
    // ([`durable`]); the writer's own connection then need not sync in `COMMIT`.
    let pipelined = synchronous == "FULL";
    let writer_sync = if pipelined { "NORMAL" } else { synchronous };
    schema::configure_writer(&conn, writer_sync).map_err(|e| match e {
        StoreError::Config(_) => e,
        other => cannot_open(other),
    })?;
    let migrated = schema::migrate(&mut conn)?;
    // Checkpoints run on a thread of their own ([`checkpoint`]), not inside commits.
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .map_err(sql_error)?;
    let wal = Arc::new(checkpoint::WalState::default());
    let checkpointer = checkpoint::Checkpointer::start(
        &path,
        settings.busy_timeout,
        synchronous,
        settings.checkpoint_every,
        settings.wal_restart_pages,
        Arc::clone(&wal),
    )
    .map_err(cannot_open)?;
    let watch = readers::open_read_only(&path, settings.busy_timeout).map_err(cannot_open)?;
    let waiters = Arc::new(Waiters::default());
    // No margin and no age limit: the writer invalidates on every foreign commit.
    let cache = Arc::new(ReplayCache::default());
    let durability = durable::Durability::new();
    let syncer = if pipelined {
        Some((
            durable::Syncer::start(path.clone(), Arc::clone(&durability)).map_err(cannot_open)?,
            Arc::clone(&durability),
        ))
    } else {
        None
    };
    let writer = Writer::start(
        conn,
        Shared {
            clock: Arc::clone(&clock),
            waiters: Arc::clone(&waiters),
            cache: Arc::clone(&cache),
            group_size: settings.group_size,
            watch_interval: settings.watch_interval,
            wal,
            syncer,
        },
    )?;
    let watcher = Watcher::start(watch, Arc::clone(&waiters), settings.watch_interval)?;
    Ok(SqliteStore {
        readers: Arc::new(Readers::new(
            path.clone(),
            settings.busy_timeout,
            settings.readers,
        )),
        path,
        writer,
        waiters,
        watcher,
        cache,
        clock,
        migrated,
        durability,
        _checkpointer: checkpointer,
    })
}

/// Makes the ledger's files owner-only (0600): the database is created so, its `-wal`
/// and `-shm` files take the database's mode when SQLite creates them, and files left
/// with a wider mode are narrowed.
#[cfg(unix)]
fn owner_only(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let file = Path::new(&name);
        match std::fs::metadata(file) {
            Ok(m) if m.permissions().mode() & 0o077 != 0 => {
                std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))?;
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(not(unix))]
fn owner_only(_path: &Path) -> std::io::Result<()> {
    Ok(())
}

/// Maps a SQLite error: damaged files are corrupt, everything else (busy, locked, I/O,
/// disk full, cannot open, read-only) makes the ledger unavailable.
pub(crate) fn sql_error(e: rusqlite::Error) -> StoreError {
    match &e {
        rusqlite::Error::SqliteFailure(err, _)
            if matches!(
                err.code,
                ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase
            ) =>
        {
            StoreError::Corrupt(e.to_string())
        }
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => StoreError::Corrupt(e.to_string()),
        _ => StoreError::Unavailable(format!("SQLite: {e}")),
    }
}

/// Reads a record, applies `change` to a copy, and writes it back only if allowed.
fn mutate<T>(
    conn: &Connection,
    id: &RecordId,
    now: Timestamp,
    change: impl FnOnce(&mut Record, Timestamp) -> Result<T, TransitionError>,
) -> Result<Applied<T>> {
    let mut record = rows::by_id(conn, id)?.ok_or_else(|| StoreError::NotFound(id.clone()))?;
    let out = change(&mut record, now)?;
    rows::update_state(conn, &record)?;
    Ok((out, Some(id.clone())))
}

/// The atomic claim: the row holding `(scope, key)` decides, inside the writer. A lease
/// met or made here is watched on the monotonic clock `mono` ([`leases`]).
fn claim_in(
    conn: &Connection,
    spec: &ClaimSpec,
    now: Timestamp,
    mono: Duration,
) -> Result<Applied<Claim>> {
    // Most claims are of a new key: try the insert first (what the plan says for no
    // row), and read the row only when one already holds the key. The single writer
    // (and `BEGIN IMMEDIATE` between processes) keeps the two steps one decision.
    let record = Record::new_claim(new_record_id(), spec, now);
    if rows::insert_new(conn, &record)? {
        leases::record_remaining(&record, mono);
        return Ok((Claim::Owned(record), None));
    }
    let Some(existing) = rows::by_key(conn, &spec.scope, &spec.key)? else {
        return Err(StoreError::Unavailable(
            "the insert of a claim met a row that is gone".into(),
        ));
    };
    let plan = plan_claims(std::slice::from_ref(spec), None, now, |_, _| {
        Ok(Some(existing.clone()))
    })?;
    let claim = match plan {
        Err(record) => Claim::Existing(leases::as_observed(record, now, mono)),
        Ok(mut records) => {
            let (replaces, record) = records.pop().expect("a granted plan has a record");
            match replaces {
                // Reclaimed: the same row, attempt + 1.
                Some(old) if old == record.id => rows::update_state(conn, &record)?,
                // Renewed: a new intention under the key, with a new id and identity.
                Some(old) => rows::update(conn, &old, &record)?,
                None => {
                    return Err(StoreError::Unavailable(
                        "a claim planned an insert over a row".into(),
                    ))
                }
            }
            Claim::Owned(record)
        }
    };
    if let Claim::Owned(record) = &claim {
        leases::record_remaining(record, mono);
    }
    Ok((claim, None))
}

#[async_trait]
impl Ledger for SqliteStore {
    async fn claim(&self, spec: &ClaimSpec) -> Result<Claim> {
        // A replayable record answers at once: nothing can take its key before it expires.
        if let Some(r) = self
            .cache
            .get(&spec.scope, &spec.key, Now::Is(self.clock.now()))
        {
            return Ok(Claim::Existing(r));
        }
        let epoch = self.cache.epoch();
        let spec = spec.clone();
        let clock = self.clock.clone();
        let claim = self
            .writer
            .run(move |conn, now| claim_in(conn, &spec, now, clock.monotonic()))
            .await?;
        if let Claim::Existing(r) = &claim {
            self.offer(epoch, r);
        }
        Ok(claim)
    }

    async fn complete(&self, fence: &Fence, completion: Completion) -> Result<Record> {
        let fence = fence.clone();
        let done = self
            .transition(&fence.id.clone(), move |r, now| {
                r.complete(&fence, completion, now)?;
                Ok(r.clone())
            })
            .await?;
        leases::forget(done.id.as_str());
        // Not offered to the replay cache: the first claim or lookup that reads it does.
        Ok(done)
    }

    async fn release(
        &self,
        fence: &Fence,
        error: Option<String>,
        window: Duration,
    ) -> Result<Record> {
        let fence = fence.clone();
        let done = self
            .transition(&fence.id.clone(), move |r, now| {
                r.release(&fence, error, window, now)?;
                Ok(r.clone())
            })
            .await?;
        leases::forget(done.id.as_str());
        Ok(done)
    }

    async fn mark_unknown(&self, fence: &Fence, error: String) -> Result<Record> {
        let fence = fence.clone();
        let done = self
            .transition(&fence.id.clone(), move |r, now| {
                r.mark_unknown(&fence, error, now)?;
                Ok(r.clone())
            })
            .await?;
        leases::forget(done.id.as_str());
        Ok(done)
    }

    async fn renew(&self, fence: &Fence, lease: Duration) -> Result<()> {
        let fence = fence.clone();
        let clock = self.clock.clone();
        self.transition(&fence.id.clone(), move |r, now| {
            r.renew(&fence, lease, now)?;
            leases::record_remaining(r, clock.monotonic());
            Ok(())
        })
        .await
    }

    async fn take_over(
        &self,
        id: &RecordId,
        expected_attempt: u32,
        owner: &str,
        lease: Duration,
    ) -> Result<TakeOverOutcome> {
        let owner = owner.to_string();
        let clock = self.clock.clone();
        self.transition(id, move |r, now| {
            // Lapsed or not is decided on the monotonic clock, not by `now` ([`leases`]).
            if r.state == State::Processing && r.attempt == expected_attempt {
                if !leases::record_remaining(r, clock.monotonic()).is_zero() {
                    return Err(TransitionError::LeaseHeld { id: r.id.clone() });
                }
                r.lease_until = Some(now);
            }
            let outcome = r.take_over(expected_attempt, &owner, lease, now)?;
            leases::record_remaining(r, clock.monotonic());
            Ok(outcome)
        })
        .await
    }

    async fn get(&self, id: &RecordId) -> Result<Option<Record>> {
        let id = id.clone();
        let found = self.read(move |conn| rows::by_id(conn, &id)).await?;
        let (now, mono) = (self.clock.now(), self.clock.monotonic());
        Ok(found.map(|r| leases::as_observed(r, now, mono)))
    }

    async fn lookup(&self, scope: &Scope, key: &str) -> Result<Option<Record>> {
        if let Some(r) = self.cache.get(scope, key, Now::Is(self.clock.now())) {
            return Ok(Some(r));
        }
        let epoch = self.cache.epoch();
        let (scope, key) = (scope.clone(), key.to_string());
        let found = self
            .read(move |conn| rows::by_key(conn, &scope, &key))
            .await?;
        if let Some(r) = &found {
            self.offer(epoch, r);
        }
        Ok(found)
    }

    async fn resolve(&self, id: &RecordId, resolution: Resolution) -> Result<Record> {
        self.transition(id, move |r, now| {
            r.resolve(resolution, now)?;
            Ok(r.clone())
        })
        .await
    }

    async fn add_repeats(&self, id: &RecordId, count: u64, units: u64) -> Result<()> {
        let changed = id.clone();
        let id = id.clone();
        let out = self
            .writer
            .run(move |conn, _now| {
                let changed = conn
                    .prepare_cached(
                        "UPDATE records SET repeats = repeats + ?1, \
                         repeat_units = repeat_units + ?2 WHERE id = ?3",
                    )
                    .and_then(|mut st| st.execute(params![count as i64, units as i64, id.0]))
                    .map_err(sql_error)?;
                if changed == 0 {
                    return Err(StoreError::NotFound(id));
                }
                Ok(((), None))
            })
            .await;
        // After the commit: later lookups read the new counters.
        self.cache.forget(&changed);
        out
    }

    async fn record_repeats(&self, id: &RecordId, events: &[Repeat]) -> Result<()> {
        let changed = id.clone();
        let id = id.clone();
        let events = events.to_vec();
        let out = self
            .writer
            .run(move |conn, _now| {
                repeats::record(conn, &id, &events)?;
                Ok(((), None))
            })
            .await;
        // After the commit: later lookups read the new counters.
        self.cache.forget(&changed);
        out
    }

    async fn now(&self) -> Result<Timestamp> {
        Ok(self.clock.now())
    }

    async fn ping(&self) -> Result<()> {
        self.read(|conn| {
            conn.query_row("SELECT 1", [], |_| Ok(()))
                .map_err(sql_error)
        })
        .await?;
        // The writer too: a ledger that can be read but not written is not healthy.
        self.writer.run(|_, _| Ok(((), None))).await
    }
}

#[async_trait]
impl Waiting for SqliteStore {
    async fn wait_for(&self, id: &RecordId, timeout: Duration) -> Result<Record> {
        wait_until_settled(&self.waiters, id, timeout, || {
            // Called after the subscription exists: the watcher now sees a waiter and
            // checks for other instances' commits until it is gone.
            self.watcher.nudge();
            self.get(id)
        })
        .await
    }
}

#[async_trait]
impl Admin for SqliteStore {
    async fn list(&self, filter: &ListFilter) -> Result<Vec<Record>> {
        let filter = filter.clone();
        self.read(move |conn| rows::list(conn, &filter)).await
    }

    async fn purge_expired(&self) -> Result<u64> {
        self.writer
            .run(|conn, now| {
                let gone = conn
                    .prepare_cached(
                        "DELETE FROM records WHERE (state = 'completed' \
                         AND (expires_at IS NULL OR expires_at <= ?1)) \
                         OR (state = 'released' AND expires_at <= ?1)",
                    )
                    .and_then(|mut st| st.execute([now.0]))
                    .map_err(sql_error)?;
                repeats::purge(conn, now)?;
                Ok((gone as u64, None))
            })
            .await
    }

    async fn repeat_events(
        &self,
        principal: &str,
        since: Option<Timestamp>,
        limit: usize,
    ) -> Result<RepeatEvents> {
        let principal = principal.to_string();
        self.read(move |conn| repeats::list(conn, &principal, since, limit))
            .await
    }

    async fn usage(&self, since: Option<Timestamp>) -> Result<Usage> {
        let rows = self.read(move |conn| rows::usage_rows(conn, since)).await?;
        Ok(usage_from_rows(rows))
    }

    async fn secret(&self, name: &str) -> Result<Vec<u8>> {
        let name = name.to_string();
        self.writer
            .run(move |conn, _now| {
                let fresh = rand::random::<[u8; 32]>().to_vec();
                conn.prepare_cached("INSERT OR IGNORE INTO secrets (name, value) VALUES (?1, ?2)")
                    .and_then(|mut st| st.execute(params![name, fresh]))
                    .map_err(sql_error)?;
                let value: Option<Vec<u8>> = conn
                    .prepare_cached("SELECT value FROM secrets WHERE name = ?1")
                    .and_then(|mut st| st.query_row([&name], |row| row.get(0)).optional())
                    .map_err(sql_error)?;
                let value = value.ok_or_else(|| {
                    StoreError::Unavailable(format!("the secret {name:?} was not kept"))
                })?;
                Ok((value, None))
            })
            .await
    }

    async fn reconcile_schedule(&self, id: &RecordId) -> Result<Option<ReconcileSchedule>> {
        self.reconcile_get(id).await
    }

    async fn schedule_reconcile(
        &self,
        id: &RecordId,
        seen: ReconcileSchedule,
        next: ReconcileSchedule,
    ) -> Result<bool> {
        self.reconcile_set(id, seen, next).await
    }
}
