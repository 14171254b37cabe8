//! The W3C trace context (level 1): a `traceparent` parsed and written
//! ([`TraceParent`]), and a caller's `tracestate` kept within the W3C's limits
//! ([`trace_state`]).

use http::{HeaderMap, HeaderValue};

/// The W3C trace context header.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C vendor trace state header.
pub const TRACESTATE: &str = "tracestate";

/// A valid W3C `traceparent`: the trace, the caller's span in it, whether it is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// 16 bytes, not all zero.
    pub trace_id: [u8; 16],
    /// The span that sent the request: 8 bytes, not all zero.
    pub parent_id: [u8; 8],
    /// The `sampled` trace flag.
    pub sampled: bool,
}

impl TraceParent {
    /// Parses a `traceparent` value as the W3C Trace Context (level 1) says: version 2
    /// lower-case hex digits (not `ff`; `00` has exactly four fields, a later version
    /// may add fields after a `-`), trace id 32 and parent id 16 lower-case hex digits,
    /// neither all zeros, flags 2 hex digits. `None` for anything else.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        let value = trim(value);
        if value.len() < 55 {
            return None;
        }
        let version = &value[0..2];
        if !lower_hex(version) || version == b"ff" {
            return None;
        }
        if version == b"00" && value.len() != 55 {
            return None;
        }
        if value.len() > 55 && value[55] != b'-' {
            return None;
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let (trace, parent, flags) = (&value[3..35], &value[36..52], &value[53..55]);
        if !lower_hex(trace) || !lower_hex(parent) || !lower_hex(flags) {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut parent_id = [0u8; 8];
        hex::decode_to_slice(trace, &mut trace_id).ok()?;
        hex::decode_to_slice(parent, &mut parent_id).ok()?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        let mut flag = [0u8; 1];
        hex::decode_to_slice(flags, &mut flag).ok()?;
        Some(TraceParent {
            trace_id,
            parent_id,
            sampled: flag[0] & 1 == 1,
        })
    }

    /// The header value, version `00`.
    pub fn to_header(&self) -> HeaderValue {
        let text = format!(
            "00-{}-{}-{}",
            hex::encode(self.trace_id),
            hex::encode(self.parent_id),
            if self.sampled { "01" } else { "00" }
        );
        HeaderValue::from_str(&text).expect("hex is a valid header value")
    }
}

/// The most of a `tracestate` passed on: what the W3C asks every vendor to propagate.
const TRACESTATE_MAX_LEN: usize = 512;
/// The most list members a `tracestate` has.
const TRACESTATE_MAX_MEMBERS: usize = 32;

/// The caller's `tracestate` as the W3C list: several headers are one list; a list with
/// a malformed member is dropped whole (never passed on invalid); a valid one keeps its
/// first members up to 32 and 512 characters, so that a hostile one swells neither the
/// upstream's request nor the exported spans.
pub fn trace_state(headers: &HeaderMap) -> Option<String> {
    let mut kept = String::new();
    let mut count = 0;
    let mut full = false;
    for value in headers.get_all(TRACESTATE) {
        let value = value.to_str().ok()?;
        for member in value.split(',').map(|m| m.trim_matches([' ', '\t'])) {
            if member.is_empty() {
                continue;
            }
            if !tracestate_member(member) {
                return None;
            }
            let len = kept.len() + usize::from(!kept.is_empty()) + member.len();
            if full || count == TRACESTATE_MAX_MEMBERS || len > TRACESTATE_MAX_LEN {
                full = true;
                continue;
            }
            if !kept.is_empty() {
                kept.push(',');
            }
            kept.push_str(member);
            count += 1;
        }
    }
    (!kept.is_empty()).then_some(kept)
}

/// One `key=value` list member: the key lower-case letters, digits and `_-*/` (with at
/// most one `@`, for a tenant), starting with a letter or a digit, at most 256; the value
/// 1 to 256 printable ASCII characters but `,` and `=`, not ending with a space.
fn tracestate_member(member: &str) -> bool {
    let Some((key, value)) = member.split_once('=') else {
        return false;
    };
    let key_ok = (1..=256).contains(&key.len())
        && key
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-*/@".contains(&b))
        && key.bytes().filter(|b| *b == b'@').count() <= 1;
    let value_ok = (1..=256).contains(&value.len())
        && !value.ends_with(' ')
        && value
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=');
    key_ok && value_ok
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(start, |i| i + 1);
    &v[start..end]
}

fn lower_hex(v: &[u8]) -> bool {
    v.iter()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

/// A new trace id (never all zero).
pub(super) fn new_trace_id() -> [u8; 16] {
    loop {
        let id: [u8; 16] = rand::random();
        if id != [0; 16] {
            return id;
        }
    }
}

/// A new span id (never all zero).
pub(super) fn new_span_id() -> [u8; 8] {
    loop {
        let id: [u8; 8] = rand::random();
        if id != [0; 8] {
            return id;
        }
    }
}
