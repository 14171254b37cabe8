//! JSON views of ledger records and usage (and the usage history's CSV), shared by the
//! CLI (`--json`, `usage --by hour`) and the admin API so that both say the same thing
//! the same way.
//!
//! Times are RFC 3339 strings (UTC, milliseconds) or `null`; the start of a usage hour is
//! written without fractional seconds (`2026-12-01T18:00:00Z`). A stored body is shown as
//! text when it is UTF-8 (`"body_encoding": "utf8"`), else as base64
//! (`"body_encoding": "base64"`); a body that was not kept (over `max_response`) is
//! `null` with `"body_encoding": null`.

use std::fmt::Write as _;

use base64::Engine;
use oncely_core::{Record, StoredResponse, Timestamp};
use oncely_store::{ChurnEntry, ChurnKind, Usage, UsageHour, UsageRow};
use serde_json::{json, Value};

fn time(t: Option<Timestamp>) -> Value {
    t.map_or(Value::Null, |t| Value::String(t.to_rfc3339()))
}

/// The fields `ledger list --json` and `GET /records` show for each record.
pub fn summary(r: &Record) -> Value {
    json!({
        "id": r.id.as_str(),
        "state": r.state.as_str(),
        "route": r.route,
        "class": r.class.as_str(),
        "principal": r.principal,
        "attempt": r.attempt,
        "status": r.response.as_ref().map(|s| s.status),
        "created_at": time(Some(r.created_at)),
        "completed_at": time(r.completed_at),
        "expires_at": time(r.expires_at),
        "units": r.units,
        "repeats": r.repeats,
        "repeat_units": r.repeat_units,
        "workflow_id": r.workflow_id,
    })
}

/// The keys made up for a retry that joined the record (`oncely_store::churn`), oldest
/// first, and whether its caller is known never to have got its answer.
pub fn churn(entries: &[ChurnEntry]) -> (Vec<&str>, bool) {
    let joined = entries
        .iter()
        .filter(|e| e.kind == ChurnKind::Joined)
        .filter_map(|e| e.key.as_deref())
        .collect();
    let undelivered = entries.iter().any(|e| e.kind == ChurnKind::Undelivered);
    (joined, undelivered)
}

/// Every field of a record (`ledger show --json`, `GET /records/ID`), with the keys that
/// joined it ([`churn`]).
pub fn detail(r: &Record, entries: &[ChurnEntry]) -> Value {
    let (joined, undelivered) = churn(entries);
    json!({
        "id": r.id.as_str(),
        "state": r.state.as_str(),
        "route": r.route,
        "class": r.class.as_str(),
        "scope": r.scope.as_str(),
        "key": r.key,
        "fingerprint": r.fingerprint.to_hex(),
        "principal": r.principal,
        "owner": r.owner,
        "attempt": r.attempt,
        "lease_until": time(r.lease_until),
        "created_at": time(Some(r.created_at)),
        "updated_at": time(Some(r.updated_at)),
        "completed_at": time(r.completed_at),
        "expires_at": time(r.expires_at),
        "response": r.response.as_ref().map(response),
        "units": r.units,
        "repeats": r.repeats,
        "repeat_units": r.repeat_units,
        "workflow_id": r.workflow_id,
        "provider_request_id": r.provider_request_id,
        "last_error": r.last_error,
        "joined_keys": joined,
        "undelivered": undelivered,
    })
}

/// A stored response: status, headers as `[name, value]` pairs in order, and the body.
pub fn response(s: &StoredResponse) -> Value {
    let (body, encoding) = match &s.body {
        None => (Value::Null, Value::Null),
        Some(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => (Value::String(text.to_owned()), json!("utf8")),
            Err(_) => (
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes)),
                json!("base64"),
            ),
        },
    };
    json!({
        "status": s.status,
        "headers": s.headers.iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>(),
        "body": body,
        "body_encoding": encoding,
        "body_kept": s.body.is_some(),
    })
}

fn usage_row(r: &UsageRow, with_principal: bool) -> Value {
    let mut v = json!({
        "fresh": r.fresh,
        "fresh_units": r.fresh_units,
        "repeats": r.repeats,
        "repeat_units": r.repeat_units,
    });
    if with_principal {
        v["principal"] = json!(r.principal);
    }
    v
}

/// `usage --json` and `GET /usage`: `{"totals": {...}, "by_principal": [{...}]}`.
pub fn usage(u: &Usage) -> Value {
    json!({
        "totals": usage_row(&u.totals, false),
        "by_principal": u.by_principal.iter().map(|r| usage_row(r, true)).collect::<Vec<_>>(),
    })
}

