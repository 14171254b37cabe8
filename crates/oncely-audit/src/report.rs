//! What the audit found, and its three renderings: JSON (the contract's shape plus a few
//! members), a human report, and a credits CSV with one line per principal to refund.
//!
//! `credit` is always a JSON number: the duplicate units when no price is given, the
//! money (`duplicate_units × price_per_unit`, rounded to six decimals) when one is.

use std::cmp::Ordering;
use std::io::{self, Write};

use serde::Serialize;

use crate::order::Unreadable;

/// The audit's answer. Field names and types of the contract's members are fixed.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Requests read.
    pub requests: u64,
    /// Units charged for them (a line without `units` counts one).
    pub units: u64,
    /// Requests that repeated an earlier identical one within the window.
    pub duplicate_requests: u64,
    /// Units charged for those repeats: what a guard would have saved.
    pub duplicate_units: u64,
    /// Repeats that started before their original finished (a guard joins them).
    pub during: u64,
    /// Repeats that started after their original finished (a guard replays them).
    pub after: u64,
    /// Repeats whose line carries an Idempotency-Key that no earlier request of their
    /// original carried, while one carried another: a retry loop that makes up a key per
    /// attempt (0 when no line carries a key; see `keyed_requests`).
    pub churned: u64,
    /// Lines that could not be read (see `unreadable_examples`).
    pub unreadable_lines: u64,
    /// Per principal, most to credit first.
    pub by_principal: Vec<PrincipalTotals>,
    /// `duplicate_units / units` (0 when there are no units).
    pub share: f64,
    /// `duplicate_requests / requests` (0 when there are no requests).
    pub request_share: f64,
    /// The whole credit: units, or money with `price_per_unit`.
    pub credit: Credit,
    /// The price used for `credit`, when one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub price_per_unit: Option<f64>,
    /// The window, as written (`3h`).
    pub window: String,
    /// The window in milliseconds.
    pub window_ms: u64,
    /// How long after their original the repeats came.
    pub delays: Delays,
    /// The originals repeated most, most first.
    pub top_repeats: Vec<TopRepeat>,
    /// The first unreadable lines, with where they are and why.
    pub unreadable_examples: Vec<UnreadableExample>,
    /// Requests that came earlier in time than one already judged (beyond the reorder
    /// buffer); they are judged all the same.
    pub out_of_order_lines: u64,
    /// Requests without `units` (each counted as one unit).
    pub units_missing: u64,
    /// Requests whose line carries an Idempotency-Key (only those can be `churned`).
    pub keyed_requests: u64,
    /// The inputs, in the order given.
    pub inputs: Vec<String>,
    /// Most originals remembered at once (memory is proportional to this).
    pub peak_originals: u64,
}

/// One principal's sums.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PrincipalTotals {
    /// The principal as it appears in the log.
    pub principal: String,
    /// Requests charged to it.
    pub requests: u64,
    /// Units charged to it.
    pub units: u64,
    /// Its repeats.
    pub duplicate_requests: u64,
    /// Units charged for its repeats.
    pub duplicate_units: u64,
    /// What to credit: `duplicate_units`, or money with a price.
    pub credit: Credit,
    /// Its repeats that started while their original ran.
    pub during: u64,
    /// Its repeats that started after their original finished.
    pub after: u64,
    /// Its repeats under an Idempotency-Key made up anew (see [`Report::churned`]).
    pub churned: u64,
    /// Its first repeats in time order, at most [`AuditArgs::listed_repeats`]
    /// (for statements; not part of the JSON report).
    ///
    /// [`AuditArgs::listed_repeats`]: crate::AuditArgs::listed_repeats
    #[serde(skip)]
    pub repeats: Vec<ListedRepeat>,
}

/// One repeat of a principal, as a statement lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListedRepeat {
    /// When it started (milliseconds since the epoch).
    pub ts: i64,
    /// Its method.
    pub method: String,
    /// Its path (with query).
    pub path: String,
    /// The units it was charged.
    pub units: u64,
    /// It started while its original ran (a guard joins it), else after (a guard replays
    /// it).
    pub during: bool,
}

/// A credit: units, or money when a price per unit is given. Serialises as a number.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
#[serde(untagged)]
pub enum Credit {
    /// Duplicate units (no price given).
    Units(u64),
    /// Money, rounded to six decimals.
    Money(f64),
}

impl Default for Credit {
    fn default() -> Credit {
        Credit::Units(0)
    }
}

