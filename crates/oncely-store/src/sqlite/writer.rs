//! The writer thread: the one connection that writes, committing waiting commands in
//! groups.
//!
//! Callers send a [`Command`] over a channel and await its reply. The thread takes the
//! first command, drains whatever else is already waiting (up to a group's size), runs
//! them all in one `BEGIN IMMEDIATE ... COMMIT`, and only then replies: an answer means
//! the change is on disk. With `synchronous=FULL` one fsync is then shared by the whole
//! group, which is what makes FULL affordable under load; that fsync runs on the syncer
//! thread ([`super::durable`]) while this thread goes on with the next group, and the
//! group's callers are answered (and its waiters woken) once it is done.
//!
//! Each command reads its row, applies the pure transition of `oncely_core::record`, and
//! writes the row back only if the transition was allowed, so a refused transition
//! changes nothing and does not disturb the rest of the group. A command writes with at
//! most one statement, which SQLite makes atomic on its own; if an error rolls back the
//! whole transaction (disk full, I/O error), or the commit fails, every command of the
//! group is answered `StoreError::Unavailable`.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use oncely_core::{RecordId, Timestamp};
use rusqlite::Connection;
use tokio::sync::oneshot;

use super::checkpoint::{self, WalState};
use super::durable::{Batch, Durability, Syncer};
use super::replays::ReplayCache;
use super::sql_error;
use crate::waiters::Waiters;
use crate::{Clock, Result, StoreError};

/// What a command's work returns: its answer, and the record whose waiters to wake after
/// the commit.
pub(super) type Applied<T> = (T, Option<RecordId>);

/// One unit of work for the writer, type-erased so one channel carries them all.
trait Command: Send {
    /// Runs the work inside the open transaction; returns the record to wake, if any, or
    /// the work's error as text.
    fn apply(&mut self, conn: &Connection, now: Timestamp) -> Result<Option<RecordId>, String>;
    /// Sends the answer: the work's own result, or `failed` when the group did not commit.
    fn finish(self: Box<Self>, failed: Option<&str>);
}

struct Pending<T, F> {
    work: Option<F>,
    result: Option<Result<T>>,
    reply: oneshot::Sender<Result<T>>,
}

impl<T, F> Command for Pending<T, F>
where
    T: Send + 'static,
    F: FnOnce(&Connection, Timestamp) -> Result<Applied<T>> + Send + 'static,
{
    fn apply(&mut self, conn: &Connection, now: Timestamp) -> Result<Option<RecordId>, String> {
        let work = self.work.take().expect("a command runs once");
        // A panic in one command must not take the writer (and every later write) down
        // with it: it becomes that command's error, like a refused transition.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(conn, now)))
            .unwrap_or_else(|panic| {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                tracing::error!(error = %why, "a ledger write panicked; the writer carries on");
                Err(StoreError::Unavailable(format!(
                    "the ledger write failed: {why}"
                )))
            });
        match outcome {
            Ok((value, wake)) => {
                self.result = Some(Ok(value));
                Ok(wake)
            }
            Err(e) => {
                let text = e.to_string();
                self.result = Some(Err(e));
                Err(text)
            }
        }
    }

    fn finish(self: Box<Self>, failed: Option<&str>) {
        let answer = match failed {
            Some(why) => Err(StoreError::Unavailable(why.to_string())),
            None => self.result.unwrap_or_else(|| {
                Err(StoreError::Unavailable(
                    "the ledger writer skipped a command".into(),
                ))
            }),
        };
        // The caller may have gone away (cancelled request); the change stands anyway.
        let _ = self.reply.send(answer);
    }
}

/// The handle callers send commands through. Dropping every handle stops the thread.
#[derive(Debug, Clone)]
pub(super) struct Writer {
    tx: mpsc::Sender<Box<dyn Command>>,
}

impl Writer {
    /// Starts the writer thread on `conn`.
    pub(super) fn start(conn: Connection, shared: Shared) -> Result<Writer> {
        let (tx, rx) = mpsc::channel::<Box<dyn Command>>();
        thread::Builder::new()
            .name("oncely-sqlite-writer".into())
            .spawn(move || run(conn, rx, shared))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the ledger writer: {e}")))?;
        Ok(Writer { tx })
    }

