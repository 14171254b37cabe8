//! `oncely ledger list | show | resolve | reconcile | purge`.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand, ValueEnum};
use oncely_core::{Record, RecordId};
use oncely_store::{ListFilter, Store, StoreError};

use super::store::{open, StoreArgs};
use super::{Failure, Outcome};
use crate::operations::{self, OpError, Verdict, Via};
use crate::reconcile::Reconciled;
use crate::records;

/// A ledger state, as `--status` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum StatusArg {
    /// Being executed.
    Processing,
    /// Done, replayed until it expires.
    Completed,
    /// Awaiting reconciliation.
    OutcomeUnknown,
    /// Failed harmlessly.
    Released,
}

impl From<StatusArg> for oncely_core::State {
    fn from(s: StatusArg) -> oncely_core::State {
        match s {
            StatusArg::Processing => oncely_core::State::Processing,
            StatusArg::Completed => oncely_core::State::Completed,
            StatusArg::OutcomeUnknown => oncely_core::State::OutcomeUnknown,
            StatusArg::Released => oncely_core::State::Released,
        }
    }
}

/// `oncely ledger ...`.
#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// Lists records, newest first.
    List {
        /// Only records in this state.
        #[arg(long, value_enum, value_name = "S")]
        status: Option<StatusArg>,
        /// Only this principal: its hash, or its raw value (hashed with the store's key).
        #[arg(long, value_name = "P")]
        principal: Option<String>,
        /// Only this route: its name ("POST /v1/render") or its path pattern alone
        /// ("/v1/render", any method).
        #[arg(long, value_name = "R")]
        route: Option<String>,
        /// At most this many.
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// One JSON array on standard output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// One record, every field.
    Show {
        /// The record id (as in `Oncely-Record`).
        id: String,
        /// One JSON object on standard output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Resolves an outcome_unknown record.
    Resolve(ResolveArgs),
    /// Asks the route's reconcile endpoint now and resolves the record by its answer.
    Reconcile {
        /// The record id.
        id: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Deletes expired records (what they counted stays in the usage history), and the
    /// usage history's hours older than `usage_retention` (of `--config`, else 400d).
    Purge {
        /// Expired records only (the only kind purge deletes; accepted for clarity).
        #[arg(long)]
        expired: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
}

/// `oncely ledger resolve ID --released | --completed --status CODE ...`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("verdict").required(true).args(["released", "completed"])))]
pub struct ResolveArgs {
    /// The record id.
    pub id: String,
    /// The action did not happen: the next identical request executes afresh.
    #[arg(long)]
    pub released: bool,
    /// The action happened: later duplicates get this response.
    #[arg(long, requires = "status")]
    pub completed: bool,
    /// The response status duplicates get.
    #[arg(long, value_name = "CODE", value_parser = parse_status_arg, requires = "completed")]
    pub status: Option<u16>,
    /// The response body duplicates get.
    #[arg(long, value_name = "F", requires = "completed")]
    pub body_file: Option<PathBuf>,
    /// A response header, `Name: value` (repeatable).
    #[arg(long = "header", value_name = "'Name: value'", value_parser = parse_header_arg, requires = "completed")]
    pub headers: Vec<(String, String)>,
    #[command(flatten)]
    pub store: StoreArgs,
}

fn parse_header_arg(text: &str) -> Result<(String, String), String> {
    operations::header_line(text)
}

fn parse_status_arg(text: &str) -> Result<u16, String> {
    let code: u16 = text.parse().map_err(|e| format!("{e}"))?;
    operations::status(code)
}

pub(crate) async fn run(cmd: LedgerCommand) -> Outcome {
    match cmd {
        LedgerCommand::List {
            status,
            principal,
            route,
            limit,
            json,
            store,
        } => {
            let ledger = open(&store).await?;
            let principal = match principal {
                Some(p) => Some(principal_filter(&ledger.store, &p).await?),
                None => None,
            };
            // `--route R` is a route's name ("POST /v1/render"), or its path pattern
            // alone ("/v1/render"), which matches the pattern under every method.
            let (route, pattern) = match route {
                Some(r) if !r.trim().contains(' ') => (None, Some(r.trim().to_owned())),
                other => (other, None),
            };
            let filter = ListFilter {
                state: status.map(Into::into),
                principal,
                route,
                limit: if pattern.is_some() { None } else { limit },
            };
            let mut list = ledger.store.list(&filter).await.map_err(store_failure)?;
            if let Some(pattern) = &pattern {
                list.retain(|r| {
                    r.route
                        .split_once(' ')
                        .map_or(r.route == *pattern, |(_, p)| p == pattern)
                });
                if let Some(n) = limit {
                    list.truncate(n);
                }
            }
            if json {
                let all: Vec<_> = list.iter().map(records::summary).collect();
                println!("{}", serde_json::Value::Array(all));
            } else {
                print_table(&list);
            }
            Ok(())
        }
        LedgerCommand::Show { id, json, store } => {
            let ledger = open(&store).await?;
            let record = get(&*ledger.store, &id).await?;
            let churn = ledger.store.churn_of(&record.id).await.map_err(|e| {
                Failure::runtime(format!("cannot read the keys that joined {id}: {e}"))
            })?;
            if json {
                println!("{}", records::detail(&record, &churn));
            } else {
                print_record(&record, &churn);
            }
            Ok(())
        }
        LedgerCommand::Resolve(args) => resolve(args).await,
        LedgerCommand::Reconcile { id, store } => {
            let ledger = open(&store).await?;
            let outcome =
                operations::reconcile(&*ledger.store, ledger.config.as_ref(), &id, Via::Cli)
                    .await
                    .map_err(op_failure)?;
            match outcome {
                Reconciled::Completed(after) | Reconciled::Released(after) => {
                    println!("record {} is now {}", after.id, after.state);
                    Ok(())
                }
                Reconciled::Unknown(why) => Err(Failure::runtime(format!(
                    "record {id} stays outcome_unknown: {why}"
                ))),
                Reconciled::Error(why) => Err(Failure::runtime(format!("record {id}: {why}"))),
            }
        }
        LedgerCommand::Purge { expired: _, store } => {
            let ledger = open(&store).await?;
            let retention = operations::usage_retention(ledger.config.as_ref());
            let purged = operations::purge(&*ledger.store, retention, Via::Cli)
                .await
                .map_err(op_failure)?;
            let n = purged.records;
            println!(
                "purged {n} expired record{} and {} usage history row{} older than {}",
                if n == 1 { "" } else { "s" },
                purged.history_rows,
                if purged.history_rows == 1 { "" } else { "s" },
                oncely_core::units::format_duration(retention)
            );
            Ok(())
        }
    }
}

/// A store failure as a one-line exit 2.
pub(crate) fn store_failure(e: StoreError) -> Failure {
    Failure::usage(e)
}

/// An operator step that was not taken as a one-line exit 2.
pub(crate) fn op_failure(e: OpError) -> Failure {
    Failure::usage(e)
}

async fn get(store: &dyn Store, id: &str) -> Result<Record, Failure> {
    let id = RecordId(id.to_owned());
    match store.get(&id).await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(Failure::usage(format!("no ledger record {id}"))),
        Err(e) => Err(store_failure(e)),
    }
}

/// A principal as `--principal` takes it ([`crate::operations::principal_filter`]).
pub(super) async fn principal_filter(store: &Arc<dyn Store>, p: &str) -> Result<String, Failure> {
    crate::operations::principal_filter(store, p)
        .await
        .map_err(store_failure)
}

fn time(t: Option<oncely_core::Timestamp>) -> String {
    t.map_or_else(|| "-".to_owned(), |t| t.to_rfc3339())
}

fn print_table(list: &[Record]) {
    println!(
        "{:<36} {:<15} {:<6} {:>7} {:>6} {:>7} {:<24} ROUTE",
        "ID", "STATE", "CLASS", "ATTEMPT", "UNITS", "REPEATS", "CREATED"
    );
    for r in list {
        println!(
            "{:<36} {:<15} {:<6} {:>7} {:>6} {:>7} {:<24} {}",
            r.id,
            r.state,
            r.class,
            r.attempt,
            r.units,
            r.repeats,
            r.created_at.to_rfc3339(),
            r.route
        );
    }
}

fn print_record(r: &Record, churn: &[oncely_store::ChurnEntry]) {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    println!("id:                  {}", r.id);
    println!("state:               {}", r.state);
    println!("route:               {}", r.route);
    println!("class:               {}", r.class);
    println!("scope:               {}", r.scope);
    println!("key:                 {}", r.key);
    println!("fingerprint:         {}", r.fingerprint.to_hex());
    println!("principal:           {}", r.principal);
    println!("owner:               {}", opt(&r.owner));
    println!("attempt:             {}", r.attempt);
    println!("lease_until:         {}", time(r.lease_until));
    println!("created_at:          {}", r.created_at.to_rfc3339());
    println!("updated_at:          {}", r.updated_at.to_rfc3339());
    println!("completed_at:        {}", time(r.completed_at));
    println!("expires_at:          {}", time(r.expires_at));
    println!("units:               {}", r.units);
    println!("repeats:             {}", r.repeats);
    println!("repeat_units:        {}", r.repeat_units);
    println!("workflow_id:         {}", opt(&r.workflow_id));
    println!("provider_request_id: {}", opt(&r.provider_request_id));
    println!("last_error:          {}", opt(&r.last_error));
    let (joined, undelivered) = records::churn(churn);
    if !joined.is_empty() {
        println!("joined_keys:         {}", joined.join(", "));
    }
    if undelivered {
        println!("undelivered:         its caller went away before its answer");
    }
    match &r.response {
        None => println!("response:            -"),
        Some(resp) => {
            let v = records::response(resp);
            println!("response.status:     {}", resp.status);
            for (n, val) in &resp.headers {
                println!("response.header:     {n}: {val}");
            }
            match (&v["body"], &v["body_encoding"]) {
                (serde_json::Value::String(b), enc) => {
                    println!("response.body ({}):", enc.as_str().unwrap_or("utf8"));
                    println!("{b}");
                }
                _ => println!("response.body:       (not kept: larger than max_response)"),
            }
        }
    }
}

async fn resolve(args: ResolveArgs) -> Outcome {
    let ledger = open(&args.store).await?;
    let verdict = if args.released {
        Verdict::Released
    } else {
        let body = match &args.body_file {
            Some(f) => std::fs::read(f)
                .map_err(|e| Failure::usage(format!("cannot read {}: {e}", f.display())))?,
            None => Vec::new(),
        };
        Verdict::Completed {
            status: args
                .status
                .expect("clap requires --status with --completed"),
            headers: args.headers.clone(),
            body,
        }
    };
    let after = operations::resolve(
        &*ledger.store,
        ledger.config.as_ref(),
        &args.id,
        verdict,
        Via::Cli,
    )
    .await
    .map_err(op_failure)?;
    println!("record {} is now {}", after.id, after.state);
    Ok(())
}
