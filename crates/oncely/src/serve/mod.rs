//! `oncely serve`: the gateway.
//!
//! [`run`] takes bound listeners and a shutdown future (mini-redis's shape), so tests
//! bind port 0 and stop it when they like. It opens (and migrates) the store, puts the
//! oncely-tower guard around the [`crate::upstream::Proxy`], serves HTTP/1.1 and HTTP/2 (HTTPS when
//! `tls` is set) on `listen` and the [`admin`] API on `admin_listen`, purges expired
//! records (what they counted stays in the usage history) and the usage history's hours
//! past `usage_retention` every minute, refreshes the `oncely_outcome_unknown` gauge, and reconciles
//! `outcome_unknown` records of routes with `reconcile` ([`crate::reconcile::run_loop`]). A
//! `JobWorker` runs the queued jobs of `job` routes through the same proxy; what they keep
//! is sealed with the key [`job_key`] resolves. `oncely serve` reads its config file again
//! on SIGHUP ([`reload`]): each request is answered from the config current when it
//! started.
//!
//! On shutdown it stops accepting, writes the repeat counts held in memory, lets every
//! open connection finish its in-flight requests and waits for every owned upstream call
//! to be recorded (`Guard::drain`), for at most `drain_timeout`, then returns.

pub mod admin;
pub mod args;
pub mod console;
pub mod job_key;
pub mod mcp;
mod orphans;
pub mod otel;
pub mod prometheus;
pub mod reload;
pub mod routes;
pub mod tls;
pub mod webhooks;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use oncely_core::{Record, State};
use oncely_store::{ListFilter, Store};
use oncely_tower::Guard;
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::config::{Config, Overrides};
use crate::outcome::{Failure, Outcome};
use crate::reconcile;
use crate::upstream::{upstream_client, Connection};
use args::ServeArgs;

/// How often expired records are purged.
const PURGE_EVERY: Duration = Duration::from_secs(60);
/// How long the last chores of a shutdown (a final repeat flush, the admin API) may take.
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// How often the `oncely_outcome_unknown` gauge is refreshed.
const GAUGE_EVERY: Duration = Duration::from_secs(15);

/// `oncely serve ARGS`: reads the config, binds, runs until SIGINT/SIGTERM.
pub(crate) async fn cli(args: ServeArgs) -> Outcome {
    // Dropped when `serve` returns, after the last line ("stopped"): flushes the log.
    let _logs = crate::logs::init(args.log_format);
    let overrides = Overrides {
        upstream: args.upstream.clone(),
        listen: args.listen.clone(),
        admin_listen: args.admin_listen.clone(),
        store: args.store.clone(),
    };
    // First thing: a SIGHUP from now on is a reload, never the end of the process.
    let source = reload::Source::new(args.config.clone(), overrides.clone())
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    let config = match (&args.config, &args.upstream) {
        (Some(path), _) => Config::load(path, &overrides)
            .map_err(|e| Failure::usage(format!("config {}: {e}", path.display())))?,
        (None, Some(_)) => Config::from_overrides(&overrides).map_err(Failure::usage)?,
        (None, None) => {
            return Err(Failure::usage(
                "serve needs --config FILE or --upstream URL",
            ))
        }
    };
    // A bad OTEL_* value is a bad config: exit 2 naming the variable.
    config
        .telemetry()
        .map_err(|e| Failure::usage(format!("telemetry: {e}")))?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| Failure::usage(format!("cannot listen on {}: {e}", config.listen)))?;
    let admin = TcpListener::bind(config.admin_listen)
        .await
        .map_err(|e| Failure::usage(format!("cannot listen on {}: {e}", config.admin_listen)))?;
    run_reloading(listener, admin, config, Some(source), shutdown_signal())
        .await
        .map_err(|e| Failure::usage(format!("{e:#}")))
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Runs the gateway on these listeners until `shutdown` resolves, then drains.
pub async fn run(
    listener: TcpListener,
    admin_listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    run_reloading(listener, admin_listener, config, None, shutdown).await
}

