//! Fuzzes `Idempotency-Key` parsing.
//!
//! Run with: `cargo +nightly fuzz run idempotency_key` (from the repository root).
//! Nothing may panic; an accepted key is 1 to 255 visible ASCII characters; its RFC 8941
//! string spelling names the same key; and surrounding white space changes nothing.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oncely_core::ClientKey;

fuzz_target!(|data: &[u8]| {
    let Ok(key) = ClientKey::parse(data) else {
        return;
    };
    let text = key.as_str();
    assert!((1..=255).contains(&text.len()), "{text:?}");
    assert!(text.bytes().all(|b| (0x21..=0x7e).contains(&b)), "{text:?}");
    let quoted = format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""));
    assert_eq!(ClientKey::parse(quoted.as_bytes()).as_ref(), Ok(&key));
    let mut padded = b" \t".to_vec();
    padded.extend_from_slice(data);
    padded.extend_from_slice(b"\t ");
    assert_eq!(ClientKey::parse(&padded).as_ref(), Ok(&key));
});
