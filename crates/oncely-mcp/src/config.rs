//! The resolved config of one `[[mcp]]` endpoint.
//!
//! The binary parses the TOML table; this module turns its strings into one validated,
//! typed [`McpConfig`] (durations, the upstream URL, the principal source, the tools).

use std::time::Duration;

use http::{HeaderName, Uri};
use oncely_core::parse_duration;

use crate::principal::JwtVerifier;
use crate::McpError;

/// Which tools are guarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolSelection {
    /// `["*"]`: every tool the upstream does not annotate `readOnlyHint: true` (learned
    /// from its `tools/list`). A tool never listed is guarded (a wasted replay of a read
    /// costs nothing; a second paid execution does).
    AllButReadOnly,
    /// These tools, by name (still never one annotated read-only).
    Named(Vec<String>),
}

/// How many billing units one execution is worth.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum UnitsRule {
    /// One unit per call (the default for tools).
    #[default]
    Call,
    /// A JSON pointer into the call's `arguments`: a string counts its characters, a
    /// number its (non-negative, truncated) value, anything else 0. `json:/text`.
    Json(String),
}

impl UnitsRule {
    /// Parses `call` or `json:POINTER`.
    pub fn parse(text: &str) -> Result<UnitsRule, McpError> {
        match text {
            "call" | "calls" => Ok(UnitsRule::Call),
            _ => match text.strip_prefix("json:") {
                Some(p) if p.is_empty() || p.starts_with('/') => Ok(UnitsRule::Json(p.to_string())),
                _ => Err(McpError::Config(format!(
                    "units {text:?}: use \"call\" or \"json:/POINTER\" (into the tool's arguments)"
                ))),
            },
        }
    }

    /// The units of one call with these `arguments`.
    pub fn units(&self, arguments: &serde_json::Value) -> u64 {
        match self {
            UnitsRule::Call => 1,
            UnitsRule::Json(pointer) => match arguments.pointer(pointer) {
                Some(serde_json::Value::String(s)) => s.chars().count() as u64,
                Some(serde_json::Value::Number(n)) => n
                    .as_u64()
                    .or_else(|| n.as_f64().filter(|f| *f > 0.0).map(|f| f as u64))
                    .unwrap_or(0),
                _ => 0,
            },
        }
    }
}

/// What identifies the account a call acts for.
#[derive(Debug, Clone)]
pub enum PrincipalSource {
    /// The raw value of this header, stored only as a keyed hash. A call without it is
    /// forwarded unguarded.
    Header(HeaderName),
    /// A claim of a verified JWT bearer token (`jwt:sub`): a refreshed OAuth token is still
    /// the same account. A token that does not verify is never trusted for a replay: its
    /// call is forwarded unguarded.
    Jwt(JwtVerifier),
    /// Single tenant: every caller is one account.
    None,
}

impl PrincipalSource {
    /// Parses `header:NAME` or `none`; `jwt:CLAIM` needs a key, see [`JwtVerifier`].
    pub fn parse(text: &str) -> Result<PrincipalSource, McpError> {
        if text == "none" {
            return Ok(PrincipalSource::None);
        }
        if let Some(name) = text.strip_prefix("header:") {
            return HeaderName::from_bytes(name.as_bytes())
                .map(PrincipalSource::Header)
                .map_err(|_| McpError::Config(format!("principal {text:?}: bad header name")));
        }
        Err(McpError::Config(format!(
            "principal {text:?}: use header:NAME, none, or jwt:CLAIM with jwt_secret_env or jwks_file"
        )))
    }
}

/// One `[[mcp]]` endpoint, resolved.
#[derive(Debug, Clone)]
pub struct McpConfig {
    /// The path clients use (e.g. `/mcp`); also the ledger route prefix.
    pub path: String,
    /// The upstream MCP endpoint, `http://HOST:PORT/PATH` or `https://...`.
    pub upstream: Uri,
    /// Who the caller is. Default `header:authorization`.
    pub principal: PrincipalSource,
    /// Which tools are guarded. Default `["*"]`.
    pub tools: ToolSelection,
    /// How long a completed result is replayed. Default 3h.
    pub window: Duration,
    /// How long a repeat waits for an original in flight. Default 20s.
    pub wait: Duration,
    /// How long an owner's claim lasts without renewal (renewed while the call runs).
    /// Default 30s.
    pub lease: Duration,
    /// The most a guarded call may take upstream. Default 120s.
    pub timeout: Duration,
    /// Billing units per call. Default one per call.
    pub units: UnitsRule,
    /// Largest request body read. Default 10 MiB.
    pub max_body: usize,
    /// Largest tool result stored; a larger one reaches its caller and is not kept.
    /// Default 32 MiB.
    pub max_response: usize,
    /// Guarded tools of class `action` (names, `*` matches any run of characters): an
    /// ambiguous failure of one becomes `outcome_unknown` instead of being released.
    /// Default none (every guarded tool is `write`).
    pub actions: Vec<String>,
}

