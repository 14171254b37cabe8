//! How the PostgreSQL store reaches its database: the only module that knows how a
//! connection is made.
//!
//! [`Connector::parse`] reads the store URL: `params` takes out the libpq parameters
//! that tokio-postgres does not know (`sslmode=verify-ca`/`verify-full`, `sslrootcert`,
//! `sslcert`, `sslkey`, `sslsni`) or that oncely applies itself (`statement_timeout` in
//! `options`), tokio-postgres reads the rest (several hosts, `target_session_attrs`,
//! `connect_timeout`, `application_name`, ...), and oncely adds its defaults.
//! [`Connector::pool`] builds the pool every statement runs on, and
//! [`Connector::dedicated`] opens a connection outside the pool (the listener's, for
//! `LISTEN`); both connect the same way, over TLS as `sslmode` says (`tls`, with SCRAM's
//! channel binding from `binding`). [`checkout`] takes a connection from the pool.

use std::time::{Duration, Instant};

use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime,
    TimeoutType,
};
use futures::stream::BoxStream;
use tokio_postgres::{AsyncMessage, Client};

use super::error::unavailable;
use crate::{Result, StoreError};

mod binding;
mod params;
mod tls;

use tls::MakeRustls;

/// How long an operation waits for a free pooled connection before the store answers
/// [`StoreError::Unavailable`].
const POOL_TIMEOUT: Duration = Duration::from_secs(3);

/// How long connecting to one host may take, unless the URL's `connect_timeout` says.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The longest one statement may run, unless the URL's `options` say
/// (`-c statement_timeout=...`): well within a route's default `wait` (20 s) and `lease`
/// (30 s), so that a statement stuck on a lock or a slow server fails the request
/// (503 `store_unavailable`) instead of holding it.
const STATEMENT_TIMEOUT: &str = "10s";

/// What the server sends on a dedicated connection besides its answers (notifications,
/// notices); it ends when the connection does.
pub(super) type Messages = BoxStream<'static, Result<AsyncMessage, tokio_postgres::Error>>;

/// Where and how the store connects: what its URL says, with oncely's defaults.
#[derive(Clone)]
pub(super) struct Connector {
    config: tokio_postgres::Config,
    tls: MakeRustls,
    /// Set on every pooled connection once it is open.
    statement_timeout: String,
}

