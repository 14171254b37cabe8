//! The writer thread: the one connection that writes, committing waiting commands in
//! groups.
//!
//! Callers send a [`Command`] over a channel and await its reply. The thread takes the
//! first command and whatever else is already waiting (up to a group's size), runs them
//! all in one `BEGIN IMMEDIATE ... COMMIT`, and only then, once the commit is durable,
//! replies: an answer means the change is on disk. With `synchronous=FULL` one fsync is
//! shared by the whole group, which is what makes FULL affordable under load; that fsync
//! runs on the syncer thread ([`super::durable`]), and the group's callers are answered
//! (and its waiters woken) once it is done.
//!
//! While the syncer is still busy with the last commit, the next group waits and takes
//! in the commands that arrive (up to a group's size), and runs when the sync is done:
//! its callers would have waited for that next sync anyway, and one commit of many
//! commands writes each page it shares (the tables' and indexes' last pages) into the
//! WAL once, where many small commits wrote it again each time. No transaction is open
//! while it waits, so other connections (the CLI, other instances) can write then.
//!
//! Each command reads its row, applies the pure transition of `oncely_core::record`, and
//! writes the row back only if the transition was allowed, so a refused transition
//! changes nothing and does not disturb the rest of the group. A command writes with at
//! most one statement, which SQLite makes atomic on its own; if an error rolls back the
//! whole transaction (disk full, I/O error), or the commit fails, every command of the
//! group is answered `StoreError::Unavailable`.

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use oncely_core::{RecordId, Timestamp};
use rusqlite::Connection;
use tokio::sync::oneshot;

use super::checkpoint::{self, WalState};
use super::durable::{Batch, Durability, Syncer};
use super::error::sql_error;
use crate::replays::ReplayCache;
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
    tx: Sender<Box<dyn Command>>,
}

