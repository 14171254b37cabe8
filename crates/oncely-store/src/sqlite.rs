//! The SQLite store (being built).

use std::sync::Arc;

use crate::{Result, Store, StoreError, StoreOptions};

/// Opens the SQLite store the URL's remainder names.
pub async fn open(_location: &str, _options: StoreOptions) -> Result<Arc<dyn Store>> {
    Err(StoreError::Config(
        "the SQLite store is not built yet".into(),
    ))
}
