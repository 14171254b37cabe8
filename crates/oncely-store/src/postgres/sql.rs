//! The statements of the ledger on `records` and `repeat_events`, built once ([`SQL`]).
//! Every time in them is the database's clock plus the store clock's offset, passed as
//! `$1` ([`NOW`], or [`AT`] in the plain statements of the write path: the claim and the
//! owner's transitions); a transition out of `processing` notifies [`CHANNEL`] when
//! someone waits for the record.

use std::sync::LazyLock;

use super::listener::CHANNEL;
use super::rows::{cols, COLUMNS};

/// The database's time in ms since the epoch, plus the offset in `$1`.
pub(super) const NOW: &str =
    "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $1::bigint AS now";

/// The same time as an expression, for the statements of the write path, which are
/// plain statements (no common table expression to start): the statement's start
/// (`statement_timestamp()`: one value however often a statement uses it) plus the
/// offset in `$1`.
pub(super) const AT: &str =
    "((extract(epoch FROM statement_timestamp()) * 1000)::bigint + $1::bigint)";

/// Common table expressions that end in `up`, one row whose `up` says how long, in ms
/// plus the offset in `$1` (a test clock's steps count as time up), the server has been
/// the primary it is now: since its postmaster started, or since this database was first
/// seen on the server's current WAL timeline, whichever is later. A lease counts as
/// lapsed only once `up` covers a whole lease, so that an owner that could not renew
/// while the database was away is given a lease to renew before anyone takes over.
///
/// A restart keeps the timeline and starts the postmaster again; a promoted standby
/// keeps its postmaster (started long before) and starts a new timeline, on another
/// address or port as a rule. The first statement with these expressions on a new
/// primary (`oncely_primary()`: the timeline where the role may read it, and the server's
/// address and port; migration 6) records when it saw it (`timelines`), so the outage
/// before a promotion does not count as time up either. One that meets a concurrent first
/// sighting counts `up` as zero.
pub(super) const UP: &str = "\
    tl AS (SELECT oncely_primary() AS timeline,
                  (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $1::bigint AS now),
    seen AS (INSERT INTO timelines (timeline, since)
             SELECT tl.timeline, tl.now FROM tl
             WHERE NOT EXISTS (SELECT 1 FROM timelines s WHERE s.timeline = tl.timeline)
             ON CONFLICT (timeline) DO NOTHING
             RETURNING since),
    up AS (SELECT tl.now - greatest(
                      (extract(epoch FROM pg_postmaster_start_time()) * 1000)::bigint,
                      coalesce((SELECT since FROM seen),
                               (SELECT s.since FROM timelines s WHERE s.timeline = tl.timeline),
                               tl.now)) AS up
           FROM tl)";

/// Every statement the store runs, built once.
pub(super) struct Statements {
    pub(super) claim: String,
    pub(super) claim_read: String,
    pub(super) reclaim: String,
    pub(super) renew_expired: String,
    pub(super) complete: String,
    pub(super) release: String,
    pub(super) mark_unknown: String,
    pub(super) renew: String,
    pub(super) lock: String,
    pub(super) write: String,
    pub(super) get: String,
    pub(super) lookup: String,
    pub(super) wait_start: String,
    pub(super) wait_end: String,
    pub(super) list: String,
    pub(super) list_open: String,
    pub(super) purge: String,
    pub(super) record_repeats: String,
    pub(super) purge_repeats: String,
    pub(super) now: String,
    pub(super) up: String,
    pub(super) durable: String,
}

/// A fenced owner transition that sets `set` (where `t.now` is the statement's time,
/// [`AT`]) and sends NOTIFY when someone waits: one plain `UPDATE`.
fn fenced_update(set: &str, notify: bool) -> String {
    let notify = if notify {
        format!(
            ", CASE WHEN r.waiting > 0 THEN pg_notify('{}', r.id) END AS notified",
            CHANNEL
        )
    } else {
        String::new()
    };
    format!(
        "UPDATE records r SET {set}
         WHERE r.id = $2 AND r.owner = $3 AND r.attempt = $4 AND r.state = 'processing'
         RETURNING {ret}{notify}",
        set = set.replace("t.now", AT),
        ret = cols("r")
    )
}

