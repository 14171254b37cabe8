//! The config file: parsed as TOML, then resolved into one validated [`Config`].
//!
//! Two layers, as ripgrep's lowargs/hiargs: [`read`] walks the raw TOML table and
//! collects every problem with its location (unknown keys included); [`Config::resolve`]
//! turns what it read into typed values with defaults applied. Nothing downstream looks a
//! setting up by name.
//!
//! Relative file paths (`tls`, `upstream_ca`, `jwks_file`) are taken relative to the
//! config file's directory.
//!
//! Extensions beyond the contract: `upstream_ca` (a PEM file of extra CA certificates
//! trusted for `https://` upstreams, besides the system roots; also the environment
//! variable `ONCELY_EXTRA_CA_FILE`), and on `hmac-sha256` webhooks the keys
//! `signature_header`, `signature_encoding`, `signature_prefix` and `timestamp_header`;
//! the `[tracing]` section (OTLP traces, [`tracing`]).

mod pattern;
mod read;
pub mod tracing;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::{HeaderName, Method, Uri};
use oncely_core::Class;
use oncely_mcp::{JwtKey, McpPrincipal};
use oncely_tower::{GuardWhen, KeyMode, PrincipalSource, UnitsOf, UnitsRule};
use toml::Table;

pub use pattern::{normalize_path, PathError, PathPattern};
pub use read::Problem;
use read::{at, Problems};

/// The default gateway address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// The default admin address.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
/// The default store.
pub const DEFAULT_STORE: &str = "sqlite://oncely.db";
/// The default admin token variable.
pub const DEFAULT_ADMIN_TOKEN_ENV: &str = "ONCELY_ADMIN_TOKEN";

/// Why a config could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {cause}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why (in the message, so not a `source` too: the cause once).
        cause: std::io::Error,
    },
    /// The file was read and has problems, each with its location.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<Problem>),
}

/// An upstream base URL: `http://` or `https://`, with an optional path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// The URL as parsed.
    pub uri: Uri,
}

impl Upstream {
    /// Parses and checks an upstream URL.
    pub fn parse(text: &str) -> Result<Upstream, String> {
        let uri: Uri = text
            .parse()
            .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http") | Some("https") => {}
            _ => {
                return Err(format!(
                    "upstream {text:?} must start with http:// or https://"
                ))
            }
        }
        if uri.authority().is_none() {
            return Err(format!("upstream {text:?} has no host"));
        }
        if uri.query().is_some() {
            return Err(format!("upstream {text:?} must not have a query"));
        }
        Ok(Upstream { uri })
    }

    /// Whether it is an `https://` upstream.
    pub fn is_https(&self) -> bool {
        self.uri.scheme_str() == Some("https")
    }

    /// The path prefix, without a trailing slash (`""` for none).
    pub fn base_path(&self) -> &str {
        self.uri.path().trim_end_matches('/')
    }
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.uri)
    }
}

/// PEM files to serve HTTPS with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
}

/// Which methods a route matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MethodMatch {
    /// `"*"`.
    Any,
    /// One method.
    One(Method),
}

impl MethodMatch {
    /// Whether `method` matches.
    pub fn matches(&self, method: &Method) -> bool {
        match self {
            MethodMatch::Any => true,
            MethodMatch::One(m) => m == method,
        }
    }
}

impl std::fmt::Display for MethodMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MethodMatch::Any => f.write_str("*"),
            MethodMatch::One(m) => f.write_str(m.as_str()),
        }
    }
}

/// A route's `key`.
fn key_mode(text: &str) -> Result<KeyMode, String> {
    Ok(match text {
        "header" => KeyMode::Header,
        "fingerprint" => KeyMode::Fingerprint,
        "header-or-fingerprint" => KeyMode::HeaderOrFingerprint,
        "none" => KeyMode::None,
        other => {
            return Err(format!(
                "unknown key {other:?} (use header, fingerprint, header-or-fingerprint or none)"
            ))
        }
    })
}

/// How to ask the upstream whether an `outcome_unknown` action happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconcile {
    /// The method to ask with.
    pub method: Method,
    /// Path and query, with `{key}` standing for the downstream key.
    pub target: String,
}

impl Reconcile {
    fn parse(text: &str) -> Result<Reconcile, String> {
        let (method, target) = text.split_once(' ').ok_or_else(|| {
            format!("reconcile {text:?} must be \"METHOD /path?query\" with {{key}} in it")
        })?;
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|_| format!("reconcile {text:?}: {method:?} is not an HTTP method"))?;
        let target = target.trim();
        if !target.starts_with('/') {
            return Err(format!(
                "reconcile {text:?}: the target must start with \"/\""
            ));
        }
        if !target.contains("{key}") {
            return Err(format!(
                "reconcile {text:?}: the target must contain {{key}} (the downstream key)"
            ));
        }
        if target
            .replace("{key}", "k")
            .parse::<http::uri::PathAndQuery>()
            .is_err()
        {
            return Err(format!(
                "reconcile {text:?}: {target:?} is not a valid path and query"
            ));
        }
        Ok(Reconcile {
            method,
            target: target.to_owned(),
        })
    }

    /// The target with `{key}` replaced by the (URL-safe) downstream key.
    pub fn target_for(&self, downstream_key: &str) -> String {
        self.target.replace("{key}", downstream_key)
    }
}

