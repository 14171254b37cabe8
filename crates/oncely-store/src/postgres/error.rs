//! How the driver's errors become store errors.

use crate::StoreError;

/// The text of a driver error, with the server's message when there is one.
pub(super) fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => oncely_core::error_chain(e),
    }
}

/// A statement failed: the ledger is unavailable.
pub(super) fn unavailable(e: tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(format!("PostgreSQL: {}", error_text(&e)))
}

/// A column could not be read back.
pub(super) fn corrupt(e: tokio_postgres::Error) -> StoreError {
    StoreError::Corrupt(error_text(&e))
}
