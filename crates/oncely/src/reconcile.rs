//! Asking an upstream whether an `outcome_unknown` action happened: the route's
//! `reconcile = "METHOD /path?x={key}"` with `{key}` the downstream key the action was
//! sent with. 2xx: it happened, and that answer is what duplicates get; 404: it did not;
//! anything else (or no answer): still unknown.
//!
//! [`reconcile_once`] is one attempt (the CLI's `oncely ledger reconcile ID` and the
//! server share it); [`run_loop`] is the server's own reconciliation, which waits
//! `reconcile_after` from the moment a record became unknown and then retries with
//! doubling delays and a limit, on a schedule kept in the ledger.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Request};
use http_body_util::BodyExt;
use oncely_core::{DownstreamKey, Record, Resolution, State, StoredResponse};
use oncely_store::{ListFilter, ReconcileSchedule, Store};

use crate::config::{Config, Reconcile, Route, Upstream};
use crate::upstream::{strip_hop_by_hop, upstream_uri, UpstreamClient};

/// What the upstream said.
#[derive(Debug)]
pub enum Verdict {
    /// Resolve the record so (the window of a completion is the caller's to set).
    Resolve(Resolution),
    /// Still unknown, and why.
    Unknown(String),
}

/// Asks once, within `timeout`.
pub async fn ask(
    client: &UpstreamClient,
    upstream: &Upstream,
    spec: &Reconcile,
    record: &Record,
    timeout: Duration,
) -> Verdict {
    let key = DownstreamKey::derive(&record.scope, &record.key);
    let target = spec.target_for(key.as_str());
    let uri = match target
        .parse()
        .map_err(|e: http::uri::InvalidUri| e.to_string())
        .and_then(|u| upstream_uri(upstream, &u).map_err(|e| e.to_string()))
    {
        Ok(u) => u,
        Err(e) => return Verdict::Unknown(format!("bad reconcile target {target:?}: {e}")),
    };
    let mut req = Request::builder()
        .method(spec.method.clone())
        .uri(uri.clone())
        .body(oncely_tower::body::full(bytes::Bytes::new()))
        .expect("a valid request");
    if let Ok(v) = HeaderValue::from_str(key.as_str()) {
        req.headers_mut().insert("idempotency-key", v);
    }
    let exchange = async {
        let res = client.send(req).await.map_err(|e| e.to_string())?;
        let (mut parts, body) = res.into_parts();
        let body = body
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        strip_hop_by_hop(&mut parts.headers);
        Ok::<_, String>((parts, body))
    };
    let (parts, body) = match tokio::time::timeout(timeout, exchange).await {
        Err(_) => {
            return Verdict::Unknown(format!(
                "{} {uri} did not answer within {timeout:?}",
                spec.method
            ))
        }
        Ok(Err(e)) => return Verdict::Unknown(format!("{} {uri}: {e}", spec.method)),
        Ok(Ok(x)) => x,
    };
    let status = parts.status.as_u16();
    if parts.status.is_success() {
        // The one storing policy: no set-cookie, no hop-by-hop or oncely headers.
        let headers = oncely_http::headers::replayable_headers(&parts.headers);
        Verdict::Resolve(Resolution::Completed {
            response: StoredResponse {
                status,
                headers,
                body: Some(body),
            },
            window: Duration::ZERO,
            reason: format!("reconciled: {} {uri} answered {status}", spec.method),
        })
    } else if status == 404 {
        Verdict::Resolve(Resolution::Released {
            window: Duration::ZERO,
            reason: format!("reconciled: {} {uri} answered 404", spec.method),
        })
    } else {
        Verdict::Unknown(format!("{} {uri} answered {status}", spec.method))
    }
}

/// What one reconciliation of one record did.
#[derive(Debug)]
pub enum Reconciled {
    /// The upstream answered 2xx: the record is completed with that answer.
    Completed(Record),
    /// The upstream answered 404: the record is released.
    Released(Record),
    /// The upstream's answer settled nothing: the record stays outcome_unknown.
    Unknown(String),
    /// The record could not be resolved (it changed under us, or the store failed).
    Error(String),
}

