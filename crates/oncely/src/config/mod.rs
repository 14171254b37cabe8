//! The config file: parsed as TOML, then resolved into one validated [`Config`].
//!
//! Two layers, as ripgrep's lowargs/hiargs: [`read`] walks the raw TOML table and
//! collects every problem with its location (unknown keys included); [`Config::resolve`]
//! turns what it read into typed values with defaults applied. Nothing downstream looks a
//! setting up by name.
//!
//! One module per section reads its part of the table: [`routes`] (`[[routes]]` and the
//! `[defaults]` they inherit), [`mcp`] (`[[mcp]]`), [`webhooks`] (`[[webhooks]]`) and
//! [`tracing`] (`[tracing]`); this module reads the top-level keys and `tls`, and checks
//! what spans sections (one endpoint per path). What the sections share sits below them,
//! and none of them uses this module: [`read`] (the TOML getters and the problem
//! collector), [`values`] (value parsers), [`upstream`] (the [`Upstream`] URL) and
//! [`pattern`] (route path patterns).
//!
//! Relative file paths (`tls`, `upstream_ca`, `jwks_file`) are taken relative to the
//! config file's directory.
//!
//! Extensions beyond the contract: `upstream_ca` (a PEM file of extra CA certificates
//! trusted for `https://` upstreams, besides the system roots; also the environment
//! variable `ONCELY_EXTRA_CA_FILE`), and on `hmac-sha256` webhooks the keys
//! `signature_header`, `signature_encoding`, `signature_prefix` and `timestamp_header`;
//! the `[tracing]` section (OpenTelemetry export, [`tracing`], merged with the `OTEL_*`
//! variables by [`telemetry`]).

mod mcp;
mod mcp_stdio;
mod pattern;
mod read;
mod routes;
pub mod telemetry;
pub mod tracing;
mod upstream;
mod values;
mod webhooks;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Method;
use toml::Table;

pub use mcp::McpEntry;
pub use mcp_stdio::{header as remote_header, name as stdio_name, McpStdio};
pub use pattern::{normalize_path, PathError, PathPattern};
pub use read::Mistake;
pub use routes::{MethodMatch, Reconcile, Route};
pub use upstream::Upstream;
pub use webhooks::WebhookEndpoint;

use read::{at, check, Mistakes};
use values::{env_name, relative};

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
    Invalid(Vec<Mistake>),
}

/// PEM files to serve HTTPS with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
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
    /// Most connections this process opens to a PostgreSQL store (extension; default
    /// 16).
    pub store_pool_size: usize,
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
    pub mcp: Vec<McpEntry>,
    /// `[mcp_stdio]`: what `oncely mcp` reads (an extension; its defaults when absent).
    pub mcp_stdio: McpStdio,
    /// `[defaults]`'s `errors`: the dialect of the gateway's own errors on requests that
    /// match no route.
    pub errors: oncely_http::Dialect,
    /// Webhook endpoints.
    pub webhooks: Vec<WebhookEndpoint>,
    /// What the file says of OpenTelemetry export (`[tracing]`); merged with the
    /// environment by [`Config::telemetry`].
    pub tracing: Option<tracing::Tracing>,
    /// How long the usage history keeps an hour (default 400d, at least 1h).
    pub usage_retention: Duration,
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
/// The default `store_pool_size`.
pub const DEFAULT_STORE_POOL_SIZE: usize = 16;
/// The default `usage_retention`: 400 days.
pub const DEFAULT_USAGE_RETENTION: Duration = Duration::from_secs(400 * 86_400);

const TOP_KEYS: &[&str] = &[
    "listen",
    "admin_listen",
    "admin_token_env",
    "store",
    "store_pool_size",
    "upstream",
    "upstream_ca",
    "tls",
    "max_body",
    "max_response",
    "max_inflight_bytes",
    "drain_timeout",
    "usage_retention",
    "defaults",
    "routes",
    "mcp",
    "mcp_stdio",
    "webhooks",
    "tracing",
];

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

/// Reports every `[[mcp]]` or `[[webhooks]]` path that an entry before it uses already:
/// these paths are served by the gateway itself, and of two on one path, one would be
/// unreachable.
fn endpoint_paths(table: &Table, p: &mut Mistakes) {
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
}

/// The OpenTelemetry export of `file` (a `[tracing]` table, or none) merged with the
/// process's `OTEL_*` variables; every problem a [`Mistake`] at its variable or key.
pub fn telemetry_of(
    file: Option<&tracing::Tracing>,
) -> Result<Option<telemetry::Telemetry>, ConfigError> {
    telemetry::resolve(file, &telemetry::process_env).map_err(|problems| {
        ConfigError::Invalid(
            problems
                .into_iter()
                .map(|p| {
                    let (at, message) = p.split_once(": ").unwrap_or(("environment", &p));
                    Mistake {
                        at: at.to_string(),
                        message: message.to_string(),
                    }
                })
                .collect(),
        )
    })
}

