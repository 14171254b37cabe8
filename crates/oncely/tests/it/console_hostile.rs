//! The console and the admin API against a hostile or careless party, through the real
//! binary: links made by someone else that an operator follows, values from outside on
//! the pages, path spellings, stale cookies, and the token check of every admin route.

use crate::common::{get, upstream, Gateway};
use crate::console::TOKEN;

async fn gateway() -> Gateway {
    let up = upstream(axum::Router::new().fallback(|| async { "ok" })).await;
    Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", "memory:"],
        &[("ONCELY_ADMIN_TOKEN", TOKEN)],
    )
}

/// The `action` of the page's one form.
fn form_action(html: &str) -> String {
    let at = html
        .find("<form method=\"post\" action=\"")
        .expect("a form")
        + 28;
    let rest = &html[at..];
    rest[..rest.find('"').unwrap()].to_owned()
}

/// A dead-letter id taken from a link's path must not steer the confirmation's form to
/// another action: `/console/webhooks/..%2Fpurge%3F/redeliver` once asked "Redeliver?"
/// and posted to `/console/purge`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redeliver_confirmation_posts_only_to_its_own_delivery() {
    let gw = gateway().await;
    let auth = format!("Bearer {TOKEN}");
    for id in [
        "..%2Fpurge%3F",
        "..%2F..%2Fconsole%2Fpurge%23",
        "%2E%2E%2Frecords%2Frec_1%2Freconcile%3F",
    ] {
        let res = get(
            &gw.admin_url(&format!("/console/webhooks/{id}/redeliver")),
            &[("authorization", &auth)],
        )
        .await;
        assert_eq!(res.status, 200, "{}", res.text());
        let action = form_action(&res.text());
        // A browser resolves `..`, cuts at `?` and `#`: the id must reach it as one
        // opaque segment.
        let id_seg = action
            .strip_prefix("/console/webhooks/")
            .and_then(|a| a.strip_suffix("/redeliver"))
            .unwrap_or_else(|| panic!("{id}: the form posts to {action}"));
        assert!(
            !id_seg.contains(['/', '?', '#', '&']) && id_seg != ".." && id_seg != ".",
            "{id}: the form posts to {action}"
        );
    }
}

/// A login link whose `next` holds a control character: the login succeeds and lands on
/// the console, not on a 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_with_a_control_character_in_next_lands_on_the_console() {
    let gw = gateway().await;
    for next in ["%2Fconsole%2F%0AX", "%2Fconsole%2F%01", "%2Fconsole%2F%7F"] {
        let res = crate::common::post(
            &gw.admin_url("/console/login"),
            &format!("token={TOKEN}&next={next}"),
            &[("content-type", "application/x-www-form-urlencoded")],
        )
        .await;
        assert_eq!(res.status, 303, "{next}: {}", res.text());
        assert_eq!(res.header("location"), "/console/", "{next}");
    }
}

async fn login(gw: &Gateway) -> String {
    let ok = crate::common::post(
        &gw.admin_url("/console/login"),
        &format!("token={TOKEN}"),
        &[("content-type", "application/x-www-form-urlencoded")],
    )
    .await;
    assert_eq!(ok.status, 303, "{}", ok.text());
    ok.header("set-cookie")
        .split(';')
        .next()
        .unwrap()
        .trim()
        .to_owned()
}