/// The columns a claim writes (the single claim's and the grouped claims' statements).
pub(super) const CLAIM_INSERT: &str =
    "INSERT INTO records (id, claim, scope, key, fingerprint, class, route,
                                  principal, state, owner, attempt, lease_until, created_at,
                                  updated_at, workflow_id)";

/// The statements, built on first use.
pub(super) static SQL: LazyLock<Statements> = LazyLock::new(|| Statements {
    // A plain insert: the row it wrote, or none when a row holds the claim (then
    // `claim_read` reads that row in a statement of its own).
    claim: format!(
        "{CLAIM_INSERT}
         VALUES ($2, $12, $3, $4, $5, $6, $7, $8, 'processing', $9, 1, {AT} + $10, {AT}, {AT},
                 $11)
         ON CONFLICT (claim) DO NOTHING
         RETURNING true AS inserted, created_at AS now, {ins}",
        ins = COLUMNS.join(", "),
    ),
    // The rows holding the claims `$2` (hashes): the caller compares scope and key.
    claim_read: format!(
        "SELECT false AS inserted, {AT} AS now, {r} FROM records r
         WHERE r.claim = ANY($2::bytea[])",
        r = cols("r")
    ),
    reclaim: format!(
        "WITH t AS ({NOW})
         UPDATE records r SET state = 'processing', owner = $4, attempt = r.attempt + 1,
             lease_until = t.now + $5, updated_at = t.now, expires_at = NULL,
             workflow_id = COALESCE($6, r.workflow_id)
         FROM t
         WHERE r.id = $2 AND r.state = 'released' AND r.fingerprint = $3
         RETURNING {r}",
        r = cols("r")
    ),
    // The expired record leaves the ledger: what it counted is folded into the usage
    // history in the same statement (`o` is the row as it was before the update).
    renew_expired: format!(
        "WITH t AS ({NOW}),
         u AS (
             UPDATE records r SET id = $3, fingerprint = $4, class = $5, route = $6,
                 principal = $7, state = 'processing', owner = $8, attempt = 1,
                 lease_until = t.now + $9, created_at = t.now, updated_at = t.now,
                 completed_at = NULL, expires_at = NULL, response_status = NULL,
                 response_headers = NULL, response_body = NULL, units = 0, repeats = 0,
                 repeat_units = 0, workflow_id = $10, provider_request_id = NULL,
                 last_error = NULL, waiting = 0, trace = NULL
             FROM t, (SELECT id, state, principal, route, completed_at, units FROM records
                      WHERE id = $2) o
             WHERE r.id = $2 AND o.id = $2 AND ((r.state = 'completed'
               AND (r.expires_at IS NULL OR r.expires_at <= t.now))
               OR (r.state = 'released' AND r.expires_at <= t.now))
             RETURNING o.state AS old_state, o.principal AS old_principal,
                       o.route AS old_route, o.completed_at AS old_completed_at,
                       o.units AS old_units, {r}),
         folded AS ({fold})
         SELECT * FROM u",
        r = cols("r"),
        fold = fold_renewed_sql(),
    ),
    // $5 window ms, $6 replay_until, $7 status, $8 headers, $9 body, $10 units, $11 req id,
    // $12 the executing span
    complete: fenced_update(
        "state = 'completed', lease_until = NULL, completed_at = t.now,
         expires_at = LEAST(t.now + $5, COALESCE($6, 9223372036854775807)),
         response_status = $7, response_headers = $8, response_body = $9, units = $10,
         provider_request_id = COALESCE($11, r.provider_request_id), updated_at = t.now,
         last_error = NULL, trace = COALESCE($12, r.trace)",
        true,
    ),
    release: fenced_update(
        "state = 'released', lease_until = NULL, updated_at = t.now, last_error = $5,
         expires_at = t.now + $6",
        true,
    ),
    mark_unknown: fenced_update(
        "state = 'outcome_unknown', lease_until = NULL, updated_at = t.now, last_error = $5",
        true,
    ),
    renew: fenced_update("lease_until = t.now + $5, updated_at = t.now", false),
    lock: format!(
        "WITH t AS ({NOW})
         SELECT t.now, {r} FROM records r, t WHERE r.id = $2 FOR UPDATE OF r",
        r = cols("r")
    ),
    write: format!(
        "WITH u AS (
             UPDATE records SET state = $2, owner = $3, attempt = $4, lease_until = $5,
                 updated_at = $6, completed_at = $7, expires_at = $8, response_status = $9,
                 response_headers = $10, response_body = $11, units = $12,
                 provider_request_id = $13, last_error = $14, trace = $15
             WHERE id = $1
             RETURNING id, state, waiting)
         SELECT CASE WHEN u.waiting > 0 AND u.state <> 'processing'
                     THEN pg_notify('{}', u.id) END
         FROM u",
        CHANNEL
    ),
    get: format!(
        "WITH t AS ({NOW}) SELECT t.now, {r} FROM records r, t WHERE r.id = $2",
        r = cols("r")
    ),
    lookup: format!(
        "SELECT {} FROM records WHERE claim = $1",
        COLUMNS.join(", ")
    ),
    wait_start: format!(
        "WITH t AS ({NOW})
         UPDATE records r SET waiting = r.waiting + 1
         FROM t
         WHERE r.id = $2 AND r.state = 'processing'
         RETURNING t.now, {r}",
        r = cols("r")
    ),
    wait_end: "UPDATE records SET waiting = GREATEST(waiting - 1, 0) WHERE id = $1".into(),
    // Newest first is by id (`rec_` and a UUIDv7), through the primary key.
    list: format!(
        "SELECT {} FROM records
         WHERE ($1::text IS NULL OR state = $1)
           AND ($2::text IS NULL OR principal = $2)
           AND ($3::text IS NULL OR route = $3)
         ORDER BY id DESC
         LIMIT $4",
        COLUMNS.join(", ")
    ),
    // A state other than completed (what the gateway polls): through `records_open`,
    // whose predicate the statement repeats so that a generic plan may use it too.
    list_open: format!(
        "SELECT {} FROM records
         WHERE state = $1 AND state <> 'completed'
           AND ($2::text IS NULL OR principal = $2)
           AND ($3::text IS NULL OR route = $3)
         ORDER BY id DESC
         LIMIT $4",
        COLUMNS.join(", ")
    ),
    purge: purge_records_sql(),
    // The counters on the record when it is still there, and the events either way
    // (without an expiry when the record is gone: the next purge folds them).
    record_repeats: "WITH u AS (
             UPDATE records SET repeats = repeats + $2, repeat_units = repeat_units + $3
             WHERE id = $1
             RETURNING expires_at)
         INSERT INTO repeat_events
             (record_id, principal, route, at, kind, count, units, expires_at)
         SELECT $1, $7, $8, e.at, e.kind, e.count, e.units, (SELECT expires_at FROM u)
         FROM unnest($4::bigint[], $5::text[], $6::bigint[], $9::bigint[])
             AS e(at, kind, units, count)"
        .into(),
    purge_repeats: purge_events_sql(),
    now: NOW.to_string(),
    up: format!("WITH {UP} SELECT up FROM up"),
    // A write of the primary's own row, or its first sighting (as in UP): the smallest
    // commit that waits for the synchronous standbys (`PgStore::durable`).
    durable: "INSERT INTO timelines (timeline, since)
              VALUES (oncely_primary(),
                      (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $1::bigint)
              ON CONFLICT (timeline) DO UPDATE SET since = timelines.since"
        .into(),
});

