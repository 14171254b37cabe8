//! `oncely serve`'s arguments (the CLI parses them; `serve` owns them).

use std::path::PathBuf;

use clap::Args;

use crate::logs::LogFormat;

/// `oncely serve` arguments.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The config file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The default upstream (without --config: guard every POST, PUT, PATCH and DELETE).
    #[arg(long, value_name = "URL")]
    pub upstream: Option<String>,
    /// Gateway address (port 0 picks a free port; the first log line names it).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Admin API address.
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// The ledger.
    #[arg(long, env = "ONCELY_STORE", value_name = "URL")]
    pub store: Option<String>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}
