//! The PostgreSQL store's churn table (module `crate::churn`), and how every instance's
//! filter of it is kept: a written entry is announced on the listener's channel in the
//! same statement (a notification is sent at commit), each instance's listener adds what
//! it hears, and reads the table whole whenever it (re)connects, since what was announced
//! while it was away is lost; until then the filter is blind (every claim of a made-up key
//! asks the table).

use oncely_core::RecordId;

use super::listener::{entry, ANNOUNCE, CHANNEL, COLUMNS};
use super::store::PgStore;
use crate::{ChurnEntry, Result};

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

    /// Deletes the entries past their time (by its index: an entry of a record that left
    /// before it costs a claim a lookup, not its answer).
    pub(super) async fn churn_purge(&self) -> Result<()> {
        self.query(
            "DELETE FROM churn WHERE until <= (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $1::bigint",
            &[&self.offset()],
        )
        .await
        .map(|_| ())
    }
}
