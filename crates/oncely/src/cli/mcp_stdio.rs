//! `oncely mcp ... -- COMMAND [ARG]...`: what an assistant host starts instead of a local
//! MCP server. It starts COMMAND, speaks MCP over its own standard input and output, and
//! guards every `tools/call` as an `[[mcp]]` endpoint does ([`oncely_mcp::stdio`]), on
//! a ledger every wrapper of the machine shares (`sqlite://$ONCELY_HOME/mcp.db` unless
//! told otherwise). `oncely mcp ... --url URL [--header 'NAME: VALUE']...` is the same
//! guard in front of a remote server over Streamable HTTP instead of a command.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use oncely_mcp::stdio::{Remote, StdioError, Wrapped};
use oncely_mcp::{CallSettings, McpConfig};
use oncely_tower::Guard;
use sha2::{Digest, Sha256};

use crate::config::{Config, McpStdio, Overrides};
use crate::outcome::{Failure, Outcome};

/// `oncely mcp`'s arguments.
#[derive(Debug, Clone, Args)]
pub struct McpArgs {
    /// A config file: its `[mcp_stdio]` table (the keys of an `[[mcp]]` entry: tools,
    /// actions, window, wait, timeout, lease, units, principal, name), `store`,
    /// `max_body` and `max_response`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The ledger (default `sqlite://$ONCELY_HOME/mcp.db`, shared by every wrapper).
    #[arg(long, env = "ONCELY_STORE", value_name = "URL")]
    pub store: Option<String>,
    /// How long a completed call's result is replayed (default 3h).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub window: Option<Duration>,
    /// How long a repeat waits for the original still running (default 20s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
    pub wait: Option<Duration>,
    /// Tools to guard, by name or pattern (`*` matches any run of characters;
    /// repeatable; default every tool not marked readOnlyHint).
    #[arg(long = "tool", value_name = "PATTERN")]
    pub tools: Vec<String>,
    /// Guarded tools of class `action` (repeatable, `*` wildcards): an ambiguous failure
    /// becomes `outcome_unknown` instead of being run again.
    #[arg(long = "action", value_name = "PATTERN")]
    pub actions: Vec<String>,
    /// An argument that is an idempotency key the model fills in, `TOOL:/POINTER`
    /// (repeatable; `*` wildcards in TOOL): left out of the call's key, and given the
    /// record's key. The usual names (idempotency_key, client_token, ...) are always.
    #[arg(long = "key-argument", value_name = "TOOL:/POINTER")]
    pub key_arguments: Vec<String>,
    /// Who the calls are from (default `local`).
    #[arg(long, value_name = "NAME")]
    pub principal: Option<String>,
    /// The guard's name: its ledger routes are `stdio:NAME#TOOL` (default: the program's
    /// name and a hash of the command line, so that every wrapper of one command line is
    /// one guard; with --url, the URL without its query).
    #[arg(long, value_name = "NAME", value_parser = crate::config::stdio_name)]
    pub name: Option<String>,
    /// Set by the front process on the worker it starts (Unix).
    #[arg(long = "oncely-worker", hide = true)]
    pub worker: bool,
    /// A remote MCP server (Streamable HTTP, `http://` or `https://`) to guard instead
    /// of a command.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// A header sent with every request to --url's server, `'NAME: VALUE'`; `${VAR}` in
    /// VALUE is read from the environment (repeatable).
    #[arg(long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// The MCP server: its program and arguments.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// The server a wrapper guards: a command it starts, or a remote one.
enum Server {
    Command(Vec<OsString>),
    Remote(Remote),
}

impl McpArgs {
    /// The server these arguments name (exit 2 with the problem when they name none, both,
    /// or a remote one wrongly).
    fn server(&self) -> Result<Server, Failure> {
        let Some(url) = &self.url else {
            if self.command.is_empty() {
                return Err(Failure::usage(
                    "no MCP server given: put its command after --, or give --url URL",
                ));
            }
            if !self.headers.is_empty() {
                return Err(Failure::usage("--header is for --url's server only"));
            }
            return Ok(Server::Command(self.command.clone()));
        };
        if !self.command.is_empty() {
            return Err(Failure::usage(
                "--url and -- COMMAND: give one MCP server, a remote one or a command",
            ));
        }
        let parsed: http::Uri = url
            .parse()
            .ok()
            .filter(|u: &http::Uri| {
                matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
            })
            .ok_or_else(|| {
                Failure::usage(format!(
                    "--url {:?}: must be an http:// or https:// URL with a host",
                    without_query(url)
                ))
            })?;
        let mut headers = http::HeaderMap::new();
        for text in &self.headers {
            let (name, value) = crate::config::remote_header(text, |v| std::env::var(v).ok())
                .map_err(Failure::usage)?;
            headers.append(name, value);
        }
        Ok(Server::Remote(Remote {
            url: parsed,
            headers,
        }))
    }
}

/// `url` without its query (and its user and password, which are secrets), as a guard's
/// default name.
fn without_query(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or_default();
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit('@').next().unwrap_or(authority);
            format!("{scheme}://{host}{path}")
        }
        None => url.to_owned(),
    }
}

