//! Retries of temporary upstream failures: a route's `retries` and `retry_backoff`.
//!
//! A failure is temporary when the upstream could not be reached (connect refused, DNS,
//! TLS handshake: [`UpstreamError::BeforeSend`]), when the exchange broke before an
//! answer ([`UpstreamError::AfterSend`]), or when the answer is 502, 503 or 504. Which of
//! them may be tried again depends on the route's class ([`Cause::retried_on`]): a `read`
//! is safe to repeat, so all of them are; every other class only when the request
//! provably never reached the upstream, so a retry never repeats a business effect.
//!
//! The delay before retry `n` is uniform in `[0, retry_backoff * 2^(n-1)]` (exponential
//! backoff, full jitter; the webhook worker's rule). A retry starts only while the
//! route's `timeout` has time left for it: its delay must end before the last tenth of the
//! timeout, which stays for the attempt itself, so that a guarded owner's timer (which
//! turns a timeout on an `action` into `outcome_unknown`) never runs out while nothing
//! is being sent. The caller gets the last answer. Each retry is logged and counted in
//! `oncely_upstream_retries_total{route,reason}`.
//!
//! The request body must be kept to be sent again: it is read up to `max_body` first. A
//! larger body is sent once, as it came, without retries.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use oncely_core::{backoff, Class};
use oncely_tower::trace::{AttemptEnd, UpstreamAttributes, TRACEPARENT};
use oncely_tower::{BoxBody, UpstreamError};
use tokio::time::Instant;

use crate::config::Route;
use oncely_tower::client::UpstreamClient;

/// The longest pause before one retry (a route's `timeout` cuts retries sooner).
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(3600);

/// How one route retries.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// The route's name (for the log line and the metric).
    pub route: String,
    /// The route's class: what may be retried.
    pub class: Class,
    /// At most this many retries.
    pub retries: u32,
    /// The first retry's delay ceiling.
    pub backoff: Duration,
    /// Every retry starts within this time of the first attempt.
    pub timeout: Duration,
    /// The largest body kept for a retry.
    pub max_body: u64,
}

impl RetryPolicy {
    /// The policy of a route, `None` when it does not retry.
    pub fn of(route: &Route, max_body: u64) -> Option<RetryPolicy> {
        (route.retries > 0).then(|| RetryPolicy {
            route: route.name.clone(),
            class: route.class,
            retries: route.retries,
            backoff: route.retry_backoff,
            timeout: route.timeout,
            max_body,
        })
    }
}

/// Why an attempt failed, when it failed in a way that may pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The upstream could not be reached: nothing was sent.
    Connect,
    /// The exchange broke after the request may have been sent, before any answer.
    Reset,
    /// The upstream answered 502, 503 or 504.
    Status(StatusCode),
}

impl Cause {
    /// The cause of an attempt's result, `None` when it is not a temporary failure.
    pub fn of<B>(result: &Result<Response<B>, UpstreamError>) -> Option<Cause> {
        match result {
            Ok(res) => {
                matches!(res.status().as_u16(), 502..=504).then(|| Cause::Status(res.status()))
            }
            Err(UpstreamError::BeforeSend(_)) => Some(Cause::Connect),
            Err(UpstreamError::AfterSend(_)) => Some(Cause::Reset),
        }
    }

    /// Whether a route of this class tries again after this failure: a read always; any
    /// other class only when nothing reached the upstream.
    pub fn retried_on(self, class: Class) -> bool {
        class == Class::Read || self == Cause::Connect
    }

    /// The `reason` label and log field.
    pub fn reason(self) -> &'static str {
        match self {
            Cause::Connect => "connect",
            Cause::Reset => "reset",
            Cause::Status(s) if s == StatusCode::BAD_GATEWAY => "status_502",
            Cause::Status(s) if s == StatusCode::SERVICE_UNAVAILABLE => "status_503",
            Cause::Status(_) => "status_504",
        }
    }
}

/// Every value of the `reason` label.
pub const REASONS: [&str; 5] = ["connect", "reset", "status_502", "status_503", "status_504"];

