//! The MCP client: the tools of an MCP server, their annotations, descriptions and input
//! schemas (`initialize`,
//! `notifications/initialized`, every page of `tools/list`), over Streamable HTTP (JSON
//! or event-stream answers) or over the standard input and output of a command it starts
//! (stdio: newline-delimited JSON-RPC). Both transports share [`read_tools`].

use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use oncely_core::units::format_duration;
use oncely_http::client::error_chain;
use oncely_mcp::jsonrpc::code;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::model::{Found, Said, Target, Transport};

/// How long one MCP request may take.
const MCP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a stdio server may take to exit once its input is closed, before it is
/// killed.
const STDIO_GRACE: Duration = Duration::from_secs(2);

/// The longest line a stdio server may write.
const STDIO_MAX_LINE: u64 = 16 << 20;

/// The protocol version the inventory asks an MCP server for.
const MCP_PROTOCOL: &str = "2025-11-25";

/// The tools of the MCP server at `url`, over Streamable HTTP.
pub(super) async fn list_tools(url: &str) -> Result<Vec<Found>, String> {
    let uri: http::Uri = url.parse().map_err(|_| "not a URL".to_owned())?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err("not an http:// or https:// URL".into());
    }
    let client = oncely_http::client::upstream_client_or_warn(&Default::default());
    let mut session = McpSession {
        client,
        url: url.to_owned(),
        id: None,
        protocol: None,
    };
    let tools = read_tools(&mut session, url, Transport::Http).await?;
    session.end().await;
    Ok(tools)
}

/// The tools of the stdio MCP server that `words` (the words of `command`) start; the
/// tools' source is `command` as given.
pub(super) async fn list_command_tools(
    command: &str,
    words: &[String],
) -> Result<Vec<Found>, String> {
    let mut session = StdioSession::start(words)?;
    let tools = read_tools(&mut session, command, Transport::Stdio).await?;
    session.end().await;
    Ok(tools)
}

/// JSON-RPC with an MCP server, as its client.
trait Rpc {
    /// Sends a request and returns its result (an error answer is an error).
    async fn request(&mut self, id: i64, method: &str, params: Value) -> Result<Value, String>;
    /// Sends a notification.
    async fn notify(&mut self, method: &str, params: Value) -> Result<(), String>;
}

