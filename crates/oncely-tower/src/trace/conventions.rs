//! OpenTelemetry's HTTP semantic conventions (stable; the version `docs/telemetry.md`
//! names) for oncely's server and client spans: how methods, routes and protocol
//! versions are written, and what only the sender of an upstream call knows
//! ([`UpstreamAttributes`]). No header but `Host` and `User-Agent` is read, and no query
//! value is ever an attribute: they may be credentials.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http::{Method, Uri, Version};

use super::attr::{self, AttributeValue};

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
pub(super) fn method_name(method: &Method) -> (&str, bool) {
    match *method {
        Method::GET
        | Method::HEAD
        | Method::POST
        | Method::PUT
        | Method::DELETE
        | Method::CONNECT
        | Method::OPTIONS
        | Method::TRACE
        | Method::PATCH => (method.as_str(), true),
        _ => ("_OTHER", false),
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

/// Attributes of an upstream call that its sender adds after the span started: the
/// upstream's URL once it is chosen ([`UpstreamAttributes::target`]), resends. Shared with
/// the client span, which sets them when it ends; found in the request's
/// extensions.
#[derive(Debug, Clone, Default)]
pub struct UpstreamAttributes(Arc<Mutex<Vec<(&'static str, AttributeValue)>>>);

impl UpstreamAttributes {
    /// Sets (or replaces) an attribute.
    pub fn set(&self, key: &'static str, value: impl Into<AttributeValue>) {
        let value = value.into();
        let mut list = self.0.lock().expect("not poisoned");
        match list.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => list.push((key, value)),
        }
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

    pub(super) fn take(&self) -> Vec<(&'static str, AttributeValue)> {
        std::mem::take(&mut *self.0.lock().expect("not poisoned"))
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
        let got = a.take();
        let full = got.iter().find(|(k, _)| *k == attr::URL_FULL).unwrap();
        assert_eq!(
            full.1,
            AttributeValue::Str("https://up.example/v1/x?api_key=REDACTED&flag".into())
        );
        assert!(got.contains(&(attr::SERVER_PORT, AttributeValue::Int(443))));
        a.target(&"/relative".parse().unwrap());
        assert!(a.take().is_empty());
    }

    #[test]
    fn route_names_give_their_path() {
        assert_eq!(route_path("POST /v1/render"), "/v1/render");
        assert_eq!(route_path("* /v1/{*rest}"), "/v1/{*rest}");
        assert_eq!(route_path("/mcp"), "/mcp");
    }
}