// The usage history's statements (`postgres::usage`): folding what a purge deletes, or
// what a renewal replaces, into `usage_hours`.

/// Upserts `SELECT hour, principal, route, fresh, fresh_units, repeats, repeat_units,
/// joined, replayed` rows into the history (in key order, so that two instances folding
/// at once never wait for each other's rows in opposite orders).
fn upsert(select: &str) -> String {
    format!(
        "INSERT INTO usage_hours (hour, principal, route, fresh, fresh_units, repeats,
                                  repeat_units, joined, replayed)
         {select} ORDER BY 1, 2, 3
         ON CONFLICT (hour, principal, route) DO UPDATE SET
             fresh = usage_hours.fresh + EXCLUDED.fresh,
             fresh_units = usage_hours.fresh_units + EXCLUDED.fresh_units,
             repeats = usage_hours.repeats + EXCLUDED.repeats,
             repeat_units = usage_hours.repeat_units + EXCLUDED.repeat_units,
             joined = usage_hours.joined + EXCLUDED.joined,
             replayed = usage_hours.replayed + EXCLUDED.replayed"
    )
}

/// The hour of a millisecond column.
fn hour(col: &str) -> String {
    format!("(({col} / 3600000) * 3600000)")
}

/// The fresh executions of `rows` (with `state`, `principal`, `route`, `completed_at`,
/// `units`), per hour.
pub(super) fn fresh_of(rows: &str) -> String {
    format!(
        "SELECT {h}, principal, route, count(*), sum(units), 0, 0, 0, 0 FROM {rows}
         WHERE state = 'completed' AND completed_at IS NOT NULL GROUP BY 1, 2, 3",
        h = hour("completed_at")
    )
}