/// One `[[routes]]` entry, with `[defaults]` and the built-in defaults applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The route's name in the ledger, logs and metrics: `METHOD PATTERN`.
    pub name: String,
    /// Which methods.
    pub method: MethodMatch,
    /// Which paths.
    pub path: PathPattern,
    /// Operation class (default `write`).
    pub class: Class,
    /// Key source (default `header-or-fingerprint`).
    pub key: KeyMode,
    /// Principal (default `header:authorization`).
    pub principal: PrincipalSource,
    /// Headers that are part of the fingerprint (lower case).
    pub fingerprint_headers: Vec<HeaderName>,
    /// JSON pointers left out of the fingerprint.
    pub ignore_fields: Vec<String>,
    /// Only these callers are guarded.
    pub guard_when: Option<GuardWhen>,
    /// Billing units (default none).
    pub units: UnitsRule,
    /// The upstream (the route's own, or the top-level one).
    pub upstream: Option<Upstream>,
    /// Upstream timeout (default 120s).
    pub timeout: Duration,
    /// Owner lease (default 30s).
    pub lease: Duration,
    /// Reconciliation endpoint.
    pub reconcile: Option<Reconcile>,
    /// Delay before the server's own reconciliation (default 60s).
    pub reconcile_after: Duration,
    /// Most upstream calls in flight.
    pub concurrency: Option<usize>,
    /// `answer = "before_record"`: a fresh answer's body ends before its completion is
    /// durable (default `"after_record"`: only after). A crash in between is a crash
    /// during the call.
    pub answer_before_record: bool,
    /// How many more times a temporary upstream failure is tried (default 0, at most 10).
    pub retries: u32,
    /// The first retry's delay ceiling, doubled per retry, full jitter (default 100ms).
    pub retry_backoff: Duration,
    /// Replay window (default 3h).
    pub window: Duration,
    /// How long a duplicate waits for the original (default 20s).
    pub wait: Duration,
}

/// One `[[mcp]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpEndpoint {
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
    /// Most guarded tool calls in flight to the server (an extension).
    pub concurrency: Option<usize>,
    /// Retries of a connection that was never made (an extension; default 0).
    pub retries: u32,
    /// The first retry's delay ceiling (an extension; default 100ms).
    pub retry_backoff: Duration,
}

/// One `[[webhooks]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEndpoint {
    /// The path senders post to.
    pub path: String,
    /// How signatures are checked.
    pub verify: oncely_webhooks::Scheme,
    /// The variable holding the secrets (space-separated).
    pub secret_env: String,
    /// How far a signed timestamp may be from now (default 5m).
    pub tolerance: Duration,
    /// Where the event id comes from (the scheme's default when unset).
    pub event_id: Option<oncely_webhooks::EventIdSource>,
    /// JSON pointers whose values also make a delivery unique.
    pub dedupe_fields: Vec<String>,
    /// Where deliveries go.
    pub deliver_to: Upstream,
    /// Timeout of one delivery (default 30s).
    pub deliver_timeout: Duration,
    /// Attempts before dead-lettering (default 10).
    pub max_attempts: u32,
    /// First retry delay (default 1s).
    pub retry_backoff: Duration,
    /// The delivery worker's lease on a delivery, renewed while it runs: a delivery cut
    /// off by a crash is sent again about this long after (an extension; default 30s).
    pub lease: Duration,
}

/// The whole validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Gateway address.
    pub listen: SocketAddr,
    /// Admin API address.
    pub admin_listen: SocketAddr,
    /// The environment variable holding the admin bearer token.
    pub admin_token_env: String,
    /// Store URL.
    pub store: String,
    /// Default upstream.
    pub upstream: Option<Upstream>,
    /// Extra CA certificates for https upstreams (extension).
    pub upstream_ca: Option<PathBuf>,
    /// Serve HTTPS on `listen`.
    pub tls: Option<TlsFiles>,
    /// Largest guarded request body.
    pub max_body: u64,
    /// Largest answer that is stored.
    pub max_response: u64,
    /// Most bytes that answers in flight (being recorded, or not yet read by their
    /// caller) may hold in memory at once, over every route (extension; default 512MiB).
    pub max_inflight_bytes: u64,
    /// How long `SIGTERM` waits for requests in flight before the process exits anyway
    /// (extension; default 30s).
    pub drain_timeout: Duration,
    /// Guarded routes, first match wins.
    pub routes: Vec<Route>,
    /// MCP endpoints.
    pub mcp: Vec<McpEndpoint>,
    /// Webhook endpoints.
    pub webhooks: Vec<WebhookEndpoint>,
    /// OpenTelemetry traces over OTLP (`[tracing]`, an extension; off when absent).
    pub tracing: Option<tracing::Tracing>,
}

/// Command-line values that override the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--upstream`.
    pub upstream: Option<String>,
    /// `--listen`.
    pub listen: Option<String>,
    /// `--admin-listen`.
    pub admin_listen: Option<String>,
    /// `--store` (or `ONCELY_STORE`).
    pub store: Option<String>,
}

/// The default `max_inflight_bytes`.
pub const DEFAULT_MAX_INFLIGHT: u64 = 512 << 20;
/// The default `drain_timeout`.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

const TOP_KEYS: &[&str] = &[
    "listen",
    "admin_listen",
    "admin_token_env",
    "store",
    "upstream",
    "upstream_ca",
    "tls",
    "max_body",
    "max_response",
    "max_inflight_bytes",
    "drain_timeout",
    "defaults",
    "routes",
    "mcp",
    "webhooks",
    "tracing",
];

const ROUTE_FIELDS: &[&str] = &[
    "class",
    "key",
    "principal",
    "fingerprint_headers",
    "ignore_fields",
    "guard_when",
    "units",
    "upstream",
    "timeout",
    "lease",
    "reconcile",
    "reconcile_after",
    "concurrency",
    "retries",
    "retry_backoff",
    "window",
    "wait",
    "answer",
];

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
];

