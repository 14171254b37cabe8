//! WAL checkpoints on a thread of their own, so that the writer's group commits never
//! wait for one.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses its threshold
//! (1000 pages), on the writer thread: under load that was ~6% of the gateway's CPU, all
//! of it on the one thread every write waits for. The writer turns it off
//! (`wal_autocheckpoint = 0`) and this thread, on a connection of its own, runs a
//! `PASSIVE` checkpoint every [`EVERY`] when the writer committed since the last one. A
//! passive checkpoint takes no lock the writer needs; the writer starts the WAL over once
//! a checkpoint has copied all of it. Other processes on the file (the CLI, other
//! instances) keep SQLite's own checkpoints.
//!
//! Under steady load that never happens on its own: while this thread copies, the writer
//! appends, so no passive checkpoint ever ends with the whole WAL copied, SQLite never
//! starts the WAL over, and the file grows without end (1.1 GB in ten seconds of fresh
//! requests). Every frame then extends the file: new blocks, zeroed pages, and an
//! `fdatasync` that has to commit the file's size too. So when a checkpoint finds the
//! WAL longer than `SqliteSettings::wal_restart_pages`, it asks
//! the writer to finish the job: between two groups, with no write under way, the writer
//! runs a passive checkpoint of its own, which has only the frames appended since this
//! thread's to copy and so copies them all, and its next write starts the WAL over from
//! the beginning of the file (unless a read still uses the old frames; then the next
//! request tries again).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::error::sql_error;
use super::schema;
use crate::{Result, StoreError};

/// How often the checkpointer looks for commits to copy into the database file.
pub(super) const EVERY: Duration = Duration::from_millis(100);

/// The WAL length (pages) past which the writer is asked to start the WAL over: 16 MiB
/// with 4 KiB pages, one segment of SQLite's WAL index.
pub(super) const RESTART_PAGES: u32 = 4096;

/// The most WAL pages the writer is left to copy when it starts the WAL over: the
/// checkpointer copies again, without waiting, until what its pass left is no more.
pub(super) const LEFT_TO_WRITER: i64 = 256;

/// What the checkpointer and the writer share.
#[derive(Debug, Default)]
pub(super) struct WalState {
    /// Set by the writer after each commit: there are frames to copy.
    pub(super) dirty: AtomicBool,
    /// Set by the checkpointer when the WAL has grown past the limit: the writer should
    /// finish a checkpoint so that its next write starts the WAL over.
    pub(super) restart: AtomicBool,
}

/// Runs a passive checkpoint on `conn`; returns the WAL's length and how much of it is
/// now copied into the database file, in pages.
pub(super) fn passive(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
        Ok((row.get(1)?, row.get(2)?))
    })
}

/// Stops its thread when dropped.
#[derive(Debug)]
pub(super) struct Checkpointer {
    stop: Arc<AtomicBool>,
}

impl Checkpointer {
    /// Starts checkpointing `path` every `every`; asks the writer (through `wal`) to
    /// start the WAL over once it is longer than `restart_pages`.
    pub(super) fn start(
        path: &Path,
        busy_timeout: Duration,
        synchronous: &str,
        every: Duration,
        restart_pages: u32,
        wal: Arc<WalState>,
    ) -> Result<Checkpointer> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(sql_error)?;
        schema::configure_common(&conn, busy_timeout)?;
        // A checkpoint syncs the database file as this connection's setting says.
        conn.pragma_update(None, "synchronous", synchronous)
            .map_err(sql_error)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        thread::Builder::new()
            .name("oncely-sqlite-ckpt".into())
            .spawn(move || {
                let mut again = false;
                while !stopped.load(Ordering::Relaxed) {
                    if !std::mem::take(&mut again) {
                        thread::sleep(every);
                    }
                    if !wal.dirty.swap(false, Ordering::AcqRel) {
                        continue;
                    }
                    match passive(&conn) {
                        // The writer is asked only once what is left for it to copy is
                        // little: on a big ledger every frame is a page of the file at
                        // a random place, and the writer holds every claim while it
                        // copies and syncs. Until then this thread copies again at once,
                        // unless the WAL has grown to four times its limit meanwhile
                        // (writes faster than this thread copies): then the writer is
                        // asked all the same, so that the WAL stays bounded.
                        Ok((pages, copied))
                            if pages > i64::from(restart_pages)
                                && pages <= 4 * i64::from(restart_pages)
                                && pages - copied > LEFT_TO_WRITER =>
                        {
                            wal.dirty.store(true, Ordering::Release);
                            again = true;
                        }
                        Ok((pages, _)) if pages > i64::from(restart_pages) => {
                            wal.restart.store(true, Ordering::Release);
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::debug!(error = %e, "a WAL checkpoint failed; trying again later");
                            wal.dirty.store(true, Ordering::Release);
                        }
                    }
                }
            })
            .map_err(|e| {
                StoreError::Unavailable(format!("cannot start the ledger checkpointer: {e}"))
            })?;
        Ok(Checkpointer { stop })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
