//! The reference in `docs/` is kept true: every config key, environment variable,
//! command and flag, problem code and metric the code has is documented, and everything
//! documented exists. The code side is read from the code itself (the binary's own
//! unknown-key messages, clap's command tree, `ProblemCode::ALL` and the places that
//! write a problem document, the metrics macros and a real gateway's `/metrics`); the docs
//! side from the Markdown tables. A failure says what is missing where.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::common::{get, post, run, stderr, upstream, Gateway};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn doc(name: &str) -> String {
    let path = root().join("docs").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The tables of a Markdown document by the `##` heading they are under (the heading's
/// text without backticks; `""` before the first one): each row's cells, header and
/// separator rows left out, `\|` kept as `|` inside a cell.
fn tables(md: &str) -> BTreeMap<String, Vec<Vec<String>>> {
    let mut out: BTreeMap<String, Vec<Vec<String>>> = BTreeMap::new();
    let mut heading = String::new();
    let mut in_table = false;
    let mut in_code = false;
    for line in md.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if let Some(h) = line.strip_prefix("## ") {
            heading = h.replace('`', "").trim().to_owned();
            in_table = false;
            continue;
        }
        let Some(row) = line.trim().strip_prefix('|') else {
            in_table = false;
            continue;
        };
        let cells: Vec<String> = row
            .replace("\\|", "\u{0}")
            .split('|')
            .map(|c| c.replace('\u{0}', "|").trim().to_owned())
            .collect();
        let cells = cells[..cells.len().saturating_sub(1)].to_vec();
        if !in_table {
            // The header row; the separator follows.
            in_table = true;
            continue;
        }
        if cells
            .iter()
            .all(|c| c.chars().all(|ch| ch == '-' || ch == ':'))
        {
            continue;
        }
        out.entry(heading.clone()).or_default().push(cells);
    }
    out
}

/// The backticked names in a cell: `` `a`, `b` `` → `["a", "b"]`.
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The first column's name of every row under `heading` (its first backticked word).
fn first_column(
    tables: &BTreeMap<String, Vec<Vec<String>>>,
    doc: &str,
    heading: &str,
) -> BTreeSet<String> {
    let rows = tables
        .get(heading)
        .unwrap_or_else(|| panic!("docs/{doc} has no table under \"## {heading}\""));
    rows.iter()
        .filter_map(|r| ticked(&r[0]).into_iter().next())
        .map(|name| name.split_whitespace().next().unwrap_or("").to_owned())
        .collect()
}

/// Compares what the code has with what a doc lists, and says what is missing where.
#[track_caller]
fn same(what: &str, code: &BTreeSet<String>, docs: &BTreeSet<String>, doc: &str, place: &str) {
    let problems = differences(what, code, docs, doc, place);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// What is missing where, one line each.
fn differences(
    what: &str,
    code: &BTreeSet<String>,
    docs: &BTreeSet<String>,
    doc: &str,
    place: &str,
) -> Vec<String> {
    let undocumented: Vec<_> = code.difference(docs).collect();
    let unknown: Vec<_> = docs.difference(code).collect();
    let mut problems = Vec::new();
    if !undocumented.is_empty() {
        problems.push(format!(
            "{what} the code has but docs/{doc} ({place}) lacks: {undocumented:?}"
        ));
    }
    if !unknown.is_empty() {
        problems.push(format!(
            "{what} docs/{doc} ({place}) lists but the code does not have: {unknown:?}"
        ));
    }
    problems
}

/// The non-test Rust source of every crate: `(path, text)`, each file cut at its
/// `#[cfg(test)]` module (tests are at the bottom of their file) and `tests.rs` left out.
fn sources() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, String)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs")
                && path.file_name().is_some_and(|n| n != "tests.rs")
            {
                let text = std::fs::read_to_string(&path).unwrap();
                let text = match text.find("#[cfg(test)]") {
                    Some(i) => text[..i].to_owned(),
                    None => text,
                };
                out.push((path, text));
            }
        }
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() {
            walk(&src, &mut out);
        }
    }
    out
}

