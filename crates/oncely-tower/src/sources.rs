//! The extension points of a guarded route, as tower-http's `MakeRequestId`: where the
//! client's key comes from ([`MakeKey`]), which account a request acts for
//! ([`MakePrincipal`]), and what one execution is worth ([`MakeUnits`]). A
//! route's policy (`RoutePolicy`) holds one of each behind an `Arc`; the built-in
//! ones are the config's values ([`KeyMode`], [`PrincipalSource`], [`UnitsRule`]), and a
//! service adds its own by implementing a trait: no proxy code changes. The MCP proxy
//! uses the same traits for its principal and units.

use std::borrow::Cow;
use std::fmt::Debug;

use http::{HeaderMap, HeaderName, Method};
use oncely_core::{ClientKey, KeyError};

use crate::problem::{Problem, ProblemCode};

/// The `Idempotency-Key` header.
pub(crate) const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The raw identity of a single-tenant route's one account (`principal = "none"`).
pub const SINGLE_TENANT: &[u8] = b"oncely/single-tenant";

/// The head of a request as an extension point sees it.
#[derive(Debug, Clone, Copy)]
pub struct RequestHead<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path and query, e.g. `/v1/render?fast=1`.
    pub target: &'a str,
    /// The headers as the client sent them.
    pub headers: &'a HeaderMap,
}

impl<'a> RequestHead<'a> {
    /// The head of `req`.
    pub fn of<B>(req: &'a http::Request<B>) -> RequestHead<'a> {
        RequestHead {
            method: req.method(),
            target: req.uri().path_and_query().map_or("/", |p| p.as_str()),
            headers: req.headers(),
        }
    }

    /// The head of a request taken apart.
    pub fn of_parts(parts: &'a http::request::Parts) -> RequestHead<'a> {
        RequestHead {
            method: &parts.method,
            target: parts.uri.path_and_query().map_or("/", |p| p.as_str()),
            headers: &parts.headers,
        }
    }
}

/// Where a request's idempotency key comes from.
pub trait MakeKey: Debug + Send + Sync + 'static {
    /// The client's key of this request: `Ok(None)` when it has none (the request's
    /// fingerprint is then its key), `Err` to refuse the request with that problem (a
    /// 400 `key_missing` or `key_invalid`). `body` is the whole request body when
    /// [`reads_body`](MakeKey::reads_body) says so, else empty: the key is made before the
    /// body is read, and a request refused for its key is refused without reading it.
    fn make_key(&self, head: &RequestHead<'_>, body: &[u8]) -> Result<Option<ClientKey>, Problem>;

    /// Whether [`make_key`](MakeKey::make_key) needs the body (default: no).
    fn reads_body(&self) -> bool {
        false
    }

    /// Whether the route deduplicates at all (default: yes). A route that does not is
    /// forwarded untouched.
    fn deduplicates(&self) -> bool {
        true
    }
}

/// Which account a request acts for.
pub trait MakePrincipal: Debug + Send + Sync + 'static {
    /// The account's raw identity (the guard stores only its keyed hash), or `None`: the
    /// request names no account it can be trusted for, and is forwarded unguarded
    /// (`bypassed`).
    fn make_principal<'a>(&self, head: &RequestHead<'a>) -> Option<Cow<'a, [u8]>>;
}

/// How many billing units one execution is worth (what a repeat was not charged).
pub trait MakeUnits: Debug + Send + Sync + 'static {
    /// The units of a request, from its head and its whole body (for an MCP tool call,
    /// the body is the call's `arguments`).
    fn request_units(&self, head: &RequestHead<'_>, body: &[u8]) -> u64;

    /// The units read from the upstream answer's headers, which then replace the
    /// request's (default: none, the request's stand).
    fn response_units(&self, headers: &HeaderMap) -> Option<u64> {
        let _ = headers;
        None
    }
}

