//! The answers oncely reads on their way back and edits: a `tools/list` result (learnt
//! from; guarded tools offer no task-augmented calls) and a `server/discover` result (the
//! tasks extension advertised). Transports apply the [`EditFn`] to each message of the
//! answer (HTTP as it streams, `crate::body::Edit`).

use std::sync::Arc;

use serde_json::Value;

use super::shared::Shared;
use crate::tasks;

/// Most bytes of a JSON answer oncely reads to edit it (`tools/list`, `server/discover`);
/// a larger one passes through unread.
pub const EDIT_LIMIT: usize = 8 << 20;

/// What an edit does to each JSON-RPC message of an answer: changes it in place and says
/// whether it did.
pub type EditFn = Box<dyn FnMut(&mut Value) -> bool + Send + Sync>;

/// Whether oncely edits an answer it passes through, and how (see [`editor`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AnswerEdit {
    /// A `tools/list` result: learnt from; guarded tools offer no task-augmented calls.
    ToolsList,
    /// A `server/discover` result: the tasks extension is advertised.
    Discover,
}

/// What the answers to the requests `edits` names get.
pub(crate) fn editor(core: Arc<Shared>, edits: Vec<(Value, AnswerEdit)>) -> EditFn {
    Box::new(move |message: &mut Value| {
        let Some(answer) = edits
            .iter()
            .find(|(id, _)| message.get("id") == Some(id))
            .map(|(_, a)| *a)
        else {
            return false;
        };
        let Some(result) = message.get_mut("result").filter(|r| r.is_object()) else {
            return false;
        };
        match answer {
            AnswerEdit::ToolsList => {
                core.catalog.observe_list(result);
                core.catalog.note_overruled_hints(&core.config.tools);
                forbid_tasks(&core, result)
            }
            AnswerEdit::Discover => advertise_tasks(result),
        }
    })
}

/// Sets `execution.taskSupport` to `forbidden` on every guarded tool of a `tools/list`
/// result that offered task-augmented calls (2025-11-25): a client then calls it as
/// a plain call, the one oncely guards. Says whether it changed anything.
fn forbid_tasks(core: &Shared, result: &mut Value) -> bool {
    let Some(tools) = result.get_mut("tools").and_then(Value::as_array_mut) else {
        return false;
    };
    let mut changed = false;
    for tool in tools {
        let guarded = tool
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|name| core.catalog.is_guarded(&core.config.tools, name));
        let support = tool.pointer_mut("/execution/taskSupport");
        if let (true, Some(support)) = (guarded, support) {
            if support.as_str() != Some("forbidden") {
                *support = Value::String("forbidden".into());
                changed = true;
            }
        }
    }
    changed
}

/// Adds `capabilities.extensions["io.modelcontextprotocol/tasks"]` to a `server/discover`
/// result: oncely answers tasks for the calls it guards, whatever the server speaks.
fn advertise_tasks(result: &mut Value) -> bool {
    let Some(obj) = result.as_object_mut() else {
        return false;
    };
    let object = || Value::Object(Default::default());
    let capabilities = obj.entry("capabilities").or_insert_with(object);
    let Some(capabilities) = capabilities.as_object_mut() else {
        return false;
    };
    let extensions = capabilities.entry("extensions").or_insert_with(object);
    match extensions.as_object_mut() {
        Some(e) if !e.contains_key(tasks::TASKS_EXTENSION) => {
            e.insert(tasks::TASKS_EXTENSION.into(), object());
            true
        }
        _ => false,
    }
}
