//! `oncely inventory`: the failure-boundary map.
//!
//! Reads OpenAPI 3.0/3.1 documents (JSON or YAML) and MCP servers (`tools/list` over
//! Streamable HTTP, with the tools' annotations), and the current config and ledger when
//! given. For every operation and tool it says what it is (its class, as configured or
//! else proposed), who makes its key, where its record lives, how long a result is
//! replayed, what a repeat gets and how an uncertain outcome is reconciled, and it lists
//! the gaps, each with the config lines that close it. `--write-config` writes a starting
//! config with those classes.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full};
use oncely_core::units::format_duration;
use oncely_core::{Class, State};
use oncely_http::client::error_chain;
use oncely_store::ListFilter;
use oncely_tower::KeyMode;
use serde_json::{json, Value};

use super::store::open_url;
use super::{Failure, Outcome};
use crate::config::{Config, McpEndpoint, Overrides, Route};
use oncely_store::redact_url as redact;

/// A completed call that took this long or longer is one an assistant has likely given
/// up on: such a route should be a `job`.
const SLOW: Duration = Duration::from_secs(30);

/// How long one MCP request may take.
const MCP_TIMEOUT: Duration = Duration::from_secs(10);

/// The protocol version the inventory asks an MCP server for.
const MCP_PROTOCOL: &str = "2025-11-25";

/// Words that make an operation or tool a consequential `action`.
const ACTION_WORDS: &[&str] = &["send", "pay", "order", "charge", "delete"];

/// `oncely inventory` arguments.
#[derive(Debug, Clone, Args)]
pub struct InventoryArgs {
    /// An OpenAPI 3.0 or 3.1 document, JSON or YAML (repeatable).
    #[arg(long = "openapi", value_name = "FILE")]
    pub openapi: Vec<PathBuf>,
    /// An MCP server's Streamable HTTP endpoint (repeatable).
    #[arg(long = "mcp", value_name = "URL")]
    pub mcp: Vec<String>,
    /// The current config: configured classes, keys, windows and reconciliation.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The ledger, for observed durations (default: the config's store, when it exists).
    #[arg(long, env = "ONCELY_STORE", value_name = "URL")]
    pub store: Option<String>,
    /// One JSON document on standard output.
    #[arg(long)]
    pub json: bool,
    /// Writes a starting config with these classes to FILE.
    #[arg(long, value_name = "FILE")]
    pub write_config: Option<PathBuf>,
}

/// What the inventory is about: an HTTP operation or an MCP tool.
#[derive(Debug, Clone)]
enum Target {
    Http {
        method: http::Method,
        path: String,
        /// The operation's `servers` URL, when it is a usable upstream.
        server: Option<String>,
    },
    Tool {
        name: String,
    },
}

/// One operation or tool as found, before the config is consulted.
#[derive(Debug, Clone)]
struct Found {
    /// The file or URL it came from.
    source: String,
    target: Target,
    /// What the proposal goes by: operationId, summary, path or tool name.
    words: String,
    read_only_hint: bool,
    destructive_hint: bool,
}

/// A gap and the config lines that close it.
#[derive(Debug, Clone)]
struct Gap {
    kind: &'static str,
    detail: String,
    fix: String,
}

/// One line of the map.
#[derive(Debug, Clone)]
struct Entry {
    found: Found,
    class: Class,
    configured: bool,
    key: Option<String>,
    store: Option<String>,
    window: Option<Duration>,
    replay: String,
    reconcile: Option<String>,
    gaps: Vec<Gap>,
}

