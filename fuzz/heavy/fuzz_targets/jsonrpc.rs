//! Fuzzes oncely-mcp's JSON-RPC message reading and the `tools/call` arguments fingerprint.
//!
//! Run with: `cargo +nightly fuzz run --fuzz-dir fuzz/heavy jsonrpc` (from the repository
//! root). The input is read as a message (or a batch), and again as the `arguments` of a
//! `tools/call`. Nothing may panic; `jsonrpc::parse` reads what `serde_json` reads, the
//! same way, and all other JSON `oncely_core::canon` reads; a message that parses
//! re-serialises to text that parses to the same message; forwarding a call changes only
//! `params._meta` and `task`; the raw texts oncely reads (batch items, `arguments`) are
//! exactly the parts the parsed message holds; `oncely_core::canon` accepts every
//! `arguments` text `serde_json` accepts; and the fingerprint of arguments equals the
//! fingerprint of the same arguments re-spelled (white space, member order, number,
//! string and key spellings) and of their canonical form.
//!
//! Never unguarded: when the input is a JSON object, its members are added to the
//! `params` of a guarded `tools/call` (all but `name` and `arguments`, which make the
//! call). The call is still read as that tool's call ([`jsonrpc::ToolCall`], what the
//! endpoint guards), keyed as the call without them unless they continue a
//! multi-round-trip exchange (`inputResponses`, `requestState`), and forwarded without
//! its `task` parameter, with the downstream key in `_meta` and its arguments as written.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oncely_core::canon::Json;
use oncely_mcp::jsonrpc;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        let _ = serde_json::from_slice::<Value>(data);
        return;
    };
    check_message(text);
    let wrapped = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"t","arguments":{text}}}}}"#
    );
    check_message(&wrapped);
    check_never_unguarded(text);
});

/// A guarded call with the input's members added to its `params` is still that call.
fn check_never_unguarded(text: &str) {
    let Some(Value::Object(extra)) = jsonrpc::parse(text.as_bytes()) else {
        return;
    };
    let wrapped = format!("[{text}]");
    let Some(members) = jsonrpc::batch_texts(&wrapped) else {
        return;
    };
    debug_assert_eq!(members.len(), 1);
    let arguments = r#"{"amount":1000,"to":"acct_1"}"#;
    let base = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"pay","arguments":{arguments}}}}}"#
    );
    let base_value: Value = serde_json::from_str(&base).expect("the base call parses");
    let key = jsonrpc::ToolCall::read(&base_value, &base)
        .expect("the base call is a tool call")
        .fingerprint("principal", "/mcp");
    // The input's members, as written, after name and arguments (which make the call).
    let inner = members[0].trim();
    let inner = &inner[1..inner.len() - 1];
    if inner.trim().is_empty() {
        return;
    }
    let call = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"pay","arguments":{arguments},{inner}}}}}"#
    );
    let Some(value) = jsonrpc::parse(call.as_bytes()) else {
        return;
    };
    let params = value["params"].as_object().expect("params is an object");
    if params.get("name") != Some(&Value::from("pay"))
        || params.get("arguments") != base_value["params"].get("arguments")
        || extra.contains_key("name")
        || extra.contains_key("arguments")
    {
        return;
    }
    let read = jsonrpc::ToolCall::read(&value, &call).expect("a guarded call with members added is still a tool call");
    assert_eq!(read.tool, "pay", "another tool: {call}");
    assert_eq!(read.arguments, Some(arguments), "other arguments: {call}");
    let continues = |name: &str| extra.get(name).is_some_and(|v| !v.is_null());
    let continuation = continues("inputResponses") || continues("requestState");
    assert_eq!(read.is_continuation(), continuation);
    if !continuation {
        assert_eq!(read.fingerprint("principal", "/mcp"), key, "a member changed the key: {call}");
    }
    let forwarded = jsonrpc::forwarded_call(&call, "k").expect("a tool call is forwarded");
    let sent: Value = jsonrpc::parse(forwarded.as_bytes()).expect("the forwarded call parses");
    assert!(sent["params"].get(jsonrpc::TASK_PARAM).is_none(), "forwarded with task: {forwarded}");
    assert_eq!(sent["params"]["_meta"][jsonrpc::IDEMPOTENCY_KEY_META], "k");
    assert_eq!(jsonrpc::arguments_text(&forwarded), Some(arguments));
}

fn check_message(text: &str) {
    let batch = jsonrpc::batch_texts(text);
    let by_serde = serde_json::from_str::<Value>(text).ok();
    let Some(value) = jsonrpc::parse(text.as_bytes()) else {
        assert!(by_serde.is_none(), "serde_json reads what parse does not");
        assert!(
            oncely_core::canonical_json(text.as_bytes(), &[]).is_none(),
            "canon reads JSON that parse does not"
        );
        let _ = jsonrpc::arguments_text(text);
        return;
    };
    if let Some(by_serde) = by_serde {
        assert_eq!(by_serde, value, "parse disagrees with serde_json");
    }
    let again = serde_json::to_string(&value).expect("a parsed message serialises");
    let reparsed: Value = serde_json::from_str(&again).expect("a re-serialised message parses");
    assert_eq!(reparsed, value, "a message re-serialised is another message");
    match &value {
        Value::Array(items) => {
            let texts = batch.expect("a JSON array is a batch");
            assert_eq!(texts.len(), items.len());
            for (t, item) in texts.iter().zip(items) {
                let read = jsonrpc::parse(t.as_bytes()).expect("a batch item's text parses");
                assert_eq!(&read, item, "a batch item's text is another item");
                check_item(t, item);
            }
        }
        _ => {
            assert!(batch.is_none(), "only an array is a batch");
            check_item(text, &value);
        }
    }
}

