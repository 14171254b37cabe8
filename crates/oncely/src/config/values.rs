//! Value parsers more than one section shares: header names, JSON pointers, environment
//! variable names, principals, literal endpoint paths, and file paths relative to the
//! config file. Each returns the message of what is wrong; the caller says where.

use std::path::{Path, PathBuf};

use http::HeaderName;
use oncely_mcp::{JwtKey, McpPrincipal};
use oncely_tower::PrincipalSource;

/// A header name.
pub(super) fn header_name(text: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(text.as_bytes())
        .map_err(|_| format!("{text:?} is not a valid header name"))
}

/// A JSON pointer (`/a/b`).
pub(super) fn pointer(text: &str) -> Result<(), String> {
    if text.starts_with('/') {
        Ok(())
    } else {
        Err(format!(
            "{text:?} is not a JSON pointer (it must start with \"/\", e.g. \"/request_id\")"
        ))
    }
}

/// An environment variable name.
pub(super) fn env_name(text: &str) -> Result<(), String> {
    if !text.is_empty()
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !text.starts_with(|c: char| c.is_ascii_digit())
    {
        Ok(())
    } else {
        Err(format!(
            "{text:?} is not an environment variable name (letters, digits and _)"
        ))
    }
}

/// `header:NAME`, `none`, and (when `jwt` is allowed) `jwt:CLAIM`.
pub(super) fn principal(text: &str, allow_jwt: bool) -> Result<McpPrincipal, String> {
    if text == "none" {
        Ok(McpPrincipal::Source(PrincipalSource::None))
    } else if let Some(name) = text.strip_prefix("header:") {
        header_name(name).map(|h| McpPrincipal::Source(PrincipalSource::Header(h)))
    } else if let (true, Some(claim)) = (allow_jwt, text.strip_prefix("jwt:")) {
        if claim.is_empty() {
            Err("jwt: needs a claim name, e.g. jwt:sub".into())
        } else {
            // The key is filled in by the caller.
            Ok(McpPrincipal::Jwt {
                claim: claim.to_owned(),
                key: JwtKey::SecretEnv(String::new()),
            })
        }
    } else if allow_jwt {
        Err(format!(
            "unknown principal {text:?} (use header:NAME, jwt:CLAIM or none)"
        ))
    } else {
        Err(format!(
            "unknown principal {text:?} (use header:NAME or none)"
        ))
    }
}

/// The literal path of an `[[mcp]]` or `[[webhooks]]` endpoint.
pub(super) fn endpoint_path(text: &str) -> Result<String, String> {
    if text.starts_with('/') && !text.contains(['?', '#', '{', '}']) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "path {text:?} must be a literal path starting with \"/\""
        ))
    }
}

/// Resolves a path relative to the config file's directory.
pub(super) fn relative(base: Option<&Path>, p: &str) -> PathBuf {
    let p = PathBuf::from(p);
    match base {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_values_are_checked() {
        assert!(env_name("ONCELY_ADMIN_TOKEN").is_ok());
        for bad in ["", "1X", "A B", "A-B"] {
            assert!(env_name(bad).is_err(), "{bad:?}");
        }
        assert!(pointer("/a/b").is_ok() && pointer("a").is_err());
        assert_eq!(endpoint_path("/mcp").unwrap(), "/mcp");
        for bad in ["mcp", "/a?b", "/a#b", "/{x}"] {
            assert!(endpoint_path(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            principal("jwt:sub", true),
            Ok(McpPrincipal::Jwt { claim, .. }) if claim == "sub"
        ));
        assert!(principal("jwt:sub", false).is_err());
        assert!(principal("jwt:", true).is_err());
        let dir = Path::new("/etc/oncely");
        assert_eq!(
            relative(Some(dir), "a.pem"),
            PathBuf::from("/etc/oncely/a.pem")
        );
        assert_eq!(relative(Some(dir), "/b.pem"), PathBuf::from("/b.pem"));
        assert_eq!(relative(None, "a.pem"), PathBuf::from("a.pem"));
    }
}