const WEBHOOK_KEYS: &[&str] = &[
    "path",
    "verify",
    "secret_env",
    "tolerance",
    "event_id",
    "dedupe_fields",
    "deliver_to",
    "deliver_timeout",
    "max_attempts",
    "retry_backoff",
    "lease",
    "signature_header",
    "signature_encoding",
    "signature_prefix",
    "timestamp_header",
];

/// The route fields one table sets (a route or `[defaults]`); unset ones are `None`.
#[derive(Debug, Default, Clone)]
struct RouteFields {
    method: Option<MethodMatch>,
    class: Option<Class>,
    key: Option<KeyMode>,
    principal: Option<PrincipalSource>,
    fingerprint_headers: Option<Vec<HeaderName>>,
    ignore_fields: Option<Vec<String>>,
    guard_when: Option<GuardWhen>,
    units: Option<UnitsRule>,
    upstream: Option<Upstream>,
    timeout: Option<Duration>,
    lease: Option<Duration>,
    reconcile: Option<Reconcile>,
    reconcile_after: Option<Duration>,
    concurrency: Option<usize>,
    answer_before_record: Option<bool>,
    retries: Option<u32>,
    retry_backoff: Option<Duration>,
    window: Option<Duration>,
    wait: Option<Duration>,
}

fn header_name(text: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(text.as_bytes())
        .map_err(|_| format!("{text:?} is not a valid header name"))
}

fn pointer(text: &str) -> Result<(), String> {
    if text.starts_with('/') {
        Ok(())
    } else {
        Err(format!(
            "{text:?} is not a JSON pointer (it must start with \"/\", e.g. \"/request_id\")"
        ))
    }
}

fn check<T>(problems: &mut Problems, loc: &str, key: &str, r: Result<T, String>) -> Option<T> {
    r.map_err(|e| problems.add(at(loc, key), e)).ok()
}

fn env_name(text: &str) -> Result<(), String> {
    if !text.is_empty()
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !text.starts_with(|c: char| c.is_ascii_digit())
    {
        Ok(())
    } else {
        Err(format!(
            "{text:?} is not an environment variable name (letters, digits and _)"
        ))
    }
}

/// `header:NAME`, `none`, and (when `jwt` is allowed) `jwt:CLAIM`.
fn principal(text: &str, allow_jwt: bool) -> Result<McpPrincipal, String> {
    if text == "none" {
        Ok(McpPrincipal::Source(PrincipalSource::None))
    } else if let Some(name) = text.strip_prefix("header:") {
        header_name(name).map(|h| McpPrincipal::Source(PrincipalSource::Header(h)))
    } else if let (true, Some(claim)) = (allow_jwt, text.strip_prefix("jwt:")) {
        if claim.is_empty() {
            Err("jwt: needs a claim name, e.g. jwt:sub".into())
        } else {
            // The key is filled in by the caller.
            Ok(McpPrincipal::Jwt {
                claim: claim.to_owned(),
                key: JwtKey::SecretEnv(String::new()),
            })
        }
    } else if allow_jwt {
        Err(format!(
            "unknown principal {text:?} (use header:NAME, jwt:CLAIM or none)"
        ))
    } else {
        Err(format!(
            "unknown principal {text:?} (use header:NAME or none)"
        ))
    }
}

/// A route's `principal`: `header:NAME` or `none`.
fn route_principal(text: &str) -> Result<PrincipalSource, String> {
    match principal(text, false)? {
        McpPrincipal::Source(source) => Ok(source),
        McpPrincipal::Jwt { .. } => unreachable!("jwt:CLAIM is refused on routes"),
    }
}

fn route_fields(t: &Table, loc: &str, problems: &mut Problems) -> RouteFields {
    let mut f = RouteFields::default();
    if let Some(m) = read::string(t, loc, "method", problems) {
        f.method = check(
            problems,
            loc,
            "method",
            if m == "*" {
                Ok(MethodMatch::Any)
            } else {
                Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map(MethodMatch::One)
                    .map_err(|_| format!("{m:?} is not an HTTP method (or \"*\")"))
            },
        );
    }
    if let Some(c) = read::string(t, loc, "class", problems) {
        f.class = check(
            problems,
            loc,
            "class",
            match c.parse::<Class>() {
                Ok(Class::Webhook) | Err(_) => Err(format!(
                    "unknown class {c:?} (use read, write, action or job)"
                )),
                Ok(class) => Ok(class),
            },
        );
    }
    if let Some(k) = read::string(t, loc, "key", problems) {
        f.key = check(problems, loc, "key", key_mode(k));
    }
    if let Some(p) = read::string(t, loc, "principal", problems) {
        f.principal = check(problems, loc, "principal", route_principal(p));
    }
    if let Some(names) = read::strings(t, loc, "fingerprint_headers", problems) {
        let mut out = Vec::new();
        for (i, n) in names.iter().enumerate() {
            match header_name(n) {
                Ok(h) => out.push(h),
                Err(e) => problems.add(format!("{}[{i}]", at(loc, "fingerprint_headers")), e),
            }
        }
        f.fingerprint_headers = Some(out);
    }
    if let Some(ptrs) = read::strings(t, loc, "ignore_fields", problems) {
        for (i, p) in ptrs.iter().enumerate() {
            if let Err(e) = pointer(p) {
                problems.add(format!("{}[{i}]", at(loc, "ignore_fields")), e);
            }
        }
        f.ignore_fields = Some(ptrs);
    }
    if let Some(g) = read::table(t, loc, "guard_when", problems) {
        let gloc = at(loc, "guard_when");
        read::unknown_keys(g, &gloc, &["header", "prefix"], problems);
        let header = match read::string(g, &gloc, "header", problems) {
            Some(h) => check(problems, &gloc, "header", header_name(h)),
            None => {
                if !g.contains_key("header") {
                    problems.add(at(&gloc, "header"), "missing (the header to look at)");
                }
                None
            }
        };
        let prefix = read::string(g, &gloc, "prefix", problems).unwrap_or("");
        f.guard_when = header.map(|header| GuardWhen {
            header,
            prefix: prefix.to_owned(),
        });
    }
    if let Some(u) = read::string(t, loc, "units", problems) {
        f.units = check(problems, loc, "units", UnitsRule::parse(u, UnitsOf::Route));
    }
    if let Some(u) = read::string(t, loc, "upstream", problems) {
        f.upstream = check(problems, loc, "upstream", Upstream::parse(u));
    }
    for (key, slot) in [
        ("timeout", &mut f.timeout),
        ("lease", &mut f.lease),
        ("window", &mut f.window),
        ("wait", &mut f.wait),
    ] {
        if let Some(d) = read::duration(t, loc, key, problems) {
            if d.is_zero() {
                problems.add(at(loc, key), "must be longer than 0");
            } else {
                *slot = Some(d);
            }
        }
    }
    f.reconcile_after = read::duration(t, loc, "reconcile_after", problems);
    if let Some(r) = read::string(t, loc, "reconcile", problems) {
        f.reconcile = check(problems, loc, "reconcile", Reconcile::parse(r));
    }
    if let Some(a) = read::string(t, loc, "answer", problems) {
        f.answer_before_record = check(
            problems,
            loc,
            "answer",
            match a {
                "after_record" => Ok(false),
                "before_record" => Ok(true),
                other => Err(format!(
                    "unknown answer {other:?} (use after_record or before_record)"
                )),
            },
        );
    }
    if let Some(n) = read::integer(t, loc, "concurrency", problems) {
        if n == 0 {
            problems.add(at(loc, "concurrency"), "must be at least 1");
        } else {
            f.concurrency = Some(n as usize);
        }
    }
    if let Some(n) = read::integer(t, loc, "retries", problems) {
        if n > MAX_RETRIES.into() {
            problems.add(at(loc, "retries"), format!("must be at most {MAX_RETRIES}"));
        } else {
            f.retries = Some(n as u32);
        }
    }
    if let Some(d) = read::duration(t, loc, "retry_backoff", problems) {
        if d.is_zero() {
            problems.add(at(loc, "retry_backoff"), "must be longer than 0");
        } else {
            f.retry_backoff = Some(d);
        }
    }
    f
}

