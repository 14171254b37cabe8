//! `[[mcp]]`: MCP Streamable HTTP endpoints the gateway serves, each in front of one
//! upstream MCP server. `window`, `wait`, `timeout` and `lease` are inherited from
//! `[defaults]` when an entry does not set them.
//!
//! Extensions beyond the contract: `units`, `timeout`, `lease`, and `concurrency`,
//! `retries` and `retry_backoff`, which are read as on a route (the same parsers, bounds
//! and built-in defaults) but not inherited from `[defaults]`.

use std::path::Path;
use std::time::Duration;

use oncely_mcp::{JwtKey, McpPrincipal};
use oncely_tower::{PrincipalSource, UnitsRule};
use toml::Table;

use super::read::{self, at, check, required, Mistakes};
use super::routes::{self, RouteFields, DEFAULT_RETRY_BACKOFF};
use super::upstream::Upstream;
use super::values::{endpoint_path, env_name, principal, relative};

/// One `[[mcp]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpEntry {
    /// The path clients use.
    pub path: String,
    /// The upstream MCP server.
    pub upstream: Upstream,
    /// What identifies the account.
    pub principal: McpPrincipal,
    /// Tools to guard (`*` = every tool not marked readOnlyHint).
    pub tools: Vec<String>,
    /// Guarded tools of class `action` (names, `*` wildcards); the rest are `write`.
    pub actions: Vec<String>,
    /// Replay window.
    pub window: Duration,
    /// How long a duplicate waits.
    pub wait: Duration,
    /// Billing units per guarded call (an extension): `call` (default) or
    /// `json:/POINTER` into the tool's `arguments`.
    pub units: UnitsRule,
    /// Upstream timeout of a guarded call (an extension; default 120s).
    pub timeout: Duration,
    /// The owner's lease (an extension; default 30s).
    pub lease: Duration,
    /// With `jwt:CLAIM`: the audience a token's `aud` must name (`jwt_audience`).
    pub jwt_audience: Option<String>,
    /// With `jwt:CLAIM`: the issuer a token's `iss` must be (`jwt_issuer`).
    pub jwt_issuer: Option<String>,
    /// With `jwt:CLAIM`: whether a token without `exp` is refused (`jwt_require_exp`,
    /// default true).
    pub jwt_require_exp: bool,
    /// Most guarded tool calls in flight to the MCP server, per gateway process (an
    /// extension; default unlimited). A call that finds no slot within `timeout` is
    /// answered as busy, never sent.
    pub concurrency: Option<usize>,
    /// How many more times a failed connection to the MCP server (nothing was sent) is
    /// tried (an extension; default 0, at most 10). A call that may have reached the
    /// server is never retried.
    pub retries: u32,
    /// The first retry's delay ceiling, doubled per retry, full jitter (an extension;
    /// default 100ms).
    pub retry_backoff: Duration,
    /// Which arguments are idempotency keys the model fills in (`key_arguments`).
    pub key_arguments: oncely_mcp::KeyArguments,
    /// What each tool's intention is made of (`intent`: tool pattern → pointers).
    pub intent: Vec<(String, Vec<String>)>,
}

const MCP_KEYS: &[&str] = &[
    "path",
    "upstream",
    "principal",
    "jwt_secret_env",
    "jwks_file",
    "jwt_audience",
    "jwt_issuer",
    "jwt_require_exp",
    "tools",
    "actions",
    "window",
    "wait",
    "units",
    "timeout",
    "lease",
    "concurrency",
    "retries",
    "retry_backoff",
    "key_arguments",
    "intent",
];

/// Reads `[[mcp]]`: the entries without problems (each problem is reported). `base` is
/// the config file's directory, `defaults` the `[defaults]` read before.
/// `key_arguments` (`TOOL:/POINTER` each; `[]` turns the default names off) of an
/// `[[mcp]]` entry or `[mcp_stdio]`: the default when absent.
pub(super) fn key_arguments(t: &Table, loc: &str, p: &mut Mistakes) -> oncely_mcp::KeyArguments {
    let Some(entries) = read::strings(t, loc, "key_arguments", p) else {
        return oncely_mcp::KeyArguments::default();
    };
    match oncely_mcp::KeyArguments::parse(&entries) {
        Ok(k) => k,
        Err((i, why)) => {
            p.add(format!("{}[{i}]", at(loc, "key_arguments")), why);
            oncely_mcp::KeyArguments::default()
        }
    }
}

