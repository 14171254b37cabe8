//! `GET /console/usage`: fresh executions against repeats per principal over a period,
//! with a chart of both over time.

use std::fmt::Write as _;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Extension;
use oncely_core::State as RecordState;
use oncely_store::{ListFilter, StoreError};
use serde::Deserialize;

use super::super::html::{self, chart, error_page, esc, url_enc, Section};
use super::super::state::{Console, Viewer};
use super::shared::{ok, store_error, truncate, PageResult, EVENTS};

/// The newest executions per principal the usage chart reads.
const CHART_RECORDS: usize = 1_000;

#[derive(Debug, Deserialize, Default)]
pub(crate) struct UsageQuery {
    #[serde(default)]
    since: String,
    #[serde(default)]
    principal: String,
}

/// `GET /console/usage`: per principal, executions charged and repeats not charged, with
/// a chart of both over the period (for one principal, or the top 20 together).
pub(crate) async fn usage(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Query(q): Query<UsageQuery>,
) -> PageResult {
    let store = &console.store;
    let since_text = match q.since.trim() {
        "" => "24h",
        s => s,
    };
    let since = oncely_core::parse_duration(since_text)
        .map_err(|e| error_page(StatusCode::BAD_REQUEST, "Bad period", &e))?;
    let now = store.now().await.map_err(store_error)?;
    let from = now.minus(since);
    let usage = store.usage(Some(from)).await.map_err(store_error)?;
    let selected = match q.principal.trim() {
        "" => None,
        p => Some(
            crate::operations::principal_filter(store, p)
                .await
                .map_err(|_| store_error(StoreError::Unavailable("principal key".into())))?,
        ),
    };
    let charted: Vec<String> = match &selected {
        Some(p) => vec![p.clone()],
        None => usage
            .by_principal
            .iter()
            .take(10)
            .map(|r| r.principal.clone())
            .collect(),
    };
    let mut fresh = Vec::new();
    let mut repeats = Vec::new();
    let mut events_kept = true;
    for p in &charted {
        let filter = ListFilter {
            state: Some(RecordState::Completed),
            principal: Some(p.clone()),
            route: None,
            limit: Some(CHART_RECORDS),
        };
        for r in store.list(&filter).await.map_err(store_error)? {
            if let Some(t) = r.completed_at.filter(|t| *t >= from) {
                // As the usage counts them: every record completed in the period.
                if r.state == RecordState::Completed {
                    fresh.push(t);
                }
            }
        }
        match store.repeat_events(p, Some(from), EVENTS).await {
            Ok(ev) => repeats.extend(ev.listed.iter().map(|e| e.at)),
            Err(_) => events_kept = false,
        }
    }
    let data = html::buckets(from, now, 24, &fresh, &repeats);
    let mut body = format!(
        "<form method=\"get\" action=\"/console/usage\" class=\"search\">\
<label>Period <select name=\"since\" id=\"u-since\">{}</select></label>\
<label>Principal (raw or hash) <input name=\"principal\" id=\"u-principal\" value=\"{}\"></label>\
<button type=\"submit\" id=\"u-go\">Show</button></form>",
        ["1h", "24h", "7d", "30d"]
            .iter()
            .map(|s| format!(
                "<option{}>{s}</option>",
                if *s == since_text { " selected" } else { "" }
            ))
            .collect::<String>(),
        esc(&q.principal)
    );
    let label = match &selected {
        Some(p) => format!(
            "fresh vs repeats for {} over the last {since_text}",
            truncate(p, 12)
        ),
        None => format!(
            "fresh vs repeats over the last {since_text} (top {} principals; at most the newest {CHART_RECORDS} executions of each)",
            charted.len()
        ),
    };
    let _ = write!(
        body,
        "<figure id=\"usage-chart\">{}<figcaption>{}</figcaption></figure>",
        chart(&label, from, now, &data),
        esc(&label)
    );
    if !events_kept {
        body.push_str("<p class=\"hint\">This store keeps no repeat events: the chart shows executions only.</p>");
    }
    body.push_str(
        "<table id=\"usage\"><thead><tr><th>principal (keyed hash)</th><th>fresh</th><th>fresh units</th>\
<th>repeats</th><th>repeat units (not charged)</th></tr></thead><tbody>",
    );
    for r in usage
        .by_principal
        .iter()
        .filter(|r| selected.as_ref().is_none_or(|p| *p == r.principal))
    {
        let _ = write!(
            body,
            "<tr data-principal=\"{p}\"><td><a class=\"mono\" href=\"/console/usage?since={since}&amp;principal={p}\">{p}</a></td>\
<td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            r.fresh,
            r.fresh_units,
            r.repeats,
            r.repeat_units,
            p = esc(&r.principal),
            since = url_enc(since_text),
        );
    }
    let t = &usage.totals;
    let _ = write!(
        body,
        "</tbody><tfoot><tr><th>total</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr></tfoot></table>\
<p class=\"hint\">Of the records completed in the period. A statement for one account: \
<code>oncely usage --statement ACCOUNT</code>.</p>",
        t.fresh, t.fresh_units, t.repeats, t.repeat_units
    );
    Ok(ok("Usage", Section::Usage, &viewer, None, &body))
}