/// [`run`], reading the config again from `reload` on each SIGHUP ([`reload`]).
pub async fn run_reloading(
    listener: TcpListener,
    admin_listener: TcpListener,
    config: Config,
    reload: Option<reload::Source>,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    // Before the store: a missing or bad key refuses to start without touching it.
    let job_key = job_key::resolve(&config)?;
    let telemetry = config.telemetry().map_err(anyhow::Error::msg)?;
    let store = oncely_store::open(&config.store, config.store_options())
        .await
        .with_context(|| format!("store {}", oncely_store::redact_url(&config.store)))?;
    let principal_key = crate::operations::principal_key(&*store)
        .await
        .context("reading the principal key from the store")?;
    let mut guard =
        Guard::new(store.clone(), principal_key).with_max_inflight_bytes(config.max_inflight_bytes);
    let has_job_key = job_key.is_some();
    if let Some(key) = job_key {
        guard = guard.with_job_key(key);
    }
    // OpenTelemetry (`[tracing]` and the OTEL_* variables): spans of guarded requests,
    // and metrics, exported over OTLP by the SDK's own threads.
    let otel = match &telemetry {
        Some(t) => Some(otel::Exporter::start(t, guard.instance())?),
        None => None,
    };
    if let Some(tracer) = otel.as_ref().and_then(otel::Exporter::tracer) {
        guard = guard.with_tracer(tracer);
    }
    let guard = Arc::new(guard);
    let metrics = prometheus::handle();
    let client = upstream_client(config.upstream_ca.as_deref())?;
    let tls = match &config.tls {
        Some(files) => Some(tokio_rustls::TlsAcceptor::from(tls::server_config(files)?)),
        None => None,
    };
    let config = Arc::new(config);
    let live = reload::Live::start(
        config.clone(),
        guard.clone(),
        has_job_key,
        client.clone(),
        store.clone(),
    )?;

    // On SQLite the process before this one owned every record still processing: their
    // callers never got an answer (see `orphans`).
    if config.store.starts_with("sqlite:") {
        let churn_of = |r: &Record| orphans::churn_of(r, &config);
        if let Err(e) = guard.engine().mark_undelivered(&churn_of, false).await {
            tracing::warn!(error = %e, "marking the records of the last run undelivered failed");
        }
    }
    let local = listener.local_addr()?;
    let admin_local = admin_listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!(
        "listening on {scheme}://{local} (admin http://{admin_local}), store {}",
        oncely_store::redact_url(&config.store)
    );

    // Trimmed, as the bearer value it is compared with is: a variable filled from a file
    // keeps its line end. Only whitespace: unset.
    let admin_token = std::env::var(&config.admin_token_env)
        .ok()
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty());
    let admin_state = admin::AdminState {
        store: store.clone(),
        config: config.clone(),
        token: admin_token,
        metrics: metrics.clone(),
        webhooks: live.webhooks.admin_router(store.clone()),
        webhook_waker: live.webhooks.waker(),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let admin_task = {
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            axum::serve(admin_listener, admin::router(admin_state))
                .with_graceful_shutdown(async move {
                    let _ = stop.changed().await;
                })
                .await
        })
    };
    let chores = tokio::spawn(chores(
        store.clone(),
        guard.clone(),
        metrics.clone(),
        live.configs(),
        stop_rx.clone(),
    ));
    let reconciler = tokio::spawn(reconcile::run_loop(
        store.clone(),
        client.clone(),
        live.configs(),
        reconcile::Pace::default(),
        stop_rx.clone(),
    ));

    let current = live.current.clone();
    let reloader = reload::Reloader::spawn(live, reload);
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: wait, do not spin or die.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let info = Connection {
            peer: addr,
            https: tls.is_some(),
        };
        let current = current.clone();
        let per_conn = tower::service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(info);
            // This request's routes and endpoints, to its end: a reload changes the
            // requests that start after it.
            let snapshot = current.load();
            // One normalised path for everything after this (or 400 path_invalid).
            let req = snapshot.routes.normalize(req);
            // `[[mcp]]` and `[[webhooks]]` paths are answered by their endpoints, before
            // the route table.
            async move {
                let started = std::time::Instant::now();
                let req = match req {
                    Ok(req) => req,
                    Err(refused) => return Ok(refused),
                };
                // http.server.request.duration, when metrics go over OTLP.
                let measure = otel::metrics::enabled()
                    .then(|| (req.method().clone(), req.uri().path().to_string()));
                // An endpoint's answer is boxed, and only when the path is its: the
                // futures of the MCP and webhook endpoints are large, and a route's
                // request must not carry (and move) them.
                let path = req.uri().path();
                let mcp = snapshot.mcp.find(path);
                let endpoint = mcp.is_some() || snapshot.hooks.serves(path);
                let answer = match mcp {
                    Some(mcp) => Ok(Box::pin(mcp.handle(req)).await),
                    None if endpoint => match Box::pin(snapshot.hooks.answer(req)).await {
                        Ok(resp) => Ok(resp),
                        Err(req) => snapshot.service.clone().oneshot(req).await,
                    },
                    None => snapshot.service.clone().oneshot(req).await,
                };
                if let (Some((method, path)), Ok(resp)) = (&measure, &answer) {
                    let route = if endpoint {
                        Some(path.as_str())
                    } else {
                        snapshot.routes.route_path(method, path)
                    };
                    let took = started.elapsed().as_secs_f64();
                    otel::metrics::request_finished(method, route, resp.status().as_u16(), took);
                }
                answer
            }
        });
        let hyper_service = TowerToHyperService::new(per_conn);
        let builder = builder.clone();
        let watcher = graceful.watcher();
        match &tls {
            None => {
                tokio::spawn(async move {
                    let conn =
                        builder.serve_connection_with_upgrades(TokioIo::new(stream), hyper_service);
                    if let Err(e) = watcher.watch(conn.into_owned()).await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let stream = match acceptor.accept(stream).await {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::debug!(error = %e, client = %addr, "TLS handshake failed");
                            return;
                        }
                    };
                    let conn =
                        builder.serve_connection_with_upgrades(TokioIo::new(stream), hyper_service);
                    if let Err(e) = watcher.watch(conn.into_owned()).await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
        }
    }
    drop(listener);
    // A reload under way ends first; none starts after this.
    let mut live = reloader.stop().await;
    let drain_timeout = live.config.drain_timeout;
    let deadline = tokio::time::Instant::now() + drain_timeout;
    tracing::info!(
        connections = graceful.count(),
        drain_timeout = ?drain_timeout,
        "shutting down: finishing in-flight requests"
    );
    // The repeat counts live only in memory: write them before anything that may wait.
    let _ = tokio::time::timeout_at(deadline, guard.flush_repeats()).await;
    let drained = tokio::time::timeout_at(deadline, async {
        graceful.shutdown().await;
        // Queued jobs that have not started stay queued for the next start.
        if let Some(jobs) = live.jobs.take() {
            jobs.stop().await;
        }
        live.webhooks.stop().await;
        guard.drain().await;
    })
    .await;
    if drained.is_err() {
        // What is still running stays `processing` in the ledger; its lease lapses and
        // another instance (or this one restarted) takes it over, as after a crash.
        tracing::warn!(
            in_flight = guard.in_flight(),
            "drain deadline passed; exiting with requests still in flight"
        );
        let _ = tokio::time::timeout(DRAIN_GRACE, guard.flush_repeats()).await;
    }
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(DRAIN_GRACE, async {
        let _ = admin_task.await;
        let _ = chores.await;
        let _ = reconciler.await;
    })
    .await;
    if let Some(exporter) = otel {
        exporter.stop().await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// The server's own periodic work: purging expired records and the usage history past
/// `usage_retention` (of the config current then), refreshing the outcome_unknown gauge,
/// looking for orphaned actions, and the metrics recorder's upkeep.
async fn chores(
    store: Arc<dyn Store>,
    guard: Arc<Guard>,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    configs: tokio::sync::watch::Receiver<Arc<Config>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut purge = tokio::time::interval(PURGE_EVERY);
    let mut gauge = tokio::time::interval(GAUGE_EVERY);
    let mut sweep = tokio::time::interval(oncely_engine::sweep::SWEEP_EVERY);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = sweep.tick() => {
                let config = configs.borrow().clone();
                guard.engine().sweep(&|r| orphans::churn_of(r, &config)).await;
            }
            _ = purge.tick() => {
                let retention = configs.borrow().usage_retention;
                let via = crate::operations::Via::Server;
                if let Err(e) = crate::operations::purge(&*store, retention, via).await {
                    tracing::warn!(error = %e, "purging expired records failed");
                }
            }
            _ = gauge.tick() => {
                let filter = ListFilter {
                    state: Some(State::OutcomeUnknown),
                    ..ListFilter::default()
                };
                match store.list(&filter).await {
                    Ok(list) => ::metrics::gauge!("oncely_outcome_unknown").set(list.len() as f64),
                    Err(e) => tracing::warn!(error = %e, "counting outcome_unknown records failed"),
                }
                metrics.run_upkeep();
            }
        }
    }
}
