//! Read connections, and the watcher that notices commits made by other connections.
//!
//! Reads run on a small pool of read-only connections inside `spawn_blocking`, never on
//! a tokio worker. In WAL mode they do not wait for the writer and see every committed
//! group.
//!
//! SQLite has no notification between connections, so a waiter in this instance learns
//! about a completion made by another instance (another process on the same file) from
//! the watcher: while anyone waits here, it reads `PRAGMA data_version` every
//! [`WATCH_INTERVAL`] and wakes every waiter when the number changes. Completions made
//! by this instance's own writer wake their waiters directly, without the watcher.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::Semaphore;

use super::error::sql_error;
use super::schema;
use crate::waiters::Waiters;
use crate::{Result, StoreError};

/// How often the watcher looks for commits of other connections while someone waits.
pub(super) const WATCH_INTERVAL: Duration = Duration::from_millis(10);

/// A pool of read-only connections. At most `size` reads run at once, so the pool never
/// opens more than `size` connections; further reads wait their turn without a thread.
#[derive(Debug)]
pub(super) struct Readers {
    path: PathBuf,
    busy_timeout: Duration,
    idle: Mutex<Vec<Connection>>,
    turns: Semaphore,
}

/// Opens a read-only connection to the ledger at `path`.
pub(super) fn open_read_only(path: &Path, busy_timeout: Duration) -> Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sql_error)?;
    schema::configure_common(&conn, busy_timeout)?;
    Ok(conn)
}

impl Readers {
    /// A pool of up to `size` connections, opened as reads need them.
    pub(super) fn new(path: PathBuf, busy_timeout: Duration, size: usize) -> Readers {
        Readers {
            path,
            busy_timeout,
            idle: Mutex::new(Vec::new()),
            turns: Semaphore::new(size.max(1)),
        }
    }

    /// Runs `read` on a pooled connection on tokio's blocking threads.
    pub(super) async fn run<T, F>(self: &Arc<Self>, read: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let _turn = self
            .turns
            .acquire()
            .await
            .map_err(|_| StoreError::Unavailable("the ledger's readers are closed".into()))?;
        let pool = Arc::clone(self);
        tokio::task::spawn_blocking(move || pool.run_here(read))
            .await
            .map_err(|e| StoreError::Unavailable(format!("a ledger read did not finish: {e}")))?
    }

    /// Runs `read` on a pooled connection on the current (blocking) thread.
    fn run_here<T>(&self, read: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.idle.lock().expect("reader pool lock").pop();
        let conn = match conn {
            Some(c) => c,
            None => open_read_only(&self.path, self.busy_timeout)?,
        };
        let out = read(&conn);
        self.idle.lock().expect("reader pool lock").push(conn);
        out
    }
}

/// The watcher thread's handle; dropping it stops the thread.
#[derive(Debug)]
pub(super) struct Watcher {
    stop: Arc<AtomicBool>,
    thread: thread::Thread,
}

impl Watcher {
    /// Starts watching the ledger at `path` for the waiters in `waiters`.
    pub(super) fn start(
        conn: Connection,
        waiters: Arc<Waiters>,
        interval: Duration,
    ) -> Result<Watcher> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = thread::Builder::new()
            .name("oncely-sqlite-watch".into())
            .spawn(move || watch(conn, waiters, flag, interval))
            .map_err(|e| {
                StoreError::Unavailable(format!("cannot start the ledger watcher: {e}"))
            })?;
        Ok(Watcher {
            stop,
            thread: handle.thread().clone(),
        })
    }

    /// Tells the watcher that someone waits (it sleeps while nobody does).
    pub(super) fn nudge(&self) {
        self.thread.unpark();
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

fn data_version(conn: &Connection) -> Option<i64> {
    conn.query_row("PRAGMA data_version", [], |row| row.get(0))
        .ok()
}

fn watch(conn: Connection, waiters: Arc<Waiters>, stop: Arc<AtomicBool>, interval: Duration) {
    let mut last = data_version(&conn);
    while !stop.load(Ordering::SeqCst) {
        if waiters.is_empty() {
            // Nobody waits: sleep until a waiter nudges (or a while passes). `last` stays
            // as it was, so a commit made meanwhile is still seen as a change.
            thread::park_timeout(Duration::from_millis(500));
            continue;
        }
        let now = data_version(&conn);
        if now.is_none() || now != last {
            // Something committed (or the read failed): every waiter re-reads its record.
            last = now;
            waiters.wake_all();
        }
        thread::sleep(interval);
    }
}