/// Every string literal in `text` that directly follows `prefix` (whitespace allowed
/// between them), with the text before the prefix.
fn literals_after<'a>(text: &'a str, prefix: &str) -> Vec<(&'a str, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find(prefix) {
        let start = from + i;
        let rest = text[start + prefix.len()..].trim_start();
        if let Some(lit) = rest.strip_prefix('"') {
            if let Some(end) = lit.find('"') {
                out.push((&text[..start], lit[..end].to_owned()));
            }
        }
        from = start + prefix.len();
    }
    out
}

// ---------------------------------------------------------------------------------------
// Config

/// Where the binary reports an unknown key, and the heading of docs/config.md that
/// documents that section.
const SECTIONS: [(&str, &str); 8] = [
    ("", "Top level"),
    ("tls", "tls"),
    ("defaults", "[defaults]"),
    ("routes[0]", "[[routes]]"),
    ("routes[0].guard_when", "guard_when"),
    ("mcp[0]", "[[mcp]]"),
    ("webhooks[0]", "[[webhooks]]"),
    ("tracing", "[tracing]"),
];

/// A config with one unknown key in every section: the binary answers each with the keys
/// it knows there.
const PROBE: &str = r#"
zz_probe = 1
upstream = "http://127.0.0.1:9"
tls = { cert = "c.pem", key = "k.pem", zz_probe = 1 }

[defaults]
zz_probe = 1

[[routes]]
method = "POST"
path = "/x"
guard_when = { header = "authorization", zz_probe = 1 }
zz_probe = 1

[[mcp]]
path = "/mcp"
upstream = "http://127.0.0.1:9/mcp"
zz_probe = 1

[[webhooks]]
path = "/hooks"
verify = "stripe"
secret_env = "S"
deliver_to = "http://127.0.0.1:9"
zz_probe = 1

[tracing]
otlp_endpoint = "http://127.0.0.1:4318"
zz_probe = 1
"#;

