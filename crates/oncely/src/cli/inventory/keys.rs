//! Keys the caller makes up: which arguments of a tool are idempotency keys the model
//! fills in and what oncely does with each (decided by `oncely_mcp::key_arguments`, the
//! endpoint's own rules), and the gap of a tool or operation whose description tells its
//! caller to send a new or unique key with every request.
//!
//! Such a description is found by these patterns, in one sentence (see [`sentences`]),
//! read as lower-case words (camelCase split):
//!
//! - [`NEW`] (with none of [`NOT`] in the three words before it), then within eight words
//!   [`EACH`], then within three words [`ATTEMPT`]: "must be unique for every request",
//!   "generate a new UUID for each request", "unique per call";
//! - [`EACH`], within three words [`ATTEMPT`], within four words [`MUST`], then within
//!   four words [`NEW`]: "each request must have a unique key".
//!
//! Unless the text describes the key itself (a key argument, the `Idempotency-Key`
//! header), the sentence must also name a key ([`KEY`]), or the argument it describes
//! must. A text with a sentence that says to reuse the key on retries (one of
//! [`REUSE`] and one of [`RETRY`]) asks for a key per intention, not per request: it
//! matches nothing.

use oncely_core::Class;
use oncely_mcp::key_arguments::{admits_uuid, property};
use oncely_mcp::KeyArguments;
use oncely_tower::KeyMode;
use serde_json::{json, Value};

use super::model::{Found, Gap, KeyArgument, Said, Target};
use super::shell;
use super::words::words;
use crate::config::{McpEntry, Route};

/// Words that ask for a key of its own.
const NEW: &[&str] = &["unique", "new", "different", "fresh", "distinct"];
/// Words before [`NEW`] that turn it around.
const NOT: &[&str] = &[
    "not", "never", "no", "don", "dont", "doesn", "shouldn", "mustn", "avoid",
];
/// "every request".
const EACH: &[&str] = &["every", "each", "per"];
const ATTEMPT: &[&str] = &[
    "request",
    "requests",
    "call",
    "calls",
    "attempt",
    "attempts",
    "time",
    "times",
    "invocation",
    "invocations",
    "retry",
    "retries",
    "try",
];
/// "each request must have a unique key".
const MUST: &[&str] = &["must", "should", "needs", "need", "requires", "require"];
/// What names a key.
const KEY: &[&str] = &[
    "key",
    "keys",
    "token",
    "tokens",
    "uuid",
    "uuids",
    "guid",
    "idempotency",
    "nonce",
    "identifier",
    "id",
];
/// A sentence with one of these and one of [`RETRY`] says to reuse the key on retries.
const REUSE: &[&str] = &["same", "reuse", "reused", "reusing", "again"];
const RETRY: &[&str] = &["retry", "retries", "retrying", "retried"];

/// Names that make an argument the likely key when a tool's description asks for one.
const KEYISH: &[&str] = &["key", "token", "nonce", "idempotency", "uuid"];

/// The key arguments of the tool `tool` listed with `schema`, as `setting` and the
/// endpoint's rules make them; `guarded`: whether oncely guards its calls.
pub(super) fn of_tool(
    tool: &str,
    schema: Option<&Value>,
    setting: &KeyArguments,
    guarded: bool,
) -> Vec<KeyArgument> {
    let Some(schema) = schema else {
        return Vec::new();
    };
    // The arguments a call could hold, for the endpoint's own rule of which are keys.
    let arguments = skeleton(schema, 0);
    setting
        .of(tool, &arguments)
        .into_iter()
        .map(|pointer| {
            let at = property(schema, &pointer);
            let replaced = at.is_none_or(admits_uuid);
            let mut what = if replaced {
                "replaced with a derived UUID".to_owned()
            } else {
                format!(
                    "forwarded as sent ({})",
                    ruled_out(at.unwrap_or(&Value::Null))
                )
            };
            if !guarded {
                what.push_str(", once oncely guards the tool");
            }
            KeyArgument {
                pointer,
                replaced,
                what,
            }
        })
        .collect()
}

