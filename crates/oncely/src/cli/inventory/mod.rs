//! `oncely inventory`: the failure-boundary map.
//!
//! Reads OpenAPI 3.0/3.1 documents (JSON or YAML) and MCP servers (`tools/list` over
//! Streamable HTTP, or over the standard input and output of a local server's command,
//! with the tools' annotations), and the current config and ledger when given. For every operation and tool it says what it is (its class, as configured or
//! else proposed), who makes its key, where its record lives, how long a result is
//! replayed, what a repeat gets and how an uncertain outcome is reconciled, which of a
//! tool's arguments are idempotency keys and what the server gets in each, and it lists
//! the gaps, each with the config lines that close it. `--write-config` writes a starting
//! config with those classes.

mod durations;
mod heuristics;
mod keys;
mod mcp;
mod model;
mod openapi;
mod report;
mod shell;
mod words;

use std::path::PathBuf;

use clap::Args;

use crate::config::{Config, Overrides};
use crate::outcome::{Failure, Outcome};
use durations::observed_durations;
use heuristics::assess;
use mcp::{list_command_tools, list_tools};
use model::Entry;
use openapi::read_openapi;
use report::{print_table, starting_config, to_json};

/// `oncely inventory` arguments.
#[derive(Debug, Clone, Args)]
pub struct InventoryArgs {
    /// An OpenAPI 3.0 or 3.1 document, JSON or YAML (repeatable).
    #[arg(long = "openapi", value_name = "FILE")]
    pub openapi: Vec<PathBuf>,
    /// An MCP server's Streamable HTTP endpoint (repeatable).
    #[arg(long = "mcp", value_name = "URL")]
    pub mcp: Vec<String>,
    /// A local (stdio) MCP server's command line, started and asked for its tools; split
    /// as a POSIX shell splits it, nothing expanded (repeatable).
    #[arg(long = "mcp-command", value_name = "COMMAND")]
    pub mcp_command: Vec<String>,
    /// The current config: configured classes, keys, windows and reconciliation.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The ledger, for observed durations (default: the config's store, when it exists).
    #[arg(long, env = "ONCELY_STORE", value_name = "URL")]
    pub store: Option<String>,
    /// One JSON document on standard output.
    #[arg(long)]
    pub json: bool,
    /// Writes a starting config with these classes to FILE.
    #[arg(long, value_name = "FILE")]
    pub write_config: Option<PathBuf>,
}

/// Runs `oncely inventory`.
pub(crate) async fn run(args: InventoryArgs) -> Outcome {
    if args.openapi.is_empty() && args.mcp.is_empty() && args.mcp_command.is_empty() {
        return Err(Failure::usage(
            "inventory needs at least one --openapi FILE, --mcp URL or --mcp-command COMMAND",
        ));
    }
    // Every command line is split before anything is read or started.
    let commands = args
        .mcp_command
        .iter()
        .map(|c| {
            shell::split(c)
                .map(|words| (c, words))
                .map_err(|e| Failure::usage(format!("--mcp-command '{}': {e}", one_line(c))))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let config = match &args.config {
        Some(path) => Some(
            Config::load(path, &Overrides::default())
                .map_err(|e| Failure::usage(format!("config {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let mut found = Vec::new();
    for path in &args.openapi {
        found.extend(
            read_openapi(path)
                .map_err(|e| Failure::usage(format!("--openapi {}: {e}", path.display())))?,
        );
    }
    for url in &args.mcp {
        found.extend(
            list_tools(url)
                .await
                .map_err(|e| Failure::usage(format!("--mcp {url}: {e}")))?,
        );
    }
    for (command, words) in &commands {
        found.extend(
            list_command_tools(command, words).await.map_err(|e| {
                Failure::usage(format!("--mcp-command '{}': {e}", one_line(command)))
            })?,
        );
    }
    let durations = observed_durations(args.store.as_deref(), config.as_ref()).await?;
    let entries: Vec<Entry> = found
        .into_iter()
        .map(|f| assess(f, config.as_ref(), &durations))
        .collect();
    if let Some(path) = &args.write_config {
        let text = starting_config(&entries, config.as_ref());
        std::fs::write(path, text)
            .map_err(|e| Failure::usage(format!("cannot write {}: {e}", path.display())))?;
    }
    if args.json {
        println!("{}", to_json(&entries));
    } else {
        print_table(&entries);
        if let Some(path) = &args.write_config {
            println!("\nwrote a starting config to {}", path.display());
        }
    }
    Ok(())
}

/// A command line as an error message shows it: on one line.
fn one_line(command: &str) -> String {
    command.replace(['\n', '\r'], " ")
}
