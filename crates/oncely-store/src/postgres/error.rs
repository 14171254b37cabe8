//! How the driver's errors become store errors.

use crate::StoreError;

/// The text of a driver error, with the server's message when there is one, and what it
/// usually means when its code points at a setup mistake rather than an outage.
pub(super) fn error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            format!("{code}: {}{}", db.message(), hint(code))
        }
        None => oncely_core::error_chain(e),
    }
}

/// What an error code says about the setup: a read-only server is a standby (reached
/// because the URL did not ask for the primary, or during a failover); a prepared
/// statement that is missing, or already there, is a pooler that hands one session's
/// statements to another (PgBouncer in transaction mode).
fn hint(code: &str) -> &'static str {
    match code {
        // read_only_sql_transaction
        "25006" => {
            " (the server is read-only: a standby; with several hosts, add \
             target_session_attrs=read-write to the store URL)"
        }
        // invalid_sql_statement_name, duplicate_prepared_statement
        "26000" | "42P05" => {
            " (a pooler in transaction mode? oncely needs a session: PgBouncer pool_mode = \
             session)"
        }
        _ => "",
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
