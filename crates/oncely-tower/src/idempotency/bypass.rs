//! [`BypassLog`]: what the one log line (and the span) of a bypassed request needs. The
//! service makes it for a request it bypasses (`guard_when` did not match, or no
//! principal); the response future writes it once the inner service has answered.

use std::time::Instant;

/// What the one log line of a bypassed request needs.
#[derive(Debug)]
pub(crate) struct BypassLog {
    pub(crate) route: String,
    pub(crate) principal: Option<String>,
    pub(crate) workflow_id: Option<String>,
    pub(crate) started: Instant,
    /// The request's server span (traces on).
    pub(crate) span: Option<crate::trace::Span>,
}

impl BypassLog {
    /// Writes the line and ends the span of the answer's `status_code`; `own` is
    /// the code of the gateway's own error when it answered with one instead.
    pub(crate) fn finish(self, status_code: u16, own: Option<&'static str>) {
        let status = own.unwrap_or("bypassed");
        if let Some(mut span) = self.span {
            use crate::trace::attr;
            span.fixed(attr::DECISION, status);
            if let Some(principal) = &self.principal {
                span.set(attr::PRINCIPAL, principal.as_str());
            }
            if let Some(workflow) = &self.workflow_id {
                span.set(attr::WORKFLOW_ID, workflow.as_str());
            }
            if own.is_none() {
                span.set(attr::UPSTREAM_STATUS, i64::from(status_code));
            }
            crate::trace::http_server_response(&mut span, status_code, own);
            span.end();
        }
        crate::log::log_request(&crate::log::RequestLog {
            record: None,
            route: &self.route,
            principal: self.principal.as_deref(),
            status,
            attempt: None,
            workflow_id: self.workflow_id.as_deref(),
            upstream_status: own.is_none().then_some(status_code),
            provider_request_id: None,
            started: self.started,
            span: None,
        });
    }
}
