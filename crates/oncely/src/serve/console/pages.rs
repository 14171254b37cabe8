//! The console's pages and actions. Each reads the ledger through the `Store` trait, as
//! the admin API does; each action first shows a confirmation page (a form that posts
//! `confirmed=1`), then acts, logs (target `oncely::console`, `by = "console"`) and sends
//! the browser to the page that shows the result.

use std::fmt::Write as _;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use oncely_core::{Record, RecordId, Resolution, State as RecordState};
use oncely_store::{ListFilter, RepeatKind, StoreError};
use serde::Deserialize;
use tower::ServiceExt;

use super::html::{
    self, age, chart, csrf_field, error_page, esc, html, page, short_principal, state_badge,
    time_ago, url_enc, Section,
};
use super::state::{Console, Viewer};
use crate::config::Route;
use crate::operations::Verdict;
use crate::serve::reconcile::{reconcile_once, Reconciled};

/// Records per page.
const PAGE: usize = 50;
/// The newest records a search by key or path looks through.
const SCAN: usize = 5_000;
/// The most `outcome_unknown` records the list shows.
const MAX_UNKNOWN: usize = 1_000;
/// The newest executions per principal the usage chart reads.
const CHART_RECORDS: usize = 1_000;
/// Repeat events read for one record's history or one principal's chart.
const EVENTS: usize = 10_000;
/// The most of a stored body a record page shows.
const BODY_PREVIEW: usize = 4096;

type PageResult = Result<Response, Response>;

fn store_error(e: StoreError) -> Response {
    match e {
        StoreError::NotFound(id) => error_page(
            StatusCode::NOT_FOUND,
            "Not found",
            &format!("No ledger record {id}."),
        ),
        StoreError::Transition(t) => {
            error_page(StatusCode::CONFLICT, "Not possible now", &t.to_string())
        }
        other => {
            tracing::warn!(target: "oncely::console", error = %other, "console: store failure");
            error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Ledger unavailable",
                "The ledger cannot be reached; nothing was changed.",
            )
        }
    }
}

fn ok(
    title: &str,
    section: Section,
    viewer: &Viewer,
    notice: Option<&str>,
    body: &str,
) -> Response {
    html(
        StatusCode::OK,
        page(title, section, Some(viewer), notice, body),
    )
}

async fn get_record(console: &Console, id: &str) -> Result<Record, Response> {
    let id = RecordId(id.to_owned());
    match console.store.get(&id).await {
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(store_error(StoreError::NotFound(id))),
        Err(e) => Err(store_error(e)),
    }
}

