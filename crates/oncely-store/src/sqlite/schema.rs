//! The SQLite schema as an ordered list of migrations, and how a connection is set up.
//!
//! The schema's version is `PRAGMA user_version`: migration `n` moves it from `n - 1` to
//! `n`. [`MIGRATIONS`] only grows: a later feature (the job queue, the webhook delivery
//! queue) appends a new [`Migration`] with the next version and never edits an old one,
//! because files in the field have already applied it.

use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use super::error::sql_error;
use crate::migration;
use crate::{Result, StoreError};

/// One step of the schema: its version is the `user_version` after it (1, 2, 3...).
pub type Migration = migration::Migration<u32>;

/// Every migration, oldest first. Append new ones at the end with the next version.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "ledger records and secrets",
        sql: r#"
CREATE TABLE records (
    id                  TEXT    NOT NULL PRIMARY KEY,
    scope               TEXT    NOT NULL,
    key                 TEXT    NOT NULL,
    fingerprint         TEXT    NOT NULL,
    class               TEXT    NOT NULL,
    route               TEXT    NOT NULL,
    principal           TEXT    NOT NULL,
    state               TEXT    NOT NULL,
    owner               TEXT,
    attempt             INTEGER NOT NULL,
    lease_until         INTEGER,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    completed_at        INTEGER,
    expires_at          INTEGER,
    -- The stored response: status NULL means none; body NULL means it was not kept.
    status              INTEGER,
    headers             TEXT,
    body                BLOB,
    units               INTEGER NOT NULL DEFAULT 0,
    repeats             INTEGER NOT NULL DEFAULT 0,
    repeat_units        INTEGER NOT NULL DEFAULT 0,
    workflow_id         TEXT,
    provider_request_id TEXT,
    last_error          TEXT,
    UNIQUE (scope, key)
);
CREATE INDEX records_created ON records (created_at);
CREATE INDEX records_state ON records (state, created_at);
CREATE INDEX records_principal ON records (principal, created_at);
CREATE INDEX records_route ON records (route, created_at);
CREATE INDEX records_expires ON records (expires_at) WHERE state = 'completed';
CREATE TABLE secrets (
    name  TEXT NOT NULL PRIMARY KEY,
    value BLOB NOT NULL
);
"#,
    },
    Migration {
        version: 2,
        name: "task queue (webhook deliveries, queued jobs)",
        sql: QUEUE_SQL,
    },
    Migration {
        version: 3,
        name: "reconciliation schedule",
        sql: RECONCILE_SQL,
    },
    Migration {
        version: 4,
        name: "repeat events (statements)",
        sql: REPEATS_SQL,
    },
    Migration {
        version: 5,
        name: "usage history",
        sql: USAGE_SQL,
    },
    Migration {
        version: 6,
        name: "a ledger for the write path (keyed by id, one claim index, fewer indexes)",
        sql: WRITE_PATH_SQL,
    },
    Migration {
        version: 7,
        name: "the span that executed a record (trace links)",
        sql: "ALTER TABLE records ADD COLUMN trace TEXT;",
    },
    Migration {
        version: 8,
        name: "keys made up for each attempt (undelivered records, keys that joined one)",
        sql: CHURN_SQL,
    },
];

/// Migration 8: the churn table (module `crate::churn`). A claim never reads it unless
/// the store's filter of it holds the claim's hashes: it is not on the fresh path.
const CHURN_SQL: &str = r#"
CREATE TABLE churn (
    hash   BLOB    NOT NULL PRIMARY KEY,
    record TEXT    NOT NULL,
    kind   TEXT    NOT NULL,
    key    TEXT,
    at     INTEGER NOT NULL,
    until  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX churn_record ON churn (record);
CREATE INDEX churn_until ON churn (until);
"#;

/// Migration 2: the task queue.
const QUEUE_SQL: &str = r#"
CREATE TABLE tasks (
    id           TEXT    NOT NULL PRIMARY KEY,
    kind         TEXT    NOT NULL,
    record       TEXT,
    target       TEXT    NOT NULL,
    method       TEXT    NOT NULL,
    headers      TEXT    NOT NULL,
    body         BLOB,
    state        TEXT    NOT NULL,
    attempts     INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    timeout_ms   INTEGER NOT NULL,
    backoff_ms   INTEGER NOT NULL,
    next_at      INTEGER NOT NULL,
    owner        TEXT,
    lease_until  INTEGER,
    last_error   TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);
CREATE INDEX tasks_pending ON tasks (kind, next_at) WHERE state = 'pending';
CREATE INDEX tasks_running ON tasks (kind, lease_until) WHERE state = 'running';
CREATE INDEX tasks_state ON tasks (kind, state, created_at);
CREATE INDEX tasks_record ON tasks (record);
"#;

/// Migration 3: the reconciliation schedule.
const RECONCILE_SQL: &str = r#"
ALTER TABLE records ADD COLUMN reconcile_for INTEGER;
ALTER TABLE records ADD COLUMN reconcile_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE records ADD COLUMN reconcile_next_at INTEGER;
"#;

/// Migration 4: repeat events.
const REPEATS_SQL: &str = r#"
CREATE TABLE repeat_events (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    record_id  TEXT    NOT NULL,
    principal  TEXT    NOT NULL,
    route      TEXT    NOT NULL,
    at         INTEGER NOT NULL,
    kind       TEXT    NOT NULL,
    units      INTEGER NOT NULL,
    expires_at INTEGER
);
CREATE INDEX repeat_events_principal ON repeat_events (principal, at);
CREATE INDEX repeat_events_expires ON repeat_events (expires_at);
"#;

/// Migration 5: the usage history, repeat events that count several repeats, and the
/// repeats older ledgers counted on their records without events (before migration 4,
/// or past the tally's limit) kept as one event per record, so that readers that count
/// events count them.
const USAGE_SQL: &str = r#"
ALTER TABLE repeat_events ADD COLUMN count INTEGER NOT NULL DEFAULT 1;
CREATE TABLE usage_hours (
    hour         INTEGER NOT NULL,
    principal    TEXT    NOT NULL,
    route        TEXT    NOT NULL,
    fresh        INTEGER NOT NULL DEFAULT 0,
    fresh_units  INTEGER NOT NULL DEFAULT 0,
    repeats      INTEGER NOT NULL DEFAULT 0,
    repeat_units INTEGER NOT NULL DEFAULT 0,
    joined       INTEGER NOT NULL DEFAULT 0,
    replayed     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, principal, route)
) WITHOUT ROWID;
-- Covering: usage per principal over a period reads this index alone, in order.
CREATE INDEX usage_hours_principal
    ON usage_hours (principal, hour, fresh, fresh_units, repeats, repeat_units);
