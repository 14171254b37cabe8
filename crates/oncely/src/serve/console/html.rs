//! The console's HTML: escaping, the page frame, small table and form pieces, the two
//! answers every page ends in (`html`, `error_page`), and the server-rendered SVG chart of
//! fresh executions against repeats. Everything is built as strings here, escaped at the
//! point where a value enters markup.

use std::fmt::Write as _;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use oncely_core::units::format_duration;
use oncely_core::Timestamp;

use super::state::Viewer;

/// Escapes text for HTML content and double-quoted attribute values.
pub(super) use crate::statement::html as esc;

/// Percent-encodes a query value (everything but unreserved characters).
pub(super) fn url_enc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A time as RFC 3339, with how long ago it was (or `-`).
pub(super) fn time_ago(t: Option<Timestamp>, now: Timestamp) -> String {
    match t {
        None => "-".to_owned(),
        Some(t) if t <= now => format!(
            "<time datetime=\"{0}\">{0}</time> <span class=\"age\">({1} ago)</span>",
            esc(&t.to_rfc3339()),
            age(t.until(now))
        ),
        Some(t) => format!(
            "<time datetime=\"{0}\">{0}</time> <span class=\"age\">(in {1})</span>",
            esc(&t.to_rfc3339()),
            age(now.until(t))
        ),
    }
}

/// A duration to the second, for ages (`0s` below a second).
pub(super) fn age(d: Duration) -> String {
    format_duration(Duration::from_secs(d.as_secs()))
}

/// A principal hash, shortened for tables (the full hash is in the title and the link).
pub(super) fn short_principal(p: &str) -> String {
    if p.chars().count() > 12 {
        let head: String = p.chars().take(12).collect();
        format!(
            "<span class=\"mono\" title=\"{}\">{}…</span>",
            esc(p),
            esc(&head)
        )
    } else {
        format!("<span class=\"mono\">{}</span>", esc(p))
    }
}

/// A state as a badge.
pub(super) fn state_badge(state: &str) -> String {
    format!(
        "<span class=\"state state-{0}\" data-state=\"{0}\">{0}</span>",
        esc(state)
    )
}

/// The hidden CSRF field of a form posted by a browser session (none for a bearer).
pub(super) fn csrf_field(viewer: &Viewer) -> String {
    match viewer {
        Viewer::Session { csrf, .. } => {
            format!(
                "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
                esc(csrf)
            )
        }
        Viewer::Bearer => String::new(),
    }
}

/// Which section a page belongs to (for the navigation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Section {
    Records,
    InFlight,
    Usage,
    Webhooks,
    None,
}

/// A whole page: head, navigation, an optional notice, the body.
pub(super) fn page(
    title: &str,
    section: Section,
    viewer: Option<&Viewer>,
    notice: Option<&str>,
    body: &str,
) -> String {
    let mut nav = String::new();
    if let Some(viewer) = viewer {
        for (s, href, label) in [
            (Section::Records, "/console/", "Records"),
            (Section::InFlight, "/console/inflight", "In flight"),
            (Section::Usage, "/console/usage", "Usage"),
            (
                Section::Webhooks,
                "/console/webhooks",
                "Webhook dead letters",
            ),
        ] {
            let current = if s == section {
                " aria-current=\"page\""
            } else {
                ""
            };
            let _ = write!(nav, "<a href=\"{href}\"{current}>{label}</a>");
        }
        if let Viewer::Session { .. } = viewer {
            let _ = write!(
                nav,
                "<form method=\"post\" action=\"/console/logout\" class=\"logout\">{}<button type=\"submit\" id=\"logout\">Log out</button></form>",
                csrf_field(viewer)
            );
        }
    }
    let notice = notice
        .map(|n| format!("<p class=\"notice\" role=\"status\">{}</p>", esc(n)))
        .unwrap_or_default();
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>{title} · oncely console</title>\
<link rel=\"stylesheet\" href=\"/console/assets/console.css\">\
<script src=\"/console/assets/console.js\" defer></script></head>\
<body><header><span class=\"brand\">oncely</span><nav>{nav}</nav></header>\
<main><h1>{title}</h1>{notice}{body}</main></body></html>\n",
        title = esc(title),
    )
}

/// An HTML answer with a status.
pub(super) fn html(status: StatusCode, body: String) -> Response {
    (status, Html(body)).into_response()
}

/// A page that says only what went wrong.
pub(super) fn error_page(status: StatusCode, title: &str, detail: &str) -> Response {
    html(
        status,
        page(
            title,
            Section::None,
            None,
            None,
            &format!("<p class=\"error\">{}</p>", esc(detail)),
        ),
    )
}

/// One series point of the usage chart: a bucket's fresh executions and repeats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Bucket {
    pub(super) fresh: u64,
    pub(super) repeats: u64,
}

/// Sums `(time, fresh, repeats)` into `n` buckets of `step` from `start`; times outside
/// them are left out.
pub(super) fn buckets(
    start: Timestamp,
    step: std::time::Duration,
    n: usize,
    counts: impl IntoIterator<Item = (Timestamp, u64, u64)>,
) -> Vec<Bucket> {
    let mut out = vec![Bucket::default(); n];
    let step = (step.as_millis() as i64).max(1);
    for (t, fresh, repeats) in counts {
        if t < start {
            continue;
        }
        let i = (t.millis() - start.millis()) / step;
        if let Some(b) = usize::try_from(i).ok().and_then(|i| out.get_mut(i)) {
            b.fresh += fresh;
            b.repeats += repeats;
        }
    }
    out
}

