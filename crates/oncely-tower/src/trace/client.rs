//! The client span of an upstream call ([`ClientSpan`]): one span per attempt when its
//! sender sends the call again.

use std::time::SystemTime;

use super::attr;
use super::context::new_span_id;
use super::conventions::{AttemptEnd, UpstreamAttributes};
use super::data::SpanData;
use super::Span;

/// The span of an upstream call: ended with its answer, or, when dropped unanswered
/// (the call timed out, or was cut off), ended as failed. What the sender learns later
/// (the upstream's URL, resends) arrives through its [`UpstreamAttributes`]. A call its
/// sender sent again is one client span per attempt (the HTTP conventions' resends): this
/// span is the first attempt, ended when the first answer came; each resend is a sibling
/// with `http.request.resend_count`, the last ended with the answer given here.
#[derive(Debug)]
pub struct ClientSpan(Option<Span>, UpstreamAttributes);

impl ClientSpan {
    /// Watches `span`.
    pub fn new(span: Span) -> ClientSpan {
        let attributes = UpstreamAttributes::with_context(span.data.trace_id, span.sampled);
        ClientSpan(Some(span), attributes)
    }

    /// Its first attempt's span, as a record keeps the span that executed it.
    pub fn span_ref(&self) -> Option<oncely_engine::SpanRef> {
        self.0.as_ref().map(Span::span_ref)
    }

    /// What the sender adds to the span (put in the request's extensions).
    pub fn attributes(&self) -> UpstreamAttributes {
        self.1.clone()
    }

    /// Ends the attempts: each but the last with how it ended, the last with `f`.
    fn finish(&mut self, f: impl FnOnce(&mut Span)) {
        let Some(mut span) = self.0.take() else {
            return;
        };
        let (attributes, attempts) = self.1.take();
        for (k, v) in attributes {
            span.set(k, v);
        }
        let Some((first, resends)) = attempts.split_first() else {
            f(&mut span);
            span.end();
            return;
        };
        let resends: Vec<Span> = resends
            .iter()
            .enumerate()
            .map(|(n, attempt)| {
                let mut resend = Span {
                    tracer: span.tracer.clone(),
                    data: SpanData {
                        span_id: attempt.span_id.unwrap_or_else(new_span_id),
                        start: attempt.start,
                        ..span.data.clone()
                    },
                    sampled: span.sampled,
                };
                resend.set(attr::RESEND_COUNT, n as i64 + 1);
                resend
            })
            .collect();
        let ended = |mut span: Span, end: &Option<(SystemTime, AttemptEnd)>| match end {
            Some((at, AttemptEnd::Status(status))) => {
                answered_with(&mut span, *status);
                span.end_at(*at);
            }
            Some((at, AttemptEnd::Failed(why))) => {
                unreachable_with(&mut span, why.clone());
                span.end_at(*at);
            }
            None => span.end(),
        };
        ended(span, &first.end);
        let mut resends = resends;
        let Some(mut last) = resends.pop() else {
            return;
        };
        for (n, resend) in resends.into_iter().enumerate() {
            ended(resend, &attempts[n + 1].end);
        }
        f(&mut last);
        last.end();
    }

    /// Ends it with the upstream's status (a 5xx marks it failed, `error.type` the
    /// status).
    pub fn answered(mut self, status: u16) {
        self.finish(|span| answered_with(span, status));
    }

    /// Ends it as answered, over a transport without statuses (stdio).
    pub fn ended(mut self) {
        self.finish(|_| {});
    }

    /// Ends it failed.
    pub fn failed(mut self, why: impl Into<String>) {
        let why = why.into();
        self.finish(|span| unreachable_with(span, why));
    }
}

/// A client span's answer: its status, and for a 5xx `error.type` and failed.
fn answered_with(span: &mut Span, status: u16) {
    span.set(attr::HTTP_STATUS, i64::from(status));
    if status >= 500 {
        span.set(attr::ERROR_TYPE, status.to_string());
        span.fail(format!("upstream answered {status}"));
    }
}

/// A client span without an answer.
fn unreachable_with(span: &mut Span, why: String) {
    span.set(attr::ERROR_TYPE, "upstream_unreachable");
    span.fail(why);
}

impl Drop for ClientSpan {
    fn drop(&mut self) {
        self.finish(|span| {
            span.set(attr::ERROR_TYPE, "timeout");
            span.fail("no answer: the call timed out or was cut off");
        });
    }
}
