//! How the PostgreSQL store reaches its database: the only module that knows how a
//! connection is made.
//!
//! [`Connector::parse`] reads the store URL: `params` takes out the libpq parameters
//! that tokio-postgres does not know (`sslmode=verify-ca`/`verify-full`, `sslrootcert`,
//! `sslcert`, `sslkey`, `sslsni`), tokio-postgres reads the rest (several hosts,
//! `target_session_attrs`, `connect_timeout`, `application_name`, ...), and oncely adds
//! its defaults.
//! [`Connector::pool`] builds the pool every statement runs on, and
//! [`Connector::dedicated`] opens a connection outside the pool (the listener's, for
//! `LISTEN`); both connect the same way, over TLS as `sslmode` says (`tls`, with SCRAM's
//! channel binding from `binding`). [`checkout`] takes a connection from the pool.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use futures::stream::BoxStream;
use tokio_postgres::{AsyncMessage, Client};

use super::error::unavailable;
use crate::{Result, StoreError};

mod binding;
mod params;
mod tls;

use tls::MakeRustls;

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
    tls: MakeRustls,
}

impl Connector {
    /// Reads `url` (`postgres://USER[:PASS]@HOST[:PORT][,HOST[:PORT]...]/DB[?PARAMS]`)
    /// and the files its TLS parameters name. Unless the URL says otherwise, TLS is used
    /// when the server offers it (`sslmode=prefer`), connecting times out after
    /// [`POOL_TIMEOUT`] and the session's application name is `oncely`.
    pub(super) fn parse(url: &str) -> Result<Connector> {
        let url = params::parse(url)?;
        let mut config: tokio_postgres::Config = url.driver.parse().map_err(|e| {
            StoreError::Config(format!(
                "bad PostgreSQL URL: {}",
                oncely_core::error_chain(&e)
            ))
        })?;
        config.ssl_mode(url.tls.driver_mode());
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(POOL_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("oncely");
        }
        Ok(Connector {
            config,
            tls: MakeRustls::new(&url.tls)?,
        })
    }

    /// A pool of at most `size` connections (at least one), opened as they are needed.
    pub(super) fn pool(&self, size: usize) -> Result<Pool> {
        let manager = Manager::from_config(
            self.config.clone(),
            self.tls.clone(),
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
        let (client, mut connection) = self
            .config
            .connect(self.tls.clone())
            .await
            .map_err(unavailable)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn connector(url: &str) -> Connector {
        Connector::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    #[test]
    fn defaults_are_added_where_the_url_sets_none() {
        let c = connector("postgres://oncely@db/ledger");
        assert_eq!(c.config.get_application_name(), Some("oncely"));
        assert_eq!(c.config.get_connect_timeout(), Some(&POOL_TIMEOUT));
        assert_eq!(
            c.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Prefer
        );
        assert_eq!(c.pool(7).unwrap().status().max_size, 7);
    }

    #[test]
    fn verify_modes_reach_tokio_postgres_as_require() {
        let c = connector("postgres://db/x?sslmode=verify-full&sslrootcert=system");
        assert_eq!(
            c.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        let c = connector("postgres://db/x?sslmode=disable&sslrootcert=/nonexistent.pem");
        assert_eq!(
            c.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Disable
        );
    }

    #[test]
    fn a_bad_url_is_a_config_error() {
        for url in [
            "postgres://db/x?sslmode=verify-everything",
            "postgres://db/x?no_such_parameter=1",
            "postgres://db/x?sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem",
        ] {
            match Connector::parse(url) {
                Err(StoreError::Config(_)) => {}
                Err(other) => panic!("{url}: {other:?}"),
                Ok(_) => panic!("{url}: taken"),
            }
        }
    }
}
