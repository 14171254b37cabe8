//! The conformance suite against the SQLite store, and what only a file can show:
//! durability across reopen, migrations, durability modes and a ledger that cannot write.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use oncely_core::{Class, State};
use oncely_store::sqlite::{SqliteSettings, SqliteStore, SCHEMA_VERSION};
use oncely_store::{Admin, Claim, Ledger, ManualClock, Store, StoreError, StoreOptions, TaskQueue};
use oncely_store_conformance::{completion, spec, Harness};
use tempfile::TempDir;

/// A temporary directory with `ledger.db`; every store shares one manual clock.
struct SqliteHarness {
    dir: TempDir,
    clock: ManualClock,
}

impl SqliteHarness {
    fn new() -> SqliteHarness {
        SqliteHarness {
            dir: tempfile::tempdir().expect("temp dir"),
            clock: ManualClock::new(),
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("ledger.db")
    }

    fn options(&self) -> StoreOptions {
        StoreOptions {
            clock: Arc::new(self.clock.clone()),
            ..StoreOptions::default()
        }
    }

    async fn open(&self) -> SqliteStore {
        SqliteStore::open(self.path(), self.options())
            .await
            .expect("open the SQLite ledger")
    }
}

#[async_trait]
impl Harness for SqliteHarness {
    type Store = dyn Store;

    async fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.open().await)
    }

    async fn second(&self) -> Arc<dyn Store> {
        // Its own connections, writer thread, watcher and waiters: like another process.
        Arc::new(self.open().await)
    }

    fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }
}

oncely_store_conformance::conformance_tests!(SqliteHarness::new());

