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

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::{schema, sql_error};
use crate::{Result, StoreError};

/// How often the checkpointer looks for commits to copy into the database file.
pub(super) const EVERY: Duration = Duration::from_millis(100);

/// Stops its thread when dropped.
#[derive(Debug)]
pub(super) struct Checkpointer {
    stop: Arc<AtomicBool>,
}

impl Checkpointer {
    /// Starts checkpointing `path`; `dirty` is set by the writer after each commit.
    pub(super) fn start(
        path: &Path,
        busy_timeout: Duration,
        synchronous: &str,
        dirty: Arc<AtomicBool>,
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
                while !stopped.load(Ordering::Relaxed) {
                    thread::sleep(EVERY);
                    if dirty.swap(false, Ordering::AcqRel) {
                        if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                            tracing::debug!(error = %e, "a WAL checkpoint failed; trying again later");
                            dirty.store(true, Ordering::Release);
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
