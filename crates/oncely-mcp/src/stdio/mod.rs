//! MCP over stdio: oncely between an assistant host and a local MCP server it would
//! start itself. [`run`] starts the real server as a child process, reads the host's
//! messages from one stream (its standard input) and writes the answers to another (its
//! standard output), one JSON-RPC message per line, and hands every message to the
//! [`Core`] directly: the same guard as an `[[mcp]]` HTTP endpoint, on the same engine.
//! The core's server is the child ([`server::ServerLink`], a
//! [`MessageServer`](crate::core::MessageServer)), whose requests are renumbered so that
//! the host's ids and the server's never meet.
//!
//! Messages are handled as they come: a request on a task of its own (a slow call does
//! not hold up the next), a notification or a response in order. Lines over `max_body`
//! are refused with a JSON-RPC error under their own id (read without keeping the line,
//! [`lines`]); lines that are not JSON get a parse error.
//!
//! The end: when the host closes the input (or the process is asked to stop), nothing
//! new is read; the requests in flight get their answers and the guarded calls this
//! process owns run to their end and are recorded (each within its timeout), then the
//! server's input is closed and it is given [`SERVER_GRACE`] to exit before it is
//! killed; the run ends with 0. When the server exits on its own, the run ends with the
//! server's status (after what it left in flight is recorded as failed).
//!
//! [`run_remote`] is the same wrapper in front of a remote server over Streamable HTTP
//! ([`remote`]) instead of a child.

mod lines;
mod remote;
mod server;

use std::ffi::OsString;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use oncely_tower::Guard;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::McpConfig;
use crate::core::{is_stateless, Context, Core, KnownCaller, MessageServer, Messages};
use crate::jsonrpc;
use crate::jsonrpc::code;
use lines::{Line, LineReader};
use server::ServerLink;

pub use remote::{run_remote, Remote};

/// How long the server has to exit once its input is closed, before it is killed.
pub const SERVER_GRACE: Duration = Duration::from_secs(5);

/// What to run, and as whom.
#[derive(Debug, Clone)]
pub struct Wrapped {
    /// The server's command line: its program and arguments.
    pub command: Vec<OsString>,
    /// Who the host's calls are from (hashed before it reaches the ledger).
    pub principal: String,
}

/// Why a stdio run could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StdioError {
    /// No command was given.
    #[error("no MCP server command given (after --)")]
    NoCommand,
    /// The server could not be started.
    #[error("cannot start the MCP server {program:?}: {cause}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        cause: std::io::Error,
    },
}

/// Starts the server `wrapped` names and carries the host's messages on `input` and
/// `output` through an endpoint of `config` on `guard` until the host closes `input`,
/// `shutdown` resolves, or the server exits. Returns the exit status: 0 after a host's
/// end, the server's own when it exited by itself.
pub async fn run<I, O>(
    config: McpConfig,
    guard: Arc<Guard>,
    wrapped: Wrapped,
    input: I,
    output: O,
    shutdown: impl Future<Output = ()>,
) -> Result<i32, StdioError>
where
    I: AsyncRead + Unpin,
    O: AsyncWrite + Unpin + Send + 'static,
{
    let (program, args) = wrapped.command.split_first().ok_or(StdioError::NoCommand)?;
    let mut child = spawn(program, args).map_err(|cause| StdioError::Spawn {
        program: program.to_string_lossy().into_owned(),
        cause,
    })?;
    let server_in = child.stdin.take().expect("piped stdin");
    let server_out = child.stdout.take().expect("piped stdout");

    let (to_server, server_lines) = mpsc::unbounded_channel();
    let (client_tx, client_lines) = mpsc::unbounded_channel();
    let queued = Arc::new(server::Queued::default());
    let to_client = server::ToClient::new(client_tx, queued.clone());
    let (close_server, server_closed) = tokio::sync::oneshot::channel::<()>();
    let server_writer = tokio::spawn(write_lines(
        server_in,
        server_lines,
        Some(server_closed),
        "server",
        None,
    ));
    let client_writer = tokio::spawn(write_lines(
        output,
        client_lines,
        None,
        "client",
        Some(queued),
    ));

    let link = ServerLink::new(to_server, to_client.clone());
    // The server's answers can be as large as the results oncely passes on unstored.
    let server_limit = config.max_response.saturating_mul(4).max(64 << 20);
    let mut reader = tokio::spawn(
        link.clone()
            .read_from(BufReader::new(server_out), server_limit),
    );

    let max_body = config.max_body;
    let timeout = config.timeout;
    let host = Host::new(
        config,
        guard.clone(),
        link.clone(),
        to_client.clone(),
        wrapped.principal,
    );
    tracing::info!(route = %host.core.config().path, server = %program.to_string_lossy(),
        "guarding the MCP server's tools/call over stdio");

    let mut requests = JoinSet::new();
    let mut lines = LineReader::new(BufReader::new(input), max_body);
    let mut shutdown = std::pin::pin!(shutdown);
    let exited_by_itself = loop {
        tokio::select! {
            line = lines.next() => match line {
                Ok(Some(line)) => host.line(line, max_body, &mut requests).await,
                Ok(None) => break false,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the host's input failed");
                    break false;
                }
            },
            () = &mut shutdown => {
                tracing::info!("asked to stop: finishing the calls in flight");
                break false;
            }
            _ = &mut reader => break true,
            Some(_) = requests.join_next(), if !requests.is_empty() => {}
        }
    };

    let status = if exited_by_itself {
        // Its output ended; a server that closed it and lives on is stopped.
        let status = match tokio::time::timeout(SERVER_GRACE, child.wait()).await {
            Ok(status) => status.ok(),
            Err(_) => {
                tracing::warn!("the MCP server closed its output but did not exit: killed");
                let _ = child.kill().await;
                None
            }
        };
        let code = status.map(exit_code).unwrap_or(1);
        tracing::warn!(code, "the MCP server ended by itself");
        // What it left in flight fails; record that before leaving.
        let _ = tokio::time::timeout(SERVER_GRACE, guard.drain()).await;
        requests.abort_all();
        code
    } else {
        link.client_gone();
        finish_in_flight(&guard, &mut requests, timeout).await;
        let _ = close_server.send(());
        let _ = server_writer.await;
        match tokio::time::timeout(SERVER_GRACE, child.wait()).await {
            Ok(_) => {}
            Err(_) => {
                tracing::warn!("the MCP server did not exit once its input closed: killed");
                let _ = child.kill().await;
            }
        }
        0
    };
    let junk = link.junk_lines();
    if junk > 1 {
        tracing::warn!(
            lines = junk,
            "lines the MCP server wrote that were not JSON-RPC, dropped"
        );
    }
    drop(host);
    drop(link);
    drop(to_client);
    let _ = tokio::time::timeout(Duration::from_secs(2), client_writer).await;
    Ok(status)
}

