//! `GET /console/usage`: fresh executions against repeats per principal over a period,
//! with a chart of both over time: the whole period, from the usage history (kept per
//! hour for `usage_retention`) and the records in the ledger.

use std::fmt::Write as _;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Extension;
use oncely_store::StoreError;
use serde::Deserialize;

use super::super::html::{self, chart, error_page, esc, url_enc, Section};
use super::super::state::{Console, Viewer};
use super::shared::{ok, store_error, truncate, PageResult};

const HOUR: Duration = Duration::from_secs(3600);
/// The longest period charted per hour; longer ones are charted per day (or per so many
/// days that at most [`MOST_BARS`] bars are drawn).
const HOURLY_UP_TO: Duration = Duration::from_secs(48 * 3600);
const MOST_BARS: u64 = 100;

#[derive(Debug, Deserialize, Default)]
pub(crate) struct UsageQuery {
    #[serde(default)]
    since: String,
    #[serde(default)]
    principal: String,
}

/// `GET /console/usage`: per principal, executions charged and repeats not charged, with
/// a chart of both over the period, per hour or per day (for one principal, or every one
/// together). The period starts at the start of its first hour.
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
    let from = crate::operations::period_start(now, since);
    let usage = store.usage(Some(from)).await.map_err(store_error)?;
    let hours = store.usage_by_hour(Some(from)).await.map_err(store_error)?;
    let selected = match q.principal.trim() {
        "" => None,
        p => Some(
            crate::operations::principal_filter(store, p)
                .await
                .map_err(|_| store_error(StoreError::Unavailable("principal key".into())))?,
        ),
    };
    let span = from.until(now);
    let (step, per) = if since <= HOURLY_UP_TO {
        (HOUR, "hour".to_owned())
    } else {
        let days = span.as_secs().div_ceil(86_400).div_ceil(MOST_BARS).max(1);
        let per = match days {
            1 => "day".to_owned(),
            n => format!("{n} days"),
        };
        (Duration::from_secs(86_400 * days), per)
    };
    let slots = span.as_millis().div_ceil(step.as_millis()).max(1) as usize;
    let data = html::buckets(
        from,
        step,
        slots,
        hours
            .iter()
            .filter(|h| selected.as_ref().is_none_or(|p| *p == h.principal))
            .map(|h| (h.hour, h.fresh, h.repeats)),
    );
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
            "fresh vs repeats for {} over the last {since_text}, per {per}",
            truncate(p, 12)
        ),
        None => format!("fresh vs repeats over the last {since_text}, per {per} (every principal)"),
    };
    let _ = write!(
        body,
        "<figure id=\"usage-chart\">{}<figcaption>{}</figcaption></figure>",
        chart(&label, from, now, &data),
        esc(&label)
    );
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
<p class=\"hint\" id=\"usage-period\">The whole period, from {} (the start of its first hour): the usage \
history, which keeps what records counted after they leave the ledger, per hour, for <code>usage_retention</code>, \
with the records still in the ledger. A statement for one account: \
<code>oncely usage --statement ACCOUNT</code>; rows for a billing system: <code>oncely usage --by hour</code>.</p>",
        t.fresh, t.fresh_units, t.repeats, t.repeat_units,
        esc(&crate::records::hour(from))
    );
    Ok(ok("Usage", Section::Usage, &viewer, None, &body))
}