fn owned(c: Claim) -> oncely_core::Record {
    match c {
        Claim::Owned(r) => r,
        Claim::Existing(r) => panic!("expected to own the claim, found {r:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_record_survives_close_and_reopen() {
    let h = SqliteHarness::new();
    let store = h.open().await;
    let r = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    store
        .complete(&r.fence().unwrap(), completion("{\"kept\":true}", 9))
        .await
        .unwrap();
    let pending = owned(
        store
            .claim(&spec("alice", "p", "{}", Class::Action, "a"))
            .await
            .unwrap(),
    );
    drop(store);

    let reopened = h.open().await;
    assert!(
        reopened.migrated().is_empty(),
        "the schema was already there"
    );
    let again = reopened
        .claim(&spec("alice", "k", "{}", Class::Write, "b"))
        .await
        .unwrap();
    let Claim::Existing(replay) = again else {
        panic!("the completed record was lost on reopen: {again:?}")
    };
    assert_eq!(replay.id, r.id);
    assert_eq!(replay.state, State::Completed);
    assert_eq!(
        replay.response.unwrap().body.as_deref(),
        Some(&b"{\"kept\":true}"[..])
    );
    assert_eq!(replay.units, 9);
    let still = reopened.get(&pending.id).await.unwrap().unwrap();
    assert_eq!(still.state, State::Processing);
    assert_eq!(still.owner.as_deref(), Some("a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_a_migrated_file_is_a_no_op() {
    let h = SqliteHarness::new();
    let first = h.open().await;
    assert_eq!(first.migrated(), (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    let secret = first.secret("k").await.unwrap();
    drop(first);
    for _ in 0..2 {
        let again = h.open().await;
        assert!(again.migrated().is_empty());
        assert_eq!(again.secret("k").await.unwrap(), secret);
    }
    let conn = rusqlite::Connection::open(h.path()).unwrap();
    let version: u32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

/// A SQLite file with the schema of an older oncely: `MIGRATIONS[..version]`, exactly
/// as that release applied them.
fn old_ledger(path: &std::path::Path, version: u32) -> rusqlite::Connection {
    use oncely_store::sqlite::MIGRATIONS;
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    for m in &MIGRATIONS[..version as usize] {
        conn.execute_batch(m.sql).unwrap();
    }
    conn.pragma_update(None, "user_version", version).unwrap();
    conn
}

/// One record as a release before schema 6 wrote it (scope and key as text, the response
/// on the record's row).
struct OldRow<'a> {
    id: &'a str,
    spec: oncely_core::ClaimSpec,
    state: &'a str,
    owner: Option<&'a str>,
    attempt: i64,
    lease_until: Option<i64>,
    created_at: i64,
    completed_at: Option<i64>,
    expires_at: Option<i64>,
    response: Option<(i64, &'a str, &'a [u8])>,
    units: i64,
    repeats: i64,
    last_error: Option<&'a str>,
}

impl OldRow<'_> {
    fn insert(&self, conn: &rusqlite::Connection) {
        let s = &self.spec;
        let (status, headers, body) = match self.response {
            Some((status, headers, body)) => (Some(status), Some(headers), Some(body)),
            None => (None, None, None),
        };
        conn.execute(
            "INSERT INTO records (id, scope, key, fingerprint, class, route, principal, state, \
             owner, attempt, lease_until, created_at, updated_at, completed_at, expires_at, \
             status, headers, body, units, repeats, repeat_units, workflow_id) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?12, ?13, ?14, ?15, \
             ?16, ?17, ?18, ?19, ?19 * 4, 'wf-old')",
            rusqlite::params![
                self.id,
                s.scope.as_str(),
                s.key,
                s.fingerprint.to_hex(),
                s.class.as_str(),
                s.route,
                s.principal,
                self.state,
                self.owner,
                self.attempt,
                self.lease_until,
                self.created_at,
                self.completed_at,
                self.expires_at,
                status,
                headers,
                body,
                self.units,
                self.repeats,
            ],
        )
        .unwrap();
        if let Some(error) = self.last_error {
            conn.execute(
                "UPDATE records SET last_error = ?2 WHERE id = ?1",
                rusqlite::params![self.id, error],
            )
            .unwrap();
        }
    }
}

/// A ledger of schema 4 (no usage history, repeat events without `count`, and repeats
/// counted on records alone by older releases) is upgraded, and usage keeps everything
/// the records held, before and after their purge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_of_the_previous_schema_keeps_its_usage() {
    use oncely_store::Clock;
    let h = SqliteHarness::new();
    let now = h.clock.now().0;
    let conn = old_ledger(&h.path(), 4);
    let window = oncely_store_conformance::WINDOW.as_millis() as i64;
    OldRow {
        id: "rec_old_1",
        spec: spec("alice", "k", "{}", Class::Write, "a"),
        state: "completed",
        owner: Some("a"),
        attempt: 1,
        lease_until: None,
        created_at: now - 10,
        completed_at: Some(now - 5),
        expires_at: Some(now - 5 + window),
        response: Some((201, "[]", b"{}")),
        units: 4,
        repeats: 5,
        last_error: None,
    }
    .insert(&conn);
    let route = spec("alice", "k", "{}", Class::Write, "a").identity.route;
    for kind in ["joined", "replayed"] {
        conn.execute(
            "INSERT INTO repeat_events (record_id, principal, route, at, kind, units, expires_at) \
             VALUES ('rec_old_1', 'alice', ?1, ?2, ?3, 4, ?4)",
            rusqlite::params![route, now - 2, kind, now - 5 + window],
        )
        .unwrap();
    }
    drop(conn);
    let store = h.open().await;
    assert_eq!(store.migrated(), vec![5, 6, 7, 8]);
    let expect = (1, 4, 5, 20);
    let totals = |u: oncely_store::Usage| {
        let t = u.totals;
        (t.fresh, t.fresh_units, t.repeats, t.repeat_units)
    };
    assert_eq!(totals(store.usage(None).await.unwrap()), expect);
    h.advance(oncely_store_conformance::WINDOW + Duration::from_secs(1));
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    assert_eq!(
        totals(store.usage(None).await.unwrap()),
        expect,
        "the purge kept it"
    );
    let events = store.repeat_events("alice", None, 10).await.unwrap();
    assert_eq!((events.total, events.listed.len()), (5, 0));
}

/// A ledger of schema 5 (the last before the write path's: scope and key as text, the
/// response on the record's row, four listing indexes) is rebuilt in place, and every
/// record in it reads, replays, lists and purges as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_of_schema_5_is_upgraded_in_place() {
    use oncely_core::RecordId;
    use oncely_store::{Clock, ListFilter};
    let h = SqliteHarness::new();
    let now = h.clock.now().0;
    let window = oncely_store_conformance::WINDOW.as_millis() as i64;
    let lease = oncely_store_conformance::LEASE.as_millis() as i64;
    let conn = old_ledger(&h.path(), 5);
    let row = |id, key, state| OldRow {
        id,
        spec: spec("alice", key, "{}", Class::Write, "a"),
        state,
        owner: Some("a"),
        attempt: 1,
        lease_until: None,
        created_at: now - 100,
        completed_at: None,
        expires_at: None,
        response: None,
        units: 0,
        repeats: 0,
        last_error: None,
    };
    OldRow {
        created_at: now - 400,
        completed_at: Some(now - 390),
        expires_at: Some(now - 390 + window),
        response: Some((201, r#"[["x-render-id","r-1"]]"#, b"{\"done\":1}")),
        units: 7,
        repeats: 2,
        ..row("rec_0001", "done", "completed")
    }
    .insert(&conn);
    OldRow {
        created_at: now - 300,
        expires_at: Some(now - 290 + window),
        last_error: Some("upstream said 503"),
        ..row("rec_0002", "released", "released")
    }
    .insert(&conn);
    OldRow {
        created_at: now - 200,
        last_error: Some("timed out"),
        ..row("rec_0003", "unknown", "outcome_unknown")
    }
    .insert(&conn);
    OldRow {
        created_at: now - 100,
        lease_until: Some(now + lease),
        ..row("rec_0004", "running", "processing")
    }
    .insert(&conn);
    drop(conn);

    let store = h.open().await;
    assert_eq!(store.migrated(), vec![6, 7, 8]);
    // Every record reads back as it was.
    let done = store
        .get(&RecordId("rec_0001".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.state, State::Completed);
    assert_eq!((done.units, done.repeats, done.repeat_units), (7, 2, 8));
    let response = done.response.clone().unwrap();
    assert_eq!(response.status, 201);
    assert_eq!(response.headers, vec![("x-render-id".into(), "r-1".into())]);
    assert_eq!(response.body.as_deref(), Some(&b"{\"done\":1}"[..]));
    assert_eq!(done.workflow_id.as_deref(), Some("wf-old"));
    let released = store
        .get(&RecordId("rec_0002".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(released.state, State::Released);
    assert_eq!(released.last_error.as_deref(), Some("upstream said 503"));
    assert!(released.response.is_none());
    let unknown = store
        .get(&RecordId("rec_0003".into()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(unknown.state, State::OutcomeUnknown);
    // Claims find them by key through the new claim index.
    let again = store
        .claim(&spec("alice", "done", "{}", Class::Write, "b"))
        .await
        .unwrap();
    let Claim::Existing(replay) = again else {
        panic!("the completed record was not found by its key: {again:?}")
    };
    assert_eq!(replay.id.0, "rec_0001");
    assert_eq!(replay.response, done.response);
    let running = store
        .claim(&spec("alice", "running", "{}", Class::Write, "b"))
        .await
        .unwrap();
    assert!(
        matches!(&running, Claim::Existing(r) if r.id.0 == "rec_0004" && r.state == State::Processing),
        "{running:?}"
    );
    let reclaimed = owned(
        store
            .claim(&spec("alice", "released", "{}", Class::Write, "b"))
            .await
            .unwrap(),
    );
    assert_eq!(
        (reclaimed.id.0.as_str(), reclaimed.attempt),
        ("rec_0002", 2)
    );
    let fresh = owned(
        store
            .claim(&spec("alice", "new", "{}", Class::Write, "b"))
            .await
            .unwrap(),
    );
    // Newest first: the new claim, then the old ones by age.
    let all = store.list(&ListFilter::default()).await.unwrap();
    let ids: Vec<&str> = all.iter().map(|r| r.id.0.as_str()).collect();
    assert_eq!(
        ids,
        vec![
            fresh.id.0.as_str(),
            "rec_0004",
            "rec_0003",
            "rec_0002",
            "rec_0001"
        ]
    );
    let unknowns = store
        .list(&ListFilter {
            state: Some(State::OutcomeUnknown),
            ..ListFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(unknowns.len(), 1);
    assert_eq!(unknowns[0].id.0, "rec_0003");
    // The completed one's usage before and after its purge.
    let fresh_units = |u: oncely_store::Usage| (u.totals.fresh, u.totals.fresh_units);
    assert_eq!(fresh_units(store.usage(None).await.unwrap()), (1, 7));
    h.advance(oncely_store_conformance::WINDOW + Duration::from_secs(1));
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    assert!(store
        .get(&RecordId("rec_0001".into()))
        .await
        .unwrap()
        .is_none());
    assert_eq!(fresh_units(store.usage(None).await.unwrap()), (1, 7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_through_the_url() {
    let h = SqliteHarness::new();
    let url = format!("sqlite://{}", h.path().display());
    let store = oncely_store::open(&url, h.options()).await.unwrap();
    let r = owned(
        store
            .claim(&spec("alice", "u", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    assert!(h.path().exists());
    assert_eq!(store.get(&r.id).await.unwrap().unwrap().id, r.id);
}

/// The ledger's files are owner-only: a new ledger is created so (its `-wal` and `-shm`
/// take the database's mode), and files left readable by others are narrowed on open.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_files_are_owner_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let files = |db: &std::path::Path| {
        ["", "-wal", "-shm"].map(|s| PathBuf::from(format!("{}{s}", db.display())))
    };
    let h = SqliteHarness::new();
    let store = h.open().await;
    store
        .claim(&spec("alice", "u", "{}", Class::Write, "a"))
        .await
        .unwrap();
    for f in files(&h.path()) {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
    drop(store);
    let old = h.dir.path().join("old.db");
    std::fs::write(&old, b"").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
    let store = SqliteStore::open(&old, h.options()).await.unwrap();
    store
        .claim(&spec("alice", "u", "{}", Class::Write, "a"))
        .await
        .unwrap();
    for f in files(&old) {
        assert_eq!(mode(&f), 0o600, "{}", f.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_normal_works_and_off_is_refused() {
    let h = SqliteHarness::new();
    let options = StoreOptions {
        sqlite_synchronous: "normal".into(),
        ..h.options()
    };
    let store = SqliteStore::open(h.path(), options).await.unwrap();
    let r = owned(
        store
            .claim(&spec("alice", "n", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    store
        .complete(&r.fence().unwrap(), completion("{}", 1))
        .await
        .unwrap();
    drop(store);
    let reopened = h.open().await;
    assert_eq!(
        reopened.get(&r.id).await.unwrap().unwrap().state,
        State::Completed
    );

    let off = StoreOptions {
        sqlite_synchronous: "OFF".into(),
        ..h.options()
    };
    let err = SqliteStore::open(h.dir.path().join("off.db"), off)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Config(m) if m.contains("synchronous")),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_cannot_be_created_is_a_clear_error() {
    let h = SqliteHarness::new();
    let missing = h.dir.path().join("no-such-dir").join("ledger.db");
    let err = SqliteStore::open(&missing, h.options()).await.unwrap_err();
    let StoreError::Config(message) = &err else {
        panic!("expected a configuration error, got {err:?}")
    };
    assert!(message.contains("no-such-dir"), "{message}");
    assert!(
        message.contains("cannot open the SQLite ledger"),
        "{message}"
    );
    // Through the URL too, and a file where a directory should be.
    let file = h.dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let url = format!("sqlite://{}/ledger.db", file.display());
    let err = oncely_store::open(&url, h.options()).await.unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_is_not_a_ledger_is_refused() {
    let h = SqliteHarness::new();
    std::fs::write(h.path(), vec![b'z'; 8192]).unwrap();
    let err = SqliteStore::open(h.path(), h.options()).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Config(_) | StoreError::Corrupt(_)),
        "{err:?}"
    );
    assert_eq!(
        std::fs::read(h.path()).unwrap(),
        vec![b'z'; 8192],
        "the file is left as it was"
    );
}

/// Another process holds the write lock longer than the busy timeout: the claim fails
/// as unavailable (the gateway then refuses to forward), and works once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_that_cannot_write_is_unavailable_and_loses_nothing() {
    let h = SqliteHarness::new();
    let settings = SqliteSettings {
        busy_timeout: Duration::from_millis(200),
        ..SqliteSettings::default()
    };
    let store = SqliteStore::open_with(h.path(), h.options(), settings)
        .await
        .unwrap();
    let kept = owned(
        store
            .claim(&spec("alice", "before", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );

    let blocker = rusqlite::Connection::open(h.path()).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let during = spec("alice", "during-1", "{}", Class::Write, "a");
    let fence = kept.fence().unwrap();
    let (a, b) = tokio::join!(
        store.claim(&during),
        store.complete(&fence, completion("{}", 1)),
    );
    for err in [a.unwrap_err(), b.unwrap_err()] {
        let StoreError::Unavailable(message) = &err else {
            panic!("expected unavailable, got {err:?}")
        };
        assert!(message.to_lowercase().contains("locked"), "{message}");
    }
    // Reads still work while another connection writes (WAL).
    assert_eq!(
        store.get(&kept.id).await.unwrap().unwrap().state,
        State::Processing
    );
    blocker.execute_batch("ROLLBACK").unwrap();

    let done = store
        .complete(&kept.fence().unwrap(), completion("{}", 1))
        .await
        .unwrap();
    assert_eq!(done.state, State::Completed);
    let later = owned(
        store
            .claim(&spec("alice", "during-1", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    assert_eq!(later.attempt, 1, "the failed claim left no row behind");
}

/// A refused transition in a group does not undo the others committed with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_transition_leaves_its_group_intact() {
    let h = SqliteHarness::new();
    let store = Arc::new(h.open().await);
    let mut records = Vec::new();
    for i in 0..20 {
        records.push(owned(
            store
                .claim(&spec("alice", &format!("g{i}"), "{}", Class::Write, "a"))
                .await
                .unwrap(),
        ));
    }
    let mut tasks = Vec::new();
    for (i, r) in records.iter().enumerate() {
        let store = Arc::clone(&store);
        let mut fence = r.fence().unwrap();
        if i % 2 == 1 {
            fence.owner = "stale".into();
        }
        tasks.push(tokio::spawn(async move {
            store.complete(&fence, completion("{}", 1)).await
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let out = t.await.unwrap();
        assert_eq!(out.is_ok(), i % 2 == 0, "{i}: {out:?}");
    }
    for (i, r) in records.iter().enumerate() {
        let state = store.get(&r.id).await.unwrap().unwrap().state;
        let want = if i % 2 == 0 {
            State::Completed
        } else {
            State::Processing
        };
        assert_eq!(state, want, "record {i}");
    }
}

/// Replays are answered from memory, but counters another instance adds show up soon,
/// and nothing is served past the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_replays_follow_other_instances_and_expiry() {
    let h = SqliteHarness::new();
    let a = h.open().await;
    let b = h.open().await;
    let r = owned(
        a.claim(&spec("alice", "c", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    a.complete(&r.fence().unwrap(), completion("{}", 1))
        .await
        .unwrap();
    let cached = a.lookup(&r.scope, "c").await.unwrap().unwrap();
    assert_eq!(cached.repeats, 0);
    let summed = oncely_store::Repeat {
        at: b.now().await.unwrap(),
        kind: oncely_store::RepeatKind::Replayed,
        count: 2,
        units: 20,
    };
    b.record_repeats(&r.id, &r.principal, &r.route, &[summed])
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_millis(500);
    loop {
        let seen = a.lookup(&r.scope, "c").await.unwrap().unwrap();
        if seen.repeats == 2 {
            assert_eq!(seen.repeat_units, 20);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "instance a still shows {} repeats",
            seen.repeats
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let Claim::Existing(replay) = a
        .claim(&spec("alice", "c", "{}", Class::Write, "z"))
        .await
        .unwrap()
    else {
        panic!("a completed record is replayed")
    };
    assert_eq!(replay.repeats, 2);
    h.clock.advance(oncely_store_conformance::WINDOW);
    let renewed = owned(
        a.claim(&spec("alice", "c", "{}", Class::Write, "z"))
            .await
            .unwrap(),
    );
    assert_ne!(
        renewed.id, r.id,
        "an expired record is never served from memory"
    );
    assert_eq!(
        a.lookup(&r.scope, "c").await.unwrap().unwrap().id,
        renewed.id
    );
}

/// A forward step of the wall clock larger than the lease (the monotonic clock does not
/// move) lapses neither a record's lease nor a task's: a take-over is refused, the
/// record reads as still leased, the task is not leased again and keeps its slot. Once
/// a lease's length has really passed without a renewal, both lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_step_lapses_no_lease() {
    use oncely_core::{TakeOverOutcome, TransitionError};
    use oncely_store_conformance::{new_task, LEASE};
    let h = SqliteHarness::new();
    let store = h.open().await;
    let other = h.open().await;
    let r = owned(
        store
            .claim(&spec("alice", "k", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    other
        .claim_with_task(
            &[spec("stripe", "evt", "{}", Class::Webhook, "ingress")],
            Some(completion("", 0)),
            new_task("{}", 5),
        )
        .await
        .unwrap();
    let leased = other
        .lease_tasks_capped("webhook", "w1", 1, LEASE)
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);

    h.clock.step_wall(Duration::from_secs(3600));
    let now = store.now().await.unwrap();
    let seen = other.get(&r.id).await.unwrap().unwrap();
    assert!(!seen.lease_lapsed(now), "read as still leased: {seen:?}");
    let err = other.take_over(&r.id, 1, "b", LEASE).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Transition(TransitionError::LeaseHeld { .. })
        ),
        "{err:?}"
    );
    assert!(other
        .lease_tasks("webhook", "w2", 10, LEASE)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .lease_tasks_capped("webhook", "w2", 1, LEASE)
        .await
        .unwrap()
        .is_empty());
    // The owner renews after the step, and nothing changes.
    store.renew(&r.fence().unwrap(), LEASE).await.unwrap();
    assert!(other.take_over(&r.id, 1, "b", LEASE).await.is_err());

    h.clock.advance(LEASE + Duration::from_secs(1));
    assert!(matches!(
        other.take_over(&r.id, 1, "b", LEASE).await.unwrap(),
        TakeOverOutcome::Owned(_)
    ));
    let again = other.lease_tasks("webhook", "w2", 10, LEASE).await.unwrap();
    assert_eq!(
        again.len(),
        1,
        "a task whose worker stopped renewing lapses"
    );
    assert_eq!(again[0].attempts, 2);
}

/// With `synchronous = FULL` the WAL is fsynced by the syncer thread before a write is
/// answered. When that sync fails (here: the WAL is gone from under the syncer, as a
/// failing disk would make it), the write that waited is refused, and so is every later
/// write and read: what the kernel could not flush may be lost, so nothing the ledger
/// shows since can be trusted as durable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wal_sync_refuses_the_write_and_every_later_write_and_read() {
    let h = SqliteHarness::new();
    let store = h.open().await;
    // A read connection opened before the failure, which can still read the file.
    assert!(store
        .get(&oncely_store::new_record_id())
        .await
        .unwrap()
        .is_none());
    // A write synced before the failure, so that the syncer holds the WAL open: the
    // unlinked file it holds would still sync, so the syncer must see that the WAL at
    // its path is gone (before that check, this test passed only when nothing had been
    // synced yet).
    let before = spec("carol", "k0", "{}", Class::Write, "c");
    assert!(matches!(
        store.claim(&before).await.unwrap(),
        Claim::Owned(_)
    ));
    let mut wal = h.path().into_os_string();
    wal.push("-wal");
    std::fs::remove_file(&wal).expect("the ledger runs in WAL mode");

    let first = spec("alice", "k1", "{}", Class::Write, "a");
    let err = store.claim(&first).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::Unavailable(m) if m.contains("syncing")),
        "{err:?}"
    );
    // The claim's row is committed in SQLite but was never durable: no read shows it.
    let err = store.lookup(&first.scope, &first.key).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    let err = store.get(&oncely_store::new_record_id()).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    // And nothing more is written.
    let err = store
        .claim(&spec("bob", "k2", "{}", Class::Write, "b"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Unavailable(m) if m.contains("refuses writes")),
        "{err:?}"
    );
}

/// Under steady writes the WAL is started over instead of growing without end: a
/// passive checkpoint alone never copies all of it while the writer keeps appending, so
/// without the writer's own checkpoint the file grew by every frame ever written (1.1 GB
/// in ten seconds of fresh requests through the gateway). Every record written across
/// the restarts is there after a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_writes_start_the_wal_over_and_keep_every_record() {
    let h = SqliteHarness::new();
    let settings = SqliteSettings {
        checkpoint_every: Duration::from_millis(5),
        wal_restart_pages: 64,
        ..SqliteSettings::default()
    };
    let store = Arc::new(
        SqliteStore::open_with(h.path(), h.options(), settings)
            .await
            .unwrap(),
    );
    const CALLERS: usize = 16;
    const EACH: usize = 150;
    let wal = h.dir.path().join("ledger.db-wal");
    let largest = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..CALLERS {
        let store = store.clone();
        let (wal, largest) = (wal.clone(), largest.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..EACH {
                let body = format!(
                    "{{\"caller\":{c},\"n\":{i},\"pad\":\"{}\"}}",
                    "x".repeat(200)
                );
                let record = owned(
                    store
                        .claim(&spec(
                            "alice",
                            &format!("k-{c}-{i}"),
                            &body,
                            Class::Write,
                            "a",
                        ))
                        .await
                        .unwrap(),
                );
                store
                    .complete(&record.fence().unwrap(), completion(&body, 1))
                    .await
                    .unwrap();
                let len = std::fs::metadata(&wal).map_or(0, |m| m.len());
                largest.fetch_max(len, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let largest = largest.load(std::sync::atomic::Ordering::Relaxed);
    // 4,800 writes of at least one 4 KiB frame each would be about 20 MB of WAL without
    // restarts; with them the file stays near what a few checkpoint intervals append.
    assert!(
        largest < 6 * 1024 * 1024,
        "the WAL grew to {largest} bytes: it was never started over"
    );
    drop(store);

    let store = h.open().await;
    let done = store
        .list(&oncely_store::ListFilter {
            state: Some(State::Completed),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(done.len(), CALLERS * EACH, "every completed record is kept");
}

/// Processes that open one new ledger file at the same moment (parallel `oncely mcp`
/// wrappers, each started by its own host) all open it: switching a new file to WAL
/// does not wait on SQLite's busy handler, so the open waits out the others' locks.
#[test]
fn many_openers_of_one_new_file_all_open_it() {
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger.db");
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let openers: Vec<_> = (0..8)
            .map(|_| {
                let (path, barrier) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    barrier.wait();
                    rt.block_on(SqliteStore::open(&path, StoreOptions::default()))
                        .map(|_| ())
                })
            })
            .collect();
        for opener in openers {
            let opened = opener.join().unwrap();
            assert!(opened.is_ok(), "round {round}: {opened:?}");
        }
    }
}

/// Claims of a record whose answer is too large for the replay cache hold one copy of it
/// while a replay holds it: served from memory, and read through the writer (after its
/// counters changed) without reading the body again. Once nobody holds it, a claim reads
/// it again, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_of_a_large_answer_share_the_copy_a_replay_holds() {
    let h = SqliteHarness::new();
    let store = h.open().await;
    let big = "y".repeat(1 << 20);
    let r = owned(
        store
            .claim(&spec("alice", "big", "{}", Class::Write, "a"))
            .await
            .unwrap(),
    );
    store
        .complete(&r.fence().unwrap(), completion(&big, 1))
        .await
        .unwrap();
    let replay = || async {
        match store
            .claim(&spec("alice", "big", "{}", Class::Write, "z"))
            .await
            .unwrap()
        {
            Claim::Existing(r) => r.response.unwrap().body.unwrap(),
            Claim::Owned(_) => panic!("a completed record is replayed"),
        }
    };
    let held = replay().await;
    assert_eq!(held, big.as_bytes());
    let from_memory = replay().await;
    assert_eq!(from_memory.as_ptr(), held.as_ptr(), "served from memory");
    // Counters change: the next claim goes to the writer, which shares the held copy.
    let summed = oncely_store::Repeat {
        at: store.now().await.unwrap(),
        kind: oncely_store::RepeatKind::Replayed,
        count: 1,
        units: 1,
    };
    store
        .record_repeats(&r.id, &r.principal, &r.route, &[summed])
        .await
        .unwrap();
    let through_writer = replay().await;
    assert_eq!(
        through_writer.as_ptr(),
        held.as_ptr(),
        "the writer shares it"
    );
    drop((held, from_memory, through_writer));
    let again = replay().await;
    assert_eq!(
        again,
        big.as_bytes(),
        "read again, whole, once nobody holds it"
    );
}
