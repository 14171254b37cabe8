//! The remote link against a fake server: what reaches the client when, and the headers
//! of each request.

use std::time::Duration;

use futures::StreamExt;
use http_body::Frame;
use http_body_util::StreamBody;
use serde_json::json;
use tokio::sync::mpsc;

use super::*;
use crate::body::full;
use crate::stdio::server::Queued;
use futures::FutureExt;

/// What the fake server saw: each request's method, headers and body.
type Seen = Arc<Mutex<Vec<(Method, HeaderMap, Value)>>>;

/// A fake server: `initialize` answered with JSON and a session, `tools/call` with an
/// event stream the test writes to (`events`), anything else 202.
fn fake(seen: Seen, events: futures::channel::mpsc::UnboundedReceiver<String>) -> McpUpstream {
    let events = Arc::new(Mutex::new(Some(events)));
    McpUpstream::new(tower::service_fn(move |req: Request<BoxBody>| {
        let (seen, events) = (seen.clone(), events.clone());
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await?.to_bytes();
            let message: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            lock(&seen).push((parts.method, parts.headers, message.clone()));
            let mut resp = Response::new(full(Bytes::new()));
            match message["method"].as_str() {
                Some("initialize") => {
                    let answer = json!({"jsonrpc": "2.0", "id": message["id"],
                        "result": {"protocolVersion": "2025-11-25"}});
                    resp = Response::new(full(answer.to_string()));
                    let headers = resp.headers_mut();
                    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                    headers.insert("mcp-session-id", HeaderValue::from_static("s-1"));
                }
                Some("tools/call") => {
                    let stream = lock(&events).take().expect("one call");
                    let frames = stream.map(|e| {
                        Ok::<_, BoxError>(Frame::data(Bytes::from(format!("data: {e}\n\n"))))
                    });
                    resp = Response::new(BodyExt::boxed(StreamBody::new(frames)));
                    resp.headers_mut()
                        .insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
                }
                _ => *resp.status_mut() = StatusCode::ACCEPTED,
            }
            Ok::<_, BoxError>(resp)
        }
        .boxed()
    }))
}

#[tokio::test]
async fn a_server_request_mid_stream_reaches_the_client_before_the_response() {
    let seen: Seen = Arc::default();
    let (events, stream) = futures::channel::mpsc::unbounded();
    let (lines, mut to_client) = mpsc::unbounded_channel();
    let client = ToClient::new(lines, Arc::new(Queued::default()));
    let mut headers = HeaderMap::new();
    headers.insert("authorization", HeaderValue::from_static("Bearer t"));
    let remote = Remote {
        url: "http://127.0.0.1:9/mcp".parse().unwrap(),
        headers,
    };
    let link = RemoteLink::new(remote, fake(seen.clone(), stream), client, 1 << 20);

    let init = r#"{"jsonrpc":"2.0","id":"i","method":"initialize","params":{}}"#;
    let answer = link.send_text(init, false).await.unwrap().unwrap();
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["id"], "i", "under the client's id: {answer}");
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"ask"}}"#;
    let running = tokio::spawn({
        let link = link.clone();
        async move { link.send_text(call, true).await.unwrap() }
    });
    let sampling = json!({"jsonrpc": "2.0", "id": 0, "method": "sampling/createMessage"});
    events.unbounded_send(sampling.to_string()).unwrap();
    let line = tokio::time::timeout(Duration::from_secs(5), to_client.recv())
        .await
        .expect("the server's request reaches the client while the call runs")
        .unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&line).unwrap(), sampling);
    assert!(!running.is_finished());
    let ours = lock(&seen)[1].2["id"].clone();
    assert_ne!(ours, 7, "the link's own id");
    let result = json!({"jsonrpc": "2.0", "id": ours, "result": {"content": []}});
    events.unbounded_send(result.to_string()).unwrap();
    let answer = running.await.unwrap().unwrap();
    let answer: Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(
        answer,
        json!({"jsonrpc": "2.0", "id": 7, "result": {"content": []}})
    );
    link.end().await;

    let seen = lock(&seen);
    let (_, first, _) = &seen[0];
    assert_eq!(first["authorization"], "Bearer t");
    assert_eq!(first[ACCEPT], "application/json, text/event-stream");
    assert!(
        first.get("mcp-session-id").is_none(),
        "none before initialize"
    );
    let (_, call, _) = &seen[1];
    assert_eq!(call["mcp-session-id"], "s-1");
    assert_eq!(call["mcp-protocol-version"], "2025-11-25");
    assert!(
        call.get("mcp-method").is_none(),
        "no routing headers before 2026-07-28"
    );
    let (method, end, _) = seen.last().unwrap();
    assert_eq!(
        (method, &end["mcp-session-id"]),
        (&Method::DELETE, &HeaderValue::from_static("s-1"))
    );
}

#[test]
fn the_stateless_era_gets_the_routing_headers_of_its_message() {
    let (lines, _to_client) = mpsc::unbounded_channel();
    let client = ToClient::new(lines, Arc::new(Queued::default()));
    let remote = Remote {
        url: "http://127.0.0.1:9/mcp".parse().unwrap(),
        headers: HeaderMap::new(),
    };
    let (_, stream) = futures::channel::mpsc::unbounded();
    let link = RemoteLink::new(remote, fake(Arc::default(), stream), client, 1 << 20);
    let message = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "render",
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
    let req = link
        .session
        .request(Method::POST, Bytes::new(), Some(&message));
    let headers = req.headers();
    assert_eq!(headers["mcp-protocol-version"], "2026-07-28");
    assert_eq!(headers["mcp-method"], "tools/call");
    assert_eq!(headers["mcp-name"], "render");
    assert!(!headers.keys().any(|k| k.as_str().starts_with("mcp-param-")));

    // Once a listing marked its parameters, a call mirrors them, each value encoded; a
    // name outside the header-safe set is in the Base64 sentinel.
    let listing = json!({"jsonrpc": "2.0", "id": 1, "result": {"tools": [
        {"name": "render", "inputSchema": {"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "size": {"type": "object", "properties": {
                "width": {"type": "integer", "x-mcp-header": "Width"}}},
            "draft": {"type": "boolean", "x-mcp-header": "Draft"}}}}]}});
    link.session.learn_tools(listing.to_string().as_bytes());
    let message = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "render", "arguments": {"region": "Köln", "size": {"width": 640}, "draft": null},
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
    let req = link
        .session
        .request(Method::POST, Bytes::new(), Some(&message));
    let headers = req.headers();
    assert_eq!(headers["mcp-param-region"], "=?base64?S8O2bG4=?=");
    assert_eq!(headers["mcp-param-width"], "640");
    assert!(
        headers.get("mcp-param-draft").is_none(),
        "a null argument has no header"
    );
    let message = json!({"jsonrpc": "2.0", "id": 3, "method": "resources/read",
        "params": {"uri": "file:///Köln.txt",
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}});
    let req = link
        .session
        .request(Method::POST, Bytes::new(), Some(&message));
    assert_eq!(
        req.headers()["mcp-name"],
        "=?base64?ZmlsZTovLy9Lw7Zsbi50eHQ=?="
    );
}
