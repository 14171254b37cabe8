//! The inventory's three outputs: the table on standard output, the JSON document
//! (`--json`), and the starting config (`--write-config`).

use std::collections::BTreeMap;

use oncely_core::units::format_duration;
use oncely_core::Class;
use serde_json::{json, Value};

use super::heuristics::{
    configured_route, mcp_lines, reconcile_suggestion, route_lines, route_pattern, toml_string,
    wrapper_line,
};
use super::model::{Entry, Target, Transport};
use crate::config::Config;

pub(super) fn to_json(entries: &[Entry]) -> Value {
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
                Target::Tool { name, transport } => {
                    o.insert("method".into(), json!("tools/call"));
                    o.insert("tool".into(), json!(name));
                    o.insert("transport".into(), json!(transport.as_str()));
                    let keys: Vec<Value> = e
                        .key_arguments
                        .iter()
                        .map(|k| json!({"argument": k.pointer, "replaced": k.replaced, "what": k.what}))
                        .collect();
                    o.insert("key_arguments".into(), Value::Array(keys));
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

pub(super) fn print_table(entries: &[Entry]) {
    let name = |e: &Entry| match &e.found.target {
        Target::Http { method, path, .. } => format!("{method} {path}"),
        Target::Tool { name, .. } => format!("tool {name}"),
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
        let keys: Vec<String> = idx
            .iter()
            .flat_map(|&i| {
                let e = &entries[i];
                e.key_arguments
                    .iter()
                    .map(move |k| format!("  {} {}: {}", name(e), k.pointer, k.what))
            })
            .collect();
        if !keys.is_empty() {
            println!("\nkey arguments (left out of the call's key; what the server gets in them):");
            for k in keys {
                println!("{k}");
            }
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

/// A starting config: one route per non-read operation, one `[[mcp]]` per Streamable HTTP
/// MCP server, with the classes above, and for each stdio MCP server, in comments, the
/// `oncely mcp` command line that guards it. Reads get no route (an unmatched request is
/// forwarded).
pub(super) fn starting_config(entries: &[Entry], config: Option<&Config>) -> String {
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
        // A caller told to send a new key with every request: keyed by its request.
        if e.gaps.iter().any(|g| g.kind == "new_key_per_request") {
            out.push_str("key = \"fingerprint\"\n");
        }
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
    let mut servers: Vec<(&str, Transport)> = Vec::new();
    for e in entries {
        if let Target::Tool { transport, .. } = e.found.target {
            if !servers.contains(&(e.found.source.as_str(), transport)) {
                servers.push((&e.found.source, transport));
            }
        }
    }
    let actions_of = |source: &str, of: Transport| -> Vec<String> {
        entries
            .iter()
            .filter(|e| e.found.source == source && e.class == Class::Action)
            .filter_map(|e| match &e.found.target {
                Target::Tool { name, transport } if *transport == of => Some(name.clone()),
                _ => None,
            })
            .collect()
    };
    let http = servers.iter().filter(|(_, t)| *t == Transport::Http);
    for (i, (source, _)) in http.enumerate() {
        let path = if i == 0 {
            "/mcp".to_owned()
        } else {
            format!("/mcp{}", i + 1)
        };
        out.push_str(&format!(
            "\n{}\n",
            mcp_lines(source, &path, &actions_of(source, Transport::Http))
        ));
    }
    // A stdio server is started by the assistant host: it is guarded by the command the
    // host starts instead, not by this config.
    for (source, _) in servers.iter().filter(|(_, t)| *t == Transport::Stdio) {
        out.push_str(&format!(
            "\n# The stdio MCP server `{}`: `oncely mcp` guards it, not an `[[mcp]]` table.\n\
             # Wrap the server: in the host's config, start this instead of its command:\n\
             #   {}\n",
            source.trim().replace(['\n', '\r'], " "),
            wrapper_line(source, &actions_of(source, Transport::Stdio)).replace(['\n', '\r'], " ")
        ));
    }
    out
}
