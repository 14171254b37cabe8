//! `GET/POST /console/records/ID/resolve`: resolving an `outcome_unknown` record by
//! hand, as `oncely ledger resolve` and the admin API do: the form, the confirmation,
//! then the resolution.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use oncely_core::{Record, Resolution, State as RecordState};
use serde::Deserialize;

use super::super::html::{csrf_field, esc, html, page, state_badge, url_enc, Section};
use super::super::state::{Console, Viewer};
use super::shared::{get_record, not_unknown, ok, store_error, PageResult};
use crate::operations::Verdict;

/// What the resolve form posts (and the confirmation page posts again with `confirmed`).
#[derive(Debug, Deserialize, Default, Clone)]
pub(crate) struct ResolveForm {
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
pub(crate) async fn resolve_form(
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
pub(crate) async fn resolve(
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