/// `intent = { "TOOL_PATTERN" = ["/POINTER", ...] }` of an `[[mcp]]` entry or
/// `[mcp_stdio]`: the arguments each tool's calls are keyed by, alone.
pub(super) fn intent(t: &Table, loc: &str, p: &mut Mistakes) -> Vec<(String, Vec<String>)> {
    let Some(table) = read::table(t, loc, "intent", p) else {
        return Vec::new();
    };
    let iloc = at(loc, "intent");
    let mut out = Vec::new();
    for tool in table.keys() {
        let Some(pointers) = read::strings(table, &iloc, tool, p) else {
            continue;
        };
        let mut ok = !pointers.is_empty();
        if pointers.is_empty() {
            p.add(
                at(&iloc, tool),
                "empty: name the arguments the intention is made of",
            );
        }
        for (i, ptr) in pointers.iter().enumerate() {
            if let Err(e) = super::values::pointer(ptr) {
                p.add(format!("{}[{i}]", at(&iloc, tool)), e);
                ok = false;
            }
        }
        if ok {
            out.push((tool.clone(), pointers));
        }
    }
    out
}

pub(super) fn section(
    table: &Table,
    base: Option<&Path>,
    defaults: &RouteFields,
    p: &mut Mistakes,
) -> Vec<McpEntry> {
    let mut mcp = Vec::new();
    for (i, t) in read::tables(table, "mcp", p).into_iter().enumerate() {
        if let Some(m) = entry(t, &format!("mcp[{i}]"), base, defaults, p) {
            mcp.push(m);
        }
    }
    mcp
}

