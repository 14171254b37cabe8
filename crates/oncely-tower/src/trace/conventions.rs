//! OpenTelemetry's HTTP semantic conventions (stable; the version `docs/telemetry.md`
//! names) for oncely's server and client spans: how methods, routes and protocol
//! versions are written, and what only the sender of an upstream call knows
//! ([`UpstreamAttributes`]). No header but `Host` and `User-Agent` is read, and no query
//! value is ever an attribute: they may be credentials.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use http::{Method, Uri, Version};

use super::attr::{self, AttributeValue};
use super::context::{new_span_id, TraceParent};

/// What the server knows of a request's connection, put in its extensions: the peer
/// (`client.address`) and whether it came over TLS (`url.scheme`).
#[derive(Debug, Clone, Copy)]
pub struct Connection {
    /// The peer's address.
    pub peer: SocketAddr,
    /// The connection is HTTPS.
    pub https: bool,
}

/// The method as the conventions name it: one HTTP defines, else `_OTHER` (`false`).
pub(super) fn method_name(method: &Method) -> (&'static str, bool) {
    let name = match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::CONNECT => "CONNECT",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::PATCH => "PATCH",
        _ => return ("_OTHER", false),
    };
    (name, true)
}

/// The host (without an IPv6 literal's brackets) and port of a `Host` value or an
/// authority (`example.com:8443`, `[::1]:80`, `example.com`); `None` for one that is
/// not a host with an optional numeric port.
pub(super) fn host_and_port(authority: &str) -> Option<(&str, Option<u16>)> {
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, rest) = v6.split_once(']')?;
            match rest {
                "" => (host, None),
                _ => (host, Some(rest.strip_prefix(':')?)),
            }
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let valid = |b: u8| b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=:".contains(&b);
    if host.is_empty() || !host.bytes().all(valid) {
        return None;
    }
    match port {
        None => Some((host, None)),
        Some(p) => Some((host, Some(p.parse().ok()?))),
    }
}

/// An IP address as text (IPv4 written directly: the standard formatter is slow).
pub(super) fn ip_text(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let mut out = String::with_capacity(15);
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                if octet >= 100 {
                    out.push((b'0' + octet / 100) as char);
                }
                if octet >= 10 {
                    out.push((b'0' + octet / 10 % 10) as char);
                }
                out.push((b'0' + octet % 10) as char);
            }
            out
        }
        v6 => v6.to_string(),
    }
}

/// The path pattern of a route named `METHOD PATTERN` (`*` for any method), as the
/// config writes it: the span's `http.route`.
pub fn route_path(route_name: &str) -> &str {
    match route_name.split_once(' ') {
        Some((method, path)) if path.starts_with('/') && !method.is_empty() => path,
        _ => route_name,
    }
}

