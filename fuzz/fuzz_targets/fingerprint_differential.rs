//! Differential fuzzing of the canonical form and the fingerprint.
//!
//! Run with: `cargo +nightly fuzz run fingerprint_differential` (from the repository root).
//! The input's first byte says where to split the rest into two bodies. The reference
//! is independent of `oncely_core::canon`: `serde_json` with `arbitrary_precision` (on in
//! this fuzz workspace only) parses both, and numbers are compared as exact decimals by
//! the small comparer below. Two JSON bodies have equal fingerprints if and only if they
//! are equal as JSON values with exact-decimal numbers; a JSON body never shares a
//! fingerprint with a non-JSON one; and both parsers agree on what is JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oncely_core::FingerprintBuilder;
use serde_json::Value;

/// An exact decimal as (negative, significant digits, exponent of the last digit);
/// `None` for zero. `None` overall when the exponent is too long to compare here.
fn decimal(text: &str) -> Option<Option<(bool, String, i128)>> {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, "0"),
    };
    let exp = exp.strip_prefix('+').unwrap_or(exp);
    if exp.trim_start_matches('-').trim_start_matches('0').len() > 30 {
        return None;
    }
    let exp: i128 = exp.parse().ok()?;
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(None);
    }
    let sig = digits.trim_end_matches('0');
    let last = exp - frac.len() as i128 + (digits.len() - sig.len()) as i128;
    Some(Some((negative, sig.to_owned(), last)))
}

/// Equal as JSON values with exact-decimal numbers; `None` when undecidable here.
fn same(a: &Value, b: &Value) -> Option<bool> {
    Some(match (a, b) {
        (Value::Number(x), Value::Number(y)) => decimal(&x.to_string())? == decimal(&y.to_string())?,
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Some(false);
            }
            for (p, q) in x.iter().zip(y) {
                if !same(p, q)? {
                    return Some(false);
                }
            }
            true
        }
        (Value::Object(x), Value::Object(y)) => {
            if x.len() != y.len() {
                return Some(false);
            }
            for (k, p) in x {
                match y.get(k) {
                    Some(q) if same(p, q)? => {}
                    _ => return Some(false),
                }
            }
            true
        }
        (Value::Number(_), _) | (_, Value::Number(_)) => false,
        (x, y) => x == y,
    })
}

fn fingerprint(body: &[u8]) -> oncely_core::Fingerprint {
    FingerprintBuilder::new("principal", "POST", "/v1/render").body(body, &[])
}

fuzz_target!(|data: &[u8]| {
    let Some((&at, rest)) = data.split_first() else {
        return;
    };
    let at = (at as usize).min(rest.len());
    let (a, b) = rest.split_at(at);
    let parsed_a = serde_json::from_slice::<Value>(a).ok();
    let parsed_b = serde_json::from_slice::<Value>(b).ok();
    for (body, parsed) in [(a, &parsed_a), (b, &parsed_b)] {
        assert_eq!(
            oncely_core::canon::is_json(body),
            parsed.is_some(),
            "the parsers disagree on {:?}",
            String::from_utf8_lossy(body)
        );
    }
    // JSON that repeats a member name is not canonical JSON: hashed as bytes.
    let canonical = |body: &[u8]| oncely_core::canon::Json::parse(body).is_some();
    let equal_fingerprints = fingerprint(a) == fingerprint(b);
    match (&parsed_a, &parsed_b) {
        (Some(_), Some(_)) if !canonical(a) || !canonical(b) => {
            assert_eq!(equal_fingerprints, a == b)
        }
        (Some(x), Some(y)) => {
            if let Some(equal) = same(x, y) {
                assert_eq!(
                    equal, equal_fingerprints,
                    "{:?} vs {:?}",
                    String::from_utf8_lossy(a),
                    String::from_utf8_lossy(b)
                );
            }
        }
        (None, None) => assert_eq!(equal_fingerprints, a == b),
        _ => assert!(!equal_fingerprints, "JSON and non-JSON share a fingerprint"),
    }
});
