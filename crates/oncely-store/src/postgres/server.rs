//! Which server the store reached, checked before the store uses it: a ledger needs a
//! server that takes writes, so a standby (or a server that allows only read-only
//! transactions) is refused at once, in one line that says what to change, instead of
//! failing every claim later; and a URL that lists several hosts without asking for the
//! primary gets a warning, since after a failover it may land on a standby.

use tokio_postgres::{Client, SimpleQueryMessage};

use super::error::unavailable;
use crate::{Result, StoreError};

/// Refuses a server that does not take writes: a standby (in recovery), or one whose
/// sessions are read-only by default.
pub(super) async fn refuse_read_only(client: &Client) -> Result<()> {
    let messages = client
        .simple_query(
            "SELECT pg_is_in_recovery()::text, current_setting('transaction_read_only'), \
             coalesce(host(inet_server_addr()) || ':' || inet_server_port(), 'its socket')",
        )
        .await
        .map_err(unavailable)?;
    let Some(row) = messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => Some(row),
        _ => None,
    }) else {
        return Ok(());
    };
    let in_recovery = row.get(0) == Some("true");
    let read_only = row.get(1) == Some("on");
    let server = row.get(2).unwrap_or("its socket");
    if in_recovery {
        return Err(StoreError::Config(format!(
            "the PostgreSQL server at {server} is a read-only standby, and the ledger needs \
             the primary: list the primary, or add target_session_attrs=read-write to the \
             store URL so that oncely finds it among the hosts"
        )));
    }
    if read_only {
        return Err(StoreError::Config(format!(
            "the PostgreSQL server at {server} allows only read-only transactions \
             (default_transaction_read_only is on for this user or database), and the \
             ledger needs to write"
        )));
    }
    Ok(())
}
