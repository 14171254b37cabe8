//! What oncely knows of the server's tools, learned from its own `tools/list` answers as
//! they pass through (and refreshed with every later listing, so a tool whose annotation
//! or schema changes is treated by its latest listing): which are read-only, which
//! require a task-augmented call (`execution.taskSupport: "required"`, 2025-11-25), and
//! which parameters each mirrors into headers (`x-mcp-header`, [`crate::header_params`]).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use serde_json::Value;

use crate::config::ToolSelection;
use crate::header_params::{declared, HeaderParam};

/// The tools seen so far, by name: whether each is annotated `readOnlyHint: true`, and
/// the parameters of those that mirror some into headers.
#[derive(Debug, Default)]
pub struct ToolCatalog {
    read_only: RwLock<HashMap<String, bool>>,
    /// The tools named in the selection and annotated read-only that were logged.
    overruled: std::sync::Mutex<std::collections::HashSet<String>>,
    header_params: RwLock<HashMap<String, Arc<[HeaderParam]>>>,
    /// The tools the server runs only as tasks: listed `taskSupport: "required"`, or
    /// refused when called without a task.
    need_tasks: RwLock<std::collections::HashSet<String>>,
    /// Each tool's `inputSchema`, as its latest listing gave it (its key arguments'
    /// schemas say whether a UUID fits them).
    schemas: RwLock<HashMap<String, Arc<Value>>>,
}

impl ToolCatalog {
    /// An empty catalog.
    pub fn new() -> ToolCatalog {
        ToolCatalog::default()
    }

    /// Learns from one `tools/list` result (`{"tools": [...]}`); returns how many tools it named.
    pub fn observe_list(&self, result: &Value) -> usize {
        let Some(tools) = result.get("tools").and_then(Value::as_array) else {
            return 0;
        };
        let mut map = self.read_only.write().unwrap_or_else(|e| e.into_inner());
        let mut params = self
            .header_params
            .write()
            .unwrap_or_else(|e| e.into_inner());
        let mut need_tasks = self.need_tasks.write().unwrap_or_else(|e| e.into_inner());
        let mut schemas = self.schemas.write().unwrap_or_else(|e| e.into_inner());
        for tool in tools {
            if let Some(name) = tool.get("name").and_then(Value::as_str) {
                match tool.get("inputSchema") {
                    Some(schema) => {
                        schemas.insert(name.to_string(), Arc::new(schema.clone()));
                    }
                    None => {
                        schemas.remove(name);
                    }
                }
                let support = tool.pointer("/execution/taskSupport");
                if support.and_then(Value::as_str) == Some("required") {
                    need_tasks.insert(name.to_string());
                } else {
                    need_tasks.remove(name);
                }
                let ro = tool
                    .pointer("/annotations/readOnlyHint")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                map.insert(name.to_string(), ro);
                let schema = tool.get("inputSchema").unwrap_or(&Value::Null);
                match declared(schema) {
                    Ok(found) if !found.is_empty() => {
                        params.insert(name.to_string(), found.into());
                    }
                    Ok(_) => {
                        params.remove(name);
                    }
                    // A client excludes such a tool (2026-07-28); a call of it is left
                    // to the server.
                    Err(why) => {
                        tracing::warn!(tool = name, %why,
                            "the tool's x-mcp-header declarations are invalid: its Mcp-Param headers are not checked");
                        params.remove(name);
                    }
                }
            }
        }
        tools.len()
    }

    /// Logs, once per tool, each tool that `selection` names exactly and the server's
    /// listing annotates `readOnlyHint: true`: guarded all the same, because the operator
    /// named it (an annotation is an untrusted hint). Returns those tools.
    pub fn note_overruled_hints(&self, selection: &ToolSelection) -> Vec<String> {
        let map = self.read_only.read().unwrap_or_else(|e| e.into_inner());
        let mut logged = self.overruled.lock().unwrap_or_else(|e| e.into_inner());
        let mut found: Vec<String> = map
            .iter()
            .filter(|(name, ro)| **ro && selection.names(name))
            .map(|(name, _)| name.clone())
            .collect();
        found.sort();
        for name in &found {
            if logged.insert(name.clone()) {
                tracing::warn!(tool = %name,
                    "the server marks this tool readOnlyHint, but tools names it: it is guarded as named");
            }
        }
        found
    }

    /// The parameters tool `name` mirrors into `Mcp-Param-*` headers, as its latest
    /// listing declared them (none when it declared none, or was never listed).
    pub fn header_params(&self, name: &str) -> Option<Arc<[HeaderParam]>> {
        let params = self.header_params.read().unwrap_or_else(|e| e.into_inner());
        params.get(name).cloned()
    }

    /// Tool `name`'s `inputSchema`, as its latest listing gave it.
    pub fn input_schema(&self, name: &str) -> Option<Arc<Value>> {
        let schemas = self.schemas.read().unwrap_or_else(|e| e.into_inner());
        schemas.get(name).cloned()
    }