/// The records list's query.
#[derive(Debug, Deserialize, Default)]
pub(super) struct RecordsQuery {
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
pub(super) async fn records(
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

/// The text of a body's first bytes, a character the cut went through left out; an
/// error when they are not text.
fn preview(bytes: &[u8]) -> Result<&str, std::str::Utf8Error> {
    match std::str::from_utf8(bytes) {
        // Invalid only in a last character cut short (at most 3 bytes of it).
        Err(e) if e.error_len().is_none() && bytes.len() - e.valid_up_to() < 4 => {
            std::str::from_utf8(&bytes[..e.valid_up_to()])
        }
        other => other,
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(n).collect();
        t.push('…');
        t
    }
}

#[derive(Debug, Deserialize, Default)]
pub(super) struct DoneQuery {
    done: Option<String>,
}

/// `GET /console/records/ID`: one record, with what the ledger keeps of its history.
pub(super) async fn record(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
    Query(q): Query<DoneQuery>,
) -> PageResult {
    let store = &console.store;
    let r = get_record(&console, &id).await?;
    let now = store.now().await.map_err(store_error)?;
    let route = console.config.route_named(&r.route);
    let schedule = if r.state == RecordState::OutcomeUnknown {
        store.reconcile_schedule(&r.id).await.ok().flatten()
    } else {
        None
    };
    // Joined and replayed, from the repeat events kept for statements.
    // (None of them is older than the record.)
    let events = store
        .repeat_events(&r.principal, Some(r.created_at), EVENTS)
        .await;
    let (joined, replayed, last_repeat, cut) = match &events {
        Ok(ev) => {
            let mine: Vec<_> = ev.listed.iter().filter(|e| e.record == r.id).collect();
            let count = |kind| mine.iter().filter(|e| e.kind == kind).count();
            (
                Some(count(RepeatKind::Joined)),
                Some(count(RepeatKind::Replayed)),
                mine.iter().map(|e| e.at).max(),
                (ev.listed.len() as u64) < ev.total,
            )
        }
        Err(_) => (None, None, None, false),
    };

    let mut body = String::new();
    let _ = write!(
        body,
        "<p id=\"record-state\">{} on <strong>{}</strong> · class {} · {} in this state</p>",
        state_badge(r.state.as_str()),
        esc(&r.route),
        r.class.as_str(),
        age(r.updated_at.until(now)),
    );
    // Actions.
    if r.state == RecordState::OutcomeUnknown {
        body.push_str("<div class=\"actions\" id=\"actions\">");
        let _ = write!(
            body,
            "<a class=\"button\" id=\"resolve\" href=\"/console/records/{0}/resolve\">Resolve…</a>",
            esc(r.id.as_str())
        );
        if route.is_some_and(|rt| rt.reconcile.is_some()) {
            let _ = write!(
                body,
                " <a class=\"button\" id=\"reconcile\" href=\"/console/records/{0}/reconcile\">Reconcile now…</a>",
                esc(r.id.as_str())
            );
        } else {
            body.push_str(" <span class=\"hint\">(its route has no <code>reconcile</code>: resolve by hand)</span>");
        }
        body.push_str("</div>");
    }

    // History: what the ledger has.
    body.push_str("<h2>History</h2><table class=\"history\" id=\"history\"><tbody>");
    let mut row = |what: &str, value: String| {
        let _ = write!(body, "<tr><th>{}</th><td>{value}</td></tr>", esc(what));
    };
    row("claimed", time_ago(Some(r.created_at), now));
    row(
        "attempts",
        if r.attempt > 1 {
            format!(
                "{} (executed {} times: {} re-execution{} after a release or a take-over of a lapsed lease)",
                r.attempt,
                r.attempt,
                r.attempt - 1,
                if r.attempt == 2 { "" } else { "s" }
            )
        } else {
            r.attempt.to_string()
        },
    );
    if r.state == RecordState::Processing {
        row(
            "owner",
            format!(
                "<span class=\"mono\">{}</span>, lease until {}",
                esc(r.owner.as_deref().unwrap_or("-")),
                time_ago(r.lease_until, now)
            ),
        );
    }
    row("last change", time_ago(Some(r.updated_at), now));
    if let Some(t) = r.completed_at {
        row(
            "completed",
            format!(
                "{} with status {}",
                time_ago(Some(t), now),
                r.response
                    .as_ref()
                    .map_or("-".into(), |s| s.status.to_string())
            ),
        );
    }
    row(
        "reason",
        r.last_error.as_deref().map_or("-".to_owned(), |e| {
            format!("<span id=\"reason\">{}</span>", esc(e))
        }),
    );
    if r.state == RecordState::OutcomeUnknown {
        row(
            "reconcile attempts",
            match (schedule, route.and_then(|rt| rt.reconcile.as_ref())) {
                (_, None) => "none: the route has no <code>reconcile</code>".to_owned(),
                (Some(s), Some(_)) => format!(
                    "{} so far; next {}",
                    s.attempts,
                    s.next_at
                        .map_or("at the route's reconcile_after".to_owned(), |t| time_ago(
                            Some(t),
                            now
                        ))
                ),
                (None, Some(_)) => "not kept by this store".to_owned(),
            },
        );
    }
    row(
        "repeats",
        format!(
            "{} answered from this record ({} units not charged){}",
            r.repeats,
            r.repeat_units,
            match (joined, replayed) {
                (Some(j), Some(p)) => format!(
                    ": {j} joined, {p} replayed{}{}",
                    last_repeat.map_or(String::new(), |t| format!(
                        ", the last {}",
                        time_ago(Some(t), now)
                    )),
                    if cut {
                        format!(" (among the principal's first {EVENTS} repeats since the claim)")
                    } else {
                        String::new()
                    }
                ),
                _ => String::new(),
            }
        ),
    );
    row("expires", time_ago(r.expires_at, now));
    body.push_str("</tbody></table>");
    body.push_str(
        "<p class=\"hint\">The ledger keeps a record's current state, its attempt counter, the \
reason of its last change, its repeat events (while its window lasts) and, while it is \
outcome_unknown, its reconciliation schedule. It keeps no time for each attempt or take-over; \
the log lines do.</p>",
    );

    body.push_str("<h2>Record</h2><table class=\"fields\"><tbody>");
    for (name, value) in [
        ("id", r.id.as_str().to_owned()),
        ("key", r.key.clone()),
        ("principal", r.principal.clone()),
        ("scope", r.scope.as_str().to_owned()),
        ("fingerprint", r.fingerprint.to_hex()),
        ("units", r.units.to_string()),
        (
            "workflow_id",
            r.workflow_id.clone().unwrap_or_else(|| "-".into()),
        ),
        (
            "provider_request_id",
            r.provider_request_id.clone().unwrap_or_else(|| "-".into()),
        ),
    ] {
        let _ = write!(
            body,
            "<tr><th>{name}</th><td class=\"mono\" id=\"f-{name}\">{}</td></tr>",
            esc(&value)
        );
    }
    body.push_str("</tbody></table>");
    if let Some(resp) = &r.response {
        let _ = write!(
            body,
            "<h2>Stored answer</h2><p>status {}</p><pre class=\"headers\">",
            resp.status
        );
        for (n, v) in &resp.headers {
            let _ = writeln!(body, "{}: {}", esc(n), esc(v));
        }
        body.push_str("</pre>");
        match &resp.body {
            None => body.push_str(
                "<p class=\"hint\">The body was not kept (larger than max_response).</p>",
            ),
            Some(b) => match preview(&b[..b.len().min(BODY_PREVIEW)]) {
                Ok(text) => {
                    let _ = write!(
                        body,
                        "<pre class=\"body\" id=\"answer-body\">{}</pre>{}",
                        esc(text),
                        if b.len() > BODY_PREVIEW {
                            format!(
                                "<p class=\"hint\">first {BODY_PREVIEW} of {} bytes</p>",
                                b.len()
                            )
                        } else {
                            String::new()
                        }
                    );
                }
                Err(_) => {
                    let _ = write!(
                        body,
                        "<p class=\"hint\">{} bytes of binary data</p>",
                        b.len()
                    );
                }
            },
        }
    }
    let notice = q.done.as_deref().map(|d| format!("Done: {d}."));
    Ok(ok(
        &format!("Record {}", r.id),
        Section::Records,
        &viewer,
        notice.as_deref(),
        &body,
    ))
}

/// What the resolve form posts (and the confirmation page posts again with `confirmed`).
#[derive(Debug, Deserialize, Default, Clone)]
pub(super) struct ResolveForm {
    #[serde(default)]
    verdict: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    headers: String,
    #[serde(default)]
    body: String,
    #[serde(default)]
    confirmed: String,
}

fn resolve_form_page(
    viewer: &Viewer,
    r: &Record,
    f: &ResolveForm,
    error: Option<&str>,
) -> Response {
    let checked = |v: &str| if f.verdict == v { " checked" } else { "" };
    let body = format!(
        "{error}<p>Record <a class=\"mono\" href=\"/console/records/{id}\">{id}</a> on {route} is \
{badge}: nobody knows whether its action happened. Say what happened, as you found out from the \
upstream. Duplicates then get the answer you give (completed), or execute again (released).</p>\
<form method=\"post\" action=\"/console/records/{id}/resolve\" class=\"resolve\" id=\"resolve-form\">{csrf}\
<fieldset><legend>Verdict</legend>\
<label><input type=\"radio\" name=\"verdict\" value=\"completed\" id=\"v-completed\"{c}> completed: it happened, with this answer</label>\
<label><input type=\"radio\" name=\"verdict\" value=\"released\" id=\"v-released\"{rel}> released: it did not happen; the next request executes</label>\
</fieldset>\
<label>Status (completed) <input name=\"status\" id=\"r-status\" inputmode=\"numeric\" value=\"{status}\" placeholder=\"200\"></label>\
<label><span>Headers (completed), one <code>Name: value</code> a line</span> <textarea name=\"headers\" id=\"r-headers\" rows=\"3\">{headers}</textarea></label>\
<label>Body (completed) <textarea name=\"body\" id=\"r-body\" rows=\"5\">{bodytext}</textarea></label>\
<button type=\"submit\" id=\"r-next\">Review…</button> <a href=\"/console/records/{id}\">cancel</a></form>",
        error = error
            .map(|e| format!("<p class=\"error\" id=\"form-error\">{}</p>", esc(e)))
            .unwrap_or_default(),
        id = esc(r.id.as_str()),
        route = esc(&r.route),
        badge = state_badge(r.state.as_str()),
        csrf = csrf_field(viewer),
        c = checked("completed"),
        rel = checked("released"),
        status = esc(&f.status),
        headers = esc(&f.headers),
        bodytext = esc(&f.body),
    );
    html(
        if error.is_some() {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::OK
        },
        page(
            &format!("Resolve {}", r.id),
            Section::Records,
            Some(viewer),
            None,
            &body,
        ),
    )
}

/// `GET /console/records/ID/resolve`: the form.
pub(super) async fn resolve_form(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
) -> PageResult {
    let r = get_record(&console, &id).await?;
    if r.state != RecordState::OutcomeUnknown {
        return Err(not_unknown(&r));
    }
    Ok(resolve_form_page(
        &viewer,
        &r,
        &ResolveForm::default(),
        None,
    ))
}

fn not_unknown(r: &Record) -> Response {
    error_page(
        StatusCode::CONFLICT,
        "Nothing to resolve",
        &format!(
            "Record {} is {}, not outcome_unknown: only an outcome_unknown record is resolved.",
            r.id, r.state
        ),
    )
}

/// The resolution a form describes ([`crate::operations::resolution`], as for the CLI
/// and the admin API).
fn resolution(f: &ResolveForm, window: Duration) -> Result<Resolution, String> {
    let verdict = match f.verdict.as_str() {
        "released" => Verdict::Released,
        "completed" => {
            let status: u16 = f
                .status
                .trim()
                .parse()
                .ok()
                .filter(|s| (100..=599).contains(s))
                .ok_or("completed needs a status from 100 to 599")?;
            let headers = f
                .headers
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(crate::operations::header_line)
                .collect::<Result<Vec<_>, _>>()?;
            // A browser's textarea sends CRLF line ends: store what the operator typed.
            let body = f.body.replace("\r\n", "\n").into_bytes();
            Verdict::Completed {
                status,
                headers,
                body,
            }
        }
        _ => return Err("choose completed or released".into()),
    };
    crate::operations::resolution(verdict, window, "console")
}

/// `POST /console/records/ID/resolve`: without `confirmed`, the confirmation page; with
/// it, the resolution.
pub(super) async fn resolve(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
    Form(f): Form<ResolveForm>,
) -> PageResult {
    let r = get_record(&console, &id).await?;
    if r.state != RecordState::OutcomeUnknown {
        return Err(not_unknown(&r));
    }
    let window = crate::operations::window_for(Some(&console.config), &r.route);
    let resolution = match resolution(&f, window) {
        Ok(res) => res,
        Err(e) => return Ok(resolve_form_page(&viewer, &r, &f, Some(&e))),
    };
    if f.confirmed != "1" {
        let what = match &resolution {
            Resolution::Released { .. } => "<strong>released</strong>: the next identical request executes again".to_owned(),
            Resolution::Completed { response, .. } => format!(
                "<strong>completed</strong> with status <strong>{}</strong>, {} header{}, a body of {} bytes: duplicates get this answer for {}",
                response.status,
                response.headers.len(),
                if response.headers.len() == 1 { "" } else { "s" },
                response.body.as_ref().map_or(0, |b| b.len()),
                esc(&oncely_core::units::format_duration(window)),
            ),
        };
        let hidden = |name: &str, value: &str| {
            format!(
                "<input type=\"hidden\" name=\"{name}\" value=\"{}\">",
                esc(value)
            )
        };
        let body = format!(
            "<p id=\"confirm-text\">Record <span class=\"mono\">{id}</span> will go from {badge} to {what}. \
This cannot be undone.</p>\
<form method=\"post\" action=\"/console/records/{id}/resolve\" id=\"confirm-form\">{csrf}{v}{s}{h}{b}{c}\
<button type=\"submit\" id=\"confirm\" class=\"danger\">Resolve</button> \
<a href=\"/console/records/{id}\" id=\"cancel\">cancel</a></form>",
            id = esc(r.id.as_str()),
            badge = state_badge(r.state.as_str()),
            csrf = csrf_field(&viewer),
            v = hidden("verdict", &f.verdict),
            s = hidden("status", &f.status),
            h = hidden("headers", &f.headers),
            b = hidden("body", &f.body),
            c = hidden("confirmed", "1"),
        );
        return Ok(ok(
            "Confirm the resolution",
            Section::Records,
            &viewer,
            None,
            &body,
        ));
    }
    let after = console
        .store
        .resolve(&r.id, resolution)
        .await
        .map_err(store_error)?;
    tracing::info!(
        target: "oncely::console",
        action = "resolve",
        record = %after.id,
        route = %after.route,
        to = %after.state,
        by = "console",
        "console action"
    );
    Ok(Redirect::to(&format!(
        "/console/records/{}?done={}",
        url_enc(after.id.as_str()),
        url_enc(&format!("resolved as {}", after.state))
    ))
    .into_response())
}

/// A confirmation page: what will happen, and the one button that does it.
fn confirm_page(
    viewer: &Viewer,
    title: &str,
    text: &str,
    action: &str,
    button: &str,
    back: &str,
) -> Response {
    ok(
        title,
        Section::None,
        viewer,
        None,
        &format!(
            "<p id=\"confirm-text\">{text}</p><form method=\"post\" action=\"{action}\" id=\"confirm-form\">{}\
<input type=\"hidden\" name=\"confirmed\" value=\"1\">\
<button type=\"submit\" id=\"confirm\" class=\"danger\">{}</button> <a href=\"{back}\" id=\"cancel\">cancel</a></form>",
            csrf_field(viewer),
            esc(button)
        ),
    )
}

#[derive(Debug, Deserialize, Default)]
pub(super) struct Confirmed {
    #[serde(default)]
    confirmed: String,
}

/// `GET /console/records/ID/reconcile`: the confirmation.
pub(super) async fn reconcile_form(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
) -> PageResult {
    let r = get_record(&console, &id).await?;
    let route = reconcilable(&console, &r).map_err(|e| *e)?;
    let spec = route.reconcile.as_ref().expect("checked");
    let id = esc(r.id.as_str());
    Ok(confirm_page(
        &viewer,
        "Reconcile now",
        &format!(
            "Ask the upstream now whether the action of record <span class=\"mono\">{id}</span> happened: \
<code>{} {}</code> with <code>{{key}}</code> = the downstream key. 2xx completes the record with that answer, \
404 releases it, anything else leaves it outcome_unknown.",
            esc(spec.method.as_str()),
            esc(&spec.target_for("{key}")),
        ),
        &format!("/console/records/{id}/reconcile"),
        "Reconcile now",
        &format!("/console/records/{id}"),
    ))
}

fn reconcilable<'a>(console: &'a Console, r: &Record) -> Result<&'a Route, Box<Response>> {
    if r.state != RecordState::OutcomeUnknown {
        return Err(Box::new(not_unknown(r)));
    }
    match console.config.route_named(&r.route) {
        Some(route) if route.reconcile.is_some() && route.upstream.is_some() => Ok(route),
        _ => Err(Box::new(error_page(
            StatusCode::CONFLICT,
            "Cannot reconcile",
            &format!("Route {:?} has no reconcile endpoint (or no upstream) in this config: resolve the record by hand.", r.route),
        ))),
    }
}