/// The host's side: its messages to the core, the answers back.
struct Host<M: MessageServer> {
    core: Arc<Core<Messages<M>>>,
    to_client: server::ToClient,
    session: Arc<Mutex<Session>>,
    /// Whether the server's tools (which are read-only) are known yet.
    tools: Arc<tokio::sync::watch::Sender<Learning>>,
}

/// What the wrapper knows of its host's session.
#[derive(Debug, Clone)]
struct Session {
    /// The session's id with the core: its calls and cancellations are its own.
    id: String,
    /// Who the host's calls are from (hashed before it reaches the ledger).
    principal: String,
    /// The protocol revision the session negotiated, once it has.
    revision: Option<String>,
}

impl Session {
    /// What the core is told of `message` (parsed, when it is JSON): the session, the
    /// caller, and whether it is of the stateless era (the revision it names itself, in
    /// that era, else the session's).
    fn context(&self, message: Option<&Value>) -> Context<()> {
        let named = message
            .and_then(|m| m.pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion"))
            .and_then(Value::as_str);
        Context {
            session: Some(self.id.clone()),
            modern: named.or(self.revision.as_deref()).is_some_and(is_stateless),
            caller: Arc::new(KnownCaller(
                self.principal.clone(),
                named.or(self.revision.as_deref()).map(str::to_string),
            )),
            origin: (),
        }
    }
}

/// Answers one message (or batch) of the host's through `core`: the messages to send
/// back, in order (none for a notification, a response, or a request its client
/// cancelled).
async fn exchange<M: MessageServer>(
    core: &Arc<Core<Messages<M>>>,
    bytes: Bytes,
    session: &Session,
) -> Vec<Value> {
    let parsed = jsonrpc::parse(&bytes);
    let batch = parsed.as_ref().is_some_and(Value::is_array);
    let context = session.context(parsed.as_ref());
    core.handle(bytes, context).await.into_messages(batch).await
}

/// Where learning the server's tools is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Learning {
    /// Not started: the host has not finished the handshake (or speaks a revision
    /// without one).
    NotYet,
    /// The wrapper's own `tools/list` is under way: tool calls wait for it.
    Under,
    /// Done (or given up on).
    Done,
}

/// Most a tool call waits for the tools to be learnt.
const LEARN_TOOLS_FOR: Duration = Duration::from_secs(10);

impl<M: MessageServer> Host<M> {
    /// The host's side of a core of `config` on `guard` in front of `server`; the
    /// answers go to `to_client`, the calls are `principal`'s.
    fn new(
        config: McpConfig,
        guard: Arc<Guard>,
        server: Arc<M>,
        to_client: server::ToClient,
        principal: String,
    ) -> Host<M> {
        Host {
            core: Core::new(config, guard, Messages(server)),
            to_client,
            session: Arc::new(Mutex::new(Session {
                id: session_id(),
                principal,
                revision: None,
            })),
            tools: Arc::new(tokio::sync::watch::channel(Learning::NotYet).0),
        }
    }

