//! `oncely ledger list | show | resolve | reconcile | purge`.

use std::sync::Arc;

use oncely_core::{Record, RecordId, State};
use oncely_store::{ListFilter, Store, StoreError};

use super::store::{open, Ledger};
use super::{Failure, LedgerCommand, Outcome, ResolveArgs};
use crate::operations::{self, Verdict};
use crate::records;
use crate::serve::reconcile::{reconcile_once, Reconciled};

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
            if json {
                println!("{}", records::full(&record));
            } else {
                print_record(&record);
            }
            Ok(())
        }
        LedgerCommand::Resolve(args) => resolve(args).await,
        LedgerCommand::Reconcile { id, store } => {
            let ledger = open(&store).await?;
            let record = get(&*ledger.store, &id).await?;
            reconcile(&ledger, record).await
        }
        LedgerCommand::Purge { expired: _, store } => {
            let ledger = open(&store).await?;
            let n = ledger.store.purge_expired().await.map_err(store_failure)?;
            println!("purged {n} expired record{}", if n == 1 { "" } else { "s" });
            Ok(())
        }
    }
}

/// A store failure as a one-line exit 2.
pub(crate) fn store_failure(e: StoreError) -> Failure {
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

fn print_record(r: &Record) {
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
    let record = get(&*ledger.store, &args.id).await?;
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
    let window = operations::window_for(ledger.config.as_ref(), &record.route);
    let resolution =
        operations::resolution(verdict, window, "oncely ledger resolve").map_err(Failure::usage)?;
    let after = ledger
        .store
        .resolve(&record.id, resolution)
        .await
        .map_err(store_failure)?;
    println!("record {} is now {}", after.id, after.state);
    Ok(())
}

async fn reconcile(ledger: &Ledger, record: Record) -> Outcome {
    if record.state != State::OutcomeUnknown {
        return Err(Failure::usage(format!(
            "record {} is {}, not outcome_unknown: nothing to reconcile",
            record.id, record.state
        )));
    }
    let Some(config) = &ledger.config else {
        return Err(Failure::usage(format!(
            "record {} is on route {:?}: pass --config FILE so that its reconcile endpoint is known",
            record.id, record.route
        )));
    };
    let Some(route) = config.route_named(&record.route) else {
        return Err(Failure::usage(format!(
            "route {:?} of record {} is not in the config",
            record.route, record.id
        )));
    };
    if route.reconcile.is_none() {
        return Err(Failure::usage(format!(
            "route {:?} has no reconcile configured",
            record.route
        )));
    }
    if route.upstream.is_none() {
        return Err(Failure::usage(format!(
            "route {:?} has no upstream",
            record.route
        )));
    }
    let client = crate::serve::proxy::upstream_client(config.upstream_ca.as_deref())
        .map_err(|e| Failure::usage(format!("{e:#}")))?;
    match reconcile_once(&*ledger.store, &client, route, &record, 1).await {
        Reconciled::Completed(after) | Reconciled::Released(after) => {
            println!("record {} is now {}", after.id, after.state);
            Ok(())
        }
        Reconciled::Unknown(why) => Err(Failure::runtime(format!(
            "record {} stays outcome_unknown: {why}",
            record.id
        ))),
        Reconciled::Error(why) => Err(Failure::runtime(format!("record {}: {why}", record.id))),
    }
}
