//! Repeat events on SQLite (migration 4; `count` since migration 5): one row per repeat a
//! record answered (or per several, summed, see `Repeat`), for statements and usage. Each
//! row copies its record's principal, route and expiry when it is written, so that
//! listing needs no join and purging (which folds it into the usage history) drops it
//! with its record's window.

use oncely_core::{RecordId, Timestamp};
use rusqlite::{params, Connection, OptionalExtension};

use super::error::sql_error;
use crate::{Repeat, RepeatEvent, RepeatEvents, RepeatKind, Result, StoreError};

/// How many events one `INSERT` writes. A replay under load is one event, so the writer
/// inserts thousands a second: one statement per row (an `INSERT ... SELECT` each, with
/// its own statement journal) was most of the writer's time on replays.
const ROWS_PER_INSERT: usize = 64;

/// `INSERT INTO repeat_events ... VALUES (...), (...)` with `rows` rows of eight values.
fn insert_sql(rows: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO repeat_events \
         (record_id, principal, route, at, kind, count, units, expires_at) VALUES ",
    );
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        let n = row * 8;
        let marks: Vec<String> = (1..=8).map(|i| format!("?{}", n + i)).collect();
        sql.push_str(&format!("({})", marks.join(", ")));
    }
    sql
}

/// Counts the repeats on the record and keeps each one (inside the writer's transaction).
/// A record already purged keeps them all the same, to be folded at the next purge.
pub(super) fn record(
    conn: &Connection,
    id: &RecordId,
    principal: &str,
    route: &str,
    repeats: &[Repeat],
) -> Result<()> {
    let count: u64 = repeats.iter().map(|r| r.count).sum();
    let units: u64 = repeats.iter().map(|r| r.units).sum();
    // The record's expiry, which its events keep; none (folded at the next purge) when
    // the record is gone.
    let expires_at: Option<i64> = conn
        .prepare_cached(
            "UPDATE records SET repeats = repeats + ?1, repeat_units = repeat_units + ?2 \
             WHERE id = ?3 RETURNING expires_at",
        )
        .and_then(|mut st| {
            st.query_row(params![count as i64, units as i64, id.0], |r| r.get(0))
                .optional()
        })
        .map_err(sql_error)?
        .flatten();
    static FULL: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| insert_sql(ROWS_PER_INSERT));
    for chunk in repeats.chunks(ROWS_PER_INSERT) {
        let rows: Vec<(i64, &str, i64, i64)> = chunk
            .iter()
            .map(|r| (r.at.0, r.kind.as_str(), r.count as i64, r.units as i64))
            .collect();
        let mut values: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(rows.len() * 8);
        for (at, kind, count, units) in &rows {
            values.extend_from_slice(&[
                &id.0,
                &principal,
                &route,
                at,
                kind,
                count,
                units,
                &expires_at,
            ]);
        }
        // The full-size statement stays in the connection's cache; a shorter last chunk's
        // is prepared for this once (its length varies, and would crowd the cache).
        if chunk.len() == ROWS_PER_INSERT {
            conn.prepare_cached(&FULL)
                .and_then(|mut st| st.execute(values.as_slice()))
        } else {
            conn.prepare(&insert_sql(chunk.len()))
                .and_then(|mut st| st.execute(values.as_slice()))
        }
        .map_err(sql_error)?;
    }
    Ok(())
}

/// The repeats of `principal` from `from` still held one by one, oldest first (the
/// caller adds the history's).
pub(super) fn list(
    conn: &Connection,
    principal: &str,
    from: i64,
    limit: usize,
) -> Result<RepeatEvents> {
    let (total, total_units): (i64, i64) = conn
        .prepare_cached(
            "SELECT COALESCE(SUM(count), 0), COALESCE(SUM(units), 0) FROM repeat_events \
             WHERE principal = ?1 AND at >= ?2",
        )
        .and_then(|mut st| st.query_row(params![principal, from], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(sql_error)?;
    let mut st = conn
        .prepare_cached(
            "SELECT record_id, route, at, kind, count, units FROM repeat_events \
             WHERE principal = ?1 AND at >= ?2 ORDER BY at, seq LIMIT ?3",
        )
        .map_err(sql_error)?;
    let rows = st
        .query_map(
            params![principal, from, limit.min(i64::MAX as usize) as i64],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, i64>(5)?,
                ))
            },
        )
        .map_err(sql_error)?;
    let mut listed = Vec::new();
    for row in rows {
        let (record, route, at, kind, count, units) = row.map_err(sql_error)?;
        let kind = RepeatKind::parse(&kind)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown repeat kind {kind:?}")))?;
        listed.push(RepeatEvent {
            record: RecordId(record),
            route,
            at: Timestamp(at),
            kind,
            count: count as u64,
            units: units as u64,
        });
    }
    Ok(RepeatEvents {
        listed,
        older: Vec::new(),
        total: total as u64,
        total_units: total_units as u64,
    })
}
