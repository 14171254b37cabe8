//! The engine without circles, checked: `oncely-engine` depends on no HTTP crate, and the
//! modules of `oncely-engine` and `oncely-tower` import each other in one direction only
//! (the `crate::MODULE` paths of each file form no cycle).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn crate_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name)
}

/// The dependency names of a manifest's `[dependencies]` table.
fn dependencies(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let mut names = Vec::new();
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
        } else if inside && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap_or_default();
            names.push(name.to_string());
        }
    }
    names
}

#[test]
fn the_engine_depends_on_no_http_crate() {
    let deps = dependencies(&crate_dir("oncely-engine").join("Cargo.toml"));
    assert!(deps.iter().any(|d| d == "oncely-core"), "parsed: {deps:?}");
    for http in [
        "http",
        "http-body",
        "http-body-util",
        "hyper",
        "tower",
        "axum",
    ] {
        assert!(
            !deps.iter().any(|d| d == http),
            "oncely-engine must not depend on {http}"
        );
    }
}

/// Each top-level module of a crate (a file of `src/`, or a directory) and the modules
/// its files name as `crate::MODULE`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    fn files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut all = Vec::new();
    files(src, &mut all);
    let module_of = |path: &Path| -> String {
        let rel = path.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        first.trim_end_matches(".rs").to_string()
    };
    let modules: BTreeSet<String> = all.iter().map(|p| module_of(p)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for path in &all {
        let from = module_of(path);
        if from == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        let edges = graph.entry(from.clone()).or_default();
        for (at, _) in text.match_indices("crate::") {
            let name: String = text[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if name != from && modules.contains(&name) {
                edges.insert(name);
            }
        }
    }
    graph
}

/// A cycle of the graph, if it has one.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_modules_of_the_engine_and_the_layer_import_each_other_in_one_direction() {
    for name in ["oncely-engine", "oncely-tower"] {
        let graph = module_graph(&crate_dir(name).join("src"));
        assert!(graph.len() > 3, "{name}: parsed {graph:?}");
        if let Some(cycle) = cycle(&graph) {
            panic!(
                "{name}: modules import each other in a circle: {}",
                cycle.join(" -> ")
            );
        }
    }
    // The layer's own direction: the engine's HTTP edge, then jobs, then the layer.
    let tower = module_graph(&crate_dir("oncely-tower").join("src"));
    assert!(tower["idempotency"].contains("jobs"));
    assert!(tower["jobs"].contains("guard"));
    assert!(!tower["guard"].contains("jobs"));
}

#[test]
fn a_cycle_is_found() {
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(
        cycle(&graph),
        Some(vec!["a".to_string(), "b".to_string(), "a".to_string()])
    );
    graph.get_mut("b").unwrap().clear();
    assert_eq!(cycle(&graph), None);
}
