//! What an operator does to the ledger, in one home for `oncely ledger` and `oncely usage`
//! (`cli`), the admin API and the console (`serve`): each reads its own input (flags, a
//! JSON body, a form) and hands it here, so the three never disagree on what a
//! resolution is, which principal a filter names or what a purge removes (the server's
//! periodic purge too). The principal key (what the gateway hashes principals with) is
//! read here too.
//!
//! This module knows no input format and no output format; `cli` and `serve` know no
//! resolution rule of their own.

use std::sync::Arc;
use std::time::Duration;

use oncely_core::{Resolution, StoredResponse};
use oncely_store::{Store, StoreError};

use crate::config::{Config, Route};

/// What an operator says happened to an `outcome_unknown` action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It did not happen: the next identical request executes afresh.
    Released,
    /// It happened: later duplicates get this answer.
    Completed {
        /// The status duplicates get (100-599).
        status: u16,
        /// Headers, each checked by [`header`].
        headers: Vec<(String, String)>,
        /// The body duplicates get.
        body: Vec<u8>,
    },
}

/// The resolution `verdict` makes of a record whose route replays for `window`, told by
/// `via` (`oncely ledger resolve`, `admin API`, `console`, as its reason says). A replay
/// never carries a header the storing policy keeps out (`set-cookie` and the like).
pub fn resolution(verdict: Verdict, window: Duration, via: &str) -> Result<Resolution, String> {
    Ok(match verdict {
        Verdict::Released => Resolution::Released {
            window,
            reason: format!("resolved as released by an operator ({via})"),
        },
        Verdict::Completed {
            status,
            headers,
            body,
        } => {
            if !(100..=599).contains(&status) {
                return Err(format!("status {status} is not from 100 to 599"));
            }
            let headers = headers
                .into_iter()
                .filter(|(name, _)| oncely_http::headers::is_replayable(name))
                .collect();
            Resolution::Completed {
                response: StoredResponse {
                    status,
                    headers,
                    body: Some(body.into()),
                },
                window,
                reason: format!("resolved as completed by an operator ({via})"),
            }
        }
    })
}

/// A header of a resolution: a valid name (kept lower-case) and value.
pub fn header(name: &str, value: &str) -> Result<(String, String), String> {
    http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?} is not a valid header name"))?;
    http::HeaderValue::from_str(value)
        .map_err(|_| format!("the value of {name:?} is not a valid header value"))?;
    Ok((name.to_ascii_lowercase(), value.to_owned()))
}

/// A header written `Name: value` (the CLI's `--header`, a line of the console's form).
pub fn header_line(line: &str) -> Result<(String, String), String> {
    let (name, value) = line
        .split_once(':')
        .ok_or_else(|| format!("{line:?} is not 'Name: value'"))?;
    header(name.trim(), value.trim())
}

/// The window a resolution of a record on `route` is replayed for: the route's, else the
/// config's defaults, else 3h.
pub fn window_for(config: Option<&Config>, route: &str) -> Duration {
    config
        .and_then(|c| c.route_named(route))
        .map_or(Route::defaults().window, |r| r.window)
}

/// A principal as a filter names it (`--principal P`, `?principal=P`): its
/// 64-hex-digit hash as stored, or its raw value, hashed with the store's principal key
/// as the gateway hashes it ([`oncely_core::principal_hash`]).
pub async fn principal_filter(store: &Arc<dyn Store>, p: &str) -> Result<String, StoreError> {
    if p.len() == 64 && p.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(p.to_ascii_lowercase());
    }
    let key = principal_key(&**store).await?;
    Ok(oncely_core::principal_hash(&key, p.as_bytes()))
}

/// What a purge removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Purged {
    /// Expired records (what they counted is kept in the usage history).
    pub records: u64,
    /// Rows of the usage history older than the retention.
    pub history_rows: u64,
}

/// The purge of `oncely ledger purge --expired`, the console and the server: the expired
/// records (the store folds what they counted into the usage history as it deletes them),
/// then the usage history's hours that ended `retention` or longer ago (an hour is kept
/// while any of it is within the retention).
pub async fn purge(store: &dyn Store, retention: Duration) -> Result<Purged, StoreError> {
    let records = store.purge_expired().await?;
    let cutoff = period_start(store.now().await?, retention);
    let history_rows = store.purge_usage(cutoff).await?;
    Ok(Purged {
        records,
        history_rows,
    })
}

/// Where a usage period of `since` up to `now` starts: at the start of its first hour, as
/// the usage history counts (never before the Unix epoch, however long `since` is).
pub fn period_start(now: oncely_core::Timestamp, since: Duration) -> oncely_core::Timestamp {
    oncely_store::hour_of(now.minus(since).max(oncely_core::Timestamp(0)))
}

/// `usage_retention` of `config`, else its default.
pub fn usage_retention(config: Option<&Config>) -> Duration {
    config.map_or(crate::config::DEFAULT_USAGE_RETENTION, |c| {
        c.usage_retention
    })
}

/// The environment variable that overrides the principal hashing key.
pub const PRINCIPAL_KEY_ENV: &str = "ONCELY_PRINCIPAL_KEY";

/// The key principals are hashed with: `ONCELY_PRINCIPAL_KEY` (hex, or any other string
/// taken as its bytes), else a secret generated once and kept in the store, so every
/// instance on one database hashes alike.
pub async fn principal_key(store: &dyn Store) -> Result<Vec<u8>, StoreError> {
    match std::env::var(PRINCIPAL_KEY_ENV) {
        Ok(v) if !v.is_empty() => Ok(match hex::decode(&v) {
            Ok(bytes) if v.len() >= 32 => bytes,
            _ => v.into_bytes(),
        }),
        _ => store.secret("principal-key").await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completed_verdict_keeps_what_a_replay_may_carry() {
        let window = Duration::from_secs(60);
        let verdict = Verdict::Completed {
            status: 201,
            headers: vec![
                header_line("Content-Type: application/json").unwrap(),
                header_line("Set-Cookie: s=1").unwrap(),
            ],
            body: b"{}".to_vec(),
        };
        match resolution(verdict, window, "console").unwrap() {
            Resolution::Completed {
                response, reason, ..
            } => {
                assert_eq!(response.status, 201);
                assert_eq!(
                    response.headers,
                    [("content-type".to_string(), "application/json".to_string())]
                );
                assert_eq!(reason, "resolved as completed by an operator (console)");
            }
            other => panic!("{other:?}"),
        }
        let bad = Verdict::Completed {
            status: 99,
            headers: vec![],
            body: vec![],
        };
        assert!(resolution(bad, window, "x").is_err());
        assert!(header_line("no colon").is_err());
        assert!(header("bad name", "v").is_err());
        assert!(header("x", "bad\nvalue").is_err());
    }
}
