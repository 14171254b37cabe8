//! The PostgreSQL store's churn table (module `crate::churn`), and how every instance's
//! filter of it is kept: a written entry is announced on the listener's channel in the
//! same statement (a notification is sent at commit), each instance's listener adds what
//! it hears, and reads the table whole whenever it (re)connects, since what was announced
//! while it was away is lost; until then the filter is blind (every claim of a made-up key
//! asks the table).

use oncely_core::{RecordId, Timestamp};
use tokio_postgres::{Client, Row};

use super::error::{corrupt, unavailable};
use super::listener::CHANNEL;
use super::store::PgStore;
use crate::{ChurnEntry, ChurnFilter, ChurnKind, Result, StoreError};

/// The prefix of a notification that announces a churn entry (a record id never has it).
pub(super) const ANNOUNCE: &str = "churn:";

const COLUMNS: &str = "hash, record, kind, key, at, until";

fn entry(row: &Row) -> Result<ChurnEntry> {
    let hash: Vec<u8> = row.try_get(0).map_err(corrupt)?;
    let kind: String = row.try_get(2).map_err(corrupt)?;
    Ok(ChurnEntry {
        hash: hash
            .try_into()
            .map_err(|_| StoreError::Corrupt("a churn entry's hash is not 16 bytes".into()))?,
        record: RecordId(row.try_get(1).map_err(corrupt)?),
        kind: ChurnKind::parse(&kind)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown churn entry kind {kind:?}")))?,
        key: row.try_get(3).map_err(corrupt)?,
        at: Timestamp(row.try_get(4).map_err(corrupt)?),
        until: Timestamp(row.try_get(5).map_err(corrupt)?),
    })
}

/// Reads every entry still in its time into `filter` (the listener, on each connect).
pub(super) async fn reload(client: &Client, filter: &ChurnFilter) -> Result<()> {
    let sql = format!(
        "SELECT {COLUMNS} FROM churn \
         WHERE until > (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
    );
    let rows = client.query(&sql, &[]).await.map_err(unavailable)?;
    let entries = rows.iter().map(entry).collect::<Result<Vec<_>>>()?;
    filter.reload(entries);
    Ok(())
}

/// Learns the entry a notification announced (`churn:HASH:KIND:UNTIL:RECORD`).
pub(super) fn heard(payload: &str, filter: &ChurnFilter) {
    let Some(rest) = payload.strip_prefix(ANNOUNCE) else {
        return;
    };
    let mut parts = rest.splitn(4, ':');
    let (Some(hash), Some(kind), Some(until), Some(record)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return;
    };
    let (Some(hash), Some(kind), Ok(until)) =
        (hex_hash(hash), ChurnKind::parse(kind), until.parse::<i64>())
    else {
        return;
    };
    let now = crate::Clock::now(&crate::SystemClock);
    filter.add(hash, RecordId(record.into()), kind, Timestamp(until), now);
}

fn hex_hash(text: &str) -> Option<[u8; 16]> {
    let bytes = hex::decode(text).ok()?;
    bytes.try_into().ok()
}

impl PgStore {
    pub(super) async fn churn_entry(&self, hash: &[u8; 16]) -> Result<Option<ChurnEntry>> {
        let sql = format!("SELECT {COLUMNS} FROM churn WHERE hash = $1");
        let row = self.query_opt(&sql, &[&&hash[..]]).await?;
        row.as_ref().map(entry).transpose()
    }

    /// Inserts unless the hash is held, and announces it in the same statement.
    pub(super) async fn churn_insert(&self, e: &ChurnEntry) -> Result<bool> {
        let sql = format!(
            "WITH ins AS (INSERT INTO churn ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (hash) DO NOTHING RETURNING hash) \
             SELECT pg_notify('{CHANNEL}', '{ANNOUNCE}' || encode(hash, 'hex') || ':' || $3 \
             || ':' || $6::bigint::text || ':' || $2) FROM ins"
        );
        let row = self
            .query_opt(
                &sql,
                &[
                    &&e.hash[..],
                    &e.record.as_str(),
                    &e.kind.as_str(),
                    &e.key,
                    &e.at.0,
                    &e.until.0,
                ],
            )
            .await?;
        let inserted = row.is_some();
        if inserted {
            self.inner.churn.add(
                e.hash,
                e.record.clone(),
                e.kind,
                e.until,
                crate::Clock::now(&crate::SystemClock),
            );
        }
        Ok(inserted)
    }

    pub(super) async fn churn_delete_undelivered(&self, id: &RecordId) -> Result<()> {
        self.inner.churn.delivered(id);
        self.query(
            "DELETE FROM churn WHERE record = $1 AND kind = 'undelivered'",
            &[&id.as_str()],
        )
        .await
        .map(|_| ())
    }

    pub(super) async fn churn_entries(&self, id: &RecordId) -> Result<Vec<ChurnEntry>> {
        let sql = format!("SELECT {COLUMNS} FROM churn WHERE record = $1 ORDER BY at");
        let rows = self.query(&sql, &[&id.as_str()]).await?;
        rows.iter().map(entry).collect()
    }

    /// Deletes the entries past their time or of records that left.
    pub(super) async fn churn_purge(&self) -> Result<()> {
        self.query(
            "DELETE FROM churn WHERE until <= (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $1::bigint \
             OR NOT EXISTS (SELECT 1 FROM records r WHERE r.id = churn.record)",
            &[&self.offset()],
        )
        .await
        .map(|_| ())
    }
}