impl MakeKey for KeyMode {
    fn make_key(&self, head: &RequestHead<'_>, _body: &[u8]) -> Result<Option<ClientKey>, Problem> {
        let mode = *self;
        let mut values = head.headers.get_all(IDEMPOTENCY_KEY).iter();
        let raw = values.next();
        // Idempotency-Key is one structured-field Item: two header lines name two keys,
        // and no single intention. Refuse rather than pick one.
        if mode != KeyMode::Fingerprint && values.next().is_some() {
            return Err(Problem::new(
                ProblemCode::KeyInvalid,
                "the request carries more than one Idempotency-Key header",
            ));
        }
        match (mode, raw) {
            (KeyMode::Fingerprint, _) => Ok(None),
            (KeyMode::Header, None) => Err(Problem::new(
                ProblemCode::KeyMissing,
                KeyError::Missing.to_string(),
            )),
            (_, None) => Ok(None),
            (_, Some(v)) => ClientKey::parse(v.as_bytes())
                .map(Some)
                .map_err(|e| Problem::new(ProblemCode::KeyInvalid, e.to_string())),
        }
    }

    fn deduplicates(&self) -> bool {
        *self != KeyMode::None
    }
}

/// Every value of header `name`, as one: a single line as it is, several lines joined
/// with `", "` in order (what HTTP makes of a field sent on several lines), `None` when
/// absent. Reading only the first line would let a second one change the request
/// without changing what oncely keys it by.
pub fn combined<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<Cow<'a, [u8]>> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    let Some(second) = values.next() else {
        return Some(Cow::Borrowed(first.as_bytes()));
    };
    let mut all = first.as_bytes().to_vec();
    for v in std::iter::once(second).chain(values) {
        all.extend_from_slice(b", ");
        all.extend_from_slice(v.as_bytes());
    }
    Some(Cow::Owned(all))
}

impl MakePrincipal for PrincipalSource {
    fn make_principal<'a>(&self, head: &RequestHead<'a>) -> Option<Cow<'a, [u8]>> {
        match self {
            // An empty header is a missing one: it names no account. Two lines are one
            // account of their own, never the first line's (the upstream may read the
            // other).
            PrincipalSource::Header(name) => {
                combined(head.headers, name).filter(|v| !v.iter().all(|b| matches!(b, b',' | b' ')))
            }
            PrincipalSource::None => Some(Cow::Borrowed(SINGLE_TENANT)),
        }
    }
}

impl UnitsRule {
    /// The units of a request whose body is `body` (no rule reads the request's head; a
    /// `response_header` rule counts 0 until the answer names them).
    pub fn units_of(&self, body: &[u8]) -> u64 {
        match self {
            UnitsRule::None | UnitsRule::ResponseHeader(_) => 0,
            UnitsRule::Fixed(n) => *n,
            UnitsRule::BodyBytes => body.len() as u64,
            UnitsRule::Json(pointer) => {
                let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) else {
                    return 0;
                };
                json_units(value.pointer(pointer))
            }
        }
    }
}

impl MakeUnits for UnitsRule {
    fn request_units(&self, _head: &RequestHead<'_>, body: &[u8]) -> u64 {
        self.units_of(body)
    }

    fn response_units(&self, headers: &HeaderMap) -> Option<u64> {
        match self {
            UnitsRule::ResponseHeader(name) => Some(
                headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(0),
            ),
            _ => None,
        }
    }
}

/// A JSON value's units: a string counts its characters, a number its (non-negative,
/// truncated) value, anything else 0.
fn json_units(value: Option<&serde_json::Value>) -> u64 {
    match value {
        Some(serde_json::Value::String(s)) => s.chars().count() as u64,
        Some(serde_json::Value::Number(n)) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| *f > 0.0).map(|f| f as u64))
            .unwrap_or(0),
        _ => 0,
    }
}