impl Reconciled {
    /// The `result` label of `oncely_reconcile_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Reconciled::Completed(_) => "completed",
            Reconciled::Released(_) => "released",
            Reconciled::Unknown(_) => "unknown",
            Reconciled::Error(_) => "error",
        }
    }
}

/// Asks the route's `reconcile` endpoint about `record` once and resolves the record by
/// the answer: shared by `oncely ledger reconcile` and the server's own loop. Every
/// attempt is counted in `oncely_reconcile_total{result}` and logged (target
/// `oncely::reconcile`); a state change is logged with its reason.
pub async fn reconcile_once(
    store: &dyn Store,
    client: &UpstreamClient,
    route: &Route,
    record: &Record,
    attempt: u32,
) -> Reconciled {
    let outcome = match (&route.reconcile, &route.upstream) {
        (Some(spec), Some(upstream)) => {
            match ask(client, upstream, spec, record, route.timeout).await {
                Verdict::Unknown(why) => Reconciled::Unknown(why),
                Verdict::Resolve(resolution) => {
                    let resolution = match resolution {
                        Resolution::Completed {
                            response, reason, ..
                        } => Resolution::Completed {
                            response,
                            window: route.window,
                            reason,
                        },
                        Resolution::Released { reason, .. } => Resolution::Released {
                            window: route.window,
                            reason,
                        },
                    };
                    match store.resolve(&record.id, resolution).await {
                        Ok(r) if r.state == State::Completed => Reconciled::Completed(r),
                        Ok(r) => Reconciled::Released(r),
                        Err(e) => Reconciled::Error(format!("could not resolve: {e}")),
                    }
                }
            }
        }
        (None, _) => Reconciled::Error(format!("route {:?} has no reconcile", route.name)),
        (_, None) => Reconciled::Error(format!("route {:?} has no upstream", route.name)),
    };
    metrics::counter!("oncely_reconcile_total", "result" => outcome.label()).increment(1);
    match &outcome {
        Reconciled::Completed(r) | Reconciled::Released(r) => tracing::info!(
            target: "oncely::reconcile",
            record = %r.id,
            route = %r.route,
            attempt,
            from = "outcome_unknown",
            to = %r.state,
            reason = r.last_error.as_deref().unwrap_or(""),
            "record resolved by reconciliation"
        ),
        Reconciled::Unknown(why) => tracing::info!(
            target: "oncely::reconcile",
            record = %record.id,
            route = %record.route,
            attempt,
            reason = %why,
            "reconciliation left the record outcome_unknown"
        ),
        Reconciled::Error(why) => tracing::warn!(
            target: "oncely::reconcile",
            record = %record.id,
            route = %record.route,
            attempt,
            error = %why,
            "reconciliation failed"
        ),
    }
    outcome
}

/// How the server's own reconciliation paces itself.
#[derive(Debug, Clone)]
pub struct Pace {
    /// How often the ledger is scanned for outcome_unknown records.
    pub scan_every: Duration,
    /// The longest delay between two attempts on one record.
    pub max_delay: Duration,
    /// Attempts on one record before the server stops asking on its own (the CLI and
    /// the admin API still can).
    pub max_attempts: u32,
}

impl Default for Pace {
    fn default() -> Pace {
        Pace {
            scan_every: Duration::from_secs(1),
            max_delay: Duration::from_secs(3600),
            max_attempts: 12,
        }
    }
}

/// The delay before attempt `n + 1` (after `n` inconclusive ones): `reconcile_after`
/// doubled `n` times, capped at `max`.
pub fn backoff(reconcile_after: Duration, n: u32, max: Duration) -> Duration {
    oncely_core::backoff::exponential(reconcile_after.max(Duration::from_millis(100)), n, max)
}

/// How long an instance holds an attempt it took beyond the route's `timeout`: if it
/// dies while asking, another instance asks again after that.
const HOLD_MARGIN: Duration = Duration::from_secs(5);

