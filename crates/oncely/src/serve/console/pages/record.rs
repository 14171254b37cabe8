//! `GET /console/records/ID`: one record, with what the ledger keeps of its history
//! (attempts, owner and lease, reason, reconciliation schedule, repeats), its fields,
//! its stored answer, and the actions an `outcome_unknown` record offers.

use std::fmt::Write as _;

use axum::extract::{Path, Query, State};
use axum::Extension;
use oncely_core::State as RecordState;
use oncely_store::RepeatKind;

use super::super::html::{age, esc, state_badge, time_ago, Section};
use super::super::state::{Console, Viewer};
use super::shared::{get_record, ok, store_error, DoneQuery, PageResult, EVENTS};

/// The most of a stored body a record page shows.
const BODY_PREVIEW: usize = 4096;

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

/// `GET /console/records/ID`: one record, with what the ledger keeps of its history.
pub(crate) async fn record(
    State(console): State<Console>,
    Extension(viewer): Extension<Viewer>,
    Path(id): Path<String>,
    Query(q): Query<DoneQuery>,
) -> PageResult {
    let store = &console.store;
    let r = get_record(&console, &id).await?;
    let now = store.now().await.map_err(store_error)?;
    let churn = store.churn_of(&r.id).await.map_err(store_error)?;
    let (keys, _) = crate::records::churn(&churn);
    let joined_keys = if keys.is_empty() {
        "-".to_owned()
    } else {
        keys.join(", ")
    };
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
            let count = |kind| -> u64 {
                mine.iter()
                    .filter(|e| e.kind == kind)
                    .map(|e| e.count)
                    .sum()
            };
            // Listed one by one up to the limit; the older ones (their records gone) are
            // not this record's.
            let shown = ev.listed.iter().map(|e| e.count).sum::<u64>()
                + ev.older.iter().map(|h| h.repeats).sum::<u64>();
            (
                Some(count(RepeatKind::Joined)),
                Some(count(RepeatKind::Replayed)),
                mine.iter().map(|e| e.at).max(),
                shown < ev.total,
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
reason of its last change, its repeat events (while its window lasts; then what it counted \
stays in the usage history, per hour) and, while it is \
outcome_unknown, its reconciliation schedule. It keeps no time for each attempt or take-over; \
the log lines do.</p>",
    );

    body.push_str("<h2>Record</h2><table class=\"fields\"><tbody>");
    for (name, value) in [
        ("id", r.id.as_str().to_owned()),
        ("key", r.key.clone()),
        ("joined_keys", joined_keys),
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
