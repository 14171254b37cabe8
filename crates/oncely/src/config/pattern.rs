//! Route path patterns: literal segments, `{name}` for one segment, `{*rest}` for the
//! tail.
//!
//! Matching is on the path as sent (no percent-decoding), segment by segment. `{name}`
//! matches one non-empty segment; `{*rest}` matches whatever remains, including nothing,
//! so `/v1/{*rest}` matches `/v1`, `/v1/` and `/v1/a/b`.

use std::fmt;

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
        let parts: Vec<&str> = rest.split('/').collect();
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
        let mut parts = rest.split('/');
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
        assert!(!p.matches("/v1/render/"));
        assert!(!p.matches("/v1/renders"));
        assert!(!p.matches("/v1"));

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