/// Where a request's idempotency key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyMode {
    /// The client's `Idempotency-Key` header; a request without one gets 400 `key_missing`.
    Header,
    /// No client key: the key is the request's fingerprint.
    Fingerprint,
    /// The header when present, else the fingerprint.
    HeaderOrFingerprint,
    /// Not deduplicated: the request is forwarded untouched.
    None,
}

/// How many billing units one execution is worth (what a repeat was not charged).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum UnitsRule {
    /// No units (0).
    #[default]
    None,
    /// The request body's length in bytes.
    BodyBytes,
    /// A JSON pointer into the **request** body: a string counts its characters, a
    /// number its (non-negative, truncated) value; anything else counts 0. The seed's
    /// render service charges per character of `/text`, which is `json:/text`.
    Json(String),
    /// The upstream answer's header, read as a non-negative integer (absent or
    /// unreadable: 0).
    ResponseHeader(HeaderName),
    /// The same units for every execution (an MCP tool call's `call` is one).
    Fixed(u64),
}

/// Where a `units` rule is written, which decides its vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnitsOf {
    /// A `[[routes]]` entry: `body_bytes`, `json:/POINTER` (into the request body) or
    /// `response_header:NAME`.
    Route,
    /// An MCP endpoint: `call` (one per call) or `json:POINTER` (into the tool's
    /// `arguments`).
    ToolCall,
}

impl UnitsRule {
    /// Reads a `units` rule as `of` writes it: the one parser of the config file and of
    /// the MCP crate.
    pub fn parse(text: &str, of: UnitsOf) -> Result<UnitsRule, String> {
        match of {
            UnitsOf::Route => {
                if text == "body_bytes" {
                    Ok(UnitsRule::BodyBytes)
                } else if let Some(p) = text.strip_prefix("json:") {
                    if p.starts_with('/') {
                        Ok(UnitsRule::Json(p.to_owned()))
                    } else {
                        Err(format!(
                            "{p:?} is not a JSON pointer (it must start with \"/\", e.g. \"/request_id\")"
                        ))
                    }
                } else if let Some(name) = text.strip_prefix("response_header:") {
                    HeaderName::from_bytes(name.as_bytes())
                        .map(UnitsRule::ResponseHeader)
                        .map_err(|_| format!("{name:?} is not a valid header name"))
                } else {
                    Err(format!(
                        "unknown units {text:?} (use body_bytes, json:/POINTER or response_header:NAME)"
                    ))
                }
            }
            UnitsOf::ToolCall => match text {
                "call" | "calls" => Ok(UnitsRule::Fixed(1)),
                _ => match text.strip_prefix("json:") {
                    Some(p) if p.is_empty() || p.starts_with('/') => {
                        Ok(UnitsRule::Json(p.to_string()))
                    }
                    _ => Err(format!(
                        "units {text:?}: use \"call\" or \"json:/POINTER\" (into the tool's arguments)"
                    )),
                },
            },
        }
    }
}

/// What identifies the account a request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrincipalSource {
    /// The raw value of this header (e.g. `authorization`); it is stored only as a keyed
    /// hash. A request without it is forwarded unguarded (`bypassed`).
    Header(HeaderName),
    /// A single-tenant route: every caller is one account.
    None,
}

/// Most characters of a workflow id kept from `X-Workflow-Id`.
const MAX_WORKFLOW_ID: usize = 200;

