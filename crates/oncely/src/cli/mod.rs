//! The command line: one clap-derived [`Cli`], one module per command family.
//!
//! Exit codes: 0 on success; 2 for a bad argument, a bad config, an unknown store scheme,
//! an unreachable store or an unknown record id, always with one line on standard error;
//! 1 when a command ran but could not do what was asked for a reason outside the user's
//! input (e.g. `ledger reconcile` whose upstream still cannot tell).

mod audit;
mod inventory;
mod ledger;
mod mcp_stdio;
mod store;
mod usage;
mod webhooks;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use ledger::LedgerCommand;
use store::StoreArgs;

pub use crate::logs::LogFormat;
pub use crate::outcome::{Failure, Outcome};
pub use crate::serve::args::ServeArgs;
pub use usage::{By, UsageFormat};

/// The gateway that makes expensive calls safe to repeat.
#[derive(Debug, Parser)]
#[command(name = "oncely", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Runs the gateway.
    Serve(ServeArgs),
    /// Runs a self-contained showcase: a slow, billed service, the gateway in front of it,
    /// and an agent that retries; prints what was executed, replayed and charged.
    Demo {
        /// Anything the demo takes (only the hidden `--render-time DURATION`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        rest: Vec<String>,
    },
    /// Reads and reconciles the ledger.
    #[command(subcommand)]
    Ledger(LedgerCommand),
    /// Per principal: fresh executions and repeats, with their units, over the whole
    /// period (the usage history and the records in the ledger).
    Usage {
        /// The period: from the start of the hour this long ago (e.g. 24h, 7d); everything
        /// kept when absent.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration_arg)]
        since: Option<std::time::Duration>,
        /// One JSON document on standard output.
        #[arg(long, conflicts_with_all = ["statement", "by"])]
        json: bool,
        /// A statement for this one account that explains its bill: what it was charged,
        /// each repeat it was not charged for, and the totals (the principal's hash, or
        /// its raw value).
        #[arg(long, value_name = "PRINCIPAL", conflicts_with = "by")]
        statement: Option<String>,
        /// Rows per principal, route and hour, for a billing system.
        #[arg(long, value_enum, value_name = "PERIOD")]
        by: Option<By>,
        /// How the statement (md, html; default md) or the rows of `--by hour` (csv, json;
        /// default csv) are written.
        #[arg(long, value_enum)]
        format: Option<UsageFormat>,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Reports the requests in a log that repeated an earlier identical one within the
    /// window: what a guard would have saved, and what to credit.
    Audit(audit::AuditArgs),
    /// Dead-lettered webhook deliveries, and sending one again.
    #[command(subcommand)]
    Webhooks(webhooks::WebhooksCommand),
    /// Creates or upgrades the store's schema.
    Migrate {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// The failure-boundary map of OpenAPI operations and MCP tools: classes, keys,
    /// windows, replays, reconciliation, and the gaps with the config lines that close them.
    Inventory(inventory::InventoryArgs),
    /// Guards a local MCP server that an assistant host starts over stdio: put `oncely mcp
    /// --` before the server's command in the host's config (or `--url URL` for a remote
    /// one).
    Mcp(mcp_stdio::McpArgs),
    /// Validates a config file: exit 0 when valid, else 2 with each problem on a line.
    CheckConfig {
        /// The file.
        file: PathBuf,
    },
}

fn parse_duration_arg(text: &str) -> Result<std::time::Duration, String> {
    oncely_core::parse_duration(text)
}

/// Parses the arguments, runs the command, and turns the outcome into an exit code.
pub fn main() -> ExitCode {
    quiet_on_broken_pipe();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_failure(e),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("oncely: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(run(cli));
    // A task still blocked at the end (a connection held past `drain_timeout`, a store
    // call that hangs) must not keep the process alive.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            // One line, whatever the error chain held.
            // (A failure that already said everything, e.g. check-config's problem
            // lines, has no message of its own.)
            let line = f.message.replace(['\n', '\r'], " ");
            if !line.is_empty() {
                eprintln!("oncely: {line}");
            }
            ExitCode::from(f.code)
        }
    }
}

/// `oncely ledger list | head -1`: a standard output closed by its reader ends the
/// command quietly with exit 0 (as ripgrep does), where `println!` would panic and print
/// a backtrace. Every other panic goes to the default hook.
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let text = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if text.starts_with("failed printing to stdout") && text.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

