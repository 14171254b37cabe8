//! Opening the ledger for a command: which URL and which config.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use oncely_store::{Store, StoreError, StoreOptions};

use super::{Failure, Outcome};
use crate::config::{Config, Overrides, DEFAULT_STORE};

/// Where the ledger is: `--store`, else `ONCELY_STORE`, else the config file's `store`,
/// else `sqlite://oncely.db`.
#[derive(Debug, Clone, Args, Default)]
pub struct StoreArgs {
    /// The ledger: sqlite://PATH or postgres://USER[:PASS]@HOST[:PORT]/DB.
    #[arg(long, env = "ONCELY_STORE", value_name = "URL")]
    pub store: Option<String>,
    /// A config file to take the store (and route settings) from.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// What a ledger command works with.
#[derive(Debug)]
pub(crate) struct Ledger {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) url: String,
    pub(crate) config: Option<Config>,
}

/// Loads `--config` if given and opens the store (`--store`/`ONCELY_STORE`, else the
/// file's, else the default).
pub(crate) async fn open(args: &StoreArgs) -> Result<Ledger, Failure> {
    let config = match &args.config {
        Some(path) => Some(
            Config::load(path, &Overrides::default())
                .map_err(|e| Failure::usage(format!("config {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let url = args
        .store
        .clone()
        .or_else(|| config.as_ref().map(|c| c.store.clone()))
        .unwrap_or_else(|| DEFAULT_STORE.to_owned());
    let options = config
        .as_ref()
        .map_or_else(StoreOptions::default, Config::store_options);
    let store = open_url(&url, options).await?;
    Ok(Ledger { store, url, config })
}

/// Opens (and migrates) a store by URL; every failure is a one-line exit 2.
pub(crate) async fn open_url(url: &str, options: StoreOptions) -> Result<Arc<dyn Store>, Failure> {
    oncely_store::open(url, options).await.map_err(|e| match e {
        StoreError::Config(m) => Failure::usage(m),
        other => Failure::usage(format!(
            "cannot open store {}: {other}",
            oncely_store::redact_url(url)
        )),
    })
}

/// `oncely migrate`: opening a store creates or upgrades its schema.
pub(crate) async fn migrate(args: &StoreArgs) -> Outcome {
    let ledger = open(args).await?;
    ledger.store.ping().await.map_err(|e| {
        Failure::usage(format!(
            "store {}: {e}",
            oncely_store::redact_url(&ledger.url)
        ))
    })?;
    println!(
        "store {}: schema created or upgraded, up to date",
        oncely_store::redact_url(&ledger.url)
    );
    Ok(())
}