impl Config {
    /// The OpenTelemetry export: `[tracing]` merged with the process's `OTEL_*`
    /// variables (the file wins); `Ok(None)` when nothing is exported; else every
    /// problem, each naming its variable or key.
    pub fn telemetry(&self) -> Result<Option<telemetry::Telemetry>, ConfigError> {
        telemetry_of(self.tracing.as_ref())
    }

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
                return Err(ConfigError::Invalid(vec![Mistake {
                    at,
                    message: format!("TOML syntax: {}", e.message().trim().replace('\n', "; ")),
                }]));
            }
        };
        let mut problems = Mistakes::default();
        let p = &mut problems;
        read::unknown_keys(&table, "", TOP_KEYS, p);

        let addr = |key: &str, flag: &Option<String>, default: &str, p: &mut Mistakes| match flag {
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

        let store_pool_size = match read::integer(&table, "", "store_pool_size", p) {
            Some(0) => {
                p.add(at("", "store_pool_size"), "must be at least 1");
                None
            }
            n => n.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        }
        .unwrap_or(DEFAULT_STORE_POOL_SIZE);

        let upstream = match &overrides.upstream {
            Some(u) => check(p, "", "--upstream", Upstream::parse(u)),
            None => read::string(&table, "", "upstream", p)
                .and_then(|u| check(p, "", "upstream", Upstream::parse(u))),
        };
        let upstream_ca = read::string(&table, "", "upstream_ca", p).map(|f| relative(base, f));

        let tls = read::table(&table, "", "tls", p).and_then(|t| {
            read::unknown_keys(t, "tls", &["cert", "key"], p);
            let file = |k: &str, p: &mut Mistakes| match read::string(t, "tls", k, p) {
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
        let usage_retention = match read::duration(&table, "", "usage_retention", p) {
            Some(d) if d < Duration::from_secs(3600) => {
                p.add(
                    at("", "usage_retention"),
                    "must be at least 1h (usage is kept by the hour)",
                );
                None
            }
            d => d,
        }
        .unwrap_or(DEFAULT_USAGE_RETENTION);

        let defaults = routes::defaults(&table, p);
        let errors = defaults.errors.unwrap_or_default();
        let routes = routes::section(&table, &defaults, upstream.as_ref(), p);

        endpoint_paths(&table, p);
        let mcp = mcp::section(&table, base, &defaults, p);
        let mcp_stdio = mcp_stdio::section(&table, &defaults, p);
        let webhooks = webhooks::section(&table, p);

        let tracing = tracing::section(&table, base, p);

        if !problems.0.is_empty() {
            return Err(ConfigError::Invalid(problems.0));
        }
        Ok(Config {
            listen: listen.expect("checked"),
            admin_listen: admin_listen.expect("checked"),
            admin_token_env,
            store: store.expect("checked"),
            store_pool_size,
            upstream,
            upstream_ca,
            tls,
            max_body,
            max_response,
            max_inflight_bytes,
            drain_timeout,
            routes,
            mcp,
            mcp_stdio,
            webhooks,
            tracing,
            usage_retention,
            errors,
        })
    }

    /// How the store is opened: `store_pool_size` connections at most.
    pub fn store_options(&self) -> oncely_store::StoreOptions {
        oncely_store::StoreOptions {
            pool_size: self.store_pool_size,
            ..oncely_store::StoreOptions::default()
        }
    }

    /// The route a ledger record names (`Record::route`), if it is configured.
    pub fn route_named(&self, name: &str) -> Option<&Route> {
        self.routes.iter().find(|r| r.name == name)
    }
}

#[cfg(test)]
mod tests {
    use oncely_core::Class;
    use oncely_tower::{KeyMode, UnitsRule};

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
    fn store_pool_size_defaults_to_16_and_must_be_at_least_one() {
        let none = Overrides::default();
        let c = Config::resolve("", None, &none).unwrap();
        assert_eq!(c.store_pool_size, DEFAULT_STORE_POOL_SIZE);
        assert_eq!(c.store_options().pool_size, 16);
        let c = Config::resolve("store_pool_size = 40\n", None, &none).unwrap();
        assert_eq!(c.store_options().pool_size, 40);
        for (text, problem) in [
            (
                "store_pool_size = 0\n",
                "store_pool_size: must be at least 1",
            ),
            (
                "store_pool_size = \"8\"\n",
                "store_pool_size: expected an integer",
            ),
        ] {
            let ps = problems(text);
            assert!(ps.iter().any(|p| p.starts_with(problem)), "{ps:?}");
        }
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
        assert_eq!(c.store, DEFAULT_STORE);
    }

    #[test]
    fn one_endpoint_per_path_over_mcp_and_webhooks() {
        let ps = problems(
            r#"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:1/mcp"
[[webhooks]]
path = "/mcp"
verify = "stripe"
secret_env = "S"
deliver_to = "http://127.0.0.1:1/x"
"#,
        );
        assert_eq!(
            ps,
            [
                "mcp[1].path: \"/mcp\" is already used by mcp[0]",
                "webhooks[0].path: \"/mcp\" is already used by mcp[0]",
            ]
        );
    }
}
