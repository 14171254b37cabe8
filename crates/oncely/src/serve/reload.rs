//! `SIGHUP`: `oncely serve` reads its config file again.
//!
//! The request path reads one [`Snapshot`] per request (the route table, the `[[mcp]]`
//! and `[[webhooks]]` endpoints, and the guarded proxy built on that table) from
//! [`Current`], which a reload swaps whole. A request keeps the snapshot it started with
//! to its end, so nothing in flight is dropped or changes its mind halfway; owned
//! upstream calls run on tasks of their own as always.
//!
//! A reload is all or nothing. The new file is read and validated like at start
//! (`Config::load`, with the same command-line overrides), its fields that need a
//! restart are compared with the running ones ([`FIXED`]), and its MCP and webhook
//! entries are resolved (secrets, JWKS files); any problem is logged (one line each)
//! and the running config is kept. Then the snapshot is swapped, the webhook endpoints
//! are replaced (the one delivery worker keeps running: see
//! [`super::webhooks::Webhooks::reload`]) and the job worker is started again on the new
//! `job` routes (jobs running go on; the store caps a route's `concurrency` across both).
//! Each reload is one `oncely::reload` log line and one
//! `oncely_config_reloads_total{result="ok|refused"}`.
//!
//! A file with nothing in it (no key, no table: a file caught while it is rewritten in
//! place) is refused too.
//!
//! Read at start only (a change is refused, naming the field): `listen`, `admin_listen`,
//! `admin_token_env`, `store`, `store_pool_size`, `upstream_ca`, `tls`,
//! `max_inflight_bytes`, `[tracing]` (its exporter is built at start); and the job
//! key, so a reload that brings the first `job` route to a server started without one
//! (and without `ONCELY_SECRET_KEY`) is refused too. Applied:
//! everything else, `drain_timeout`, the routes' `reconcile` settings (the reconciler
//! scans with the current config) and `usage_retention` (the periodic purge reads the
//! current one) included. Still the start's until a restart: the admin API's view of
//! routes (the `window` of a resolution) and of `usage_retention` (the console's purge),
//! and the webhook delivery worker's lease.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use oncely_core::Class;
use oncely_store::Store;
use oncely_tower::{Guard, IdempotencyLayer, IdempotencyService, JobWorker, JobWorkerOptions};
use tower::Layer;

use super::mcp::McpEndpoints;
use super::routes::RouteTable;
use super::webhooks::{WebhookPaths, Webhooks};
use crate::config::{Config, ConfigError, Overrides};
use crate::upstream::{Proxy, UpstreamClient};

/// The guarded proxy of one route table.
pub type GuardedProxy = IdempotencyService<Proxy, RouteTable>;

/// What a request is answered with: everything built from one config.
#[derive(Debug)]
pub struct Snapshot {
    /// The routes (normalising, matching, upstreams, limits).
    pub routes: RouteTable,
    /// The `[[mcp]]` endpoints.
    pub mcp: McpEndpoints,
    /// The `[[webhooks]]` endpoints.
    pub hooks: WebhookPaths,
    /// The guard around the proxy, on `routes`.
    pub service: GuardedProxy,
}

impl Snapshot {
    fn new(
        routes: RouteTable,
        mcp: McpEndpoints,
        hooks: WebhookPaths,
        guard: &Arc<Guard>,
        client: &UpstreamClient,
    ) -> Snapshot {
        let service = IdempotencyLayer::new(guard.clone(), routes.clone())
            .layer(Proxy::new(client.clone(), routes.default_target()));
        Snapshot {
            routes,
            mcp,
            hooks,
            service,
        }
    }
}

/// The snapshot new requests get. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct Current(Arc<RwLock<Arc<Snapshot>>>);

impl Current {
    /// The snapshot for a request starting now.
    pub fn load(&self) -> Arc<Snapshot> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn swap(&self, next: Snapshot) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
    }
}

#[cfg(unix)]
type Hangups = tokio::signal::unix::Signal;
#[cfg(not(unix))]
type Hangups = std::convert::Infallible;

/// Where the config came from, read again from there on each `SIGHUP`.
#[derive(Debug)]
pub struct Source {
    /// The config file (`None`: `serve --upstream URL` without one; nothing to reload).
    path: Option<PathBuf>,
    /// The command line's overrides, applied again.
    overrides: Overrides,
    #[cfg_attr(not(unix), allow(dead_code))]
    hangups: Option<Hangups>,
}

