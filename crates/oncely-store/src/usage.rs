//! The usage history's arithmetic, shared by the backends: rows per principal, route and
//! hour, and how a record and a repeat event count in them when they are folded (at the
//! purge that deletes them, or when an expired record is renewed in place) and when a
//! reader adds what the ledger still holds to the history.
//!
//! A record counts one fresh execution (and its units) in the hour it completed, if it
//! completed; a repeat event counts `count` repeats (and its units) in the hour it was
//! answered, as joined or replayed. Each is counted exactly once: in the history after it
//! left the ledger, or by the readers while it is in the ledger, never both (the fold and
//! the delete are one write).

use std::collections::BTreeMap;

use oncely_core::{Record, State, Timestamp};

use crate::{hour_of, RepeatKind, Usage, UsageHour, UsageRow};

/// Usage rows keyed by (hour, principal, route): oldest hour first, then principal and
/// route.
#[derive(Debug, Default, Clone)]
pub(crate) struct Hours(BTreeMap<(i64, String, String), UsageHour>);

impl Hours {
    fn row(&mut self, principal: &str, route: &str, at: Timestamp) -> &mut UsageHour {
        let hour = hour_of(at);
        self.0
            .entry((hour.0, principal.to_owned(), route.to_owned()))
            .or_insert_with(|| UsageHour {
                principal: principal.to_owned(),
                route: route.to_owned(),
                hour,
                ..UsageHour::default()
            })
    }

    /// What `record` counts: one fresh execution in the hour it completed, if it did.
    pub(crate) fn add_record(&mut self, record: &Record) {
        if let (State::Completed, Some(done)) = (record.state, record.completed_at) {
            let row = self.row(&record.principal, &record.route, done);
            row.fresh += 1;
            row.fresh_units += record.units;
        }
    }

    /// What one repeat event counts, in the hour it was answered.
    pub(crate) fn add_repeat(
        &mut self,
        principal: &str,
        route: &str,
        at: Timestamp,
        kind: RepeatKind,
        count: u64,
        units: u64,
    ) {
        let row = self.row(principal, route, at);
        row.repeats += count;
        row.repeat_units += units;
        match kind {
            RepeatKind::Joined => row.joined += count,
            RepeatKind::Replayed => row.replayed += count,
        }
    }

    /// Adds a whole row (a history row, or one a store summed).
    pub(crate) fn add(&mut self, h: &UsageHour) {
        let row = self.row(&h.principal, &h.route, h.hour);
        row.fresh += h.fresh;
        row.fresh_units += h.fresh_units;
        row.repeats += h.repeats;
        row.repeat_units += h.repeat_units;
        row.joined += h.joined;
        row.replayed += h.replayed;
    }

    /// The rows, oldest hour first, then by principal and route.
    pub(crate) fn rows(&self) -> impl Iterator<Item = &UsageHour> {
        self.0.values()
    }

    pub(crate) fn into_rows(self) -> Vec<UsageHour> {
        self.0.into_values().collect()
    }

    /// Drops the hours that start before `before`; returns how many rows.
    pub(crate) fn purge_before(&mut self, before: Timestamp) -> u64 {
        let kept = self.0.split_off(&(before.0, String::new(), String::new()));
        let gone = self.0.len() as u64;
        self.0 = kept;
        gone
    }
}

/// Per-principal usage (most charged first) with totals, from rows per hour.
pub(crate) fn per_principal<'a>(rows: impl IntoIterator<Item = &'a UsageHour>) -> Usage {
    let mut by: BTreeMap<&str, UsageRow> = BTreeMap::new();
    for h in rows {
        let row = by.entry(&h.principal).or_insert_with(|| UsageRow {
            principal: h.principal.clone(),
            ..UsageRow::default()
        });
        row.fresh += h.fresh;
        row.fresh_units += h.fresh_units;
        row.repeats += h.repeats;
        row.repeat_units += h.repeat_units;
    }
    usage_from_rows(by.into_values().collect())
}

/// The first millisecond a period from `since` counts: the start of its hour (all when
/// `None`).
pub(crate) fn period_start(since: Option<Timestamp>) -> i64 {
    since.map_or(i64::MIN, |s| hour_of(s).0)
}

/// Sorts per-principal rows (most charged first) and adds the totals.
pub(crate) fn usage_from_rows(mut rows: Vec<UsageRow>) -> Usage {
    rows.sort_by(|a, b| {
        b.fresh_units
            .cmp(&a.fresh_units)
            .then(b.fresh.cmp(&a.fresh))
            .then(a.principal.cmp(&b.principal))
    });
    let mut totals = UsageRow::default();
    for r in &rows {
        totals.fresh += r.fresh;
        totals.fresh_units += r.fresh_units;
        totals.repeats += r.repeats;
        totals.repeat_units += r.repeat_units;
    }
    Usage {
        totals,
        by_principal: rows,
    }
}
