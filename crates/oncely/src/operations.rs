//! What an operator does to the ledger, in one home for `oncely ledger`, `oncely
//! webhooks` and `oncely usage` (`cli`), the admin API and the console (`serve`): each
//! operator step (resolve, reconcile, purge, redeliver) is one function here that does the
//! whole sequence (read the record, check that the step applies to it, build what it
//! needs, the store call, the log line) and returns a typed result or [`OpError`]. The
//! CLI, the admin API and the console only parse their input (flags, a JSON body, a form)
//! and render what comes back, so the three never disagree on what a resolution is, which
//! records it applies to, which principal a filter names or what a purge removes (the
//! server's periodic purge too). The principal key (what the gateway hashes principals
//! with) is read here too.
//!
//! This module knows no input format and no output format; `cli` and `serve` know no
//! rule of an operator step of their own.

use std::sync::Arc;
use std::time::Duration;

use oncely_core::{Record, RecordId, Resolution, State, StoredResponse};
use oncely_store::{Store, StoreError, TaskError};

use crate::config::{Config, Route};
use crate::reconcile::{reconcile_once, Reconciled};

/// Who asks for an operator step: said in a resolution's reason and in the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `oncely ledger ...`, `oncely webhooks ...`.
    Cli,
    /// The admin API.
    AdminApi,
    /// The operator console.
    Console,
    /// The server on its own (the periodic purge).
    Server,
}

impl Via {
    /// How the log line names it (`by`).
    fn name(self) -> &'static str {
        match self {
            Via::Cli => "cli",
            Via::AdminApi => "admin API",
            Via::Console => "console",
            Via::Server => "server",
        }
    }

    /// How a resolution's reason names it.
    fn resolver(self) -> &'static str {
        match self {
            Via::Cli => "oncely ledger resolve",
            other => other.name(),
        }
    }
}

/// Why an operator step was not taken.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// No ledger record has this id.
    #[error("no ledger record {0}")]
    NotFound(String),
    /// No webhook delivery has this id.
    #[error("{0}")]
    NoDelivery(String),
    /// The step applies only to an `outcome_unknown` record, and this one is not.
    #[error("record {id} is {state}, not outcome_unknown: nothing to {step}")]
    NotOutcomeUnknown {
        /// The record.
        id: RecordId,
        /// Its state.
        state: State,
        /// The step (`resolve`, `reconcile`).
        step: &'static str,
    },
    /// What the operator gave is not a valid resolution (a status outside 100-599).
    #[error("{0}")]
    Invalid(String),
    /// The record's route cannot be asked (no config, no `reconcile`, no upstream).
    #[error("{0}")]
    NotReconcilable(String),
    /// The upstream client cannot be built (its CA file).
    #[error("{0}")]
    Client(String),
    /// The webhook delivery is not dead (still queued or delivered).
    #[error("{0}")]
    NotDead(String),
    /// The store refused the change (the record changed meanwhile) or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What an operator says happened to an `outcome_unknown` action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It did not happen: the next identical request executes afresh.
    Released,
    /// It happened: later duplicates get this answer.
    Completed {
        /// The status duplicates get (checked by [`status`]).
        status: u16,
        /// Headers, each checked by [`header`].
        headers: Vec<(String, String)>,
        /// The body duplicates get.
        body: Vec<u8>,
    },
}

/// A status a resolution may give duplicates: 100 to 599 (the one check; the CLI's
/// `--status` parser calls it too).
pub fn status(code: u16) -> Result<u16, String> {
    if (100..=599).contains(&code) {
        Ok(code)
    } else {
        Err(format!("status {code} is not from 100 to 599"))
    }
}

/// The record `id` names, when it is `outcome_unknown`: the only records `step`
/// (`resolve`, `reconcile`) applies to.
pub async fn unknown_record(
    store: &dyn Store,
    id: &str,
    step: &'static str,
) -> Result<Record, OpError> {
    let record = store
        .get(&RecordId(id.to_owned()))
        .await?
        .ok_or_else(|| OpError::NotFound(id.to_owned()))?;
    if record.state != State::OutcomeUnknown {
        return Err(OpError::NotOutcomeUnknown {
            id: record.id,
            state: record.state,
            step,
        });
    }
    Ok(record)
}

/// What a resolution of `id` would do, without doing it (the console's confirmation
/// page): the `outcome_unknown` record, and the resolution `verdict` makes of it for its
/// route's window ([`window_for`]).
pub async fn plan_resolution(
    store: &dyn Store,
    config: Option<&Config>,
    id: &str,
    verdict: Verdict,
    via: Via,
) -> Result<(Record, Resolution), OpError> {
    let record = unknown_record(store, id, "resolve").await?;
    let window = window_for(config, &record.route);
    let resolution = resolution(verdict, window, via.resolver()).map_err(OpError::Invalid)?;
    Ok((record, resolution))
}

