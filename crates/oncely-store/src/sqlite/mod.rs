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
//! The store's traits are implemented in `ledger` (claims and transitions), `queue`
//! (the task queue) and `admin`, and wake-ups here; `rows` maps records to rows.
//!
//! Every transition is the pure one of `oncely_core::record`, run inside the writer's
//! transaction; the single writer (and `BEGIN IMMEDIATE` between processes) makes each
//! read-decide-write atomic. Nothing here blocks a tokio worker.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use oncely_core::{Record, RecordId};
use rusqlite::{Connection, OpenFlags};

use crate::replays::ReplayCache;
use crate::waiters::{wait_until_settled, Waiters};
use crate::{Clock, Ledger, Result, Store, StoreError, StoreOptions, Waiting};

mod admin;
mod checkpoint;
mod churn;
mod durable;
mod error;
mod ledger;
mod queue;
mod readers;
mod reconcile;
mod repeats;
mod rows;
pub mod schema;
mod usage;
mod writer;

use error::sql_error;
use readers::{Readers, Watcher};
use writer::{Shared, Writer};

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
    /// What this instance knows of the churn table (`crate::churn`): read whole on open,
    /// and kept by this instance's writes. (Another process on the same file tells it
    /// nothing: made-up keys are recognised across instances on PostgreSQL.)
    churn: Arc<crate::ChurnFilter>,
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
    // Processes that open one new file at the same moment (parallel `oncely mcp`
    // wrappers) race to switch it to WAL and to migrate it. Switching to WAL takes the
    // file's exclusive lock without waiting on the busy handler, so a lock held by
    // another opener is waited out here, within the busy timeout; both steps are
    // idempotent (the migration is one transaction that reads the version first).
    let deadline = std::time::Instant::now() + settings.busy_timeout;
    let migrated = loop {
        let attempt =
            schema::configure_writer(&conn, writer_sync).and_then(|()| schema::migrate(&mut conn));
        match attempt {
            Err(StoreError::Unavailable(m))
                if is_locked(&m) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(StoreError::Config(m)) => return Err(StoreError::Config(m)),
            Err(StoreError::Unavailable(m)) => return Err(cannot_open(StoreError::Unavailable(m))),
            other => break other?,
        }
    };
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
    let churn = Arc::new(crate::ChurnFilter::default());
    churn.reload(SqliteStore::live_churn(&watch, clock.now())?);
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
        churn,
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

/// Whether an error says the file is locked by another connection (`SQLITE_BUSY`).
fn is_locked(message: &str) -> bool {
    message.contains("database is locked") || message.contains("database is busy")
}