/// The keys the binary knows in each section, from its own `unknown key (known here:
/// ...)` messages.
fn known_config_keys() -> BTreeMap<String, BTreeSet<String>> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("probe.toml");
    std::fs::write(&file, PROBE).unwrap();
    let out = run(&["check-config", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let mut known = BTreeMap::new();
    for line in stderr(&out).lines() {
        let Some((at, message)) = line.split_once(": unknown key (known here: ") else {
            continue;
        };
        let section = at.strip_suffix("zz_probe").unwrap().trim_end_matches('.');
        let keys = message.trim_end_matches(')').split(", ").map(str::to_owned);
        known.insert(section.to_owned(), keys.collect());
    }
    known
}

#[test]
fn every_config_key_is_documented_and_every_documented_key_exists() {
    let known = known_config_keys();
    let probed: BTreeSet<&str> = known.keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = SECTIONS.iter().map(|(s, _)| *s).collect();
    assert_eq!(
        probed, expected,
        "the probe reached other sections than expected"
    );
    let md = doc("config.md");
    let t = tables(&md);
    let mut problems = Vec::new();
    for (section, heading) in SECTIONS {
        problems.extend(differences(
            &format!("config keys of section {heading:?}:"),
            &known[section],
            &first_column(&t, "config.md", heading),
            "config.md",
            &format!("## {heading}"),
        ));
        // Each key with its type, default, meaning and an example that sets it.
        for row in t.get(heading).into_iter().flatten() {
            let key = ticked(&row[0]).into_iter().next().unwrap_or_default();
            if row.len() != 5 || row.iter().any(String::is_empty) {
                problems.push(format!(
                    "docs/config.md ## {heading}: the row of {key:?} needs key | type | default | meaning | example"
                ));
            } else if !row[4].contains(&key) && !row[4].contains(&format!("[{key}]")) {
                problems.push(format!(
                    "docs/config.md ## {heading}: the example of {key:?} does not set it: {}",
                    row[4]
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_documented_example_config_is_valid() {
    let md = doc("config.md");
    let start = md
        .find("```toml\n")
        .expect("docs/config.md has a ```toml example")
        + 8;
    let example = &md[start..start + md[start..].find("```").unwrap()];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("example.toml");
    std::fs::write(&file, example).unwrap();
    let out = run(&["check-config", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn every_environment_variable_is_documented() {
    let mut code = BTreeSet::new();
    for (_, text) in sources() {
        let mut rest = text.as_str();
        while let Some(i) = rest.find("\"ONCELY_") {
            let name: String = rest[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if rest[i + 1 + name.len()..].starts_with('"') && !name.starts_with("ONCELY_TEST_") {
                code.insert(name);
            }
            rest = &rest[i + 1..];
        }
    }
    let md = doc("config.md");
    let documented: BTreeSet<String> =
        first_column(&tables(&md), "config.md", "Environment variables")
            .into_iter()
            .filter(|n| n.starts_with("ONCELY_"))
            .collect();
    same(
        "environment variables",
        &code,
        &documented,
        "config.md",
        "## Environment variables",
    );
}

// ---------------------------------------------------------------------------------------
// Commands

/// Every command that runs (no subcommands of its own), as `oncely a b`, with its
/// arguments: `--long` flags and positional value names (`ID`, `FILE`).
fn cli_commands() -> BTreeMap<String, BTreeSet<String>> {
    use clap::CommandFactory;
    fn walk(cmd: &clap::Command, path: &str, out: &mut BTreeMap<String, BTreeSet<String>>) {
        let subs: Vec<_> = cmd
            .get_subcommands()
            .filter(|c| c.get_name() != "help" && !c.is_hide_set())
            .collect();
        if subs.is_empty() {
            let args = cmd
                .get_arguments()
                .filter(|a| !a.is_hide_set())
                .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
                .map(|a| match a.get_long() {
                    Some(long) => format!("--{long}"),
                    None => a
                        .get_value_names()
                        .and_then(|v| v.first().map(|n| n.to_string()))
                        .unwrap_or_else(|| a.get_id().as_str().to_uppercase()),
                })
                .collect();
            out.insert(path.to_owned(), args);
        }
        for sub in subs {
            walk(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }
    let mut out = BTreeMap::new();
    walk(&oncely::cli::Cli::command(), "oncely", &mut out);
    out
}

#[test]
fn every_command_and_flag_is_documented_with_exit_codes() {
    let commands = cli_commands();
    let md = doc("commands.md");
    let t = tables(&md);
    let documented: BTreeSet<String> = md
        .lines()
        .filter_map(|l| l.strip_prefix("## `oncely"))
        .map(|l| format!("oncely{}", l.trim_end_matches('`')))
        .collect();
    same(
        "commands",
        &commands.keys().cloned().collect(),
        &documented,
        "commands.md",
        "its \"## `oncely ...`\" headings",
    );
    let mut problems = Vec::new();
    for (command, args) in &commands {
        let listed = match t.get(command) {
            Some(_) => first_column(&t, "commands.md", command),
            None => BTreeSet::new(),
        };
        problems.extend(differences(
            &format!("flags and arguments of `{command}`:"),
            args,
            &listed,
            "commands.md",
            &format!("the table under ## `{command}`"),
        ));
        let Some(start) = md.find(&format!("## `{command}`\n")) else {
            continue;
        };
        let section = &md[start + 3..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        if !section.contains("Exit codes:") {
            problems.push(format!(
                "docs/commands.md: ## `{command}` does not say its exit codes (\"Exit codes: ...\")"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Problem codes

/// `StatusCode::NAME` → its number, for the statuses problem documents are written with
/// (`None` for a success or redirect status, which no problem has).
fn status_number(name: &str) -> Option<u16> {
    Some(match name {
        "OK" | "CREATED" | "ACCEPTED" | "NO_CONTENT" | "FOUND" | "SEE_OTHER"
        | "TEMPORARY_REDIRECT" | "NOT_MODIFIED" => return None,
        "BAD_REQUEST" => 400,
        "UNAUTHORIZED" => 401,
        "FORBIDDEN" => 403,
        "NOT_FOUND" => 404,
        "METHOD_NOT_ALLOWED" => 405,
        "CONFLICT" => 409,
        "PAYLOAD_TOO_LARGE" => 413,
        "UNPROCESSABLE_ENTITY" => 422,
        "BAD_GATEWAY" => 502,
        "SERVICE_UNAVAILABLE" => 503,
        "GATEWAY_TIMEOUT" => 504,
        other => panic!("a problem is written with StatusCode::{other}: add its number here"),
    })
}

/// Every `(code, status)` a problem document can carry: the gateway's `ProblemCode`s,
/// and the codes written in place by the MCP endpoint, the webhook endpoints and the
/// admin API (`problem(StatusCode::X, "code", ...)`, `AdminError::new(StatusCode::X,
/// "code", ...)`, `rejected("code", ...)` (always 400), and literal
/// `"status":N,"code":"..."` documents).
fn problem_codes() -> BTreeSet<(String, u16)> {
    let mut codes: BTreeSet<(String, u16)> = oncely_tower::ProblemCode::ALL
        .iter()
        .map(|c| (c.as_str().to_owned(), c.status().as_u16()))
        .collect();
    for (path, text) in sources() {
        if !text.contains("problem") && !text.contains("AdminError") {
            continue;
        }
        for (before, code) in literals_after(&text, ",") {
            // `StatusCode::NAME,` right before the literal.
            let before = before.trim_end();
            let Some(i) = before.rfind("StatusCode::") else {
                continue;
            };
            let name = &before[i + "StatusCode::".len()..];
            if name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                && !code.is_empty()
                && code.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            {
                if let Some(status) = status_number(name) {
                    codes.insert((code, status));
                }
            }
        }
        for (_, code) in literals_after(&text, "self.rejected(") {
            assert!(
                path.ends_with("ingress.rs"),
                "{}: rejected() outside the webhook ingress",
                path.display()
            );
            codes.insert((code, 400));
        }
        let mut rest = text.as_str();
        while let Some(i) = rest.find("\"status\":") {
            rest = &rest[i + 9..];
            let status: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if let (Ok(status), Some(j)) = (status.parse::<u16>(), rest.find("\"code\":\"")) {
                let code = &rest[j + 8..];
                let code = &code[..code.find('"').unwrap()];
                if j < 80 {
                    codes.insert((code.to_owned(), status));
                }
            }
        }
    }
    codes
}

#[test]
fn every_problem_code_is_documented_with_its_status() {
    let codes = problem_codes();
    // Sanity: the scan sees the places that write problems.
    for expected in [
        "signature_invalid",
        "admin_disabled",
        "upstream_failed",
        "method_not_allowed",
    ] {
        assert!(
            codes.iter().any(|(c, _)| c == expected),
            "the scan of the code missed {expected}: {codes:?}"
        );
    }
    let md = doc("problems.md");
    let rows = tables(&md).remove("").unwrap_or_default();
    let documented: BTreeSet<(String, u16)> = rows
        .iter()
        .filter_map(|r| {
            let code = ticked(&r[0]).into_iter().next()?;
            Some((code, r[1].parse().ok()?))
        })
        .collect();
    let names = |s: &BTreeSet<(String, u16)>| -> BTreeSet<String> {
        s.iter().map(|(c, st)| format!("{c} ({st})")).collect()
    };
    same(
        "problem codes (with their status)",
        &names(&codes),
        &names(&documented),
        "problems.md",
        "the table of codes",
    );
}

/// The table of dialects in problems.md says what the renderer sends: for every code, its
/// status, `X-Should-Retry` (the code's own; the upstream failures also say when it is
/// `false`) and each dialect's `type` (and Stripe's status).
#[test]
fn the_dialect_table_is_what_each_dialect_renders() {
    use oncely_http::{Dialect, Problem, ProblemCode};
    let md = doc("problems.md");
    let rows = tables(&md).remove("Dialects").unwrap_or_default();
    let documented: BTreeSet<Vec<String>> = rows.into_iter().collect();
    let rendered: BTreeSet<Vec<String>> = ProblemCode::ALL
        .iter()
        .map(|&code| {
            let p = Problem::new(code, "why");
            let res = p.render_in(Dialect::Problem);
            let retry = res.headers()["x-should-retry"].to_str().unwrap().to_owned();
            assert_eq!(res.headers()["oncely-problem"], code.as_str());
            let retry = if retry == "true"
                && code.as_str().starts_with("upstream_")
                && code != ProblemCode::UpstreamBusy
            {
                "true (released), false (`outcome_unknown`)".to_owned()
            } else {
                retry
            };
            let body = |d: Dialect| -> (u16, serde_json::Value) {
                let res = p.render_in(d);
                assert_eq!(
                    res.headers()["x-should-retry"],
                    p.render_in(Dialect::Problem).headers()["x-should-retry"]
                );
                assert_eq!(res.headers()["oncely-problem"], code.as_str());
                (
                    res.status().as_u16(),
                    serde_json::from_slice(res.body()).unwrap(),
                )
            };
            let (_, openai) = body(Dialect::OpenAi);
            let (_, anthropic) = body(Dialect::Anthropic);
            let (stripe_status, stripe) = body(Dialect::Stripe);
            assert_eq!(openai["error"]["code"], code.as_str());
            assert_eq!(openai["error"]["message"], "why");
            assert_eq!(anthropic["type"], "error");
            assert_eq!(anthropic["error"]["message"], "why");
            assert_eq!(stripe["error"]["code"], code.as_str());
            assert_eq!(stripe["error"]["message"], "why");
            let t = |v: &serde_json::Value| format!("`{}`", v.as_str().unwrap());
            vec![
                format!("`{code}`"),
                code.status().as_u16().to_string(),
                retry,
                t(&openai["error"]["type"]),
                t(&anthropic["error"]["type"]),
                format!("{stripe_status}, {}", t(&stripe["error"]["type"])),
            ]
        })
        .collect();
    let show = |s: &BTreeSet<Vec<String>>| -> BTreeSet<String> {
        s.iter().map(|r| r.join(" | ")).collect()
    };
    same(
        "dialect rows",
        &show(&rendered),
        &show(&documented),
        "problems.md",
        "the table under Dialects",
    );
}

// ---------------------------------------------------------------------------------------
// Metrics

/// Every metric name the code registers or records (`counter!`, `gauge!`, `histogram!`
/// and their `describe_*!`).
fn registered_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (_, text) in sources() {
        for mac in [
            "counter!(",
            "gauge!(",
            "histogram!(",
            "describe_counter!(",
            "describe_gauge!(",
            "describe_histogram!(",
        ] {
            for (_, name) in literals_after(&text, mac) {
                names.insert(name);
            }
        }
        // `Matcher::Full("name".into())` and other mentions are not registrations.
    }
    names
}

/// The metrics table and the label-values table of docs/metrics.md.
struct MetricDocs {
    /// metric → its labels.
    labels: BTreeMap<String, BTreeSet<String>>,
    /// (metric, label) → the documented values.
    values: BTreeMap<(String, String), BTreeSet<String>>,
}

fn metric_docs() -> MetricDocs {
    let md = doc("metrics.md");
    let t = tables(&md);
    let mut labels = BTreeMap::new();
    for row in t.get("").expect("docs/metrics.md has a table of metrics") {
        let name = ticked(&row[0]).remove(0);
        labels.insert(name, ticked(&row[2]).into_iter().collect());
    }
    let mut values = BTreeMap::new();
    for row in t
        .get("Label values")
        .expect("docs/metrics.md has ## Label values")
    {
        let metric = ticked(&row[0]).remove(0);
        let label = ticked(&row[1]).remove(0);
        values.insert((metric, label), ticked(&row[2]).into_iter().collect());
    }
    MetricDocs { labels, values }
}

#[test]
fn every_registered_metric_is_documented() {
    let docs = metric_docs();
    same(
        "metrics",
        &registered_metrics(),
        &docs.labels.keys().cloned().collect(),
        "metrics.md",
        "the table of metrics",
    );
    for (metric, label) in docs.values.keys() {
        assert!(
            docs.labels.get(metric).is_some_and(|l| l.contains(label)),
            "docs/metrics.md: ## Label values has {metric}{{{label}}}, but the table of metrics does not give {metric} that label"
        );
    }
}

/// One sample line of Prometheus text: name and labels.
fn sample(line: &str) -> Option<(String, BTreeMap<String, String>)> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let (head, _) = line.rsplit_once(' ')?;
    let (name, labels) = match head.split_once('{') {
        Some((n, l)) => (n, l.trim_end_matches('}')),
        None => (head, ""),
    };
    let mut map = BTreeMap::new();
    // Values are quoted and may hold commas (route names do not; tool names neither).
    for pair in labels.split("\",").filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once("=\"")?;
        map.insert(
            k.trim_start_matches(',').to_owned(),
            v.trim_end_matches('"').to_owned(),
        );
    }
    let name = ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name);
    Some((name.to_owned(), map))
}

const WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_gateways_metrics_are_all_documented_with_their_labels() {
    // An upstream that answers 503 on /flaky (a read route retries it), 500 on /orders
    // (an action becomes outcome_unknown), 404 on /orders/lookup (the reconciler releases
    // it), and 200 elsewhere.
    let up = upstream(
        axum::Router::new()
            .route(
                "/flaky",
                axum::routing::get(|| async { axum::http::StatusCode::SERVICE_UNAVAILABLE }),
            )
            .route(
                "/orders",
                axum::routing::post(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }),
            )
            .route(
                "/orders/lookup",
                axum::routing::get(|| async { axum::http::StatusCode::NOT_FOUND }),
            )
            .fallback(|| async { "done" }),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("oncely.toml");
    std::fs::write(
        &config,
        format!(
            r#"
store = "sqlite://{db}"
upstream = "http://{up}"

[[routes]]
method = "POST"
path = "/v1/render"
guard_when = {{ header = "authorization", prefix = "Bearer sk_" }}

[[routes]]
method = "POST"
path = "/v1/keyed"
key = "header"

[[routes]]
method = "GET"
path = "/flaky"
class = "read"
retries = 1
retry_backoff = "10ms"

[[routes]]
method = "POST"
path = "/jobs"
class = "job"
wait = "2s"

[[routes]]
method = "POST"
path = "/orders"
class = "action"
reconcile = "GET /orders/lookup?ref={{key}}"
reconcile_after = "10ms"

[[webhooks]]
path = "/hooks"
verify = "stripe"
secret_env = "DOCS_TEST_WEBHOOK_SECRET"
deliver_to = "http://{up}/internal"
"#,
            db = dir.path().join("ledger.db").display()
        ),
    )
    .unwrap();
    let gw = Gateway::start(
        &["--config", config.to_str().unwrap()],
        &[("DOCS_TEST_WEBHOOK_SECRET", WEBHOOK_SECRET)],
    );
    let key = [("authorization", "Bearer sk_1")];
    // fresh, then replayed
    for want in ["fresh", "replayed"] {
        let r = post(&gw.url("/v1/render"), "{\"text\":\"hi\"}", &key).await;
        assert_eq!(r.header("oncely-status"), want);
    }
    // bypassed: guard_when does not match
    let r = post(&gw.url("/v1/render"), "{}", &[("authorization", "Basic x")]).await;
    assert_eq!(r.header("oncely-status"), "bypassed");
    // refused: key = "header" without a key
    let r = post(&gw.url("/v1/keyed"), "{}", &key).await;
    assert_eq!(r.status, 400);
    // a retried read
    let r = get(&gw.url("/flaky"), &key).await;
    assert_eq!(r.status, 503);
    // a job
    let r = post(&gw.url("/jobs"), "{}", &key).await;
    assert_eq!(r.header("oncely-status"), "fresh");
    // an action whose outcome is unknown, which the server reconciles
    let r = post(&gw.url("/orders"), "{}", &key).await;
    assert_eq!(r.status, 500);
    // a rejected webhook event, then one accepted and delivered, then its duplicate
    let r = post(&gw.url("/hooks"), "{\"id\":\"evt_1\"}", &[]).await;
    assert_eq!(r.status, 400);
    let scheme: oncely_webhooks::Scheme = "stripe".parse().unwrap();
    let secrets = oncely_webhooks::Secrets::parse(&scheme, WEBHOOK_SECRET).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let body = "{\"id\":\"evt_2\"}";
    let signed = oncely_webhooks::sign(&scheme, secrets.primary(), "evt_2", now, body.as_bytes());
    let headers: Vec<(&str, &str)> = signed
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    let first = post(&gw.url("/hooks"), body, &headers).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let again = post(&gw.url("/hooks"), body, &headers).await;
    assert_eq!(again.header("oncely-status"), "duplicate");

    // The delivery and the reconciliation happen in the background: wait until both are
    // counted (no timing is asserted).
    let mut text = String::new();
    for _ in 0..200 {
        text = get(&gw.admin_url("/metrics"), &[]).await.text();
        if text.contains("oncely_webhook_deliveries_total{result=\"delivered\"} 1")
            && text.contains("oncely_reconcile_total{")
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let docs = metric_docs();
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for (name, labels) in text.lines().filter_map(sample) {
        if !name.starts_with("oncely_") {
            continue;
        }
        seen.insert(name.clone());
        let Some(documented) = docs.labels.get(&name) else {
            problems.push(format!(
                "metric {name} is served but docs/metrics.md lacks it"
            ));
            continue;
        };
        for (label, value) in labels {
            if label == "le" {
                continue;
            }
            if !documented.contains(&label) {
                problems.push(format!(
                    "label {label} of {name} is served but docs/metrics.md does not list it"
                ));
                continue;
            }
            let values = docs.values.get(&(name.clone(), label.clone()));
            let free_form = matches!(label.as_str(), "route" | "tool");
            match values {
                None => problems.push(format!(
                    "docs/metrics.md ## Label values lacks a row for {name}{{{label}}}"
                )),
                Some(v) if !free_form && !v.contains(&value) => problems.push(format!(
                    "{name}{{{label}=\"{value}\"}} is served but docs/metrics.md ## Label values does not list {value:?}"
                )),
                _ => {}
            }
        }
    }
    for expected in [
        "oncely_upstream_retries_total",
        "oncely_webhook_events_total",
        "oncely_reconcile_total",
    ] {
        assert!(
            seen.contains(expected),
            "the test did not make {expected} appear:\n{text}"
        );
    }
    assert!(
        text.contains("status=\"key_missing\""),
        "a refused request is counted under its code:\n{text}"
    );
    assert!(
        problems.is_empty(),
        "{}\n\n/metrics:\n{text}",
        problems.join("\n")
    );
}

// ---------------------------------------------------------------------------------------
// Links

/// The targets of the Markdown links `[text](target)` in `md`.
fn links(md: &str) -> Vec<String> {
    md.split("](")
        .skip(1)
        .filter_map(|rest| rest.find(')').map(|end| rest[..end].to_owned()))
        .collect()
}

#[test]
fn readme_architecture_and_docs_link_only_inside_the_repository() {
    let root = root().canonicalize().unwrap();
    let mut files = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    for entry in std::fs::read_dir(root.join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    let mut problems = Vec::new();
    for file in &files {
        let md = std::fs::read_to_string(file).unwrap();
        let name = file.strip_prefix(&root).unwrap().display().to_string();
        for word in ["../shared", "CONTRACT.md"] {
            if md.contains(word) {
                problems.push(format!("{name} mentions {word}, which users do not have"));
            }
        }
        for target in links(&md) {
            let path = target.split('#').next().unwrap();
            if target.contains("://") || target.starts_with('/') {
                problems.push(format!("{name} links outside the repository: {target}"));
                continue;
            }
            if path.is_empty() {
                continue;
            }
            match file.parent().unwrap().join(path).canonicalize() {
                Ok(p) if p.starts_with(&root) => {}
                Ok(_) => problems.push(format!("{name} links outside the repository: {target}")),
                Err(_) => problems.push(format!("{name} links to {target}, which does not exist")),
            }
        }
    }
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    if !links(&readme).iter().any(|l| l == "docs/README.md") {
        problems.push("README.md does not point to docs/README.md".into());
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------
// ARCHITECTURE.md

/// The backticked spans of `md`.
fn backticked(md: &str) -> Vec<&str> {
    md.split('`').skip(1).step_by(2).collect()
}

/// Whether `name` is a module (a file `name.rs` or a folder `name/`) somewhere under
/// `src`, or an item (`fn`, `mod`, `struct`, `trait`, `enum`, `type`) of the crate.
fn crate_has(src: &Path, name: &str) -> bool {
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            if path.is_dir() {
                if stem == name {
                    return true;
                }
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                if stem == name {
                    return true;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let item = ["fn ", "mod ", "struct ", "trait ", "enum ", "type "]
                    .iter()
                    .any(|kw| text.contains(&format!("{kw}{name}")));
                if item {
                    return true;
                }
            }
        }
    }
    false
}

/// The code map lists the crates from the bottom up, and a crate depends only on the ones
/// above it: each crate's `[dependencies]` (what it is built with) name no workspace crate
/// listed after it, nor one the map does not list.
#[test]
fn each_crate_depends_only_on_the_crates_the_map_lists_above_it() {
    let root = root();
    let md = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let order: Vec<&str> = md
        .split("**`crates/")
        .skip(1)
        .map(|s| s.split('`').next().unwrap())
        .collect();
    let mut problems = Vec::new();
    for (n, name) in order.iter().enumerate() {
        let manifest = std::fs::read_to_string(root.join("crates").join(name).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("crates/{name}/Cargo.toml: {e}"));
        let manifest: toml::Table = manifest.parse().unwrap();
        let deps = manifest
            .get("dependencies")
            .and_then(|d| d.as_table())
            .map(|t| t.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default();
        for dep in deps.iter().filter(|d| d.starts_with("oncely")) {
            match order.iter().position(|o| o == dep) {
                Some(at) if at < n => {}
                Some(_) => problems.push(format!(
                    "crates/{name} depends on {dep}, which the code map lists after it"
                )),
                None => problems.push(format!(
                    "crates/{name} depends on {dep}, which the code map does not list"
                )),
            }
        }
    }
    assert!(order.len() >= 9, "the code map lists {order:?}");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// ARCHITECTURE.md stays a map: under 3,000 words, and every path it names and every
/// module its code map names under a crate exists (a renamed or deleted module fails
/// here until the map says so).
#[test]
fn architecture_is_short_and_names_only_what_exists() {
    let root = root();
    let md = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let words = md.split_whitespace().count();
    let mut problems = Vec::new();
    if words >= 3000 {
        problems.push(format!("ARCHITECTURE.md has {words} words (under 3,000)"));
    }
    let roots = ["crates/", "scripts/", "docs/", "deploy/", "fuzz/"];
    for span in backticked(&md) {
        let path = span.split_whitespace().next().unwrap_or("");
        if roots.iter().any(|r| path.starts_with(r)) && !root.join(path).exists() {
            problems.push(format!(
                "ARCHITECTURE.md names {path}, which does not exist"
            ));
        }
    }
    // The code map: each crate's paragraph, from its `**`crates/NAME`**` heading to the
    // next heading; a bare lower-case name in it is a module or an item of that crate.
    let map = md
        .split("## Code map")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("a Code map section");
    for section in map.split("**`crates/").skip(1) {
        let name = section.split('`').next().unwrap();
        let src = root.join("crates").join(name).join("src");
        if !src.is_dir() {
            problems.push(format!(
                "the code map names crates/{name}, which has no src/"
            ));
            continue;
        }
        // After the heading's closing backtick, outside any span.
        let body = section[name.len() + 1..].split("\n**").next().unwrap();
        for span in backticked(body) {
            let module = span.trim_end_matches('/');
            let bare = !module.is_empty()
                && module
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if bare && !crate_has(&src, module) {
                problems.push(format!(
                    "the code map names `{span}` under crates/{name}, which has no such module or item"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
