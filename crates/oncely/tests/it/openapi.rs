//! `GET /openapi.json` on the admin listener through the real binary: served behind the
//! admin token, valid OpenAPI 3.1 (checked by the PyPI `openapi-spec-validator` that
//! `crates/oncely/tests/setup.sh` installs), and naming exactly the routes the admin
//! router serves (paths under `/console` aside: HTML for people, not API).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use http::Request;
use http_body_util::Full;

use crate::common::{get, send, upstream, Gateway};

const TOKEN: &str = "docs-s3cret";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A Python that has `openapi_spec_validator`: `ONCELY_DOCS_PYTHON`, the venv
/// `crates/oncely/tests/setup.sh` makes, or the system's `python3` when it has it.
fn validator_python() -> Option<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    let candidates = [
        std::env::var_os("ONCELY_DOCS_PYTHON").map(PathBuf::from),
        Some(target.join("docs-venv/bin/python")),
        Some(PathBuf::from("python3")),
    ];
    let found = candidates.into_iter().flatten().find(|py| {
        Command::new(py)
            .args(["-c", "import openapi_spec_validator"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "the OpenAPI test needs crates/oncely/tests/setup.sh"
        );
        eprintln!("SKIPPED: run crates/oncely/tests/setup.sh to validate /openapi.json");
    }
    found
}

async fn gateway(envs: &[(&str, &str)]) -> Gateway {
    let up = upstream(axum::Router::new()).await;
    Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", "memory:"],
        envs,
    )
}

async fn served_document(gw: &Gateway) -> serde_json::Value {
    let auth = format!("Bearer {TOKEN}");
    let res = get(&gw.admin_url("/openapi.json"), &[("authorization", &auth)]).await;
    assert_eq!(res.status, 200, "{}", res.text());
    assert_eq!(res.header("content-type"), "application/json");
    res.json()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_served_behind_the_admin_token() {
    let gw = gateway(&[("ONCELY_ADMIN_TOKEN", TOKEN)]).await;
    let without = get(&gw.admin_url("/openapi.json"), &[]).await;
    assert_eq!(without.status, 401);
    assert_eq!(without.json()["code"], "unauthorized");
    let doc = served_document(&gw).await;
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("docs/openapi.json")).unwrap())
            .unwrap();
    assert_eq!(doc, file, "the served document is docs/openapi.json");

    let closed = gateway(&[]).await;
    let res = get(
        &closed.admin_url("/openapi.json"),
        &[("authorization", "Bearer anything")],
    )
    .await;
    assert_eq!(res.status, 403);
    assert_eq!(res.json()["code"], "admin_disabled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_is_valid_openapi_3_1() {
    let gw = gateway(&[("ONCELY_ADMIN_TOKEN", TOKEN)]).await;
    let doc = served_document(&gw).await;
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1.")),
        "openapi: {}",
        doc["openapi"]
    );
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let Some(py) = validator_python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, doc.to_string()).unwrap();
    let out = Command::new(py)
        .args([
            "-c",
            "import json, sys\n\
             from openapi_spec_validator import validate\n\
             from openapi_spec_validator.validation import OpenAPIV31SpecValidator\n\
             validate(json.load(open(sys.argv[1])), cls=OpenAPIV31SpecValidator)\n\
             print('valid')",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "/openapi.json is not valid OpenAPI 3.1:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `METHOD PATH` of every route the admin router declares: the `.route("PATH",
/// METHOD(handler))` lines of the admin API and of the webhook routes it mounts.
fn declared_routes() -> BTreeSet<String> {
    let mut routes = BTreeSet::new();
    for file in [
        "crates/oncely/src/serve/admin.rs",
        "crates/oncely-webhooks/src/ops.rs",
    ] {
        let text = std::fs::read_to_string(root().join(file)).unwrap();
        let text = &text[..text.find("#[cfg(test)]").unwrap_or(text.len())];
        for part in text.split(".route(\"").skip(1) {
            let path = &part[..part.find('"').unwrap()];
            // The rest of the line: `, get(list))` or `, get(a).post(b))`.
            let line = &part[path.len() + 1..];
            let line = &line[..line.find('\n').unwrap_or(line.len())];
            for method in ["get", "post", "put", "patch", "delete"] {
                if [" ", ".", ","]
                    .iter()
                    .any(|before| line.contains(&format!("{before}{method}(")))
                {
                    routes.insert(format!("{} {path}", method.to_uppercase()));
                }
            }
        }
    }
    routes.retain(|r| !r.split(' ').nth(1).unwrap().starts_with("/console"));
    routes
}

fn documented_routes(doc: &serde_json::Value) -> BTreeSet<String> {
    let mut routes = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            routes.insert(format!("{} {path}", method.to_uppercase()));
        }
    }
    routes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_route_is_in_the_document_and_every_operation_is_served() {
    let gw = gateway(&[("ONCELY_ADMIN_TOKEN", TOKEN)]).await;
    let doc = served_document(&gw).await;
    let documented = documented_routes(&doc);
    let declared = declared_routes();
    assert!(declared.contains("GET /records/{id}"), "{declared:?}");
    let undocumented: Vec<_> = declared.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "admin routes the router serves but docs/openapi.json lacks: {undocumented:?}"
    );
    // Every documented operation is answered by a route, not by the fallback (404
    // "no such admin route") and not 405.
    let auth = format!("Bearer {TOKEN}");
    for route in &documented {
        let (method, path) = route.split_once(' ').unwrap();
        let uri = gw.admin_url(&path.replace("{id}", "rec_nope"));
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header("authorization", &auth)
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from_static(
                b"{\"released\": true}",
            )))
            .unwrap();
        let res = send(req).await;
        assert_ne!(res.status, 405, "{route}: method not allowed");
        if res.status == 404 {
            assert_ne!(
                res.json()["detail"],
                "no such admin route",
                "{route} is in docs/openapi.json but the admin API does not serve it"
            );
        }
    }
}