/// What a console session grants: the console, and nothing of the admin API (which takes
/// only the bearer header); no path spelling, method or stale cookie gets round the check;
/// pages with data are neither cached nor framed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_session_grants_nothing_else_and_no_path_spelling_gets_round_it() {
    let gw = gateway().await;
    let cookie = login(&gw).await;
    let with_cookie = [("cookie", cookie.as_str())];
    for path in [
        "/records",
        "/records/rec_1",
        "/usage",
        "/openapi.json",
        "/webhooks/dead",
    ] {
        let res = get(&gw.admin_url(path), &with_cookie).await;
        assert_eq!(res.status, 401, "{path} with the console's cookie");
    }
    // Spellings that a path-normalising proxy might send on: never a page without a
    // session.
    for path in [
        "/console//",
        "/console/../records",
        "/console/%2e%2e/records",
        "/console/records/..%2F..%2Frecords",
        "/console/%2F",
        "/Console/",
        "/console/assets/../records",
    ] {
        let res = get(&gw.admin_url(path), &[]).await;
        assert!(
            matches!(res.status.as_u16(), 303 | 401 | 404),
            "{path}: {} {}",
            res.status,
            res.text()
        );
        assert!(!res.text().contains("id=\"records\""), "{path}");
    }
    for method in ["HEAD", "OPTIONS", "PUT", "DELETE"] {
        let req = http::Request::builder()
            .method(method)
            .uri(gw.admin_url("/console/"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        let res = crate::common::send(req).await;
        assert!(
            matches!(res.status.as_u16(), 401 | 405),
            "{method}: {}",
            res.status
        );
    }
    // A page with data: not cached, not framed.
    let page = get(&gw.admin_url("/console/"), &with_cookie).await;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("cache-control"), "no-store");
    assert_eq!(page.header("x-frame-options"), "DENY");
    assert!(page
        .header("content-security-policy")
        .contains("frame-ancestors 'none'"));
    // A cookie from before a restart (sessions live in the process) opens nothing.
    let other = gateway().await;
    let stale = get(&other.admin_url("/console/"), &with_cookie).await;
    assert_eq!(stale.status, 303);
}

/// What does not exist is a 404 page, a huge search or page number an answer: never a
/// 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_records_and_huge_searches_are_answered_not_500() {
    let gw = gateway().await;
    let auth = format!("Bearer {TOKEN}");
    let h = [("authorization", auth.as_str())];
    let long = "a".repeat(3000);
    for path in [
        "/console/records/rec_nope".to_owned(),
        "/console/records/rec_nope/resolve".to_owned(),
        "/console/records/rec_nope/reconcile".to_owned(),
        format!("/console/records/{long}"),
    ] {
        let res = get(&gw.admin_url(&path), &h).await;
        assert_eq!(res.status, 404, "{path}");
        assert_eq!(res.header("content-type"), "text/html; charset=utf-8");
    }
    for path in [
        "/console/records/rec_nope/resolve",
        "/console/records/rec_nope/reconcile",
        "/console/webhooks/nope/redeliver",
    ] {
        let res = crate::common::post(
            &gw.admin_url(path),
            "confirmed=1&verdict=released",
            &[
                ("authorization", auth.as_str()),
                ("content-type", "application/x-www-form-urlencoded"),
            ],
        )
        .await;
        assert_eq!(res.status, 404, "{path}: {}", res.text());
    }
    let huge = "%3Cx%3E".repeat(2500);
    for query in [
        format!("key={huge}&principal={huge}&route={huge}"),
        "page=100000".to_owned(),
        "page=18446744073709551615".to_owned(),
        "page=99999999999999999999999".to_owned(),
        "page=-1".to_owned(),
    ] {
        let res = get(&gw.admin_url(&format!("/console/?{query}")), &h).await;
        assert!(
            matches!(res.status.as_u16(), 200 | 400),
            "{}: {}",
            &query[..query.len().min(40)],
            res.status
        );
        assert!(!res.text().contains("<x>"));
    }
}

