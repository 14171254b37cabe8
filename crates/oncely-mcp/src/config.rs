//! The resolved config of one `[[mcp]]` endpoint.
//!
//! The binary parses the TOML table; this module turns its strings into one validated,
//! typed [`McpConfig`] (durations, the upstream URL, the principal source, the tools).
//! The principal source and the units rule are the layer's extension points
//! ([`MakePrincipal`], [`UnitsRule`]), as on HTTP routes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use oncely_core::parse_duration;
use oncely_tower::{Concurrency, MakePrincipal, PrincipalSource, RoutePolicy, UnitsRule};

use crate::McpError;

/// Parses an endpoint's `units`: `call` (one unit per call, [`UnitsRule::Fixed`]`(1)`) or
/// `json:POINTER` into the call's `arguments` (a string counts its characters, a number
/// its non-negative, truncated value, anything else 0). The one parser is
/// [`UnitsRule::parse`].
pub fn parse_units(text: &str) -> Result<UnitsRule, McpError> {
    UnitsRule::parse(text, oncely_tower::UnitsOf::ToolCall).map_err(McpError::Config)
}

/// Who the caller of an endpoint is, as configured: a built-in source, or a claim of a
/// verified JWT bearer token (`jwt:sub`), whose key is read when the endpoint is built
/// (into a [`JwtVerifier`](crate::principal::JwtVerifier), so a reload reads a JWKS file
/// again). A refreshed OAuth token is still the same account; a token that does not verify
/// is never trusted for a replay: its call is forwarded unguarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpPrincipal {
    /// `header:NAME` or `none`.
    Source(PrincipalSource),
    /// `jwt:CLAIM`.
    Jwt {
        /// The claim, e.g. `sub`.
        claim: String,
        /// Where the verification key comes from.
        key: JwtKey,
    },
}

/// Where a JWT principal's verification key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtKey {
    /// An HMAC secret in this environment variable (`jwt_secret_env`).
    SecretEnv(String),
    /// A JWKS document in this file (`jwks_file`).
    JwksFile(PathBuf),
}

/// Which tools are guarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolSelection {
    /// `["*"]`: every tool the upstream does not annotate `readOnlyHint: true` (learned
    /// from its `tools/list`). A tool never listed is guarded (a wasted replay of a read
    /// costs nothing; a second paid execution does).
    AllButReadOnly,
    /// These tools, by name or pattern (`*` matches any run of characters, as in
    /// `actions`). A tool named exactly is guarded whatever the server's annotations say
    /// (they are untrusted hints, and the operator named it); one that only a pattern
    /// matches is not when the server annotates it `readOnlyHint: true`.
    Named(Vec<String>),
}

impl ToolSelection {
    /// Whether a call of `tool` is guarded under this selection, given whether the
    /// upstream annotates it `readOnlyHint: true`: the one rule the endpoint follows and
    /// `oncely inventory` reports.
    pub fn guards(&self, tool: &str, read_only: bool) -> bool {
        match self {
            ToolSelection::AllButReadOnly => !read_only,
            ToolSelection::Named(names) => {
                self.names(tool) || (!read_only && any_matches(names, tool))
            }
        }
    }

    /// Whether the selection names `tool` exactly (not by a pattern): then the operator's
    /// name wins over the server's `readOnlyHint`.
    pub fn names(&self, tool: &str) -> bool {
        matches!(self, ToolSelection::Named(names) if names.iter().any(|n| n == tool))
    }
}

pub use crate::tool_patterns::any_matches;

/// One `[[mcp]]` endpoint, resolved.
#[derive(Debug, Clone)]
pub struct McpConfig {
    /// The path clients use (e.g. `/mcp`); also the ledger route prefix.
    pub path: String,
    /// The upstream MCP endpoint, `http://HOST:PORT/PATH` or `https://...`.
    pub upstream: Uri,
    /// Who the caller is. Default `header:authorization` (a [`PrincipalSource`]); with
    /// `jwt:CLAIM` a [`JwtVerifier`](crate::principal::JwtVerifier).
    pub principal: Arc<dyn MakePrincipal>,
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
    /// Billing units per call, from the call's `arguments`. Default one per call
    /// ([`UnitsRule::Fixed`]`(1)`).
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
    /// Most guarded tool calls in flight to the server from this endpoint: the owner of
    /// each holds one of its slots for its upstream call (the gateway's `concurrency`).
    /// Default unlimited.
    pub concurrency: Option<Concurrency>,
    /// Which arguments are idempotency keys the model fills in: left out of a call's key,
    /// and given a key derived from the record. Default: the usual names.
    pub key_arguments: crate::KeyArguments,
    /// What a tool's intention is made of: (tool pattern, argument pointers); a call of
    /// a tool the first pattern matches is keyed by those arguments alone. Default none.
    pub intent: Vec<(String, Vec<String>)>,
}