/// The tools of one MCP server: initialize, notifications/initialized, then tools/list
/// (every page), whatever the transport.
async fn read_tools(
    session: &mut impl Rpc,
    source: &str,
    transport: Transport,
) -> Result<Vec<Found>, String> {
    session
        .request(
            1,
            "initialize",
            json!({
                "protocolVersion": MCP_PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "oncely-inventory", "version": env!("CARGO_PKG_VERSION")},
            }),
        )
        .await?;
    session
        .notify("notifications/initialized", json!({}))
        .await?;
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for page in 0..100 {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let result = session.request(2 + page, "tools/list", params).await?;
        let list = result
            .get("tools")
            .and_then(Value::as_array)
            .ok_or("tools/list answered without a `tools` list")?;
        for t in list {
            let Some(name) = t.get("name").and_then(Value::as_str) else {
                continue;
            };
            let hint = |h: &str| {
                t.pointer(&format!("/annotations/{h}"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false)
            };
            tools.push(Found {
                source: source.to_owned(),
                target: Target::Tool {
                    name: name.to_owned(),
                    transport,
                },
                words: format!(
                    "{name} {}",
                    t.pointer("/annotations/title")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                ),
                read_only_hint: hint("readOnlyHint"),
                destructive_hint: hint("destructiveHint"),
                said: t
                    .get("description")
                    .and_then(Value::as_str)
                    .map(|d| Said {
                        at: "the tool's description".into(),
                        text: d.to_owned(),
                        of_key: false,
                    })
                    .into_iter()
                    .collect(),
                input_schema: t.get("inputSchema").cloned(),
            });
        }
        cursor = result
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    Ok(tools)
}

/// The result of a JSON-RPC answer to `method` (an error answer is an error).
fn result_of(method: &str, answer: Value) -> Result<Value, String> {
    if let Some(e) = answer.get("error") {
        return Err(format!(
            "{method}: error {}: {}",
            e.get("code").unwrap_or(&Value::Null),
            e.get("message").and_then(Value::as_str).unwrap_or("")
        ));
    }
    answer
        .get("result")
        .cloned()
        .ok_or_else(|| format!("{method}: the answer has no result"))
}

fn no_answer(method: &str) -> String {
    format!(
        "{method}: no answer within {}",
        format_duration(MCP_TIMEOUT)
    )
}

/// One stdio MCP server, as its client: a child process whose standard input and output
/// carry newline-delimited JSON-RPC (its standard error is ours).
struct StdioSession {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl StdioSession {
    fn start(words: &[String]) -> Result<StdioSession, String> {
        let (program, args) = words.split_first().ok_or("no command")?;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {program}: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(format!("cannot start {program}: no pipes"));
        };
        Ok(StdioSession {
            child,
            stdin,
            stdout: BufReader::new(stdout),
        })
    }

    /// Writes one message, on a line of its own.
    async fn send(&mut self, method: &str, message: &Value) -> Result<(), String> {
        let mut line = message.to_string();
        line.push('\n');
        let written = async {
            self.stdin.write_all(line.as_bytes()).await?;
            self.stdin.flush().await
        }
        .await;
        match written {
            Ok(()) => Ok(()),
            Err(e) => Err(format!(
                "{method}: cannot write to the server: {e}{}",
                self.exit_note().await
            )),
        }
    }

    /// The next JSON value the server writes (lines that are not JSON are skipped); `None`
    /// when its output ends.
    async fn next_value(&mut self, method: &str) -> Result<Option<Value>, String> {
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = (&mut self.stdout)
                .take(STDIO_MAX_LINE)
                .read_until(b'\n', &mut line)
                .await
                .map_err(|e| format!("{method}: cannot read from the server: {e}"))?;
            if n == 0 {
                return Ok(None);
            }
            if n as u64 == STDIO_MAX_LINE && line.last() != Some(&b'\n') {
                return Err(format!(
                    "{method}: the server wrote a line longer than {} MiB",
                    STDIO_MAX_LINE >> 20
                ));
            }
            if let Ok(v) = serde_json::from_slice::<Value>(&line) {
                return Ok(Some(v));
            }
        }
    }

    /// " (exit status: N)" when the server has exited or does so shortly, else "".
    async fn exit_note(&mut self) -> String {
        match tokio::time::timeout(STDIO_GRACE, self.child.wait()).await {
            Ok(Ok(status)) => format!(" ({status})"),
            _ => String::new(),
        }
    }

    /// Closes the server's input, gives it [`STDIO_GRACE`] to exit, then kills it.
    async fn end(self) {
        let StdioSession {
            mut child,
            stdin,
            mut stdout,
        } = self;
        drop(stdin);
        // Whatever it still writes is read, so that it is not stuck on a full pipe.
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut stdout, &mut tokio::io::sink()).await;
        });
        if tokio::time::timeout(STDIO_GRACE, child.wait())
            .await
            .is_err()
        {
            let _ = child.kill().await;
        }
    }
}

impl Rpc for StdioSession {
    async fn request(&mut self, id: i64, method: &str, params: Value) -> Result<Value, String> {
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let answer = tokio::time::timeout(MCP_TIMEOUT, async {
            self.send(method, &message).await?;
            loop {
                let Some(value) = self.next_value(method).await? else {
                    return Err(format!(
                        "{method}: the server closed its output{}",
                        self.exit_note().await
                    ));
                };
                let messages = match value {
                    Value::Array(batch) => batch,
                    one => vec![one],
                };
                for m in messages {
                    if !m.is_object() {
                        continue;
                    }
                    if m.get("method").is_some() {
                        // A request of the server's (roots/list, sampling, ...) gets an
                        // error at once, so that it does not wait; a notification
                        // nothing.
                        if let Some(their) = m.get("id") {
                            let reply = json!({
                                "jsonrpc": "2.0",
                                "id": their,
                                "error": {
                                    "code": code::METHOD_NOT_FOUND,
                                    "message": "the oncely inventory answers no requests",
                                },
                            });
                            self.send(method, &reply).await?;
                        }
                        continue;
                    }
                    if m.get("id") == Some(&json!(id)) {
                        return Ok(m);
                    }
                }
            }
        })
        .await
        .map_err(|_| no_answer(method))??;
        result_of(method, answer)
    }

