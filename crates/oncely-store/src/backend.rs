//! Which backend a store URL names: [`open`] hands `sqlite://`, `postgres://` and
//! `memory:` URLs to their backends, and names the cargo feature of a driver that is not
//! compiled in.

use std::sync::Arc;

use crate::{memory, Bounded, Result, Store, StoreError, StoreOptions, ANSWER_WITHIN};

/// Opens (and migrates) the store a URL names: `sqlite://PATH` or
/// `postgres://USER[:PASS]@HOST[:PORT]/DB`, every operation bounded by
/// [`ANSWER_WITHIN`] ([`Bounded`]).
pub async fn open(url: &str, options: StoreOptions) -> Result<Arc<dyn Store>> {
    let store = open_unbounded(url, options).await?;
    Ok(Arc::new(Bounded::new(store, ANSWER_WITHIN)))
}

async fn open_unbounded(url: &str, options: StoreOptions) -> Result<Arc<dyn Store>> {
    if let Some(path) = url.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err(StoreError::Config(
                "sqlite:// needs a file path, e.g. sqlite://oncely.db".into(),
            ));
        }
        open_sqlite(path, options).await
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        open_postgres(url, options).await
    } else if url == "memory:" || url == "memory://" {
        Ok(Arc::new(memory::MemoryStore::new(options.clock)))
    } else {
        Err(StoreError::Config(format!(
            "unknown store {url:?}: use sqlite://PATH or postgres://USER@HOST/DB"
        )))
    }
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(path: &str, options: StoreOptions) -> Result<Arc<dyn Store>> {
    crate::sqlite::open(path, options).await
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(_: &str, _: StoreOptions) -> Result<Arc<dyn Store>> {
    Err(missing_driver("sqlite://", "sqlite"))
}

#[cfg(feature = "postgres")]
async fn open_postgres(url: &str, options: StoreOptions) -> Result<Arc<dyn Store>> {
    crate::postgres::open(url, options).await
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_: &str, _: StoreOptions) -> Result<Arc<dyn Store>> {
    Err(missing_driver("postgres://", "postgres"))
}

/// The error for a store URL whose driver was not compiled in.
#[cfg(not(all(feature = "sqlite", feature = "postgres")))]
fn missing_driver(scheme: &str, feature: &str) -> StoreError {
    StoreError::Config(format!(
        "{scheme} stores are not compiled into this build: enable the `{feature}` feature \
         of oncely-store"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_error(result: Result<Arc<dyn Store>>) -> String {
        match result {
            Err(StoreError::Config(message)) => message,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn open_memory_and_refuses_unknown_schemes() {
        let store = open("memory:", StoreOptions::default()).await.unwrap();
        store.ping().await.unwrap();
        let message = config_error(open("mysql://db", StoreOptions::default()).await);
        assert!(message.contains("unknown store"), "{message}");
    }

    /// Built without the `sqlite` feature (`scripts/test` runs these tests with
    /// `--no-default-features`), a `sqlite://` URL names the feature to enable.
    #[cfg(not(feature = "sqlite"))]
    #[tokio::test]
    async fn open_names_the_missing_sqlite_feature() {
        let message = config_error(open("sqlite://ledger.db", StoreOptions::default()).await);
        assert!(message.contains("`sqlite` feature"), "{message}");
        assert!(message.contains("sqlite://"), "{message}");
        assert!(
            !std::path::Path::new("ledger.db").exists(),
            "no file was created"
        );
    }

    /// Built without the `postgres` feature, a `postgres://` (or `postgresql://`) URL
    /// names the feature to enable.
    #[cfg(not(feature = "postgres"))]
    #[tokio::test]
    async fn open_names_the_missing_postgres_feature() {
        for url in ["postgres://u@127.0.0.1/db", "postgresql://u@127.0.0.1/db"] {
            let message = config_error(open(url, StoreOptions::default()).await);
            assert!(message.contains("`postgres` feature"), "{message}");
        }
    }
}
