//! Classes and gaps: the class proposed for what no config classes (from methods,
//! annotations and names), what the config says of the rest, the gaps (unguarded, no
//! reconcile, slow but not a job, a new key asked for with every request) and the config
//! lines that close each.

use std::collections::HashMap;
use std::time::Duration;

use oncely_core::units::format_duration;
use oncely_core::Class;
use oncely_store::redact_url as redact;
use oncely_tower::KeyMode;

use super::keys::{self, Place};
use super::model::{Entry, Found, Gap, Target, Transport};
use super::shell;
use super::words::words;
use crate::config::{Config, McpEntry, Route};

/// A completed call that took this long or longer is one an assistant has likely given
/// up on: such a route should be a `job`.
const SLOW: Duration = Duration::from_secs(30);

/// Words that make an operation or tool a consequential `action`.
const ACTION_WORDS: &[&str] = &["send", "pay", "order", "charge", "delete"];

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
pub(super) fn route_pattern(template: &str) -> String {
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

pub(super) fn configured_route<'a>(config: Option<&'a Config>, f: &Found) -> Option<&'a Route> {
    let Target::Http { method, path, .. } = &f.target else {
        return None;
    };
    let sample = sample_path(path);
    config?
        .routes
        .iter()
        .find(|r| r.method.matches(method) && r.path.matches(&sample))
}

fn configured_mcp<'a>(config: Option<&'a Config>, source: &str) -> Option<&'a McpEntry> {
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
pub(super) fn route_lines(method: &http::Method, path: &str, class: Class) -> String {
    format!(
        "[[routes]]\nmethod = \"{method}\"\npath = {}\nclass = \"{}\"",
        toml_string(&route_pattern(path)),
        class.as_str()
    )
}

/// A reconcile line to adapt: a lookup by key under the operation's first segments.
pub(super) fn reconcile_suggestion(path: &str) -> String {
    let base: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .take_while(|s| !s.contains('{'))
        .collect();
    format!("reconcile = \"GET /{}?reference={{key}}\"", base.join("/"))
}

