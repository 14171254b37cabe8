//! `[[webhooks]]` in `oncely serve`: each config entry becomes an
//! [`oncely_webhooks::WebhookEndpoint`] (verify, claim the event id once, queue the
//! delivery durably, answer), all fed to one [`DeliveryWorker`] per process. Requests
//! whose path is a webhook path are answered before the HTTP route table.
//!
//! With traces on, a webhook request is a server span, whose `traceparent` is stored with
//! its delivery; each delivery attempt is a client span under it ([`Deliveries`]), so the
//! delivery is in the trace of the request that received the event, whenever and on
//! whichever instance it runs.

use std::sync::Arc;

use anyhow::Context as _;
use http::{Request, Response};
use hyper::body::Incoming;
use oncely_http::problem::{Problem, ProblemCode};
use oncely_store::Store;
use oncely_tower::trace::{attr, ClientSpan, Tracer};
use oncely_tower::BoxBody;
use oncely_webhooks::worker::{DeliveryWorker, WorkerOptions};
use oncely_webhooks::{Secrets, Verifier, WebhookConfig, WebhookEndpoint};

use crate::config::{Config, WebhookEndpoint as WebhookEntry};

/// The configured webhook endpoints and the worker that delivers their events.
#[derive(Debug, Default)]
pub struct Webhooks {
    endpoints: Arc<Vec<WebhookEndpoint>>,
    worker: Option<DeliveryWorker>,
    tracer: Option<Arc<Tracer>>,
}

impl Webhooks {
    /// One endpoint per `[[webhooks]]` entry, and a delivery worker when there is any.
    /// A secret variable that is unset or malformed stops the server with a clear error.
    /// With `tracer`, requests and deliveries are spans.
    pub fn start(
        config: &Config,
        store: &Arc<dyn Store>,
        tracer: Option<Arc<Tracer>>,
    ) -> anyhow::Result<Webhooks> {
        if config.webhooks.is_empty() {
            return Ok(Webhooks {
                tracer,
                ..Webhooks::default()
            });
        }
        let worker = start_worker(config, store, tracer.as_ref());
        let endpoints = build(config, store, &worker)?;
        Ok(Webhooks {
            endpoints: Arc::new(endpoints),
            worker: Some(worker),
            tracer,
        })
    }

    /// The endpoints of a config read again (SIGHUP), on this process's one worker,
    /// which keeps running: deliveries already queued carry their own target and
    /// attempt limit, so they are delivered (or dead-lettered) as they were received,
    /// whether their entry changed, went, or not. A worker is started when the first
    /// entry appears; its lease stays the one it started with. A problem changes nothing.
    pub fn reload(&mut self, config: &Config, store: &Arc<dyn Store>) -> anyhow::Result<()> {
        if config.webhooks.is_empty() {
            self.endpoints = Arc::default();
            return Ok(());
        }
        // Every entry resolves (secrets set) before a worker is started for them.
        for (i, entry) in config.webhooks.iter().enumerate() {
            resolve(config, entry).with_context(|| format!("webhooks[{i}]"))?;
        }
        if self.worker.is_none() {
            self.worker = Some(start_worker(config, store, self.tracer.as_ref()));
        }
        let worker = self.worker.as_ref().expect("a worker");
        self.endpoints = Arc::new(build(config, store, worker)?);
        Ok(())
    }

    /// What the request handlers need (cheap to clone).
    pub fn endpoints(&self) -> WebhookPaths {
        WebhookPaths(self.endpoints.clone(), self.tracer.clone())
    }

    /// The admin routes (`GET /webhooks/dead`, `POST /webhooks/dead/{id}/redeliver`),
    /// waking this process's worker on a redelivery.
    pub fn admin_router(&self, store: Arc<dyn Store>) -> axum::Router {
        oncely_webhooks::ops::admin_router(store, self.waker())
    }

    /// What wakes this process's delivery worker, when it has one.
    pub fn waker(&self) -> Option<oncely_webhooks::Waker> {
        self.worker.as_ref().map(|w| w.waker())
    }

    /// Stops the worker, letting deliveries in flight finish (queued ones stay queued).
    pub async fn stop(self) {
        if let Some(worker) = self.worker {
            worker.stop().await;
        }
    }
}

/// The webhook endpoints by path.
#[derive(Debug, Clone, Default)]
pub struct WebhookPaths(Arc<Vec<WebhookEndpoint>>, Option<Arc<Tracer>>);

impl WebhookPaths {
    /// Whether `path` is a webhook endpoint's.
    pub fn serves(&self, path: &str) -> bool {
        self.0.iter().any(|e| e.path() == path)
    }

