//! Statements that explain a bill: for one account, what it was charged and each repeat
//! it was not charged for (or, from a past log, was charged for and is owed), with the
//! totals, as Markdown or a self-contained HTML page a provider can send as it is. From
//! the ledger, the repeats of requests it still holds are listed one by one, the older
//! ones (their requests have left it, their counts kept in the usage history) summed per
//! route and hour, and the statement says which is which.
//!
//! `oncely usage --statement` fills a [`Statement`] from the ledger, `oncely audit
//! --statements` one per principal from the audit's findings; both render here.

use std::fmt::Write as _;

use oncely_core::Timestamp;

/// How a statement is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Format {
    /// Markdown (default).
    #[default]
    Md,
    /// One self-contained HTML page.
    Html,
}

impl Format {
    /// The file extension.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Md => "md",
            Format::Html => "html",
        }
    }
}

/// How one repeat was (or, from a log, would have been) answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// It came while the original ran and got the original's answer.
    Joined,
    /// It came after the original finished and got the stored answer.
    Replayed,
}

impl Answer {
    fn text(self) -> &'static str {
        match self {
            Answer::Joined => "joined a running original",
            Answer::Replayed => "replayed a finished one",
        }
    }
}

/// One listed repeat (or a few of one kind the gateway counted together).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// When it came (the first of them).
    pub at: Timestamp,
    /// The route (or method and path, from a log).
    pub route: String,
    /// How many repeats the line is: 1, unless the gateway had to count several together
    /// (it held them while the ledger was away).
    pub count: u64,
    /// The units it was not charged (or was charged and is owed), together.
    pub units: u64,
    /// Joined or replayed.
    pub answer: Answer,
}

impl Line {
    fn answer_text(&self) -> String {
        match self.count {
            1 => self.answer.text().to_owned(),
            n => format!("{} ({n} repeats, counted together)", self.answer.text()),
        }
    }
}

/// The repeats of one route in one hour whose requests have left the ledger, summed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HourLine {
    /// The start of the hour.
    pub hour: Timestamp,
    /// The route.
    pub route: String,
    /// How many repeats.
    pub count: u64,
    /// The units they were not charged.
    pub units: u64,
    /// Of them, those that joined a running original.
    pub joined: u64,
    /// Of them, those that replayed a finished one.
    pub replayed: u64,
}

impl HourLine {
    /// `2026-12-01 18:00–19:00`.
    fn hour_text(&self) -> String {
        let start = self.hour.to_rfc3339();
        let end = self
            .hour
            .plus(std::time::Duration::from_secs(3600))
            .to_rfc3339();
        format!("{} {}–{}", &start[..10], &start[11..16], &end[11..16])
    }

    fn answers_text(&self) -> String {
        let mut parts = Vec::new();
        if self.joined > 0 {
            parts.push(format!("{} {}", self.joined, Answer::Joined.text()));
        }
        if self.replayed > 0 {
            parts.push(format!("{} {}", self.replayed, Answer::Replayed.text()));
        }
        parts.join(", ")
    }
}

/// Where the figures come from, which decides what the repeats mean for the bill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The gateway's ledger: repeats were answered from it and not charged.
    Ledger,
    /// A request log audited afterwards: repeats were charged, and are owed back.
    Audit {
        /// The credit owed, as written (units, or money with its price).
        credit: String,
    },
}

/// One account's statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The account as the provider knows it.
    pub account: String,
    /// Its keyed hash in the ledger, when that is not what `account` shows.
    pub account_hash: Option<String>,
    /// The period, in words.
    pub period: String,
    /// When the statement was made.
    pub generated: Timestamp,
    /// The figures' origin.
    pub source: Source,
    /// Executions charged (from a log: every request, repeats included).
    pub charged: u64,
    /// Their units.
    pub charged_units: u64,
    /// Every repeat in the period.
    pub repeats: u64,
    /// Their units.
    pub repeat_units: u64,
    /// The first repeats, oldest first (at most a cap; `repeats` counts them all).
    pub lines: Vec<Line>,
    /// Repeats of requests that have left the ledger, per route and hour, oldest first
    /// (from the ledger only; `repeats` counts them too).
    pub older: Vec<HourLine>,
}

impl Statement {
    /// The statement in `format`.
    pub fn render(&self, format: Format) -> String {
        match format {
            Format::Md => self.markdown(),
            Format::Html => self.html(),
        }
    }

    /// The summary rows: (label, requests, units).
    fn summary(&self) -> Vec<(&'static str, u64, u64)> {
        match self.source {
            Source::Ledger => vec![
                ("Charged: executed", self.charged, self.charged_units),
                (
                    "Not charged: repeats answered from the ledger",
                    self.repeats,
                    self.repeat_units,
                ),
            ],
            Source::Audit { .. } => vec![
                ("Charged: every request", self.charged, self.charged_units),
                (
                    "Of them, repeats of an identical request (owed back)",
                    self.repeats,
                    self.repeat_units,
                ),
            ],
        }
    }

