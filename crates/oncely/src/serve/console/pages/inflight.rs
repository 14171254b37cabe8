//! `GET /console/inflight`: the records being executed now, on every instance on this
//! ledger; the page's script refreshes the table from `/console/inflight/fragment`
//! every 2 s.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Extension;
use oncely_core::State as RecordState;
use oncely_store::ListFilter;

use super::super::html::{age, esc, html, short_principal, Section};
use super::super::state::{Console, Viewer};
use super::shared::{ok, store_error, PageResult};

/// `GET /console/inflight`: the page; its script refreshes the fragment every 2 s.
pub(crate) async fn in_flight(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
) -> PageResult {
    let fragment = in_flight_table(&console).await?;
    Ok(ok(
        "In flight",
        Section::InFlight,
        &viewer,
        None,
        &format!(
            "<p class=\"hint\">Records being executed now, on every instance on this ledger. \
Refreshed every 2 s <span id=\"refreshed\"></span>.</p>\
<div id=\"inflight\" data-refresh=\"/console/inflight/fragment\" data-every=\"2000\">{fragment}</div>"
        ),
    ))
}

/// `GET /console/inflight/fragment`: the table alone.
pub(crate) async fn in_flight_fragment(State(console): State<Console>) -> PageResult {
    let table = in_flight_table(&console).await?;
    Ok(html(StatusCode::OK, table))
}

async fn in_flight_table(console: &Console) -> Result<String, Response> {
    let store = &console.store;
    let now = store.now().await.map_err(store_error)?;
    let filter = ListFilter {
        state: Some(RecordState::Processing),
        limit: Some(500),
        ..ListFilter::default()
    };
    let list = store.list(&filter).await.map_err(store_error)?;
    let mut out = format!(
        "<p class=\"summary\" id=\"inflight-count\" data-count=\"{0}\">{0} in flight</p>",
        list.len()
    );
    if list.is_empty() {
        return Ok(out);
    }
    out.push_str(
        "<table id=\"inflight-table\"><thead><tr><th>record</th><th>route</th><th>principal</th>\
<th>attempt</th><th>running for</th><th>owner</th><th>lease</th><th>repeats so far</th></tr></thead><tbody>",
    );
    for r in &list {
        let lease = match r.lease_until {
            Some(t) if t > now => format!("{} left", age(now.until(t))),
            Some(t) => format!("lapsed {} ago", age(t.until(now))),
            None => "-".into(),
        };
        let _ = write!(
            out,
            "<tr data-record=\"{id}\"><td><a class=\"mono\" href=\"/console/records/{id}\">{id}</a></td><td>{}</td>\
<td>{}</td><td>{}</td><td>{}</td><td class=\"mono\">{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.route),
            short_principal(&r.principal),
            r.attempt,
            age(r.updated_at.until(now)),
            esc(r.owner.as_deref().unwrap_or("-")),
            lease,
            r.repeats,
            id = esc(r.id.as_str()),
        );
    }
    out.push_str("</tbody></table>");
    Ok(out)
}
