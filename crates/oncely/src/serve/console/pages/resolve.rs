//! `GET/POST /console/records/ID/resolve`: resolving an `outcome_unknown` record by
//! hand, as `oncely ledger resolve` and the admin API do: the form, the confirmation,
//! then the resolution.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use oncely_core::{Record, Resolution};
use serde::Deserialize;

use super::super::html::{csrf_field, esc, html, page, state_badge, url_enc, Section};
use super::super::state::{Console, Viewer};
use super::shared::{ok, op_error, PageResult};
use crate::operations::{self, OpError, Verdict, Via};

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
    let r = operations::unknown_record(&*console.store, &id, "resolve")
        .await
        .map_err(op_error)?;
    Ok(resolve_form_page(
        &viewer,
        &r,
        &ResolveForm::default(),
        None,
    ))
}

/// The verdict a form describes; its status and headers are checked by
/// [`crate::operations`], as for the CLI and the admin API.
fn verdict(f: &ResolveForm) -> Result<Verdict, String> {
    Ok(match f.verdict.as_str() {
        "released" => Verdict::Released,
        "completed" => {
            let status: u16 = f
                .status
                .trim()
                .parse()
                .map_err(|_| "completed needs a status from 100 to 599")?;
            let headers = f
                .headers
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(operations::header_line)
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
    })
}

/// `POST /console/records/ID/resolve`: without `confirmed`, the confirmation page; with
/// it, the resolution.
pub(crate) async fn resolve(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
    Form(f): Form<ResolveForm>,
) -> PageResult {
    let config = Some(&*console.config);
    let v = match verdict(&f) {
        Ok(v) => v,
        Err(e) => return invalid(&console, &viewer, &id, &f, e).await,
    };
    if f.confirmed != "1" {
        let (r, resolution) = match operations::plan_resolution(
            &*console.store,
            config,
            &id,
            v,
            Via::Console,
        )
        .await
        {
            Ok(planned) => planned,
            Err(OpError::Invalid(e)) => return invalid(&console, &viewer, &id, &f, e).await,
            Err(e) => return Err(op_error(e)),
        };
        let window = match &resolution {
            Resolution::Released { window, .. } | Resolution::Completed { window, .. } => *window,
        };
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
    let after = match operations::resolve(&*console.store, config, &id, v, Via::Console).await {
        Ok(after) => after,
        Err(OpError::Invalid(e)) => return invalid(&console, &viewer, &id, &f, e).await,
        Err(e) => return Err(op_error(e)),
    };
    Ok(Redirect::to(&format!(
        "/console/records/{}?done={}",
        url_enc(after.id.as_str()),
        url_enc(&format!("resolved as {}", after.state))
    ))
    .into_response())
}

/// The form again with what was wrong in it, for a record that is still
/// `outcome_unknown` (else the page that says it is not).
async fn invalid(
    console: &Console,
    viewer: &Viewer,
    id: &str,
    f: &ResolveForm,
    error: String,
) -> PageResult {
    let r = operations::unknown_record(&*console.store, id, "resolve")
        .await
        .map_err(op_error)?;
    Ok(resolve_form_page(viewer, &r, f, Some(&error)))
}