impl Writer {
    /// Starts the writer thread on `conn`.
    pub(super) fn start(conn: Connection, shared: Shared) -> Result<Writer> {
        let (tx, rx) = crossbeam_channel::unbounded::<Box<dyn Command>>();
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

/// What woke the writer while commands were waiting for the syncer.
enum Event {
    Command(Box<dyn Command>),
    /// The syncer finished a sync (or stopped).
    Synced,
    /// Every handle is gone.
    Closed,
}

fn run(conn: Connection, rx: Receiver<Box<dyn Command>>, shared: Shared) {
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
    // The last commit handed to the syncer: the next group waits until it is durable.
    let mut handed = 0;
    let mut rounds = syncer
        .as_ref()
        .map_or_else(crossbeam_channel::never, |(s, _)| s.rounds());
    // The syncer thread ended early (it panicked): nothing is worth waiting for, and
    // each commit handed to it is answered as failed.
    let mut syncer_gone = false;
    let mut version = data_version(&conn);
    let mut foreign_commits = |conn: &Connection| {
        let now = data_version(conn);
        if now.is_none() || now != version {
            version = now;
            cache.clear();
        }
    };
    loop {
        let event = if group.is_empty() {
            // An idle writer still looks for other connections' commits while the cache
            // holds records, so that their counters are not shown stale for long.
            match rx.recv_timeout(watch_interval) {
                Ok(c) => Event::Command(c),
                Err(RecvTimeoutError::Timeout) => {
                    if !cache.is_empty() {
                        foreign_commits(&conn);
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        } else {
            crossbeam_channel::select! {
                recv(rx) -> c => c.map_or(Event::Closed, Event::Command),
                recv(rounds) -> r => {
                    if r.is_err() {
                        syncer_gone = true;
                        rounds = crossbeam_channel::never();
                    }
                    Event::Synced
                }
            }
        };
        let closed = matches!(event, Event::Closed);
        if let Event::Command(first) = event {
            group.push(first);
            while group.len() < group_size {
                match rx.try_recv() {
                    Ok(c) => group.push(c),
                    Err(_) => break,
                }
            }
        }
        // While the syncer is busy with the last commit, the next group waits and takes
        // in what arrives (no transaction is open meanwhile, so other connections can
        // write): its callers would wait for the next sync anyway, and one commit of
        // many commands writes each shared page (the tables' and indexes' last pages)
        // once, where many small commits wrote it again each time.
        let syncer_free = syncer_gone || syncer.as_ref().is_none_or(|(_, d)| d.through(handed));
        if !group.is_empty() && (syncer_free || closed || group.len() >= group_size) {
            if let Some(seq) = commit(&conn, &mut group, clock.as_ref(), &syncer, &waiters, &wal) {
                handed = seq;
            }
            foreign_commits(&conn);
        }
        if closed {
            break;
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

/// Runs the group in one transaction (first starting the WAL over, when the checkpointer
/// asked) and has its callers answered: by the syncer once the commit is durable
/// (returns the commit's sequence number), or at once (without a syncer, or when the
/// group failed).
fn commit(
    conn: &Connection,
    group: &mut Vec<Box<dyn Command>>,
    clock: &dyn Clock,
    syncer: &Option<(Syncer, Arc<Durability>)>,
    waiters: &Arc<Waiters>,
    wal: &WalState,
) -> Option<u64> {
    let mut woken = Vec::new();
    // After a failed fsync nothing more is written: what the kernel could not flush may
    // be gone, and a later success would hide that.
    let lost = syncer.as_ref().and_then(|(_, d)| d.failure());
    if lost.is_none() && wal.restart.swap(false, Ordering::AcqRel) {
        restart_wal(conn);
    }
    let (failed, seq) = match lost {
        Some(why) => (Some(why), None),
        None => apply_all(
            conn,
            group,
            clock,
            &mut woken,
            syncer.as_ref().map(|(_, d)| d),
        ),
    };
    let commands = std::mem::replace(group, Vec::with_capacity(group.capacity()));
    if failed.is_none() {
        wal.dirty.store(true, Ordering::Release);
    }
    match (syncer, seq) {
        (Some((syncer, _)), Some(seq)) if failed.is_none() => {
            // Answered once the syncer has made this commit durable.
            let waiters = Arc::clone(waiters);
            syncer.push(Batch {
                seq,
                done: Box::new(move |failed| {
                    if failed.is_none() {
                        for id in &woken {
                            waiters.wake(id);
                        }
                    }
                    for c in commands {
                        c.finish(failed);
                    }
                }),
            });
            Some(seq)
        }
        (syncer, seq) => {
            if let Some(why) = &failed {
                tracing::warn!(commands = commands.len(), error = %why, "a ledger write group failed");
            } else {
                for id in &woken {
                    waiters.wake(id);
                }
            }
            for c in commands {
                c.finish(failed.as_deref());
            }
            let (Some((syncer, _)), Some(seq)) = (syncer, seq) else {
                return None;
            };
            // Nothing of this group was committed; its number still has to be passed,
            // or reads that counted it would wait for it forever.
            syncer.push(Batch {
                seq,
                done: Box::new(|_| {}),
            });
            Some(seq)
        }
    }
}

/// `BEGIN IMMEDIATE`, every command of the group, `COMMIT`; returns why the group failed
/// as a whole, if it did, and the commit's sequence number when one was counted.
fn apply_all(
    conn: &Connection,
    group: &mut [Box<dyn Command>],
    clock: &dyn Clock,
    woken: &mut Vec<RecordId>,
    durability: Option<&Arc<Durability>>,
) -> (Option<String>, Option<u64>) {
    if let Err(e) = run_cached(conn, "BEGIN IMMEDIATE") {
        return (Some(sql_error(e).to_string()), None);
    }
    for c in group.iter_mut() {
        let outcome = c.apply(conn, clock.now());
        if conn.is_autocommit() {
            // SQLite rolled the whole transaction back (I/O error, disk full): the
            // earlier commands of the group are lost too.
            let why = outcome.err().unwrap_or_default();
            woken.clear();
            return (
                Some(format!("the ledger's transaction was rolled back: {why}")),
                None,
            );
        }
        if let Ok(Some(id)) = outcome {
            woken.push(id);
        }
    }
    // The sequence number is counted before `COMMIT` makes the group visible: a read
    // that sees the commit then also sees the number, and waits for its sync
    // ([`Durability::settled`]).
    let seq = durability.map(|d| d.commit());
    match run_cached(conn, "COMMIT") {
        Ok(()) => (None, seq),
        Err(e) => {
            let why = sql_error(e).to_string();
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            woken.clear();
            (Some(why), seq)
        }
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

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    use super::*;
    use crate::SystemClock;

    const GROUP: usize = 16;

    fn shared(syncer: Option<(Syncer, Arc<Durability>)>, wal: Arc<WalState>) -> Shared {
        Shared {
            clock: Arc::new(SystemClock),
            waiters: Arc::default(),
            cache: Arc::default(),
            group_size: GROUP,
            watch_interval: Duration::from_millis(50),
            wal,
            syncer,
        }
    }

    fn writer() -> Writer {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (n INTEGER)").unwrap();
        Writer::start(conn, shared(None, Arc::default())).unwrap()
    }

    /// A writer on a WAL-mode file at `db` (checkpoints only when asked, as the store's
    /// writer), with a syncer whose fsync is `sync`.
    fn piped_writer(
        db: &Path,
        sync: impl FnMut() -> std::io::Result<()> + Send + 'static,
        wal: Arc<WalState>,
    ) -> (Writer, Arc<Durability>) {
        let conn = Connection::open(db).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
             PRAGMA wal_autocheckpoint = 0; CREATE TABLE t (n INTEGER);",
        )
        .unwrap();
        let durability = Durability::new();
        let syncer =
            Syncer::start_with(db.with_extension("db-wal"), Arc::clone(&durability), sync).unwrap();
        let w = Writer::start(conn, shared(Some((syncer, Arc::clone(&durability))), wal)).unwrap();
        (w, durability)
    }

    async fn insert(w: &Writer, n: i64) -> Result<()> {
        w.run(move |conn, _| {
            conn.execute("INSERT INTO t VALUES (?1)", [n])
                .map_err(sql_error)?;
            Ok(((), None))
        })
        .await
    }

    /// How many rows `t` holds, read through the writer.
    async fn rows(w: &Writer) -> i64 {
        w.run(|conn, _| {
            let n = conn
                .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
                .map_err(sql_error)?;
            Ok((n, None))
        })
        .await
        .unwrap()
    }

    async fn until(what: impl Fn() -> bool) {
        let start = Instant::now();
        while !what() {
            assert!(start.elapsed() < Duration::from_secs(10), "timed out");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn while_a_sync_runs_the_next_commands_gather_into_groups_of_at_most_the_size() {
        let dir = tempfile::tempdir().unwrap();
        // The fsync stalls until the test opens it, as a slow disk would.
        let open = Arc::new(AtomicBool::new(false));
        let syncs = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (w, durability) = piped_writer(
            &dir.path().join("l.db"),
            {
                let (open, syncs) = (Arc::clone(&open), Arc::clone(&syncs));
                move || {
                    syncs.fetch_add(1, Ordering::AcqRel);
                    while !open.load(Ordering::Acquire) {
                        thread::sleep(Duration::from_millis(1));
                    }
                    Ok(())
                }
            },
            Arc::default(),
        );
        // The first command commits at once (the syncer is idle) and its sync stalls.
        let first = tokio::spawn({
            let w = w.clone();
            async move { insert(&w, 0).await }
        });
        until(|| syncs.load(Ordering::Acquire) == 1).await;
        assert_eq!(durability.committed(), 1);
        // Two full groups and three more arrive while it stalls.
        let many = 2 * GROUP + 3;
        let callers: Vec<_> = (1..=many as i64)
            .map(|n| {
                let w = w.clone();
                tokio::spawn(async move { insert(&w, n).await })
            })
            .collect();
        // A full group does not wait for the sync; the three left over do.
        until(|| durability.committed() == 3).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            durability.committed(),
            3,
            "the three left over committed early"
        );
        assert!(
            !first.is_finished(),
            "answered before its commit was synced"
        );
        assert!(callers.iter().all(|c| !c.is_finished()));
        open.store(true, Ordering::Release);
        first.await.unwrap().unwrap();
        for c in callers {
            c.await.unwrap().unwrap();
        }
        // The three left over went in one group, after the sync.
        assert_eq!(durability.committed(), 4);
        let n = rows(&w).await;
        assert_eq!(n, many as i64 + 1);
    }

    #[tokio::test]
    async fn a_panicking_sync_fails_the_writes_and_reads_instead_of_leaving_them_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let (w, durability) = piped_writer(
            &dir.path().join("l.db"),
            || panic!("the disk driver fell over"),
            Arc::default(),
        );
        let limit = Duration::from_secs(10);
        for n in 0..3 {
            let answer = tokio::time::timeout(limit, insert(&w, n))
                .await
                .expect("a write waited for a dead syncer");
            assert!(
                matches!(&answer, Err(StoreError::Unavailable(m)) if m.contains("panicked")),
                "{answer:?}"
            );
        }
        // A read (a replay, a join) that saw those commits is refused, not left waiting.
        let read = tokio::time::timeout(limit, durability.settled())
            .await
            .expect("a read waited for a dead syncer");
        assert!(matches!(read, Err(StoreError::Unavailable(_))), "{read:?}");
    }

    #[tokio::test]
    async fn after_a_failed_sync_the_writer_writes_nothing_not_even_a_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        let fail = Arc::new(AtomicBool::new(false));
        let wal = Arc::new(WalState::default());
        let (w, durability) = piped_writer(
            &db,
            {
                let fail = Arc::clone(&fail);
                move || {
                    if fail.load(Ordering::Acquire) {
                        Err(std::io::Error::other("EIO"))
                    } else {
                        Ok(())
                    }
                }
            },
            Arc::clone(&wal),
        );
        for n in 0..20 {
            insert(&w, n).await.unwrap();
        }
        fail.store(true, Ordering::Release);
        let err = insert(&w, 20).await.unwrap_err();
        assert!(err.to_string().contains("EIO"), "{err}");
        assert!(durability.failure().is_some());
        let read = |p: &Path| std::fs::read(p).unwrap();
        let (db_before, wal_before) = (read(&db), read(&db.with_extension("db-wal")));
        // The checkpointer asks for the WAL to be started over: the writer must not copy
        // frames whose sync failed into the database file.
        wal.restart.store(true, Ordering::Release);
        for n in 21..24 {
            let err = insert(&w, n).await.unwrap_err();
            assert!(err.to_string().contains("EIO"), "{err}");
        }
        assert_eq!(read(&db), db_before, "the database file changed");
        assert_eq!(
            read(&db.with_extension("db-wal")),
            wal_before,
            "the WAL changed"
        );
        assert!(wal.restart.load(Ordering::Acquire), "the restart was taken");
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
        insert(&w, 1).await.unwrap();
        let n = rows(&w).await;
        assert_eq!(n, 1);
    }
}
