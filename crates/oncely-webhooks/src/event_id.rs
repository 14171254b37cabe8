//! Where a delivery's event id comes from: the `event_id` key of a `[[webhooks]]` entry.
//!
//! `json:/POINTER` reads a JSON pointer in the body (a string, or an integer written as
//! its decimal digits); `header:NAME` reads a request header. Each scheme has a default
//! (`Scheme::default_event_id`).

use std::fmt;
use std::str::FromStr;

use crate::error::ConfigError;
use crate::headers::HeaderLookup;

/// Where the event id of a delivery is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventIdSource {
    /// A JSON pointer into the body, e.g. `/id`.
    Json(String),
    /// A request header, e.g. `webhook-id`.
    Header(String),
}

impl EventIdSource {
    /// The event id of this delivery, or `None` when the source holds none (no such
    /// header or field, an empty value, a body that is not JSON, a field that is neither
    /// a string nor an integer).
    pub fn extract<H: HeaderLookup + ?Sized>(&self, headers: &H, body: &[u8]) -> Option<String> {
        let id = match self {
            EventIdSource::Header(name) => match headers.header_values(name).as_slice() {
                [value] => std::str::from_utf8(value).ok()?.to_owned(),
                _ => return None,
            },
            EventIdSource::Json(pointer) => {
                let value: serde_json::Value = serde_json::from_slice(body).ok()?;
                match value.pointer(pointer)? {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
                    _ => return None,
                }
            }
        };
        (!id.is_empty()).then_some(id)
    }
}

impl FromStr for EventIdSource {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ConfigError::BadEventIdSource(s.to_owned());
        if let Some(pointer) = s.strip_prefix("json:") {
            if !pointer.starts_with('/') {
                return Err(bad());
            }
            return Ok(EventIdSource::Json(pointer.to_owned()));
        }
        if let Some(name) = s.strip_prefix("header:") {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(bad());
            }
            return Ok(EventIdSource::Header(name.to_owned()));
        }
        Err(bad())
    }
}

impl fmt::Display for EventIdSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventIdSource::Json(pointer) => write!(f, "json:{pointer}"),
            EventIdSource::Header(name) => write!(f, "header:{name}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse_and_print_back() {
        for text in [
            "json:/id",
            "json:/data/object/id",
            "header:X-GitHub-Delivery",
        ] {
            let source: EventIdSource = text.parse().unwrap();
            assert_eq!(source.to_string(), text);
        }
    }

    #[test]
    fn bad_sources_are_refused() {
        for text in [
            "id",
            "json:id",
            "json:",
            "header:",
            "header:bad name",
            "body:/id",
        ] {
            assert_eq!(
                text.parse::<EventIdSource>(),
                Err(ConfigError::BadEventIdSource(text.to_owned())),
                "{text}"
            );
        }
    }

    #[test]
    fn json_ids_are_strings_or_integers() {
        let no_headers: [(&str, &str); 0] = [];
        let id = |pointer: &str, body: &str| {
            EventIdSource::Json(pointer.into()).extract(&no_headers, body.as_bytes())
        };
        let body = r#"{"id":"evt_1","n":42,"f":1.5,"o":{},"e":"","data":{"object":{"id":"pi_9"}}}"#;
        assert_eq!(id("/id", body).as_deref(), Some("evt_1"));
        assert_eq!(id("/n", body).as_deref(), Some("42"));
        assert_eq!(id("/data/object/id", body).as_deref(), Some("pi_9"));
        assert_eq!(id("/f", body), None);
        assert_eq!(id("/o", body), None);
        assert_eq!(id("/e", body), None);
        assert_eq!(id("/missing", body), None);
        assert_eq!(id("/id", "not json"), None);
    }

    #[test]
    fn header_ids_need_exactly_one_nonempty_value() {
        let source = EventIdSource::Header("webhook-id".into());
        assert_eq!(
            source.extract(&[("Webhook-Id", "msg_1")], b"").as_deref(),
            Some("msg_1")
        );
        assert_eq!(source.extract(&[("webhook-id", "")], b""), None);
        assert_eq!(
            source.extract(&[("webhook-id", "a"), ("webhook-id", "b")], b""),
            None
        );
        assert_eq!(source.extract(&[("other", "a")], b""), None);
    }
}
