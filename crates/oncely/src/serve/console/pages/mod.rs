//! The console's pages and actions, one module a page. Each reads the ledger through the
//! `Store` trait, as the admin API does; each action first shows a confirmation page (a
//! form that posts `confirmed=1`), then acts, logs (target `oncely::console`,
//! `by = "console"`) and sends the browser to the page that shows the result.
//!
//! What more than one page needs is in [`shared`]; the HTML pieces are the console's
//! `html` module, what the handlers share its `state` module.

pub(super) mod inflight;
pub(super) mod purge;
pub(super) mod reconcile;
pub(super) mod record;
pub(super) mod records;
pub(super) mod resolve;
mod shared;
pub(super) mod usage;
pub(super) mod webhooks;