    /// Whether the server runs `name` only as a task.
    pub fn needs_task(&self, name: &str) -> bool {
        let need = self.need_tasks.read().unwrap_or_else(|e| e.into_inner());
        need.contains(name)
    }

    /// Learns that the server runs `name` only as a task (it refused a call without one).
    pub fn learn_needs_task(&self, name: &str) {
        let mut need = self.need_tasks.write().unwrap_or_else(|e| e.into_inner());
        if need.insert(name.to_string()) {
            tracing::info!(
                tool = name,
                "the server runs this tool only as a task: oncely calls it as one from now on"
            );
        }
    }

    /// Whether `name` is known to be read-only.
    pub fn is_read_only(&self, name: &str) -> bool {
        let map = self.read_only.read().unwrap_or_else(|e| e.into_inner());
        map.get(name).copied().unwrap_or(false)
    }

    /// The value a metric label takes for a call of `name`: the name when a `tools/list`
    /// answer or the config (`tools = [...]`) named it, else `other`. A client chooses
    /// the name it calls, and every distinct label value is a series kept for the life of
    /// the process, so unknown names share one.
    pub fn metric_label<'a>(&self, selection: &ToolSelection, name: &'a str) -> &'a str {
        let named =
            matches!(selection, ToolSelection::Named(names) if names.iter().any(|n| n == name));
        let listed = || {
            let map = self.read_only.read().unwrap_or_else(|e| e.into_inner());
            map.contains_key(name)
        };
        if named || listed() {
            name
        } else {
            "other"
        }
    }

    /// Whether a call of `name` is deduplicated under `selection`.
    pub fn is_guarded(&self, selection: &ToolSelection, name: &str) -> bool {
        selection.guards(name, self.is_read_only(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn read_only_tools_are_never_guarded_and_listing_refreshes() {
        let c = ToolCatalog::new();
        let all = ToolSelection::AllButReadOnly;
        assert!(c.is_guarded(&all, "render"), "an unlisted tool is guarded");
        c.observe_list(&json!({"tools":[{"name":"render"},{"name":"balance","annotations":{"readOnlyHint":true}}]}));
        assert!(c.is_guarded(&all, "render"));
        assert!(!c.is_guarded(&all, "balance"));
        let named = ToolSelection::Named(vec!["balance".into(), "render".into()]);
        assert!(
            c.is_guarded(&named, "balance"),
            "the operator's name wins over the server's hint"
        );
        assert_eq!(c.note_overruled_hints(&named), vec!["balance".to_string()]);
        assert!(c.note_overruled_hints(&all).is_empty());
        let pattern = ToolSelection::Named(vec!["bal*".into(), "ren*".into()]);
        assert!(
            !c.is_guarded(&pattern, "balance"),
            "a pattern still skips read-only tools"
        );
        assert!(c.is_guarded(&pattern, "render"));
        assert!(!c.is_guarded(&ToolSelection::Named(vec![]), "render"));
        c.observe_list(&json!({"tools":[{"name":"balance","annotations":{"readOnlyHint":false}}]}));
        assert!(c.is_guarded(&all, "balance"), "the latest listing counts");
    }

    #[test]
    fn header_params_follow_the_latest_listing() {
        let c = ToolCatalog::new();
        let marked = json!({"tools":[{"name":"q","inputSchema":{"type":"object",
            "properties":{"region":{"type":"string","x-mcp-header":"Region"}}}}]});
        c.observe_list(&marked);
        let params = c.header_params("q").unwrap();
        assert_eq!(params[0].header(), "Mcp-Param-Region");
        assert!(c.header_params("other").is_none());
        c.observe_list(&json!({"tools":[{"name":"q","inputSchema":{"type":"object"}}]}));
        assert!(c.header_params("q").is_none(), "unmarked now");
        c.observe_list(&marked);
        c.observe_list(&json!({"tools":[{"name":"q","inputSchema":{"type":"object",
            "properties":{"list":{"items":{"x-mcp-header":"Item"}}}}}]}));
        assert!(
            c.header_params("q").is_none(),
            "an invalid declaration checks nothing"
        );
    }

    #[test]
    fn metric_labels_are_listed_or_configured_names_else_other() {
        let c = ToolCatalog::new();
        let all = ToolSelection::AllButReadOnly;
        assert_eq!(c.metric_label(&all, "render"), "other");
        c.observe_list(&json!({"tools":[{"name":"render"}]}));
        assert_eq!(c.metric_label(&all, "render"), "render");
        assert_eq!(c.metric_label(&all, "x-1"), "other");
        let named = ToolSelection::Named(vec!["quote".into()]);
        assert_eq!(c.metric_label(&named, "quote"), "quote");
        assert_eq!(c.metric_label(&named, "x-2"), "other");
    }
}
