//! How the PostgreSQL store reaches its database: the only module that knows how a
//! connection is made.
//!
//! [`Connector::parse`] reads the store URL (with the defaults oncely adds),
//! [`Connector::pool`] builds the pool every statement runs on, and
//! [`Connector::dedicated`] opens a connection outside the pool (the listener's, for
//! `LISTEN`). [`checkout`] takes a connection from the pool. Connections are plain TCP
//! (no TLS): run PostgreSQL on a private network or through a local proxy.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use futures::stream::BoxStream;
use tokio_postgres::{AsyncMessage, Client, NoTls};

use super::error::unavailable;
use crate::{Result, StoreError};

/// How long an operation waits for a pooled connection, or for a new one, before the
/// store answers [`StoreError::Unavailable`].
const POOL_TIMEOUT: Duration = Duration::from_secs(3);

/// What the server sends on a dedicated connection besides its answers (notifications,
/// notices); it ends when the connection does.
pub(super) type Messages = BoxStream<'static, Result<AsyncMessage, tokio_postgres::Error>>;

/// Where and how the store connects: what its URL says, with oncely's defaults.
#[derive(Clone)]
pub(super) struct Connector {
    config: tokio_postgres::Config,
}

impl Connector {
    /// Reads `url` (`postgres://USER[:PASS]@HOST[:PORT]/DB[?options=...]`). Unless the
    /// URL says otherwise, connecting times out after [`POOL_TIMEOUT`] and the session's
    /// application name is `oncely`.
    pub(super) fn parse(url: &str) -> Result<Connector> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            StoreError::Config(format!(
                "bad PostgreSQL URL: {}",
                oncely_core::error_chain(&e)
            ))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(POOL_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("oncely");
        }
        Ok(Connector { config })
    }

    /// A pool of at most `size` connections (at least one), opened as they are needed.
    pub(super) fn pool(&self, size: usize) -> Result<Pool> {
        let manager = Manager::from_config(
            self.config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        Pool::builder(manager)
            .max_size(size.max(1))
            .wait_timeout(Some(POOL_TIMEOUT))
            .create_timeout(Some(POOL_TIMEOUT))
            .recycle_timeout(Some(POOL_TIMEOUT))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Config(format!("PostgreSQL pool: {e}")))
    }

    /// A new connection outside the pool: its client, and the messages the server sends
    /// on it. The client's statements make progress only while the messages are polled.
    pub(super) async fn dedicated(&self) -> Result<(Client, Messages)> {
        let (client, mut connection) = self.config.connect(NoTls).await.map_err(unavailable)?;
        let messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        Ok((client, Box::pin(messages)))
    }
}

/// A connection from `pool`: [`StoreError::Unavailable`] when none frees up, or none
/// can be opened, within [`POOL_TIMEOUT`].
pub(super) async fn checkout(pool: &Pool) -> Result<Object> {
    pool.get().await.map_err(pool_error)
}

fn pool_error(e: deadpool_postgres::PoolError) -> StoreError {
    use deadpool_postgres::PoolError;
    match e {
        PoolError::Backend(e) => unavailable(e),
        PoolError::Timeout(kind) => StoreError::Unavailable(format!(
            "PostgreSQL: no connection within {POOL_TIMEOUT:?} ({kind:?})"
        )),
        other => StoreError::Unavailable(format!("PostgreSQL pool: {other}")),
    }
}