/// The (hidden) flag the front process starts its worker with (see [`run`]).
#[cfg(unix)]
const WORKER_FLAG: &str = "--oncely-worker";

fn parse_duration_arg(text: &str) -> Result<Duration, String> {
    oncely_core::parse_duration(text)
}

/// Runs the wrapper until the host closes its input (exit 0) or the server exits (its
/// status).
///
/// On Unix the process the host starts is a front: it starts the wrapper proper (the
/// worker, this same command) in a process group of its own, passes it the host's input
/// and lets it write to the host's output directly. Hosts stop a server by closing its
/// input, then signalling it (the Python SDK signals its whole process group 2 s later,
/// SIGTERM, then SIGKILL 2 s after that; the TypeScript SDK its process alone): the
/// front ends the worker's input on the first signal and waits, and when the front is
/// killed, the worker's input ends all the same. Either way the worker, out of the
/// host's reach, finishes the calls in flight, records them, and stops the server.
pub(crate) async fn run(args: McpArgs) -> Outcome {
    #[cfg(unix)]
    if !args.worker {
        return front().await;
    }
    worker(args).await
}

/// The front (Unix): starts the worker out of the host's process group, copies the
/// host's input to it until that ends or a signal comes, and exits with its status.
#[cfg(unix)]
async fn front() -> Outcome {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::usage(format!("cannot find the oncely binary: {e}")))?;
    // The same arguments, with the worker's flag after the command's name.
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let at = args.iter().position(|a| a == "mcp").map_or(0, |i| i + 1);
    args.insert(at, WORKER_FLAG.into());
    let mut worker = tokio::process::Command::new(exe)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::inherit())
        .stderr(std::process::Stdio::inherit())
        .process_group(0)
        .spawn()
        .map_err(|e| Failure::usage(format!("cannot start the oncely mcp worker: {e}")))?;
    let mut to_worker = worker.stdin.take().expect("piped stdin");
    let copied = async {
        let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut to_worker).await;
    };
    let status = tokio::select! {
        () = copied => None,
        () = crate::serve::shutdown_signal() => None,
        status = worker.wait() => Some(status),
    };
    // The worker's input ends: it finishes what is in flight and exits.
    drop(to_worker);
    let status = match status {
        Some(status) => status,
        None => worker.wait().await,
    }
    .map_err(|e| Failure {
        code: 1,
        message: format!("waiting for the oncely mcp worker: {e}"),
    })?;
    exit_status(status)
}

/// A worker's exit status as this process's outcome (128 + the signal that ended it).
#[cfg(unix)]
fn exit_status(status: std::process::ExitStatus) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    match code {
        0 => Ok(()),
        code => Err(Failure {
            code: u8::try_from(code.clamp(1, 255)).unwrap_or(1),
            message: String::new(),
        }),
    }
}