INSERT INTO repeat_events (record_id, principal, route, at, kind, count, units, expires_at)
SELECT r.id, r.principal, r.route, COALESCE(r.completed_at, r.created_at), 'replayed',
       r.repeats - COALESCE(e.n, 0), r.repeat_units - COALESCE(e.u, 0), r.expires_at
FROM records r
LEFT JOIN (SELECT record_id, SUM(count) AS n, SUM(units) AS u FROM repeat_events
           GROUP BY record_id) e ON e.record_id = r.id
WHERE r.repeats > COALESCE(e.n, 0);
"#;

/// Migration 6: `records` rebuilt for the write path. A fresh claim and its completion
/// write four B-trees, not eight: the table itself, keyed by the record id (a
/// time-ordered UUIDv7, so rows are appended, and "newest first" is the key's order);
/// the unique claim index, which holds the 16-byte
/// [`Scope::claim_hash`](oncely_core::Scope::claim_hash) (computed here by
/// `oncely_claim_hash`, which [`migrate`] registers) instead of the scope and key as
/// text, the one B-tree a claim writes at random; one partial index over the records not
/// completed, for the states polled every few seconds, which stays the size of what is in
/// flight; and the expiry index the purge reads. The four listing indexes go: in a
/// group commit every B-tree a request touches costs a whole page of WAL.
const WRITE_PATH_SQL: &str = r#"
ALTER TABLE records RENAME TO records_v5;
CREATE TABLE records (
    id                  TEXT    NOT NULL PRIMARY KEY,
    claim               BLOB    NOT NULL,
    scope               TEXT    NOT NULL,
    key                 TEXT    NOT NULL,
    fingerprint         TEXT    NOT NULL,
    class               TEXT    NOT NULL,
    route               TEXT    NOT NULL,
    principal           TEXT    NOT NULL,
    state               TEXT    NOT NULL,
    owner               TEXT,
    attempt             INTEGER NOT NULL,
    lease_until         INTEGER,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    completed_at        INTEGER,
    expires_at          INTEGER,
    units               INTEGER NOT NULL DEFAULT 0,
    repeats             INTEGER NOT NULL DEFAULT 0,
    repeat_units        INTEGER NOT NULL DEFAULT 0,
    workflow_id         TEXT,
    provider_request_id TEXT,
    last_error          TEXT,
    reconcile_for       INTEGER,
    reconcile_attempts  INTEGER NOT NULL DEFAULT 0,
    reconcile_next_at   INTEGER,
    -- The stored response: status NULL means none; body NULL means it was not kept.
    status              INTEGER,
    headers             TEXT,
    body                BLOB
) WITHOUT ROWID;
INSERT INTO records (id, claim, scope, key, fingerprint, class, route, principal, state,
                     owner, attempt, lease_until, created_at, updated_at, completed_at,
                     expires_at, units, repeats, repeat_units, workflow_id,
                     provider_request_id, last_error, reconcile_for, reconcile_attempts,
                     reconcile_next_at, status, headers, body)
SELECT id, oncely_claim_hash(scope, key), scope, key, fingerprint, class, route, principal,
       state, owner, attempt, lease_until, created_at, updated_at, completed_at, expires_at,
       units, repeats, repeat_units, workflow_id, provider_request_id, last_error,
       reconcile_for, reconcile_attempts, reconcile_next_at, status, headers, body