/// Text an outsider chose (an Idempotency-Key, a webhook event id, a search) reaches the
/// pages as text: never as markup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_from_outside_reach_the_pages_as_text() {
    let s = crate::console::setup().await;
    let gw = &s.gw;
    let auth = format!("Bearer {TOKEN}");
    let h = [("authorization", auth.as_str())];
    let res = crate::common::post(
        &gw.url("/v1/render"),
        "{\"text\":\"x\"}",
        &[
            ("authorization", "Bearer \"><img src=x onerror=alert(2)>"),
            ("idempotency-key", "\"<script>alert(1)</script>\""),
        ],
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let id = res.header("oncely-record").to_owned();
    let delivery = crate::console::dead_letter(&s, "<img src=x onerror=alert(3)>").await;
    for path in [
        format!("/console/records/{id}"),
        "/console/?key=%3Cscript%3E".to_owned(),
        "/console/?key=%22%3E%3Cimg%20src%3Dx%3E&principal=%3Cb%3E&route=%27%3E%3Cb%3E".to_owned(),
        "/console/webhooks".to_owned(),
        format!("/console/webhooks/{delivery}/redeliver"),
        "/console/records/%3Cimg%20src%3Dx%3E".to_owned(),
        "/console/usage?principal=%3Cimg%20src%3Dx%3E".to_owned(),
        "/console/?done=%3Cimg%20src%3Dx%3E".to_owned(),
    ] {
        let page = get(&gw.admin_url(&path), &h).await;
        let text = page.text();
        assert!(
            !text.contains("<img") && !text.contains("<script>") && !text.contains("<b>"),
            "{path}: {text}"
        );
    }
    let record = get(&gw.admin_url(&format!("/console/records/{id}")), &h).await;
    assert!(
        record.text().contains("&lt;script&gt;"),
        "{}",
        record.text()
    );
    let dead = get(&gw.admin_url("/console/webhooks"), &h).await;
    assert!(
        dead.text().contains("&lt;img src=x onerror=alert(3)&gt;"),
        "{}",
        dead.text()
    );
}

/// Every admin route checks the token the same way: closed (403) without one configured,
/// 401 for none, a wrong one or another scheme; `/healthz` and `/metrics` open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_route_checks_the_token_the_same_way() {
    let routes = [
        ("GET", "/records"),
        ("GET", "/records/rec_1"),
        ("POST", "/records/rec_1/resolve"),
        ("GET", "/usage"),
        ("GET", "/openapi.json"),
        ("GET", "/webhooks/dead"),
        ("POST", "/webhooks/dead/x/redeliver"),
    ];
    let ask = |gw: &Gateway, method: &str, path: &str, auth: Option<String>| {
        let mut b = http::Request::builder()
            .method(method)
            .uri(gw.admin_url(path))
            .header("content-type", "application/json");
        if let Some(a) = auth {
            b = b.header("authorization", a);
        }
        crate::common::send(
            b.body(http_body_util::Full::new(bytes::Bytes::from_static(
                b"{\"released\":true}",
            )))
            .unwrap(),
        )
    };
    let up = upstream(axum::Router::new()).await;
    let closed = Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", "memory:"],
        &[],
    );
    for (method, path) in routes {
        let res = ask(&closed, method, path, Some(format!("Bearer {TOKEN}"))).await;
        assert_eq!(res.status, 403, "{method} {path}");
        assert_eq!(res.json()["code"], "admin_disabled", "{method} {path}");
    }
    for path in ["/healthz", "/metrics"] {
        assert_eq!(
            get(&closed.admin_url(path), &[]).await.status,
            200,
            "{path}"
        );
    }
    let open = gateway().await;
    for (method, path) in routes {
        for auth in [
            None,
            Some("Bearer nope".to_owned()),
            Some(format!("Basic {TOKEN}")),
            Some(format!("Bearer {TOKEN}x")),
            Some(TOKEN.to_owned()),
        ] {
            let res = ask(&open, method, path, auth.clone()).await;
            assert_eq!(res.status, 401, "{method} {path} with {auth:?}");
            assert_eq!(res.header("www-authenticate"), "Bearer");
        }
    }
}

/// A token variable filled from a file keeps its line end ("s3cret\n"): the token is what
/// a header can carry, so it is taken trimmed; one that is only whitespace closes the API
/// as an unset one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_variable_is_taken_trimmed_and_blank_is_unset() {
    let up = upstream(axum::Router::new()).await;
    let with_newline = Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", "memory:"],
        &[("ONCELY_ADMIN_TOKEN", &format!("{TOKEN}\n"))],
    );
    let auth = format!("Bearer {TOKEN}");
    let res = get(
        &with_newline.admin_url("/records"),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(res.status, 200, "{}", res.text());
    let page = get(
        &with_newline.admin_url("/console/"),
        &[("authorization", &auth)],
    )
    .await;
    assert_eq!(page.status, 200);
    let login = crate::common::post(
        &with_newline.admin_url("/console/login"),
        &format!("token={TOKEN}"),
        &[("content-type", "application/x-www-form-urlencoded")],
    )
    .await;
    assert_eq!(login.status, 303, "{}", login.text());

    let blank = Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", "memory:"],
        &[("ONCELY_ADMIN_TOKEN", " \n")],
    );
    let res = get(
        &blank.admin_url("/records"),
        &[("authorization", "Bearer  ")],
    )
    .await;
    assert_eq!(res.status, 403);
    assert_eq!(res.json()["code"], "admin_disabled");
    assert_eq!(get(&blank.admin_url("/console/"), &[]).await.status, 403);
}