impl Connector {
    /// Reads `url` (`postgres://USER[:PASS]@HOST[:PORT][,HOST[:PORT]...]/DB[?PARAMS]`)
    /// and the files its TLS parameters name. Unless the URL says otherwise, TLS is used
    /// when the server offers it (`sslmode=prefer`), connecting to a host times out after
    /// [`CONNECT_TIMEOUT`], a statement after [`STATEMENT_TIMEOUT`], and the session's
    /// application name is `oncely`.
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
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("oncely");
        }
        let statement_timeout = match url.statement_timeout {
            Some(value) => checked_duration(&value)?,
            None => STATEMENT_TIMEOUT.to_owned(),
        };
        Ok(Connector {
            config,
            tls: MakeRustls::new(&url.tls)?,
            statement_timeout,
        })
    }

    /// Whether the URL lists several hosts without `target_session_attrs=read-write`: a
    /// new connection then goes to the first host that answers, which after a failover
    /// may be a standby.
    pub(super) fn several_hosts_without_read_write(&self) -> bool {
        let hosts = self
            .config
            .get_hosts()
            .len()
            .max(self.config.get_hostaddrs().len());
        hosts > 1
            && self.config.get_target_session_attrs()
                != tokio_postgres::config::TargetSessionAttrs::ReadWrite
    }

    /// How long opening one connection may take: `connect_timeout` for each host it may
    /// try (as libpq's is), TLS and authentication included.
    fn open_timeout(&self) -> Duration {
        let hosts = self
            .config
            .get_hosts()
            .len()
            .max(self.config.get_hostaddrs().len())
            .max(1);
        let per_host = self
            .config
            .get_connect_timeout()
            .unwrap_or(&CONNECT_TIMEOUT);
        per_host.saturating_mul(u32::try_from(hosts).unwrap_or(u32::MAX))
    }

    /// A pool of at most `size` connections (at least one), opened as they are needed,
    /// each with the statement timeout set (with `SET`, not a startup option, so that a
    /// pooler which refuses startup options, as PgBouncer does, still gets it).
    pub(super) fn pool(&self, size: usize) -> Result<Pool> {
        let manager = Manager::from_config(
            self.config.clone(),
            self.tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let set = format!("SET statement_timeout = '{}'", self.statement_timeout);
        Pool::builder(manager)
            .max_size(size.max(1))
            .wait_timeout(Some(POOL_TIMEOUT))
            .create_timeout(Some(self.open_timeout()))
            .recycle_timeout(Some(POOL_TIMEOUT))
            .post_create(Hook::async_fn(move |client, _| {
                let set = set.clone();
                Box::pin(
                    async move { client.batch_execute(&set).await.map_err(HookError::Backend) },
                )
            }))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| StoreError::Config(format!("PostgreSQL pool: {e}")))
    }

    /// A new connection outside the pool: its client, and the messages the server sends
    /// on it. The client's statements make progress only while the messages are polled.
    pub(super) async fn dedicated(&self) -> Result<(Client, Messages)> {
        let within = self.open_timeout();
        let (client, mut connection) =
            tokio::time::timeout(within, self.config.connect(self.tls.clone()))
                .await
                .map_err(|_| {
                    StoreError::Unavailable(format!("PostgreSQL: no connection within {within:?}"))
                })?
                .map_err(unavailable)?;
        let messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        Ok((client, Box::pin(messages)))
    }
}

/// `value` if it reads as a PostgreSQL duration (`250ms`, `5s`, `1min`, `5000`, `0` for
/// none), so that it can be quoted into `SET` as it is.
fn checked_duration(value: &str) -> Result<String> {
    let number_end = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(number_end);
    let number_ok = !number.is_empty()
        && number.split('.').count() <= 2
        && number.split('.').all(|part| !part.is_empty());
    if number_ok && ["", "us", "ms", "s", "min", "h", "d"].contains(&unit.trim_start()) {
        Ok(value.to_owned())
    } else {
        Err(StoreError::Config(format!(
            "bad PostgreSQL URL: statement_timeout {value:?} is not a duration (e.g. 5s, \
             500ms, 1min, 0 for none)"
        )))
    }
}

/// A connection from `pool`: [`StoreError::Unavailable`] when none frees up, or none
/// can be opened, within the pool's timeouts.
pub(super) async fn checkout(pool: &Pool) -> Result<Conn> {
    let object = pool.get().await.map_err(|e| pool_error(pool, e))?;
    Ok(Conn {
        object: Some(object),
        since: Instant::now(),
    })
}

/// How long a connection may be out of the pool and still go back to it. An operation
/// takes milliseconds; one that held its connection this long was most likely cut off by
/// the store's bound ([`crate::ANSWER_WITHIN`]) with a statement unanswered, on a server
/// that is paused or a network path that went dark. Such a connection is closed instead
/// of handed to the next operation, so a dark connection costs one bound, not one per
/// operation that draws it; a connection the server closed is never handed out either
/// (the pool's recycling checks it).
const RETURN_WITHIN: Duration = Duration::from_secs(5);

/// A pooled connection, returned to its pool when dropped unless it was held past
/// [`RETURN_WITHIN`].
pub(super) struct Conn {
    object: Option<Object>,
    since: Instant,
}

impl std::ops::Deref for Conn {
    type Target = Object;

