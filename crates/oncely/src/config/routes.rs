//! `[[routes]]` and the `[defaults]` a route inherits: a route takes each field it does
//! not set from `[defaults]`, else from the built-in default ([`Route::defaults`]).
//! `[[mcp]]` entries inherit `window`, `wait`, `timeout` and `lease` from `[defaults]` too,
//! so [`RouteFields`] is what this module gives them.

use std::time::Duration;

use http::{HeaderName, Method};
use oncely_core::Class;
use oncely_http::Dialect;
use oncely_mcp::McpPrincipal;
use oncely_tower::{GuardWhen, KeyMode, PrincipalSource, UnitsOf, UnitsRule};
use toml::Table;

use super::pattern::PathPattern;
use super::read::{self, at, check, Mistakes};
use super::upstream::Upstream;
use super::values::{header_name, pointer, principal};

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
    /// The only fields of the body the fingerprint covers (JSON pointers, `/NAME` for a
    /// form field or a part), when set: the complement of `ignore_fields`.
    pub fingerprint_fields: Vec<String>,
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
    /// The dialect of the errors of the gateway's own (default `problem`).
    pub errors: Dialect,
    /// How many more times a temporary upstream failure is tried (default 0, at most 10).
    pub retries: u32,
    /// The first retry's delay ceiling, doubled per retry, full jitter (default 100ms).
    pub retry_backoff: Duration,
    /// Replay window (default 3h).
    pub window: Duration,
    /// How long a duplicate waits for the original (default 20s).
    pub wait: Duration,
    /// How long after its creation a record whose caller never got its answer is joined
    /// by a request under a new client key with its fingerprint (default 10m; zero: never).
    pub churn_window: Duration,
}

/// A route's `churn_window` unless it sets one.
pub(crate) const DEFAULT_CHURN_WINDOW: Duration = Duration::from_secs(600);

/// The keys a route and `[defaults]` share (both know `method` too, a route `path`).
const ROUTE_FIELDS: &[&str] = &[
    "class",
    "key",
    "principal",
    "fingerprint_headers",
    "ignore_fields",
    "fingerprint_fields",
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
    "churn_window",
    "answer",
    "errors",
];

/// The route fields one table sets (a route or `[defaults]`); unset ones are `None`.
#[derive(Debug, Default, Clone)]
pub(super) struct RouteFields {
    pub(super) method: Option<MethodMatch>,
    pub(super) class: Option<Class>,
    pub(super) key: Option<KeyMode>,
    pub(super) principal: Option<PrincipalSource>,
    pub(super) fingerprint_headers: Option<Vec<HeaderName>>,
    pub(super) ignore_fields: Option<Vec<String>>,
    pub(super) fingerprint_fields: Option<Vec<String>>,
    pub(super) guard_when: Option<GuardWhen>,
    pub(super) units: Option<UnitsRule>,
    pub(super) upstream: Option<Upstream>,
    pub(super) timeout: Option<Duration>,
    pub(super) lease: Option<Duration>,
    pub(super) reconcile: Option<Reconcile>,
    pub(super) reconcile_after: Option<Duration>,
    pub(super) concurrency: Option<usize>,
    pub(super) answer_before_record: Option<bool>,
    pub(super) errors: Option<Dialect>,
    pub(super) retries: Option<u32>,
    pub(super) retry_backoff: Option<Duration>,
    pub(super) window: Option<Duration>,
    pub(super) wait: Option<Duration>,
    pub(super) churn_window: Option<Duration>,
}

/// A route's `principal`: `header:NAME` or `none`.
fn route_principal(text: &str) -> Result<PrincipalSource, String> {
    match principal(text, false)? {
        McpPrincipal::Source(source) => Ok(source),
        McpPrincipal::Jwt { .. } => unreachable!("jwt:CLAIM is refused on routes"),
    }
}