impl McpConfig {
    /// An endpoint at `path` in front of `upstream`, with every default.
    pub fn new(path: &str, upstream: &str) -> Result<McpConfig, McpError> {
        if !path.starts_with('/') {
            return Err(McpError::Config(format!("path {path:?} must start with /")));
        }
        let uri: Uri = upstream
            .parse()
            .map_err(|e| McpError::Config(format!("upstream {upstream:?}: {e}")))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
            return Err(McpError::Config(format!(
                "upstream {upstream:?}: must be an http:// or https:// URL with a host"
            )));
        }
        Ok(McpConfig {
            path: path.to_string(),
            upstream: uri,
            principal: PrincipalSource::Header(http::header::AUTHORIZATION),
            tools: ToolSelection::AllButReadOnly,
            window: Duration::from_secs(3 * 3600),
            wait: Duration::from_secs(20),
            lease: Duration::from_secs(30),
            timeout: Duration::from_secs(120),
            units: UnitsRule::Call,
            max_body: 10 << 20,
            max_response: 32 << 20,
            actions: Vec::new(),
        })
    }

    /// Sets the tools of class `action` from the config list (names with `*` wildcards).
    pub fn with_actions(mut self, actions: &[String]) -> Result<McpConfig, McpError> {
        if let Some(i) = actions.iter().position(|a| a.is_empty()) {
            return Err(McpError::Config(format!("actions[{i}]: empty tool name")));
        }
        self.actions = actions.to_vec();
        Ok(self)
    }

    /// The class of a guarded tool: `action` when `actions` names it, else `write`.
    pub fn class_of(&self, tool: &str) -> oncely_core::Class {
        if self.actions.iter().any(|p| wildcard_match(p, tool)) {
            oncely_core::Class::Action
        } else {
            oncely_core::Class::Write
        }
    }

    /// Sets the tools from the config list (`["*"]` or names).
    pub fn with_tools(mut self, tools: &[String]) -> Result<McpConfig, McpError> {
        self.tools = match tools {
            [] => {
                return Err(McpError::Config(
                    "tools is empty: use [\"*\"] or tool names".into(),
                ))
            }
            [star] if star == "*" => ToolSelection::AllButReadOnly,
            names if names.iter().any(|n| n == "*") => {
                return Err(McpError::Config("tools: \"*\" must stand alone".into()))
            }
            names => ToolSelection::Named(names.to_vec()),
        };
        Ok(self)
    }

    /// Sets a duration field from its config text (`window`, `wait`, `lease`, `timeout`).
    pub fn with_duration(mut self, field: &str, text: &str) -> Result<McpConfig, McpError> {
        let d = parse_duration(text).map_err(|e| McpError::Config(format!("{field}: {e}")))?;
        match field {
            "window" => self.window = d,
            "wait" => self.wait = d,
            "lease" => self.lease = d,
            "timeout" => self.timeout = d,
            _ => {
                return Err(McpError::Config(format!(
                    "unknown duration field {field:?}"
                )))
            }
        }
        Ok(self)
    }

    /// The ledger route of a tool on this endpoint, as `oncely ledger list --route` shows it.
    pub fn route_of(&self, tool: &str) -> String {
        format!("{}#{}", self.path, tool)
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters (none too).
fn wildcard_match(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn units_count_characters_of_a_pointer_into_arguments() {
        let rule = UnitsRule::parse("json:/text").unwrap();
        assert_eq!(rule.units(&json!({"text": "héllo"})), 5);
        assert_eq!(rule.units(&json!({"other": 1})), 0);
        assert_eq!(
            UnitsRule::parse("json:/n")
                .unwrap()
                .units(&json!({"n": 7.9})),
            7
        );
        assert_eq!(UnitsRule::Call.units(&json!({})), 1);
        assert!(UnitsRule::parse("body_bytes").is_err());
    }

    #[test]
    fn config_rejects_bad_values_with_a_reason() {
        assert!(McpConfig::new("mcp", "http://127.0.0.1:1/mcp").is_err());
        assert!(McpConfig::new("/mcp", "ftp://x/").is_err());
        let c = McpConfig::new("/mcp", "http://127.0.0.1:1/mcp").unwrap();
        assert!(c.clone().with_tools(&[]).is_err());
        assert!(c.clone().with_tools(&["*".into(), "x".into()]).is_err());
        let c = c.with_tools(&["render".into()]).unwrap();
        assert_eq!(c.tools, ToolSelection::Named(vec!["render".into()]));
        assert!(c.clone().with_duration("wait", "soon").is_err());
        assert_eq!(
            c.with_duration("wait", "2s").unwrap().wait,
            Duration::from_secs(2)
        );
        assert!(PrincipalSource::parse("cookie:x").is_err());
    }

    #[test]
    fn actions_match_names_and_wildcards() {
        use oncely_core::Class;
        let c = McpConfig::new("/mcp", "http://127.0.0.1:1/mcp")
            .unwrap()
            .with_actions(&["place_order".into(), "send_*".into(), "*_refund".into()])
            .unwrap();
        assert_eq!(c.class_of("place_order"), Class::Action);
        assert_eq!(c.class_of("place_order2"), Class::Write);
        assert_eq!(c.class_of("send_"), Class::Action);
        assert_eq!(c.class_of("send_email"), Class::Action);
        assert_eq!(c.class_of("resend_email"), Class::Write);
        assert_eq!(c.class_of("issue_refund"), Class::Action);
        assert_eq!(c.class_of("render"), Class::Write);
        assert!(wildcard_match("a*b*c", "aXbYc"));
        assert!(!wildcard_match("a*b*c", "aXcYb"));
        assert!(!wildcard_match("ab*ba", "aba"));
        assert!(wildcard_match("*", ""));
        assert!(c.with_actions(&["".into()]).is_err());
    }
}
