//! The Prometheus recorder and the metrics the contract names.
//!
//! | metric | kind | labels |
//! | --- | --- | --- |
//! | `oncely_requests_total` | counter | `route`, `status` (the `Oncely-Status` values; a job run the worker ended counts once more with the job's status: `completed`, `failed`, `outcome_unknown`); counted by `oncely_http::request_log`; MCP calls add `tool`, a tool name a `tools/list` answer or the config named, else `other` (a client picks the names it calls) |
//! | `oncely_upstream_seconds` | histogram | time to the upstream's answer head |
//! | `oncely_in_flight` | gauge | upstream calls whose answer is not finished |
//! | `oncely_outcome_unknown` | gauge | records awaiting reconciliation, refreshed from the store |
//! | `oncely_webhook_deliveries_total` | counter | `result` |
//! | `oncely_upstream_retries_total` | counter | `route`, `reason` (`connect`, `reset`, `status_502`, `status_503`, `status_504`): temporary upstream failures tried again (a route's `retries`) |
//! | `oncely_config_reloads_total` | counter | `result` (`ok`, `refused`): config files read again on `SIGHUP` |
//!
//! Every one of them is described and set at start, so each name is in the output
//! before any traffic.

use std::sync::OnceLock;

use metrics::Unit;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Answer statuses of a guarded route, as `Oncely-Status` shows them.
pub const STATUSES: [&str; 4] = ["fresh", "replayed", "joined", "bypassed"];

/// Results of a webhook delivery attempt.
pub const DELIVERY_RESULTS: [&str; 3] = ["delivered", "retried", "dead"];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process's Prometheus handle, installing the recorder on first use. When another
/// recorder is already global (a test harness), the handle still renders, empty.
pub fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Full("oncely_upstream_seconds".into()),
                    &[
                        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                        60.0, 120.0,
                    ],
                )
                .expect("non-empty buckets")
                .build_recorder();
            let handle = recorder.handle();
            // Mirrored over OTLP when metrics export is on (`otel::metrics`).
            let _ = metrics::set_global_recorder(super::otel::metrics::Mirror::new(recorder));
            handle
        })
        .clone()
}

/// Describes every metric and gives each a first value, per configured route.
pub fn describe<'a>(routes: impl Iterator<Item = &'a str>) {
    metrics::describe_counter!(
        "oncely_requests_total",
        "Requests on guarded routes, by route and Oncely-Status"
    );
    metrics::describe_histogram!(
        "oncely_upstream_seconds",
        Unit::Seconds,
        "Time until the upstream's answer head arrived"
    );
    metrics::describe_gauge!(
        "oncely_in_flight",
        "Upstream calls whose answer is not finished"
    );
    metrics::describe_gauge!(
        "oncely_outcome_unknown",
        "Ledger records awaiting reconciliation"
    );
    metrics::describe_counter!(
        "oncely_webhook_deliveries_total",
        "Webhook delivery attempts, by result"
    );
    metrics::describe_counter!(
        "oncely_key_churn_total",
        "Keys made up for a retry that joined another key's record, by route"
    );
    metrics::describe_counter!(
        "oncely_upstream_retries_total",
        "Temporary upstream failures tried again, by route and reason"
    );
    for route in routes {
        for status in STATUSES {
            oncely_http::request_log::request_counter(route, status).increment(0);
        }
    }
    for result in DELIVERY_RESULTS {
        metrics::counter!("oncely_webhook_deliveries_total", "result" => result).increment(0);
    }
    metrics::describe_counter!(
        "oncely_ledger_write_retries_total",
        "Ledger writes of an owner (renew, complete, release, mark_unknown) tried again"
    );
    for op in ["renew", "complete", "release", "mark_unknown"] {
        metrics::counter!("oncely_ledger_write_retries_total", "op" => op).increment(0);
    }
    metrics::describe_counter!(
        "oncely_config_reloads_total",
        "Config files read again on SIGHUP, by result (ok, refused)"
    );
    for result in ["ok", "refused"] {
        metrics::counter!("oncely_config_reloads_total", "result" => result).increment(0);
    }
    metrics::gauge!("oncely_in_flight").increment(0.0);
    metrics::gauge!("oncely_outcome_unknown").set(0.0);
    // A histogram is rendered once it has a handle; registering it is enough.
    let _ = metrics::histogram!("oncely_upstream_seconds");
}