/// `POST /console/records/ID/reconcile`: asks once, as `oncely ledger reconcile` does.
pub(super) async fn reconcile(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
    Form(c): Form<Confirmed>,
) -> PageResult {
    if c.confirmed != "1" {
        return reconcile_form(State(console), Extension(viewer), Path(id)).await;
    }
    let r = get_record(&console, &id).await?;
    let route = reconcilable(&console, &r).map_err(|e| *e)?;
    let client = crate::serve::proxy::UpstreamClient::new(console.config.upstream_ca.as_deref())
        .map_err(|e| {
            error_page(
                StatusCode::SERVICE_UNAVAILABLE,
                "Cannot reconcile",
                &format!("{e:#}"),
            )
        })?;
    let attempt = match console.store.reconcile_schedule(&r.id).await {
        Ok(Some(s)) => s.attempts + 1,
        _ => 1,
    };
    let outcome = reconcile_once(&*console.store, &client, route, &r, attempt).await;
    let done = match &outcome {
        Reconciled::Completed(a) | Reconciled::Released(a) => {
            format!("reconciled: now {}", a.state)
        }
        Reconciled::Unknown(why) => format!("reconciled: still outcome_unknown ({why})"),
        Reconciled::Error(why) => format!("reconciliation failed ({why})"),
    };
    tracing::info!(
        target: "oncely::console",
        action = "reconcile",
        record = %r.id,
        route = %r.route,
        result = outcome.label(),
        by = "console",
        "console action"
    );
    Ok(Redirect::to(&format!(
        "/console/records/{}?done={}",
        url_enc(r.id.as_str()),
        url_enc(&done)
    ))
    .into_response())
}

