//! The dialects a route's own errors are written in (`errors`): the body of a
//! [`Problem`] as the SDKs of the API behind the gateway read their API's errors, so that
//! they raise their own typed errors with oncely's code and message. One table per
//! dialect, [`Dialect::table`]; `Problem::render_in` is the one renderer. A dialect
//! changes the body (and Stripe's status of `key_reused`) only: `Retry-After`,
//! `X-Should-Retry`, `Oncely-Problem` and `Oncely-Record` are the same in every one.

use std::fmt;
use std::str::FromStr;

use http::StatusCode;
use serde_json::{json, Value};

/// How a route writes the errors of the gateway's own (`errors`, default `problem`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Dialect {
    /// RFC 9457 `application/problem+json` with a `code` member.
    #[default]
    Problem,
    /// OpenAI's `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// Anthropic's `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
    /// Stripe's `{"error": {"type", "code", "message"}}`, with `Stripe-Should-Retry`.
    Stripe,
}

/// What is said of one problem, whatever the dialect: its code (as `code` names it), title
/// and detail, and what is known of its record and its original.
pub(crate) struct Said<'a> {
    pub(crate) code: &'static str,
    pub(crate) title: &'static str,
    pub(crate) detail: &'a str,
    pub(crate) record: Option<&'a str>,
    pub(crate) original_at: Option<String>,
    pub(crate) retry_after: Option<u64>,
}

/// What a dialect says of one problem: its status, its content type, its document and
/// the headers of its own.
pub(crate) struct Spoken {
    pub(crate) status: StatusCode,
    pub(crate) content_type: &'static str,
    pub(crate) document: Value,
    pub(crate) headers: Vec<(&'static str, &'static str)>,
}

/// One dialect's table: from a problem (with its code's status and whether a retry can
/// succeed) to what is sent.
type Table = fn(&Said<'_>, StatusCode, bool) -> Spoken;

impl Dialect {
    /// Every dialect, as `errors` names them.
    pub const ALL: [Dialect; 4] = [
        Dialect::Problem,
        Dialect::OpenAi,
        Dialect::Anthropic,
        Dialect::Stripe,
    ];

    /// The name `errors` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Problem => "problem",
            Dialect::OpenAi => "openai",
            Dialect::Anthropic => "anthropic",
            Dialect::Stripe => "stripe",
        }
    }

    pub(crate) fn table(self) -> Table {
        match self {
            Dialect::Problem => problem,
            Dialect::OpenAi => openai,
            Dialect::Anthropic => anthropic,
            Dialect::Stripe => stripe,
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `errors` value that names no dialect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown errors dialect {0:?}: expected problem, openai, anthropic or stripe")]
pub struct UnknownDialect(pub String);

impl FromStr for Dialect {
    type Err = UnknownDialect;

    fn from_str(s: &str) -> Result<Dialect, UnknownDialect> {
        Dialect::ALL
            .into_iter()
            .find(|d| d.as_str() == s)
            .ok_or_else(|| UnknownDialect(s.to_string()))
    }
}

fn problem(p: &Said<'_>, status: StatusCode, _: bool) -> Spoken {
    let mut doc = json!({
        "type": format!("urn:oncely:problem:{}", p.code),
        "title": p.title,
        "status": status.as_u16(),
        "detail": p.detail,
        "code": p.code,
    });
    if let Some(id) = p.record {
        doc["record"] = id.into();
    }
    if let Some(at) = &p.original_at {
        doc["original_at"] = at.as_str().into();
    }
    if let Some(s) = p.retry_after {
        doc["retry_after"] = s.into();
    }
    Spoken {
        status,
        content_type: "application/problem+json",
        document: doc,
        headers: Vec::new(),
    }
}

fn openai(p: &Said<'_>, status: StatusCode, _: bool) -> Spoken {
    let kind = if status.is_server_error() {
        "server_error"
    } else {
        "invalid_request_error"
    };
    Spoken {
        status,
        content_type: "application/json",
        document: json!({"error": {
            "message": p.detail,
            "type": kind,
            "param": null,
            "code": p.code,
        }}),
        headers: Vec::new(),
    }
}

fn anthropic(p: &Said<'_>, status: StatusCode, _: bool) -> Spoken {
    let kind = match status {
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        s if s.is_server_error() => "api_error",
        _ => "invalid_request_error",
    };
    Spoken {
        status,
        content_type: "application/json",
        document: json!({"type": "error", "error": {"type": kind, "message": p.detail}}),
        headers: Vec::new(),
    }
}

fn stripe(p: &Said<'_>, status: StatusCode, retry: bool) -> Spoken {
    // Stripe answers a key used with other parameters 400 `idempotency_error`.
    let (kind, status) = match p.code {
        "key_reused" => ("idempotency_error", StatusCode::BAD_REQUEST),
        _ if status.is_server_error() => ("api_error", status),
        _ => ("invalid_request_error", status),
    };
    Spoken {
        status,
        content_type: "application/json",
        document: json!({"error": {
            "type": kind,
            "code": p.code,
            "message": p.detail,
        }}),
        headers: vec![("stripe-should-retry", if retry { "true" } else { "false" })],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_and_unknown_ones_are_refused() {
        for d in Dialect::ALL {
            assert_eq!(d.as_str().parse::<Dialect>(), Ok(d));
        }
        assert!("OpenAI".parse::<Dialect>().is_err());
        assert!("json".parse::<Dialect>().is_err());
        assert_eq!(Dialect::default(), Dialect::Problem);
    }
}