/// One `[[mcp]]` entry at `loc`, or `None` when it has problems (each reported).
fn entry(
    t: &Table,
    loc: &str,
    base: Option<&Path>,
    defaults: &RouteFields,
    p: &mut Mistakes,
) -> Option<McpEntry> {
    read::unknown_keys(t, loc, MCP_KEYS, p);
    let path = required(t, loc, "path", "e.g. path = \"/mcp\"", p)
        .and_then(|s| check(p, loc, "path", endpoint_path(s)));
    let upstream = required(t, loc, "upstream", "the MCP server's URL", p)
        .and_then(|s| check(p, loc, "upstream", Upstream::parse(s)));
    let secret_env = read::string(t, loc, "jwt_secret_env", p);
    let jwks_file = read::string(t, loc, "jwks_file", p);
    if let Some(e) = secret_env {
        check(p, loc, "jwt_secret_env", env_name(e));
    }
    let principal = match read::string(t, loc, "principal", p) {
        Some(text) => match check(p, loc, "principal", principal(text, true)) {
            Some(McpPrincipal::Jwt { claim, .. }) => match (secret_env, jwks_file) {
                (Some(e), None) => Some(McpPrincipal::Jwt {
                    claim,
                    key: JwtKey::SecretEnv(e.to_owned()),
                }),
                (None, Some(f)) => Some(McpPrincipal::Jwt {
                    claim,
                    key: JwtKey::JwksFile(relative(base, f)),
                }),
                (Some(_), Some(_)) => {
                    p.add(
                        at(loc, "principal"),
                        "set one of jwt_secret_env and jwks_file, not both",
                    );
                    None
                }
                (None, None) => {
                    p.add(
                        at(loc, "principal"),
                        format!("{text:?} needs jwt_secret_env or jwks_file to verify the token"),
                    );
                    None
                }
            },
            other => other,
        },
        None => Some(McpPrincipal::Source(PrincipalSource::Header(
            http::header::AUTHORIZATION,
        ))),
    };
    if !matches!(principal, Some(McpPrincipal::Jwt { .. }) | None)
        && (secret_env.is_some() || jwks_file.is_some())
    {
        p.add(
            at(loc, "principal"),
            "jwt_secret_env / jwks_file are set but principal is not jwt:CLAIM",
        );
    }
    let jwt_audience = read::string(t, loc, "jwt_audience", p).map(str::to_owned);
    let jwt_issuer = read::string(t, loc, "jwt_issuer", p).map(str::to_owned);
    let jwt_require_exp = match t.get("jwt_require_exp") {
        None => true,
        Some(toml::Value::Boolean(b)) => *b,
        Some(_) => {
            p.add(at(loc, "jwt_require_exp"), "expected true or false");
            true
        }
    };
    for (key, set) in [
        ("jwt_audience", jwt_audience.is_some()),
        ("jwt_issuer", jwt_issuer.is_some()),
        ("jwt_require_exp", t.contains_key("jwt_require_exp")),
    ] {
        if set && !matches!(principal, Some(McpPrincipal::Jwt { .. }) | None) {
            p.add(at(loc, key), "is set but principal is not jwt:CLAIM");
        }
    }
    let tools = read::strings(t, loc, "tools", p).unwrap_or_else(|| vec!["*".into()]);
    for (i, tool) in tools.iter().enumerate() {
        if tool.is_empty() {
            p.add(format!("{}[{i}]", at(loc, "tools")), "empty tool name");
        }
    }
    let actions = read::strings(t, loc, "actions", p).unwrap_or_default();
    for (i, tool) in actions.iter().enumerate() {
        if tool.is_empty() {
            p.add(format!("{}[{i}]", at(loc, "actions")), "empty tool name");
        }
    }
    let duration = |key: &str, default: Option<Duration>, builtin: u64, p: &mut Mistakes| {
        read::duration(t, loc, key, p)
            .or(default)
            .unwrap_or(Duration::from_secs(builtin))
    };
    let window = duration("window", defaults.window, 3 * 3600, p);
    let wait = duration("wait", defaults.wait, 20, p);
    let timeout = duration("timeout", defaults.timeout, 120, p);
    let lease = duration("lease", defaults.lease, 30, p);
    let units = match read::string(t, loc, "units", p) {
        Some(text) => check(
            p,
            loc,
            "units",
            oncely_mcp::parse_units(text).map_err(|e| e.to_string()),
        ),
        None => Some(UnitsRule::Fixed(1)),
    };
    let concurrency = routes::concurrency(t, loc, p);
    let key_arguments = key_arguments(t, loc, p);
    let intent = intent(t, loc, p);
    let retries = routes::retries(t, loc, p).unwrap_or(0);
    let retry_backoff = routes::retry_backoff(t, loc, p).unwrap_or(DEFAULT_RETRY_BACKOFF);
    Some(McpEntry {
        path: path?,
        upstream: upstream?,
        principal: principal?,
        tools,
        actions,
        window,
        wait,
        units: units?,
        timeout,
        lease,
        jwt_audience,
        jwt_issuer,
        jwt_require_exp,
        concurrency,
        key_arguments,
        intent,
        retries,
        retry_backoff,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `[[mcp]]` entries of `text` (with its `[defaults]`), or its problems.
    fn read(text: &str) -> Result<Vec<McpEntry>, Vec<String>> {
        let table: Table = text.parse().unwrap();
        let mut p = Mistakes::default();
        let defaults = routes::defaults(&table, &mut p);
        let mcp = section(&table, None, &defaults, &mut p);
        if p.0.is_empty() {
            Ok(mcp)
        } else {
            Err(p.0.iter().map(ToString::to_string).collect())
        }
    }

    #[test]
    fn principals_are_checked() {
        let ps = read(
            r#"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
principal = "jwt:sub"
[[mcp]]
path = "/mcp2"
upstream = "http://127.0.0.1:1/mcp"
principal = "cookie:x"
[[mcp]]
path = "/mcp3"
upstream = "http://127.0.0.1:1/mcp"
jwt_secret_env = "S"
"#,
        )
        .unwrap_err();
        let want = [
            "mcp[0].principal: \"jwt:sub\" needs jwt_secret_env or jwks_file",
            "mcp[1].principal: unknown principal",
            "mcp[2].principal: jwt_secret_env / jwks_file are set but principal is not jwt:CLAIM",
        ];
        for w in want {
            assert!(ps.iter().any(|p| p.starts_with(w)), "{w:?} not in {ps:#?}");
        }
        assert_eq!(ps.len(), want.len(), "{ps:#?}");
    }

    #[test]
    fn defaults_apply_and_entry_fields_win() {
        let mcp = read(
            r#"
[defaults]
window = "1h"
timeout = "30s"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
timeout = "5s"
"#,
        )
        .unwrap();
        let m = &mcp[0];
        assert_eq!(m.window, Duration::from_secs(3600));
        assert_eq!(m.timeout, Duration::from_secs(5));
        assert_eq!(m.wait, Duration::from_secs(20));
        assert_eq!(m.lease, Duration::from_secs(30));
        assert_eq!(m.tools, ["*"]);
        assert_eq!(m.units, UnitsRule::Fixed(1));
        assert_eq!(
            m.principal,
            McpPrincipal::Source(PrincipalSource::Header(http::header::AUTHORIZATION))
        );
    }

    #[test]
    fn concurrency_and_retries_have_the_routes_defaults_and_are_read() {
        let mcp = read(
            r#"
[defaults]
concurrency = 8
retries = 3
retry_backoff = "1s"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
[[mcp]]
path = "/mcp2"
upstream = "http://127.0.0.1:1/mcp"
concurrency = 4
retries = 10
retry_backoff = "250ms"
"#,
        )
        .unwrap();
        // The built-in defaults of a route; `[defaults]` is not inherited for these.
        let route = routes::Route::defaults();
        assert_eq!(mcp[0].concurrency, None);
        assert_eq!(mcp[0].retries, 0);
        assert_eq!(mcp[0].retry_backoff, Duration::from_millis(100));
        assert_eq!(
            (mcp[0].concurrency, mcp[0].retries, mcp[0].retry_backoff),
            (route.concurrency, route.retries, route.retry_backoff)
        );
        assert_eq!(mcp[1].concurrency, Some(4));
        assert_eq!(mcp[1].retries, 10);
        assert_eq!(mcp[1].retry_backoff, Duration::from_millis(250));
    }

    #[test]
    fn concurrency_and_retries_are_refused_as_on_routes() {
        let cases = [
            ("retries", "11", "must be at most 10"),
            ("retries", "-1", "-1 is negative"),
            ("retries", "\"2\"", "expected an integer, found a string"),
            ("concurrency", "0", "must be at least 1"),
            ("concurrency", "-3", "-3 is negative"),
            ("retry_backoff", "\"0s\"", "must be longer than 0"),
            ("retry_backoff", "3", "expected a string, found an integer"),
        ];
        for (key, value, message) in cases {
            let mcp = read(&format!(
                "[[mcp]]\npath = \"/mcp\"\nupstream = \"http://127.0.0.1:1/mcp\"\n{key} = {value}\n"
            ))
            .unwrap_err();
            assert_eq!(mcp, [format!("mcp[0].{key}: {message}")]);
            let table: Table =
                format!("[[routes]]\nmethod = \"GET\"\npath = \"/a\"\n{key} = {value}\n")
                    .parse()
                    .unwrap();
            let mut p = Mistakes::default();
            let upstream = Upstream::parse("http://127.0.0.1:1").unwrap();
            routes::section(&table, &RouteFields::default(), Some(&upstream), &mut p);
            let route: Vec<_> = p.0.iter().map(ToString::to_string).collect();
            assert_eq!(route, [format!("routes[0].{key}: {message}")]);
        }
    }

    #[test]
    fn key_arguments_are_read_and_a_bad_one_refused() {
        let ps = read(
            r#"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
key_arguments = ["pay:/ref", "nonce"]
"#,
        )
        .unwrap_err();
        assert_eq!(ps.len(), 1, "{ps:#?}");
        assert!(
            ps[0].starts_with("mcp[0].key_arguments[1]: \"nonce\" is not TOOL:/POINTER"),
            "{ps:#?}"
        );
        let off = |text: &str| {
            let cfg =
                format!("[[mcp]]\npath = \"/mcp\"\nupstream = \"http://127.0.0.1:1/mcp\"\n{text}");
            read(&cfg).unwrap()[0].key_arguments.clone()
        };
        assert_eq!(off(""), oncely_mcp::KeyArguments::default());
        assert_eq!(
            off("key_arguments = []"),
            oncely_mcp::KeyArguments::parse(&[]).unwrap()
        );
    }

    #[test]
    fn intent_is_read_and_a_bad_one_refused() {
        let ps = read(
            r#"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
intent = { "pay" = ["/amount", "to"], "refund" = [], "send_*" = ["/to"] }
"#,
        )
        .unwrap_err();
        assert_eq!(ps.len(), 2, "{ps:#?}");
        assert!(
            ps.iter().any(|p| p.starts_with("mcp[0].intent.pay[1]: ")),
            "{ps:#?}"
        );
        assert!(
            ps.iter()
                .any(|p| p.starts_with("mcp[0].intent.refund: empty")),
            "{ps:#?}"
        );
        let ok = read(
            "[[mcp]]\npath = \"/mcp\"\nupstream = \"http://127.0.0.1:1/mcp\"\n\
             intent = { \"send_*\" = [\"/to\", \"/amount\"] }\n",
        )
        .unwrap();
        assert_eq!(
            ok[0].intent,
            [(
                "send_*".to_string(),
                vec!["/to".to_string(), "/amount".to_string()]
            )]
        );
    }

    #[test]
    fn unknown_keys_are_still_refused() {
        let ps = read(
            r#"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
concurency = 2
retry = 1
"#,
        )
        .unwrap_err();
        assert_eq!(ps.len(), 2, "{ps:#?}");
        assert!(ps[0].starts_with("mcp[0].concurency: unknown key (known here: "));
        assert!(ps[1].starts_with("mcp[0].retry: unknown key (known here: "));
        assert!(
            ps[0].ends_with(", concurrency, retries, retry_backoff, key_arguments, intent)"),
            "{ps:#?}"
        );
    }

    #[test]
    fn mcp_units_timeout_and_lease_are_read() {
        let mcp = read(
            r#"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
units = "json:/text"
timeout = "90s"
lease = "10s"
actions = ["place_order", "send_*"]
"#,
        )
        .unwrap();
        assert_eq!(mcp[0].actions, vec!["place_order", "send_*"]);
        assert_eq!(mcp[0].units, oncely_mcp::UnitsRule::Json("/text".into()));
        assert_eq!(mcp[0].timeout, Duration::from_secs(90));
        assert_eq!(mcp[0].lease, Duration::from_secs(10));
        let ps = read(
            r#"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
units = "characters"
actions = [""]
"#,
        )
        .unwrap_err();
        assert_eq!(ps.len(), 2, "{ps:#?}");
        assert!(
            ps.iter().any(|p| p.starts_with("mcp[0].units: ")),
            "{ps:#?}"
        );
        assert!(
            ps.iter().any(|p| p.starts_with("mcp[0].actions[0]: ")),
            "{ps:#?}"
        );
    }

    #[test]
    fn mcp_jwt_claim_checks_are_read_and_need_a_jwt_principal() {
        let mcp = read(
            r#"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
principal = "jwt:sub"
jwt_secret_env = "JWT_SECRET"
jwt_audience = "https://api.example"
jwt_issuer = "https://issuer.example"
jwt_require_exp = false
[[mcp]]
path = "/mcp2"
upstream = "http://127.0.0.1:1/mcp"
"#,
        )
        .unwrap();
        assert_eq!(mcp[0].jwt_audience.as_deref(), Some("https://api.example"));
        assert_eq!(mcp[0].jwt_issuer.as_deref(), Some("https://issuer.example"));
        assert!(!mcp[0].jwt_require_exp);
        assert!(mcp[1].jwt_require_exp, "exp is required by default");
        let ps = read(
            r#"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
jwt_audience = "x"
jwt_require_exp = "no"
"#,
        )
        .unwrap_err();
        let want = [
            "mcp[0].jwt_require_exp: expected true or false",
            "mcp[0].jwt_audience: is set but principal is not jwt:CLAIM",
            "mcp[0].jwt_require_exp: is set but principal is not jwt:CLAIM",
        ];
        for w in want {
            assert!(ps.iter().any(|p| p.starts_with(w)), "{w:?} not in {ps:#?}");
        }
        assert_eq!(ps.len(), want.len(), "{ps:#?}");
    }
}