/// An object with every property `schema` has, nested ones as objects, values `null`.
fn skeleton(schema: &Value, depth: usize) -> Value {
    match schema.get("properties").and_then(Value::as_object) {
        Some(properties) if depth < 32 => Value::Object(
            properties
                .iter()
                .map(|(name, s)| (name.clone(), skeleton(s, depth + 1)))
                .collect(),
        ),
        _ => Value::Null,
    }
}

/// "the schema's maxLength 16 rules the UUID out": each rule of a property's schema that
/// rules a UUID out on its own.
fn ruled_out(schema: &Value) -> String {
    let rules: Vec<String> = ["type", "format", "pattern", "maxLength", "minLength"]
        .into_iter()
        .filter_map(|k| {
            let v = schema.get(k)?;
            (!admits_uuid(&json!({ k: v }))).then(|| format!("{k} {v}"))
        })
        .collect();
    match rules.len() {
        0 => "the schema rules the UUID out".into(),
        1 => format!("the schema's {} rules the UUID out", rules[0]),
        _ => format!("the schema's {} rule the UUID out", rules.join(" and ")),
    }
}

/// The sentence of `text` that asks for a new or unique key with every request, when one
/// does; `of_key`: the text describes the key itself; `name`: the words of the argument
/// it describes.
pub(super) fn asks_new_key(text: &str, of_key: bool, name: &[String]) -> Option<String> {
    let sentences = sentences(text);
    let any = |w: &[String], set: &[&str]| w.iter().any(|w| set.contains(&w.as_str()));
    if sentences.iter().any(|s| {
        let w = words(s);
        any(&w, REUSE) && any(&w, RETRY)
    }) {
        return None;
    }
    let keyed = of_key || any(name, KEY);
    sentences.into_iter().find_map(|s| {
        let w = words(s);
        ((keyed || any(&w, KEY)) && per_request(&w)).then(|| quote(s))
    })
}

/// The sentences of a text: split at a line end, at `;`, and at `.`, `!` or `?` that ends
/// the text or is followed by a blank and a capital ("e.g. a UUID" is one sentence).
fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in text.char_indices() {
        let after = &text[i + c.len_utf8()..];
        let next = after.trim_start();
        let ends = match c {
            '\n' | ';' => true,
            '.' | '!' | '?' => {
                next.is_empty()
                    || (next.len() < after.len() && next.starts_with(char::is_uppercase))
            }
            _ => false,
        };
        if ends {
            out.push(&text[start..i]);
            start = i + c.len_utf8();
        }
    }
    out.push(&text[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// Whether the words ask for a key of its own with every request (the patterns above).
fn per_request(w: &[String]) -> bool {
    let is = |i: usize, set: &[&str]| w.get(i).is_some_and(|w| set.contains(&w.as_str()));
    let within = |from: usize, n: usize, set: &[&str]| (from..from + n).find(|i| is(*i, set));
    let negated = |from: usize, to: usize| (from..to).any(|i| is(i, NOT));
    (0..w.len()).any(|i| {
        let new_each = is(i, NEW)
            && !negated(i.saturating_sub(3), i)
            && (i + 1..=i + 8).any(|j| is(j, EACH) && within(j + 1, 3, ATTEMPT).is_some());
        let each_must_new = is(i, EACH)
            && within(i + 1, 3, ATTEMPT)
                .and_then(|r| within(r + 1, 4, MUST))
                .and_then(|m| within(m + 1, 4, NEW).map(|u| (m, u)))
                .is_some_and(|(m, u)| !negated(m + 1, u));
        new_each || each_must_new
    })
}

/// A sentence as a gap quotes it: at most 160 characters.
fn quote(sentence: &str) -> String {
    match sentence.char_indices().nth(160) {
        Some((at, _)) => format!("{}...", &sentence[..at]),
        None => sentence.to_owned(),
    }
}

/// The descriptions of the properties of `schema`, nested ones too, by JSON pointer.
fn described(schema: &Value, prefix: &str, depth: usize, out: &mut Vec<(String, String)>) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, s) in properties {
        let pointer = format!("{prefix}/{}", name.replace('~', "~0").replace('/', "~1"));
        if let Some(d) = s.get("description").and_then(Value::as_str) {
            out.push((pointer.clone(), d.to_owned()));
        }
        if depth < 32 {
            described(s, &pointer, depth + 1, out);
        }
    }
}