/// Resolves the `outcome_unknown` record `id` by `verdict` (`oncely ledger resolve`,
/// `POST /records/ID/resolve`, the console): the record after; the change is logged.
pub async fn resolve(
    store: &dyn Store,
    config: Option<&Config>,
    id: &str,
    verdict: Verdict,
    via: Via,
) -> Result<Record, OpError> {
    let (record, resolution) = plan_resolution(store, config, id, verdict, via).await?;
    let after = store.resolve(&record.id, resolution).await?;
    match via {
        Via::Console => tracing::info!(target: "oncely::console", action = "resolve",
            record = %after.id, route = %after.route, to = %after.state, by = "console",
            "console action"),
        _ => tracing::info!(record = %after.id, route = %after.route, to = %after.state,
            by = via.name(), "record resolved by an operator"),
    }
    Ok(after)
}

/// The route of the `outcome_unknown` `record` when `config` says how to ask its upstream
/// (`reconcile` and an upstream): what [`reconcile`] asks.
pub fn reconcilable<'c>(config: Option<&'c Config>, record: &Record) -> Result<&'c Route, OpError> {
    let not = OpError::NotReconcilable;
    let Some(config) = config else {
        return Err(not(format!(
            "record {} is on route {:?}: pass --config FILE so that its reconcile endpoint is known",
            record.id, record.route
        )));
    };
    let Some(route) = config.route_named(&record.route) else {
        return Err(not(format!(
            "route {:?} of record {} is not in the config",
            record.route, record.id
        )));
    };
    if route.reconcile.is_none() {
        return Err(not(format!(
            "route {:?} has no reconcile configured",
            record.route
        )));
    }
    if route.upstream.is_none() {
        return Err(not(format!("route {:?} has no upstream", record.route)));
    }
    Ok(route)
}

/// Asks the route's `reconcile` endpoint about the `outcome_unknown` record `id` now,
/// once, and resolves the record by the answer (`oncely ledger reconcile`, the console):
/// what it did ([`reconcile_once`] counts and logs the attempt).
pub async fn reconcile(
    store: &dyn Store,
    config: Option<&Config>,
    id: &str,
    via: Via,
) -> Result<Reconciled, OpError> {
    let record = unknown_record(store, id, "reconcile").await?;
    let route = reconcilable(config, &record)?;
    let ca = config.and_then(|c| c.upstream_ca.as_deref());
    let client =
        crate::upstream::upstream_client(ca).map_err(|e| OpError::Client(format!("{e:#}")))?;
    // The attempt after the server's own, when it has asked already.
    let attempt = match store.reconcile_schedule(&record.id).await {
        Ok(Some(s)) => s.attempts + 1,
        _ => 1,
    };
    let outcome = reconcile_once(store, &client, route, &record, attempt).await;
    if via == Via::Console {
        tracing::info!(target: "oncely::console", action = "reconcile", record = %record.id,
            route = %record.route, result = outcome.label(), by = "console", "console action");
    }
    Ok(outcome)
}

/// The resolution `verdict` makes of a record whose route replays for `window`, told by
/// `via` (`oncely ledger resolve`, `admin API`, `console`, as its reason says). A replay
/// never carries a header the storing policy keeps out (`set-cookie` and the like).
fn resolution(verdict: Verdict, window: Duration, via: &str) -> Result<Resolution, String> {
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
            let status = self::status(status)?;
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
fn window_for(config: Option<&Config>, route: &str) -> Duration {
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
pub async fn purge(store: &dyn Store, retention: Duration, via: Via) -> Result<Purged, OpError> {
    let records = store.purge_expired().await?;
    let cutoff = period_start(store.now().await?, retention);
    let history_rows = store.purge_usage(cutoff).await?;
    match via {
        Via::Console => tracing::info!(target: "oncely::console", action = "purge",
            purged = records, history_rows, by = "console", "console action"),
        _ if records == 0 && history_rows == 0 => {}
        _ => tracing::info!(
            purged = records,
            history_rows,
            by = via.name(),
            "purged expired records"
        ),
    }
    Ok(Purged {
        records,
        history_rows,
    })
}

/// Queues the dead webhook delivery `id` (its task id, or its event's record id) again,
/// its attempts starting over (`oncely webhooks redeliver`, the console): the delivery;
/// `waker` (this process's delivery worker, when it has one) is woken to send it now.
pub async fn redeliver(
    store: &dyn Store,
    waker: Option<&oncely_webhooks::Waker>,
    id: &str,
    via: Via,
) -> Result<oncely_webhooks::DeadDelivery, OpError> {
    let delivery = oncely_webhooks::redeliver(store, id)
        .await
        .map_err(|e| match e {
            StoreError::Task(TaskError::NotFound(_)) => OpError::NoDelivery(e.to_string()),
            StoreError::Task(_) => OpError::NotDead(e.to_string()),
            other => OpError::Store(other),
        })?;
    if let Some(w) = waker {
        w.wake();
    }
    if via == Via::Console {
        tracing::info!(target: "oncely::console", action = "redeliver", delivery = %id,
            by = "console", "console action");
    }
    Ok(delivery)
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
