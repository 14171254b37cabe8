//! A job request and its sealing: the [`JobRequest`] a `job` route's request becomes,
//! the task that keeps it in the queue until it runs (kind `job:ROUTE`; the headers worth
//! forwarding, the body and the query sealed with the guard's [`JobKey`] when it has
//! one, bound to the task's kind, method and path), and the request a run sends the
//! upstream again, with the downstream key.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request};
use oncely_core::DownstreamKey;
use oncely_store::{NewTask, Task};

use crate::body::full;
use crate::policy::RoutePolicy;
use crate::seal::{self, JobKey};
use crate::BoxBody;

/// A job task's attempts before it is dead: effectively unlimited (each attempt is a
/// worker that died mid-call).
const JOB_MAX_ATTEMPTS: u32 = 1_000;

/// The queue kind of a route's jobs.
pub fn task_kind(route: &str) -> String {
    format!("job:{route}")
}

/// A job request: the call, and what the worker needs to make it again later.
#[derive(Debug, Clone)]
pub struct JobRequest {
    /// Method.
    pub method: Method,
    /// Path and query, as sent.
    pub target: String,
    /// The headers to forward (hop-by-hop, length and key headers are dropped here).
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

/// What a sealed job payload is bound to: its task's kind, method and path.
fn sealed_binding(kind: &str, method: &str, path: &str) -> Vec<u8> {
    format!("{kind} {method} {path}").into_bytes()
}

/// Headers a queued job does not keep: hop-by-hop headers (the one policy of
/// [`crate::headers`]), and those of one message's framing or set again when it runs.
fn keep_for_job(name: &HeaderName) -> bool {
    !crate::headers::is_hop_by_hop(name.as_str())
        && !matches!(
            name.as_str(),
            "content-length" | "host" | "idempotency-key" | "expect"
        )
}

impl JobRequest {
    /// The task that keeps this request until it runs. With a [`JobKey`] the headers,
    /// body and query are sealed into the task's body (see [`crate::seal`]); the store
    /// keeps only the method, the path and an opaque body.
    pub(super) fn task(&self, policy: &RoutePolicy, key: Option<&JobKey>) -> NewTask {
        let headers: Vec<(String, String)> = self
            .headers
            .iter()
            .filter(|(n, _)| keep_for_job(n))
            .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        let kind = task_kind(&policy.name);
        let method = self.method.as_str().to_string();
        let (target, headers, body) = match key {
            Some(key) => {
                let path = self
                    .target
                    .split_once('?')
                    .map_or(self.target.as_str(), |(path, _)| path)
                    .to_string();
                let opened = seal::Opened {
                    target: self.target.clone(),
                    headers,
                    body: self.body.to_vec(),
                };
                let sealed = key.seal(&sealed_binding(&kind, &method, &path), &opened);
                (path, Vec::new(), sealed)
            }
            None => (self.target.clone(), headers, self.body.to_vec()),
        };
        NewTask {
            kind,
            target,
            method,
            headers,
            body,
            max_attempts: JOB_MAX_ATTEMPTS,
            timeout: policy.timeout,
            backoff: policy.lease,
        }
    }

    pub(super) fn from_task(task: &Task, key: Option<&JobKey>) -> Result<JobRequest, String> {
        let method = Method::from_bytes(task.method.as_bytes())
            .map_err(|e| format!("queued job has a bad method: {e}"))?;
        let opened = if seal::is_sealed(&task.body) {
            let key = key.ok_or("the queued job is sealed and no job key is set")?;
            key.open(
                &sealed_binding(&task.kind, &task.method, &task.target),
                &task.body,
            )?
        } else {
            // Queued before sealing was on (or by a guard without a key).
            seal::Opened {
                target: task.target.clone(),
                headers: task.headers.clone(),
                body: task.body.clone(),
            }
        };
        let mut headers = HeaderMap::new();
        for (n, v) in &opened.headers {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(n.as_bytes()),
                HeaderValue::from_str(v),
            ) {
                headers.append(n, v);
            }
        }
        Ok(JobRequest {
            method,
            target: opened.target,
            headers,
            body: Bytes::from(opened.body),
        })
    }

    /// The request the upstream gets, with the downstream key.
    pub(super) fn upstream_request(&self, key: &DownstreamKey) -> Request<BoxBody> {
        let mut req = Request::new(full(self.body.clone()));
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.target.parse().unwrap_or_else(|_| "/".parse().unwrap());
        *req.headers_mut() = self.headers.clone();
        let h = req.headers_mut();
        crate::headers::sent_whole(h, self.body.len());
        h.insert(
            HeaderName::from_static("idempotency-key"),
            HeaderValue::from_str(key.as_str()).expect("a downstream key is visible ASCII"),
        );
        req
    }
}