/// The header of the usage history's CSV (`usage --by hour --format csv`).
pub const USAGE_HOURS_CSV_HEADER: &str =
    "principal,route,hour,fresh,fresh_units,repeats,repeat_units";

/// The start of a usage hour, RFC 3339 in UTC without fractional seconds.
pub fn hour(t: Timestamp) -> String {
    let text = t.to_rfc3339();
    // `YYYY-MM-DDTHH:MM:SS.mmmZ`: the whole seconds, then `Z`.
    match text.split_once('.') {
        Some((whole, _)) => format!("{whole}Z"),
        None => text,
    }
}

/// `usage --by hour --format json` and `GET /usage?by=hour`: one object per principal,
/// route and hour.
pub fn usage_hours(rows: &[UsageHour]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                json!({
                    "principal": r.principal,
                    "route": r.route,
                    "hour": hour(r.hour),
                    "fresh": r.fresh,
                    "fresh_units": r.fresh_units,
                    "repeats": r.repeats,
                    "repeat_units": r.repeat_units,
                })
            })
            .collect(),
    )
}

/// `usage --by hour --format csv`: [`USAGE_HOURS_CSV_HEADER`], then a line per row
/// (RFC 4180: a field with a comma, quote or line break is quoted).
pub fn usage_hours_csv(rows: &[UsageHour]) -> String {
    fn field(text: &str) -> String {
        if text.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", text.replace('"', "\"\""))
        } else {
            text.to_owned()
        }
    }
    let mut out = format!("{USAGE_HOURS_CSV_HEADER}\n");
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{}",
            field(&r.principal),
            field(&r.route),
            hour(r.hour),
            r.fresh,
            r.fresh_units,
            r.repeats,
            r.repeat_units
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_text_or_base64_and_say_which() {
        let text = response(&StoredResponse {
            status: 200,
            headers: vec![("content-type".into(), "text/plain".into())],
            body: Some(bytes::Bytes::from_static(b"hello")),
        });
        assert_eq!(text["body"], "hello");
        assert_eq!(text["body_encoding"], "utf8");
        assert_eq!(text["headers"][0], json!(["content-type", "text/plain"]));
        let binary = response(&StoredResponse {
            status: 200,
            headers: vec![],
            body: Some(bytes::Bytes::from_static(&[0xff, 0x00])),
        });
        assert_eq!(binary["body"], "/wA=");
        assert_eq!(binary["body_encoding"], "base64");
        let dropped = response(&StoredResponse {
            status: 200,
            headers: vec![],
            body: None,
        });
        assert_eq!(dropped["body"], Value::Null);
        assert_eq!(dropped["body_kept"], false);
    }

    #[test]
    fn usage_has_the_contract_shape() {
        let u = Usage {
            totals: UsageRow {
                principal: String::new(),
                fresh: 2,
                fresh_units: 10,
                repeats: 3,
                repeat_units: 15,
            },
            by_principal: vec![UsageRow {
                principal: "abc".into(),
                fresh: 2,
                fresh_units: 10,
                repeats: 3,
                repeat_units: 15,
            }],
        };
        assert_eq!(
            usage(&u),
            json!({
                "totals": {"fresh": 2, "fresh_units": 10, "repeats": 3, "repeat_units": 15},
                "by_principal": [{"principal": "abc", "fresh": 2, "fresh_units": 10, "repeats": 3, "repeat_units": 15}],
            })
        );
    }

    #[test]
    fn usage_hours_have_the_contract_columns() {
        let rows = [UsageHour {
            principal: "abc".into(),
            route: "POST /v1/a,b".into(),
            hour: Timestamp::parse_rfc3339("2026-12-01T18:00:00Z").unwrap(),
            fresh: 1,
            fresh_units: 4,
            repeats: 2,
            repeat_units: 8,
            joined: 1,
            replayed: 1,
        }];
        assert_eq!(
            usage_hours_csv(&rows),
            "principal,route,hour,fresh,fresh_units,repeats,repeat_units\n\
             abc,\"POST /v1/a,b\",2026-12-01T18:00:00Z,1,4,2,8\n"
        );
        assert_eq!(
            usage_hours(&rows),
            json!([{"principal": "abc", "route": "POST /v1/a,b", "hour": "2026-12-01T18:00:00Z",
                "fresh": 1, "fresh_units": 4, "repeats": 2, "repeat_units": 8}])
        );
        assert_eq!(usage_hours_csv(&[]), format!("{USAGE_HOURS_CSV_HEADER}\n"));
    }
}
