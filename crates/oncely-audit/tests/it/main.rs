//! Integration tests of `oncely audit`: real files (plain and gzip), readers standing in
//! for standard input, and the seed's day as a generated log.

mod churn;
mod identity;
mod inputs;
mod seed;
mod window;

use std::io::Cursor;
use std::path::PathBuf;

use oncely_audit::{audit, AuditArgs, Input, Report};

/// 2026-11-06T09:00:00Z in milliseconds.
pub(crate) const DAY: i64 = 1_793_955_600_000;

pub(crate) fn ts(ms: i64) -> String {
    oncely_core::Timestamp(ms).to_rfc3339()
}

/// One log line in the contract's field names.
pub(crate) fn line(at: i64, principal: &str, body: &str, units: u64, duration_ms: u64) -> String {
    format!(
        r#"{{"ts":"{}","principal":"{principal}","method":"POST","path":"/v1/render","body":{body},"units":{units},"duration_ms":{duration_ms}}}"#,
        ts(at)
    )
}

pub(crate) fn args() -> AuditArgs {
    AuditArgs::new(vec![PathBuf::from("-")])
}

/// Audits lines given in memory, as if read from standard input.
pub(crate) fn audit_lines(lines: &[String], args: &AuditArgs) -> Report {
    let text = lines.join("\n") + "\n";
    let input = Input::from_reader("-", Cursor::new(text.into_bytes())).unwrap();
    audit(vec![input], args)
}
