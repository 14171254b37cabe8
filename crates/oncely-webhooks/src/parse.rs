//! Parsers for each scheme's signature header and timestamps.
//!
//! They take untrusted text straight from a request, so they never panic and never echo
//! their input: a failure is a [`Malformed`] holding a fixed reason. The fuzz target
//! (`fuzz/fuzz_targets/signature_headers.rs`) and a property test throw arbitrary bytes
//! at each of them.
//!
//! Unknown entries are skipped where the provider's format allows new ones (Stripe's
//! `v0=` or a future scheme, Standard Webhooks' `v1a,` asymmetric signatures), but an
//! entry of a known kind that cannot be read makes the whole header malformed.

use std::fmt;

use base64::Engine as _;

use crate::scheme::{Encoding, HmacConfig};
use crate::secret::BASE64_LENIENT;

/// Length of an HMAC-SHA256 tag.
pub const TAG_LEN: usize = 32;

/// An HMAC-SHA256 tag as sent by a sender.
pub type Tag = [u8; TAG_LEN];

/// Why a header could not be read. The reason is fixed text, safe to show a sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// A parsed `Stripe-Signature` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeSignature {
    /// The `t=` timestamp, Unix seconds.
    pub timestamp: i64,
    /// Every `v1=` signature, in order.
    pub v1: Vec<Tag>,
}

/// Reads a Unix timestamp in seconds: ASCII digits only, as every provider sends it.
pub fn parse_timestamp(text: &str) -> Result<i64, Malformed> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Malformed("timestamp is not a whole number of seconds"));
    }
    text.parse::<i64>()
        .map_err(|_| Malformed("timestamp is out of range"))
}