impl Source {
    /// Installs the `SIGHUP` handler (off Unix, none): from now on the signal asks for
    /// a reload instead of ending the process.
    pub fn new(path: Option<PathBuf>, overrides: Overrides) -> anyhow::Result<Source> {
        #[cfg(unix)]
        let hangups = Some(
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .map_err(|e| anyhow::anyhow!("cannot handle SIGHUP: {e}"))?,
        );
        #[cfg(not(unix))]
        let hangups = None;
        Ok(Source {
            path,
            overrides,
            hangups,
        })
    }

    /// Resolves on the next `SIGHUP`; never when there is no handler.
    async fn hangup(&mut self) {
        #[cfg(unix)]
        if let Some(h) = &mut self.hangups {
            if h.recv().await.is_some() {
                return;
            }
        }
        std::future::pending().await
    }
}

/// The task that reloads on `SIGHUP`, apart from the accept loop (which never waits
/// for a reload).
#[derive(Debug)]
pub struct Reloader {
    stop: tokio::sync::watch::Sender<bool>,
    handle: tokio::task::JoinHandle<Live>,
}

impl Reloader {
    /// Reloads `live` from `source` on each `SIGHUP` until stopped (no source: never).
    pub fn spawn(mut live: Live, source: Option<Source>) -> Reloader {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let handle = tokio::spawn(async move {
            let Some(mut source) = source else {
                let _ = stopped.changed().await;
                return live;
            };
            loop {
                tokio::select! {
                    _ = stopped.changed() => return live,
                    () = source.hangup() => live.reload(&source).await,
                }
            }
        });
        Reloader { stop, handle }
    }