pub(super) fn protocol_version(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

/// What the sender of an upstream call adds to its client span after the span started:
/// the upstream's URL once it is chosen ([`UpstreamAttributes::target`]), and each resend
/// ([`UpstreamAttributes::resend`]), which is a client span of its own. Shared with the
/// client span, which sets them when it ends; found in the request's extensions.
#[derive(Debug, Clone, Default)]
pub struct UpstreamAttributes(Arc<Mutex<Recorded>>);

#[derive(Debug, Default)]
struct Recorded {
    attributes: Vec<(&'static str, AttributeValue)>,
    /// Every attempt but the one in flight has its end; the first is the client span.
    attempts: Vec<Attempt>,
    /// The client span's trace and sampled flag, for the resends' `traceparent`.
    context: Option<([u8; 16], bool)>,
}

/// One attempt of an upstream call (see [`UpstreamAttributes::resend`]).
#[derive(Debug, Clone)]
pub(super) struct Attempt {
    /// Its span's id; `None` for the first, which is the client span itself.
    pub(super) span_id: Option<[u8; 8]>,
    /// When it was sent (the first: when the client span started).
    pub(super) start: SystemTime,
    /// When and how it ended, once a resend followed it.
    pub(super) end: Option<(SystemTime, AttemptEnd)>,
}

/// How an attempt that was sent again ended.
#[derive(Debug, Clone)]
pub enum AttemptEnd {
    /// The upstream answered with this status.
    Status(u16),
    /// No answer: why.
    Failed(String),
}

impl UpstreamAttributes {
    pub(super) fn with_context(trace_id: [u8; 16], sampled: bool) -> UpstreamAttributes {
        let a = UpstreamAttributes::default();
        a.lock().context = Some((trace_id, sampled));
        a
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.0.lock().expect("not poisoned")
    }

    /// Sets (or replaces) an attribute.
    pub fn set(&self, key: &'static str, value: impl Into<AttributeValue>) {
        let value = value.into();
        let mut recorded = self.lock();
        match recorded.attributes.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => recorded.attributes.push((key, value)),
        }
    }

    /// The call is sent again now, after an attempt that ended at `ended` as `previous`:
    /// the resend is a client span of its own (a sibling of the first, with
    /// `http.request.resend_count`), and the `traceparent` it carries names it (`None`
    /// without traces).
    pub fn resend(&self, previous: AttemptEnd, ended: SystemTime) -> Option<TraceParent> {
        let now = SystemTime::now();
        let mut recorded = self.lock();
        match recorded.attempts.last_mut() {
            Some(last) => last.end = Some((ended, previous)),
            None => recorded.attempts.push(Attempt {
                span_id: None,
                start: now,
                end: Some((ended, previous)),
            }),
        }
        let id = new_span_id();
        recorded.attempts.push(Attempt {
            span_id: Some(id),
            start: now,
            end: None,
        });
        recorded.context.map(|(trace_id, sampled)| TraceParent {
            trace_id,
            parent_id: id,
            sampled,
        })
    }

    /// `url.full` (no credentials, each query value `REDACTED`), `server.address` and
    /// `server.port` of an absolute `uri`; nothing for a relative one.
    pub fn target(&self, uri: &Uri) {
        let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
            return;
        };
        let host = authority.host();
        let port = authority
            .port_u16()
            .unwrap_or(if scheme == "https" { 443 } else { 80 });
        let hostport = match authority.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        let mut full = format!("{scheme}://{hostport}{}", uri.path());
        if let Some(query) = uri.query() {
            let redacted: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) => format!("{k}=REDACTED"),
                    None => pair.to_string(),
                })
                .collect();
            full.push('?');
            full.push_str(&redacted.join("&"));
        }
        self.set(attr::URL_FULL, full);
        self.set(attr::SERVER_ADDRESS, host.trim_matches(['[', ']']));
        self.set(attr::SERVER_PORT, i64::from(port));
    }

    /// What was recorded: the attributes, and the attempts before the last (empty when
    /// the call was sent once).
    pub(super) fn take(&self) -> (Vec<(&'static str, AttributeValue)>, Vec<Attempt>) {
        let mut recorded = self.lock();
        (
            std::mem::take(&mut recorded.attributes),
            std::mem::take(&mut recorded.attempts),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_url_never_carries_credentials_or_query_values() {
        let a = UpstreamAttributes::default();
        a.target(
            &"https://user:pw@up.example/v1/x?api_key=sk_1&flag"
                .parse()
                .unwrap(),
        );
        let (got, _) = a.take();
        let full = got.iter().find(|(k, _)| *k == attr::URL_FULL).unwrap();
        assert_eq!(
            full.1,
            AttributeValue::Str("https://up.example/v1/x?api_key=REDACTED&flag".into())
        );
        assert!(got.contains(&(attr::SERVER_PORT, AttributeValue::Int(443))));
        a.target(&"/relative".parse().unwrap());
        assert!(a.take().0.is_empty());
    }

    #[test]
    fn hosts_ports_and_addresses_are_read_as_the_uri_grammar_says() {
        assert_eq!(
            host_and_port("api.example:8443"),
            Some(("api.example", Some(8443)))
        );
        assert_eq!(host_and_port("api.example"), Some(("api.example", None)));
        assert_eq!(host_and_port("[::1]:80"), Some(("::1", Some(80))));
        assert_eq!(host_and_port("[2001:db8::1]"), Some(("2001:db8::1", None)));
        assert_eq!(
            host_and_port("u:p@h.example:1"),
            Some(("h.example", Some(1)))
        );
        for bad in [
            "", ":80", "h:port", "h:99999", "[::1", "[::1]x", "a b", "h/x",
        ] {
            assert_eq!(host_and_port(bad), None, "{bad:?}");
        }
        for ip in [
            "127.0.0.1",
            "10.20.30.40",
            "0.0.0.0",
            "255.255.255.255",
            "1.100.9.10",
        ] {
            assert_eq!(ip_text(ip.parse().unwrap()), ip);
        }
        assert_eq!(ip_text("::1".parse().unwrap()), "::1");
    }

    #[test]
    fn route_names_give_their_path() {
        assert_eq!(route_path("POST /v1/render"), "/v1/render");
        assert_eq!(route_path("* /v1/{*rest}"), "/v1/{*rest}");
        assert_eq!(route_path("/mcp"), "/mcp");
    }
}