/// Reads `Stripe-Signature: t=1492774577,v1=5257a8...,v0=6ffbb5...`.
///
/// Entries are `key=value` separated by commas, with no spaces, as Stripe writes them.
/// Exactly one `t=` and at least one `v1=` are required; other keys are ignored.
pub fn parse_stripe(value: &str) -> Result<StripeSignature, Malformed> {
    let mut timestamp = None;
    let mut v1 = Vec::new();
    for entry in value.split(',') {
        if entry.is_empty() {
            return Err(Malformed("empty entry"));
        }
        let (key, val) = entry
            .split_once('=')
            .ok_or(Malformed("entry without '='"))?;
        match key {
            "t" => {
                let t = parse_timestamp(val)?;
                if timestamp.replace(t).is_some() {
                    return Err(Malformed("more than one t= entry"));
                }
            }
            "v1" => v1.push(decode_hex(val)?),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(Malformed("no t= timestamp"))?;
    if v1.is_empty() {
        return Err(Malformed("no v1= signature"));
    }
    Ok(StripeSignature { timestamp, v1 })
}

/// Reads `webhook-signature: v1,K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4= v1,...`.
///
/// Entries are `version,base64` separated by whitespace; at least one usable `v1` is
/// required. Other versions (such as `v1a` asymmetric signatures) are skipped, and so is
/// an entry that cannot be read, as the reference verifiers do: a sender signing with
/// several keys may list one this receiver cannot use. With no usable `v1`, the first
/// entry's problem is the reason.
pub fn parse_standard(value: &str) -> Result<Vec<Tag>, Malformed> {
    let mut v1 = Vec::new();
    let mut problem = None;
    for entry in value.split_ascii_whitespace() {
        let Some((version, signature)) = entry.split_once(',') else {
            problem.get_or_insert(Malformed("entry without ','"));
            continue;
        };
        if version == "v1" {
            match decode_base64(signature) {
                Ok(tag) => v1.push(tag),
                Err(e) => {
                    problem.get_or_insert(e);
                }
            }
        }
    }
    if v1.is_empty() {
        return Err(problem.unwrap_or(Malformed("no v1 signature")));
    }
    Ok(v1)
}

/// Reads `X-Hub-Signature-256: sha256=757107ea0eb2509fc2...`.
pub fn parse_github(value: &str) -> Result<Tag, Malformed> {
    let hex = value
        .strip_prefix("sha256=")
        .ok_or(Malformed("value does not start with sha256="))?;
    decode_hex(hex)
}

/// Reads the generic scheme's signature header as `config` describes it.
pub fn parse_generic(config: &HmacConfig, value: &str) -> Result<Tag, Malformed> {
    let encoded = match &config.prefix {
        Some(prefix) => value
            .strip_prefix(prefix.as_str())
            .ok_or(Malformed("value does not start with the configured prefix"))?,
        None => value,
    };
    match config.encoding {
        Encoding::Hex => decode_hex(encoded),
        Encoding::Base64 => decode_base64(encoded),
    }
}

fn decode_hex(text: &str) -> Result<Tag, Malformed> {
    let mut tag = [0u8; TAG_LEN];
    hex::decode_to_slice(text, &mut tag)
        .map_err(|_| Malformed("signature is not 64 hexadecimal digits"))?;
    Ok(tag)
}

fn decode_base64(text: &str) -> Result<Tag, Malformed> {
    let bytes = BASE64_LENIENT
        .decode(text)
        .map_err(|_| Malformed("signature is not base64"))?;
    bytes
        .try_into()
        .map_err(|_| Malformed("signature is not 32 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX_A: &str = "5257a869e7ecebeda32affa62cdca3fa51cad7e77a0e56ff536d0ce8e108d8bd";
    const HEX_B: &str = "6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39";
    const B64_A: &str = "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn tag(hex_text: &str) -> Tag {
        hex::decode(hex_text).unwrap().try_into().unwrap()
    }

    #[test]
    fn timestamps_are_plain_digits() {
        assert_eq!(parse_timestamp("1614265330"), Ok(1_614_265_330));
        assert_eq!(parse_timestamp("0"), Ok(0));
        for bad in ["", "abc", "-5", "+5", " 5", "5 ", "1.5", "1e9", "1_000"] {
            assert!(parse_timestamp(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_timestamp("99999999999999999999"),
            Err(Malformed("timestamp is out of range"))
        );
    }

    #[test]
    fn stripe_header_with_v1_and_v0() {
        let parsed = parse_stripe(&format!("t=1492774577,v1={HEX_A},v0={HEX_B}")).unwrap();
        assert_eq!(parsed.timestamp, 1_492_774_577);
        assert_eq!(parsed.v1, vec![tag(HEX_A)]);
    }

    #[test]
    fn stripe_header_keeps_every_v1_in_order() {
        let parsed = parse_stripe(&format!("v1={HEX_B},t=7,v1={HEX_A}")).unwrap();
        assert_eq!(parsed.timestamp, 7);
        assert_eq!(parsed.v1, vec![tag(HEX_B), tag(HEX_A)]);
    }

    #[test]
    fn stripe_header_refusals_name_their_reason() {
        let cases = [
            (
                format!("t=abc,v1={HEX_A}"),
                "timestamp is not a whole number of seconds",
            ),
            ("t=1".to_owned(), "no v1= signature"),
            (format!("t=1,v0={HEX_A}"), "no v1= signature"),
            (format!("v1={HEX_A}"), "no t= timestamp"),
            (format!("t=1,,v1={HEX_A}"), "empty entry"),
            (format!("t=1,v1={HEX_A},"), "empty entry"),
            (String::new(), "empty entry"),
            (format!("t=1,v1{HEX_A}"), "entry without '='"),
            (format!("t=1,t=2,v1={HEX_A}"), "more than one t= entry"),
            (
                "t=1,v1=zz".to_owned(),
                "signature is not 64 hexadecimal digits",
            ),
            (
                "t=1,v1=".to_owned(),
                "signature is not 64 hexadecimal digits",
            ),
            (
                format!("t=1,v1={HEX_A}00"),
                "signature is not 64 hexadecimal digits",
            ),
            (format!("t=1, v1={HEX_A}"), "no v1= signature"),
        ];
        for (header, reason) in cases {
            assert_eq!(parse_stripe(&header), Err(Malformed(reason)), "{header:?}");
        }
    }

    #[test]
    fn standard_header_with_several_versions() {
        let header = format!("v1a,AAAA v1,{B64_A}  v1,{}", "A".repeat(43));
        let parsed = parse_standard(&header).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0][..3], [0x83, 0x48, 0x4c]);
        assert_eq!(parsed[1], [0u8; 32]);
    }

    #[test]
    fn standard_header_refusals_name_their_reason() {
        let cases = [
            ("", "no v1 signature"),
            ("   ", "no v1 signature"),
            ("v1a,AAAA", "no v1 signature"),
            ("v1", "entry without ','"),
            ("v1,not*base64*at*all", "signature is not base64"),
            ("v1,", "signature is not 32 bytes"),
            ("v1,aGVsbG8=", "signature is not 32 bytes"),
        ];
        for (header, reason) in cases {
            assert_eq!(parse_standard(header), Err(Malformed(reason)), "{header:?}");
        }
    }

    #[test]
    fn standard_entries_that_cannot_be_read_are_skipped_next_to_a_usable_one() {
        let good = format!("v1,{}", "A".repeat(43) + "=");
        for header in [
            format!("v1,AAAA {good}"),
            format!("{good} v1,not*base64"),
            format!("garbage {good}"),
            format!("v1a,xyz {good} v2,"),
        ] {
            assert_eq!(parse_standard(&header), Ok(vec![[0u8; 32]]), "{header:?}");
        }
    }

    #[test]
    fn github_header_needs_its_prefix() {
        assert_eq!(parse_github(&format!("sha256={HEX_A}")), Ok(tag(HEX_A)));
        assert_eq!(
            parse_github(&format!("sha256={}", HEX_A.to_uppercase())),
            Ok(tag(HEX_A))
        );
        assert_eq!(
            parse_github(HEX_A),
            Err(Malformed("value does not start with sha256="))
        );
        assert_eq!(
            parse_github(&format!("sha1={HEX_A}")),
            Err(Malformed("value does not start with sha256="))
        );
        assert_eq!(
            parse_github("sha256=abc"),
            Err(Malformed("signature is not 64 hexadecimal digits"))
        );
    }

    #[test]
    fn generic_header_follows_its_config() {
        let hex_plain = HmacConfig::default();
        assert_eq!(parse_generic(&hex_plain, HEX_A), Ok(tag(HEX_A)));
        assert!(parse_generic(&hex_plain, B64_A).is_err());

        let b64_prefixed = HmacConfig {
            encoding: Encoding::Base64,
            prefix: Some("sha256=".into()),
            ..HmacConfig::default()
        };
        let tag_a = parse_generic(&b64_prefixed, &format!("sha256={B64_A}")).unwrap();
        // Padding may be left out.
        let unpadded = B64_A.trim_end_matches('=');
        assert_eq!(
            parse_generic(&b64_prefixed, &format!("sha256={unpadded}")),
            Ok(tag_a)
        );
        assert_eq!(
            parse_generic(&b64_prefixed, B64_A),
            Err(Malformed("value does not start with the configured prefix"))
        );
        assert_eq!(
            parse_generic(&b64_prefixed, "sha256=!!"),
            Err(Malformed("signature is not base64"))
        );
    }
}
