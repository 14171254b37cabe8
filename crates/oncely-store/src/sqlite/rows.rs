//! Records to and from rows of the `records` table, and the statements both the writer
//! and the readers run.

use oncely_core::{Fingerprint, Identity, Record, RecordId, Scope, StoredResponse, Timestamp};
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, Row};
use std::sync::LazyLock;

use super::error::sql_error;
use crate::replays::ReplayCache;
use crate::{ListFilter, Result, StoreError};

/// The columns of a record, in the order [`from_row`] reads them.
pub(super) const COLUMNS: &str = "id, scope, key, fingerprint, class, route, principal, state, \
     owner, attempt, lease_until, created_at, updated_at, completed_at, expires_at, status, \
     headers, body, units, repeats, repeat_units, workflow_id, provider_request_id, last_error, \
     trace";

/// A column that holds text the record types did not accept.
fn corrupt(column: usize, what: String) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(
        column,
        rusqlite::types::Type::Text,
        Box::<dyn std::error::Error + Send + Sync>::from(what),
    )
}

/// Reads a record from a row of `SELECT {COLUMNS}`.
pub(super) fn from_row(row: &Row<'_>) -> rusqlite::Result<Record> {
    let fingerprint: String = row.get(3)?;
    let class: String = row.get(4)?;
    let state: String = row.get(7)?;
    let status: Option<i64> = row.get(15)?;
    let response = match status {
        None => None,
        Some(status) => {
            let headers: Option<String> = row.get(16)?;
            let headers: Vec<(String, String)> = match headers {
                Some(text) => serde_json::from_str(&text)
                    .map_err(|e| corrupt(16, format!("stored headers: {e}")))?,
                None => Vec::new(),
            };
            Some(StoredResponse {
                status: u16::try_from(status)
                    .map_err(|_| corrupt(15, format!("stored status {status}")))?,
                headers,
                body: row.get::<_, Option<Vec<u8>>>(17)?.map(bytes::Bytes::from),
            })
        }
    };
    Ok(Record {
        id: RecordId(row.get(0)?),
        identity: Identity {
            scope: Scope::from_stored(row.get(1)?),
            key: row.get(2)?,
            fingerprint: Fingerprint::from_hex(&fingerprint)
                .ok_or_else(|| corrupt(3, format!("stored fingerprint {fingerprint:?}")))?,
            class: class.parse().map_err(|e: String| corrupt(4, e))?,
            route: row.get(5)?,
            principal: row.get(6)?,
            workflow_id: row.get(21)?,
        },
        state: state.parse().map_err(|e: String| corrupt(7, e))?,
        owner: row.get(8)?,
        attempt: row.get(9)?,
        lease_until: row.get::<_, Option<i64>>(10)?.map(Timestamp),
        created_at: Timestamp(row.get(11)?),
        updated_at: Timestamp(row.get(12)?),
        completed_at: row.get::<_, Option<i64>>(13)?.map(Timestamp),
        expires_at: row.get::<_, Option<i64>>(14)?.map(Timestamp),
        response,
        units: row.get::<_, i64>(18)? as u64,
        repeats: row.get::<_, i64>(19)? as u64,
        repeat_units: row.get::<_, i64>(20)? as u64,
        provider_request_id: row.get(22)?,
        last_error: row.get(23)?,
        trace: row.get(24)?,
    })
}

/// The record with this id.
pub(super) fn by_id(conn: &Connection, id: &RecordId) -> Result<Option<Record>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM records WHERE id = ?1"))
        .and_then(|mut st| st.query_row([id.as_str()], from_row).optional())
        .map_err(sql_error)
}

/// The record holding `(scope, key)`, found by its claim hash. A row whose scope or key
/// differ would be a collision of the hash: refused, never taken for the record.
pub(super) fn by_key(conn: &Connection, scope: &Scope, key: &str) -> Result<Option<Record>> {
    static SQL: LazyLock<String> =
        LazyLock::new(|| format!("SELECT {COLUMNS} FROM records WHERE claim = ?1"));
    let found = conn
        .prepare_cached(&SQL)
        .and_then(|mut st| {
            st.query_row([&scope.claim_hash(key)[..]], from_row)
                .optional()
        })
        .map_err(sql_error)?;
    found.map(|r| holding(r, scope, key)).transpose()
}

/// `record`, found by the claim hash of `(scope, key)`, if it holds them: one whose scope
/// or key differ is a collision of the hash, refused.
fn holding(record: Record, scope: &Scope, key: &str) -> Result<Record> {
    if record.scope != *scope || record.key != key {
        return Err(StoreError::Unavailable(format!(
            "record {} holds the claim hash of another key; refusing to use it",
            record.id
        )));
    }
    Ok(record)
}