impl Credit {
    pub(crate) fn of(units: u64, price: Option<f64>) -> Credit {
        match price {
            None => Credit::Units(units),
            Some(p) => Credit::Money((units as f64 * p * 1e6).round() / 1e6),
        }
    }

    /// The credit as a plain number.
    pub fn value(self) -> f64 {
        match self {
            Credit::Units(u) => u as f64,
            Credit::Money(m) => m,
        }
    }
}

impl std::fmt::Display for Credit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credit::Units(u) => f.write_str(&thousands(*u)),
            Credit::Money(m) => write!(f, "{m}"),
        }
    }
}

/// Delays of both kinds of repeat.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Delays {
    /// From the original's start to the repeat's start, for repeats during it.
    pub during: DelayStats,
    /// From the original's completion to the repeat's start, for repeats after it.
    pub after: DelayStats,
}

/// Bucket edges in milliseconds: <1s, 1s-10s, 10s-1m, 1m-10m, 10m-1h, 1h-3h, >=3h.
const EDGES: [u64; 6] = [1_000, 10_000, 60_000, 600_000, 3_600_000, 10_800_000];
const LABELS: [&str; 7] = [
    "<1s", "1s-10s", "10s-1m", "1m-10m", "10m-1h", "1h-3h", ">=3h",
];

/// A distribution of delays.
#[derive(Debug, Clone, Serialize)]
pub struct DelayStats {
    /// How many repeats.
    pub count: u64,
    /// Shortest delay (absent when there are none).
    pub min_ms: Option<u64>,
    /// Longest delay.
    pub max_ms: Option<u64>,
    /// Mean delay.
    pub mean_ms: Option<u64>,
    /// Counts per range.
    pub buckets: Vec<DelayBucket>,
    #[serde(skip)]
    total_ms: u128,
}

/// One range of a [`DelayStats`].
#[derive(Debug, Clone, Serialize)]
pub struct DelayBucket {
    /// `<1s`, `1s-10s`, ... `>=3h`.
    pub range: &'static str,
    /// Inclusive lower edge.
    pub from_ms: u64,
    /// Exclusive upper edge (absent for the last).
    pub to_ms: Option<u64>,
    /// Repeats in this range.
    pub count: u64,
}

impl Default for DelayStats {
    fn default() -> DelayStats {
        let buckets = (0..LABELS.len())
            .map(|i| DelayBucket {
                range: LABELS[i],
                from_ms: if i == 0 { 0 } else { EDGES[i - 1] },
                to_ms: EDGES.get(i).copied(),
                count: 0,
            })
            .collect();
        DelayStats {
            count: 0,
            min_ms: None,
            max_ms: None,
            mean_ms: None,
            buckets,
            total_ms: 0,
        }
    }
}

impl DelayStats {
    pub(crate) fn add(&mut self, ms: u64) {
        self.count += 1;
        self.total_ms += u128::from(ms);
        self.min_ms = Some(self.min_ms.map_or(ms, |m| m.min(ms)));
        self.max_ms = Some(self.max_ms.map_or(ms, |m| m.max(ms)));
        self.mean_ms = Some((self.total_ms / u128::from(self.count)) as u64);
        let i = EDGES.iter().position(|&e| ms < e).unwrap_or(EDGES.len());
        self.buckets[i].count += 1;
    }
}

/// An original that was repeated, for the "most repeated" list.
#[derive(Debug, Clone, Serialize)]
pub struct TopRepeat {
    /// Who sent it.
    pub principal: String,
    /// Its method.
    pub method: String,
    /// Its path and query.
    pub path: String,
    /// The audit's key of the request (the first 128 bits, in hex, of the SHA-256 of
    /// principal, method, path and canonical body).
    pub fingerprint: String,
    /// When the original started.
    pub first_seen: String,
    /// How long the original ran.
    pub duration_ms: u64,
    #[serde(skip)]
    pub(crate) source_file: u32,
    /// Where the original is: `FILE:LINE`.
    pub source: String,
    /// The original's line number.
    pub line: u64,
    /// Units of the original.
    pub units: u64,
    /// How often it was repeated within its window.
    pub repeats: u64,
    /// Units charged for the repeats.
    pub repeat_units: u64,
    /// Repeats while it ran.
    pub during: u64,
    /// Repeats after it finished.
    pub after: u64,
    /// Repeats under an Idempotency-Key made up anew (see [`Report::churned`]).
    pub churned: u64,
    /// The longest delay of a repeat (see [`Delays`]).
    pub max_delay_ms: u64,
}