/// The repeats of `events` (repeat events' columns), per hour.
pub(super) fn repeats_of(events: &str) -> String {
    format!(
        "SELECT {h}, principal, route, 0, 0, sum(count), sum(units),
                COALESCE(sum(count) FILTER (WHERE kind = 'joined'), 0),
                COALESCE(sum(count) FILTER (WHERE kind = 'replayed'), 0)
         FROM {events} GROUP BY 1, 2, 3",
        h = hour("at")
    )
}

/// One batch of the purge of records whose window ended: at most `$2` rows of each kind
/// (completed, completed before expiries were kept, released), each kind read through
/// its index (an `OR` of the three made the planner scan the table), that no
/// other purge holds (`SKIP LOCKED`), deleted by primary key (`= ANY`: a join with the
/// batch could be planned as a scan of the table), and folded, in one statement; answers how
/// many. The caller repeats it until a batch comes back short, so that no statement holds
/// many rows' locks, or writes much WAL, at once.
fn purge_records_sql() -> String {
    format!(
        "WITH done AS (
             SELECT id FROM records
             WHERE state = 'completed' AND expires_at <= {AT}
             LIMIT $2
             FOR UPDATE SKIP LOCKED),
         undated AS (
             SELECT id FROM records
             WHERE state = 'completed' AND expires_at IS NULL
             LIMIT $2
             FOR UPDATE SKIP LOCKED),
         released AS (
             SELECT id FROM records
             WHERE state = 'released' AND state <> 'completed' AND expires_at <= {AT}
             LIMIT $2
             FOR UPDATE SKIP LOCKED),
         batch AS (
             SELECT id FROM done UNION ALL SELECT id FROM undated
             UNION ALL SELECT id FROM released),
         gone AS (
             DELETE FROM records r WHERE r.id = ANY (ARRAY(SELECT id FROM batch))
             RETURNING r.state, r.principal, r.route, r.completed_at, r.units),
         folded AS ({fold})
         SELECT count(*)::bigint FROM gone",
        fold = upsert(&fresh_of("gone"))
    )
}

/// One batch of the purge of repeat events whose record's window ended (or whose record
/// was gone when they were written), folding them, as [`purge_records_sql`]; answers how
/// many.
fn purge_events_sql() -> String {
    format!(
        "WITH ended AS (
             SELECT seq FROM repeat_events
             WHERE expires_at <= {AT}
             LIMIT $2
             FOR UPDATE SKIP LOCKED),
         orphans AS (
             SELECT seq FROM repeat_events
             WHERE expires_at IS NULL
             LIMIT $2
             FOR UPDATE SKIP LOCKED),
         batch AS (SELECT seq FROM ended UNION ALL SELECT seq FROM orphans),
         gone AS (
             DELETE FROM repeat_events e WHERE e.seq = ANY (ARRAY(SELECT seq FROM batch))
             RETURNING e.principal, e.route, e.at, e.kind, e.count, e.units),
         folded AS ({fold})
         SELECT count(*)::bigint FROM gone",
        fold = upsert(&repeats_of("gone"))
    )
}

/// Folds the row an expired record was before a statement's update `u` renewed it in
/// place (it leaves the ledger; `u` returns its old columns as `old_*`).
fn fold_renewed_sql() -> String {
    upsert(&fresh_of(
        "(SELECT old_state AS state, old_principal AS principal, old_route AS route,
                 old_completed_at AS completed_at, old_units AS units FROM u) o",
    ))
}

/// Folds the record `$1` before a claim deletes it to insert its successor.
pub(super) fn fold_record_sql() -> String {
    upsert(&fresh_of(
        "(SELECT state, principal, route, completed_at, units FROM records WHERE id = $1) r",
    ))
}
