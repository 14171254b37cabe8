//! `oncely check-config FILE`.

use crate::common::{run, stderr, stdout};

#[test]
fn the_contract_example_is_valid() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/contract-example.toml"
    );
    let o = run(&["check-config", path]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("ok"));
}

#[test]
fn every_problem_is_on_its_own_line_and_the_exit_is_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        r#"
upstream = "http://127.0.0.1:3000"
max_body = "ten"
colour = "blue"

[defaults]
wndow = "3h"

[[routes]]
method = "POST"
path = "/v1/render"
window = "5x"
class = "writ"
ignore_fields = ["request_id"]

[[webhooks]]
path = "/hooks/a"
verify = "stripe"
deliver_to = "http://127.0.0.1:1/x"
"#,
    )
    .unwrap();
    let o = run(&["check-config", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().collect();
    for want in [
        "max_body: size \"ten\"",
        "colour: unknown key",
        "defaults.wndow: unknown key",
        "routes[0].window: duration \"5x\" has unknown unit",
        "routes[0].class: unknown class \"writ\"",
        "routes[0].ignore_fields[0]: \"request_id\" is not a JSON pointer",
        "webhooks[0].secret_env: missing",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(want)),
            "{want:?} not in {err}"
        );
    }
    // Seven problems, one line each, and nothing else.
    assert_eq!(lines.len(), 7, "{err}");
}

#[test]
fn a_missing_file_and_a_syntax_error_are_one_line_each() {
    let o = run(&["check-config", "/nonexistent/oncely.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("syntax.toml");
    std::fs::write(&file, "listen = \"127.0.0.1:1\"\n[[routes]\n").unwrap();
    let o = run(&["check-config", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.lines().next().unwrap().starts_with("2:"), "{err}");
    assert!(err.contains("TOML syntax"), "{err}");
}

/// `check-config` checks the text (the contract's example names TLS files it does not
/// ship); `serve` reads the files, and a missing one stops it with exit 2 and one line
/// that gives the cause once.
#[test]
fn serve_names_a_missing_tls_file_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tls.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         upstream = \"http://127.0.0.1:9\"\n\
         tls = { cert = \"missing-cert.pem\", key = \"missing-key.pem\" }\n",
    )
    .unwrap();
    let o = run(&["check-config", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let store = format!("sqlite://{}", dir.path().join("l.db").display());
    let o = run(&[
        "serve",
        "--config",
        file.to_str().unwrap(),
        "--store",
        &store,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    let line = err
        .lines()
        .find(|l| l.contains("missing-cert.pem"))
        .unwrap_or_else(|| panic!("no line names the file: {err}"));
    assert_eq!(
        line.matches("No such file or directory").count(),
        1,
        "the cause once: {line}"
    );
}

#[test]
fn fingerprint_fields_with_ignore_fields_and_a_bad_pointer_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fields.toml");
    std::fs::write(
        &file,
        r#"
upstream = "http://127.0.0.1:3000"

[defaults]
ignore_fields = ["/request_id"]

[[routes]]
method = "POST"
path = "/v1/payments"
fingerprint_fields = ["/amount"]

[[routes]]
method = "POST"
path = "/v1/orders"
ignore_fields = []
fingerprint_fields = ["amount", "/to"]

[[routes]]
method = "POST"
path = "/v1/refunds"
ignore_fields = []
fingerprint_fields = []
"#,
    )
    .unwrap();
    let o = run(&["check-config", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().collect();
    for want in [
        "routes[0].fingerprint_fields: set with ignore_fields (here or in [defaults])",
        "routes[1].fingerprint_fields[0]: \"amount\" is not a JSON pointer",
        "routes[2].fingerprint_fields: empty",
    ] {
        assert!(
            lines.iter().any(|l| l.starts_with(want)),
            "{want:?} not in {err}"
        );
    }
    assert_eq!(lines.len(), 3, "{err}");

    // A route's own `ignore_fields = []` over the defaults' leaves fingerprint_fields alone.
    std::fs::write(
        &file,
        "upstream = \"http://127.0.0.1:3000\"\n[defaults]\nignore_fields = [\"/r\"]\n\
         [[routes]]\nmethod = \"POST\"\npath = \"/v1/orders\"\nignore_fields = []\n\
         fingerprint_fields = [\"/amount\", \"/to\"]\n",
    )
    .unwrap();
    let o = run(&["check-config", file.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}
