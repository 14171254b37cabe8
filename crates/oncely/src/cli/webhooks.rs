//! `oncely webhooks dead [--json]` and `oncely webhooks redeliver ID`: the dead-letter
//! queue of webhook deliveries. A redelivered event is queued again; a running gateway's
//! delivery worker picks it up within its poll interval.

use clap::Subcommand;

use super::ledger::{op_failure, store_failure};
use super::store::open;
use super::store::StoreArgs;
use super::{Failure, Outcome};
use crate::operations::{self, Via};

/// The `webhooks` subcommands.
#[derive(Debug, Subcommand)]
pub enum WebhooksCommand {
    /// Lists dead-lettered deliveries (oldest first).
    Dead {
        /// One JSON document (an array) on standard output.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Queues a dead-lettered delivery again (its attempts start over).
    Redeliver {
        /// The delivery's id (`task_...`), or the event's record id (`rec_...`).
        id: String,
        #[command(flatten)]
        store: StoreArgs,
    },
}

pub(super) async fn run(cmd: WebhooksCommand) -> Outcome {
    match cmd {
        WebhooksCommand::Dead { json, store } => {
            let ledger = open(&store).await?;
            let dead = oncely_webhooks::list_dead(ledger.store.as_ref())
                .await
                .map_err(store_failure)?;
            if json {
                let text = serde_json::to_string(&dead)
                    .map_err(|e| Failure::runtime(format!("cannot write JSON: {e}")))?;
                println!("{text}");
                return Ok(());
            }
            if dead.is_empty() {
                println!("no dead-lettered webhook deliveries");
                return Ok(());
            }
            println!(
                "{:<38} {:<32} {:>8}  {:<24}  LAST ERROR",
                "ID", "EVENT", "ATTEMPTS", "DEAD SINCE"
            );
            for d in &dead {
                println!(
                    "{:<38} {:<32} {:>8}  {:<24}  {}",
                    d.id,
                    d.event_id,
                    d.attempts,
                    d.updated_at,
                    d.last_error.as_deref().unwrap_or("-")
                );
            }
            Ok(())
        }
        WebhooksCommand::Redeliver { id, store } => {
            let ledger = open(&store).await?;
            let d = operations::redeliver(ledger.store.as_ref(), None, &id, Via::Cli)
                .await
                .map_err(op_failure)?;
            println!(
                "{}: event {} queued for delivery to {} again",
                d.id, d.event_id, d.deliver_to
            );
            Ok(())
        }
    }
}