    /// One line the host wrote.
    async fn line(&self, line: Line, max_body: usize, requests: &mut JoinSet<()>) {
        let bytes = match line {
            Line::TooLong { len, id } => {
                tracing::warn!(bytes = len, max_body, "refused a message over max_body");
                if let Some(id) = id {
                    let why = format!(
                        "the message is {len} bytes, over max_body ({max_body} bytes): not forwarded"
                    );
                    self.send(&jsonrpc::error_message(&id, code::INVALID_REQUEST, &why));
                }
                return;
            }
            Line::Whole(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => return,
            Line::Whole(bytes) => Bytes::from(bytes),
        };
        let Some(message) = jsonrpc::parse(&bytes) else {
            self.send(&json!({"jsonrpc": "2.0", "id": null,
                "error": {"code": code::PARSE_ERROR, "message": "Parse error: the line is not JSON"}}));
            return;
        };
        let request = jsonrpc::as_request(&message).map(|r| r.method.to_string());
        let initialized = jsonrpc::as_notification(&message)
            .is_some_and(|(m, _)| m == "notifications/initialized");
        // A host of the stateless era (2026-07-28) has no handshake: its first request
        // names its revision, and the tools are learnt in it.
        let stateless = message
            .pointer("/params/_meta/io.modelcontextprotocol~1protocolVersion")
            .and_then(Value::as_str)
            .filter(|r| is_stateless(r))
            .map(str::to_owned);
        if let (Some(revision), true) = (stateless, request.is_some()) {
            if *self.tools.borrow() == Learning::NotYet {
                let mut session = self.session();
                session.revision = Some(revision);
                self.learn_tools(session, requests);
            }
        }
        let session = self.session();
        match request {
            // The handshake, before anything else the host sends.
            Some(method) if method == "initialize" => {
                let answers = exchange(&self.core, bytes, &session).await;
                learn_revision(&answers, &self.session);
                for answer in &answers {
                    self.send(answer);
                }
            }
            // A request: on a task of its own, so that a slow call holds up nothing. A
            // tool call first waits for the tools to be learnt (a read-only tool called
            // at once must not be guarded).
            Some(method) => {
                let core = self.core.clone();
                let to_client = self.to_client.clone();
                let mut learnt = self.tools.subscribe();
                requests.spawn(async move {
                    if method == "tools/call" {
                        let wait = learnt.wait_for(|l| *l != Learning::Under);
                        let _ = tokio::time::timeout(LEARN_TOOLS_FOR, wait).await;
                    }
                    for answer in &exchange(&core, bytes, &session).await {
                        to_client.send(serde_json::to_vec(answer).unwrap_or_default());
                    }
                });
            }
            // A notification, a response or a batch: in order.
            None => {
                for answer in exchange(&self.core, bytes, &session).await {
                    self.send(&answer);
                }
                if initialized && *self.tools.borrow() == Learning::NotYet {
                    // Which tools are read-only, before the host's first call.
                    self.learn_tools(session, requests);
                }
            }
        }
    }

    /// Lists the server's tools (in `context`'s revision) on a task; tool calls wait
    /// for it.
    fn learn_tools(&self, session: Session, requests: &mut JoinSet<()>) {
        self.tools.send_replace(Learning::Under);
        let core = self.core.clone();
        let tools = self.tools.clone();
        requests.spawn(async move {
            learn_tools(&core, &session).await;
            tools.send_replace(Learning::Done);
        });
    }

    fn session(&self) -> Session {
        self.session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn send(&self, message: &Value) {
        self.to_client
            .send(serde_json::to_vec(message).unwrap_or_default());
    }
}

/// Keeps the protocol revision the server answered `initialize` with.
fn learn_revision(answers: &[Value], session: &Mutex<Session>) {
    let revision = answers
        .iter()
        .find_map(|a| a.pointer("/result/protocolVersion"))
        .and_then(Value::as_str);
    if let Some(revision) = revision {
        session.lock().unwrap_or_else(|e| e.into_inner()).revision = Some(revision.to_string());
    }
}

/// Lists the server's tools through the core (which learns from the answer which are
/// read-only), every page, so that a host that calls a read-only tool before it lists
/// them is not answered with a replay.
async fn learn_tools<M: MessageServer>(core: &Arc<Core<Messages<M>>>, session: &Session) {
    let mut cursor: Option<Value> = None;
    for page in 0..100 {
        let mut request = json!({"jsonrpc": "2.0", "id": format!("oncely-tools-{page}"),
            "method": "tools/list", "params": {}});
        if let Some(revision) = session.revision.as_deref().filter(|r| is_stateless(r)) {
            request["params"]["_meta"] =
                json!({"io.modelcontextprotocol/protocolVersion": revision});
        }
        if let Some(c) = cursor.take() {
            request["params"]["cursor"] = c;
        }
        let body = Bytes::from(serde_json::to_vec(&request).unwrap_or_default());
        let answers = exchange(core, body, session).await;
        cursor = answers
            .iter()
            .find_map(|a| a.pointer("/result/nextCursor"))
            .filter(|c| !c.is_null())
            .cloned();
        if cursor.is_none() {
            break;
        }
    }
}

/// The host has closed its input: the requests in flight get their answers and the
/// guarded calls this process owns run to their end and are recorded, each within
/// `timeout` (and 5 s more); what is still running then is cut off.
pub(crate) async fn finish_in_flight(guard: &Guard, requests: &mut JoinSet<()>, timeout: Duration) {
    tracing::info!(
        in_flight = guard.in_flight(),
        "the host closed the input: finishing the calls in flight"
    );
    let deadline = Instant::now() + timeout + Duration::from_secs(5);
    let answered = async { while requests.join_next().await.is_some() {} };
    let _ = tokio::time::timeout_at(deadline, async {
        tokio::join!(answered, guard.drain());
    })
    .await;
    requests.abort_all();
}

/// Writes each line it is given (with its line end) to `out`, flushing when no more wait,
/// until the senders are gone or `close` resolves (then `out` is dropped: the reader sees
/// its end). A write that fails (the reader is gone) is said once; later lines are
/// dropped.
async fn write_lines<W: AsyncWrite + Unpin>(
    mut out: W,
    mut lines: mpsc::UnboundedReceiver<Vec<u8>>,
    close: Option<tokio::sync::oneshot::Receiver<()>>,
    side: &'static str,
    counted: Option<Arc<server::Queued>>,
) {
    let mut broken = false;
    let mut close = close;
    loop {
        let line = match close.as_mut() {
            Some(c) => tokio::select! {
                biased;
                line = lines.recv() => line,
                _ = c => None,
            },
            None => lines.recv().await,
        };
        let Some(mut line) = line else { break };
        let len = line.len();
        if broken {
            if let Some(c) = &counted {
                c.written(len);
            }
            continue;
        }
        line.push(b'\n');
        let mut result = out.write_all(&line).await;
        if result.is_ok() && lines.is_empty() {
            result = out.flush().await;
        }
        if let Some(c) = &counted {
            c.written(len);
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, "the {side}'s input is closed: what is left for it is dropped");
            broken = true;
        }
    }
    let _ = out.flush().await;
    let _ = out.shutdown().await;
}

/// The server, started with piped standard input and output and the wrapper's standard
/// error, environment and working directory. On Unix it gets a process group of its own:
/// a host that signals the wrapper's group (the Python SDK does, 2 s after closing the
/// input) must not stop the server while the wrapper finishes its calls; the wrapper
/// stops it once they are recorded. On Windows, a process group of its own likewise.
fn spawn(program: &OsString, args: &[OsString]) -> std::io::Result<Child> {
    #[cfg(windows)]
    let program = &windows_program(program);
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true);
    #[cfg(unix)]
    command.process_group(0);
    #[cfg(windows)]
    {
        /// `CREATE_NEW_PROCESS_GROUP`.
        const NEW_PROCESS_GROUP: u32 = 0x0000_0200;
        command.creation_flags(NEW_PROCESS_GROUP);
    }
    command.spawn()
}

