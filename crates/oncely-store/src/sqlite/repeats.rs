//! Repeat events on SQLite (migration 4): one row per repeat a record answered, for
//! statements. Each row copies its record's principal, route and expiry when it is
//! written, so that listing needs no join and purging drops it with its record's window.

use oncely_core::{RecordId, Timestamp};
use rusqlite::{params, Connection};

use super::error::sql_error;
use crate::{Repeat, RepeatEvent, RepeatEvents, RepeatKind, Result, StoreError};

/// Migration 4: repeat events.
pub(super) const MIGRATION_SQL: &str = r#"
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

/// How many events one `INSERT` writes. A replay under load is one event, so the writer
/// inserts thousands a second: one statement per row (an `INSERT ... SELECT` each, with
/// its own statement journal) was most of the writer's time on replays.
const ROWS_PER_INSERT: usize = 64;

/// `INSERT INTO repeat_events ... VALUES (...), (...)` with `rows` rows of seven values.
fn insert_sql(rows: usize) -> String {
    let mut sql = String::from(
        "INSERT INTO repeat_events (record_id, principal, route, at, kind, units, expires_at) VALUES ",
    );
    for row in 0..rows {
        if row > 0 {
            sql.push_str(", ");
        }
        let n = row * 7;
        sql.push_str(&format!(
            "(?{}, ?{}, ?{}, ?{}, ?{}, ?{}, ?{})",
            n + 1,
            n + 2,
            n + 3,
            n + 4,
            n + 5,
            n + 6,
            n + 7
        ));
    }
    sql
}

/// Counts the repeats on the record and keeps each one (inside the writer's transaction).
pub(super) fn record(conn: &Connection, id: &RecordId, repeats: &[Repeat]) -> Result<()> {
    let units: u64 = repeats.iter().map(|r| r.units).sum();
    let changed = conn
        .prepare_cached(
            "UPDATE records SET repeats = repeats + ?1, \
             repeat_units = repeat_units + ?2 WHERE id = ?3",
        )
        .and_then(|mut st| st.execute(params![repeats.len() as i64, units as i64, id.0]))
        .map_err(sql_error)?;
    if changed == 0 {
        return Err(StoreError::NotFound(id.clone()));
    }
    if repeats.is_empty() {
        return Ok(());
    }
    // Each event copies its record's principal, route and expiry, read once here.
    let (principal, route, expires_at): (String, String, Option<i64>) = conn
        .prepare_cached("SELECT principal, route, expires_at FROM records WHERE id = ?1")
        .and_then(|mut st| st.query_row([&id.0], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))))
        .map_err(sql_error)?;
    static FULL: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| insert_sql(ROWS_PER_INSERT));
    for chunk in repeats.chunks(ROWS_PER_INSERT) {
        let rows: Vec<(i64, &str, i64)> = chunk
            .iter()
            .map(|r| (r.at.0, r.kind.as_str(), r.units as i64))
            .collect();
        let mut values: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(rows.len() * 7);
        for (at, kind, units) in &rows {
            values.extend_from_slice(&[&id.0, &principal, &route, at, kind, units, &expires_at]);
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

/// Deletes the events whose record's window ended.
pub(super) fn purge(conn: &Connection, now: Timestamp) -> Result<()> {
    conn.prepare_cached("DELETE FROM repeat_events WHERE expires_at IS NULL OR expires_at <= ?1")
        .and_then(|mut st| st.execute([now.0]))
        .map_err(sql_error)?;
    Ok(())
}

/// The repeats of `principal` since `since`, oldest first.
pub(super) fn list(
    conn: &Connection,
    principal: &str,
    since: Option<Timestamp>,
    limit: usize,
) -> Result<RepeatEvents> {
    let since = since.map_or(i64::MIN, |s| s.0);
    let (total, total_units): (i64, i64) = conn
        .prepare_cached(
            "SELECT COUNT(*), COALESCE(SUM(units), 0) FROM repeat_events \
             WHERE principal = ?1 AND at >= ?2",
        )
        .and_then(|mut st| st.query_row(params![principal, since], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(sql_error)?;
    let mut st = conn
        .prepare_cached(
            "SELECT record_id, route, at, kind, units FROM repeat_events \
             WHERE principal = ?1 AND at >= ?2 ORDER BY at, seq LIMIT ?3",
        )
        .map_err(sql_error)?;
    let rows = st
        .query_map(
            params![principal, since, limit.min(i64::MAX as usize) as i64],
            |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            },
        )
        .map_err(sql_error)?;
    let mut listed = Vec::new();
    for row in rows {
        let (record, route, at, kind, units) = row.map_err(sql_error)?;
        let kind = RepeatKind::parse(&kind)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown repeat kind {kind:?}")))?;
        listed.push(RepeatEvent {
            record: RecordId(record),
            route,
            at: Timestamp(at),
            kind,
            units: units as u64,
        });
    }
    Ok(RepeatEvents {
        listed,
        total: total as u64,
        total_units: total_units as u64,
    })
}
