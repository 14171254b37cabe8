//! Fuzzes request path normalisation and route matching.
//!
//! Run with: `cargo +nightly fuzz run path_routes` (from the repository root).
//! The input is a request path. Nothing may panic. A normalised path starts with `/`,
//! has no empty, `.` or `..` segment, no trailing slash (but the root), no `%2F` and no
//! escaped unreserved character, and is its own normal form; other spellings of it
//! (`//`, `./`, a trailing `/`) normalise to it. A pattern matches a normal path with a
//! trailing `/` as it matches the path, and the literal `/v1/render` matches only itself.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The module itself (it needs nothing but std), so that this target does not build the
// whole gateway.
#[allow(dead_code)]
#[path = "../../crates/oncely/src/config/pattern.rs"]
mod pattern;

use pattern::{normalize_path, PathPattern};

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(normal) = normalize_path(path) else {
        return;
    };
    if !path.starts_with('/') {
        assert_eq!(normal, path);
        return;
    }
    let normal = normal.into_owned();
    assert!(normal.starts_with('/'), "{normal:?}");
    assert!(normal == "/" || !normal.ends_with('/'), "{normal:?}");
    for segment in normal[1..].split('/').filter(|_| normal != "/") {
        assert!(!segment.is_empty() && segment != "." && segment != "..", "{normal:?}");
    }
    let upper = normal.to_ascii_uppercase();
    assert!(!upper.contains("%2F"), "{normal:?}");
    for (i, _) in normal.match_indices('%') {
        let byte = u8::from_str_radix(&normal[i + 1..i + 3], 16).expect("a valid escape");
        assert!(
            !(byte.is_ascii_alphanumeric() || b"-._~".contains(&byte)),
            "{normal:?} keeps an escaped unreserved character"
        );
        assert_eq!(&normal[i + 1..i + 3], normal[i + 1..i + 3].to_ascii_uppercase());
    }
    assert_eq!(normalize_path(&normal).unwrap(), normal.as_str(), "a fixed point");

    let spelled = format!("/.{}/", normal.replace('/', "//"));
    assert_eq!(normalize_path(&spelled).unwrap(), normal.as_str(), "{spelled:?}");
    let slashed = format!("{normal}/");
    for pattern in ["/v1/render", "/v1/{id}/charge", "/files/{*rest}", "/{*rest}", "/"] {
        let p = PathPattern::parse(pattern).unwrap();
        assert_eq!(p.matches(&normal), p.matches(&slashed), "{pattern} on {normal:?}");
    }
    assert!(PathPattern::parse("/{*rest}").unwrap().matches(&normal));
    if PathPattern::parse("/v1/render").unwrap().matches(&normal) {
        assert_eq!(normal, "/v1/render");
    }
});
