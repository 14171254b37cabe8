//! The operator console: server-rendered HTML under `/console/` on the admin listener,
//! for the person on call during an incident.
//!
//! | page | what it shows or does |
//! | --- | --- |
//! | `GET /console/` | records: search by key, principal, route, state; `outcome_unknown` first with its age; paging |
//! | `GET /console/records/ID` | one record: what the ledger has of its history, its answer, the actions |
//! | `GET/POST /console/records/ID/resolve` | resolve an `outcome_unknown` record: form, confirmation, done |
//! | `GET/POST /console/records/ID/reconcile` | ask the route's `reconcile` endpoint now (confirmation first) |
//! | `GET/POST /console/purge` | purge expired records (confirmation first) |
//! | `GET /console/usage` | fresh vs repeats per principal, with a chart over time |
//! | `GET /console/webhooks`, `GET/POST /console/webhooks/ID/redeliver` | dead letters, redeliver (confirmation first) |
//! | `GET /console/inflight` | records being executed now; its script refreshes `/console/inflight/fragment` every 2 s |
//! | `GET/POST /console/login`, `POST /console/logout` | the token, asked once |
//!
//! **Authentication.** The admin token, as the admin API takes it: an `Authorization:
//! Bearer` header on each request, or given once to the login form, which opens a session
//! kept in this process's memory and names it in a cookie (`HttpOnly`, `SameSite=Strict`,
//! `Path=/console`, `Secure` when the console was reached over HTTPS as a proxy in front
//! says with `X-Forwarded-Proto`). No token configured: 403, as the admin API.
//!
//! **CSRF.** Every POST made with the session cookie carries the session's own token in a
//! hidden field, and an `Origin` header, when the browser sends one, must be this host's;
//! otherwise 403. (A bearer header cannot be sent by another site's form.) Every action
//! asks for confirmation on a page of its own, and is logged (target `oncely::console`,
//! with the action, the record and `by = "console"`).
//!
//! Everything the pages need is in the binary (`assets/`, `include_str!`): no external
//! network, no build step.

mod html;
mod pages;
mod state;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Form, Router};
use oncely_store::Store;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::config::Config;
use html::{error_page, esc, html, page, Section};
use state::{Console, Viewer, SESSION_TTL};

/// The session cookie's name.
const COOKIE: &str = "oncely_console";
/// The largest form a console POST may send.
const MAX_FORM: usize = 1 << 20;

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// The console's routes, merged into the admin router: the ledger, the config, the admin
/// token and the webhook worker are the admin API's own.
pub(crate) fn router(
    store: Arc<dyn Store>,
    config: Arc<Config>,
    token: Option<String>,
    webhook_waker: Option<oncely_webhooks::Waker>,
) -> Router {
    let console = Console::new(store, config, token, webhook_waker);
    let guarded = Router::new()
        .route("/console/", get(pages::records::records))
        .route("/console/records/{id}", get(pages::record::record))
        .route(
            "/console/records/{id}/resolve",
            get(pages::resolve::resolve_form).post(pages::resolve::resolve),
        )
        .route(
            "/console/records/{id}/reconcile",
            get(pages::reconcile::reconcile_form).post(pages::reconcile::reconcile),
        )
        .route(
            "/console/purge",
            get(pages::purge::purge_form).post(pages::purge::purge),
        )
        .route("/console/usage", get(pages::usage::usage))
        .route("/console/webhooks", get(pages::webhooks::dead_letters))
        .route(
            "/console/webhooks/{id}/redeliver",
            get(pages::webhooks::redeliver_form).post(pages::webhooks::redeliver),
        )
        .route("/console/inflight", get(pages::inflight::in_flight))
        .route(
            "/console/inflight/fragment",
            get(pages::inflight::in_flight_fragment),
        )
        .route("/console/logout", axum::routing::post(logout))
        .route_layer(axum::middleware::from_fn_with_state(
            console.clone(),
            authenticate,
        ));
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route("/console/login", get(login_form).post(login))
        .route("/console/assets/console.css", get(css))
        .route("/console/assets/console.js", get(js))
        .merge(guarded)
        .layer(axum::middleware::map_response(protect))
        .with_state(console)
}