    /// Runs `work` in the next group and answers after it is committed.
    pub(super) async fn run<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, Timestamp) -> Result<Applied<T>> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let command = Box::new(Pending {
            work: Some(work),
            result: None,
            reply,
        });
        self.tx
            .send(command)
            .map_err(|_| StoreError::Unavailable("the ledger writer has stopped".into()))?;
        answer.await.map_err(|_| {
            StoreError::Unavailable("the ledger writer stopped before answering".into())
        })?
    }
}

/// What the writer thread shares with the store.
pub(super) struct Shared {
    /// The store's clock.
    pub(super) clock: Arc<dyn Clock>,
    /// This instance's waiters, woken after each commit.
    pub(super) waiters: Arc<Waiters>,
    /// Completed records, cleared when another connection commits.
    pub(super) cache: Arc<ReplayCache>,
    /// The most commands in one transaction.
    pub(super) group_size: usize,
    /// How often an idle writer checks for other connections' commits while the cache
    /// holds records.
    pub(super) watch_interval: Duration,
    /// Shared with the checkpointer: set after each commit (frames to copy); read before
    /// each group (start the WAL over).
    pub(super) wal: Arc<WalState>,
    /// With `synchronous = FULL`: the thread that fsyncs the WAL after each commit, and
    /// the commit sequence it reports durable. `None`: SQLite syncs (or does not) in
    /// `COMMIT` itself.
    pub(super) syncer: Option<(Syncer, Arc<Durability>)>,
}

/// `PRAGMA data_version` of the writer's connection: it changes only when another
/// connection commits.
fn data_version(conn: &Connection) -> Option<i64> {
    conn.prepare_cached("PRAGMA data_version")
        .and_then(|mut stmt| stmt.query_row([], |row| row.get(0)))
        .ok()
}

/// Runs a statement without parameters from the connection's statement cache (`BEGIN`
/// and `COMMIT` run for every group; `execute_batch` would parse them each time).
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

