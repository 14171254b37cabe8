//! The PostgreSQL schema, as a list of versioned migrations.
//!
//! Each migration runs once, in one transaction, in order; `schema_migrations` remembers
//! which ran. [`migrate`] holds a transaction-scoped advisory lock, so several instances
//! that start together apply each migration exactly once; the connection's statement
//! timeout does not apply to it. Append new migrations at the end with the next version
//! number (the job queue and the webhook delivery queue go here); never edit one that
//! has shipped, except so that it can run where it failed with the same effect wherever
//! it ran (migration 5, on a role that may not read the WAL position).

use tokio_postgres::Client;

use super::error::{error_text, unavailable};
use crate::migration;
use crate::Result;

/// One schema change: its version is a row of `schema_migrations` (an `integer`).
pub type Migration = migration::Migration<i32>;

/// Every migration, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "ledger records and secrets",
        sql: r#"
CREATE TABLE records (
    id                  text PRIMARY KEY,
    scope               text NOT NULL,
    key                 text NOT NULL,
    fingerprint         bytea NOT NULL,
    class               text NOT NULL,
    route               text NOT NULL,
    principal           text NOT NULL,
    state               text NOT NULL
        CHECK (state IN ('processing', 'completed', 'released', 'outcome_unknown')),
    owner               text,
    attempt             integer NOT NULL,
    lease_until         bigint,
    created_at          bigint NOT NULL,
    updated_at          bigint NOT NULL,
    completed_at        bigint,
    expires_at          bigint,
    response_status     integer,
    response_headers    text,
    response_body       bytea,
    units               bigint NOT NULL DEFAULT 0,
    repeats             bigint NOT NULL DEFAULT 0,
    repeat_units        bigint NOT NULL DEFAULT 0,
    workflow_id         text,
    provider_request_id text,
    last_error          text,
    -- How many wait_for calls (on any instance) wait for this record: a transition out of
    -- processing sends NOTIFY only when this is above zero.
    waiting             integer NOT NULL DEFAULT 0,
    UNIQUE (scope, key)
);
CREATE INDEX records_created ON records (created_at DESC, id DESC);
CREATE INDEX records_expiry ON records (expires_at) WHERE state = 'completed';
CREATE INDEX records_principal ON records (principal, created_at DESC);

CREATE TABLE secrets (
    name  text PRIMARY KEY,
    value bytea NOT NULL
);
"#,
    },
    Migration {
        version: 2,
        name: "task queue (webhook deliveries, queued jobs)",
        sql: r#"
CREATE TABLE tasks (
    id           text PRIMARY KEY,
    kind         text NOT NULL,
    record       text,
    target       text NOT NULL,
    method       text NOT NULL,
    headers      text NOT NULL,
    body         bytea,
    state        text NOT NULL CHECK (state IN ('pending', 'running', 'dead')),
    attempts     integer NOT NULL,
    max_attempts integer NOT NULL,
    timeout_ms   bigint NOT NULL,
    backoff_ms   bigint NOT NULL,
    next_at      bigint NOT NULL,
    owner        text,
    lease_until  bigint,
    last_error   text,
    created_at   bigint NOT NULL,
    updated_at   bigint NOT NULL
);
CREATE INDEX tasks_pending ON tasks (kind, next_at) WHERE state = 'pending';
CREATE INDEX tasks_running ON tasks (kind, lease_until) WHERE state = 'running';
CREATE INDEX tasks_state ON tasks (kind, state, created_at);
CREATE INDEX tasks_record ON tasks (record);
"#,
    },
    Migration {
        version: 3,
        name: "reconciliation schedule",
        sql: r#"
ALTER TABLE records
    ADD COLUMN reconcile_for      bigint,
    ADD COLUMN reconcile_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN reconcile_next_at  bigint;
"#,
    },
    Migration {
        version: 4,
        name: "repeat events (statements)",
        sql: r#"
CREATE TABLE repeat_events (
    seq        bigserial PRIMARY KEY,
    record_id  text   NOT NULL,
    principal  text   NOT NULL,
    route      text   NOT NULL,
    at         bigint NOT NULL,
    kind       text   NOT NULL CHECK (kind IN ('joined', 'replayed')),
    units      bigint NOT NULL,
    expires_at bigint
);
CREATE INDEX repeat_events_principal ON repeat_events (principal, at);
CREATE INDEX repeat_events_expires ON repeat_events (expires_at);
"#,
    },
    Migration {
        version: 5,
        name: "timelines (a lease lapses only once the primary has been up for it)",
        sql: r#"
-- When this database was first seen taking writes on each WAL timeline of its server
-- (ms, the database's clock plus the store clock's offset): a promoted standby starts a
-- new timeline, and a lease counts as lapsed only once the server has been the primary
-- for a whole lease (postgres::sql::UP). The timeline the schema is created on counts as
-- old as the server.
CREATE TABLE timelines (
    timeline text PRIMARY KEY,
    since    bigint NOT NULL
);
-- Edited after it shipped, with the same effect where it ran: a role that may not read
-- the WAL position (Aurora without logical replication, a DBA's REVOKE) failed here, and
-- migration 6 records the server as it is identified since.
DO $$
BEGIN
    INSERT INTO timelines (timeline, since)
    VALUES (substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8), 0);
EXCEPTION WHEN OTHERS THEN
    NULL;
END $$;
"#,
    },
    Migration {
        version: 6,
        name:
            "the primary identified by its timeline and address (timelines without WAL functions)",
        sql: r#"
-- Which primary this is, for the lease rule (postgres::sql::UP): the server's WAL
-- timeline (a promoted standby starts a new one) where the role may read it, and its
-- address and port (a standby promoted on another host). A role that may not read the WAL
-- position (Aurora without rds.logical_replication, a DBA's REVOKE) is told the primary
-- apart by its address alone.
CREATE FUNCTION oncely_primary() RETURNS text LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    timeline text;
BEGIN
    BEGIN
        timeline := substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8);
    EXCEPTION WHEN OTHERS THEN
        timeline := '-';
    END;
    RETURN timeline || '@' || coalesce(host(inet_server_addr()), 'local') || ':'
        || coalesce(inet_server_port()::text, '');
END
$fn$;
-- The primary the schema is upgraded on counts as old as the server, as in migration 5.
INSERT INTO timelines (timeline, since) VALUES (oncely_primary(), 0)
ON CONFLICT (timeline) DO NOTHING;
"#,
    },
    Migration {
        version: 7,
        name: "usage history",
        sql: USAGE_SQL,
    },
    Migration {
        version: 8,
        name: "a ledger built for the write path (claim hashes, fewer indexes)",
        sql: r#"
-- A claim finds its row by 16 bytes (`Scope::claim_hash`: SHA-256 of a prefix, the scope
-- and the key) instead of two long texts: the unique index a claim inserts into is a
-- quarter of the size. The store compares scope and key on the row it finds. (Each step
-- may run again with the same effect.)
ALTER TABLE records ADD COLUMN IF NOT EXISTS claim bytea;
UPDATE records SET claim = substring(sha256(
    convert_to('oncely/claim/v1', 'UTF8') || '\x00'::bytea || convert_to(scope, 'UTF8')
    || '\x00'::bytea || convert_to(key, 'UTF8')) FROM 1 FOR 16);
ALTER TABLE records ALTER COLUMN claim SET NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS records_claim ON records (claim);
ALTER TABLE records DROP CONSTRAINT IF EXISTS records_scope_key_key;
-- Lists are newest first by id (`rec_` and a UUIDv7: time-ordered), through the primary
-- key; the states the gateway polls (processing, outcome_unknown) have an index of their
-- own, which a completed record leaves.
DROP INDEX IF EXISTS records_created;
DROP INDEX IF EXISTS records_principal;
CREATE INDEX IF NOT EXISTS records_open ON records (state, id) WHERE state <> 'completed';
"#,
    },
    Migration {
        version: 9,
        name: "the span that executed a record (trace links)",
        sql: "ALTER TABLE records ADD COLUMN IF NOT EXISTS trace text;",
    },
    Migration {
        version: 10,
        name: "keys made up for each attempt (undelivered records, keys that joined one)",
        sql: r#"
CREATE TABLE IF NOT EXISTS churn (
    hash   bytea  PRIMARY KEY,
    record text   NOT NULL,
    kind   text   NOT NULL,
    key    text,
    at     bigint NOT NULL,
    until  bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS churn_record ON churn (record);
CREATE INDEX IF NOT EXISTS churn_until ON churn (until);
"#,
    },
];