/// A stacked bar chart (fresh below, repeats above) as inline SVG, with a legend and the
/// period's ends on the axis. Presentation attributes only (the CSP allows no inline
/// style).
pub(super) fn chart(label: &str, from: Timestamp, to: Timestamp, data: &[Bucket]) -> String {
    const W: f64 = 720.0;
    const H: f64 = 200.0;
    const LEFT: f64 = 40.0;
    const TOP: f64 = 24.0;
    const BOTTOM: f64 = 24.0;
    let max = data
        .iter()
        .map(|b| b.fresh + b.repeats)
        .max()
        .unwrap_or(0)
        .max(1);
    let plot_h = H - TOP - BOTTOM;
    let slot = (W - LEFT - 8.0) / data.len().max(1) as f64;
    let bar = (slot * 0.8).max(1.0);
    let mut svg = format!(
        "<svg class=\"chart\" role=\"img\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" \
xmlns=\"http://www.w3.org/2000/svg\" aria-label=\"{}\"><title>{}</title>",
        esc(label),
        esc(label)
    );
    let base = H - BOTTOM;
    let _ = write!(
        svg,
        "<line x1=\"{LEFT}\" y1=\"{base}\" x2=\"{W}\" y2=\"{base}\" stroke=\"#888\"/>\
<text x=\"{x}\" y=\"{y}\" font-size=\"11\" text-anchor=\"end\" fill=\"#555\">{max}</text>\
<text x=\"{x}\" y=\"{base}\" font-size=\"11\" text-anchor=\"end\" fill=\"#555\">0</text>",
        x = LEFT - 4.0,
        y = TOP + 4.0,
    );
    for (i, b) in data.iter().enumerate() {
        let x = LEFT + i as f64 * slot + (slot - bar) / 2.0;
        let fh = plot_h * b.fresh as f64 / max as f64;
        let rh = plot_h * b.repeats as f64 / max as f64;
        if b.fresh > 0 {
            let _ = write!(
                svg,
                "<rect class=\"fresh\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar:.1}\" height=\"{fh:.1}\" fill=\"#3b6fb6\"><title>{} fresh</title></rect>",
                base - fh,
                b.fresh
            );
        }
        if b.repeats > 0 {
            let _ = write!(
                svg,
                "<rect class=\"repeats\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar:.1}\" height=\"{rh:.1}\" fill=\"#e08a2c\"><title>{} repeats</title></rect>",
                base - fh - rh,
                b.repeats
            );
        }
    }
    let _ = write!(
        svg,
        "<text x=\"{LEFT}\" y=\"{H}\" font-size=\"11\" fill=\"#555\" dy=\"-6\">{}</text>\
<text x=\"{W}\" y=\"{H}\" font-size=\"11\" fill=\"#555\" dy=\"-6\" text-anchor=\"end\">{}</text>\
<rect x=\"{LEFT}\" y=\"4\" width=\"10\" height=\"10\" fill=\"#3b6fb6\"/>\
<text x=\"{lx1}\" y=\"13\" font-size=\"11\">fresh (charged)</text>\
<rect x=\"{lx2}\" y=\"4\" width=\"10\" height=\"10\" fill=\"#e08a2c\"/>\
<text x=\"{lx3}\" y=\"13\" font-size=\"11\">repeats (not charged)</text></svg>",
        esc(&from.to_rfc3339()),
        esc(&to.to_rfc3339()),
        lx1 = LEFT + 14.0,
        lx2 = LEFT + 120.0,
        lx3 = LEFT + 134.0,
    );
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_covers_markup_and_attributes() {
        assert_eq!(
            esc(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(url_enc("POST /v1/x?a=b"), "POST%20%2Fv1%2Fx%3Fa%3Db");
        // Shortened by characters, never inside one.
        assert_eq!(
            short_principal("ééééééééééééé<"),
            "<span class=\"mono\" title=\"ééééééééééééé&lt;\">éééééééééééé…</span>"
        );
    }

    #[test]
    fn buckets_count_times_in_their_slot_and_ignore_the_rest() {
        let from = Timestamp(0);
        let to = Timestamp(1000);
        let b = buckets(
            from,
            std::time::Duration::from_millis(250),
            4,
            [
                (Timestamp(0), 1, 0),
                (Timestamp(260), 1, 0),
                (Timestamp(999), 1, 1),
                (Timestamp(1000), 1, 0),
                (Timestamp(-1), 0, 1),
            ],
        );
        assert_eq!(
            b,
            vec![
                Bucket {
                    fresh: 1,
                    repeats: 0
                },
                Bucket {
                    fresh: 1,
                    repeats: 0
                },
                Bucket {
                    fresh: 0,
                    repeats: 0
                },
                Bucket {
                    fresh: 1,
                    repeats: 1
                },
            ]
        );
        let svg = chart("x", from, to, &b);
        assert_eq!(svg.matches("class=\"fresh\"").count(), 3);
        assert_eq!(svg.matches("class=\"repeats\"").count(), 1);
    }
}
