//! How the verifier reads request headers, without forcing one HTTP type on callers.
//!
//! [`HeaderLookup`] is implemented for [`http::HeaderMap`] (what the ingress has) and for
//! lists of `(name, value)` pairs (what `sign` returns and tests write).

/// Gives every value of a header, found by ASCII case-insensitive name.
pub trait HeaderLookup {
    /// Every value of the header `name`, in the order received.
    fn header_values(&self, name: &str) -> Vec<&[u8]>;
}

impl HeaderLookup for http::HeaderMap {
    fn header_values(&self, name: &str) -> Vec<&[u8]> {
        // An invalid name finds nothing rather than panicking.
        self.get_all(name).iter().map(|v| v.as_bytes()).collect()
    }
}

impl<N: AsRef<str>, V: AsRef<[u8]>> HeaderLookup for [(N, V)] {
    fn header_values(&self, name: &str) -> Vec<&[u8]> {
        self.iter()
            .filter(|(n, _)| n.as_ref().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_ref())
            .collect()
    }
}

impl<N: AsRef<str>, V: AsRef<[u8]>> HeaderLookup for Vec<(N, V)> {
    fn header_values(&self, name: &str) -> Vec<&[u8]> {
        self.as_slice().header_values(name)
    }
}

impl<N: AsRef<str>, V: AsRef<[u8]>, const K: usize> HeaderLookup for [(N, V); K] {
    fn header_values(&self, name: &str) -> Vec<&[u8]> {
        self.as_slice().header_values(name)
    }
}

impl<H: HeaderLookup + ?Sized> HeaderLookup for &H {
    fn header_values(&self, name: &str) -> Vec<&[u8]> {
        (**self).header_values(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_found_case_insensitively_in_order() {
        let headers = [("Webhook-Id", "a"), ("other", "x"), ("webhook-id", "b")];
        assert_eq!(headers.header_values("WEBHOOK-ID"), [&b"a"[..], &b"b"[..]]);
        assert!(headers.header_values("missing").is_empty());
    }

    #[test]
    fn header_map_is_found_case_insensitively() {
        let mut map = http::HeaderMap::new();
        map.append("stripe-signature", "t=1".parse().unwrap());
        assert_eq!(map.header_values("Stripe-Signature"), [&b"t=1"[..]]);
        assert!(map.header_values("not a header name").is_empty());
    }
}