impl TopRepeat {
    /// Most repeats first, then most repeated units, then earliest.
    pub(crate) fn rank(a: &TopRepeat, b: &TopRepeat) -> Ordering {
        b.repeats
            .cmp(&a.repeats)
            .then(b.repeat_units.cmp(&a.repeat_units))
            .then(a.first_seen.cmp(&b.first_seen))
            .then(a.fingerprint.cmp(&b.fingerprint))
    }
}

/// An unreadable line: where and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct UnreadableExample {
    /// The input's name.
    pub file: String,
    /// 1-based line number.
    pub line: u64,
    /// Why it was not read.
    pub reason: String,
}

impl UnreadableExample {
    pub(crate) fn from(u: &Unreadable, names: &[String]) -> UnreadableExample {
        UnreadableExample {
            file: names[u.file as usize].clone(),
            line: u.line,
            reason: u.reason.clone(),
        }
    }
}

impl Report {
    /// The contract's JSON document, one line.
    pub fn write_json(&self, out: &mut dyn Write) -> io::Result<()> {
        serde_json::to_writer(&mut *out, self)?;
        out.write_all(b"\n")
    }

    /// The credits file: a header, then one line per principal that has repeats.
    pub fn write_credits_csv(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "principal,duplicate_requests,duplicate_units,credit")?;
        for p in self
            .by_principal
            .iter()
            .filter(|p| p.duplicate_requests > 0)
        {
            let credit = match p.credit {
                Credit::Units(u) => u.to_string(),
                Credit::Money(m) => m.to_string(),
            };
            writeln!(
                out,
                "{},{},{},{}",
                csv_field(&p.principal),
                p.duplicate_requests,
                p.duplicate_units,
                credit
            )?;
        }
        Ok(())
    }

    /// The report for a person.
    pub fn write_human(&self, out: &mut dyn Write) -> io::Result<()> {
        let inputs = match self.inputs.len() {
            1 => self.inputs[0].clone(),
            n => format!("{n} inputs"),
        };
        writeln!(
            out,
            "{}: {} requests, {} units (window {})",
            inputs,
            thousands(self.requests),
            thousands(self.units),
            self.window
        )?;
        writeln!(
            out,
            "repeated an earlier identical request: {} requests ({}), {} units ({})",
            thousands(self.duplicate_requests),
            percent(self.request_share),
            thousands(self.duplicate_units),
            percent(self.share)
        )?;
        if self.duplicate_requests > 0 {
            writeln!(
                out,
                "  during the original (a guard joins): {}",
                thousands(self.during)
            )?;
            self.write_delays(out, &self.delays.during, "since the original started")?;
            writeln!(
                out,
                "  after the original finished (a guard replays): {}",
                thousands(self.after)
            )?;
            self.write_delays(out, &self.delays.after, "after the original finished")?;
        }
        if self.keyed_requests > 0 {
            self.write_churned(out)?;
        }
        match self.price_per_unit {
            Some(p) => writeln!(out, "to credit: {} (at {p} per unit)", self.credit)?,
            None => writeln!(out, "to credit: {} units", self.credit)?,
        }

        let owed: Vec<&PrincipalTotals> = self
            .by_principal
            .iter()
            .filter(|p| p.duplicate_requests > 0)
            .collect();
        if !owed.is_empty() {
            writeln!(out)?;
            let shown = owed.len().min(20);
            let width = owed[..shown]
                .iter()
                .map(|p| p.principal.chars().count())
                .max()
                .unwrap_or(0)
                .clamp(9, 40);
            writeln!(
                out,
                "{:<width$}  {:>10}  {:>12}  {:>10}  {:>12}  {:>12}",
                "principal", "requests", "units", "repeats", "rep. units", "credit"
            )?;
            for p in &owed[..shown] {
                writeln!(
                    out,
                    "{:<width$}  {:>10}  {:>12}  {:>10}  {:>12}  {:>12}",
                    truncate(&p.principal, 40),
                    thousands(p.requests),
                    thousands(p.units),
                    thousands(p.duplicate_requests),
                    thousands(p.duplicate_units),
                    p.credit.to_string()
                )?;
            }
            if owed.len() > shown {
                writeln!(
                    out,
                    "... and {} more principals (see --json or --credits-csv)",
                    thousands((owed.len() - shown) as u64)
                )?;
            }
        }

        if !self.top_repeats.is_empty() {
            writeln!(out)?;
            writeln!(out, "most repeated:")?;
            for t in &self.top_repeats {
                writeln!(
                    out,
                    "  {}x  {} {} {}  ({} units each time, {} repeated; original {} at {}, ran {}; last repeat up to {} later)",
                    t.repeats,
                    t.principal,
                    t.method,
                    truncate(&t.path, 60),
                    thousands(t.units),
                    thousands(t.repeat_units),
                    t.first_seen,
                    t.source,
                    human_ms(t.duration_ms),
                    human_ms(t.max_delay_ms)
                )?;
            }
        }

        if self.unreadable_lines > 0 {
            writeln!(out)?;
            writeln!(
                out,
                "unreadable lines: {} (not counted above)",
                thousands(self.unreadable_lines)
            )?;
            for u in &self.unreadable_examples {
                writeln!(out, "  {}:{}: {}", u.file, u.line, truncate(&u.reason, 120))?;
            }
        }
        if self.out_of_order_lines > 0 {
            writeln!(
                out,
                "out of time order (judged as read): {}",
                thousands(self.out_of_order_lines)
            )?;
        }
        if self.units_missing > 0 {
            writeln!(
                out,
                "requests without units (counted as 1 unit each): {}",
                thousands(self.units_missing)
            )?;
        }
        Ok(())
    }

    /// The churned repeats, and what they mean.
    fn write_churned(&self, out: &mut dyn Write) -> io::Result<()> {
        let (requests, them) = match self.churned {
            1 => ("request", "it"),
            _ => ("requests", "them"),
        };
        writeln!(
            out,
            "{} {requests} repeated an earlier one under a new key: a retry loop that makes up \
             a key per attempt; oncely's churn_window joins {them} to the original when its \
             caller never got its answer",
            thousands(self.churned)
        )
    }

    fn write_delays(&self, out: &mut dyn Write, d: &DelayStats, what: &str) -> io::Result<()> {
        if d.count == 0 {
            return Ok(());
        }
        writeln!(
            out,
            "    {} to {} {what} (mean {})",
            human_ms(d.min_ms.unwrap_or(0)),
            human_ms(d.max_ms.unwrap_or(0)),
            human_ms(d.mean_ms.unwrap_or(0))
        )?;
        let line: Vec<String> = d
            .buckets
            .iter()
            .filter(|b| b.count > 0)
            .map(|b| format!("{} {}", b.range, thousands(b.count)))
            .collect();
        writeln!(out, "    {}", line.join(" | "))
    }
}