    /// Answers `req` when its path is a webhook endpoint's; hands it back otherwise.
    pub async fn answer(
        &self,
        req: Request<Incoming>,
    ) -> Result<Response<BoxBody>, Request<Incoming>> {
        let Some(endpoint) = self.0.iter().find(|e| e.path() == req.uri().path()) else {
            return Err(req);
        };
        if req.method() != http::Method::POST {
            return Ok(method_not_allowed());
        }
        let mut req = req;
        // The request's span; its `traceparent` (replacing the sender's) is stored with
        // the delivery.
        let span = self.1.as_ref().map(|tracer| {
            let mut span = tracer.start_request(req.headers(), String::new());
            let path = endpoint.path().to_string();
            oncely_tower::trace::http_server_request(&mut span, &req, Some(&path));
            span.propagate(req.headers_mut());
            span
        });
        let response = endpoint.handle(req.map(axum::body::Body::new)).await;
        if let Some(mut span) = span {
            let status = response.status().as_u16();
            if let Some(s) = response
                .headers()
                .get("oncely-status")
                .and_then(|v| v.to_str().ok())
            {
                span.set(attr::DECISION, s.to_string());
            }
            let own = oncely_tower::Problem::code_of(&response);
            oncely_tower::trace::http_server_response(&mut span, status, own);
            span.end();
        }
        Ok(response.map(oncely_tower::body::boxed))
    }
}

fn method_not_allowed() -> Response<BoxBody> {
    let mut res =
        Problem::new(ProblemCode::MethodNotAllowed, "webhook endpoints take POST").into_response();
    res.headers_mut()
        .insert(http::header::ALLOW, http::HeaderValue::from_static("POST"));
    res
}

/// The one worker that delivers for every endpoint: the shortest lease serves them all
/// (a shorter lease only means more frequent renewals), and `https://` targets are
/// verified like upstreams (system roots, `upstream_ca`, `$ONCELY_EXTRA_CA_FILE`).
fn start_worker(
    config: &Config,
    store: &Arc<dyn Store>,
    tracer: Option<&Arc<Tracer>>,
) -> DeliveryWorker {
    let mut options = WorkerOptions {
        spans: tracer
            .map(|t| Arc::new(Deliveries(t.clone())) as Arc<dyn oncely_webhooks::DeliverySpans>),
        ..WorkerOptions::default()
    };
    if let Some(lease) = config.webhooks.iter().map(|w| w.lease).min() {
        options.lease = lease;
    }
    DeliveryWorker::start_trusting(store.clone(), options, config.upstream_ca.as_deref())
}

/// Delivery attempts as client spans under the span of the request that received the
/// event (the `traceparent` stored with the delivery); an attempt without one (a
/// delivery queued before traces were on) has none.
#[derive(Debug)]
struct Deliveries(Arc<Tracer>);

impl oncely_webhooks::DeliverySpans for Deliveries {
    fn start(&self, headers: &mut http::HeaderMap, target: &str) -> oncely_webhooks::DeliveryEnd {
        let Some(mut span) = self.0.start_client_under(headers, "POST".into()) else {
            return Box::new(|_| {});
        };
        span.set(attr::HTTP_METHOD, "POST");
        span.propagate(headers);
        let span = ClientSpan::new(span);
        if let Ok(uri) = target.parse::<http::Uri>() {
            span.attributes().target(&uri);
        }
        Box::new(move |result| match result {
            Ok(status) => span.answered(status),
            Err(why) => span.failed(why),
        })
    }
}

fn build(
    config: &Config,
    store: &Arc<dyn Store>,
    worker: &DeliveryWorker,
) -> anyhow::Result<Vec<WebhookEndpoint>> {
    let mut endpoints = Vec::new();
    for (i, entry) in config.webhooks.iter().enumerate() {
        let resolved = resolve(config, entry).with_context(|| format!("webhooks[{i}]"))?;
        endpoints.push(WebhookEndpoint::new(resolved, store.clone()).with_waker(worker.waker()));
    }
    Ok(endpoints)
}

fn resolve(config: &Config, entry: &WebhookEntry) -> anyhow::Result<WebhookConfig> {
    let value = std::env::var(&entry.secret_env)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .with_context(|| format!("secret_env: ${} is not set", entry.secret_env))?;
    let secrets = Secrets::parse(&entry.verify, &value)
        .with_context(|| format!("secret_env: ${}", entry.secret_env))?;
    let mut verifier = Verifier::new(entry.verify.clone(), secrets, entry.tolerance);
    if let Some(source) = &entry.event_id {
        verifier = verifier.with_event_id(source.clone());
    }
    let mut resolved = WebhookConfig::new(
        entry.path.clone(),
        verifier,
        entry.deliver_to.uri.to_string(),
    );
    resolved.dedupe_fields = entry.dedupe_fields.clone();
    resolved.deliver_timeout = entry.deliver_timeout;
    resolved.max_attempts = entry.max_attempts;
    resolved.retry_backoff = entry.retry_backoff;
    resolved.max_body = usize::try_from(config.max_body).unwrap_or(usize::MAX);
    Ok(resolved)
}
