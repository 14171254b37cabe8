//! What the ledger says of each route: the observed durations of its completed first
//! attempts, which tell a slow route (one that should be a `job`).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use oncely_core::State;
use oncely_store::redact_url as redact;
use oncely_store::{ListFilter, StoreOptions};

use super::super::store::open_url;
use crate::config::Config;
use crate::outcome::Failure;

/// Observed durations of completed first attempts, by route name. The ledger is read
/// when `--store`/`ONCELY_STORE` names it, or when the config's store exists already
/// (the inventory never creates a ledger by looking for one).
pub(super) async fn observed_durations(
    store: Option<&str>,
    config: Option<&Config>,
) -> Result<HashMap<String, Vec<Duration>>, Failure> {
    let url = match (store, config) {
        (Some(url), _) => {
            if let Some(p) = url.strip_prefix("sqlite://") {
                if !p.is_empty() && !Path::new(p).exists() {
                    return Err(Failure::usage(format!("no ledger at {url}")));
                }
            }
            url.to_owned()
        }
        (None, Some(c)) => match c.store.strip_prefix("sqlite://") {
            Some(p) if !Path::new(p).exists() => return Ok(HashMap::new()),
            _ => c.store.clone(),
        },
        (None, None) => return Ok(HashMap::new()),
    };
    let options = config.map_or_else(StoreOptions::default, Config::store_options);
    let store = open_url(&url, options).await?;
    let records = store
        .list(&ListFilter {
            state: Some(State::Completed),
            limit: Some(100_000),
            ..ListFilter::default()
        })
        .await
        .map_err(|e| Failure::usage(format!("store {}: {e}", redact(&url))))?;
    let mut out: HashMap<String, Vec<Duration>> = HashMap::new();
    for r in records {
        // A re-executed record's creation time is its first attempt's: only first
        // attempts measure one call.
        let Some(done) = r.completed_at else { continue };
        if r.attempt != 1 {
            continue;
        }
        let ms = done.millis().saturating_sub(r.created_at.millis()).max(0) as u64;
        out.entry(r.identity.route)
            .or_default()
            .push(Duration::from_millis(ms));
    }
    Ok(out)
}