/// A session's form posted from elsewhere (another site, a sandboxed frame or a
/// `data:` page that sends `Origin: null`), or without the session's own CSRF token, does
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_posts_with_the_session_cookie_are_refused() {
    let gw = gateway().await;
    let cookie = login(&gw).await;
    let page = get(&gw.admin_url("/console/purge"), &[("cookie", &cookie)]).await;
    let text = page.text();
    let at = text.find("name=\"csrf\" value=\"").unwrap() + 19;
    let csrf = text[at..at + text[at..].find('"').unwrap()].to_owned();
    let purge = |body: String, origin: Option<&'static str>| {
        let mut h = vec![
            ("cookie", cookie.clone()),
            (
                "content-type",
                "application/x-www-form-urlencoded".to_owned(),
            ),
        ];
        if let Some(o) = origin {
            h.push(("origin", o.to_owned()));
        }
        let url = gw.admin_url("/console/purge");
        async move {
            let h: Vec<(&str, &str)> = h.iter().map(|(n, v)| (*n, v.as_str())).collect();
            crate::common::post(&url, &body, &h).await
        }
    };
    for (body, origin) in [
        (format!("confirmed=1&csrf={csrf}"), Some("null")),
        (
            format!("confirmed=1&csrf={csrf}"),
            Some("http://evil.example"),
        ),
        ("confirmed=1".to_owned(), None),
        ("confirmed=1&csrf=".to_owned(), None),
        (format!("confirmed=1&csrf={}", "0".repeat(csrf.len())), None),
    ] {
        let res = purge(body.clone(), origin).await;
        assert_eq!(res.status, 403, "{body} from {origin:?}");
    }
    let ok = purge(format!("confirmed=1&csrf={csrf}"), None).await;
    assert_eq!(ok.status, 303, "{}", ok.text());
    // The login form is refused from another origin too.
    let res = crate::common::post(
        &gw.admin_url("/console/login"),
        &format!("token={TOKEN}"),
        &[
            ("content-type", "application/x-www-form-urlencoded"),
            ("origin", "null"),
        ],
    )
    .await;
    assert_eq!(res.status, 403);
    assert!(res.headers.get("set-cookie").is_none());
}

/// A stored text answer longer than the page shows, cut inside a character: shown as the
/// text it is, not as "binary data".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_text_answer_cut_inside_a_character_is_shown_as_text() {
    let body = format!("x{}", "é".repeat(3000));
    let up = {
        let body = body.clone();
        upstream(axum::Router::new().fallback(move || {
            let body = body.clone();
            async move { body }
        }))
        .await
    };
    let gw = Gateway::start(
        &["--upstream", &format!("http://{up}"), "--store", "memory:"],
        &[("ONCELY_ADMIN_TOKEN", TOKEN)],
    );
    let res = crate::common::post(
        &gw.url("/v1/text"),
        "{}",
        &[
            ("authorization", "Bearer user-1"),
            ("idempotency-key", "\"long-text\""),
        ],
    )
    .await;
    assert_eq!(res.status, 200);
    assert_eq!(res.text(), body);
    let id = res.header("oncely-record").to_owned();
    let auth = format!("Bearer {TOKEN}");
    let mut page = String::new();
    for _ in 0..100 {
        page = get(
            &gw.admin_url(&format!("/console/records/{id}")),
            &[("authorization", &auth)],
        )
        .await
        .text();
        if page.contains("Stored answer") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(page.contains("id=\"answer-body\">xéé"), "{page}");
    assert!(!page.contains("binary data"), "{page}");
}