/// The words of the last name in a JSON pointer.
fn name_words(pointer: &str) -> Vec<String> {
    words(pointer.rsplit('/').next().unwrap_or(""))
}

fn why(at: &str, sentence: &str, who: &str) -> String {
    format!(
        "{at} tells the {who} to send a new or unique key with every request (\"{sentence}\"): \
         a {who} told this makes up a new key on every retry, so the server's own idempotency \
         sees a new key each time and runs the call again"
    )
}

/// Where a tool's settings go, for the fix.
pub(super) enum Place<'a> {
    /// A Streamable HTTP server: its `[[mcp]]`, when the config has one.
    Mcp(Option<&'a McpEntry>),
    /// A stdio server: the `oncely mcp` line.
    Stdio,
}

/// The `new_key_per_request` gap of the tool `tool`, when one of its descriptions asks
/// for a new key with every request.
pub(super) fn tool_gap(
    tool: &str,
    f: &Found,
    keys: &[KeyArgument],
    guarded: bool,
    class: Class,
    place: Place<'_>,
) -> Option<Gap> {
    let mut properties = Vec::new();
    if let Some(schema) = &f.input_schema {
        described(schema, "", 0, &mut properties);
    }
    let is_key = |p: &str| keys.iter().any(|k| k.pointer == p);
    let property_said = |p: &String, d: &String| Said {
        at: format!("the description of {p}"),
        text: d.clone(),
        of_key: is_key(p),
    };
    // An argument that is not a key first (the config must name it), then the keys, then
    // the tool's own description.
    let texts = properties
        .iter()
        .filter(|(p, _)| !is_key(p))
        .chain(properties.iter().filter(|(p, _)| is_key(p)))
        .map(|(p, d)| (Some(p.clone()), property_said(p, d)))
        .chain(f.said.iter().map(|s| (None, s.clone())));
    let (pointer, said, sentence) = texts.into_iter().find_map(|(p, s)| {
        let name = p.as_deref().map(name_words).unwrap_or_default();
        asks_new_key(&s.text, s.of_key, &name).map(|q| (p, s, q))
    })?;
    let why = why(&said.at, &sentence, "model");
    // The tool's description may name the argument the key goes in.
    let pointer = pointer.or_else(|| mentioned(&sentence, f, keys));
    let key = match &pointer {
        Some(p) => keys.iter().find(|k| &k.pointer == p),
        None => keys.iter().find(|k| !k.replaced).or(keys.first()),
    };
    let (detail, fix) = match key {
        None => {
            let argument = pointer.clone().unwrap_or_else(|| likely_key(f));
            let not_one = match &pointer {
                Some(p) => format!("{p} is not one"),
                None => "no argument of this tool is one".into(),
            };
            let entry = format!("{tool}:{argument}");
            let mut fix = match place {
                Place::Mcp(m) => format!(
                    "key_arguments = [{}]  # add to the key_arguments of {}",
                    toml_string(&entry),
                    m.map_or("the [[mcp]] that guards it".into(), |m| {
                        format!("the [[mcp]] of {}", m.upstream)
                    })
                ),
                Place::Stdio => format!(
                    "--key-argument {}  # on the `oncely mcp` line, before its `--` \
                     (or in key_arguments of [mcp_stdio])",
                    shell::quote(&entry)
                ),
            };
            if argument == "/ARGUMENT" {
                fix.push_str("\n# /ARGUMENT: the argument that carries the key");
            }
            (
                format!(
                    "{why}. oncely keeps such a call one intention by leaving its key \
                     arguments out of the call's key and sending a key derived from the \
                     record in them, but {not_one}"
                ),
                fix,
            )
        }
        Some(k) if k.replaced => (
            format!(
                "{why}. oncely keeps the call one intention{}: {} is left out of the call's \
                 key, and the server gets in it a key derived from the record, the same on \
                 every attempt",
                if guarded {
                    ""
                } else {
                    " once it guards the tool"
                },
                k.pointer
            ),
            if guarded {
                format!(
                    "# nothing to add: keep the tool guarded and {} a key argument \
                     (no `key_arguments = []`)",
                    k.pointer
                )
            } else {
                "# guard the tool (the lines of its `unguarded` gap): nothing more is needed".into()
            },
        ),
        Some(k) => (
            format!(
                "{why}. oncely leaves {} out of the call's key, so a repeat gets the first \
                 call's result, but it is {}: an attempt that reaches the server again (a \
                 retry after a released failure) carries the model's new key",
                k.pointer, k.what
            ),
            match (guarded, class, place) {
                (true, Class::Action, _) => "# nothing to add: the tool is an action, so an \
                     uncertain outcome is reconciled, never run again"
                    .into(),
                (false, ..) => "# guard the tool as an action (the lines of its `unguarded` \
                     gap, with the tool in `actions`): an uncertain outcome is then \
                     reconciled, never run again"
                    .into(),
                (true, _, Place::Mcp(_)) => format!(
                    "actions = [{}]  # add to the actions of its [[mcp]]: an uncertain \
                     outcome is then reconciled, never run again",
                    toml_string(tool)
                ),
                (true, _, Place::Stdio) => format!(
                    "--action {}  # on the `oncely mcp` line: an uncertain outcome is then \
                     reconciled, never run again",
                    shell::quote(tool)
                ),
            },
        ),
    };
    Some(Gap {
        kind: "new_key_per_request",
        detail,
        fix,
    })
}

