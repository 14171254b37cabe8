//! `GET /console/`, the console's front page: the records, searched by key (or record
//! id), principal, route and state, `outcome_unknown` first with how long each has
//! waited, then the newest, a page at a time.

use std::fmt::Write as _;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Extension;
use oncely_core::{Record, State as RecordState};
use oncely_store::{ListFilter, StoreError};
use serde::Deserialize;

use super::super::html::{age, error_page, esc, short_principal, state_badge, url_enc, Section};
use super::super::state::{Console, Viewer};
use super::shared::{ok, store_error, truncate, PageResult};

/// Records per page.
const PAGE: usize = 50;
/// The newest records a search by key or path looks through.
const SCAN: usize = 5_000;
/// The most `outcome_unknown` records the list shows.
const MAX_UNKNOWN: usize = 1_000;

/// The records list's query.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct RecordsQuery {
    #[serde(default)]
    key: String,
    #[serde(default)]
    principal: String,
    #[serde(default)]
    route: String,
    #[serde(default)]
    state: String,
    page: Option<usize>,
    done: Option<String>,
}

/// `GET /console/`: the records, `outcome_unknown` first (longest waiting first), then
/// the newest; searched by key (or record id), principal, route and state.
pub(crate) async fn records(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Query(q): Query<RecordsQuery>,
) -> PageResult {
    let store = &console.store;
    let now = store.now().await.map_err(store_error)?;
    let state = match q.state.trim() {
        "" => None,
        s => Some(
            s.parse::<RecordState>()
                .map_err(|e| error_page(StatusCode::BAD_REQUEST, "Bad search", &e))?,
        ),
    };
    let principal = match q.principal.trim() {
        "" => None,
        p => Some(
            crate::operations::principal_filter(store, p)
                .await
                .map_err(|_| store_error(StoreError::Unavailable("principal key".into())))?,
        ),
    };
    // A route's name ("POST /v1/render"), or its path pattern alone under every method.
    let route = q.route.trim();
    let (route_name, pattern) = match route {
        "" => (None, None),
        r if r.contains(' ') => (Some(r.to_owned()), None),
        r => (None, Some(r.to_owned())),
    };
    let key = q.key.trim();
    let page_no = q.page.unwrap_or(1).clamp(1, 100_000);
    let offset = (page_no - 1) * PAGE;
    // Enough records for this page and one more (to know whether a next page exists);
    // outcome_unknown first, the longest waiting at the top, then the newest first.
    // Without a key or path filter, two bounded reads; with one, the newest SCAN records
    // are read and filtered here.
    let scan = !key.is_empty() || pattern.is_some();
    let want = offset + PAGE + 1;
    let (mut unknown, rest, scanned_all) = if scan {
        let filter = ListFilter {
            state,
            principal,
            route: route_name,
            limit: Some(SCAN),
        };
        let mut list = store.list(&filter).await.map_err(store_error)?;
        let scanned_all = list.len() < SCAN;
        list.retain(|r| {
            pattern.as_ref().is_none_or(|p| {
                r.route
                    .split_once(' ')
                    .map_or(r.route == *p, |(_, path)| path == p)
            }) && (key.is_empty() || r.key.contains(key) || r.id.as_str() == key)
        });
        let (unknown, rest): (Vec<Record>, Vec<Record>) = list
            .into_iter()
            .partition(|r| r.state == RecordState::OutcomeUnknown);
        (unknown, rest, scanned_all)
    } else {
        let unknown = if state.is_none_or(|s| s == RecordState::OutcomeUnknown) {
            let filter = ListFilter {
                state: Some(RecordState::OutcomeUnknown),
                principal: principal.clone(),
                route: route_name.clone(),
                limit: Some(MAX_UNKNOWN),
            };
            store.list(&filter).await.map_err(store_error)?
        } else {
            Vec::new()
        };
        let rest = if state == Some(RecordState::OutcomeUnknown) {
            Vec::new()
        } else {
            let filter = ListFilter {
                state,
                principal,
                route: route_name,
                // Up to unknown.len() of these are outcome_unknown, dropped below.
                limit: Some(want.max(unknown.len())),
            };
            let mut rest = store.list(&filter).await.map_err(store_error)?;
            rest.retain(|r| r.state != RecordState::OutcomeUnknown);
            rest
        };
        let all = unknown.len() < MAX_UNKNOWN;
        (unknown, rest, all)
    };
    unknown.sort_by_key(|r| r.updated_at);
    let unknown_count = unknown.len();
    let mut shown: Vec<Record> = unknown
        .into_iter()
        .chain(rest)
        .skip(offset)
        .take(PAGE + 1)
        .collect();
    let more = shown.len() > PAGE;
    shown.truncate(PAGE);

    let mut body = String::new();
    let routes: Vec<&str> = console
        .config
        .routes
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    let _ = write!(
        body,
        "<form method=\"get\" action=\"/console/\" class=\"search\" id=\"search\">\
<label>Key or record id <input name=\"key\" id=\"q-key\" value=\"{}\"></label>\
<label>Principal (raw or hash) <input name=\"principal\" id=\"q-principal\" value=\"{}\"></label>\
<label>Route <input name=\"route\" id=\"q-route\" list=\"routes\" value=\"{}\"></label>\
<datalist id=\"routes\">{}</datalist>\
<label>State <select name=\"state\" id=\"q-state\">{}</select></label>\
<button type=\"submit\" id=\"q-go\">Search</button> <a href=\"/console/\">clear</a></form>",
        esc(&q.key),
        esc(&q.principal),
        esc(&q.route),
        routes
            .iter()
            .map(|r| format!("<option value=\"{}\">", esc(r)))
            .collect::<String>(),
        ["", "outcome_unknown", "processing", "completed", "released"]
            .iter()
            .map(|s| format!(
                "<option value=\"{s}\"{}>{}</option>",
                if q.state.trim() == *s {
                    " selected"
                } else {
                    ""
                },
                if s.is_empty() { "any" } else { s }
            ))
            .collect::<String>()
    );
    let _ = write!(
        body,
        "<p class=\"summary\" id=\"summary\"><strong>{unknown_count}{} outcome_unknown</strong>{}. \
<a href=\"/console/purge\">Purge expired records…</a></p>",
        if scanned_all { "" } else { "+" },
        if scan && !scanned_all {
            format!(" (searched the newest {SCAN} records)")
        } else {
            String::new()
        }
    );
    body.push_str(
        "<table id=\"records\"><thead><tr><th>record</th><th>state</th><th>age in state</th>\
<th>route</th><th>principal</th><th>key</th><th>attempt</th><th>repeats</th><th>created</th></tr></thead><tbody>",
    );
    for r in &shown {
        let _ = write!(
            body,
            "<tr data-record=\"{id}\" data-state=\"{state}\"><td><a class=\"mono\" href=\"/console/records/{id}\">{id}</a></td>\
<td>{badge}</td><td>{age}</td><td>{route}</td><td>{principal}</td><td class=\"mono key\">{key}</td>\
<td>{attempt}</td><td>{repeats}</td><td>{created}</td></tr>",
            id = esc(r.id.as_str()),
            state = r.state.as_str(),
            badge = state_badge(r.state.as_str()),
            age = age(r.updated_at.until(now)),
            route = esc(&r.route),
            principal = short_principal(&r.principal),
            key = esc(&truncate(&r.key, 40)),
            attempt = r.attempt,
            repeats = r.repeats,
            created = esc(&r.created_at.to_rfc3339()),
        );
    }
    body.push_str("</tbody></table>");
    if shown.is_empty() {
        body.push_str("<p class=\"empty\">No records match.</p>");
    }
    if page_no > 1 || more {
        let link = |n: usize| {
            format!(
                "/console/?key={}&principal={}&route={}&state={}&page={n}",
                url_enc(&q.key),
                url_enc(&q.principal),
                url_enc(&q.route),
                url_enc(&q.state)
            )
        };
        body.push_str("<nav class=\"pages\" id=\"pages\">");
        if page_no > 1 {
            let _ = write!(
                body,
                "<a href=\"{}\" rel=\"prev\">← newer</a> ",
                esc(&link(page_no - 1))
            );
        }
        let _ = write!(body, "page {page_no}");
        if more {
            let _ = write!(
                body,
                " <a href=\"{}\" rel=\"next\" id=\"next-page\">older →</a>",
                esc(&link(page_no + 1))
            );
        }
        body.push_str("</nav>");
    }
    let notice = q.done.as_deref().map(|d| match d {
        "purged" => "Expired records purged.".to_owned(),
        other => format!("Done: {other}."),
    });
    Ok(ok(
        "Records",
        Section::Records,
        &viewer,
        notice.as_deref(),
        &body,
    ))
}