/// The wrapper proper.
async fn worker(args: McpArgs) -> Outcome {
    let _logs = crate::logs::init(crate::logs::LogFormat::Text);
    let server = args.server()?;
    let (config, file_store) = match &args.config {
        Some(path) => {
            let config = Config::load(path, &Overrides::default())
                .map_err(|e| Failure::usage(format!("config {}: {e}", path.display())))?;
            let sets_store = std::fs::read_to_string(path)
                .ok()
                .and_then(|t| t.parse::<toml::Table>().ok())
                .is_some_and(|t| t.contains_key("store"));
            let store = sets_store.then(|| config.store.clone());
            (Some(config), store)
        }
        None => (None, None),
    };
    let stdio = config
        .as_ref()
        .map(|c| c.mcp_stdio.clone())
        .unwrap_or_default();
    let url = match args.store.clone().or(file_store) {
        Some(url) => url,
        None => default_store()?,
    };
    let options = config
        .as_ref()
        .map_or_else(oncely_store::StoreOptions::default, Config::store_options);
    let store = crate::cli::store::open_url(&url, options).await?;
    let principal_key = crate::operations::principal_key(&*store)
        .await
        .map_err(|e| Failure::usage(format!("reading the principal key from the store: {e}")))?;
    let max_inflight = config
        .as_ref()
        .map_or(crate::config::DEFAULT_MAX_INFLIGHT, |c| {
            c.max_inflight_bytes
        });
    let mut guard = Guard::new(store, principal_key).with_max_inflight_bytes(max_inflight);
    // OpenTelemetry as `serve` has it: the file's `[tracing]` over the OTEL_* variables;
    // a bad value exits 2 naming it.
    let telemetry = crate::config::telemetry_of(config.as_ref().and_then(|c| c.tracing.as_ref()))
        .map_err(|e| Failure::usage(format!("telemetry: {e}")))?;
    let otel = match &telemetry {
        Some(t) => Some(
            crate::serve::otel::Exporter::start(t, guard.instance())
                .map_err(|e| Failure::usage(format!("telemetry: {e:#}")))?,
        ),
        None => None,
    };
    if let Some(tracer) = otel.as_ref().and_then(crate::serve::otel::Exporter::tracer) {
        guard = guard.with_tracer(tracer);
    }
    let guard = Arc::new(guard);

    let name = match (args.name.clone().or(stdio.name.clone()), &server) {
        (Some(name), _) => name,
        (None, Server::Command(command)) => derived_name(command),
        (None, Server::Remote(_)) => without_query(args.url.as_deref().unwrap_or_default()),
    };
    let mcp = endpoint(&args, &stdio, config.as_ref(), &name)?;
    let principal = args
        .principal
        .clone()
        .or(stdio.principal.clone())
        .unwrap_or_else(|| "local".to_owned());
    tracing::info!(store = %oncely_store::redact_url(&url), route = %mcp.path, "oncely mcp");
    let command = match server {
        Server::Command(command) => command,
        Server::Remote(remote) => {
            let outcome = oncely_mcp::stdio::run_remote(
                mcp,
                guard,
                remote,
                principal,
                tokio::io::stdin(),
                tokio::io::stdout(),
                crate::serve::shutdown_signal(),
            )
            .await
            .map_err(Failure::usage);
            if let Some(otel) = otel {
                otel.stop().await;
            }
            return outcome;
        }
    };
    let wrapped = Wrapped { command, principal };
    let status = oncely_mcp::stdio::run(
        mcp,
        guard,
        wrapped,
        tokio::io::stdin(),
        tokio::io::stdout(),
        crate::serve::shutdown_signal(),
    )
    .await;
    if let Some(otel) = otel {
        otel.stop().await;
    }
    let status = status.map_err(|e| match e {
        StdioError::Spawn { .. } | StdioError::NoCommand => Failure::usage(e),
        other => Failure {
            code: 1,
            message: other.to_string(),
        },
    })?;
    match status {
        0 => Ok(()),
        code => Err(Failure {
            code: u8::try_from(code.clamp(1, 255)).unwrap_or(1),
            message: String::new(),
        }),
    }
}