/// Migration 7: the usage history, repeat events that count several repeats, and the
/// repeats older ledgers counted on their records without events kept as one event per
/// record (see the SQLite store's migration 5).
const USAGE_SQL: &str = r#"
ALTER TABLE repeat_events ADD COLUMN count bigint NOT NULL DEFAULT 1;
CREATE TABLE usage_hours (
    hour         bigint NOT NULL,
    principal    text   NOT NULL,
    route        text   NOT NULL,
    fresh        bigint NOT NULL DEFAULT 0,
    fresh_units  bigint NOT NULL DEFAULT 0,
    repeats      bigint NOT NULL DEFAULT 0,
    repeat_units bigint NOT NULL DEFAULT 0,
    joined       bigint NOT NULL DEFAULT 0,
    replayed     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (hour, principal, route)
);
-- Covering: usage per principal over a period reads this index alone.
CREATE INDEX usage_hours_principal ON usage_hours (principal, hour)
    INCLUDE (fresh, fresh_units, repeats, repeat_units);
INSERT INTO repeat_events (record_id, principal, route, at, kind, count, units, expires_at)
SELECT r.id, r.principal, r.route, COALESCE(r.completed_at, r.created_at), 'replayed',
       r.repeats - COALESCE(e.n, 0), r.repeat_units - COALESCE(e.u, 0), r.expires_at
FROM records r
LEFT JOIN (SELECT record_id, sum(count) AS n, sum(units) AS u FROM repeat_events
           GROUP BY record_id) e ON e.record_id = r.id
WHERE r.repeats > COALESCE(e.n, 0);
"#;

/// The advisory lock key that serialises migrations ("oncely" in ASCII).
const LOCK_KEY: i64 = 0x6f6e_6365_6c79;

/// Applies every migration the database has not seen; returns the versions applied.
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>> {
    let tx = client.transaction().await.map_err(unavailable)?;
    // A schema change may take long, and so may waiting for another instance's: the
    // connection's statement timeout is for the requests' statements, not for these.
    tx.batch_execute("SET LOCAL statement_timeout = 0")
        .await
        .map_err(unavailable)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
        .await
        .map_err(unavailable)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(unavailable)?;
    let rows = tx
        .query("SELECT version FROM schema_migrations", &[])
        .await
        .map_err(unavailable)?;
    let seen: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    let newest = seen.iter().copied().max();
    let pending = migration::pending(MIGRATIONS, "the database", newest, |v| seen.contains(&v))?;
    let mut applied = Vec::new();
    for m in pending {
        tx.batch_execute(m.sql)
            .await
            .map_err(|e| migration::failed(m, error_text(&e)))?;
        tx.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            &[&m.version, &m.name],
        )
        .await
        .map_err(unavailable)?;
        migration::applied(m, "the database");
        applied.push(m.version);
    }
    tx.commit().await.map_err(unavailable)?;
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_increase_from_one() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i as i32 + 1, "migration {:?}", m.name);
        }
    }
}