pub(super) fn assess(
    f: Found,
    config: Option<&Config>,
    durations: &HashMap<String, Vec<Duration>>,
) -> Entry {
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
                gaps.extend(keys::operation_gap(&f, Some(route)));
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
                    key_arguments: Vec::new(),
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
                gaps.extend(keys::operation_gap(&f, None));
                Entry {
                    class: proposed,
                    configured: false,
                    key: None,
                    store: None,
                    window: None,
                    replay: replay_of(proposed, false),
                    reconcile: reconcile_text(proposed, false, None),
                    gaps,
                    key_arguments: Vec::new(),
                    found: f,
                }
            }
        }
        Target::Tool { name, transport } => {
            // What guards the server's tools: an `[[mcp]]` entry in front of an HTTP
            // server; for a stdio server (started by the host, not reached at a URL),
            // the `oncely mcp` line it is started with, when it is.
            let guard = match transport {
                Transport::Http => configured_mcp(config, &f.source).map(ToolGuard::of_entry),
                Transport::Stdio => ToolGuard::of_wrapper(&f.source),
            };
            // The endpoint's own rule (oncely_mcp::config), not a copy of it.
            let guarded = guard.as_ref().is_some_and(|g| {
                selection(&g.tools).is_some_and(|s| s.guards(name, f.read_only_hint))
            });
            let (class, configured) = match &guard {
                Some(g) if guarded => (
                    if oncely_mcp::config::any_matches(&g.actions, name) {
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
                let own_action: Vec<String> = [name.clone()]
                    .into_iter()
                    .filter(|_| class == Class::Action)
                    .collect();
                let endpoint = match transport {
                    Transport::Http => configured_mcp(config, &f.source),
                    Transport::Stdio => None,
                };
                let (detail, fix) = match (transport, endpoint) {
                    // Already wrapped: the line lacks the tool.
                    (Transport::Stdio, _) if guard.is_some() => (
                        format!(
                            "{} tool the `oncely mcp` line does not guard: a retried call executes it again",
                            a(class)
                        ),
                        format!(
                            "add `--tool {name}`{} to the `oncely mcp` line (before its `--`)",
                            if class == Class::Action {
                                format!(" and `--action {name}`")
                            } else {
                                String::new()
                            }
                        ),
                    ),
                    (Transport::Stdio, _) => (
                        format!(
                            "{} tool of a stdio server: unless `oncely mcp` wraps the server, a retried call executes it again",
                            a(class)
                        ),
                        wrapper_fix(&f.source, &own_action),
                    ),
                    (Transport::Http, Some(m)) => {
                        let mut tools = m.tools.clone();
                        tools.push(name.clone());
                        let mut lines = format!("tools = {}", toml_list(&tools));
                        if class == Class::Action {
                            let mut actions = m.actions.clone();
                            actions.push(name.clone());
                            lines.push_str(&format!("\nactions = {}", toml_list(&actions)));
                        }
                        (
                            http_detail(class),
                            format!("{lines}  # (in the [[mcp]] of {})", m.upstream),
                        )
                    }
                    (Transport::Http, None) => {
                        (http_detail(class), mcp_lines(&f.source, "/mcp", &own_action))
                    }
                };
                gaps.push(Gap {
                    kind: "unguarded",
                    detail,
                    fix,
                });
            }
            // The key arguments: the wrapper line's, the [[mcp]]'s, else [mcp_stdio]'s.
            let setting = match (transport, guard.as_ref().and_then(|g| g.keys.clone())) {
                (_, Some(k)) => k,
                (Transport::Stdio, None) => keys::stdio_default(config),
                (Transport::Http, None) => Default::default(),
            };
            let key_arguments = keys::of_tool(name, f.input_schema.as_ref(), &setting, guarded);
            let place = match transport {
                Transport::Http => Place::Mcp(configured_mcp(config, &f.source)),
                Transport::Stdio => Place::Stdio,
            };
            gaps.extend(keys::tool_gap(
                name,
                &f,
                &key_arguments,
                guarded,
                class,
                place,
            ));
            let window = guard.filter(|_| guarded).map(|g| g.window);
            Entry {
                class,
                configured,
                key: guarded.then(|| "fingerprint".to_owned()),
                store: if guarded { store } else { None },
                window,
                replay: replay_of(class, guarded),
                reconcile: reconcile_text(class, guarded, None),
                gaps,
                key_arguments,
                found: f,
            }
        }
    }
}

/// What guards an MCP server's tools: its tools and actions, the replay window, and its
/// key arguments when it says (an `oncely mcp` line says only with `--key-argument`).
struct ToolGuard {
    tools: Vec<String>,
    actions: Vec<String>,
    window: Duration,
    keys: Option<oncely_mcp::KeyArguments>,
}

impl ToolGuard {
    /// An `[[mcp]]` entry's.
    fn of_entry(m: &McpEntry) -> ToolGuard {
        ToolGuard {
            tools: m.tools.clone(),
            actions: m.actions.clone(),
            window: m.window,
            keys: Some(m.key_arguments.clone()),
        }
    }

    /// The `oncely mcp` line `command` is, read by that command's own parser, when it is
    /// one (`oncely mcp [OPTIONS] -- SERVER...`): its `--tool`s (else every tool not
    /// marked read-only), `--action`s, `--window` and `--key-argument`s (its `--config`
    /// is not read).
    fn of_wrapper(command: &str) -> Option<ToolGuard> {
        #[derive(clap::Parser)]
        struct Wrapper {
            #[command(flatten)]
            args: crate::cli::mcp_stdio::McpArgs,
        }
        let words = shell::split(command).ok()?;
        let (program, rest) = words.split_first()?;
        let is_oncely = std::path::Path::new(program)
            .file_stem()
            .is_some_and(|s| s == "oncely");
        if !is_oncely || rest.first().map(String::as_str) != Some("mcp") {
            return None;
        }
        let args = <Wrapper as clap::Parser>::try_parse_from(
            std::iter::once("oncely mcp").chain(rest[1..].iter().map(String::as_str)),
        )
        .ok()?
        .args;
        Some(ToolGuard {
            tools: if args.tools.is_empty() {
                vec!["*".into()]
            } else {
                args.tools
            },
            actions: args.actions,
            window: args.window.unwrap_or(Duration::from_secs(3 * 3600)),
            keys: (!args.key_arguments.is_empty())
                .then(|| oncely_mcp::KeyArguments::parse(&args.key_arguments).ok())
                .flatten(),
        })
    }
}