/// The endpoint config: the command line over `[mcp_stdio]` over the defaults.
fn endpoint(
    args: &McpArgs,
    stdio: &McpStdio,
    config: Option<&Config>,
    name: &str,
) -> Result<McpConfig, Failure> {
    let tools = if args.tools.is_empty() {
        stdio.tools.clone()
    } else {
        args.tools.clone()
    };
    let actions = if args.actions.is_empty() {
        stdio.actions.clone()
    } else {
        args.actions.clone()
    };
    let defaults = McpConfig::stdio(name);
    let key_arguments = if args.key_arguments.is_empty() {
        stdio.key_arguments.clone()
    } else {
        oncely_mcp::KeyArguments::parse(&args.key_arguments)
            .map_err(|(_, why)| Failure::usage(format!("--key-argument: {why}")))?
    };
    let calls = CallSettings {
        window: args.window.unwrap_or(stdio.window),
        wait: args.wait.unwrap_or(stdio.wait),
        timeout: stdio.timeout,
        lease: stdio.lease,
        units: stdio.units.clone(),
        concurrency: stdio.concurrency,
        max_body: config.map_or(defaults.max_body as u64, |c| c.max_body),
        max_response: config.map_or(defaults.max_response as u64, |c| c.max_response),
        key_arguments,
        intent: stdio.intent.clone(),
    };
    defaults
        .with_tools(&tools)
        .and_then(|m| m.with_actions(&actions))
        .map(|m| m.with_calls(calls))
        .map_err(Failure::usage)
}

/// The name of the guard of `command` when none is given: the program's file name and
/// the first 8 hex digits of a hash of the whole command line (arguments may hold
/// secrets; the hash keeps them out of the ledger). Every wrapper started with the same
/// command line is one guard.
fn derived_name(command: &[OsString]) -> String {
    let program = command
        .first()
        .map(|p| {
            let path = Path::new(p);
            path.file_stem()
                .unwrap_or(path.as_os_str())
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    let program: String = program
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let mut hash = Sha256::new();
    for arg in command {
        hash.update(arg.to_string_lossy().as_bytes());
        hash.update([0]);
    }
    let digest = hex::encode(hash.finalize());
    format!("{program}-{}", &digest[..8])
}

/// `sqlite://$ONCELY_HOME/mcp.db`, the home created owner-only when missing.
fn default_store() -> Result<String, Failure> {
    let home = oncely_home().ok_or_else(|| {
        Failure::usage(
            "cannot tell where oncely's data goes: set ONCELY_HOME (or HOME), or give --store",
        )
    })?;
    create_private_dir(&home).map_err(|e| {
        Failure::usage(format!("cannot create ONCELY_HOME {}: {e}", home.display()))
    })?;
    Ok(format!("sqlite://{}", home.join("mcp.db").display()))
}

/// `ONCELY_HOME`, else the platform's place for a user's application data: on macOS
/// `~/Library/Application Support/oncely`, on Windows `%APPDATA%\oncely`, elsewhere
/// `$XDG_DATA_HOME/oncely` (when it is an absolute path), else `~/.local/share/oncely`.
pub(crate) fn oncely_home() -> Option<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(home) = var("ONCELY_HOME") {
        return Some(home);
    }
    if cfg!(windows) {
        return var("APPDATA").map(|d| d.join("oncely"));
    }
    if cfg!(target_os = "macos") {
        return var("HOME").map(|h| h.join("Library/Application Support/oncely"));
    }
    if let Some(data) = var("XDG_DATA_HOME").filter(|d| d.is_absolute()) {
        return Some(data.join("oncely"));
    }
    var("HOME").map(|h| h.join(".local/share/oncely"))
}

/// Creates `dir` and its missing parents, owner-only (0700) on Unix.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_line_names_one_guard() {
        let a = derived_name(&["npx".into(), "-y".into(), "@acme/render".into()]);
        let b = derived_name(&["npx".into(), "-y".into(), "@acme/render".into()]);
        let c = derived_name(&["npx".into(), "-y".into(), "@acme/other".into()]);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.starts_with("npx-") && a.len() == 12, "{a}");
        let odd = derived_name(&["/opt/My Server/run.sh".into()]);
        assert!(odd.starts_with("run-"), "{odd}");
        assert!(crate::config::stdio_name(&odd).is_ok());
    }

    #[test]
    fn a_remote_server_is_named_by_its_url_without_query_or_password() {
        assert_eq!(
            without_query("https://user:pw@mcp.example.com:8443/v1/mcp?key=s3cret"),
            "https://mcp.example.com:8443/v1/mcp"
        );
        assert_eq!(
            without_query("http://127.0.0.1:9/mcp"),
            "http://127.0.0.1:9/mcp"
        );
        assert_eq!(without_query("http://h?x"), "http://h");
    }
}