/// Sends `parts` + `body` to the upstream, retrying temporary failures as `policy` says.
pub async fn send(
    client: &UpstreamClient,
    policy: &RetryPolicy,
    mut parts: Parts,
    body: BoxBody,
) -> Result<Response<BoxBody>, UpstreamError> {
    let deadline = Instant::now() + policy.timeout;
    // The attempt itself keeps the last tenth of the timeout.
    let last_start = deadline - policy.timeout / 10;
    let body = match keep(body, policy.max_body).await? {
        Kept::Whole(bytes) => bytes,
        Kept::TooLarge(body) => return client.send(Request::from_parts(parts, body)).await,
    };
    let mut retry = 0u32;
    loop {
        let result = client.send(attempt(&parts, &body)).await;
        let Some(cause) = Cause::of(&result).filter(|c| c.retried_on(policy.class)) else {
            return result;
        };
        if retry >= policy.retries {
            return result;
        }
        retry += 1;
        let ceiling = backoff::exponential(policy.backoff, retry - 1, MAX_RETRY_PAUSE);
        let delay = backoff::full_jitter(ceiling, rand::random());
        if Instant::now() + delay > last_start {
            return result;
        }
        let ended = (
            std::time::SystemTime::now(),
            match &result {
                Ok(res) => AttemptEnd::Status(res.status().as_u16()),
                Err(e) => AttemptEnd::Failed(e.to_string()),
            },
        );
        // An answer that will not be passed on frees its connection now.
        drop(result);
        tracing::info!(
            route = %policy.route,
            attempt = retry + 1,
            reason = %cause.reason(),
            delay = ?delay,
            "retrying a temporary upstream failure"
        );
        metrics::counter!(
            "oncely_upstream_retries_total",
            "route" => policy.route.clone(),
            "reason" => cause.reason()
        )
        .increment(1);
        tokio::time::sleep(delay).await;
        // The resend is a client span of its own, and its traceparent names it.
        let span = parts.extensions.get::<UpstreamAttributes>().cloned();
        if let Some(tp) = span.and_then(|s| s.resend(ended.1, ended.0)) {
            parts.headers.insert(TRACEPARENT, tp.to_header());
        }
    }
}

/// One attempt's request: the same head and body each time.
fn attempt(parts: &Parts, body: &Bytes) -> Request<BoxBody> {
    let mut req = Request::new(oncely_tower::body::full(body.clone()));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    req
}

/// A request body, read whole when it fits in `max_body`.
enum Kept {
    Whole(Bytes),
    /// Too large to keep: what was read, then the rest, as one body.
    TooLarge(BoxBody),
}

async fn keep(mut body: BoxBody, max_body: u64) -> Result<Kept, UpstreamError> {
    let mut read = VecDeque::new();
    let mut len = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            // Nothing was sent yet.
            UpstreamError::BeforeSend(format!("the request body could not be read: {e}"))
        })?;
        let Ok(data) = frame.into_data() else {
            // Trailers end the body; a proxied request does not carry them on.
            break;
        };
        len += data.len() as u64;
        read.push_back(data);
        if len > max_body {
            return Ok(Kept::TooLarge(oncely_tower::body::prefixed(read, body)));
        }
    }
    let mut whole = bytes::BytesMut::with_capacity(len as usize);
    for chunk in read {
        whole.extend_from_slice(&chunk);
    }
    Ok(Kept::Whole(whole.freeze()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Frame;
    use oncely_tower::BoxError;

    fn answer(status: u16) -> Result<Response<()>, UpstreamError> {
        Ok(Response::builder().status(status).body(()).unwrap())
    }

    #[test]
    fn reads_retry_every_temporary_failure_and_the_rest_only_unreached_upstreams() {
        let connect: Result<Response<()>, _> = Err(UpstreamError::BeforeSend("refused".into()));
        let reset: Result<Response<()>, _> = Err(UpstreamError::AfterSend("reset".into()));
        for (result, read, other) in [
            (connect, true, true),
            (reset, true, false),
            (answer(502), true, false),
            (answer(503), true, false),
            (answer(504), true, false),
        ] {
            let cause = Cause::of(&result).unwrap();
            assert_eq!(cause.retried_on(Class::Read), read, "{cause:?}");
            for class in [Class::Write, Class::Action, Class::Job] {
                assert_eq!(cause.retried_on(class), other, "{cause:?} on {class:?}");
            }
            assert!(REASONS.contains(&cause.reason()));
        }
        for status in [200, 404, 500, 501, 505] {
            assert_eq!(Cause::of(&answer(status)), None, "{status}");
        }
    }

    #[tokio::test]
    async fn bodies_over_max_body_are_passed_on_whole_and_not_kept() {
        let chunks = futures::stream::iter(
            ["ab", "cd", "ef"].map(|c| Ok::<_, BoxError>(Frame::data(Bytes::from(c)))),
        );
        let body = oncely_tower::body::boxed(http_body_util::StreamBody::new(chunks));
        let Kept::TooLarge(body) = keep(body, 3).await.unwrap() else {
            panic!("kept a body over max_body");
        };
        assert_eq!(body.collect().await.unwrap().to_bytes(), "abcdef");
        let body = oncely_tower::body::full("abc");
        let Kept::Whole(bytes) = keep(body, 3).await.unwrap() else {
            panic!("a body of max_body was not kept");
        };
        assert_eq!(bytes, "abc");
    }
}
