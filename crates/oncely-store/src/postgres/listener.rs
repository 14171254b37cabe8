//! Wake-ups across instances: one dedicated connection per store that `LISTEN`s on
//! [`CHANNEL`] and wakes the local waiters of each record id it hears about.
//!
//! If the connection drops, notifications sent meanwhile are lost; so after every
//! reconnect the listener wakes every local waiter, and each re-reads its record.
//!
//! A new store checks that notifications reach its listener at all ([`check_delivery`]):
//! a pooler that does not keep a session per client (PgBouncer in transaction or
//! statement mode) takes the `LISTEN` and then hands its server connection to others,
//! so nothing would ever wake a waiter of another instance (and named prepared
//! statements, which every statement of the store is, would land on the wrong session).

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use futures::StreamExt;
use oncely_core::{RecordId, Timestamp};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client, Row};

use super::connection::{checkout, Connector};
use super::error::{corrupt, unavailable};
use crate::waiters::Waiters;
use crate::{ChurnEntry, ChurnFilter, ChurnKind, Result, StoreError};

/// The notification channel; the payload is a record id, or a churn entry announced
/// (`ANNOUNCE`).
pub(super) const CHANNEL: &str = "oncely_records";

/// The pause before the listener connects again after its connection was lost (doubled
/// after each failed try, [`oncely_core::backoff`]), and the longest.
const RECONNECT_FIRST: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// How often the idle listener checks that its connection still answers.
const HEARTBEAT: Duration = Duration::from_secs(10);

/// How long [`check_delivery`] waits for each of its notifications (a new one each time):
/// a notification arrives in milliseconds, the longer waits are for a loaded server.
const PROBE_WAITS: [Duration; 3] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

/// Sends a notification of its own through the pool and waits until the listener, which
/// [`start`] started, hears it: [`StoreError::Config`] when it never does.
pub(super) async fn check_delivery(pool: &Pool, waiters: &Waiters) -> Result<()> {
    let probe = RecordId(format!("probe_{}", uuid::Uuid::now_v7().simple()));
    let sub = waiters.subscribe(&probe);
    for wait in PROBE_WAITS {
        let notified = sub.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // The simple protocol: no prepared statement, which a transaction pooler would
        // lose between two messages.
        let client = checkout(pool).await?;
        client
            .batch_execute(&format!("NOTIFY {CHANNEL}, '{}'", probe.0))
            .await
            .map_err(unavailable)?;
        drop(client);
        if tokio::time::timeout(wait, notified).await.is_ok() {
            return Ok(());
        }
    }
    Err(StoreError::Config(
        "PostgreSQL notifications do not reach oncely's listening session: a connection \
         pooler in transaction or statement mode does not keep the session oncely needs \
         (LISTEN/NOTIFY, prepared statements); use PgBouncer with pool_mode = session, or \
         connect to PostgreSQL directly"
            .into(),
    ))
}

/// Starts the listener; returns once it listens (or the first connection failed).
pub(super) async fn start(
    connector: Connector,
    waiters: Arc<Waiters>,
    churn: Arc<ChurnFilter>,
) -> Result<JoinHandle<()>> {
    let (ready_tx, ready_rx) = oneshot::channel();
    let task = tokio::spawn(run(connector, waiters, churn, ready_tx));
    match ready_rx.await {
        Ok(Ok(())) => Ok(task),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(StoreError::Unavailable(
            "the PostgreSQL listener stopped while starting".into(),
        )),
    }
}

async fn run(
    connector: Connector,
    waiters: Arc<Waiters>,
    churn: Arc<ChurnFilter>,
    ready: oneshot::Sender<Result<()>>,
) {
    let mut ready = Some(ready);
    let mut pauses = 0u32;
    loop {
        // Listening first, then reading the churn table: an entry written in between is
        // both heard and read. (The first time, the store reads it once its schema is
        // current, `PgStore::connect`.)
        let connected = match connect(&connector).await {
            Ok((client, messages)) if ready.is_none() => match reload(&client, &churn).await {
                Ok(()) => Ok((client, messages)),
                Err(e) => Err(e),
            },
            other => other,
        };
        match connected {
            Ok((client, mut messages)) => {
                pauses = 0;
                match ready.take() {
                    Some(tx) => {
                        let _ = tx.send(Ok(()));
                    }
                    None => {
                        tracing::info!("PostgreSQL listener reconnected; waking every waiter");
                        waiters.wake_all();
                    }
                }
                listen(&client, &mut messages, &waiters, &churn).await;
                churn.blind();
                tracing::warn!("PostgreSQL listener connection lost; reconnecting");
            }
            Err(e) => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(Err(e));
                    return;
                }
                tracing::warn!(error = %e, backoff = ?pause(pauses),
                    "PostgreSQL listener cannot reconnect");
            }
        }
        // Waiters still wake at their deadline while there is no listener; they also get
        // a wake-up right after the reconnect.
        tokio::time::sleep(pause(pauses)).await;
        pauses = pauses.saturating_add(1);
    }
}

/// The pause after `n` pauses since the last connection that held.
fn pause(n: u32) -> Duration {
    oncely_core::backoff::exponential(RECONNECT_FIRST, n, RECONNECT_MAX)
}

/// Connects and subscribes; the receiver yields notification payloads and closes when
/// the connection ends.
async fn connect(connector: &Connector) -> Result<(Client, mpsc::UnboundedReceiver<String>)> {
    let (client, mut messages) = connector.dedicated().await?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if tx.send(n.payload().to_string()).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "PostgreSQL listener connection failed");
                    return;
                }
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .await
        .map_err(unavailable)?;
    Ok((client, rx))
}

/// Wakes waiters until the connection ends.
async fn listen(
    client: &Client,
    messages: &mut mpsc::UnboundedReceiver<String>,
    waiters: &Waiters,
    churn: &ChurnFilter,
) {
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.tick().await;
    loop {
        tokio::select! {
            payload = messages.recv() => match payload {
                Some(p) if p.starts_with(ANNOUNCE) => heard(&p, churn),
                Some(id) => waiters.wake(&RecordId(id)),
                None => return,
            },
            _ = heartbeat.tick() => {
                let alive = tokio::time::timeout(HEARTBEAT, client.simple_query("SELECT 1")).await;
                if !matches!(alive, Ok(Ok(_))) {
                    return;
                }
            }
        }
    }
}

// The churn table as the listener keeps every instance's filter of it (`super::churn`).

/// The prefix of a notification that announces a churn entry (a record id never has it).
pub(super) const ANNOUNCE: &str = "churn:";

pub(super) const COLUMNS: &str = "hash, record, kind, key, at, until";

pub(super) fn entry(row: &Row) -> Result<ChurnEntry> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnects_pause_50ms_doubling_up_to_5s() {
        let ms = Duration::from_millis;
        let pauses: Vec<_> = (0..9).map(pause).collect();
        assert_eq!(
            pauses,
            [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000].map(ms)
        );
        assert_eq!(pause(u32::MAX), RECONNECT_MAX);
    }
}
