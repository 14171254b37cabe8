//! Records as rows of `records`: the columns ([`COLUMNS`]), a row read back as a record
//! ([`record_from_row`]), and the parameters a record's fields are written as.

use std::time::Duration;

use oncely_core::{Fingerprint, Identity, Record, RecordId, Scope, StoredResponse, Timestamp};
use tokio_postgres::Row;

use super::error::corrupt;
use crate::{Result, StoreError};

/// The columns of a record, in the order [`record_from_row`] reads them by name.
pub(super) const COLUMNS: &[&str] = &[
    "id",
    "scope",
    "key",
    "fingerprint",
    "class",
    "route",
    "principal",
    "state",
    "owner",
    "attempt",
    "lease_until",
    "created_at",
    "updated_at",
    "completed_at",
    "expires_at",
    "response_status",
    "response_headers",
    "response_body",
    "units",
    "repeats",
    "repeat_units",
    "workflow_id",
    "provider_request_id",
    "last_error",
    "waiting",
    "trace",
];

/// `prefix.col, prefix.col, ...`
pub(super) fn cols(prefix: &str) -> String {
    COLUMNS
        .iter()
        .map(|c| format!("{prefix}.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The response of a record as its three columns.
pub(super) struct ResponseColumns {
    pub(super) status: Option<i32>,
    pub(super) headers: Option<String>,
    pub(super) body: Option<Vec<u8>>,
}

impl ResponseColumns {
    pub(super) fn of(response: Option<&StoredResponse>) -> Result<ResponseColumns> {
        Ok(match response {
            None => ResponseColumns {
                status: None,
                headers: None,
                body: None,
            },
            Some(r) => ResponseColumns {
                status: Some(i32::from(r.status)),
                headers: Some(
                    serde_json::to_string(&r.headers)
                        .map_err(|e| StoreError::Corrupt(format!("headers: {e}")))?,
                ),
                body: r.body.as_ref().map(|b| b.to_vec()),
            },
        })
    }
}

/// The record a row of `records` (every column of [`COLUMNS`]) holds.
pub(super) fn record_from_row(row: &Row) -> Result<Record> {
    fn opt_ts(row: &Row, col: &str) -> Result<Option<Timestamp>> {
        Ok(row
            .try_get::<_, Option<i64>>(col)
            .map_err(corrupt)?
            .map(Timestamp))
    }
    let get_str = |col: &str| row.try_get::<_, String>(col).map_err(corrupt);
    let fingerprint: Vec<u8> = row.try_get("fingerprint").map_err(corrupt)?;
    let fingerprint = Fingerprint(
        fingerprint
            .try_into()
            .map_err(|_| StoreError::Corrupt("a fingerprint is not 32 bytes".into()))?,
    );
    let status: Option<i32> = row.try_get("response_status").map_err(corrupt)?;
    let response = match status {
        None => None,
        Some(status) => {
            let headers: Option<String> = row.try_get("response_headers").map_err(corrupt)?;
            Some(StoredResponse {
                status: u16::try_from(status)
                    .map_err(|_| StoreError::Corrupt(format!("response status {status}")))?,
                headers: match headers {
                    None => Vec::new(),
                    Some(h) => serde_json::from_str(&h)
                        .map_err(|e| StoreError::Corrupt(format!("response headers: {e}")))?,
                },
                body: row
                    .try_get::<_, Option<Vec<u8>>>("response_body")
                    .map_err(corrupt)?
                    .map(bytes::Bytes::from),
            })
        }
    };
    let attempt: i32 = row.try_get("attempt").map_err(corrupt)?;
    Ok(Record {
        id: RecordId(get_str("id")?),
        identity: Identity {
            scope: Scope::from_stored(get_str("scope")?),
            key: get_str("key")?,
            fingerprint,
            class: get_str("class")?.parse().map_err(StoreError::Corrupt)?,
            route: get_str("route")?,
            principal: get_str("principal")?,
            workflow_id: row.try_get("workflow_id").map_err(corrupt)?,
        },
        state: get_str("state")?.parse().map_err(StoreError::Corrupt)?,
        owner: row.try_get("owner").map_err(corrupt)?,
        attempt: u32::try_from(attempt)
            .map_err(|_| StoreError::Corrupt(format!("attempt {attempt}")))?,
        lease_until: opt_ts(row, "lease_until")?,
        created_at: Timestamp(row.try_get("created_at").map_err(corrupt)?),
        updated_at: Timestamp(row.try_get("updated_at").map_err(corrupt)?),
        completed_at: opt_ts(row, "completed_at")?,
        expires_at: opt_ts(row, "expires_at")?,
        response,
        units: unsigned(row, "units")?,
        repeats: unsigned(row, "repeats")?,
        repeat_units: unsigned(row, "repeat_units")?,
        provider_request_id: row.try_get("provider_request_id").map_err(corrupt)?,
        last_error: row.try_get("last_error").map_err(corrupt)?,
        trace: row.try_get("trace").map_err(corrupt)?,
    })
}

/// The row a claim hash (`Scope::claim_hash`) found, if it holds that claim's own scope
/// and key: two keys whose hashes collide are refused, never answered with each other's
/// record.
pub(super) fn holding(record: Record, scope: &Scope, key: &str) -> Result<Record> {
    if record.scope == *scope && record.key == key {
        return Ok(record);
    }
    Err(StoreError::Unavailable(format!(
        "claim-hash collision: key {key:?} has the claim hash of record {}'s key; \
         refusing to answer with another key's record",
        record.id
    )))
}

/// A `bigint` column that holds a count.
pub(super) fn unsigned(row: &Row, col: &str) -> Result<u64> {
    let v: i64 = row.try_get(col).map_err(corrupt)?;
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{col} is {v}")))
}

/// A duration in ms, capped so that adding it to a time cannot overflow a bigint.
pub(super) fn millis(d: Duration) -> i64 {
    d.as_millis().min(1_000_000_000_000_000) as i64
}

/// Attempts are `integer` in the table.
pub(super) fn attempt_param(attempt: u32) -> i32 {
    i32::try_from(attempt).unwrap_or(i32::MAX)
}
