//! How SQLite's errors become store errors.

use rusqlite::ErrorCode;

use crate::StoreError;

/// Maps a SQLite error: damaged files are corrupt, everything else (busy, locked, I/O,
/// disk full, cannot open, read-only) makes the ledger unavailable.
pub(super) fn sql_error(e: rusqlite::Error) -> StoreError {
    match &e {
        rusqlite::Error::SqliteFailure(err, _)
            if matches!(
                err.code,
                ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase
            ) =>
        {
            StoreError::Corrupt(e.to_string())
        }
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::IntegralValueOutOfRange(..) => StoreError::Corrupt(e.to_string()),
        _ => StoreError::Unavailable(format!("SQLite: {e}")),
    }
}