/// The most retries a route may ask for.
const MAX_RETRIES: u32 = 10;

/// Resolves a path relative to the config file's directory.
fn relative(base: Option<&Path>, p: &str) -> PathBuf {
    let p = PathBuf::from(p);
    match base {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p,
    }
}

fn listen_addr(text: &str) -> Result<SocketAddr, String> {
    text.parse()
        .map_err(|_| format!("{text:?} is not an address such as 127.0.0.1:8080"))
}

fn store_url(text: &str) -> Result<String, String> {
    let ok = text
        .strip_prefix("sqlite://")
        .is_some_and(|p| !p.is_empty())
        || text.starts_with("postgres://")
        || text.starts_with("postgresql://")
        || text == "memory:"
        || text == "memory://";
    if ok {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "unknown store {text:?}: use sqlite://PATH or postgres://USER@HOST/DB"
        ))
    }
}

impl Config {
    /// Reads and resolves a config file.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read {
            path: path.to_owned(),
            cause,
        })?;
        Config::resolve(&text, path.parent(), overrides)
    }

    /// The configuration of `oncely serve --upstream URL` without a file: every `POST`,
    /// `PUT`, `PATCH` and `DELETE` guarded as `write`, key `header-or-fingerprint`.
    pub fn from_overrides(overrides: &Overrides) -> Result<Config, ConfigError> {
        let mut config = Config::resolve("", None, overrides)?;
        let path = PathPattern::parse("/{*rest}").expect("a valid pattern");
        for method in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            config.routes.push(Route {
                name: format!("{method} /{{*rest}}"),
                method: MethodMatch::One(method),
                path: path.clone(),
                upstream: config.upstream.clone(),
                ..Route::defaults()
            });
        }
        Ok(config)
    }

    /// Resolves config text (`base` = the file's directory, for relative paths).
    pub fn resolve(
        text: &str,
        base: Option<&Path>,
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        let table: Table = match text.parse() {
            Ok(t) => t,
            Err(e) => {
                let e: toml::de::Error = e;
                let at = e
                    .span()
                    .map(|s| read::line_col(text, s.start))
                    .unwrap_or_else(|| "1:1".into());
                return Err(ConfigError::Invalid(vec![Problem {
                    at,
                    message: format!("TOML syntax: {}", e.message().trim().replace('\n', "; ")),
                }]));
            }
        };
        let mut problems = Problems::default();
        let p = &mut problems;
        read::unknown_keys(&table, "", TOP_KEYS, p);

        let addr = |key: &str, flag: &Option<String>, default: &str, p: &mut Problems| match flag {
            Some(v) => check(
                p,
                "",
                &format!("--{}", key.replace('_', "-")),
                listen_addr(v),
            ),
            None => {
                let v = read::string(&table, "", key, p).unwrap_or(default);
                check(p, "", key, listen_addr(v))
            }
        };
        let listen = addr("listen", &overrides.listen, DEFAULT_LISTEN, p);
        let admin_listen = addr(
            "admin_listen",
            &overrides.admin_listen,
            DEFAULT_ADMIN_LISTEN,
            p,
        );

        let admin_token_env = read::string(&table, "", "admin_token_env", p)
            .unwrap_or(DEFAULT_ADMIN_TOKEN_ENV)
            .to_owned();
        check(p, "", "admin_token_env", env_name(&admin_token_env));

        let store = match &overrides.store {
            Some(s) => check(p, "", "--store", store_url(s)),
            None => {
                let s = read::string(&table, "", "store", p).unwrap_or(DEFAULT_STORE);
                check(p, "", "store", store_url(s))
            }
        };

        let upstream = match &overrides.upstream {
            Some(u) => check(p, "", "--upstream", Upstream::parse(u)),
            None => read::string(&table, "", "upstream", p)
                .and_then(|u| check(p, "", "upstream", Upstream::parse(u))),
        };
        let upstream_ca = read::string(&table, "", "upstream_ca", p).map(|f| relative(base, f));

        let tls = read::table(&table, "", "tls", p).and_then(|t| {
            read::unknown_keys(t, "tls", &["cert", "key"], p);
            let file = |k: &str, p: &mut Problems| match read::string(t, "tls", k, p) {
                Some(f) if !f.is_empty() => Some(relative(base, f)),
                Some(_) => {
                    p.add(at("tls", k), "is empty");
                    None
                }
                None => {
                    if !t.contains_key(k) {
                        p.add(at("tls", k), "missing (a PEM file)");
                    }
                    None
                }
            };
            let cert = file("cert", p);
            let key = file("key", p);
            Some(TlsFiles {
                cert: cert?,
                key: key?,
            })
        });

        let max_body = read::size(&table, "", "max_body", p).unwrap_or(10 << 20);
        let max_response = read::size(&table, "", "max_response", p).unwrap_or(32 << 20);
        let max_inflight_bytes =
            read::size(&table, "", "max_inflight_bytes", p).unwrap_or(DEFAULT_MAX_INFLIGHT);
        let drain_timeout =
            read::duration(&table, "", "drain_timeout", p).unwrap_or(DEFAULT_DRAIN_TIMEOUT);

        let defaults = match read::table(&table, "", "defaults", p) {
            Some(d) => {
                let mut known = vec!["method"];
                known.extend_from_slice(ROUTE_FIELDS);
                read::unknown_keys(d, "defaults", &known, p);
                route_fields(d, "defaults", p)
            }
            None => RouteFields::default(),
        };

        let mut routes = Vec::new();
        for (i, t) in read::tables(&table, "routes", p).into_iter().enumerate() {
            let loc = format!("routes[{i}]");
            let mut known = vec!["method", "path"];
            known.extend_from_slice(ROUTE_FIELDS);
            read::unknown_keys(t, &loc, &known, p);
            let fields = route_fields(t, &loc, p);
            let path = match read::string(t, &loc, "path", p) {
                Some(s) => check(p, &loc, "path", PathPattern::parse(s)),
                None => {
                    if !t.contains_key("path") {
                        p.add(at(&loc, "path"), "missing (e.g. path = \"/v1/render\")");
                    }
                    None
                }
            };
            let method = fields.method.clone().or(defaults.method.clone());
            if method.is_none() && !t.contains_key("method") {
                p.add(
                    at(&loc, "method"),
                    "missing (e.g. method = \"POST\", or \"*\")",
                );
            }
            let route_upstream = fields.upstream.clone().or(defaults.upstream.clone());
            if route_upstream.is_none() && upstream.is_none() && !t.contains_key("upstream") {
                p.add(
                    at(&loc, "upstream"),
                    "no upstream: set `upstream` at the top of the file, on the route, or pass --upstream",
                );
            }
            let (Some(path), Some(method)) = (path, method) else {
                continue;
            };
            routes.push(Route::merge(
                method,
                path,
                fields,
                &defaults,
                route_upstream.or(upstream.clone()),
            ));
        }

        // An MCP or webhook path is served by the gateway itself; two of them on one path
        // would make one unreachable.
        let mut seen: Vec<(String, String)> = Vec::new();
        for section in ["mcp", "webhooks"] {
            if let Some(toml::Value::Array(items)) = table.get(section) {
                for (i, item) in items.iter().enumerate() {
                    let loc = format!("{section}[{i}]");
                    if let Some(path) = item.get("path").and_then(toml::Value::as_str) {
                        if let Some((_, first)) = seen.iter().find(|(p2, _)| p2 == path) {
                            p.add(
                                at(&loc, "path"),
                                format!("{path:?} is already used by {first}"),
                            );
                        }
                        seen.push((path.to_owned(), loc));
                    }
                }
            }
        }
        let mut mcp = Vec::new();
        for (i, t) in read::tables(&table, "mcp", p).into_iter().enumerate() {
            if let Some(m) = mcp_endpoint(t, &format!("mcp[{i}]"), base, &defaults, p) {
                mcp.push(m);
            }
        }
        let mut webhooks = Vec::new();
        for (i, t) in read::tables(&table, "webhooks", p).into_iter().enumerate() {
            if let Some(w) = webhook_endpoint(t, &format!("webhooks[{i}]"), p) {
                webhooks.push(w);
            }
        }

        let tracing = tracing::section(&table, p);

        if !problems.0.is_empty() {
            return Err(ConfigError::Invalid(problems.0));
        }
        Ok(Config {
            listen: listen.expect("checked"),
            admin_listen: admin_listen.expect("checked"),
            admin_token_env,
            store: store.expect("checked"),
            upstream,
            upstream_ca,
            tls,
            max_body,
            max_response,
            max_inflight_bytes,
            drain_timeout,
            routes,
            mcp,
            webhooks,
            tracing,
        })
    }

    /// The route a ledger record names (`Record::route`), if it is configured.
    pub fn route_named(&self, name: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.name == name)
    }
}