/// On Windows, a bare program name is looked up on `PATH` with each extension of
/// `PATHEXT`, as the shell does (process creation alone finds only `NAME.exe`, and the
/// usual `npx` is `npx.cmd`); the name as it is when nothing is found.
#[cfg(windows)]
fn windows_program(program: &OsString) -> OsString {
    let path = std::path::Path::new(program);
    if path.extension().is_some() || path.components().count() > 1 {
        return program.clone();
    }
    let exts = std::env::var("PATHEXT").unwrap_or_else(|_| ".COM;.EXE;.BAT;.CMD".into());
    let dirs = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&dirs) {
        for ext in exts.split(';').filter(|e| !e.is_empty()) {
            let mut name = program.clone();
            name.push(ext.to_ascii_lowercase());
            let candidate = dir.join(&name);
            if candidate.is_file() {
                return candidate.into_os_string();
            }
        }
    }
    program.clone()
}

/// An exit status as a process exit code: its code, or on Unix 128 + the signal that
/// ended it.
fn exit_code(status: std::process::ExitStatus) -> i32 {
    if let Some(code) = status.code() {
        return code;
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return 128 + signal;
        }
    }
    1
}

/// This process's session id with the core: its calls and cancellations are its own.
fn session_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("stdio-{}-{nanos:x}", std::process::id())
}
