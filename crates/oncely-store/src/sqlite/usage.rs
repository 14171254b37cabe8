//! The usage history on SQLite (migration 5): `usage_hours`, one row per principal, route
//! and hour, into which the purge folds the records and repeat events it deletes, in the
//! writer's transaction that deletes them (`crate::usage` says how each counts). Readers
//! add what the ledger still holds to it, in one read.

use oncely_core::Timestamp;
use rusqlite::{params, Connection};

use super::error::sql_error;
use crate::usage::Hours;
use crate::{Result, UsageHour, UsageRow};

/// The hour of a millisecond column, in SQL.
macro_rules! hour {
    ($col:literal) => {
        concat!("((", $col, " / 3600000) * 3600000)")
    };
}

/// How many records (or repeat events) one purge step deletes: each step is one writer
/// command, so claims and completions run between steps. Expired records lie all over
/// the table and the claim index, so a step writes about two pages per record: 250
/// records keep a step to a few milliseconds.
pub(super) const PURGE_STEP: i64 = 250;

/// The step's rows: picked first (a record's id, a repeat event's `seq`), then folded
/// and deleted by it, so that what is folded is exactly what is deleted.
const PICK: &str = "CREATE TEMP TABLE IF NOT EXISTS purge_step (id PRIMARY KEY); \
     DELETE FROM temp.purge_step;";

/// Up to `?2` records whose window ended at `?1`, through the expiry index (completed
/// records without an expiry are from before expiries were kept, and go too).
const PICK_RECORDS: &str = "INSERT INTO temp.purge_step (id) SELECT id FROM records \
     INDEXED BY records_expiry WHERE state IN ('completed', 'released') \
     AND (expires_at <= ?1 OR (expires_at IS NULL AND state = 'completed')) LIMIT ?2";

const FOLD_RECORDS: &str = concat!(
    "INSERT INTO usage_hours (hour, principal, route, fresh, fresh_units) SELECT ",
    hour!("completed_at"),
    ", principal, route, COUNT(*), SUM(units) FROM records \
     WHERE id IN (SELECT id FROM temp.purge_step) \
     AND state = 'completed' AND completed_at IS NOT NULL GROUP BY 1, 2, 3 \
     ON CONFLICT (hour, principal, route) DO UPDATE SET \
     fresh = fresh + excluded.fresh, fresh_units = fresh_units + excluded.fresh_units"
);

/// Up to `?2` repeat events whose record's window ended at `?1` (or whose record was
/// gone when they were written).
const PICK_EVENTS: &str = "INSERT INTO temp.purge_step (id) SELECT seq FROM repeat_events \
     WHERE expires_at IS NULL OR expires_at <= ?1 LIMIT ?2";

const FOLD_EVENTS: &str = concat!(
    "INSERT INTO usage_hours (hour, principal, route, repeats, repeat_units, joined, replayed) \
     SELECT ",
    hour!("at"),
    ", principal, route, SUM(count), SUM(units), \
     SUM(CASE WHEN kind = 'joined' THEN count ELSE 0 END), \
     SUM(CASE WHEN kind = 'replayed' THEN count ELSE 0 END) FROM repeat_events \
     WHERE seq IN (SELECT id FROM temp.purge_step) GROUP BY 1, 2, 3 \
     ON CONFLICT (hour, principal, route) DO UPDATE SET \
     repeats = repeats + excluded.repeats, repeat_units = repeat_units + excluded.repeat_units, \
     joined = joined + excluded.joined, replayed = replayed + excluded.replayed"
);

/// One step of a purge at `now`: up to [`PURGE_STEP`] expired records, then as many
/// repeat events, folded into the usage history and deleted, in the writer's
/// transaction. Returns how many records and how many events went; a step that took
/// fewer than [`PURGE_STEP`] of both was the last.
pub(super) fn purge_step(conn: &Connection, now: Timestamp) -> Result<(u64, u64)> {
    let mut gone = [0u64; 2];
    let parts = [
        (
            PICK_RECORDS,
            FOLD_RECORDS,
            "DELETE FROM records WHERE id IN (SELECT id FROM temp.purge_step)",
        ),
        (
            PICK_EVENTS,
            FOLD_EVENTS,
            "DELETE FROM repeat_events WHERE seq IN (SELECT id FROM temp.purge_step)",
        ),
    ];
    for (i, (pick, fold, delete)) in parts.into_iter().enumerate() {
        conn.execute_batch(PICK).map_err(sql_error)?;
        conn.prepare_cached(pick)
            .and_then(|mut st| st.execute(params![now.0, PURGE_STEP]))
            .map_err(sql_error)?;
        conn.prepare_cached(fold)
            .and_then(|mut st| st.execute([]))
            .map_err(sql_error)?;
        gone[i] = conn
            .prepare_cached(delete)
            .and_then(|mut st| st.execute([]))
            .map_err(sql_error)? as u64;
    }
    Ok((gone[0], gone[1]))
}