impl Route {
    /// A route with every built-in default and a catch-all pattern.
    pub fn defaults() -> Route {
        Route {
            name: "* /{*rest}".into(),
            method: MethodMatch::Any,
            path: PathPattern::parse("/{*rest}").expect("a valid pattern"),
            class: Class::Write,
            key: KeyMode::HeaderOrFingerprint,
            principal: PrincipalSource::Header(http::header::AUTHORIZATION),
            fingerprint_headers: Vec::new(),
            ignore_fields: Vec::new(),
            guard_when: None,
            units: UnitsRule::None,
            upstream: None,
            timeout: Duration::from_secs(120),
            lease: Duration::from_secs(30),
            reconcile: None,
            reconcile_after: Duration::from_secs(60),
            concurrency: None,
            answer_before_record: false,
            retries: 0,
            retry_backoff: Duration::from_millis(100),
            window: Duration::from_secs(3 * 3600),
            wait: Duration::from_secs(20),
        }
    }

    fn merge(
        method: MethodMatch,
        path: PathPattern,
        f: RouteFields,
        d: &RouteFields,
        upstream: Option<Upstream>,
    ) -> Route {
        let b = Route::defaults();
        Route {
            name: format!("{method} {path}"),
            method,
            path,
            class: f.class.or(d.class).unwrap_or(b.class),
            key: f.key.or(d.key).unwrap_or(b.key),
            principal: f.principal.or(d.principal.clone()).unwrap_or(b.principal),
            fingerprint_headers: f
                .fingerprint_headers
                .or(d.fingerprint_headers.clone())
                .unwrap_or_default(),
            ignore_fields: f
                .ignore_fields
                .or(d.ignore_fields.clone())
                .unwrap_or_default(),
            guard_when: f.guard_when.or(d.guard_when.clone()),
            units: f.units.or(d.units.clone()).unwrap_or(b.units),
            upstream,
            timeout: f.timeout.or(d.timeout).unwrap_or(b.timeout),
            lease: f.lease.or(d.lease).unwrap_or(b.lease),
            reconcile: f.reconcile.or(d.reconcile.clone()),
            reconcile_after: f
                .reconcile_after
                .or(d.reconcile_after)
                .unwrap_or(b.reconcile_after),
            concurrency: f.concurrency.or(d.concurrency),
            answer_before_record: f
                .answer_before_record
                .or(d.answer_before_record)
                .unwrap_or(b.answer_before_record),
            retries: f.retries.or(d.retries).unwrap_or(b.retries),
            retry_backoff: f
                .retry_backoff
                .or(d.retry_backoff)
                .unwrap_or(b.retry_backoff),
            window: f.window.or(d.window).unwrap_or(b.window),
            wait: f.wait.or(d.wait).unwrap_or(b.wait),
        }
    }
}