/// [`by_key`], without reading a body larger than the replay cache keeps when a replay
/// of the record still holds it ([`ReplayCache::held`]): a claim of a record with an
/// 8 MB answer costs the writer that read once, however many replays of it are in
/// flight, not once each.
pub(super) fn by_key_sharing(
    conn: &Connection,
    scope: &Scope,
    key: &str,
    cache: &ReplayCache,
) -> Result<Option<Record>> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        let columns = COLUMNS.replace(
            "headers, body,",
            "headers, CASE WHEN length(body) > ?2 THEN NULL ELSE body END,",
        );
        format!("SELECT {columns}, length(body) FROM records WHERE claim = ?1")
    });
    let max = cache.max_body() as i64;
    let found = conn
        .prepare_cached(&SQL)
        .and_then(|mut st| {
            st.query_row(rusqlite::params![&scope.claim_hash(key)[..], max], |row| {
                Ok((from_row(row)?, row.get::<_, Option<i64>>(25)?))
            })
            .optional()
        })
        .map_err(sql_error)?;
    let Some((record, len)) = found else {
        return Ok(None);
    };
    let mut record = holding(record, scope, key)?;
    if let (Some(len), Some(response)) = (len.filter(|n| *n > max), record.response.as_mut()) {
        response.body = match cache.held(&record.id, record.attempt, len as usize) {
            Some(held) => Some(held),
            None => conn
                .prepare_cached("SELECT body FROM records WHERE id = ?1")
                .and_then(|mut st| {
                    st.query_row([record.id.as_str()], |r| r.get::<_, Option<Vec<u8>>>(0))
                })
                .map_err(sql_error)?
                .map(bytes::Bytes::from),
        };
    }
    Ok(Some(record))
}

/// The record's values, in [`COLUMNS`] order.
fn values(r: &Record) -> Result<[Value; 25]> {
    let (status, headers, body) = match &r.response {
        None => (Value::Null, Value::Null, Value::Null),
        Some(resp) => (
            Value::Integer(i64::from(resp.status)),
            Value::Text(serde_json::to_string(&resp.headers).map_err(|e| {
                StoreError::Unavailable(format!("cannot encode response headers: {e}"))
            })?),
            resp.body
                .as_ref()
                .map_or(Value::Null, |b| Value::Blob(b.to_vec())),
        ),
    };
    let text = |s: &Option<String>| s.clone().map_or(Value::Null, Value::Text);
    let time = |t: Option<Timestamp>| t.map_or(Value::Null, |t| Value::Integer(t.0));
    Ok([
        Value::Text(r.id.0.clone()),
        Value::Text(r.scope.as_str().to_string()),
        Value::Text(r.key.clone()),
        Value::Text(r.fingerprint.to_hex()),
        Value::Text(r.class.as_str().to_string()),
        Value::Text(r.route.clone()),
        Value::Text(r.principal.clone()),
        Value::Text(r.state.as_str().to_string()),
        text(&r.owner),
        Value::Integer(i64::from(r.attempt)),
        time(r.lease_until),
        Value::Integer(r.created_at.0),
        Value::Integer(r.updated_at.0),
        time(r.completed_at),
        time(r.expires_at),
        status,
        headers,
        body,
        Value::Integer(r.units as i64),
        Value::Integer(r.repeats as i64),
        Value::Integer(r.repeat_units as i64),
        text(&r.workflow_id),
        text(&r.provider_request_id),
        text(&r.last_error),
        text(&r.trace),
    ])
}

/// A new row's values: [`values`], then its claim hash (which a transition never
/// changes, so only an insert computes it).
fn insert_values(r: &Record) -> Result<impl Iterator<Item = Value>> {
    let claim = Value::Blob(r.scope.claim_hash(&r.key).to_vec());
    Ok(values(r)?.into_iter().chain(std::iter::once(claim)))
}

/// `INSERT INTO records (COLUMNS, claim) VALUES (?1, ..., ?26)` with `tail` after it.
fn insert_sql(tail: &str) -> String {
    let placeholders = (1..=26).map(|i| format!("?{i}")).collect::<Vec<_>>();
    format!(
        "INSERT INTO records ({COLUMNS}, claim) VALUES ({}){tail}",
        placeholders.join(", ")
    )
}

/// Inserts a new record.
pub(super) fn insert(conn: &Connection, r: &Record) -> Result<()> {
    static SQL: LazyLock<String> = LazyLock::new(|| insert_sql(""));
    let vals = insert_values(r)?;
    conn.prepare_cached(&SQL)
        .and_then(|mut st| st.execute(rusqlite::params_from_iter(vals)))
        .map_err(sql_error)?;
    Ok(())
}