    fn deref(&self) -> &Object {
        self.object.as_ref().expect("a connection until dropped")
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Object {
        self.object.as_mut().expect("a connection until dropped")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(object) = self.object.take() {
            if self.since.elapsed() >= RETURN_WITHIN {
                tracing::debug!(target: "oncely::store", held_ms = self.since.elapsed().as_millis() as u64,
                    "closing a PostgreSQL connection that was held past its bound");
                drop(Object::take(object));
            }
        }
    }
}

fn pool_error(pool: &Pool, e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) | PoolError::PostCreateHook(HookError::Backend(e)) => unavailable(e),
        PoolError::Timeout(kind) => {
            let timeouts = pool.timeouts();
            let within = match kind {
                TimeoutType::Wait => timeouts.wait,
                TimeoutType::Create => timeouts.create,
                TimeoutType::Recycle => timeouts.recycle,
            };
            StoreError::Unavailable(format!(
                "PostgreSQL: no connection within {:?} ({kind:?})",
                within.unwrap_or_default()
            ))
        }
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
    fn several_hosts_without_read_write_is_told_apart() {
        for (url, warn) in [
            ("postgres://u@a:1,b:2/db", true),
            ("postgres://u@a:1,b:2/db?target_session_attrs=any", true),
            ("postgres://u@a:1,b:2/db?application_name=x", true),
            ("postgres://u:p,w@a:1/db", false),
            ("postgres://u@a:1/db", false),
            (
                "postgres://u@a:1,b:2/db?target_session_attrs=read-write",
                false,
            ),
            (
                "postgresql://u@a,b/db?connect_timeout=2&target_session_attrs=read-write",
                false,
            ),
        ] {
            assert_eq!(
                connector(url).several_hosts_without_read_write(),
                warn,
                "{url}"
            );
        }
    }

    #[test]
    fn defaults_are_added_where_the_url_sets_none() {
        let c = connector("postgres://oncely@db/ledger");
        assert_eq!(c.config.get_application_name(), Some("oncely"));
        assert_eq!(c.config.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(
            c.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Prefer
        );
        assert_eq!(c.statement_timeout, STATEMENT_TIMEOUT);
        assert_eq!(c.open_timeout(), CONNECT_TIMEOUT);
        let pool = c.pool(7).unwrap();
        assert_eq!(pool.status().max_size, 7);
        let timeouts = pool.timeouts();
        assert_eq!(timeouts.wait, Some(POOL_TIMEOUT));
        assert_eq!(timeouts.create, Some(CONNECT_TIMEOUT));
        assert_eq!(c.pool(0).unwrap().status().max_size, 1);
    }

    #[test]
    fn the_url_sets_the_limits_in_libpq_spelling() {
        let c = connector(
            "postgres://oncely@pg1:5432,pg2:5432/ledger?application_name=billing-gw\
             &connect_timeout=5&options=-c%20statement_timeout%3D1500ms&sslmode=require",
        );
        assert_eq!(c.config.get_application_name(), Some("billing-gw"));
        assert_eq!(
            c.config.get_connect_timeout(),
            Some(&Duration::from_secs(5))
        );
        assert_eq!(
            c.config.get_options(),
            None,
            "taken out of the startup options"
        );
        assert_eq!(c.statement_timeout, "1500ms");
        assert_eq!(
            c.config.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        // Each of the two hosts may take its connect_timeout.
        assert_eq!(c.open_timeout(), Duration::from_secs(10));
        assert_eq!(
            c.pool(4).unwrap().timeouts().create,
            Some(Duration::from_secs(10))
        );
        for ok in ["0", "250ms", "5s", "1.5min", "5000", "2 h"] {
            assert_eq!(checked_duration(ok).unwrap(), ok);
        }
        for bad in [
            "",
            "5sec",
            "1';DROP%20TABLE%20records;--",
            "1..2s",
            "-1",
            ".5s",
        ] {
            let url = format!("postgres://db/x?options=-cstatement_timeout%3D{bad}");
            match Connector::parse(&url) {
                Err(StoreError::Config(m)) => assert!(m.contains("statement_timeout"), "{m}"),
                Err(other) => panic!("{bad:?}: {other:?}"),
                Ok(_) => panic!("{bad:?} was taken"),
            }
        }
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
