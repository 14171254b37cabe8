//! Route path patterns: literal segments, `{name}` for one segment, `{*rest}` for the
//! tail; and the one normalised form of a request path ([`normalize_path`]).
//!
//! The gateway matches routes on the normalised path and forwards that same path, so no
//! other spelling of a guarded path (`//v1/render`, `/v1/%72ender`, `/v1/./render`,
//! `/v1/x/../render`, `/v1/render/`) reaches the upstream unguarded. Matching is then
//! segment by segment: `{name}` matches one non-empty segment; `{*rest}` matches
//! whatever remains, including nothing, so `/v1/{*rest}` matches `/v1` and `/v1/a/b`.

use std::borrow::Cow;
use std::fmt;

/// Why a request path has no unambiguous normalised form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    /// `%2F`: a `/` inside a segment, which upstreams read in different ways.
    EncodedSlash,
    /// A `%` not followed by two hex digits.
    BadEscape,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PathError::EncodedSlash => "the path holds an encoded \"/\" (%2F)",
            PathError::BadEscape => "the path holds a \"%\" not followed by two hex digits",
        })
    }
}

/// The normalised form of a request path (without query), as RFC 3986 section 6.2.2
/// describes it plus two rules of this gateway:
///
/// - percent-encoded unreserved characters (`A-Z a-z 0-9 - . _ ~`) are decoded, every
///   other escape is kept with upper-case hex digits;
/// - dot segments are removed (`/a/./b`, `/a/x/../b` → `/a/b`; never above the root);
/// - repeated slashes are merged, and a trailing slash is dropped (`/v1/render/` is
///   `/v1/render`), except for the root `/`.
///
/// An encoded `/` (`%2F`) or a bad escape has no unambiguous form: [`PathError`].
/// A path that does not start with `/` (the `*` of `OPTIONS *`) is left as it is.
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    if !path.starts_with('/') {
        return Ok(Cow::Borrowed(path));
    }
    let b = path.as_bytes();
    let mut decoded: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'%' {
            decoded.push(b[i]);
            i += 1;
            continue;
        }
        let hex = |c: u8| (c as char).to_digit(16);
        let (Some(hi), Some(lo)) = (
            b.get(i + 1).and_then(|c| hex(*c)),
            b.get(i + 2).and_then(|c| hex(*c)),
        ) else {
            return Err(PathError::BadEscape);
        };
        let byte = (hi * 16 + lo) as u8;
        if byte == b'/' {
            return Err(PathError::EncodedSlash);
        }
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            decoded.push(byte);
        } else {
            decoded.push(b'%');
            decoded.extend_from_slice(format!("{byte:02X}").as_bytes());
        }
        i += 3;
    }
    let decoded = String::from_utf8(decoded).map_err(|_| PathError::BadEscape)?;
    let mut segments: Vec<&str> = Vec::new();
    for segment in decoded.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    let normal = format!("/{}", segments.join("/"));
    Ok(if normal == path {
        Cow::Borrowed(path)
    } else {
        Cow::Owned(normal)
    })
}

/// One segment of a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
    Rest,
}

/// A parsed route path pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    segments: Vec<Segment>,
}