/// Inserts a new record unless a row already holds its `(scope, key)`; returns whether it
/// did. One statement where a claim of a new key used to read first and then insert.
pub(super) fn insert_new(conn: &Connection, r: &Record) -> Result<bool> {
    static SQL: LazyLock<String> = LazyLock::new(|| insert_sql(" ON CONFLICT (claim) DO NOTHING"));
    let vals = insert_values(r)?;
    let inserted = conn
        .prepare_cached(&SQL)
        .and_then(|mut st| st.execute(rusqlite::params_from_iter(vals)))
        .map_err(sql_error)?;
    Ok(inserted == 1)
}

/// Replaces the row that had id `old_id` with `r`, a new intention under the same key
/// (with a new id, so that lists, newest first by id, show it as new).
pub(super) fn replace(conn: &Connection, old_id: &RecordId, r: &Record) -> Result<()> {
    let gone = conn
        .prepare_cached("DELETE FROM records WHERE id = ?1")
        .and_then(|mut st| st.execute([old_id.as_str()]))
        .map_err(sql_error)?;
    if gone == 0 {
        return Err(StoreError::NotFound(old_id.clone()));
    }
    insert(conn, r)
}

/// The columns a transition of one record may change: everything but its identity
/// (`id`, `scope`, `key`, `fingerprint`, `class`, `route`, `principal`, `created_at`,
/// and the claim hash of scope and key), so the unique index on those is left alone.
const MUTABLE: [(&str, usize); 17] = [
    ("state", 7),
    ("owner", 8),
    ("attempt", 9),
    ("lease_until", 10),
    ("updated_at", 12),
    ("completed_at", 13),
    ("expires_at", 14),
    ("status", 15),
    ("headers", 16),
    ("body", 17),
    ("units", 18),
    ("repeats", 19),
    ("repeat_units", 20),
    ("workflow_id", 21),
    ("provider_request_id", 22),
    ("last_error", 23),
    ("trace", 24),
];

/// Writes back what a transition changed in `r` (same id, same identity).
pub(super) fn update_state(conn: &Connection, r: &Record) -> Result<()> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        let sets = MUTABLE
            .iter()
            .enumerate()
            .map(|(i, (c, _))| format!("{c} = ?{}", i + 1))
            .collect::<Vec<_>>();
        format!(
            "UPDATE records SET {} WHERE id = ?{}",
            sets.join(", "),
            MUTABLE.len() + 1
        )
    });
    let mut all = values(r)?;
    let mut vals: Vec<Value> = MUTABLE
        .iter()
        .map(|(_, i)| std::mem::replace(&mut all[*i], Value::Null))
        .collect();
    vals.push(Value::Text(r.id.0.clone()));
    let changed = conn
        .prepare_cached(&SQL)
        .and_then(|mut st| st.execute(rusqlite::params_from_iter(vals)))
        .map_err(sql_error)?;
    if changed == 0 {
        return Err(StoreError::NotFound(r.id.clone()));
    }
    Ok(())
}

/// Records matching `filter`, newest first (by id: a UUIDv7, time-ordered). A state
/// other than `completed` is read through the small partial index of records not
/// completed.
pub(super) fn list(conn: &Connection, filter: &ListFilter) -> Result<Vec<Record>> {
    let mut clauses = Vec::new();
    let mut args: Vec<Value> = Vec::new();
    if let Some(state) = filter.state {
        args.push(Value::Text(state.as_str().into()));
        clauses.push(format!("state = ?{}", args.len()));
        if state != oncely_core::State::Completed {
            // The partial index's own condition, so that the planner may use it.
            clauses.push("state <> 'completed'".into());
        }
    }
    if let Some(p) = &filter.principal {
        args.push(Value::Text(p.clone()));
        clauses.push(format!("principal = ?{}", args.len()));
    }
    if let Some(route) = &filter.route {
        args.push(Value::Text(route.clone()));
        clauses.push(format!("route = ?{}", args.len()));
    }
    let mut sql = format!("SELECT {COLUMNS} FROM records");
    if !clauses.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&clauses.join(" AND "));
    }
    sql.push_str(" ORDER BY id DESC");
    if let Some(limit) = filter.limit {
        args.push(Value::Integer(i64::try_from(limit).unwrap_or(i64::MAX)));
        sql.push_str(&format!(" LIMIT ?{}", args.len()));
    }
    let mut st = conn.prepare_cached(&sql).map_err(sql_error)?;
    let rows = st
        .query_map(rusqlite::params_from_iter(args), from_row)
        .map_err(sql_error)?;
    rows.collect::<rusqlite::Result<Vec<_>>>()
        .map_err(sql_error)
}