/// Headers on every console answer: nothing from elsewhere, no framing, no caching, no
/// referrer to other sites (record ids and principals are in the URLs). `same-origin`,
/// not `no-referrer`: under `no-referrer` a browser sends `Origin: null` with its form
/// posts, which the origin check refuses.
async fn protect(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    res
}

async fn css() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        CSS,
    )
        .into_response()
}

async fn js() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        JS,
    )
        .into_response()
}

fn closed(console: &Console) -> Response {
    error_page(
        StatusCode::FORBIDDEN,
        "Console closed",
        &format!(
            "The admin API and the console are closed: set {} to a token to open them.",
            console.config.admin_token_env
        ),
    )
}

fn cookie_value<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.trim())
}

fn token_matches(given: &str, token: &str) -> bool {
    bool::from(given.as_bytes().ct_eq(token.as_bytes()))
}

/// Whether the page was reached over HTTPS (a TLS-terminating proxy in front says so).
/// The admin listener itself speaks plain HTTP.
fn over_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
}

/// The `Origin` check: absent (older browsers, curl) passes; present, it must name this
/// host.
fn origin_ok(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let (Ok(origin), Some(host)) = (
        origin.to_str(),
        headers.get(header::HOST).and_then(|h| h.to_str().ok()),
    ) else {
        return false;
    };
    origin == format!("http://{host}") || origin == format!("https://{host}")
}

#[derive(Debug, Deserialize)]
struct CsrfField {
    #[serde(default)]
    csrf: String,
}

/// Lets a request in when it carries the token (bearer) or a live session; a session's
/// POST must also carry the session's CSRF token and a same-origin `Origin`.
async fn authenticate(State(console): State<Console>, req: Request, next: Next) -> Response {
    let Some(token) = console.token() else {
        return closed(&console);
    };
    if let Some(auth) = req.headers().get(header::AUTHORIZATION) {
        let given = auth
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        return match given {
            Some(g) if token_matches(g, token) => {
                let mut req = req;
                req.extensions_mut().insert(Viewer::Bearer);
                next.run(req).await
            }
            _ => {
                let mut res = error_page(
                    StatusCode::UNAUTHORIZED,
                    "Wrong token",
                    "The Authorization header does not carry the admin token.",
                );
                res.headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                res
            }
        };
    }
    let session = cookie_value(req.headers(), COOKIE)
        .and_then(|id| console.session(id).map(|csrf| (id.to_owned(), csrf)));
    let Some((id, csrf)) = session else {
        if req.method() == Method::GET {
            let target = req
                .uri()
                .path_and_query()
                .map_or("/console/", |p| p.as_str());
            return Redirect::to(&format!("/console/login?next={}", html::url_enc(target)))
                .into_response();
        }
        return error_page(
            StatusCode::UNAUTHORIZED,
            "Not logged in",
            "Log in to the console first.",
        );
    };
    let req = if req.method() == Method::POST {
        if !origin_ok(req.headers()) {
            tracing::warn!(target: "oncely::console", path = %req.uri().path(), "console POST from another origin refused");
            return error_page(
                StatusCode::FORBIDDEN,
                "Refused",
                "This form was sent from another site.",
            );
        }
        // Read the form to check its token, then hand the same bytes on.
        let (parts, body) = req.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM).await else {
            return error_page(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Too large",
                "The form is too large.",
            );
        };
        let probe = Request::from_parts(parts.clone(), Body::from(bytes.clone()));
        let given = Form::<CsrfField>::from_request(probe, &())
            .await
            .map(|f| f.0.csrf)
            .unwrap_or_default();
        if given.is_empty() || !token_matches(&given, &csrf) {
            tracing::warn!(target: "oncely::console", path = %parts.uri.path(), "console POST without a valid CSRF token refused");
            return error_page(
                StatusCode::FORBIDDEN,
                "Refused",
                "The form's CSRF token is missing or does not belong to this session: reload the page and try again.",
            );
        }
        Request::from_parts(parts, Body::from(bytes))
    } else {
        req
    };
    let mut req = req;
    req.extensions_mut().insert(Viewer::Session { id, csrf });
    next.run(req).await
}

#[derive(Debug, Deserialize, Default)]
struct LoginQuery {
    next: Option<String>,
}