/// `GET /console/purge`: the confirmation.
pub(super) async fn purge_form(Extension(viewer): Extension<Viewer>) -> Response {
    confirm_page(
        &viewer,
        "Purge expired records",
        "Delete every completed and released record whose window has ended (as <code>oncely ledger purge --expired</code>; the server also does this every minute). Records in processing or outcome_unknown are never purged.",
        "/console/purge",
        "Purge",
        "/console/",
    )
}

/// `POST /console/purge`.
pub(super) async fn purge(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Form(c): Form<Confirmed>,
) -> PageResult {
    if c.confirmed != "1" {
        return Ok(purge_form(Extension(viewer)).await);
    }
    let n = console.store.purge_expired().await.map_err(store_error)?;
    tracing::info!(target: "oncely::console", action = "purge", purged = n, by = "console", "console action");
    Ok(Redirect::to(&format!(
        "/console/?done={}",
        url_enc(&format!("purged {n} expired records"))
    ))
    .into_response())
}

#[derive(Debug, Deserialize, Default)]
pub(super) struct UsageQuery {
    #[serde(default)]
    since: String,
    #[serde(default)]
    principal: String,
}

/// `GET /console/usage`: per principal, executions charged and repeats not charged, with
/// a chart of both over the period (for one principal, or the top 20 together).
pub(super) async fn usage(
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

/// `GET /console/webhooks`: the dead-lettered deliveries.
pub(super) async fn dead_letters(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Query(q): Query<DoneQuery>,
) -> PageResult {
    let dead = oncely_webhooks::list_dead(console.store.as_ref())
        .await
        .map_err(store_error)?;
    let mut body = String::new();
    if dead.is_empty() {
        body.push_str("<p class=\"empty\" id=\"no-dead\">No dead-lettered webhook deliveries.</p>");
    } else {
        body.push_str(
            "<table id=\"dead\"><thead><tr><th>delivery</th><th>event</th><th>to</th><th>attempts</th>\
<th>dead since</th><th>last error</th><th></th></tr></thead><tbody>",
        );
        for d in &dead {
            let _ = write!(
                body,
                "<tr data-delivery=\"{id}\"><td class=\"mono\">{id}</td><td class=\"mono\">{}</td><td>{}</td><td>{}/{}</td>\
<td>{}</td><td>{}</td><td><a class=\"button redeliver\" href=\"/console/webhooks/{id}/redeliver\">Redeliver…</a></td></tr>",
                esc(&d.event_id),
                esc(&d.deliver_to),
                d.attempts,
                d.max_attempts,
                esc(&d.updated_at),
                esc(d.last_error.as_deref().unwrap_or("-")),
                id = esc(&d.id),
            );
        }
        body.push_str("</tbody></table>");
    }
    let notice = q.done.as_deref().map(|d| format!("Done: {d}."));
    Ok(ok(
        "Webhook dead letters",
        Section::Webhooks,
        &viewer,
        notice.as_deref(),
        &body,
    ))
}

/// `GET /console/webhooks/ID/redeliver`: the confirmation.
pub(super) async fn redeliver_form(
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
) -> Response {
    // The id comes from the link's path: one encoded segment in the form's action, so
    // that `..`, `/`, `?` or `#` in it cannot point the form at another action.
    let action = format!("/console/webhooks/{}/redeliver", esc(&url_enc(&id)));
    let id = esc(&id);
    confirm_page(
        &viewer,
        "Redeliver",
        &format!("Queue the dead delivery <span class=\"mono\">{id}</span> again: its attempts start over, and the handler gets the same event under the same Idempotency-Key."),
        &action,
        "Redeliver",
        "/console/webhooks",
    )
}

/// `POST /console/webhooks/ID/redeliver`: through the admin API's own route, which also
/// wakes this process's delivery worker.
pub(super) async fn redeliver(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
    Form(c): Form<Confirmed>,
) -> PageResult {
    if c.confirmed != "1" {
        return Ok(redeliver_form(Extension(viewer), Path(id)).await);
    }
    let req = Request::post(format!("/webhooks/dead/{}/redeliver", url_enc(&id)))
        .body(Body::empty())
        .expect("a valid request");
    let res = console
        .webhooks
        .clone()
        .oneshot(req)
        .await
        .unwrap_or_else(|e| match e {});
    let status = res.status();
    if !status.is_success() {
        let detail = axum::body::to_bytes(res.into_body(), 64 * 1024)
            .await
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["detail"].as_str().map(str::to_owned))
            .unwrap_or_else(|| "the delivery cannot be redelivered".into());
        return Err(error_page(status, "Not redelivered", &detail));
    }
    tracing::info!(target: "oncely::console", action = "redeliver", delivery = %id, by = "console", "console action");
    Ok(Redirect::to(&format!(
        "/console/webhooks?done={}",
        url_enc(&format!("{id} queued again"))
    ))
    .into_response())
}

/// `GET /console/inflight`: the page; its script refreshes the fragment every 2 s.
pub(super) async fn in_flight(
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
pub(super) async fn in_flight_fragment(State(console): State<Console>) -> PageResult {
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
