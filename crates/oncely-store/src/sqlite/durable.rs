//! The WAL's fsync on a thread of its own, so that the writer runs the next group while
//! the last one is being made durable.
//!
//! With `synchronous = FULL` SQLite fsyncs the WAL inside `COMMIT`, on the writer thread:
//! while the disk flushes (about a millisecond here), no other write can run, and under
//! load the writer spent about a third of its time waiting so. With `FULL` asked for, the
//! writer's connection runs `synchronous = NORMAL` instead (SQLite then writes the WAL
//! frames at commit without syncing them; it still syncs the WAL header when it starts
//! the WAL over, and a checkpoint syncs the WAL before copying it) and hands each
//! committed group to the syncer, which `fdatasync`s the WAL file and only then answers
//! the group's callers and wakes their waiters. One fsync covers every group committed
//! before it, so groups that commit while a sync runs share the next one.
//!
//! What a caller sees is unchanged: an answer still means the change is on disk. Reads
//! on the read connections can see a group committed but not yet synced, so
//! [`Durability::settled`] lets a read wait until everything committed before it is
//! durable before it is answered: a replay or a join is never answered from a completion
//! a power cut could take back.
//!
//! A failed fsync is final (the kernel may have dropped the pages it could not write):
//! the store answers every later write and read `Unavailable` until it is reopened, and
//! the callers of the unsynced groups get `Unavailable`, as if the process had died
//! before answering.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;

use tokio::sync::watch;

use crate::{Result, StoreError};

/// Where syncing stands: everything committed up to a sequence number is durable, or a
/// sync failed and nothing more will be.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Synced {
    Upto(u64),
    Failed(String),
}

/// Commit sequence numbers and how far they are durable.
#[derive(Debug)]
pub(super) struct Durability {
    /// The sequence number of the last committed group (the writer counts them).
    committed: AtomicU64,
    synced: watch::Sender<Synced>,
}

impl Durability {
    pub(super) fn new() -> Arc<Durability> {
        Arc::new(Durability {
            committed: AtomicU64::new(0),
            synced: watch::Sender::new(Synced::Upto(0)),
        })
    }

    /// Counts one group about to commit; returns its sequence number. Counted before the
    /// `COMMIT`, so that no read can see the group's changes and not its number.
    pub(super) fn commit(&self) -> u64 {
        self.committed.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Waits until every group committed before this call is durable. Call it after a
    /// read, before using what the read saw.
    pub(super) async fn settled(&self) -> Result<()> {
        let seen = self.committed.load(Ordering::Acquire);
        let mut rx = self.synced.subscribe();
        let state = rx
            .wait_for(|s| {
                matches!(s, Synced::Failed(_)) || matches!(s, Synced::Upto(n) if *n >= seen)
            })
            .await
            .map_err(|_| StoreError::Unavailable("the ledger's syncer has stopped".into()))?;
        match &*state {
            Synced::Failed(why) => Err(StoreError::Unavailable(why.clone())),
            Synced::Upto(_) => Ok(()),
        }
    }

    /// How many groups have been counted (committed or about to be).
    #[cfg(test)]
    pub(super) fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// Why the store can no longer write, if a sync failed.
    pub(super) fn failure(&self) -> Option<String> {
        match &*self.synced.borrow() {
            Synced::Failed(why) => Some(why.clone()),
            Synced::Upto(_) => None,
        }
    }

    /// Whether every group up to `seq` is synced, or syncing has failed (then nothing
    /// more will be, and waiting for it is pointless).
    pub(super) fn through(&self, seq: u64) -> bool {
        match &*self.synced.borrow() {
            Synced::Upto(n) => *n >= seq,
            Synced::Failed(_) => true,
        }
    }

    fn synced_upto(&self, seq: u64) {
        self.synced.send_if_modified(|s| match s {
            Synced::Upto(n) if *n < seq => {
                *n = seq;
                true
            }
            _ => false,
        });
    }

    fn fail(&self, why: String) {
        self.synced.send_replace(Synced::Failed(why));
    }
}

/// What a batch does once synced: `None`, or why the sync failed.
pub(super) type Then = Box<dyn FnOnce(Option<&str>) + Send>;

/// A committed group waiting for its fsync: its sequence number and what to do once it
/// is durable (answer the callers, wake the waiters), or once it cannot be.
pub(super) struct Batch {
    pub(super) seq: u64,
    pub(super) done: Then,
}

/// The handle the writer hands committed groups to.
pub(super) struct Syncer {
    tx: mpsc::Sender<Batch>,
    thread: thread::JoinHandle<()>,
    rounds: crossbeam_channel::Receiver<()>,
}

impl Syncer {
    /// Starts the syncer thread for the WAL of the database at `db`.
    pub(super) fn start(db: PathBuf, durability: Arc<Durability>) -> Result<Syncer> {
        let mut wal = db.into_os_string();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        let mut file: Option<File> = None;
        let path = wal.clone();
        Syncer::start_with(wal, durability, move || sync(&path, &mut file))
    }

