//! What every backend is opened with ([`StoreOptions`]), and a store URL as messages show
//! it ([`redact_url`]).

use std::sync::Arc;

use crate::{Clock, SystemClock};

/// Options common to every backend.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// SQLite `synchronous`: `FULL` (default) or `NORMAL`.
    pub sqlite_synchronous: String,
    /// PostgreSQL pool size.
    pub pool_size: usize,
    /// The clock (tests inject a [`ManualClock`]); PostgreSQL uses the database's clock
    /// and takes only this clock's offset from system time.
    pub clock: Arc<dyn Clock>,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            sqlite_synchronous: "FULL".into(),
            pool_size: 16,
            clock: Arc::new(SystemClock),
        }
    }
}

/// A store URL without its password, for messages: the one in the user part, and a
/// `password` or `sslpassword` parameter. The other parameters (file paths such as
/// `sslkey` included) are shown as they are.
pub fn redact_url(url: &str) -> String {
    let mut shown = url.to_owned();
    if let Some((scheme, rest)) = url.split_once("://") {
        if let Some((userinfo, host)) = rest.split_once('@') {
            if let Some((user, _)) = userinfo.split_once(':') {
                shown = format!("{scheme}://{user}:***@{host}");
            }
        }
    }
    let query_at = shown.find('@').unwrap_or(0);
    let Some(q) = shown[query_at..].find('?').map(|i| query_at + i) else {
        return shown;
    };
    let params: Vec<String> = shown[q + 1..]
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if ["password", "sslpassword"].contains(&key) => format!("{key}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("{}?{}", &shown[..q], params.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            redact_url("postgres://me:secret@db:5432/x"),
            "postgres://me:***@db:5432/x"
        );
        assert_eq!(redact_url("postgres://me@db/x"), "postgres://me@db/x");
        assert_eq!(redact_url("sqlite://a.db"), "sqlite://a.db");
        assert_eq!(
            redact_url("postgres://me@db/x?sslmode=verify-full&password=secret&sslkey=/k.pem"),
            "postgres://me@db/x?sslmode=verify-full&password=***&sslkey=/k.pem"
        );
        assert_eq!(
            redact_url("postgres://me:a?b@db/x?sslpassword=pw&application_name=gw"),
            "postgres://me:***@db/x?sslpassword=***&application_name=gw"
        );
    }
}