/// Folds one record that leaves the ledger otherwise (an expired one renewed in place).
pub(super) fn fold_record(conn: &Connection, id: &str) -> Result<()> {
    conn.prepare_cached(concat!(
        "INSERT INTO usage_hours (hour, principal, route, fresh, fresh_units) SELECT ",
        hour!("completed_at"),
        ", principal, route, 1, units FROM records \
         WHERE id = ?1 AND state = 'completed' AND completed_at IS NOT NULL \
         ON CONFLICT (hour, principal, route) DO UPDATE SET \
         fresh = fresh + excluded.fresh, fresh_units = fresh_units + excluded.fresh_units"
    ))
    .and_then(|mut st| st.execute([id]))
    .map_err(sql_error)?;
    Ok(())
}

/// Deletes the hours before `before`.
pub(super) fn purge(conn: &Connection, before: Timestamp) -> Result<u64> {
    conn.prepare_cached("DELETE FROM usage_hours WHERE hour < ?1")
        .and_then(|mut st| st.execute([before.0]))
        .map(|n| n as u64)
        .map_err(sql_error)
}

/// The history from `from` (an hour's start) and what records and events add, per
/// principal, route and hour: three parts, each counted once.
const PARTS: &str = concat!(
    "SELECT hour, principal, route, fresh, fresh_units, repeats, repeat_units, joined, \
     replayed FROM usage_hours WHERE hour >= ?1 \
     UNION ALL SELECT ",
    hour!("completed_at"),
    ", principal, route, COUNT(*), SUM(units), 0, 0, 0, 0 FROM records \
     WHERE state = 'completed' AND completed_at >= ?1 GROUP BY 1, 2, 3 \
     UNION ALL SELECT ",
    hour!("at"),
    ", principal, route, 0, 0, SUM(count), SUM(units), \
     SUM(CASE WHEN kind = 'joined' THEN count ELSE 0 END), \
     SUM(CASE WHEN kind = 'replayed' THEN count ELSE 0 END) FROM repeat_events \
     WHERE at >= ?1 GROUP BY 1, 2, 3"
);

/// Usage per principal, route and hour from `from`.
pub(super) fn by_hour(conn: &Connection, from: i64) -> Result<Vec<UsageHour>> {
    let mut st = conn.prepare_cached(PARTS).map_err(sql_error)?;
    let rows = st.query_map([from], hour_row).map_err(sql_error)?;
    let mut hours = Hours::default();
    for row in rows {
        hours.add(&row.map_err(sql_error)?);
    }
    Ok(hours.into_rows())
}

/// Usage per principal from `from`, summed in the database: each part per principal
/// first (the history streamed from its covering index, in principal order, so a year of
/// ten thousand principals is not sorted), then the parts together.
pub(super) fn per_principal(conn: &Connection, from: i64) -> Result<Vec<UsageRow>> {
    let mut st = conn
        .prepare_cached(
            "SELECT principal, SUM(f), SUM(fu), SUM(r), SUM(ru) FROM (
                 SELECT principal, SUM(fresh) AS f, SUM(fresh_units) AS fu,
                        SUM(repeats) AS r, SUM(repeat_units) AS ru
                 FROM usage_hours INDEXED BY usage_hours_principal
                 WHERE hour >= ?1 GROUP BY principal
                 UNION ALL
                 SELECT principal, COUNT(*), SUM(units), 0, 0 FROM records
                 WHERE state = 'completed' AND completed_at >= ?1 GROUP BY principal
                 UNION ALL
                 SELECT principal, 0, 0, SUM(count), SUM(units) FROM repeat_events
                 WHERE at >= ?1 GROUP BY principal)
             GROUP BY principal",
        )
        .map_err(sql_error)?;
    let rows = st
        .query_map([from], |row| {
            Ok(UsageRow {
                principal: row.get(0)?,
                fresh: row.get::<_, i64>(1)? as u64,
                fresh_units: row.get::<_, i64>(2)? as u64,
                repeats: row.get::<_, i64>(3)? as u64,
                repeat_units: row.get::<_, i64>(4)? as u64,
            })
        })
        .map_err(sql_error)?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .map_err(sql_error)
}

/// The history's hours of `principal` from `from` with repeats, oldest first.
pub(super) fn older_repeats(
    conn: &Connection,
    principal: &str,
    from: i64,
) -> Result<Vec<UsageHour>> {
    let mut st = conn
        .prepare_cached(
            "SELECT hour, principal, route, fresh, fresh_units, repeats, repeat_units, joined, \
             replayed FROM usage_hours WHERE principal = ?1 AND hour >= ?2 AND repeats > 0 \
             ORDER BY hour, route",
        )
        .map_err(sql_error)?;
    let rows = st
        .query_map(params![principal, from], hour_row)
        .map_err(sql_error)?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .map_err(sql_error)
}

/// A row of `hour, principal, route, fresh, fresh_units, repeats, repeat_units, joined,
/// replayed`.
fn hour_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<UsageHour> {
    let count = |i| r.get::<_, i64>(i).map(|n| n as u64);
    Ok(UsageHour {
        hour: Timestamp(r.get(0)?),
        principal: r.get(1)?,
        route: r.get(2)?,
        fresh: count(3)?,
        fresh_units: count(4)?,
        repeats: count(5)?,
        repeat_units: count(6)?,
        joined: count(7)?,
        replayed: count(8)?,
    })
}