    /// Starts the syncer thread with `sync` as the fsync of the WAL at `wal` (tests stall
    /// it, fail it or panic in it).
    pub(super) fn start_with(
        wal: PathBuf,
        durability: Arc<Durability>,
        sync: impl FnMut() -> std::io::Result<()> + Send + 'static,
    ) -> Result<Syncer> {
        let (tx, rx) = mpsc::channel::<Batch>();
        // One pending signal is enough: the writer reads where syncing stands anyway.
        let (round, rounds) = crossbeam_channel::bounded(1);
        let thread = thread::Builder::new()
            .name("oncely-sqlite-sync".into())
            .spawn(move || run(wal, sync, rx, durability, round))
            .map_err(|e| StoreError::Unavailable(format!("cannot start the ledger syncer: {e}")))?;
        Ok(Syncer { tx, thread, rounds })
    }

    /// Signalled after each sync (each round of batches answered): the writer, gathering
    /// the next group while a sync runs, commits it then.
    pub(super) fn rounds(&self) -> crossbeam_channel::Receiver<()> {
        self.rounds.clone()
    }

    /// Syncs and answers what is queued, then stops the thread. The writer calls it
    /// before closing its connection, which may checkpoint and remove the WAL.
    pub(super) fn finish(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }

    /// Queues a committed group; if the syncer is gone, the group is answered as failed.
    pub(super) fn push(&self, batch: Batch) {
        if let Err(mpsc::SendError(batch)) = self.tx.send(batch) {
            (batch.done)(Some("the ledger's syncer has stopped"));
        }
    }
}

fn run(
    wal: PathBuf,
    mut sync: impl FnMut() -> std::io::Result<()>,
    rx: mpsc::Receiver<Batch>,
    durability: Arc<Durability>,
    round: crossbeam_channel::Sender<()>,
) {
    let mut waiting: Vec<Batch> = Vec::new();
    while let Ok(first) = rx.recv() {
        waiting.push(first);
        while let Ok(more) = rx.try_recv() {
            waiting.push(more);
        }
        let upto = waiting.iter().map(|b| b.seq).max().unwrap_or(0);
        let outcome = match durability.failure() {
            Some(why) => Err(why),
            None => {
                // A panic in the sync is a failed sync: left to unwind, it would end the
                // thread with its groups unanswered and every later read waiting for a
                // sync that never comes.
                let synced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut sync))
                    .unwrap_or_else(|_| Err(std::io::Error::other("the fsync panicked")));
                synced.map_err(|e| {
                    let why = format!(
                        "syncing the ledger's WAL ({}) failed: {e}; the ledger refuses writes until oncely restarts",
                        wal.display()
                    );
                    tracing::error!(error = %e, wal = %wal.display(), "syncing the ledger's WAL failed; refusing writes until restart");
                    durability.fail(why.clone());
                    why
                })
            }
        };
        if outcome.is_ok() {
            durability.synced_upto(upto);
        }
        let failed = outcome.err();
        for batch in waiting.drain(..) {
            (batch.done)(failed.as_deref());
        }
        let _ = round.try_send(());
    }
}

