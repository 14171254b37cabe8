//! Asking an upstream whether an `outcome_unknown` action happened: the route's
//! `reconcile = "METHOD /path?x={key}"` with `{key}` the downstream key the action was
//! sent with. 2xx: it happened, and that answer is what duplicates get; 404: it did not;
//! anything else (or no answer): still unknown.

use std::time::Duration;

use http::{HeaderValue, Request};
use http_body_util::BodyExt;
use oncely_core::{DownstreamKey, Record, Resolution, StoredResponse};

use super::proxy::{strip_hop_by_hop, upstream_uri, UpstreamClient};
use crate::config::{Reconcile, Upstream};

/// What the upstream said.
#[derive(Debug)]
pub enum Verdict {
    /// Resolve the record so (the window of a completion is the caller's to set).
    Resolve(Resolution),
    /// Still unknown, and why.
    Unknown(String),
}

/// Headers not worth keeping in a stored answer.
fn keep_header(name: &str) -> bool {
    !matches!(name, "content-length" | "date" | "server")
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
        let headers = parts
            .headers
            .iter()
            .filter(|(n, _)| keep_header(n.as_str()))
            .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
            .collect();
        Verdict::Resolve(Resolution::Completed {
            response: StoredResponse {
                status,
                headers,
                body: Some(body.to_vec()),
            },
            window: Duration::ZERO,
            reason: format!("reconciled: {} {uri} answered {status}", spec.method),
        })
    } else if status == 404 {
        Verdict::Resolve(Resolution::Released {
            reason: format!("reconciled: {} {uri} answered 404", spec.method),
        })
    } else {
        Verdict::Unknown(format!("{} {uri} answered {status}", spec.method))
    }
}