/// Clap's help and version go to stdout with exit 0; its usage errors are cut to their
/// first line (the reason) and exit 2. A command family called without its command
/// (`oncely ledger`) is a usage error too: one line naming the commands, not the help.
fn clap_failure(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            eprintln!("oncely: {}", missing_command(std::env::args().skip(1)));
            ExitCode::from(2)
        }
        _ => {
            // The reason is the first paragraph ("error: ..." and any indented lines
            // it introduces, such as the missing arguments); usage and hints follow a
            // blank line.
            let text = e.render().to_string();
            let reason: Vec<&str> = text
                .lines()
                .skip_while(|l| l.trim().is_empty())
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let reason = reason.join(" ");
            let reason = reason.strip_prefix("error: ").unwrap_or(&reason);
            eprintln!("oncely: {reason}");
            ExitCode::from(2)
        }
    }
}

/// The one-line reason for a command family called without its command: the family
/// the arguments reached, and the commands it has.
fn missing_command(args: impl Iterator<Item = String>) -> String {
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let mut path = vec![cmd.get_name().to_owned()];
    for arg in args {
        let Some(sub) = cmd.find_subcommand(&arg).cloned() else {
            continue;
        };
        path.push(sub.get_name().to_owned());
        cmd = sub;
    }
    let names: Vec<&str> = cmd
        .get_subcommands()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        .map(|c| c.get_name())
        .collect();
    let path = path.join(" ");
    format!(
        "`{path}` needs a command: {} (see `{path} --help`)",
        names.join(", ")
    )
}

async fn run(cli: Cli) -> Outcome {
    match cli.command {
        Command::Serve(args) => crate::serve::cli(args).await,
        Command::Ledger(cmd) => ledger::run(cmd).await,
        Command::Usage {
            since,
            json,
            statement,
            by,
            format,
            store,
        } => match (statement, by) {
            (Some(principal), _) => {
                let format = usage::statement_format(format)?;
                usage::statement(&principal, since, format, &store).await
            }
            (None, Some(By::Hour)) => usage::by_hour(since, format, &store).await,
            (None, None) => {
                usage::no_format(format)?;
                usage::run(since, json, &store).await
            }
        },
        Command::Migrate { store } => store::migrate(&store).await,
        Command::CheckConfig { file } => check_config(&file),
        Command::Demo { rest } => crate::demo::cli(rest).await,
        Command::Audit(args) => audit::run(args).await,
        Command::Webhooks(cmd) => webhooks::run(cmd).await,
        Command::Inventory(args) => inventory::run(args).await,
        Command::Mcp(args) => mcp_stdio::run(args).await,
    }
}

fn check_config(file: &std::path::Path) -> Outcome {
    // The OTEL_* variables are part of the configuration the file would run with.
    let loaded = crate::config::Config::load(file, &crate::config::Overrides::default())
        .and_then(|config| config.telemetry().map(|_| config));
    match loaded {
        Ok(_) => {
            println!("{}: ok", file.display());
            Ok(())
        }
        Err(crate::config::ConfigError::Invalid(problems)) => {
            // Each problem on its own line, and nothing else: the line count is the
            // problem count.
            for p in &problems {
                eprintln!("{}", p.to_string().replace(['\n', '\r'], " "));
            }
            Err(Failure {
                code: 2,
                message: String::new(),
            })
        }
        Err(e) => Err(Failure::usage(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ledger::StatusArg;

    #[test]
    fn the_cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn resolve_needs_a_verdict_and_completed_needs_a_status() {
        assert!(Cli::try_parse_from(["oncely", "ledger", "resolve", "r1"]).is_err());
        assert!(Cli::try_parse_from(["oncely", "ledger", "resolve", "r1", "--completed"]).is_err());
        assert!(Cli::try_parse_from([
            "oncely",
            "ledger",
            "resolve",
            "r1",
            "--released",
            "--completed"
        ])
        .is_err());
        let ok = Cli::try_parse_from([
            "oncely",
            "ledger",
            "resolve",
            "r1",
            "--completed",
            "--status",
            "201",
            "--header",
            "Content-Type: application/json",
        ])
        .unwrap();
        let Command::Ledger(LedgerCommand::Resolve(args)) = ok.command else {
            panic!()
        };
        assert_eq!(
            args.headers,
            vec![("content-type".into(), "application/json".into())]
        );
        assert!(Cli::try_parse_from([
            "oncely",
            "ledger",
            "resolve",
            "r1",
            "--completed",
            "--status",
            "1000"
        ])
        .is_err());
    }

    #[test]
    fn statuses_and_durations_are_checked_by_the_parser() {
        assert!(Cli::try_parse_from(["oncely", "ledger", "list", "--status", "done"]).is_err());
        let ok = Cli::try_parse_from(["oncely", "ledger", "list", "--status", "outcome_unknown"])
            .unwrap();
        assert!(matches!(
            ok.command,
            Command::Ledger(LedgerCommand::List {
                status: Some(StatusArg::OutcomeUnknown),
                ..
            })
        ));
        assert!(Cli::try_parse_from(["oncely", "usage", "--since", "5x"]).is_err());
    }
}
