//! The PostgreSQL store (being built).

use std::sync::Arc;

use crate::{Result, Store, StoreError, StoreOptions};

/// Opens the PostgreSQL store the URL's remainder names.
pub async fn open(_location: &str, _options: StoreOptions) -> Result<Arc<dyn Store>> {
    Err(StoreError::Config(
        "the PostgreSQL store is not built yet".into(),
    ))
}
