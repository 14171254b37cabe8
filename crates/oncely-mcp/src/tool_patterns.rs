//! Tool name patterns (`actions`, `tools`, `key_arguments`): names with `*` wildcards.

/// Whether `tool` matches one of `patterns` (names with `*` wildcards).
pub fn any_matches(patterns: &[String], tool: &str) -> bool {
    patterns.iter().any(|p| wildcard_match(p, tool))
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters (none too).
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::wildcard_match;

    #[test]
    fn a_star_matches_any_run() {
        assert!(wildcard_match("a*b*c", "aXbYc"));
        assert!(!wildcard_match("a*b*c", "aXcYb"));
        assert!(!wildcard_match("ab*ba", "aba"));
        assert!(wildcard_match("*", ""));
    }
}
