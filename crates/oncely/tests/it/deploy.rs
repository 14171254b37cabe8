//! `deploy/`: the Prometheus alert rules pass `promtool check rules` and their unit tests
//! (`promtool test rules`), every alert has a test that fires it and one that does not,
//! the dashboard's queries are valid PromQL, and every metric name the rules, their tests
//! and the dashboard use is one a real gateway exports: `oncely serve` is started, driven
//! with one request of each kind, and its `/metrics` scraped.
//!
//! Needs `promtool` (Debian's `prometheus` package; scripts/test installs it): without it
//! the tests say so and pass, except under `CI`, where they fail.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use axum::http::StatusCode;
use axum::routing::{get, post};
use serde_json::Value;

use crate::common::{get as http_get, post as http_post, upstream, Gateway};

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

const RULES: &str = "prometheus/oncely-alerts.yml";
const RULE_TESTS: &str = "prometheus/oncely-alerts.test.yml";
const DASHBOARD: &str = "grafana/oncely-dashboard.json";

fn promtool() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("promtool"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "the deploy/ tests need promtool (apt-get install prometheus)"
        );
        eprintln!("SKIPPED: install promtool (Debian package prometheus) to check deploy/");
    }
    found
}

fn promtool_ok(promtool: &Path, args: &[&str], dir: &Path) -> String {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

fn read(path: &str) -> String {
    std::fs::read_to_string(deploy_dir().join(path)).unwrap()
}

/// The alert names of the rules file.
fn alerts() -> Vec<String> {
    read(RULES)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:"))
        .map(|n| n.trim().to_string())
        .collect()
}

/// Every PromQL query of the dashboard (panels and template variables), with Grafana's
/// variables replaced by what Prometheus would get.
fn dashboard_queries() -> Vec<String> {
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = var["query"]["query"].as_str() {
            // label_values(SELECTOR, label): the selector is the PromQL part.
            let inner = q.strip_prefix("label_values(").unwrap();
            queries.push(inner[..inner.rfind(',').unwrap()].to_string());
        }
    }
    queries
        .into_iter()
        .map(|q| {
            q.replace("$__rate_interval", "5m")
                .replace("$instance", ".*")
                .replace("$route", ".*")
        })
        .collect()
}

/// The `oncely_*` metric names a text uses.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("oncely_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        names.insert(name);
    }
    names
}

#[test]
fn alert_rules_pass_promtool_and_each_alert_is_tested_both_ways() {
    let Some(promtool) = promtool() else { return };
    let dir = deploy_dir();
    let checked = promtool_ok(&promtool, &["check", "rules", RULES], &dir);
    let alerts = alerts();
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{checked}"
    );
    promtool_ok(&promtool, &["test", "rules", RULE_TESTS], &dir);
    // Each alert is evaluated at least once expecting it and once expecting nothing.
    let tests = read(RULE_TESTS);
    let blocks: Vec<&str> = tests.split("- eval_time:").skip(1).collect();
    for alert in &alerts {
        let mine: Vec<&&str> = blocks
            .iter()
            .filter(|b| b.contains(&format!("alertname: {alert}\n")))
            .collect();
        assert!(
            mine.iter().any(|b| b.contains("exp_alerts: []")),
            "{alert}: no test that it stays quiet"
        );
        assert!(
            mine.iter().any(|b| b.contains("exp_labels:")),
            "{alert}: no test that it fires"
        );
    }
}

#[test]
fn the_dashboards_queries_are_valid_promql() {
    let Some(promtool) = promtool() else { return };
    // promtool checks PromQL offline only in rule files: one recording rule per query.
    let dir = tempfile::tempdir().unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let queries = dashboard_queries();
    assert!(queries.len() > 15, "{queries:?}");
    for (i, q) in queries.iter().enumerate() {
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(q).unwrap()
        ));
    }
    std::fs::write(dir.path().join("dashboard.yml"), rules).unwrap();
    promtool_ok(&promtool, &["check", "rules", "dashboard.yml"], dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_in_deploy_is_one_the_gateway_exports() {
    let used: BTreeSet<String> = [read(RULES), read(RULE_TESTS), read(DASHBOARD)]
        .iter()
        .flat_map(|t| metric_names(t))
        .collect();
    assert!(used.len() >= 8, "{used:?}");

    let up = upstream(
        axum::Router::new()
            .route("/v1/render", post(|| async { "rendered" }))
            .route(
                "/v1/flaky",
                get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "busy") }),
            )
            .route("/internal/events", post(|| async { "ok" })),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("oncely.toml");
    std::fs::write(
        &config,
        format!(
            r#"store = "sqlite://{db}"
upstream = "http://{up}"

[[routes]]
method = "POST"
path = "/v1/render"
class = "write"

[[routes]]
method = "GET"
path = "/v1/flaky"
class = "read"
retries = 1
retry_backoff = "10ms"

[[webhooks]]
path = "/hooks/events"
verify = "standard"
secret_env = "TEST_WEBHOOK_SECRET"
deliver_to = "http://{up}/internal/events"
"#,
            db = dir.path().join("ledger.db").display()
        ),
    )
    .unwrap();
    let gw = Gateway::start(
        &["--config", config.to_str().unwrap()],
        &[(
            "TEST_WEBHOOK_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )],
    );
    let auth = [("authorization", "Bearer sk_deploy")];
    // Fresh, then replayed.
    for _ in 0..2 {
        let a = http_post(&gw.url("/v1/render"), r#"{"text":"hi"}"#, &auth).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    }
    // A read tried again on 503.
    let a = http_get(&gw.url("/v1/flaky"), &auth).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE, "{}", a.text());
    // A webhook delivery whose signature does not verify.
    let a = http_post(&gw.url("/hooks/events"), "{}", &[("webhook-id", "msg_1")]).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text());

    // The webhook worker reports its queue at start and then once per poll interval.
    let mut exported = BTreeSet::new();
    for _ in 0..100 {
        let metrics = http_get(&gw.admin_url("/metrics"), &[]).await.text();
        exported = metrics
            .lines()
            .filter_map(|l| match l.strip_prefix("# TYPE ") {
                Some(t) => t.split(' ').next(),
                None if !l.starts_with('#') => l.split(['{', ' ']).next(),
                None => None,
            })
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        if used.is_subset(&exported) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let missing: Vec<&String> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "deploy/ uses metrics the gateway does not export: {missing:?}\nexported: {exported:?}"
    );
    assert_eq!(gw.terminate().code(), Some(0));
}