fn required<'a>(
    t: &'a Table,
    loc: &str,
    key: &str,
    hint: &str,
    p: &mut Problems,
) -> Option<&'a str> {
    let v = read::string(t, loc, key, p);
    if v.is_none() && !t.contains_key(key) {
        p.add(at(loc, key), format!("missing ({hint})"));
    }
    v
}

fn endpoint_path(text: &str) -> Result<String, String> {
    if text.starts_with('/') && !text.contains(['?', '#', '{', '}']) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "path {text:?} must be a literal path starting with \"/\""
        ))
    }
}

fn mcp_endpoint(
    t: &Table,
    loc: &str,
    base: Option<&Path>,
    defaults: &RouteFields,
    p: &mut Problems,
) -> Option<McpEndpoint> {
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
    let duration = |key: &str, default: Option<Duration>, builtin: u64, p: &mut Problems| {
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
    Some(McpEndpoint {
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
        concurrency: None,
        retries: 0,
        retry_backoff: Duration::from_millis(100),
    })
}

fn webhook_endpoint(t: &Table, loc: &str, p: &mut Problems) -> Option<WebhookEndpoint> {
    read::unknown_keys(t, loc, WEBHOOK_KEYS, p);
    let path = required(t, loc, "path", "e.g. path = \"/hooks/stripe\"", p)
        .and_then(|s| check(p, loc, "path", endpoint_path(s)));
    let mut verify = required(
        t,
        loc,
        "verify",
        "stripe, standard, github or hmac-sha256",
        p,
    )
    .and_then(|s| {
        check(
            p,
            loc,
            "verify",
            s.parse::<oncely_webhooks::Scheme>()
                .map_err(|e| e.to_string()),
        )
    });
    // The generic scheme's own keys.
    let hmac_keys = [
        "signature_header",
        "signature_encoding",
        "signature_prefix",
        "timestamp_header",
    ];
    match &mut verify {
        Some(oncely_webhooks::Scheme::HmacSha256(cfg)) => {
            if let Some(h) = read::string(t, loc, "signature_header", p) {
                cfg.header = h.to_owned();
            }
            if let Some(e) = read::string(t, loc, "signature_encoding", p) {
                if let Some(enc) = check(
                    p,
                    loc,
                    "signature_encoding",
                    e.parse()
                        .map_err(|e: oncely_webhooks::ConfigError| e.to_string()),
                ) {
                    cfg.encoding = enc;
                }
            }
            cfg.prefix = read::string(t, loc, "signature_prefix", p).map(str::to_owned);
            cfg.timestamp_header = read::string(t, loc, "timestamp_header", p).map(str::to_owned);
            if let Err(e) = cfg.validate() {
                p.add(at(loc, "verify"), e.to_string());
            }
        }
        Some(other) => {
            for k in hmac_keys {
                if t.contains_key(k) {
                    p.add(
                        at(loc, k),
                        format!("only for verify = \"hmac-sha256\", not {:?}", other.name()),
                    );
                }
            }
        }
        None => {}
    }
    let secret_env = required(t, loc, "secret_env", "the variable holding the secret", p)
        .and_then(|s| check(p, loc, "secret_env", env_name(s).map(|()| s.to_owned())));
    let tolerance =
        read::duration(t, loc, "tolerance", p).unwrap_or(oncely_webhooks::DEFAULT_TOLERANCE);
    let event_id = read::string(t, loc, "event_id", p).and_then(|s| {
        check(
            p,
            loc,
            "event_id",
            s.parse::<oncely_webhooks::EventIdSource>()
                .map_err(|e| e.to_string()),
        )
    });
    if let (Some(v), None, false) = (&verify, &event_id, t.contains_key("event_id")) {
        if v.default_event_id().is_none() {
            p.add(
                at(loc, "event_id"),
                format!(
                    "verify = {:?} has no default event id: set event_id = \"json:/POINTER\" or \"header:NAME\"",
                    v.name()
                ),
            );
        }
    }
    let dedupe_fields = read::strings(t, loc, "dedupe_fields", p).unwrap_or_default();
    for (i, f) in dedupe_fields.iter().enumerate() {
        if let Err(e) = pointer(f) {
            p.add(format!("{}[{i}]", at(loc, "dedupe_fields")), e);
        }
    }
    let deliver_to = required(t, loc, "deliver_to", "the URL deliveries go to", p)
        .and_then(|s| check(p, loc, "deliver_to", Upstream::parse(s)));
    let deliver_timeout =
        read::duration(t, loc, "deliver_timeout", p).unwrap_or(Duration::from_secs(30));
    let max_attempts = match read::integer(t, loc, "max_attempts", p) {
        Some(0) => {
            p.add(at(loc, "max_attempts"), "must be at least 1");
            10
        }
        Some(n) if n > u32::MAX as u64 => {
            p.add(at(loc, "max_attempts"), "is too large");
            10
        }
        Some(n) => n as u32,
        None => 10,
    };
    let retry_backoff =
        read::duration(t, loc, "retry_backoff", p).unwrap_or(Duration::from_secs(1));
    let lease = match read::duration(t, loc, "lease", p) {
        Some(d) if d.is_zero() => {
            p.add(at(loc, "lease"), "must be longer than 0");
            Duration::from_secs(30)
        }
        Some(d) => d,
        None => Duration::from_secs(30),
    };
    Some(WebhookEndpoint {
        path: path?,
        verify: verify?,
        secret_env: secret_env?,
        tolerance,
        event_id,
        dedupe_fields,
        deliver_to: deliver_to?,
        deliver_timeout,
        max_attempts,
        retry_backoff,
        lease,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contract's example file, verbatim.
    pub(crate) const CONTRACT_EXAMPLE: &str = include_str!("../../tests/it/contract-example.toml");

    fn problems(text: &str) -> Vec<String> {
        match Config::resolve(text, None, &Overrides::default()) {
            Ok(_) => Vec::new(),
            Err(ConfigError::Invalid(ps)) => ps.iter().map(ToString::to_string).collect(),
            Err(e) => vec![e.to_string()],
        }
    }

    #[test]
    fn the_contract_example_is_valid() {
        let c = Config::resolve(
            CONTRACT_EXAMPLE,
            Some(Path::new("/etc/oncely")),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.max_body, 10 << 20);
        assert_eq!(
            c.tls.as_ref().unwrap().cert,
            PathBuf::from("/etc/oncely/cert.pem")
        );
        let r = &c.routes[0];
        assert_eq!(r.name, "POST /v1/render");
        assert_eq!(r.class, Class::Write);
        assert_eq!(r.units, UnitsRule::Json("/text".into()));
        assert_eq!(
            r.upstream.as_ref().unwrap().to_string(),
            "http://127.0.0.1:3001/"
        );
        assert_eq!(r.concurrency, Some(8));
        assert_eq!(r.retries, 2);
        assert_eq!(r.retry_backoff, Duration::from_millis(100));
        assert_eq!(
            r.reconcile.as_ref().unwrap().target_for("k1"),
            "/v1/orders?reference=k1"
        );
        assert_eq!(c.mcp[0].tools, vec!["*".to_string()]);
        assert_eq!(c.webhooks[0].max_attempts, 10);
        assert_eq!(c.webhooks[0].verify, oncely_webhooks::Scheme::Stripe);
    }

    #[test]
    fn retries_default_to_none_and_are_bounded() {
        let c = Config::resolve(
            r#"
upstream = "http://127.0.0.1:1"
[defaults]
retry_backoff = "50ms"
[[routes]]
method = "GET"
path = "/a"
class = "read"
retries = 10
[[routes]]
method = "POST"
path = "/b"
"#,
            None,
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.routes[0].retries, 10);
        assert_eq!(c.routes[0].retry_backoff, Duration::from_millis(50));
        assert_eq!(c.routes[1].retries, 0);
        let ps = problems(
            r#"
upstream = "http://127.0.0.1:1"
[[routes]]
method = "GET"
path = "/a"
retries = 11
retry_backoff = "0s"
[[routes]]
method = "GET"
path = "/b"
retries = -1
"#,
        );
        assert_eq!(
            ps,
            [
                "routes[0].retries: must be at most 10",
                "routes[0].retry_backoff: must be longer than 0",
                "routes[1].retries: -1 is negative",
            ]
        );
    }

    #[test]
    fn defaults_apply_to_routes_and_route_fields_win() {
        let c = Config::resolve(
            r#"
upstream = "http://127.0.0.1:1"
[defaults]
window = "1h"
class = "action"
[[routes]]
method = "post"
path = "/a"
[[routes]]
method = "*"
path = "/b/{*rest}"
window = "5m"
"#,
            None,
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.routes[0].window, Duration::from_secs(3600));
        assert_eq!(c.routes[0].class, Class::Action);
        assert_eq!(c.routes[0].name, "POST /a");
        assert_eq!(c.routes[0].timeout, Duration::from_secs(120));
        assert_eq!(c.routes[1].window, Duration::from_secs(300));
        assert_eq!(c.routes[1].method, MethodMatch::Any);
        assert_eq!(c.store, DEFAULT_STORE);
    }

    #[test]
    fn every_problem_is_reported_with_its_location() {
        let ps = problems(
            r#"
listen = "nowhere"
colour = "blue"
upstream = "ftp://x"
[[routes]]
method = "POST"
path = "/a"
window = "5x"
ignore_fields = ["request_id"]
units = "tokens"
[[routes]]
path = "b"
class = "delete"
guard_when = { header = "authorization", prefx = "x" }
"#,
        );
        let want = [
            "listen: ",
            "colour: unknown key",
            "upstream: upstream \"ftp://x\" must start with http:// or https://",
            "routes[0].window: duration \"5x\" has unknown unit",
            "routes[0].ignore_fields[0]: ",
            "routes[0].units: unknown units",
            "routes[1].path: path \"b\" must start with \"/\"",
            "routes[1].class: unknown class",
            "routes[1].guard_when.prefx: unknown key",
            "routes[1].method: missing",
        ];
        for w in want {
            assert!(ps.iter().any(|p| p.starts_with(w)), "{w:?} not in {ps:#?}");
        }
        assert_eq!(ps.len(), want.len() + 2, "{ps:#?}"); // + the two routes' missing upstream
    }

    #[test]
    fn syntax_errors_have_a_line_and_column() {
        let ps = problems("listen = \"a\"\nstore = \n");
        assert_eq!(ps.len(), 1);
        assert!(ps[0].starts_with("2:"), "{ps:?}");
        assert!(!ps[0].contains('\n'));
    }

    #[test]
    fn flags_override_the_file() {
        let o = Overrides {
            upstream: Some("https://example.test".into()),
            listen: Some("127.0.0.1:0".into()),
            store: Some("memory:".into()),
            admin_listen: None,
        };
        let c = Config::resolve(
            "listen = \"127.0.0.1:1\"\nstore = \"sqlite://x.db\"\n",
            None,
            &o,
        )
        .unwrap();
        assert_eq!(c.listen.port(), 0);
        assert_eq!(c.store, "memory:");
        assert!(c.upstream.unwrap().is_https());
        let bad = Overrides {
            store: Some("redis://x".into()),
            ..Overrides::default()
        };
        let Err(ConfigError::Invalid(ps)) = Config::resolve("", None, &bad) else {
            panic!()
        };
        assert_eq!(ps[0].at, "--store");
    }

    #[test]
    fn upstream_only_guards_the_four_writing_methods() {
        let c = Config::from_overrides(&Overrides {
            upstream: Some("http://127.0.0.1:3000".into()),
            ..Overrides::default()
        })
        .unwrap();
        let names: Vec<_> = c.routes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "POST /{*rest}",
                "PUT /{*rest}",
                "PATCH /{*rest}",
                "DELETE /{*rest}"
            ]
        );
        assert!(c.routes.iter().all(|r| r.class == Class::Write
            && r.key == KeyMode::HeaderOrFingerprint
            && r.upstream.is_some()));
    }

    #[test]
    fn mcp_and_webhook_sections_are_checked() {
        let ps = problems(
            r#"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
principal = "jwt:sub"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
principal = "cookie:x"
[[webhooks]]
path = "/hooks/x"
verify = "hmac-sha256"
secret_env = "X SECRET"
deliver_to = "http://127.0.0.1:1/x"
max_attempts = 0
lease = "0s"
dedupe_fields = ["type"]
[[webhooks]]
path = "/hooks/s"
verify = "svix"
secret_env = "S"
deliver_to = "http://127.0.0.1:1/x"
signature_header = "x-sig"
"#,
        );
        let want = [
            "mcp[0].principal: \"jwt:sub\" needs jwt_secret_env or jwks_file",
            "mcp[1].principal: unknown principal",
            "mcp[1].path: \"/mcp\" is already used by mcp[0]",
            "webhooks[0].secret_env: ",
            "webhooks[0].max_attempts: must be at least 1",
            "webhooks[0].lease: must be longer than 0",
            "webhooks[0].dedupe_fields[0]: ",
            "webhooks[0].event_id: verify = \"hmac-sha256\" has no default event id",
            "webhooks[1].verify: unknown webhook verification scheme",
        ];
        for w in want {
            assert!(ps.iter().any(|p| p.starts_with(w)), "{w:?} not in {ps:#?}");
        }
        assert_eq!(ps.len(), want.len(), "{ps:#?}");
    }

    #[test]
    fn mcp_units_timeout_and_lease_are_read() {
        let c = Config::resolve(
            r#"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
units = "json:/text"
timeout = "90s"
lease = "10s"
actions = ["place_order", "send_*"]
"#,
            None,
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.mcp[0].actions, vec!["place_order", "send_*"]);
        assert_eq!(c.mcp[0].units, oncely_mcp::UnitsRule::Json("/text".into()));
        assert_eq!(c.mcp[0].timeout, Duration::from_secs(90));
        assert_eq!(c.mcp[0].lease, Duration::from_secs(10));
        let ps = problems(
            r#"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
units = "characters"
actions = [""]
"#,
        );
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
        let c = Config::resolve(
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
            None,
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(
            c.mcp[0].jwt_audience.as_deref(),
            Some("https://api.example")
        );
        assert_eq!(
            c.mcp[0].jwt_issuer.as_deref(),
            Some("https://issuer.example")
        );
        assert!(!c.mcp[0].jwt_require_exp);
        assert!(c.mcp[1].jwt_require_exp, "exp is required by default");
        let ps = problems(
            r#"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
jwt_audience = "x"
jwt_require_exp = "no"
"#,
        );
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