/// The top-level argument of the tool `f` that `sentence` names (its name's words in a
/// row), when it is a key argument or named like a key ([`KEYISH`]): "pass it as nonce".
fn mentioned(sentence: &str, f: &Found, keys: &[KeyArgument]) -> Option<String> {
    let said = words(sentence);
    top_level(f).into_iter().find(|p| {
        let name = name_words(p);
        let keyish = keys.iter().any(|k| &k.pointer == p)
            || name.iter().any(|w| KEYISH.contains(&w.as_str()));
        keyish && !name.is_empty() && said.windows(name.len()).any(|w| w == name.as_slice())
    })
}

/// The JSON pointers of a tool's top-level arguments.
fn top_level(f: &Found) -> Vec<String> {
    f.input_schema
        .as_ref()
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .map(|p| {
            p.keys()
                .map(|k| format!("/{}", k.replace('~', "~0").replace('/', "~1")))
                .collect()
        })
        .unwrap_or_default()
}

/// The argument a tool's key likely goes in, when its description asks for a key but no
/// argument is one: the only top-level property named like a key, else `/ARGUMENT`.
fn likely_key(f: &Found) -> String {
    let top = top_level(f);
    let keyish: Vec<&String> = top
        .iter()
        .filter(|p| name_words(p).iter().any(|w| KEYISH.contains(&w.as_str())))
        .collect();
    match keyish.as_slice() {
        [one] => (*one).clone(),
        _ => "/ARGUMENT".into(),
    }
}

/// The `new_key_per_request` gap of an HTTP operation, when its summary, description or
/// `Idempotency-Key` header's description asks for a new key with every request;
/// `route`: the route that guards it.
pub(super) fn operation_gap(f: &Found, route: Option<&Route>) -> Option<Gap> {
    let Target::Http { method, path, .. } = &f.target else {
        return None;
    };
    let (said, sentence) = f
        .said
        .iter()
        .find_map(|s| asks_new_key(&s.text, s.of_key, &[]).map(|q| (s, q)))?;
    let why = why(&said.at, &sentence, "caller");
    let keyed = "the call is keyed by its request, and the upstream gets in Idempotency-Key a \
                 key derived from the record, the same on every attempt";
    let (state, fix) = match route {
        Some(r) if r.key == KeyMode::Fingerprint => (
            "oncely keeps the call one intention: the route keys it by its request, not by \
             the header, and sends the upstream a key derived from the record in \
             Idempotency-Key, the same on every attempt"
                .to_owned(),
            format!(
                "# nothing to add: keep key = \"fingerprint\"  # (in the route {})",
                r.name
            ),
        ),
        Some(r) => (
            match r.key {
                KeyMode::None => "the route keys nothing".to_owned(),
                _ => "the route keys the call by that header when it is sent, so each \
                      attempt is a new call"
                    .to_owned(),
            },
            format!(
                "key = \"fingerprint\"  # (in the route {}): {keyed}",
                r.name
            ),
        ),
        None => (
            "a route keyed by that header (the default, header-or-fingerprint, uses it when \
             it is sent) takes each attempt for a new call"
                .to_owned(),
            format!(
                "key = \"fingerprint\"  # in the [[routes]] of {method} {}: {keyed}",
                path.replace(['\n', '\r'], " ")
            ),
        ),
    };
    Some(Gap {
        kind: "new_key_per_request",
        detail: format!("{why}; {state}"),
        fix,
    })
}