/// Only console pages are places to go after logging in (and only what a `Location`
/// header can carry: no control characters).
fn safe_next(next: Option<&str>) -> &str {
    match next {
        Some(n)
            if n.starts_with("/console/")
                && !n.contains("//")
                && !n.contains('\\')
                && !n.contains(|c: char| c.is_control())
                && !n.starts_with("/console/login") =>
        {
            n
        }
        _ => "/console/",
    }
}

fn login_page(status: StatusCode, next: &str, error: Option<&str>) -> Response {
    let error = error
        .map(|e| format!("<p class=\"error\" id=\"login-error\">{}</p>", esc(e)))
        .unwrap_or_default();
    html(
        status,
        page(
            "Log in",
            Section::None,
            None,
            None,
            &format!(
                "{error}<form method=\"post\" action=\"/console/login\" class=\"login\">\
<label for=\"token\">Admin token</label>\
<input type=\"password\" id=\"token\" name=\"token\" autocomplete=\"current-password\" required autofocus>\
<input type=\"hidden\" name=\"next\" value=\"{}\">\
<button type=\"submit\" id=\"login\">Log in</button></form>\
<p class=\"hint\">The value of the variable the config's <code>admin_token_env</code> names. \
It is asked once: the session is kept in a cookie only this console can read.</p>",
                esc(next)
            ),
        ),
    )
}

async fn login_form(
    State(console): State<Console>,
    query: Result<axum::extract::Query<LoginQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if console.token().is_none() {
        return closed(&console);
    }
    let next = query.ok().and_then(|q| q.0.next);
    login_page(StatusCode::OK, safe_next(next.as_deref()), None)
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
    next: Option<String>,
}

async fn login(
    State(console): State<Console>,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, axum::extract::rejection::FormRejection>,
) -> Response {
    let Some(token) = console.token() else {
        return closed(&console);
    };
    if !origin_ok(&headers) {
        return error_page(
            StatusCode::FORBIDDEN,
            "Refused",
            "This form was sent from another site.",
        );
    }
    let Ok(Form(form)) = form else {
        return login_page(
            StatusCode::BAD_REQUEST,
            "/console/",
            Some("Give the admin token."),
        );
    };
    let next = safe_next(form.next.as_deref()).to_owned();
    if form.token.is_empty() || !token_matches(form.token.trim(), token) {
        tracing::warn!(target: "oncely::console", "console login with a wrong token refused");
        return login_page(
            StatusCode::UNAUTHORIZED,
            &next,
            Some("That is not the admin token."),
        );
    }
    let (id, _) = console.open_session();
    let secure = if over_https(&headers) { "; Secure" } else { "" };
    let cookie = format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/console; Max-Age={}{secure}",
        SESSION_TTL.as_secs()
    );
    tracing::info!(target: "oncely::console", by = "console", "console session opened");
    let mut res = Redirect::to(&next).into_response();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).expect("a valid cookie"),
    );
    res
}

async fn logout(State(console): State<Console>, viewer: axum::Extension<Viewer>) -> Response {
    if let Viewer::Session { id, .. } = &viewer.0 {
        console.close_session(id);
    }
    let mut res = Redirect::to("/console/login").into_response();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "oncely_console=; HttpOnly; SameSite=Strict; Path=/console; Max-Age=0",
        ),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_console_pages_are_places_to_go_after_login() {
        assert_eq!(
            safe_next(Some("/console/records/rec_1")),
            "/console/records/rec_1"
        );
        assert_eq!(safe_next(Some("https://evil.example/")), "/console/");
        assert_eq!(safe_next(Some("/console//evil.example")), "/console/");
        assert_eq!(safe_next(Some("/console/login?next=x")), "/console/");
        assert_eq!(safe_next(Some("/console/\nX")), "/console/");
        assert_eq!(safe_next(None), "/console/");
    }

    #[test]
    fn the_origin_must_be_this_host_when_given() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:9090"));
        assert!(origin_ok(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:9090"),
        );
        assert!(origin_ok(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(!origin_ok(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(!origin_ok(&h));
    }

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; oncely_console=abc ; b=2"),
        );
        assert_eq!(cookie_value(&h, COOKIE), Some("abc"));
        assert_eq!(cookie_value(&h, "c"), None);
    }
}
