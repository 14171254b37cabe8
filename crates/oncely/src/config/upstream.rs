//! Upstream base URLs: the top-level `upstream`, a route's, an `[[mcp]]` server's and a
//! webhook's `deliver_to`. One type, so that every section checks a URL the same way.

use http::Uri;

/// An upstream base URL: `http://` or `https://`, with an optional path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// The URL as parsed.
    pub uri: Uri,
}

impl Upstream {
    /// Parses and checks an upstream URL.
    pub fn parse(text: &str) -> Result<Upstream, String> {
        let uri: Uri = text
            .parse()
            .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
        match uri.scheme_str() {
            Some("http") | Some("https") => {}
            _ => {
                return Err(format!(
                    "upstream {text:?} must start with http:// or https://"
                ))
            }
        }
        if uri.authority().is_none() {
            return Err(format!("upstream {text:?} has no host"));
        }
        if uri.query().is_some() {
            return Err(format!("upstream {text:?} must not have a query"));
        }
        Ok(Upstream { uri })
    }

    /// Whether it is an `https://` upstream.
    pub fn is_https(&self) -> bool {
        self.uri.scheme_str() == Some("https")
    }

    /// The path prefix, without a trailing slash (`""` for none).
    pub fn base_path(&self) -> &str {
        self.uri.path().trim_end_matches('/')
    }
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.uri)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upstream_is_http_or_https_with_a_host_and_no_query() {
        let u = Upstream::parse("https://api.example/v1/").unwrap();
        assert!(u.is_https());
        assert_eq!(u.base_path(), "/v1");
        assert_eq!(
            Upstream::parse("http://127.0.0.1:3000")
                .unwrap()
                .base_path(),
            ""
        );
        for bad in ["ftp://x", "/v1", "http://x/?a=1", "not a url"] {
            assert!(Upstream::parse(bad).is_err(), "{bad}");
        }
    }
}