/// The key-argument setting for a stdio tool without a wrapper line that names some.
pub(super) fn stdio_default(config: Option<&crate::config::Config>) -> KeyArguments {
    config.map_or_else(KeyArguments::default, |c| c.mcp_stdio.key_arguments.clone())
}

/// A TOML string.
fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asks(text: &str) -> bool {
        asks_new_key(text, false, &[]).is_some()
    }

    #[test]
    fn descriptions_that_ask_for_a_new_key_with_every_request() {
        for yes in [
            "A unique string that identifies this CreatePayment request. Keys can be any \
             valid string but must be unique for every CreatePayment request.",
            "Generate a new UUID for each request.",
            "Send a unique key for every call.",
            "Use a different idempotency token on each attempt",
            "The key: unique per request",
            "Each request must have a unique idempotency key.",
            "Provide a fresh client token every time you call this tool",
        ] {
            assert!(asks(yes), "{yes}");
        }
        for no in [
            "Use the same key for retries.",
            "Reuse the idempotency key when you retry; a new key makes a new payment.",
            "Send a new key for each new payment. Send the same key again when retrying.",
            "Do not generate a new key for each retry.",
            "Returns a new random number each call.",
            "Each call creates a new order with a unique id.",
            "Creates a payment.",
            "A unique key that identifies the payment.",
        ] {
            assert!(!asks(no), "{no}");
        }
        // A key's own description need not name the key.
        assert!(asks_new_key("Must be unique for every request.", true, &[]).is_some());
        assert!(!asks("Must be unique for every request."));
        assert!(
            asks_new_key("Must be unique for every request.", false, &words("nonce")).is_some()
        );
    }

    #[test]
    fn key_arguments_are_the_endpoints_and_say_what_the_server_gets() {
        let schema = json!({"properties": {
            "idempotency_key": {"type": "string"},
            "client_token": {"type": "string", "maxLength": 16},
            "request_id": {"type": "integer", "format": "int64"},
            "ref": {"properties": {"nonce": {"type": "string"}}},
            "amount": {"type": "integer"},
        }});
        let keys = of_tool("pay", Some(&schema), &KeyArguments::default(), true);
        let got: Vec<(&str, &str)> = keys
            .iter()
            .map(|k| (k.pointer.as_str(), k.what.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "/client_token",
                    "forwarded as sent (the schema's maxLength 16 rules the UUID out)"
                ),
                ("/idempotency_key", "replaced with a derived UUID"),
                (
                    "/request_id",
                    "forwarded as sent (the schema's type \"integer\" and format \"int64\" \
                     rule the UUID out)"
                ),
            ]
        );
        let named = KeyArguments::parse(&["pay:/ref/nonce".into()]).unwrap();
        let keys = of_tool("pay", Some(&schema), &named, false);
        assert_eq!(keys.last().unwrap().pointer, "/ref/nonce");
        assert_eq!(
            keys.last().unwrap().what,
            "replaced with a derived UUID, once oncely guards the tool"
        );
        let off = KeyArguments::parse(&[]).unwrap();
        assert!(of_tool("pay", Some(&schema), &off, true).is_empty());
        assert!(of_tool("pay", None, &named, true).is_empty());
    }
}