fn run(conn: Connection, rx: mpsc::Receiver<Box<dyn Command>>, shared: Shared) {
    let Shared {
        clock,
        waiters,
        cache,
        group_size,
        watch_interval,
        wal,
        syncer,
    } = shared;
    let group_size = group_size.max(1);
    let mut group: Vec<Box<dyn Command>> = Vec::with_capacity(group_size);
    let mut woken: Vec<RecordId> = Vec::new();
    let mut version = data_version(&conn);
    let mut foreign_commits = |conn: &Connection| {
        let now = data_version(conn);
        if now.is_none() || now != version {
            version = now;
            cache.clear();
        }
    };
    loop {
        // An idle writer still looks for other connections' commits while the cache
        // holds records, so that their counters are not shown stale for long.
        let first = match rx.recv_timeout(watch_interval) {
            Ok(c) => c,
            Err(RecvTimeoutError::Timeout) => {
                if !cache.is_empty() {
                    foreign_commits(&conn);
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        if wal.restart.swap(false, Ordering::AcqRel) {
            restart_wal(&conn);
        }
        group.push(first);
        while group.len() < group_size {
            match rx.try_recv() {
                Ok(c) => group.push(c),
                Err(_) => break,
            }
        }
        // After a failed fsync nothing more is written: what the kernel could not flush
        // may be gone, and a later success would hide that.
        let lost = syncer.as_ref().and_then(|(_, d)| d.failure());
        // The group's sequence number is counted before its `COMMIT` makes it visible:
        // a read that sees the commit then also sees the number, and waits for its sync
        // ([`Durability::settled`]).
        let seq = syncer.as_ref().map(|(_, d)| d.commit());
        let failed = match lost {
            Some(why) => Some(why),
            None => commit_group(&conn, &mut group, clock.as_ref(), &mut woken),
        };
        if failed.is_none() {
            wal.dirty.store(true, Ordering::Release);
        }
        foreign_commits(&conn);
        if let Some(why) = &failed {
            tracing::warn!(commands = group.len(), error = %why, "a ledger write group failed");
            woken.clear();
            if let (Some((syncer, _)), Some(seq)) = (&syncer, seq) {
                // Nothing of this group was committed; its number still has to be
                // passed, or reads that counted it would wait for it forever.
                syncer.push(Batch {
                    seq,
                    done: Box::new(|_| {}),
                });
            }
        } else if let (Some((syncer, _)), Some(seq)) = (&syncer, seq) {
            // Answered once the syncer has made this commit durable.
            let done = std::mem::replace(&mut group, Vec::with_capacity(group_size));
            let wake = std::mem::take(&mut woken);
            let waiters = Arc::clone(&waiters);
            syncer.push(Batch {
                seq,
                done: Box::new(move |failed| {
                    if failed.is_none() {
                        for id in &wake {
                            waiters.wake(id);
                        }
                    }
                    for c in done {
                        c.finish(failed);
                    }
                }),
            });
            continue;
        }
        for id in woken.drain(..) {
            waiters.wake(&id);
        }
        for c in group.drain(..) {
            c.finish(failed.as_deref());
        }
    }
    if let Some((syncer, _)) = syncer {
        syncer.finish();
    }
    // Every handle is gone: close the connection (SQLite checkpoints the WAL on close).
    if let Err((_, e)) = conn.close() {
        tracing::warn!(error = %e, "closing the ledger writer connection failed");
    }
}

/// Copies what the checkpointer has not yet copied of the WAL, so that the next write
/// starts the WAL over at the beginning of the file ([`super::checkpoint`]). Runs between
/// two groups: no write of this connection is under way, so nothing new is appended
/// while it copies. The checkpoint syncs the WAL before copying it, so it never copies a
/// frame that a power cut could take back.
fn restart_wal(conn: &Connection) {
    match checkpoint::passive(conn) {
        Ok((pages, copied)) => {
            tracing::debug!(pages, copied, "checkpointed the WAL to start it over");
        }
        Err(e) => tracing::debug!(error = %e, "a WAL checkpoint of the writer failed"),
    }
}

/// Runs one group in one transaction; returns why it failed as a whole, if it did.
fn commit_group(
    conn: &Connection,
    group: &mut [Box<dyn Command>],
    clock: &dyn Clock,
    woken: &mut Vec<RecordId>,
) -> Option<String> {
    if let Err(e) = run_cached(conn, "BEGIN IMMEDIATE") {
        return Some(sql_error(e).to_string());
    }
    for c in group.iter_mut() {
        let outcome = c.apply(conn, clock.now());
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back (I/O error, disk full): the
            // earlier commands of the group are lost too.
            let why = outcome.err().unwrap_or_default();
            return Some(format!("the ledger's transaction was rolled back: {why}"));
        }
        if let Ok(Some(id)) = outcome {
            woken.push(id);
        }
    }
    match run_cached(conn, "COMMIT") {
        Ok(()) => None,
        Err(e) => {
            let why = sql_error(e).to_string();
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            Some(why)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SystemClock;

    fn writer() -> Writer {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (n INTEGER)").unwrap();
        Writer::start(
            conn,
            Shared {
                clock: Arc::new(SystemClock),
                waiters: Arc::default(),
                cache: Arc::default(),
                group_size: 16,
                watch_interval: Duration::from_millis(50),
                wal: Arc::default(),
                syncer: None,
            },
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_panicking_command_does_not_stop_the_writer() {
        let w = writer();
        let err = w
            .run(|_, _| -> Result<Applied<()>> { panic!("boom") })
            .await
            .unwrap_err();
        assert!(
            matches!(&err, StoreError::Unavailable(m) if m.contains("boom")),
            "{err:?}"
        );
        // The writer still commits what comes next.
        w.run(|conn, _| {
            conn.execute("INSERT INTO t VALUES (1)", [])
                .map_err(sql_error)?;
            Ok(((), None))
        })
        .await
        .unwrap();
        let n: i64 = w
            .run(|conn, _| {
                let n = conn
                    .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                    .map_err(sql_error)?;
                Ok((n, None))
            })
            .await
            .unwrap();
        assert_eq!(n, 1);
    }
}