fn check_item(text: &str, value: &Value) {
    if let Some(request) = jsonrpc::as_request(value) {
        let _ = jsonrpc::response_to(value, request.id);
        let _ = jsonrpc::id_text(request.id);
    }
    let _ = jsonrpc::as_notification(value);
    let _ = jsonrpc::cancelled_request_id(value);
    let arguments = jsonrpc::arguments_text(text);
    let keyed = jsonrpc::forwarded_call(text, "k\u{e9}y\"");
    let mut expected_keyed = value.clone();
    match expected_keyed.get_mut("params").filter(|p| p.is_object()) {
        Some(params) => {
            if let Some(p) = params.as_object_mut() {
                p.remove(jsonrpc::TASK_PARAM);
            }
            jsonrpc::set_meta(params, jsonrpc::IDEMPOTENCY_KEY_META, "k\u{e9}y\"".into());
            let keyed = keyed.expect("a request with object params takes a key");
            let read = jsonrpc::parse(keyed.as_bytes()).expect("a keyed message parses");
            assert_eq!(read, expected_keyed, "forwarding changed more than _meta and task");
            assert_eq!(
                jsonrpc::arguments_text(&keyed),
                arguments,
                "the key changed how the arguments are written"
            );
        }
        None => assert!(keyed.is_none(), "a key set without object params"),
    }
    let expected = value.get("params").and_then(|p| p.get("arguments"));
    assert_eq!(
        arguments.is_some(),
        expected.is_some(),
        "arguments read from the text and from the parsed message disagree"
    );
    let (Some(arguments), Some(expected)) = (arguments, expected) else {
        return;
    };
    let read = jsonrpc::parse(arguments.as_bytes()).expect("the arguments text parses");
    assert_eq!(&read, expected, "the arguments text is not the message's arguments");
    let Some(canonical) = oncely_core::canonical_json(arguments.as_bytes(), &[]) else {
        // Only arguments that repeat a member name are JSON but not canonical JSON (the
        // endpoint refuses such a call).
        assert!(
            oncely_core::canon::is_json(arguments.as_bytes()),
            "canon refuses arguments serde_json accepts: {arguments}"
        );
        return;
    };
    let fp = |args: &str| jsonrpc::call_fingerprint("principal", "/mcp", "t", Some(args));
    let fingerprint = fp(arguments);
    let canonical = String::from_utf8(canonical).expect("the canonical form is UTF-8");
    assert_eq!(fp(&canonical), fingerprint, "canonical form fingerprints apart");
    let mut doc = Json::parse(arguments.as_bytes()).expect("canon parses the arguments");
    doc.normalize();
    let mut respelled = String::new();
    respell(&doc, &mut respelled);
    assert_eq!(
        fp(&respelled),
        fingerprint,
        "a re-spelling fingerprints apart: {arguments} vs {respelled}"
    );
    let message = format!(
        "{{ \"params\" : {{ \"arguments\" : {respelled} , \"name\":\"t\" }}, \"method\":\"tools/call\", \"id\": 2 }}"
    );
    let read = jsonrpc::arguments_text(&message).expect("re-spelled arguments are read");
    assert_eq!(fp(read), fingerprint);
}

/// The same document spelled otherwise: members in reverse order, white space between
/// tokens, numbers with a fraction and an exponent, letters and digits of strings and
/// names as `\u` escapes, characters outside the BMP as surrogate pairs.
fn respell(doc: &Json<'_>, out: &mut String) {
    match doc {
        Json::Null => out.push_str(" null "),
        Json::Bool(b) => out.push_str(if *b { " true" } else { "false " }),
        Json::Num(n) => {
            let (mantissa, exp) = n.split_once('e').unwrap_or((n, "0"));
            out.push_str(mantissa);
            out.push_str(if mantissa.contains('.') { "0" } else { ".0" });
            out.push('E');
            out.push_str(exp);
        }
        Json::Str(s) => respell_string(s, out),
        Json::Arr(items) => {
            out.push_str("[ ");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n");
                }
                respell(item, out);
            }
            out.push_str("\t]");
        }
        Json::Obj(members) => {
            out.push_str("{\r\n");
            for (i, (k, v)) in members.iter().rev().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                respell_string(k, out);
                out.push_str(" : ");
                respell(v, out);
            }
            out.push_str(" }");
        }
    }
}

fn respell_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' => out.push_str("\\/"),
            c if c.is_ascii_alphanumeric() || (c as u32) < 0x20 => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c if (c as u32) > 0xFFFF => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04X}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
