//! Fuzzes config parsing: TOML text in, a validated config or a list of problems out.
//!
//! Run with: `cargo +nightly fuzz run --fuzz-dir fuzz/heavy config` (from the repository
//! root).
//! Nothing may panic, and a config that resolves has route patterns that can be used.
#![no_main]

use libfuzzer_sys::fuzz_target;
use oncely::config::{Config, Overrides};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = Config::resolve(text, None, &Overrides::default()) else {
        return;
    };
    for route in &config.routes {
        let _ = route.path.matches("/v1/render");
        let _ = route.path.as_str();
    }
});
