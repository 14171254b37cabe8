//! Repeat events on SQLite (migration 4): one row per repeat a record answered, for
//! statements. Each row copies its record's principal, route and expiry when it is
//! written, so that listing needs no join and purging drops it with its record's window.

use oncely_core::{RecordId, Timestamp};
use rusqlite::{params, Connection};

use super::sql_error;
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
    let mut st = conn
        .prepare_cached(
            "INSERT INTO repeat_events (record_id, principal, route, at, kind, units, expires_at) \
             SELECT id, principal, route, ?2, ?3, ?4, expires_at FROM records WHERE id = ?1",
        )
        .map_err(sql_error)?;
    for r in repeats {
        st.execute(params![id.0, r.at.0, r.kind.as_str(), r.units as i64])
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
