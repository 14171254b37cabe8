//! The SQLite store's churn table (module `crate::churn`): entries written in the writer,
//! read on the read connections, and this instance's filter of them, read whole when the
//! store opens.

use async_trait::async_trait;
use oncely_core::{RecordId, Timestamp};
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::error::sql_error;
use super::SqliteStore;
use crate::{ChurnEntry, ChurnKind, Result, StoreError};

const COLUMNS: &str = "hash, record, kind, key, at, until";

/// A row as read, checked by [`parse`].
type Raw = (Vec<u8>, String, String, Option<String>, i64, i64);

fn entry(row: &Row<'_>) -> rusqlite::Result<Raw> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
    ))
}

fn parse(raw: Raw) -> Result<ChurnEntry> {
    let (hash, record, kind, key, at, until) = raw;
    let hash: [u8; 16] = hash
        .try_into()
        .map_err(|_| StoreError::Corrupt("a churn entry's hash is not 16 bytes".into()))?;
    let kind = ChurnKind::parse(&kind)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown churn entry kind {kind:?}")))?;
    Ok(ChurnEntry {
        hash,
        record: RecordId(record),
        kind,
        key,
        at: Timestamp(at),
        until: Timestamp(until),
    })
}

fn select(conn: &Connection, filter: &str, param: &dyn rusqlite::ToSql) -> Result<Vec<ChurnEntry>> {
    let sql = format!("SELECT {COLUMNS} FROM churn WHERE {filter} ORDER BY at");
    let mut stmt = conn.prepare_cached(&sql).map_err(sql_error)?;
    let rows = stmt
        .query_map([param], entry)
        .map_err(sql_error)?
        .collect::<rusqlite::Result<Vec<_>>>()
        .map_err(sql_error)?;
    rows.into_iter().map(parse).collect()
}

impl SqliteStore {
    /// The entries still in their time at `now`, for the filter of a store that opens.
    pub(super) fn live_churn(conn: &Connection, now: Timestamp) -> Result<Vec<ChurnEntry>> {
        select(conn, "until > ?1", &now.0)
    }
}

/// Deletes the entries past their time, by its index; answers how many. (An entry of a
/// record that left before it costs a claim a lookup, not its answer.)
pub(super) fn purge(conn: &Connection, now: Timestamp) -> Result<usize> {
    conn.prepare_cached("DELETE FROM churn WHERE until <= ?1")
        .and_then(|mut s| s.execute([now.0]))
        .map_err(sql_error)
}

#[async_trait]
pub(super) trait ChurnTable {
    async fn get_entry(&self, hash: &[u8; 16]) -> Result<Option<ChurnEntry>>;
    async fn put_entry(&self, entry: &ChurnEntry) -> Result<bool>;
    async fn forget_undelivered(&self, id: &RecordId) -> Result<()>;
    async fn entries_of(&self, id: &RecordId) -> Result<Vec<ChurnEntry>>;
}

#[async_trait]
impl ChurnTable for SqliteStore {
    async fn get_entry(&self, hash: &[u8; 16]) -> Result<Option<ChurnEntry>> {
        let hash = hash.to_vec();
        let raw = self
            .read(move |conn| {
                let sql = format!("SELECT {COLUMNS} FROM churn WHERE hash = ?1");
                conn.prepare_cached(&sql)
                    .and_then(|mut s| s.query_row([&hash], entry).optional())
                    .map_err(sql_error)
            })
            .await?;
        raw.map(parse).transpose()
    }

    async fn put_entry(&self, e: &ChurnEntry) -> Result<bool> {
        let row = e.clone();
        let inserted = self
            .writer
            .run(move |conn, _now| {
                let n = conn
                    .prepare_cached(
                        "INSERT INTO churn (hash, record, kind, key, at, until) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (hash) DO NOTHING",
                    )
                    .and_then(|mut s| {
                        s.execute(params![
                            &row.hash[..],
                            row.record.as_str(),
                            row.kind.as_str(),
                            row.key,
                            row.at.0,
                            row.until.0
                        ])
                    })
                    .map_err(sql_error)?;
                Ok((n == 1, None))
            })
            .await?;
        if inserted {
            let now = self.clock.now();
            self.churn
                .add(e.hash, e.record.clone(), e.kind, e.until, now);
        }
        Ok(inserted)
    }

    async fn forget_undelivered(&self, id: &RecordId) -> Result<()> {
        self.churn.delivered(id);
        let id = id.clone();
        self.writer
            .run(move |conn, _now| {
                conn.prepare_cached("DELETE FROM churn WHERE record = ?1 AND kind = 'undelivered'")
                    .and_then(|mut s| s.execute([id.as_str()]))
                    .map_err(sql_error)?;
                Ok(((), None))
            })
            .await
    }

    async fn entries_of(&self, id: &RecordId) -> Result<Vec<ChurnEntry>> {
        let id = id.0.clone();
        self.read(move |conn| select(conn, "record = ?1", &id))
            .await
    }
}
