//! Writes a synthetic request log for benchmarking `oncely audit`.
//!
//! Run with: `cargo run --release -p oncely-audit --example genlog -- 10000000 > /tmp/requests.jsonl`
//!
//! N lines (default 1,000,000) spread over one day from 2026-11-06T00:00Z, 2,000
//! principals, JSON bodies of 60-200 characters with a per-request `request_id`, units
//! and durations. About 10% of the lines repeat an earlier request of the same
//! principal (same body apart from `request_id`), up to 3 h later, as an assistant that
//! retries would; about a tenth of those are re-sent while the original still runs. The
//! output is deterministic (a fixed xorshift seed).

use std::io::{self, BufWriter, Write};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const WORDS: [&str; 16] = [
    "river", "quiet", "lantern", "morning", "voice", "harbour", "stone", "winter", "letter",
    "garden", "silver", "window", "north", "paper", "candle", "engine",
];

struct Sent {
    ts: i64,
    principal: u32,
    text: String,
    voice: u8,
    units: u64,
    duration_ms: u64,
}

fn main() -> io::Result<()> {
    let n: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("N must be a whole number"))
        .unwrap_or(1_000_000);
    let day_ms: i64 = 86_400_000;
    let start: i64 = 1_793_923_200_000; // 2026-11-06T00:00:00Z
    let step = day_ms as f64 / n as f64;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // Recent requests that may be repeated, newest last.
    let mut recent: std::collections::VecDeque<Sent> = std::collections::VecDeque::new();
    let mut out = BufWriter::with_capacity(1 << 20, io::stdout().lock());
    for i in 0..n {
        let ts = start + (i as f64 * step) as i64;
        while recent.front().is_some_and(|s| ts - s.ts > 3 * 3_600_000) {
            recent.pop_front();
        }
        let roll = rng.below(100);
        let repeat = if roll < 10 && !recent.is_empty() {
            // Mostly recent ones: pick from the newest part more often.
            let len = recent.len() as u64;
            let back = if roll < 3 {
                rng.below(len.min(200))
            } else {
                rng.below(len)
            };
            let s = &recent[(len - 1 - back) as usize];
            Some(Sent {
                ts,
                principal: s.principal,
                text: s.text.clone(),
                voice: s.voice,
                units: s.units,
                duration_ms: s.duration_ms,
            })
        } else {
            None
        };
        let is_repeat = repeat.is_some();
        let sent = repeat.unwrap_or_else(|| {
            let words = 8 + rng.below(24) as usize;
            let mut text = String::with_capacity(words * 8);
            for w in 0..words {
                if w > 0 {
                    text.push(' ');
                }
                text.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
            }
            let units = text.len() as u64;
            Sent {
                ts,
                principal: rng.below(2_000) as u32,
                text,
                voice: rng.below(6) as u8,
                units,
                duration_ms: 500 + rng.below(120_000),
            }
        });
        let ts_text = oncely_core::Timestamp(ts).to_rfc3339();
        writeln!(
            out,
            r#"{{"ts":"{ts_text}","principal":"acct_{:04}","method":"POST","path":"/v1/render","body":{{"text":"{}","voice":"v{}","speed":1.0,"request_id":"req_{i:x}"}},"units":{},"duration_ms":{},"status":200}}"#,
            sent.principal, sent.text, sent.voice, sent.units, sent.duration_ms
        )?;
        // Only originals are remembered: a copy is not copied again.
        if !is_repeat {
            recent.push_back(sent);
        }
    }
    out.flush()
}