/// `119160` → `119,160`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// `7_080_000` → `1h58m`, `16_000` → `16s`, `250` → `250ms`.
pub(crate) fn human_ms(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// RFC 4180: quoted when it holds a comma, quote or line break.
fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_durations_read_well() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(119_160), "119,160");
        assert_eq!(thousands(10_000_000), "10,000,000");
        assert_eq!(human_ms(250), "250ms");
        assert_eq!(human_ms(16_000), "16s");
        assert_eq!(human_ms(90_000), "1m30s");
        assert_eq!(human_ms(7_080_000), "1h58m");
    }

    #[test]
    fn delays_fall_in_their_buckets() {
        let mut d = DelayStats::default();
        for ms in [0, 999, 1_000, 16_000, 7_080_000, 10_800_000] {
            d.add(ms);
        }
        let counts: Vec<u64> = d.buckets.iter().map(|b| b.count).collect();
        assert_eq!(counts, [2, 1, 1, 0, 0, 1, 1]);
        assert_eq!((d.min_ms, d.max_ms), (Some(0), Some(10_800_000)));
        assert_eq!(d.buckets[6].to_ms, None);
    }

    #[test]
    fn credits_are_numbers_and_money_is_rounded() {
        assert_eq!(Credit::of(55_026, None), Credit::Units(55_026));
        assert_eq!(Credit::of(55_026, Some(0.00003)), Credit::Money(1.65078));
        assert_eq!(serde_json::to_string(&Credit::Units(3)).unwrap(), "3");
        assert_eq!(
            serde_json::to_string(&Credit::of(3, Some(0.1))).unwrap(),
            "0.3"
        );
    }

    #[test]
    fn csv_fields_are_quoted_when_needed() {
        assert_eq!(csv_field("acct_1"), "acct_1");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