fn route_fields(t: &Table, loc: &str, problems: &mut Mistakes) -> RouteFields {
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
    if let Some(ptrs) = read::strings(t, loc, "fingerprint_fields", problems) {
        for (i, p) in ptrs.iter().enumerate() {
            if let Err(e) = pointer(p) {
                problems.add(format!("{}[{i}]", at(loc, "fingerprint_fields")), e);
            }
        }
        if ptrs.is_empty() {
            problems.add(
                at(loc, "fingerprint_fields"),
                "empty: name the fields the intention is made of (e.g. [\"/amount\", \"/to\"]), or leave it out",
            );
        }
        f.fingerprint_fields = Some(ptrs);
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
    // "0s" turns it off.
    f.churn_window = read::duration(t, loc, "churn_window", problems);
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
    if let Some(e) = read::string(t, loc, "errors", problems) {
        f.errors = check(
            problems,
            loc,
            "errors",
            e.parse::<Dialect>().map_err(|e| e.to_string()),
        );
    }
    f.concurrency = concurrency(t, loc, problems);
    f.retries = retries(t, loc, problems);
    f.retry_backoff = retry_backoff(t, loc, problems);
    f
}

/// The most retries a route (or an `[[mcp]]` entry) may ask for.
const MAX_RETRIES: u32 = 10;

/// The built-in `retry_backoff`.
pub(super) const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_millis(100);

/// `concurrency`: an integer of at least 1, or `None` (unlimited) when it is absent or
/// wrong (then reported). Routes, `[defaults]` and `[[mcp]]` entries read it so.
pub(super) fn concurrency(t: &Table, loc: &str, p: &mut Mistakes) -> Option<usize> {
    let n = read::integer(t, loc, "concurrency", p)?;
    if n == 0 {
        p.add(at(loc, "concurrency"), "must be at least 1");
        return None;
    }
    Some(usize::try_from(n).unwrap_or(usize::MAX))
}

/// `retries`: an integer from 0 to [`MAX_RETRIES`], or `None` when it is absent or wrong
/// (then reported). Routes, `[defaults]` and `[[mcp]]` entries read it so.
pub(super) fn retries(t: &Table, loc: &str, p: &mut Mistakes) -> Option<u32> {
    let n = read::integer(t, loc, "retries", p)?;
    match u32::try_from(n) {
        Ok(n) if n <= MAX_RETRIES => Some(n),
        _ => {
            p.add(at(loc, "retries"), format!("must be at most {MAX_RETRIES}"));
            None
        }
    }
}

/// `retry_backoff`: a duration longer than 0, or `None` when it is absent or wrong (then
/// reported). Routes, `[defaults]` and `[[mcp]]` entries read it so.
pub(super) fn retry_backoff(t: &Table, loc: &str, p: &mut Mistakes) -> Option<Duration> {
    let d = read::duration(t, loc, "retry_backoff", p)?;
    if d.is_zero() {
        p.add(at(loc, "retry_backoff"), "must be longer than 0");
        return None;
    }
    Some(d)
}

/// Reads `[defaults]` (no table: no defaults).
pub(super) fn defaults(table: &Table, p: &mut Mistakes) -> RouteFields {
    match read::table(table, "", "defaults", p) {
        Some(d) => {
            let mut known = vec!["method"];
            known.extend_from_slice(ROUTE_FIELDS);
            read::unknown_keys(d, "defaults", &known, p);
            route_fields(d, "defaults", p)
        }
        None => RouteFields::default(),
    }
}

/// Reads `[[routes]]`, each merged with `defaults`; `upstream` is the top-level one (or
/// `--upstream`). A route whose path or method cannot be read is left out (its problems
/// are reported).
pub(super) fn section(
    table: &Table,
    defaults: &RouteFields,
    upstream: Option<&Upstream>,
    p: &mut Mistakes,
) -> Vec<Route> {
    let mut routes = Vec::new();
    for (i, t) in read::tables(table, "routes", p).into_iter().enumerate() {
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
        let ignores = fields
            .ignore_fields
            .as_ref()
            .or(defaults.ignore_fields.as_ref());
        let selects = fields
            .fingerprint_fields
            .as_ref()
            .or(defaults.fingerprint_fields.as_ref());
        if ignores.is_some_and(|i| !i.is_empty()) && selects.is_some() {
            p.add(
                at(&loc, "fingerprint_fields"),
                "set with ignore_fields (here or in [defaults]): they are each other's \
                 complement, so the route must name one, the fields that count or those that do not",
            );
        }
        routes.push(Route::merge(
            method,
            path,
            fields,
            defaults,
            route_upstream.or(upstream.cloned()),
        ));
    }
    routes
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
            fingerprint_fields: Vec::new(),
            guard_when: None,
            units: UnitsRule::None,
            upstream: None,
            timeout: Duration::from_secs(120),
            lease: Duration::from_secs(30),
            reconcile: None,
            reconcile_after: Duration::from_secs(60),
            concurrency: None,
            answer_before_record: false,
            errors: Dialect::Problem,
            retries: 0,
            retry_backoff: DEFAULT_RETRY_BACKOFF,
            window: Duration::from_secs(3 * 3600),
            wait: Duration::from_secs(20),
            churn_window: DEFAULT_CHURN_WINDOW,
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
            fingerprint_fields: f
                .fingerprint_fields
                .or(d.fingerprint_fields.clone())
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
            errors: f.errors.or(d.errors).unwrap_or(b.errors),
            retries: f.retries.or(d.retries).unwrap_or(b.retries),
            retry_backoff: f
                .retry_backoff
                .or(d.retry_backoff)
                .unwrap_or(b.retry_backoff),
            window: f.window.or(d.window).unwrap_or(b.window),
            churn_window: f.churn_window.or(d.churn_window).unwrap_or(b.churn_window),
            wait: f.wait.or(d.wait).unwrap_or(b.wait),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The routes of `text` (`[defaults]` applied, the top-level upstream
    /// `http://127.0.0.1:1`), or its problems.
    fn read(text: &str) -> Result<Vec<Route>, Vec<String>> {
        let table: Table = text.parse().unwrap();
        let upstream = Upstream::parse("http://127.0.0.1:1").unwrap();
        let mut p = Mistakes::default();
        let d = defaults(&table, &mut p);
        let routes = section(&table, &d, Some(&upstream), &mut p);
        if p.0.is_empty() {
            Ok(routes)
        } else {
            Err(p.0.iter().map(ToString::to_string).collect())
        }
    }

    #[test]
    fn retries_and_concurrency_default_to_none_and_are_bounded() {
        let routes = read(
            r#"
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
        )
        .unwrap();
        assert_eq!(routes[0].retries, 10);
        assert_eq!(routes[0].retry_backoff, Duration::from_millis(50));
        assert_eq!(routes[1].retries, 0);
        let ps = read(
            r#"
[[routes]]
method = "GET"
path = "/a"
retries = 11
retry_backoff = "0s"
[[routes]]
method = "GET"
path = "/b"
retries = -1
[[routes]]
method = "GET"
path = "/c"
concurrency = 0
"#,
        )
        .unwrap_err();
        assert_eq!(
            ps,
            [
                "routes[0].retries: must be at most 10",
                "routes[0].retry_backoff: must be longer than 0",
                "routes[1].retries: -1 is negative",
                "routes[2].concurrency: must be at least 1",
            ]
        );
    }

    #[test]
    fn defaults_apply_to_routes_and_route_fields_win() {
        let routes = read(
            r#"
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
        )
        .unwrap();
        assert_eq!(routes[0].window, Duration::from_secs(3600));
        assert_eq!(routes[0].class, Class::Action);
        assert_eq!(routes[0].name, "POST /a");
        assert_eq!(routes[0].timeout, Duration::from_secs(120));
        assert_eq!(routes[1].window, Duration::from_secs(300));
        assert_eq!(routes[1].method, MethodMatch::Any);
    }
}