/// Runs `oncely inventory`.
pub(crate) async fn run(args: InventoryArgs) -> Outcome {
    if args.openapi.is_empty() && args.mcp.is_empty() {
        return Err(Failure::usage(
            "inventory needs at least one --openapi FILE or --mcp URL",
        ));
    }
    let config = match &args.config {
        Some(path) => Some(
            Config::load(path, &Overrides::default())
                .map_err(|e| Failure::usage(format!("config {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let mut found = Vec::new();
    for path in &args.openapi {
        found.extend(
            read_openapi(path)
                .map_err(|e| Failure::usage(format!("--openapi {}: {e}", path.display())))?,
        );
    }
    for url in &args.mcp {
        found.extend(
            list_tools(url)
                .await
                .map_err(|e| Failure::usage(format!("--mcp {url}: {e}")))?,
        );
    }
    let durations = observed_durations(args.store.as_deref(), config.as_ref()).await?;
    let entries: Vec<Entry> = found
        .into_iter()
        .map(|f| assess(f, config.as_ref(), &durations))
        .collect();
    if let Some(path) = &args.write_config {
        let text = starting_config(&entries, config.as_ref());
        std::fs::write(path, text)
            .map_err(|e| Failure::usage(format!("cannot write {}: {e}", path.display())))?;
    }
    if args.json {
        println!("{}", to_json(&entries));
    } else {
        print_table(&entries);
        if let Some(path) = &args.write_config {
            println!("\nwrote a starting config to {}", path.display());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// OpenAPI

/// The operations of one OpenAPI 3.x document.
fn read_openapi(path: &Path) -> Result<Vec<Found>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    let doc: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).map_err(|e| format!("not valid JSON: {e}"))?
    } else {
        serde_yaml_ng::from_str(&text).map_err(|e| format!("not valid YAML: {e}"))?
    };
    match doc.get("openapi").and_then(Value::as_str) {
        Some(v) if v.starts_with("3.") => {}
        Some(v) => return Err(format!("OpenAPI {v} is not supported (use 3.0 or 3.1)")),
        None if doc.get("swagger").is_some() => {
            return Err("Swagger 2.0 is not supported: convert it to OpenAPI 3".into())
        }
        None => return Err("not an OpenAPI document (no `openapi: 3.x`)".into()),
    }
    let server = |v: &Value| -> Option<String> {
        let url = v.get("servers")?.get(0)?.get("url")?.as_str()?;
        let usable = (url.starts_with("http://") || url.starts_with("https://"))
            && !url.contains('{')
            && crate::config::Upstream::parse(url).is_ok();
        usable.then(|| url.trim_end_matches('/').to_owned())
    };
    let doc_server = server(&doc);
    let mut out = Vec::new();
    let Some(paths) = doc.get("paths") else {
        return Ok(out);
    };
    let paths = paths
        .as_object()
        .ok_or("`paths` is not a map of paths to operations")?;
    for (p, item) in paths {
        if !p.starts_with('/') {
            return Err(format!("path {p:?} does not start with \"/\""));
        }
        let Some(item) = item.as_object() else {
            continue;
        };
        let path_server = server(&Value::Object(item.clone())).or_else(|| doc_server.clone());
        for m in [
            "get", "put", "post", "delete", "options", "head", "patch", "trace",
        ] {
            let Some(op) = item.get(m) else { continue };
            let text = |k: &str| op.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
            let method = http::Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .expect("a standard method");
            out.push(Found {
                source: path.display().to_string(),
                target: Target::Http {
                    method,
                    path: p.clone(),
                    server: server(op).or_else(|| path_server.clone()),
                },
                words: format!("{} {} {p}", text("operationId"), text("summary")),
                read_only_hint: false,
                destructive_hint: false,
            });
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// MCP

/// The tools of one MCP server: initialize, notifications/initialized, then tools/list
/// (every page), over Streamable HTTP with JSON or event-stream answers.
async fn list_tools(url: &str) -> Result<Vec<Found>, String> {
    let uri: http::Uri = url.parse().map_err(|_| "not a URL".to_owned())?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err("not an http:// or https:// URL".into());
    }
    let client = oncely_http::client::upstream_client_or_warn(&Default::default());
    let mut session = McpSession {
        client,
        url: url.to_owned(),
        id: None,
        protocol: None,
    };
    let init = session
        .request(
            1,
            "initialize",
            json!({
                "protocolVersion": MCP_PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "oncely-inventory", "version": env!("CARGO_PKG_VERSION")},
            }),
        )
        .await?;
    session.protocol = init
        .get("protocolVersion")
        .and_then(Value::as_str)
        .map(str::to_owned);
    session
        .notify("notifications/initialized", json!({}))
        .await?;
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0..100 {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let result = session.request(2 + page, "tools/list", params).await?;
        let list = result
            .get("tools")
            .and_then(Value::as_array)
            .ok_or("tools/list answered without a `tools` list")?;
        for t in list {
            let Some(name) = t.get("name").and_then(Value::as_str) else {
                continue;
            };
            let hint = |h: &str| {
                t.pointer(&format!("/annotations/{h}"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
            };
            tools.push(Found {
                source: url.to_owned(),
                target: Target::Tool {
                    name: name.to_owned(),
                },
                words: format!(
                    "{name} {}",
                    t.pointer("/annotations/title")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                ),
                read_only_hint: hint("readOnlyHint"),
                destructive_hint: hint("destructiveHint"),
            });
        }
        cursor = result
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    session.end().await;
    Ok(tools)
}

/// One MCP session, as a client.
struct McpSession {
    client: oncely_http::client::PooledClient<Full<Bytes>>,
    url: String,
    id: Option<String>,
    protocol: Option<String>,
}

impl McpSession {
    fn post(&self, message: &Value) -> http::Request<Full<Bytes>> {
        let mut req = http::Request::post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(id) = &self.id {
            req = req.header("mcp-session-id", id);
        }
        if let Some(p) = &self.protocol {
            req = req.header("mcp-protocol-version", p);
        }
        req.body(Full::new(Bytes::from(message.to_string())))
            .expect("a valid request")
    }

    /// Sends a request and returns its result (an error answer is an error).
    async fn request(&mut self, id: i64, method: &str, params: Value) -> Result<Value, String> {
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let req = self.post(&message);
        let answer = tokio::time::timeout(MCP_TIMEOUT, async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| format!("unreachable: {}", error_chain(&e)))?;
            if !resp.status().is_success() {
                return Err(format!("{method}: HTTP {}", resp.status()));
            }
            if let Some(s) = resp.headers().get("mcp-session-id") {
                if let Ok(s) = s.to_str() {
                    self.id = Some(s.to_owned());
                }
            }
            let sse = resp
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let mut body = resp.into_body();
            if sse {
                // The stream may stay open after the answer: stop at the answer.
                let mut parser = oncely_mcp::sse::Parser::new(16 << 20);
                while let Some(frame) = body.frame().await {
                    let frame = frame.map_err(|e| format!("{method}: {e}"))?;
                    let Some(chunk) = frame.data_ref() else {
                        continue;
                    };
                    for event in parser.feed(chunk) {
                        if let Ok(v) = serde_json::from_str::<Value>(&event.data) {
                            if v.get("id") == Some(&json!(id)) {
                                return Ok(v);
                            }
                        }
                    }
                }
                Err(format!(
                    "{method}: the event stream ended without an answer"
                ))
            } else {
                let bytes = body
                    .collect()
                    .await
                    .map_err(|e| format!("{method}: {e}"))?
                    .to_bytes();
                serde_json::from_slice::<Value>(&bytes)
                    .map_err(|e| format!("{method}: the answer is not JSON: {e}"))
            }
        })
        .await
        .map_err(|_| {
            format!(
                "{method}: no answer within {}",
                format_duration(MCP_TIMEOUT)
            )
        })??;
        if let Some(e) = answer.get("error") {
            return Err(format!(
                "{method}: error {}: {}",
                e.get("code").unwrap_or(&Value::Null),
                e.get("message").and_then(Value::as_str).unwrap_or("")
            ));
        }
        answer
            .get("result")
            .cloned()
            .ok_or_else(|| format!("{method}: the answer has no result"))
    }

    async fn notify(&mut self, method: &str, params: Value) -> Result<(), String> {
        let req = self.post(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
        let resp = tokio::time::timeout(MCP_TIMEOUT, self.client.request(req))
            .await
            .map_err(|_| format!("{method}: no answer"))?
            .map_err(|e| format!("unreachable: {}", error_chain(&e)))?;
        if !resp.status().is_success() {
            return Err(format!("{method}: HTTP {}", resp.status()));
        }
        Ok(())
    }

    /// Ends the session (best effort: a server may not support it).
    async fn end(&self) {
        let Some(id) = &self.id else { return };
        let Ok(req) = http::Request::delete(&self.url)
            .header("mcp-session-id", id)
            .body(Full::new(Bytes::new()))
        else {
            return;
        };
        let _ = tokio::time::timeout(MCP_TIMEOUT, self.client.request(req)).await;
    }
}

// ---------------------------------------------------------------------------------------
// The ledger

/// Observed durations of completed first attempts, by route name. The ledger is read
/// when `--store`/`ONCELY_STORE` names it, or when the config's store exists already
/// (the inventory never creates a ledger by looking for one).
async fn observed_durations(
    store: Option<&str>,
    config: Option<&Config>,
) -> Result<HashMap<String, Vec<Duration>>, Failure> {
    let url = match (store, config) {
        (Some(url), _) => {
            if let Some(p) = url.strip_prefix("sqlite://") {
                if !p.is_empty() && !Path::new(p).exists() {
                    return Err(Failure::usage(format!("no ledger at {url}")));
                }
            }
            url.to_owned()
        }
        (None, Some(c)) => match c.store.strip_prefix("sqlite://") {
            Some(p) if !Path::new(p).exists() => return Ok(HashMap::new()),
            _ => c.store.clone(),
        },
        (None, None) => return Ok(HashMap::new()),
    };
    let store = open_url(&url).await?;
    let records = store
        .list(&ListFilter {
            state: Some(State::Completed),
            limit: Some(100_000),
            ..ListFilter::default()
        })
        .await
        .map_err(|e| Failure::usage(format!("store {}: {e}", redact(&url))))?;
    let mut out: HashMap<String, Vec<Duration>> = HashMap::new();
    for r in records {
        // A re-executed record's creation time is its first attempt's: only first
        // attempts measure one call.
        let Some(done) = r.completed_at else { continue };
        if r.attempt != 1 {
            continue;
        }
        let ms = done.millis().saturating_sub(r.created_at.millis()).max(0) as u64;
        out.entry(r.route)
            .or_default()
            .push(Duration::from_millis(ms));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Classes and gaps

/// The class proposed for an operation or tool that no config classes.
fn propose(f: &Found) -> Class {
    match &f.target {
        Target::Http { method, .. } => {
            if matches!(
                *method,
                http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
            ) {
                Class::Read
            } else if says_action(&f.words) {
                Class::Action
            } else {
                Class::Write
            }
        }
        Target::Tool { .. } => {
            if f.read_only_hint {
                Class::Read
            } else if f.destructive_hint || says_action(&f.words) {
                Class::Action
            } else {
                Class::Write
            }
        }
    }
}

/// Whether the words name a consequential action: `sendInvoice`, `place_order`,
/// `/payments`, "Delete a pet" (whole words, camelCase split, simple inflections).
fn says_action(text: &str) -> bool {
    words(text).iter().any(|w| {
        ACTION_WORDS.iter().any(|a| {
            w.strip_prefix(a).is_some_and(|rest| {
                matches!(
                    rest,
                    "" | "s" | "es" | "d" | "ed" | "ing" | "ment" | "ments"
                )
            })
        })
    })
}

/// Lower-case words: split at anything not a letter or digit, and at camelCase humps.
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut prev_lower = false;
    for c in text.chars() {
        if !c.is_alphanumeric() {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower && !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        word.extend(c.to_lowercase());
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// The tool selection of an `[[mcp]]` entry's `tools`, as the endpoint reads it.
fn selection(tools: &[String]) -> Option<oncely_mcp::ToolSelection> {
    oncely_mcp::McpConfig::new("/mcp", "http://127.0.0.1/mcp")
        .and_then(|c| c.with_tools(tools))
        .ok()
        .map(|c| c.tools)
}

/// A concrete path an OpenAPI template stands for (`{id}` → a segment), to match
/// against route patterns.
fn sample_path(template: &str) -> String {
    let mut out = String::new();
    let mut in_param = false;
    for c in template.chars() {
        match c {
            '{' => in_param = true,
            '}' if in_param => {
                in_param = false;
                out.push_str("x1");
            }
            _ if in_param => {}
            c => out.push(c),
        }
    }
    out
}

/// A route pattern for an OpenAPI path template: `{name}` kept where oncely's patterns
/// take it, a segment that mixes text and parameters becomes a parameter of its own.
fn route_pattern(template: &str) -> String {
    let mut names: Vec<String> = Vec::new();
    let segments: Vec<String> = template
        .split('/')
        .enumerate()
        .map(|(i, seg)| {
            if !seg.contains(['{', '}']) {
                return seg.to_owned();
            }
            let inner = seg
                .strip_prefix('{')
                .and_then(|s| s.strip_suffix('}'))
                .filter(|s| !s.contains(['{', '}']));
            let mut name: String = match inner {
                Some(n) => n
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect(),
                None => format!("segment{i}"),
            };
            if name.is_empty() || names.contains(&name) {
                name = format!("{name}_{i}");
            }
            names.push(name.clone());
            format!("{{{name}}}")
        })
        .collect();
    segments.join("/")
}

fn configured_route<'a>(config: Option<&'a Config>, f: &Found) -> Option<&'a Route> {
    let Target::Http { method, path, .. } = &f.target else {
        return None;
    };
    let sample = sample_path(path);
    config?
        .routes
        .iter()
        .find(|r| r.method.matches(method) && r.path.matches(&sample))
}

fn configured_mcp<'a>(config: Option<&'a Config>, source: &str) -> Option<&'a McpEndpoint> {
    let norm = |u: &str| u.trim_end_matches('/').to_ascii_lowercase();
    config?
        .mcp
        .iter()
        .find(|m| norm(&m.upstream.to_string()) == norm(source))
}

fn key_name(k: KeyMode) -> &'static str {
    match k {
        KeyMode::Header => "header",
        KeyMode::Fingerprint => "fingerprint",
        KeyMode::HeaderOrFingerprint => "header-or-fingerprint",
        KeyMode::None => "none",
    }
}

fn replay_of(class: Class, guarded: bool) -> String {
    match (class, guarded) {
        (Class::Read, _) => "forwarded again (a read repeats harmlessly)".into(),
        (_, false) => "executes again".into(),
        (Class::Job, true) => {
            "the job: 202 with its id while it runs, then its stored response".into()
        }
        (Class::Action, true) => {
            "the stored first response; after an uncertain outcome, 409 until reconciled".into()
        }
        (_, true) => "the stored first response".into(),
    }
}

/// The fix for an unguarded HTTP operation: a route of its own.
fn route_lines(method: &http::Method, path: &str, class: Class) -> String {
    format!(
        "[[routes]]\nmethod = \"{method}\"\npath = {}\nclass = \"{}\"",
        toml_string(&route_pattern(path)),
        class.as_str()
    )
}

/// A reconcile line to adapt: a lookup by key under the operation's first segments.
fn reconcile_suggestion(path: &str) -> String {
    let base: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .take_while(|s| !s.contains('{'))
        .collect();
    format!("reconcile = \"GET /{}?reference={{key}}\"", base.join("/"))
}

fn assess(f: Found, config: Option<&Config>, durations: &HashMap<String, Vec<Duration>>) -> Entry {
    let proposed = propose(&f);
    let store = config.map(|c| redact(&c.store));
    match &f.target {
        Target::Http { method, path, .. } => {
            if let Some(route) = configured_route(config, &f) {
                let class = route.class;
                let guarded = class != Class::Read && route.key != KeyMode::None;
                let mut gaps = Vec::new();
                let at = format!("(in the route {})", route.name);
                if class == Class::Action && route.reconcile.is_none() {
                    gaps.push(Gap {
                        kind: "no_reconcile",
                        detail:
                            "an action with no reconcile: an uncertain outcome waits for a person"
                                .into(),
                        fix: format!(
                            "{}  # {at}: a lookup by key your upstream answers",
                            reconcile_suggestion(path)
                        ),
                    });
                }
                // A route configured `read` is a read by its owner's word; only a
                // non-read route that keys nothing leaves its operation unguarded.
                if !guarded && class != Class::Read {
                    gaps.push(Gap {
                        kind: "unguarded",
                        detail: format!(
                            "{} route with key = \"none\": a retry executes it again",
                            a(class)
                        ),
                        fix: format!("key = \"header-or-fingerprint\"  # {at}"),
                    });
                }
                if class != Class::Job && class != Class::Read {
                    if let Some(slow) = durations.get(&route.name).and_then(|d| {
                        let n = d.iter().filter(|d| **d >= SLOW).count();
                        (n > 0).then(|| (n, d.len(), d.iter().max().copied().unwrap_or_default()))
                    }) {
                        let (n, total, max) = slow;
                        gaps.push(Gap {
                            kind: "slow_not_job",
                            detail: format!(
                                "{n} of {total} completed calls took {} or longer (the longest {}s): assistants give up before the answer",
                                format_duration(SLOW),
                                max.as_secs()
                            ),
                            fix: format!("class = \"job\"  # {at}"),
                        });
                    }
                }
                Entry {
                    class,
                    configured: true,
                    key: guarded.then(|| key_name(route.key).to_owned()),
                    store: if guarded { store } else { None },
                    window: guarded.then_some(route.window),
                    replay: replay_of(class, guarded),
                    reconcile: reconcile_text(
                        class,
                        guarded,
                        route.reconcile.as_ref().map(|r| {
                            format!(
                                "{} {} after {}",
                                r.method,
                                r.target,
                                format_duration(route.reconcile_after)
                            )
                        }),
                    ),
                    gaps,
                    found: f,
                }
            } else {
                let mut gaps = Vec::new();
                if proposed != Class::Read {
                    gaps.push(Gap {
                        kind: "unguarded",
                        detail: format!(
                            "{} operation no route guards: a retry executes it again",
                            a(proposed)
                        ),
                        fix: route_lines(method, path, proposed),
                    });
                }
                if proposed == Class::Action {
                    gaps.push(Gap {
                        kind: "no_reconcile",
                        detail:
                            "an action with no reconcile: an uncertain outcome waits for a person"
                                .into(),
                        fix: format!(
                            "{}  # a lookup by key your upstream answers",
                            reconcile_suggestion(path)
                        ),
                    });
                }
                Entry {
                    class: proposed,
                    configured: false,
                    key: None,
                    store: None,
                    window: None,
                    replay: replay_of(proposed, false),
                    reconcile: reconcile_text(proposed, false, None),
                    gaps,
                    found: f,
                }
            }
        }
        Target::Tool { name } => {
            let endpoint = configured_mcp(config, &f.source);
            // The endpoint's own rule (oncely_mcp::config), not a copy of it.
            let guarded = endpoint.is_some_and(|m| {
                selection(&m.tools).is_some_and(|s| s.guards(name, f.read_only_hint))
            });
            let (class, configured) = match endpoint {
                Some(m) if guarded => (
                    if oncely_mcp::config::any_matches(&m.actions, name) {
                        Class::Action
                    } else {
                        Class::Write
                    },
                    true,
                ),
                Some(_) if f.read_only_hint => (Class::Read, true),
                _ => (proposed, false),
            };
            let mut gaps = Vec::new();
            if !guarded && class != Class::Read {
                let fix = match endpoint {
                    Some(m) => {
                        let mut tools = m.tools.clone();
                        tools.push(name.clone());
                        let mut lines = format!("tools = {}", toml_list(&tools));
                        if class == Class::Action {
                            let mut actions = m.actions.clone();
                            actions.push(name.clone());
                            lines.push_str(&format!("\nactions = {}", toml_list(&actions)));
                        }
                        format!("{lines}  # (in the [[mcp]] of {})", m.upstream)
                    }
                    None => mcp_lines(
                        &f.source,
                        "/mcp",
                        &[name.clone()]
                            .into_iter()
                            .filter(|_| class == Class::Action)
                            .collect::<Vec<_>>(),
                    ),
                };
                gaps.push(Gap {
                    kind: "unguarded",
                    detail: format!(
                        "{} tool no [[mcp]] guards: a retried call executes it again",
                        a(class)
                    ),
                    fix,
                });
            }
            let window = endpoint.filter(|_| guarded).map(|m| m.window);
            Entry {
                class,
                configured,
                key: guarded.then(|| "fingerprint".to_owned()),
                store: if guarded { store } else { None },
                window,
                replay: replay_of(class, guarded),
                reconcile: reconcile_text(class, guarded, None),
                gaps,
                found: f,
            }
        }
    }
}

fn reconcile_text(class: Class, guarded: bool, configured: Option<String>) -> Option<String> {
    match (class, guarded) {
        (Class::Read, _) => None,
        (_, false) => Some("none: nothing is recorded".into()),
        (Class::Action, true) => Some(configured.unwrap_or_else(|| {
            "by hand: oncely ledger resolve ID (outcome_unknown until then)".into()
        })),
        (_, true) => Some("released: a retry executes again with the same downstream key".into()),
    }
}

/// "a write", "an action".
fn a(class: Class) -> String {
    match class {
        Class::Action => "an action".into(),
        c => format!("a {}", c.as_str()),
    }
}

fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| toml_string(s)).collect();
    format!("[{}]", quoted.join(", "))
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

fn mcp_lines(upstream: &str, path: &str, actions: &[String]) -> String {
    let mut lines = format!(
        "[[mcp]]\npath = {}\nupstream = {}\ntools = [\"*\"]",
        toml_string(path),
        toml_string(upstream)
    );
    if !actions.is_empty() {
        lines.push_str(&format!("\nactions = {}", toml_list(actions)));
    }
    lines
}

// ---------------------------------------------------------------------------------------
// Output

fn to_json(entries: &[Entry]) -> Value {
    let ops: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut o = serde_json::Map::new();
            o.insert("source".into(), json!(e.found.source));
            match &e.found.target {
                Target::Http { method, path, .. } => {
                    o.insert("method".into(), json!(method.as_str()));
                    o.insert("path".into(), json!(path));
                }
                Target::Tool { name } => {
                    o.insert("method".into(), json!("tools/call"));
                    o.insert("tool".into(), json!(name));
                }
            }
            o.insert("class".into(), json!(e.class.as_str()));
            o.insert("configured".into(), json!(e.configured));
            o.insert("key".into(), json!(e.key));
            o.insert("window".into(), json!(e.window.map(format_duration)));
            o.insert("replay".into(), json!(e.replay));
            o.insert("reconcile".into(), json!(e.reconcile));
            let gaps: Vec<Value> = e
                .gaps
                .iter()
                .map(|g| json!({"gap": g.kind, "detail": g.detail, "fix": g.fix}))
                .collect();
            o.insert("gaps".into(), Value::Array(gaps));
            Value::Object(o)
        })
        .collect();
    json!({ "operations": ops })
}

fn print_table(entries: &[Entry]) {
    let name = |e: &Entry| match &e.found.target {
        Target::Http { method, path, .. } => format!("{method} {path}"),
        Target::Tool { name } => format!("tool {name}"),
    };
    let rows: Vec<[String; 7]> = entries
        .iter()
        .map(|e| {
            [
                name(e),
                if e.configured {
                    e.class.as_str().to_owned()
                } else {
                    format!("{} (proposed)", e.class.as_str())
                },
                e.key.clone().unwrap_or_else(|| "-".into()),
                e.store.clone().unwrap_or_else(|| "-".into()),
                e.window.map(format_duration).unwrap_or_else(|| "-".into()),
                e.replay.clone(),
                e.reconcile.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let header = [
        "OPERATION",
        "CLASS",
        "KEY",
        "RECORD IN",
        "WINDOW",
        "A REPEAT GETS",
        "UNCERTAIN OUTCOME",
    ];
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  "));
            }
        }
        println!("{}", out.trim_end());
    };
    let mut by_source: BTreeMap<usize, (&str, Vec<usize>)> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let s = e.found.source.as_str();
        let pos = order.iter().position(|o| *o == s).unwrap_or_else(|| {
            order.push(s);
            order.len() - 1
        });
        by_source.entry(pos).or_insert((s, Vec::new())).1.push(i);
    }
    for (n, (_, (source, idx))) in by_source.iter().enumerate() {
        if n > 0 {
            println!();
        }
        println!("{source}");
        line(header.to_vec());
        for &i in idx {
            line(rows[i].iter().map(String::as_str).collect());
        }
    }
    let gaps: usize = entries.iter().map(|e| e.gaps.len()).sum();
    println!();
    if gaps == 0 {
        println!("no gaps");
        return;
    }
    println!("{gaps} gap(s), each with the config lines that close it:");
    for e in entries {
        for g in &e.gaps {
            println!("\n- {} ({}): {}", name(e), g.kind, g.detail);
            for l in g.fix.lines() {
                println!("    {l}");
            }
        }
    }
}

/// A starting config: one route per non-read operation, one `[[mcp]]` per MCP server,
/// with the classes above. Reads get no route (an unmatched request is forwarded).
fn starting_config(entries: &[Entry], config: Option<&Config>) -> String {
    let mut out = String::from(
        "# A starting config written by `oncely inventory`. Classes not taken from a config\n\
         # were proposed from methods, annotations and names: review each before use.\n",
    );
    if let Some(c) = config {
        out.push_str(&format!("store = {}\n", toml_string(&c.store)));
    }
    // Routes whose document names no usable server go to the default upstream.
    let needs_default = entries.iter().any(|e| {
        matches!(&e.found.target, Target::Http { server: None, .. }) && e.class != Class::Read
    });
    if needs_default {
        match config.and_then(|c| c.upstream.as_ref()) {
            Some(u) => out.push_str(&format!("upstream = {}\n", toml_string(&u.to_string()))),
            None => out.push_str(
                "upstream = \"http://127.0.0.1:3000\"  # where your API listens: adapt\n",
            ),
        }
    }
    let mut seen = std::collections::HashSet::new();
    for e in entries {
        let Target::Http {
            method,
            path,
            server,
        } = &e.found.target
        else {
            continue;
        };
        if e.class == Class::Read || !seen.insert((method.clone(), route_pattern(path))) {
            continue;
        }
        out.push_str(&format!(
            "\n# {} {} ({})\n{}\n",
            method,
            path.replace(['\n', '\r'], " "),
            e.found.source.replace(['\n', '\r'], " "),
            route_lines(method, path, e.class)
        ));
        if let Some(s) = server {
            out.push_str(&format!("upstream = {}\n", toml_string(s)));
        }
        if e.class == Class::Action {
            let configured = configured_route(config, &e.found).and_then(|r| r.reconcile.as_ref());
            match configured {
                Some(r) => out.push_str(&format!(
                    "reconcile = {}\n",
                    toml_string(&format!("{} {}", r.method, r.target))
                )),
                None => out.push_str(&format!(
                    "# {}  # how to ask the upstream whether it happened: adapt, then uncomment\n",
                    reconcile_suggestion(path)
                )),
            }
        }
    }
    let mut servers: Vec<&str> = Vec::new();
    for e in entries {
        if matches!(e.found.target, Target::Tool { .. })
            && !servers.contains(&e.found.source.as_str())
        {
            servers.push(&e.found.source);
        }
    }
    for (i, source) in servers.iter().enumerate() {
        let actions: Vec<String> = entries
            .iter()
            .filter(|e| e.found.source == *source && e.class == Class::Action)
            .filter_map(|e| match &e.found.target {
                Target::Tool { name } => Some(name.clone()),
                Target::Http { .. } => None,
            })
            .collect();
        let path = if i == 0 {
            "/mcp".to_owned()
        } else {
            format!("/mcp{}", i + 1)
        };
        out.push_str(&format!("\n{}\n", mcp_lines(source, &path, &actions)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_words_are_whole_words_in_any_case_style() {
        for yes in [
            "deletePet",
            "place_order",
            "Send an invoice",
            "/v1/payments",
            "charges",
            "POST /orders",
        ] {
            assert!(says_action(yes), "{yes}");
        }
        for no in [
            "payload",
            "sender_name",
            "reorder",
            "addPet",
            "perform-search",
            "put-square",
        ] {
            assert!(!says_action(no), "{no}");
        }
    }

    #[test]
    fn templates_become_route_patterns_that_match_their_samples() {
        assert_eq!(route_pattern("/pets/{id}"), "/pets/{id}");
        assert_eq!(route_pattern("/a/{x.y}/b"), "/a/{x_y}/b");
        assert_eq!(route_pattern("/f/{name}.json"), "/f/{segment2}");
        for t in ["/pets/{id}", "/board/{row}/{column}", "/f/{name}.json", "/"] {
            let p = crate::config::PathPattern::parse(&route_pattern(t)).unwrap();
            assert!(p.matches(&sample_path(t)), "{t}");
        }
    }

    #[test]
    fn tools_are_selected_by_the_endpoints_rule() {
        let all = selection(&["*".into()]).unwrap();
        assert!(all.guards("send_invoice", false));
        assert!(!all.guards("balance", true));
        let named = selection(&["render".into()]).unwrap();
        assert!(named.guards("render", false));
        assert!(!named.guards("other", false));
        assert!(oncely_mcp::config::any_matches(
            &["send_*".into()],
            "send_invoice"
        ));
        assert!(!oncely_mcp::config::any_matches(
            &["send_*".into()],
            "resend_x"
        ));
    }
}