fn http_detail(class: Class) -> String {
    format!(
        "{} tool no [[mcp]] guards: a retried call executes it again",
        a(class)
    )
}

/// What an assistant host runs instead of the stdio server `command` (as given) to guard
/// its tools, `actions` of class action: `oncely mcp [--action NAME]... -- COMMAND`.
pub(super) fn wrapper_line(command: &str, actions: &[String]) -> String {
    format!("{} {}", wrapper_prefix(actions), command.trim())
}

/// `oncely mcp [--action NAME]... --`: what goes before a stdio server's command.
fn wrapper_prefix(actions: &[String]) -> String {
    let mut line = String::from("oncely mcp");
    for a in actions {
        line.push_str(" --action ");
        line.push_str(&shell::quote(a));
    }
    line.push_str(" --");
    line
}

/// The fix for unguarded tools of a stdio server: the command line that guards them.
fn wrapper_fix(command: &str, actions: &[String]) -> String {
    format!(
        "{}\n# wrap the server: put `{}` before its command in the host's config",
        wrapper_line(command, actions),
        wrapper_prefix(actions)
    )
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

pub(super) fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

pub(super) fn mcp_lines(upstream: &str, path: &str, actions: &[String]) -> String {
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

    fn tool(source: &str, name: &str, transport: Transport, read_only: bool) -> Found {
        Found {
            source: source.into(),
            target: Target::Tool {
                name: name.into(),
                transport,
            },
            words: name.into(),
            read_only_hint: read_only,
            destructive_hint: false,
            said: Vec::new(),
            input_schema: None,
        }
    }

    #[test]
    fn stdio_tools_are_guarded_by_the_wrapper_never_by_an_mcp_entry() {
        // An [[mcp]] whose upstream is, as text, the source of both tools: it guards the
        // HTTP server's tool only.
        let url = "http://127.0.0.1:9/mcp";
        let config = Config::resolve(
            &format!("[[mcp]]\npath = \"/mcp\"\nupstream = \"{url}\"\ntools = [\"*\"]\n"),
            None,
            &crate::config::Overrides::default(),
        )
        .unwrap();
        let none = HashMap::new();
        let http = assess(
            tool(url, "place_order", Transport::Http, false),
            Some(&config),
            &none,
        );
        assert!(http.configured && http.gaps.is_empty(), "{http:?}");
        let stdio = assess(
            tool(url, "place_order", Transport::Stdio, false),
            Some(&config),
            &none,
        );
        assert!(!stdio.configured, "{stdio:?}");
        assert_eq!(stdio.class, Class::Action);
        assert_eq!(stdio.key, None);
        assert_eq!(stdio.gaps.len(), 1);
        assert_eq!(stdio.gaps[0].kind, "unguarded");
        assert_eq!(
            stdio.gaps[0].fix,
            format!(
                "oncely mcp --action place_order -- {url}\n\
                 # wrap the server: put `oncely mcp --action place_order --` before its \
                 command in the host's config"
            )
        );

        let command = " python 'my server.py' --log /tmp/x ";
        let write = assess(
            tool(command, "render", Transport::Stdio, false),
            None,
            &none,
        );
        assert_eq!(write.class, Class::Write);
        assert_eq!(
            write.gaps[0].fix.lines().next().unwrap(),
            "oncely mcp -- python 'my server.py' --log /tmp/x"
        );
        assert!(write.gaps[0]
            .fix
            .contains("put `oncely mcp --` before its command"));
        let read = assess(tool(command, "lookup", Transport::Stdio, true), None, &none);
        assert_eq!(read.class, Class::Read);
        assert!(read.gaps.is_empty());
        // A tool name a shell would split is quoted.
        assert_eq!(
            wrapper_line("srv", &["send it".into()]),
            "oncely mcp --action 'send it' -- srv"
        );
    }
}