FROM records_v5 ORDER BY id;
DROP TABLE records_v5;
-- Built after the copy, by sorting: inserting a million random hashes one by one into a
-- unique index takes most of a minute.
CREATE UNIQUE INDEX records_claim ON records (claim);
CREATE INDEX records_open ON records (state) WHERE state <> 'completed';
CREATE INDEX records_expiry ON records (expires_at) WHERE state IN ('completed', 'released');
"#;

/// Registers `oncely_claim_hash(scope, key)` on `conn`: the claim index's value
/// ([`Scope::claim_hash`](oncely_core::Scope::claim_hash)), for migration 6.
fn register_claim_hash(conn: &Connection) -> Result<()> {
    use rusqlite::functions::FunctionFlags;
    conn.create_scalar_function(
        "oncely_claim_hash",
        2,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            let scope: String = ctx.get(0)?;
            let key: String = ctx.get(1)?;
            Ok(oncely_core::Scope::from_stored(scope)
                .claim_hash(&key)
                .to_vec())
        },
    )
    .map_err(sql_error)
}

/// The schema version this build writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS[MIGRATIONS.len() - 1].version;

/// Brings the file's schema up to [`SCHEMA_VERSION`]; returns the versions applied (none
/// when the file was already current). Refuses a file from a newer oncely.
pub(super) fn migrate(conn: &mut Connection) -> Result<Vec<u32>> {
    register_claim_hash(conn)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql_error)?;
    let current: u32 = tx
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(sql_error)?;
    let pending = migration::pending(MIGRATIONS, "the SQLite ledger", Some(current), |v| {
        v <= current
    })?;
    let mut applied = Vec::new();
    for m in pending {
        tx.execute_batch(m.sql)
            .map_err(|e| migration::failed(m, e))?;
        tx.pragma_update(None, "user_version", m.version)
            .map_err(sql_error)?;
        migration::applied(m, "the SQLite ledger");
        applied.push(m.version);
    }
    tx.commit().map_err(sql_error)?;
    Ok(applied)
}

/// How long a connection waits for another one's lock before giving up with
/// `SQLITE_BUSY` (another process writing, a checkpoint).
pub(super) const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Settings every connection gets.
pub(super) fn configure_common(conn: &Connection, busy_timeout: Duration) -> Result<()> {
    conn.busy_timeout(busy_timeout).map_err(sql_error)?;
    conn.set_prepared_statement_cache_capacity(64);
    conn.pragma_update(None, "temp_store", "MEMORY")
        .map_err(sql_error)?;
    // Deleted rows (a finished job's sealed payload, a delivered webhook's body, purged
    // records) are overwritten, not left in free pages.
    conn.pragma_update(None, "secure_delete", "ON")
        .map_err(sql_error)?;
    Ok(())
}

/// Settings of the writer connection: WAL and the durability the operator chose.
pub(super) fn configure_writer(conn: &Connection, synchronous: &str) -> Result<()> {
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(sql_error)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Config(format!(
            "the SQLite ledger could not switch to WAL (journal_mode is {mode}); \
             use a file on a local disk"
        )));
    }
    conn.pragma_update(None, "synchronous", synchronous)
        .map_err(sql_error)?;
    Ok(())
}

/// Checks `StoreOptions::sqlite_synchronous`: `FULL` (default) or `NORMAL` (`EXTRA` is
/// accepted too). `OFF` is refused: the ledger's promise needs the file to survive a
/// crash.
pub(super) fn synchronous_mode(text: &str) -> Result<&'static str> {
    match text.trim().to_ascii_uppercase().as_str() {
        "" | "FULL" | "2" => Ok("FULL"),
        "NORMAL" | "1" => Ok("NORMAL"),
        "EXTRA" | "3" => Ok("EXTRA"),
        other => Err(StoreError::Config(format!(
            "unknown SQLite synchronous mode {other:?}: use FULL (default) or NORMAL"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_increase_by_one() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(
                m.version as usize,
                i + 1,
                "migration {} is out of order",
                m.name
            );
        }
    }

    #[test]
    fn migrating_twice_is_a_no_op() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("m.db")).unwrap();
        assert_eq!(
            migrate(&mut conn).unwrap(),
            MIGRATIONS.iter().map(|m| m.version).collect::<Vec<_>>()
        );
        assert!(migrate(&mut conn).unwrap().is_empty());
        let v: u32 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION);
    }

    #[test]
    fn a_newer_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = Connection::open(dir.path().join("m.db")).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
        let err = migrate(&mut conn).unwrap_err();
        assert!(
            matches!(err, StoreError::Config(ref m) if m.contains("newer")),
            "{err}"
        );
    }

    #[test]
    fn connections_overwrite_deleted_rows() {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("m.db")).unwrap();
        configure_common(&conn, DEFAULT_BUSY_TIMEOUT).unwrap();
        let on: i64 = conn
            .query_row("PRAGMA secure_delete", [], |r| r.get(0))
            .unwrap();
        assert_eq!(on, 1);
    }

    #[test]
    fn synchronous_modes() {
        assert_eq!(synchronous_mode("full").unwrap(), "FULL");
        assert_eq!(synchronous_mode("NORMAL").unwrap(), "NORMAL");
        assert!(matches!(
            synchronous_mode("off"),
            Err(StoreError::Config(_))
        ));
    }
}