    fn repeats_title(&self) -> &'static str {
        match self.source {
            Source::Ledger => "Repeats not charged",
            Source::Audit { .. } => "Repeats charged that a guard would have answered",
        }
    }

    fn more(&self) -> Option<String> {
        let shown = self.lines.iter().map(|l| l.count).sum::<u64>()
            + self.older.iter().map(|h| h.count).sum::<u64>();
        let more = self.repeats.saturating_sub(shown);
        (more > 0).then(|| format!("and {more} more (the totals above count every one)"))
    }

    /// What the listed repeats' answers mean (from the ledger).
    fn legend(&self) -> Option<&'static str> {
        (self.source == Source::Ledger && !self.lines.is_empty()).then_some(
            "Each repeat of a request the gateway still keeps, one by one: when it came, \
             the units it was not charged, and how it was answered. \"Joined a running \
             original\": it came while the first request was still being carried out, and \
             got that request's result when it was ready. \"Replayed a finished one\": it \
             came after the first request had finished, and got its stored result. Either \
             way the work was done, and charged, once.",
        )
    }

    /// What the summed older repeats are.
    const OLDER_TITLE: &'static str = "Earlier repeats not charged, per hour";
    const OLDER_TEXT: &'static str =
        "The gateway keeps each request, and its repeats one by one, for a limited time \
         (the route's window); after that it keeps only their counts, per route and hour. \
         So these earlier repeats are summed per hour (UTC). They were not charged either, \
         and the totals above count them.";

    fn markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# Usage statement\n");
        let _ = writeln!(out, "- Account: {}", md(&self.account));
        if let Some(hash) = &self.account_hash {
            let _ = writeln!(out, "- Principal hash: {}", md(hash));
        }
        let _ = writeln!(out, "- Period: {}", md(&self.period));
        let _ = writeln!(out, "- Generated: {}", self.generated.to_rfc3339());
        if let Source::Audit { credit } = &self.source {
            let _ = writeln!(out, "- Credit owed: {}", md(credit));
        }
        let _ = writeln!(out, "\n## Totals\n");
        let _ = writeln!(out, "| | requests | units |\n| --- | ---: | ---: |");
        for (label, n, units) in self.summary() {
            let _ = writeln!(out, "| {label} | {n} | {units} |");
        }
        let _ = writeln!(out, "\n## {}\n", self.repeats_title());
        if self.lines.is_empty() && self.older.is_empty() {
            let _ = writeln!(out, "None.");
        }
        if !self.lines.is_empty() {
            if let Some(legend) = self.legend() {
                let _ = writeln!(out, "{legend}\n");
            }
            let _ = writeln!(
                out,
                "| time (UTC) | route | units | answer |\n| --- | --- | ---: | --- |"
            );
            for l in &self.lines {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} |",
                    l.at.to_rfc3339(),
                    md(&l.route),
                    l.units,
                    l.answer_text()
                );
            }
        }
        if !self.older.is_empty() {
            // A blank line after the table above, if there is one.
            let gap = if self.lines.is_empty() { "" } else { "\n" };
            let _ = writeln!(
                out,
                "{gap}### {}\n\n{}\n",
                Self::OLDER_TITLE,
                Self::OLDER_TEXT
            );
            let _ = writeln!(
                out,
                "| hour (UTC) | route | repeats | units | answers |\n| --- | --- | ---: | ---: | --- |"
            );
            for h in &self.older {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} |",
                    h.hour_text(),
                    md(&h.route),
                    h.count,
                    h.units,
                    h.answers_text()
                );
            }
        }
        if let Some(more) = self.more() {
            let _ = writeln!(out, "\n{more}");
        }
        out
    }

    fn html(&self) -> String {
        let mut out = String::new();
        let _ = write!(
            out,
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <title>Usage statement: {}</title>\n<style>\n\
             body{{font-family:system-ui,sans-serif;margin:2em;color:#222}}\n\
             table{{border-collapse:collapse;margin:1em 0}}\n\
             th,td{{border:1px solid #ccc;padding:.3em .6em;text-align:left}}\n\
             td.n{{text-align:right}}\n</style>\n</head>\n<body>\n<h1>Usage statement</h1>\n<dl>\n",
            html(&self.account)
        );
        let mut item = |k: &str, v: &str| {
            let _ = writeln!(out, "<dt>{k}</dt><dd>{}</dd>", html(v));
        };
        item("Account", &self.account);
        if let Some(hash) = &self.account_hash {
            item("Principal hash", hash);
        }
        item("Period", &self.period);
        item("Generated", &self.generated.to_rfc3339());
        if let Source::Audit { credit } = &self.source {
            item("Credit owed", credit);
        }
        let _ = writeln!(
            out,
            "</dl>\n<h2>Totals</h2>\n<table>\n<tr><th></th><th>requests</th><th>units</th></tr>"
        );
        for (label, n, units) in self.summary() {
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td class=\"n\">{n}</td><td class=\"n\">{units}</td></tr>",
                html(label)
            );
        }
        let _ = writeln!(out, "</table>\n<h2>{}</h2>", html(self.repeats_title()));
        if self.lines.is_empty() && self.older.is_empty() {
            let _ = writeln!(out, "<p>None.</p>");
        }
        if !self.lines.is_empty() {
            if let Some(legend) = self.legend() {
                let _ = writeln!(out, "<p>{}</p>", html(legend));
            }
            let _ = writeln!(
                out,
                "<table>\n<tr><th>time (UTC)</th><th>route</th><th>units</th><th>answer</th></tr>"
            );
            for l in &self.lines {
                let _ = writeln!(
                    out,
                    "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                    html(&l.at.to_rfc3339()),
                    html(&l.route),
                    l.units,
                    html(&l.answer_text())
                );
            }
            let _ = writeln!(out, "</table>");
        }
        if !self.older.is_empty() {
            let _ = writeln!(
                out,
                "<h3>{}</h3>\n<p>{}</p>\n<table class=\"older\">\n<tr><th>hour (UTC)</th><th>route</th><th>repeats</th><th>units</th><th>answers</th></tr>",
                html(Self::OLDER_TITLE),
                html(Self::OLDER_TEXT)
            );
            for h in &self.older {
                let _ = writeln!(
                    out,
                    "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                    html(&h.hour_text()),
                    html(&h.route),
                    h.count,
                    h.units,
                    html(&h.answers_text())
                );
            }
            let _ = writeln!(out, "</table>");
        }
        if let Some(more) = self.more() {
            let _ = writeln!(out, "<p>{}</p>", html(&more));
        }
        out.push_str("</body>\n</html>\n");
        out
    }
}

/// Text for HTML content and attribute values.
pub fn html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Text for a Markdown table cell or list item: markup characters escaped, line breaks
/// flattened, so that a value from outside cannot change the document's shape.
fn md(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' | '`' | '*' | '[' | ']' | '<' | '>' | '|' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// A file name for `principal`'s statement: its safe characters, and a short hash of it
/// when any were left out (so that two principals never share a file).
pub fn file_name(principal: &str, format: Format) -> String {
    use sha2::{Digest, Sha256};
    let safe: String = principal
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
        .take(64)
        .collect();
    let safe = safe.trim_start_matches('.');
    let name = if safe == principal && !safe.is_empty() {
        safe.to_owned()
    } else {
        let digest = Sha256::digest(principal.as_bytes());
        format!("{safe}-{}", &hex::encode(digest)[..12])
    };
    format!("statement-{name}.{}", format.extension())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn statement(account: &str) -> Statement {
        Statement {
            account: account.into(),
            account_hash: None,
            period: "all".into(),
            generated: Timestamp(0),
            source: Source::Ledger,
            charged: 2,
            charged_units: 20,
            repeats: 3,
            repeat_units: 30,
            lines: vec![Line {
                at: Timestamp(1_000),
                route: "<b>POST /x</b>".into(),
                count: 1,
                units: 10,
                answer: Answer::Joined,
            }],
            older: Vec::new(),
        }
    }

    #[test]
    fn older_repeats_are_summed_per_hour_and_said_so() {
        let mut s = statement("acct");
        s.repeats = 6;
        s.lines[0].count = 2;
        s.lines[0].answer = Answer::Replayed;
        s.older = vec![HourLine {
            hour: Timestamp::parse_rfc3339("2026-12-01T23:00:00Z").unwrap(),
            route: "POST /x".into(),
            count: 3,
            units: 12,
            joined: 1,
            replayed: 2,
        }];
        let text = s.render(Format::Md);
        assert!(
            text.contains("replayed a finished one (2 repeats, counted together) |"),
            "{text}"
        );
        assert!(
            text.contains("### Earlier repeats not charged, per hour"),
            "{text}"
        );
        assert!(
            text.contains("| 2026-12-01 23:00–00:00 | POST /x | 3 | 12 | 1 joined a running original, 2 replayed a finished one |"),
            "{text}"
        );
        assert!(text.contains("and 1 more"), "{text}");
        let page = s.render(Format::Html);
        assert!(page.contains("<table class=\"older\">"), "{page}");
        assert!(
            page.contains("<td>2026-12-01 23:00–00:00</td><td>POST /x</td><td class=\"n\">3</td>"),
            "{page}"
        );
    }

    #[test]
    fn html_escapes_every_value() {
        let page = statement("<script>alert(1)</script>").render(Format::Html);
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(page.contains("&lt;b&gt;POST /x&lt;/b&gt;"));
        assert!(page.contains("and 2 more"));
    }

    #[test]
    fn markdown_values_cannot_break_the_table() {
        let text = statement("a|b\n# c").render(Format::Md);
        assert!(text.contains("- Account: a\\|b # c"), "{text}");
        assert!(text.contains("| 1970-01-01T00:00:01.000Z | \\<b\\>POST /x\\</b\\> | 10 | joined a running original |"), "{text}");
    }

    #[test]
    fn file_names_are_safe_and_distinct() {
        assert_eq!(file_name("acct_1", Format::Md), "statement-acct_1.md");
        let a = file_name("../etc/passwd", Format::Html);
        assert!(
            a.starts_with("statement-etcpasswd-") && a.ends_with(".html"),
            "{a}"
        );
        assert_ne!(file_name("a/b", Format::Md), file_name("a\\b", Format::Md));
    }
}
