//! `[mcp_stdio]`: what `oncely mcp` (a local MCP server over stdio) reads from
//! `--config FILE`: the keys of an `[[mcp]]` entry that make sense without HTTP. The
//! command line overrides each of them. `window`, `wait`, `timeout` and `lease` are
//! inherited from `[defaults]` when the table does not set them. Also the rules of the
//! wrapper's names and of a remote server's `--header` ([`name`], [`header`]).

use std::time::Duration;

use oncely_tower::UnitsRule;
use toml::Table;

use super::read::{self, at, check, Mistakes};
use super::routes::{self, RouteFields};

/// The `[mcp_stdio]` table, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpStdio {
    /// The guard's name: its ledger route is `stdio:NAME` (default: from the command).
    pub name: Option<String>,
    /// Who the calls are from (default `local`).
    pub principal: Option<String>,
    /// Tools to guard (`*` = every tool not marked readOnlyHint).
    pub tools: Vec<String>,
    /// Guarded tools of class `action`.
    pub actions: Vec<String>,
    /// Replay window.
    pub window: Duration,
    /// How long a duplicate waits.
    pub wait: Duration,
    /// Most a guarded call may take.
    pub timeout: Duration,
    /// The owner's lease.
    pub lease: Duration,
    /// Billing units per call.
    pub units: UnitsRule,
    /// Most guarded calls in flight to the server from one wrapper.
    pub concurrency: Option<usize>,
    /// Which arguments are idempotency keys the model fills in.
    pub key_arguments: oncely_mcp::KeyArguments,
    /// What each tool's intention is made of (`intent`).
    pub intent: Vec<(String, Vec<String>)>,
}

const KEYS: &[&str] = &[
    "name",
    "principal",
    "tools",
    "actions",
    "window",
    "wait",
    "timeout",
    "lease",
    "units",
    "concurrency",
    "key_arguments",
    "intent",
];

impl Default for McpStdio {
    fn default() -> McpStdio {
        McpStdio::with_defaults(&RouteFields::default())
    }
}

impl McpStdio {
    /// Every default under `[defaults]`: every tool not marked read-only guarded, as
    /// `write`.
    pub(super) fn with_defaults(defaults: &RouteFields) -> McpStdio {
        McpStdio {
            name: None,
            principal: None,
            tools: vec!["*".into()],
            actions: Vec::new(),
            window: defaults.window.unwrap_or(Duration::from_secs(3 * 3600)),
            wait: defaults.wait.unwrap_or(Duration::from_secs(20)),
            timeout: defaults.timeout.unwrap_or(Duration::from_secs(120)),
            lease: defaults.lease.unwrap_or(Duration::from_secs(30)),
            units: UnitsRule::Fixed(1),
            concurrency: None,
            key_arguments: oncely_mcp::KeyArguments::default(),
            intent: Vec::new(),
        }
    }
}

/// The `[mcp_stdio]` table of `table` (its defaults when absent).
pub(super) fn section(table: &Table, defaults: &RouteFields, p: &mut Mistakes) -> McpStdio {
    let mut out = McpStdio::with_defaults(defaults);
    let Some(t) = read::table(table, "", "mcp_stdio", p) else {
        return out;
    };
    let loc = "mcp_stdio";
    read::unknown_keys(t, loc, KEYS, p);
    out.name = read::string(t, loc, "name", p).and_then(|n| check(p, loc, "name", name(n)));
    out.principal = read::string(t, loc, "principal", p).and_then(|n| {
        if n.is_empty() {
            p.add(at(loc, "principal"), "must not be empty");
            None
        } else {
            Some(n.to_owned())
        }
    });
    if let Some(tools) = read::strings(t, loc, "tools", p) {
        out.tools = tools;
    }
    out.actions = read::strings(t, loc, "actions", p).unwrap_or_default();
    out.key_arguments = super::mcp::key_arguments(t, loc, p);
    out.intent = super::mcp::intent(t, loc, p);
    for (key, list) in [("tools", &out.tools), ("actions", &out.actions)] {
        for (i, tool) in list.iter().enumerate() {
            if tool.is_empty() {
                p.add(format!("{}[{i}]", at(loc, key)), "empty tool name");
            }
        }
    }
    for (key, slot) in [
        ("window", &mut out.window),
        ("wait", &mut out.wait),
        ("timeout", &mut out.timeout),
        ("lease", &mut out.lease),
    ] {
        if let Some(d) = read::duration(t, loc, key, p) {
            *slot = d;
        }
    }
    if let Some(text) = read::string(t, loc, "units", p) {
        if let Some(units) = check(
            p,
            loc,
            "units",
            oncely_mcp::parse_units(text).map_err(|e| e.to_string()),
        ) {
            out.units = units;
        }
    }
    out.concurrency = routes::concurrency(t, loc, p);
    out
}

/// A guard's name: letters, digits, `-`, `_` and `.`, at most 64 (it is part of every
/// ledger route the wrapper writes).
pub fn name(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= 64
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?}: use 1 to 64 letters, digits, '-', '_' or '.'"
        ))
    }
}

/// A remote server's `--header 'NAME: VALUE'`, each `${VAR}` in VALUE replaced by the
/// variable `var` reads (the environment). The error names the problem, never the value
/// (it may be a secret).
pub fn header(
    text: &str,
    var: impl Fn(&str) -> Option<String>,
) -> Result<(http::HeaderName, http::HeaderValue), String> {
    let Some((name, value)) = text.split_once(':') else {
        return Err("--header: must be 'NAME: VALUE', and the one given has no ':'".into());
    };
    let name = name.trim();
    let header = http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("--header {name:?}: not a valid header name"))?;
    let mut expanded = String::new();
    let mut rest = value.trim();
    while let Some(at) = rest.find("${") {
        expanded.push_str(&rest[..at]);
        let Some(end) = rest[at..].find('}') else {
            return Err(format!("--header {name}: an unclosed ${{ in its value"));
        };
        let variable = &rest[at + 2..at + end];
        let Some(v) = var(variable).filter(|_| !variable.is_empty()) else {
            return Err(format!(
                "--header {name}: ${{{variable}}} is not set in the environment"
            ));
        };
        expanded.push_str(&v);
        rest = &rest[at + end + 1..];
    }
    expanded.push_str(rest);
    let mut value = http::HeaderValue::from_str(&expanded)
        .map_err(|_| format!("--header {name}: its value is not a valid header value"))?;
    value.set_sensitive(true);
    Ok((header, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_its_variables_and_says_what_is_wrong_without_the_value() {
        let env = |v: &str| (v == "TOKEN").then(|| "s3cret".to_owned());
        let (name, value) = header("Authorization: Bearer ${TOKEN}", env).unwrap();
        assert_eq!(name, "authorization");
        assert_eq!(value, "Bearer s3cret");
        assert!(value.is_sensitive());
        assert_eq!(
            header("X-A: ${TOKEN}-${TOKEN}", env).unwrap().1,
            "s3cret-s3cret"
        );
        let unset = header("Authorization: Bearer ${NOPE}", env).unwrap_err();
        assert!(
            unset.contains("NOPE") && unset.contains("not set"),
            "{unset}"
        );
        let colon = header("Authorization Bearer s3cret", env).unwrap_err();
        assert!(
            colon.contains("':'") && !colon.contains("s3cret"),
            "{colon}"
        );
        assert!(header("Bad Name: x", env).is_err());
        assert!(header("X: ${TOKEN", env).is_err());
    }
}