/// The server's reconciliation loop: every `scan_every`, each `outcome_unknown` record of
/// a route with `reconcile` is asked about once `reconcile_after` has passed since it
/// became unknown (its `updated_at`), so that a call still running upstream is not taken
/// for one that never happened; inconclusive answers are retried with doubling delays up
/// to `max_attempts`. The schedule (attempts so far, next time) is kept in the ledger
/// ([`Admin::schedule_reconcile`](oncely_store::Admin::schedule_reconcile)): a restarted server continues it, and of several
/// instances on one database only the one that moved the schedule to the next attempt
/// asks. Each scan takes the routes of the config current then (`SIGHUP` changes it).
pub async fn run_loop(
    store: Arc<dyn Store>,
    client: UpstreamClient,
    configs: tokio::sync::watch::Receiver<Arc<Config>>,
    pace: Pace,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut ticks = tokio::time::interval(pace.scan_every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = ticks.tick() => {}
        }
        let config = configs.borrow().clone();
        if !config.routes.iter().any(|r| r.reconcile.is_some()) {
            continue;
        }
        let filter = ListFilter {
            state: Some(State::OutcomeUnknown),
            ..ListFilter::default()
        };
        let unknown = match store.list(&filter).await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(target: "oncely::reconcile", error = %e, "cannot list outcome_unknown records");
                continue;
            }
        };
        for record in unknown {
            let Some(route) = config.route_named(&record.route) else {
                continue;
            };
            if route.reconcile.is_none() {
                continue;
            }
            let outcome = tokio::select! {
                _ = stop.changed() => return,
                o = reconcile_due(&*store, &client, route, &record, &pace) => o,
            };
            if let Err(e) = outcome {
                tracing::warn!(target: "oncely::reconcile", record = %record.id, error = %e, "cannot keep the reconciliation schedule");
            }
        }
    }
}

/// Asks about `record` if its next attempt is due and this instance wins it.
async fn reconcile_due(
    store: &dyn Store,
    client: &UpstreamClient,
    route: &Route,
    record: &Record,
    pace: &Pace,
) -> Result<(), oncely_store::StoreError> {
    let Some(seen) = store.reconcile_schedule(&record.id).await? else {
        return Ok(()); // resolved meanwhile
    };
    let now = store.now().await?;
    let due = seen
        .next_at
        .unwrap_or_else(|| record.updated_at.plus(route.reconcile_after));
    if seen.attempts >= pace.max_attempts || due > now {
        return Ok(());
    }
    let attempt = seen.attempts + 1;
    let held = ReconcileSchedule {
        attempts: attempt,
        next_at: Some(now.plus(route.timeout + HOLD_MARGIN)),
    };
    if !store.schedule_reconcile(&record.id, seen, held).await? {
        return Ok(()); // another instance took this attempt
    }
    let outcome = reconcile_once(store, client, route, record, attempt).await;
    if let Reconciled::Unknown(_) | Reconciled::Error(_) = outcome {
        let delay = backoff(route.reconcile_after, attempt, pace.max_delay);
        let next = ReconcileSchedule {
            attempts: attempt,
            next_at: Some(store.now().await?.plus(delay)),
        };
        store.schedule_reconcile(&record.id, held, next).await?;
        if attempt >= pace.max_attempts {
            tracing::warn!(
                target: "oncely::reconcile",
                record = %record.id,
                route = %record.route,
                attempts = attempt,
                "automatic reconciliation gives up; resolve with `oncely ledger reconcile` or `oncely ledger resolve`"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_reconcile_after_and_is_capped() {
        let max = Duration::from_secs(3600);
        let s = Duration::from_secs;
        assert_eq!(backoff(s(60), 1, max), s(120));
        assert_eq!(backoff(s(60), 2, max), s(240));
        assert_eq!(backoff(s(60), 10, max), max);
        assert_eq!(backoff(s(60), 40, max), max);
        assert_eq!(backoff(Duration::ZERO, 1, max), Duration::from_millis(200));
    }
}