/// The caller's workflow, for every guarded request alike (HTTP routes, jobs, MCP tool
/// calls): `X-Workflow-Id` (trimmed, its first 200 characters), else the trace id of a
/// valid W3C `traceparent` ([`TraceParent::parse`](crate::trace::TraceParent::parse),
/// the one reading of that header).
pub fn workflow_id(headers: &HeaderMap) -> Option<String> {
    if let Some(v) = headers.get("x-workflow-id").and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        if !v.is_empty() {
            return Some(v.chars().take(MAX_WORKFLOW_ID).collect());
        }
    }
    let tp = headers.get(crate::trace::TRACEPARENT)?;
    crate::trace::TraceParent::parse(tp.as_bytes()).map(|t| hex::encode(t.trace_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workflow_id_from_header_or_traceparent() {
        let mut h = HeaderMap::new();
        assert_eq!(workflow_id(&h), None);
        h.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        assert_eq!(
            workflow_id(&h).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        h.insert("x-workflow-id", "wf-7".parse().unwrap());
        assert_eq!(workflow_id(&h).as_deref(), Some("wf-7"));
        let mut zeros = HeaderMap::new();
        zeros.insert(
            "traceparent",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01"
                .parse()
                .unwrap(),
        );
        assert_eq!(workflow_id(&zeros), None);
        let mut long = HeaderMap::new();
        long.insert(
            "x-workflow-id",
            format!("  {}  ", "w".repeat(300)).parse().unwrap(),
        );
        assert_eq!(workflow_id(&long).map(|w| w.len()), Some(200));
        let mut malformed = HeaderMap::new();
        malformed.insert(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-bad".parse().unwrap(),
        );
        assert_eq!(workflow_id(&malformed), None);
    }

    fn head(headers: &HeaderMap) -> RequestHead<'_> {
        RequestHead {
            method: &Method::POST,
            target: "/",
            headers,
        }
    }

    #[test]
    fn built_in_units_rules() {
        let h = HeaderMap::new();
        let body = br#"{"text":"h\u00e9llo","n":7.9}"#;
        assert_eq!(
            UnitsRule::Json("/text".into()).request_units(&head(&h), body),
            5
        );
        assert_eq!(
            UnitsRule::Json("/n".into()).request_units(&head(&h), body),
            7
        );
        assert_eq!(
            UnitsRule::Json("/x".into()).request_units(&head(&h), body),
            0
        );
        assert_eq!(UnitsRule::Fixed(1).request_units(&head(&h), body), 1);
        assert_eq!(UnitsRule::None.response_units(&h), None);
        let mut answer = HeaderMap::new();
        answer.insert("x-units", " 12 ".parse().unwrap());
        let rule = UnitsRule::ResponseHeader(http::HeaderName::from_static("x-units"));
        assert_eq!(rule.response_units(&answer), Some(12));
        assert_eq!(rule.response_units(&h), Some(0));
    }

    #[test]
    fn built_in_principals_and_keys() {
        let mut h = HeaderMap::new();
        let by_auth = PrincipalSource::Header(http::header::AUTHORIZATION);
        assert_eq!(by_auth.make_principal(&head(&h)), None);
        h.insert("authorization", "".parse().unwrap());
        assert_eq!(by_auth.make_principal(&head(&h)), None, "empty is missing");
        h.insert("authorization", "Bearer a".parse().unwrap());
        assert_eq!(
            by_auth.make_principal(&head(&h)).as_deref(),
            Some(&b"Bearer a"[..])
        );
        assert_eq!(
            PrincipalSource::None.make_principal(&head(&h)).as_deref(),
            Some(SINGLE_TENANT)
        );
        assert!(KeyMode::Header.make_key(&head(&h), b"").is_err());
        assert_eq!(
            KeyMode::HeaderOrFingerprint.make_key(&head(&h), b""),
            Ok(None)
        );
        h.append(IDEMPOTENCY_KEY, "k1".parse().unwrap());
        assert_eq!(
            KeyMode::Header
                .make_key(&head(&h), b"")
                .unwrap()
                .map(|k| k.as_str().to_string()),
            Some("k1".into())
        );
        assert_eq!(KeyMode::Fingerprint.make_key(&head(&h), b""), Ok(None));
        h.append(IDEMPOTENCY_KEY, "k2".parse().unwrap());
        assert!(KeyMode::HeaderOrFingerprint
            .make_key(&head(&h), b"")
            .is_err());
        assert!(!KeyMode::None.deduplicates() && KeyMode::Header.deduplicates());
    }
}