/// `fdatasync` of the WAL file (opened on first use: it exists once the writer has
/// committed in WAL mode), after checking that the file held open is still the one at
/// the WAL's path. A WAL removed or replaced from under the store (a careless clean-up,
/// a failing disk remounted) would otherwise sync fine: SQLite goes on writing to the
/// unlinked file, and what it holds is gone at the next open, so that is a failed sync
/// too. The check is one `stat` per sync, not per write.
fn sync(wal: &Path, file: &mut Option<File>) -> std::io::Result<()> {
    let at_path = std::fs::metadata(wal)?;
    let file = match file {
        Some(file) => {
            if !same_file(&file.metadata()?, &at_path) {
                return Err(std::io::Error::other(
                    "the WAL file was removed or replaced while the ledger was open",
                ));
            }
            file
        }
        None => file.insert(File::open(wal)?),
    };
    file.sync_data()
}

/// Whether two metadata describe one file (device and inode).
#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Whether two metadata describe one file (not told apart off Unix).
#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    /// How each batch was finished: its sequence number and the failure, if any.
    type Log = Arc<Mutex<Vec<(u64, Option<String>)>>>;

    /// A batch that records how it was finished.
    fn batch(seq: u64, log: &Log) -> Batch {
        let log = Arc::clone(log);
        Batch {
            seq,
            done: Box::new(move |failed| {
                log.lock().unwrap().push((seq, failed.map(str::to_string)));
            }),
        }
    }

    async fn until(what: impl Fn() -> bool) {
        for _ in 0..500 {
            if what() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out");
    }

    #[tokio::test]
    async fn a_read_waits_until_what_was_committed_before_it_is_synced() {
        let durability = Durability::new();
        // Nothing committed: a read is answered at once.
        durability.settled().await.unwrap();
        let seq = durability.commit();
        let waiting = tokio::spawn({
            let d = Arc::clone(&durability);
            async move { d.settled().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !waiting.is_finished(),
            "a read answered before the commit it saw was synced"
        );
        durability.synced_upto(seq);
        waiting.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn groups_are_answered_after_the_wal_is_synced() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("l.db");
        std::fs::write(dir.path().join("l.db-wal"), b"frames").unwrap();
        let durability = Durability::new();
        let syncer = Syncer::start(db, Arc::clone(&durability)).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        for _ in 0..3 {
            syncer.push(batch(durability.commit(), &log));
        }
        until(|| log.lock().unwrap().len() == 3).await;
        assert!(log
            .lock()
            .unwrap()
            .iter()
            .all(|(_, failed)| failed.is_none()));
        durability.settled().await.unwrap();
        assert!(durability.failure().is_none());
    }

    #[tokio::test]
    async fn a_failed_sync_fails_its_groups_and_every_later_one() {
        // No WAL file to sync: the sync fails, as a disk error would.
        let dir = tempfile::tempdir().unwrap();
        let durability = Durability::new();
        let syncer = Syncer::start(dir.path().join("missing.db"), Arc::clone(&durability)).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        syncer.push(batch(durability.commit(), &log));
        until(|| log.lock().unwrap().len() == 1).await;
        let why = durability.failure().expect("the failure is kept");
        assert!(why.contains("refuses writes"), "{why}");
        // A WAL that appears later does not make the store trust itself again.
        std::fs::write(dir.path().join("missing.db-wal"), b"frames").unwrap();
        syncer.push(batch(durability.commit(), &log));
        until(|| log.lock().unwrap().len() == 2).await;
        assert!(log
            .lock()
            .unwrap()
            .iter()
            .all(|(_, failed)| failed.is_some()));
        assert!(matches!(
            durability.settled().await,
            Err(StoreError::Unavailable(_))
        ));
    }
    #[test]
    fn a_wal_removed_or_replaced_after_it_was_opened_fails_the_sync() {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("ledger.db-wal");
        std::fs::write(&wal, b"frames").unwrap();
        let mut file = None;
        sync(&wal, &mut file).expect("the WAL at its path syncs");
        assert!(file.is_some(), "held open for the next sync");
        sync(&wal, &mut file).expect("and again");

        // Removed while held open: syncing the unlinked file would succeed, and lose it.
        std::fs::remove_file(&wal).unwrap();
        let err = sync(&wal, &mut file).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");

        // Replaced by another file at the same path.
        std::fs::write(&wal, b"other frames").unwrap();
        let err = sync(&wal, &mut file).unwrap_err();
        assert!(err.to_string().contains("removed or replaced"), "{err}");
    }
}