impl PathPattern {
    /// Parses a pattern such as `/v1/render`, `/v1/items/{id}` or `/files/{*rest}`.
    pub fn parse(text: &str) -> Result<PathPattern, String> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err(format!("path {text:?} must start with \"/\""));
        };
        // Empty segments are what the normalised request path never has (a trailing
        // slash, `//`): `/v1/render/` is the pattern `/v1/render`.
        let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
        let mut segments = Vec::with_capacity(parts.len());
        let mut names: Vec<&str> = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            if let Some(inner) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                let (tail, name) = match inner.strip_prefix('*') {
                    Some(name) => (true, name),
                    None => (false, inner),
                };
                if name.is_empty()
                    || !name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                {
                    return Err(format!(
                        "path {text:?}: segment {part:?} needs a name of letters, digits, _ or -"
                    ));
                }
                if names.contains(&name) {
                    return Err(format!("path {text:?}: {{{name}}} appears twice"));
                }
                names.push(name);
                if tail {
                    if i + 1 != parts.len() {
                        return Err(format!(
                            "path {text:?}: {{*{name}}} must be the last segment"
                        ));
                    }
                    segments.push(Segment::Rest);
                } else {
                    segments.push(Segment::Param);
                }
            } else if part.contains(['{', '}']) {
                return Err(format!(
                    "path {text:?}: segment {part:?} mixes text and braces (a segment is literal, {{name}} or {{*rest}})"
                ));
            } else if part.contains(['?', '#']) {
                return Err(format!("path {text:?}: a pattern has no query or fragment"));
            } else {
                segments.push(Segment::Literal((*part).to_owned()));
            }
        }
        Ok(PathPattern {
            text: text.to_owned(),
            segments,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `path` (without query) matches.
    pub fn matches(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix('/') else {
            return false;
        };
        let mut parts = rest.split('/').filter(|p| !p.is_empty());
        for segment in &self.segments {
            match segment {
                Segment::Rest => return true,
                Segment::Literal(lit) => match parts.next() {
                    Some(p) if p == lit => {}
                    _ => return false,
                },
                Segment::Param => match parts.next() {
                    Some(p) if !p.is_empty() => {}
                    _ => return false,
                },
            }
        }
        parts.next().is_none()
    }
}

impl fmt::Display for PathPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_param_and_rest() {
        let p = PathPattern::parse("/v1/render").unwrap();
        assert!(p.matches("/v1/render"));
        // A trailing slash is the same route (normalised paths never have one).
        assert!(p.matches("/v1/render/"));
        assert_eq!(
            PathPattern::parse("/v1/render/").unwrap().segments,
            p.segments
        );
        assert!(!p.matches("/v1/renders"));
        assert!(!p.matches("/v1"));

        let root = PathPattern::parse("/").unwrap();
        assert!(root.matches("/"));
        assert!(!root.matches("/a"));

        let p = PathPattern::parse("/v1/items/{id}/charge").unwrap();
        assert!(p.matches("/v1/items/42/charge"));
        assert!(!p.matches("/v1/items//charge"));
        assert!(!p.matches("/v1/items/42/43/charge"));

        let p = PathPattern::parse("/files/{*rest}").unwrap();
        assert!(p.matches("/files"));
        assert!(p.matches("/files/"));
        assert!(p.matches("/files/a/b/c"));
        assert!(!p.matches("/filesx"));

        let root = PathPattern::parse("/{*rest}").unwrap();
        assert!(root.matches("/"));
        assert!(root.matches("/anything/at/all"));
    }

    #[test]
    fn one_normalised_form() {
        for (raw, normal) in [
            ("/v1/render", "/v1/render"),
            ("//v1/render", "/v1/render"),
            ("/v1//render", "/v1/render"),
            ("/v1/%72ender", "/v1/render"),
            ("/v1/%72%65nder", "/v1/render"),
            ("/v1/render/", "/v1/render"),
            ("/v1/./render", "/v1/render"),
            ("/v1/x/../render", "/v1/render"),
            ("/v1/%2e/render", "/v1/render"),
            ("/v1/x/%2E%2E/render", "/v1/render"),
            ("/../../v1/render", "/v1/render"),
            ("/v1/render/.", "/v1/render"),
            ("/v1/a%20b", "/v1/a%20b"),
            ("/v1/a%3fb", "/v1/a%3Fb"),
            ("/v1/%7euser", "/v1/~user"),
            ("/", "/"),
            ("//", "/"),
            ("/..", "/"),
            ("*", "*"),
        ] {
            assert_eq!(normalize_path(raw).unwrap(), normal, "{raw}");
            // The normal form is a fixed point.
            assert_eq!(normalize_path(normal).unwrap(), normal, "{normal}");
        }
        for (raw, err) in [
            ("/v1/re%2Fnder", PathError::EncodedSlash),
            ("/v1/re%2fnder", PathError::EncodedSlash),
            ("/v1/%zz", PathError::BadEscape),
            ("/v1/%", PathError::BadEscape),
            ("/v1/%7", PathError::BadEscape),
        ] {
            assert_eq!(normalize_path(raw), Err(err), "{raw}");
        }
    }

    #[test]
    fn bad_patterns_are_refused() {
        for bad in [
            "v1/render",
            "/a/{*rest}/b",
            "/a/{}",
            "/a/x{id}",
            "/a/{id}/{id}",
            "/a?b=1",
            "/a/{i d}",
        ] {
            assert!(PathPattern::parse(bad).is_err(), "{bad}");
        }
    }
}