    async fn notify(&mut self, method: &str, params: Value) -> Result<(), String> {
        let message = json!({"jsonrpc": "2.0", "method": method, "params": params});
        tokio::time::timeout(MCP_TIMEOUT, self.send(method, &message))
            .await
            .map_err(|_| format!("{method}: the server does not read its input"))?
    }
}

/// One MCP session, as a client.
struct McpSession {
    client: oncely_http::client::PooledClient<Full<Bytes>>,
    url: String,
    id: Option<String>,
    protocol: Option<String>,
}

impl McpSession {
    fn post(&self, message: &Value) -> http::Request<Full<Bytes>> {
        let mut req = http::Request::post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(id) = &self.id {
            req = req.header("mcp-session-id", id);
        }
        if let Some(p) = &self.protocol {
            req = req.header("mcp-protocol-version", p);
        }
        req.body(Full::new(Bytes::from(message.to_string())))
            .expect("a valid request")
    }

    /// Ends the session (best effort: a server may not support it).
    async fn end(&self) {
        let Some(id) = &self.id else { return };
        let Ok(req) = http::Request::delete(&self.url)
            .header("mcp-session-id", id)
            .body(Full::new(Bytes::new()))
        else {
            return;
        };
        let _ = tokio::time::timeout(MCP_TIMEOUT, self.client.request(req)).await;
    }
}

impl Rpc for McpSession {
    async fn request(&mut self, id: i64, method: &str, params: Value) -> Result<Value, String> {
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let req = self.post(&message);
        let answer = tokio::time::timeout(MCP_TIMEOUT, async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| format!("unreachable: {}", error_chain(&e)))?;
            if !resp.status().is_success() {
                return Err(format!("{method}: HTTP {}", resp.status()));
            }
            if let Some(s) = resp.headers().get("mcp-session-id") {
                if let Ok(s) = s.to_str() {
                    self.id = Some(s.to_owned());
                }
            }
            let sse = resp
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let mut body = resp.into_body();
            if sse {
                // The stream may stay open after the answer: stop at the answer.
                let mut parser = oncely_mcp::sse::Parser::new(16 << 20);
                while let Some(frame) = body.frame().await {
                    let frame = frame.map_err(|e| format!("{method}: {e}"))?;
                    let Some(chunk) = frame.data_ref() else {
                        continue;
                    };
                    for event in parser.feed(chunk) {
                        if let Ok(v) = serde_json::from_str::<Value>(&event.data) {
                            if v.get("id") == Some(&json!(id)) {
                                return Ok(v);
                            }
                        }
                    }
                }
                Err(format!(
                    "{method}: the event stream ended without an answer"
                ))
            } else {
                let bytes = body
                    .collect()
                    .await
                    .map_err(|e| format!("{method}: {e}"))?
                    .to_bytes();
                serde_json::from_slice::<Value>(&bytes)
                    .map_err(|e| format!("{method}: the answer is not JSON: {e}"))
            }
        })
        .await
        .map_err(|_| no_answer(method))??;
        let result = result_of(method, answer)?;
        if method == "initialize" {
            // Every later request says the version the server chose.
            self.protocol = result
                .get("protocolVersion")
                .and_then(Value::as_str)
                .map(str::to_owned);
        }
        Ok(result)
    }

    async fn notify(&mut self, method: &str, params: Value) -> Result<(), String> {
        let req = self.post(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
        let resp = tokio::time::timeout(MCP_TIMEOUT, self.client.request(req))
            .await
            .map_err(|_| format!("{method}: no answer"))?
            .map_err(|e| format!("unreachable: {}", error_chain(&e)))?;
        if !resp.status().is_success() {
            return Err(format!("{method}: HTTP {}", resp.status()));
        }
        Ok(())
    }
}
