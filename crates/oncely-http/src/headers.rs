//! One header policy for everything that forwards, stores or replays an answer.
//!
//! - [`strip_hop_by_hop`]: what never crosses a hop (the fixed list, `Keep-Alive`,
//!   every `Proxy-*`, and every header the `Connection` header names).
//! - [`is_replayable`] / [`replayable_headers`] / [`replay_headers`]: what a stored
//!   answer keeps and a replay carries. Left out: hop-by-hop headers, `content-length`
//!   (a replay sets its own), `date` (a replay is sent now), `set-cookie` (a session
//!   cookie is a credential of one exchange, not part of the result), and oncely's own
//!   headers. The owner's answer, a reconciler's answer and an operator's resolution are
//!   stored through [`replayable_headers`], and every replay goes through
//!   [`replay_headers`], so a record written before this policy still replays by it.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::problem::{IDEMPOTENT_REPLAYED, ONCELY_KEY_CHURN, ONCELY_RECORD, ONCELY_STATUS};

/// Headers that describe one connection, not the message.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether a header never crosses a hop (not counting those `Connection` names).
pub fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP.contains(&name) || name.starts_with("proxy-")
}

/// Removes hop-by-hop headers: the fixed list, `Keep-Alive`, every `Proxy-*`, and every
/// header the `Connection` header names. Headers oncely sets itself on the way out
/// (`Idempotency-Key`, `Forwarded`, `X-Forwarded-*`) are set after this, so a caller's
/// `Connection` header cannot remove them.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    let fixed: Vec<HeaderName> = headers
        .keys()
        .filter(|k| is_hop_by_hop(k.as_str()))
        .cloned()
        .collect();
    for name in fixed {
        headers.remove(name);
    }
}

/// The headers a request is forwarded with: no hop-by-hop header
/// ([`strip_hop_by_hop`]), and no `Host` (the client sets the upstream's). A proxy that
/// adds `Forwarded` reads the client's `Host` first.
pub fn forwardable_request(headers: &mut HeaderMap) {
    strip_hop_by_hop(headers);
    headers.remove(header::HOST);
}

/// The headers of a request whose body is sent whole (read first, perhaps rewritten):
/// its own `Content-Length`, and no `Transfer-Encoding`. A body streamed as it came keeps
/// the client's `Content-Length` instead.
pub fn sent_whole(headers: &mut HeaderMap, len: usize) {
    headers.remove(header::TRANSFER_ENCODING);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
}

/// Whether a stored answer keeps this header and a replay carries it.
pub fn is_replayable(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    !(is_hop_by_hop(&name)
        || matches!(
            name.as_str(),
            "content-length" | "date" | "set-cookie" | "set-cookie2"
        )
        || name == ONCELY_STATUS
        || name == ONCELY_RECORD
        || name == ONCELY_KEY_CHURN
        || name == IDEMPOTENT_REPLAYED)
}

/// The headers of an answer worth storing, as text pairs (values that are not visible
/// text are left out).
pub fn replayable_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| is_replayable(name.as_str()))
        .filter_map(|(name, value)| {
            Some((name.as_str().to_string(), value.to_str().ok()?.to_string()))
        })
        .collect()
}

/// Stored header pairs as they go out on a replay (appended to `out`).
pub fn replay_headers(stored: &[(String, String)], out: &mut HeaderMap) {
    for (name, value) in stored {
        if !is_replayable(name) {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            out.append(n, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go_and_the_rest_stay() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert("proxy-authorization", HeaderValue::from_static("Basic x"));
        h.insert("proxy-connection", HeaderValue::from_static("close"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(header::TRAILER, HeaderValue::from_static("x-t"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer a"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["authorization", "content-type"]);
    }

    #[test]
    fn replays_keep_the_result_headers_only() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("content-type", "application/json"),
            ("location", "/orders/7"),
            ("set-cookie", "session=secret"),
            ("date", "Thu, 06 Nov 2026 10:00:00 GMT"),
            ("connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("content-length", "12"),
            ("oncely-status", "fresh"),
            ("proxy-authenticate", "Basic"),
        ] {
            h.insert(k, v.parse().unwrap());
        }
        let kept = replayable_headers(&h);
        assert_eq!(
            kept,
            vec![
                ("content-type".to_string(), "application/json".to_string()),
                ("location".to_string(), "/orders/7".to_string()),
            ]
        );
        // A record stored before the policy replays by it too.
        let old = vec![
            ("Set-Cookie".to_string(), "session=secret".to_string()),
            ("location".to_string(), "/orders/7".to_string()),
        ];
        let mut out = HeaderMap::new();
        replay_headers(&old, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out["location"], "/orders/7");
    }
}