    /// Stops reloading (a reload under way ends first) and hands the parts back.
    pub async fn stop(self) -> Live {
        let _ = self.stop.send(true);
        match self.handle.await {
            Ok(live) => live,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

/// The config fields a running server cannot take from a reload.
pub const FIXED: [&str; 9] = [
    "listen",
    "admin_listen",
    "admin_token_env",
    "store",
    "store_pool_size",
    "upstream_ca",
    "tls",
    "max_inflight_bytes",
    "tracing",
];

fn fixed_changes(old: &Config, new: &Config) -> Vec<&'static str> {
    let same = [
        old.listen == new.listen,
        old.admin_listen == new.admin_listen,
        old.admin_token_env == new.admin_token_env,
        old.store == new.store,
        old.store_pool_size == new.store_pool_size,
        old.upstream_ca == new.upstream_ca,
        old.tls == new.tls,
        old.max_inflight_bytes == new.max_inflight_bytes,
        old.tracing == new.tracing,
    ];
    FIXED
        .iter()
        .zip(same)
        .filter(|(_, same)| !same)
        .map(|(name, _)| *name)
        .collect()
}

/// The running gateway's parts a reload replaces, and what it builds them with.
#[derive(Debug)]
pub struct Live {
    /// The running config.
    pub config: Arc<Config>,
    /// The requests' snapshot.
    pub current: Current,
    /// The webhook endpoints and their delivery worker.
    pub webhooks: Webhooks,
    /// The job worker of the `job` routes (taken at shutdown).
    pub jobs: Option<JobWorker>,
    /// The running config, for the reconciler (which scans with the current one).
    configs: tokio::sync::watch::Sender<Arc<Config>>,
    /// Whether the guard was given a key to seal queued jobs with (resolved at start).
    job_key: bool,
    guard: Arc<Guard>,
    client: UpstreamClient,
    store: Arc<dyn Store>,
}

impl Live {
    /// Builds the first snapshot and starts the workers. A problem stops the start.
    pub fn start(
        config: Arc<Config>,
        guard: Arc<Guard>,
        job_key: bool,
        client: UpstreamClient,
        store: Arc<dyn Store>,
    ) -> anyhow::Result<Live> {
        let routes = RouteTable::new(&config);
        let mcp = McpEndpoints::new(&config, &guard, &client)?;
        let webhooks = Webhooks::start(&config, &store, guard.tracer().cloned())?;
        super::prometheus::describe(routes.names());
        let jobs = start_jobs(&guard, &client, &routes);
        let snapshot = Snapshot::new(routes, mcp, webhooks.endpoints(), &guard, &client);
        Ok(Live {
            configs: tokio::sync::watch::Sender::new(config.clone()),
            job_key,
            config,
            current: Current(Arc::new(RwLock::new(Arc::new(snapshot)))),
            webhooks,
            jobs: Some(jobs),
            guard,
            client,
            store,
        })
    }

    /// The running config, changing with each reload.
    pub fn configs(&self) -> tokio::sync::watch::Receiver<Arc<Config>> {
        self.configs.subscribe()
    }

    /// Reads the config again from `source` and applies it, or keeps the running one
    /// when it has any problem (each logged). Counted and logged either way.
    pub async fn reload(&mut self, source: &Source) {
        match self.try_reload(source).await {
            Ok(()) => {
                ::metrics::counter!("oncely_config_reloads_total", "result" => "ok").increment(1);
                tracing::info!(
                    target: "oncely::reload",
                    result = "ok",
                    routes = self.config.routes.len(),
                    mcp = self.config.mcp.len(),
                    webhooks = self.config.webhooks.len(),
                    "config reloaded"
                );
            }
            Err(problems) => {
                ::metrics::counter!("oncely_config_reloads_total", "result" => "refused")
                    .increment(1);
                for problem in &problems {
                    tracing::warn!(target: "oncely::reload", %problem, "config reload: problem");
                }
                tracing::warn!(
                    target: "oncely::reload",
                    result = "refused",
                    problems = problems.len(),
                    "config reload refused; the running config is kept"
                );
            }
        }
    }

    async fn try_reload(&mut self, source: &Source) -> Result<(), Vec<String>> {
        let Some(path) = &source.path else {
            return Err(vec![
                "serve was started without --config: there is no file to read again".into(),
            ]);
        };
        // A file being rewritten in place reads empty for a moment (truncated, or only
        // its first comment written): that is no config, not one without routes.
        if std::fs::read_to_string(path)
            .ok()
            .and_then(|text| text.parse::<toml::Table>().ok())
            .is_some_and(|table| table.is_empty())
        {
            return Err(vec![format!(
                "{}: the file is empty (being written?); nothing is changed",
                path.display()
            )]);
        }
        let config = Config::load(path, &source.overrides).map_err(|e| match e {
            ConfigError::Invalid(problems) => problems
                .iter()
                .map(|p| format!("{}: {p}", path.display()))
                .collect(),
            e @ ConfigError::Read { .. } => vec![e.to_string()],
        })?;
        let fixed = fixed_changes(&self.config, &config);
        if !fixed.is_empty() {
            return Err(fixed
                .into_iter()
                .map(|f| format!("{f}: changed, and only a restart can change it"))
                .collect());
        }
        if !self.job_key && config.routes.iter().any(|r| r.class == Class::Job) {
            return Err(vec![
                "routes: a first `job` route needs a restart (the key queued jobs are sealed with is resolved at start)".into(),
            ]);
        }
        let previous = self.current.load();
        let mcp = McpEndpoints::reloaded(&config, &self.guard, &self.client, &previous.mcp)
            .map_err(|e| vec![format!("{e:#}")])?;
        // The last step that can fail: it changes nothing when it does.
        self.webhooks
            .reload(&config, &self.store)
            .map_err(|e| vec![format!("{e:#}")])?;
        let routes = RouteTable::reloaded(&config, Some(&previous.routes));
        super::prometheus::describe(routes.names());
        let snapshot = Snapshot::new(
            routes.clone(),
            mcp,
            self.webhooks.endpoints(),
            &self.guard,
            &self.client,
        );
        self.current.swap(snapshot);
        // The job worker leases only its routes' tasks: start it again on the new ones.
        // Jobs it runs go on (the guard's drain waits for them).
        if let Some(jobs) = self.jobs.take() {
            jobs.stop().await;
        }
        self.jobs = Some(start_jobs(&self.guard, &self.client, &routes));
        self.config = Arc::new(config);
        self.configs.send_replace(self.config.clone());
        Ok(())
    }
}

fn start_jobs(guard: &Arc<Guard>, client: &UpstreamClient, routes: &RouteTable) -> JobWorker {
    JobWorker::start(
        guard.clone(),
        routes.job_policies(),
        Proxy::new(client.clone(), routes.default_target()),
        JobWorkerOptions::default(),
    )
}