/// What an operator sets of a guarded tool call, the same for an `[[mcp]]` entry and for
/// `oncely mcp` (`[mcp_stdio]` and its flags): [`McpConfig::with_calls`] fills them in,
/// the one place that does.
#[derive(Debug, Clone)]
pub struct CallSettings {
    /// The replay window.
    pub window: Duration,
    /// How long a duplicate waits.
    pub wait: Duration,
    /// The most a guarded call may take upstream.
    pub timeout: Duration,
    /// The owner's lease.
    pub lease: Duration,
    /// Billing units per call.
    pub units: UnitsRule,
    /// Most guarded calls in flight to the server (none: unlimited).
    pub concurrency: Option<usize>,
    /// Largest request body read.
    pub max_body: u64,
    /// Largest tool result stored.
    pub max_response: u64,
    /// Which arguments are idempotency keys the model fills in.
    pub key_arguments: crate::KeyArguments,
    /// What a tool's intention is made of (`intent`).
    pub intent: Vec<(String, Vec<String>)>,
}

impl McpConfig {
    /// The endpoint of a stdio wrapper named `name` (the `stdio` module): its route is
    /// `stdio:NAME` and its upstream the child process or remote server the wrapper
    /// speaks to (the URL is not used). Its principal is not read from messages: the
    /// wrapper knows it (`core::KnownCaller`), so no source is configured.
    pub fn stdio(name: &str) -> McpConfig {
        let mut config =
            McpConfig::new("/", "http://127.0.0.1/").expect("a valid built-in endpoint");
        config.path = format!("stdio:{name}");
        config.principal = Arc::new(PrincipalSource::None);
        config
    }

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
            principal: Arc::new(PrincipalSource::Header(http::header::AUTHORIZATION)),
            tools: ToolSelection::AllButReadOnly,
            window: Duration::from_secs(3 * 3600),
            wait: Duration::from_secs(20),
            lease: Duration::from_secs(30),
            timeout: Duration::from_secs(120),
            units: UnitsRule::Fixed(1),
            max_body: 10 << 20,
            max_response: 32 << 20,
            actions: Vec::new(),
            concurrency: None,
            key_arguments: crate::KeyArguments::default(),
            intent: Vec::new(),
        })
    }

    /// Sets every operator setting of a guarded call (see [`CallSettings`]).
    pub fn with_calls(mut self, calls: CallSettings) -> McpConfig {
        self.window = calls.window;
        self.wait = calls.wait;
        self.timeout = calls.timeout;
        self.lease = calls.lease;
        self.units = calls.units;
        self.concurrency = calls.concurrency.map(Concurrency::new);
        self.max_body = usize::try_from(calls.max_body).unwrap_or(usize::MAX);
        self.max_response = usize::try_from(calls.max_response).unwrap_or(usize::MAX);
        self.key_arguments = calls.key_arguments;
        self.intent = calls.intent;
        self
    }

    /// The arguments (JSON pointers) a call of `tool` is keyed by, when `intent` names
    /// them.
    pub fn intent_of(&self, tool: &str) -> Option<&[String]> {
        self.intent
            .iter()
            .find(|(pattern, _)| any_matches(std::slice::from_ref(pattern), tool))
            .map(|(_, pointers)| pointers.as_slice())
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
        if any_matches(&self.actions, tool) {
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

    /// The policy a guarded call of `tool` runs under: its route, its class, the
    /// endpoint's timings and slots (the key, principal and units are read by the
    /// endpoint itself).
    pub fn policy_of(&self, tool: &str) -> RoutePolicy {
        let mut policy = RoutePolicy::new(self.route_of(tool), self.class_of(tool));
        policy.window = self.window;
        policy.wait = self.wait;
        policy.lease = self.lease;
        policy.timeout = self.timeout;
        policy.max_body = self.max_body as u64;
        policy.max_response = self.max_response as u64;
        policy.concurrency = self.concurrency.clone();
        policy
    }

    /// The ledger route of a tool on this endpoint, as `oncely ledger list --route` shows it.
    pub fn route_of(&self, tool: &str) -> String {
        format!("{}#{}", self.path, tool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_tools_take_patterns_as_actions_do() {
        let named = ToolSelection::Named(vec!["send_*".into(), "render".into()]);
        assert!(named.guards("send_email", false));
        assert!(named.guards("render", false));
        assert!(!named.guards("rendering", false));
        assert!(!named.guards("send_email", true), "never a read-only tool");
    }
    use serde_json::json;

    #[test]
    fn units_count_characters_of_a_pointer_into_arguments() {
        let units = |rule: UnitsRule, arguments: serde_json::Value| {
            rule.units_of(arguments.to_string().as_bytes())
        };
        let rule = parse_units("json:/text").unwrap();
        assert_eq!(units(rule.clone(), json!({"text": "héllo"})), 5);
        assert_eq!(units(rule, json!({"other": 1})), 0);
        assert_eq!(units(parse_units("json:/n").unwrap(), json!({"n": 7.9})), 7);
        assert_eq!(units(parse_units("call").unwrap(), json!({})), 1);
        assert!(parse_units("body_bytes").is_err());
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
        assert!(c.with_actions(&["".into()]).is_err());
    }
}
