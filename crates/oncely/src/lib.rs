//! The oncely gateway: the binary's code as a library, so that tests can run the server
//! in-process on port 0 and the binary stays a one-line `main`.
//!
//! # Layout
//!
//! - [`config`]: the TOML file, read into one validated [`config::Config`].
//! - [`cli`]: the commands (`serve`, `ledger`, `usage`, `migrate`, `check-config`, ...).
//! - [`serve`]: the gateway: route table, TLS, admin API, console, shutdown.
//! - [`upstream`]: the reverse proxy to the upstreams, and its retries.
//! - [`reconcile`]: asking an upstream whether an `outcome_unknown` action happened (the
//!   server's loop and the operator's one attempt).
//! - [`demo`]: `oncely demo`, the self-contained showcase (service, gateway, agent).
//! - [`records`]: the JSON views of ledger records and usage that the CLI and the admin
//!   API share.
//! - [`operations`]: what an operator does to the ledger (resolutions, principal
//!   filters), one home for the CLI, the admin API and the console.
//! - [`logs`]: the tracing subscriber (text or one JSON object a line).
//! - [`outcome`]: what every command returns (`Failure`, `Outcome`).

pub mod cli;
pub mod config;
pub mod demo;
pub mod logs;
pub mod operations;
pub mod outcome;
pub mod reconcile;
pub mod records;
pub mod serve;
pub mod statement;
pub mod upstream;
