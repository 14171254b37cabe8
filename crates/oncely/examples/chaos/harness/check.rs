//! The history checker. For every intention:
//!
//! - all its executions carried one downstream key;
//! - an `action` executed at most once, ever;
//! - a `write` or `job` executed again only after a gateway was killed, or after an
//!   upstream failure on that key (a proxy fault, or a 502/504 the gateway answered);
//! - every answer was the result of one of its own executions, or a documented refusal
//!   (409 `in_flight`; 409 `outcome_unknown` for an `action`; 502, 503 `store_unavailable`,
//!   504; 202 for a job), and callers got one execution's result unless a gateway was
//!   killed between two;
//! - after the faults stopped it got a final answer (a result; `outcome_unknown` for an
//!   action): otherwise its answer is lost;
//! - a webhook event acknowledged with 200 was delivered, with its id as the key, and again
//!   only after a kill or a fault on that delivery;
//!
//! and once the run settles, `oncely ledger list` shows no record `processing`.
//!
//! A key-churn intention (`agents::churn_agent`: a new `Idempotency-Key` on every attempt,
//! a retry only while its caller has no answer) is one body, whatever its keys, and is
//! held to the same: at most one execution (a write again only after a kill or an upstream
//! failure), its answers its own. Its executions may carry several downstream keys only
//! where a second run is excused anyway; a run of a record seen before is held to that
//! record's last run, a run of a new record to the run before it. Two cases are the
//! gateway's to lose and are counted apart, not hidden:
//!
//! - an attempt cut by a SIGKILL of the instance serving it (running, or its caller gone
//!   less than 1 s before) takes with it the evidence that its caller left, so the next
//!   key runs it again as a new request ("churn lost to a kill"), and the killed attempt's
//!   record stays `processing` (its key is never sent again): records of the key-churn
//!   routes left processing are allowed up to the number of attempts a kill cut, no more;
//! - a new key sent to another instance less than [`NOTIFIED_WITHIN`] after the caller
//!   left the first one may come before the first instance's word (its write, and the
//!   database's notification) reached it: the documented window of two instances on one
//!   PostgreSQL, where a fresh claim asks the ledger nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use super::journal::{Attempt, Class, Entries, Exec, Intent, Outcome};
use super::{Fault, StoreKind};

/// One broken promise, with the intention's history.
#[derive(Debug)]
pub(crate) struct Violation {
    pub(crate) intent: String,
    pub(crate) rule: String,
    pub(crate) history: Vec<String>,
    /// The kinds of the faults around it (from 2 s before its first request or execution
    /// to 3 s after its last execution): where to look first.
    pub(crate) around: Vec<&'static str>,
}

/// The figures and violations of one store's phase.
#[derive(Debug, Default)]
pub(crate) struct PhaseReport {
    pub(crate) store: &'static str,
    pub(crate) seconds: u64,
    pub(crate) settled_in: f64,
    pub(crate) requests: usize,
    pub(crate) sweep_requests: usize,
    pub(crate) outcomes: BTreeMap<String, usize>,
    pub(crate) faults: BTreeMap<&'static str, usize>,
    /// Per class: how many intentions had N executions.
    pub(crate) executions: BTreeMap<&'static str, BTreeMap<usize, usize>>,
    pub(crate) intents: usize,
    pub(crate) events_acknowledged: usize,
    pub(crate) deliveries: usize,
    pub(crate) processing_left: usize,
    pub(crate) lost: usize,
    pub(crate) violations: Vec<Violation>,
    pub(crate) churn: ChurnFigures,
}

/// What the key-churn intentions did.
#[derive(Debug, Default)]
pub(crate) struct ChurnFigures {
    pub(crate) intents: usize,
    /// Attempts under a made-up key (the sweep's included).
    pub(crate) attempts: usize,
    /// Answers with `Oncely-Key-Churn`: a new key joined an earlier key's record.
    pub(crate) joined: usize,
    /// Attempts cut by a SIGKILL of the instance serving them.
    pub(crate) cut_by_kill: usize,
    /// Second runs under a new record after such a cut, allowed, one line each.
    pub(crate) lost_to_kill: Vec<String>,
    /// Second runs of a write under a new record after an upstream failure its caller was
    /// answered (502/504, retry): allowed as for every write.
    pub(crate) after_upstream_failure: usize,
    /// Second runs under a new record whose key went to another instance less than
    /// [`NOTIFIED_WITHIN`] after the caller left the first: the documented window before
    /// the first instance's word reaches the second. Allowed, one line each.
    pub(crate) before_notified: Vec<String>,
    /// Records of the key-churn routes left `processing` (allowed up to `cut_by_kill`).
    pub(crate) processing_left: usize,
}

impl PhaseReport {
    /// A phase that could not run.
    pub(crate) fn failed(store: StoreKind, why: String) -> PhaseReport {
        PhaseReport {
            store: store.name(),
            violations: vec![Violation {
                intent: "-".into(),
                rule: format!("the phase could not run: {why}"),
                history: Vec::new(),
                around: Vec::new(),
            }],
            ..PhaseReport::default()
        }
    }
}

impl fmt::Display for PhaseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "[{}] {} s under faults, settled in {:.1} s; {} intentions; {} requests ({} in the settling sweep)",
            self.store, self.seconds, self.settled_in, self.intents, self.requests, self.sweep_requests
        )?;
        let join = |m: &BTreeMap<String, usize>| {
            m.iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        writeln!(f, "  answers: {}", join(&self.outcomes))?;
        let faults: BTreeMap<String, usize> = self
            .faults
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .collect();
        writeln!(f, "  faults injected: {}", join(&faults))?;
        for (class, hist) in &self.executions {
            let h: Vec<String> = hist
                .iter()
                .map(|(n, count)| format!("{count} x {n}"))
                .collect();
            writeln!(f, "  executions per {class} intention: {}", h.join(", "))?;
        }
        let c = &self.churn;
        writeln!(
            f,
            "  key churn: {} intentions, {} attempts each under a new key, {} answers joined an earlier key's record (Oncely-Key-Churn); {} attempts cut by a kill, churn lost to a kill (ran again, allowed): {}; run again after an answered upstream failure (allowed): {}; a new key on another instance before the word of the caller that left reached it (allowed, under {} ms): {}; their records left processing (allowed up to the cuts): {}",
            c.intents,
            c.attempts,
            c.joined,
            c.cut_by_kill,
            c.lost_to_kill.len(),
            c.after_upstream_failure,
            NOTIFIED_WITHIN * 1000.0,
            c.before_notified.len(),
            c.processing_left
        )?;
        for l in &c.lost_to_kill {
            writeln!(f, "    churn lost to a kill: {l}")?;
        }
        for l in &c.before_notified {
            writeln!(f, "    before the word reached the other instance: {l}")?;
        }
        writeln!(
            f,
            "  webhook events acknowledged: {}, deliveries: {}",
            self.events_acknowledged, self.deliveries
        )?;
        writeln!(
            f,
            "  records left processing: {}; answers lost: {}; violations: {}",
            self.processing_left,
            self.lost,
            self.violations.len()
        )?;
        let mut by_fault: BTreeMap<String, usize> = BTreeMap::new();
        for v in &self.violations {
            let key = if v.around.is_empty() {
                "no fault".to_owned()
            } else {
                v.around.join("+")
            };
            *by_fault.entry(key).or_default() += 1;
        }
        if !by_fault.is_empty() {
            writeln!(
                f,
                "  violations by the faults around them: {}",
                join(&by_fault)
            )?;
        }
        for v in &self.violations {
            writeln!(f, "  VIOLATION {} [{}]: {}", v.intent, self.store, v.rule)?;
            if !v.around.is_empty() {
                writeln!(f, "      faults around it: {}", v.around.join(", "))?;
            }
            for h in &v.history {
                writeln!(f, "      {h}")?;
            }
        }
        Ok(())
    }
}

fn describe(o: &Outcome) -> String {
    match o {
        Outcome::Answer {
            status,
            oncely,
            code,
            exec,
            churned,
            ..
        } => {
            let mut s = status.to_string();
            if !oncely.is_empty() {
                s.push(' ');
                s.push_str(oncely);
            }
            if !code.is_empty() {
                s.push(' ');
                s.push_str(code);
            }
            if let Some(e) = exec {
                s.push_str(&format!(" exec #{e}"));
            }
            if !churned.is_empty() {
                s.push_str(&format!(" key-churn {churned}"));
            }
            s
        }
        Outcome::NoAnswer(why) => format!("no answer ({why})"),
    }
}

/// A short name for the figures.
fn bucket(o: &Outcome) -> String {
    match o {
        Outcome::Answer {
            status,
            oncely,
            code,
            ..
        } => {
            let what = if code.is_empty() { oncely } else { code };
            format!("{status} {what}").trim().to_owned()
        }
        Outcome::NoAnswer(why) if why.contains("gave up") => "caller gave up".into(),
        Outcome::NoAnswer(why) if why.contains("down") => "instance down".into(),
        Outcome::NoAnswer(_) => "connection error".into(),
    }
}

/// Whether `o` is allowed for `class`; else why not.
fn documented(intent: &Intent, o: &Outcome, execs: &[&Exec]) -> Result<(), String> {
    let Outcome::Answer {
        status,
        code,
        exec,
        answered,
        ..
    } = o
    else {
        return Ok(());
    };
    let class = intent.class;
    match (*status, code.as_str()) {
        (200, _) if class == Class::Event => Ok(()),
        (202, "") if class == Class::Job => Ok(()),
        (200..=299, "") if class != Class::Event && *status != 202 => {
            if answered.as_deref() != Some(intent.id.as_str()) {
                return Err(format!(
                    "a {status} answer carried intention {answered:?}, not {}",
                    intent.id
                ));
            }
            match exec {
                Some(e) if execs.iter().any(|x| x.id == *e) => Ok(()),
                _ => Err(format!(
                    "a {status} answer carried execution {exec:?}, which never ran for it"
                )),
            }
        }
        (409, "in_flight") if class != Class::Event => Ok(()),
        (409, "outcome_unknown") if class == Class::Action => Ok(()),
        (502, _) | (504, _) if class != Class::Event => Ok(()),
        (503, "store_unavailable") => Ok(()),
        _ => Err(format!("undocumented answer {}", describe(o))),
    }
}

/// What excuses a second execution (or delivery): a kill between the two, an upstream
/// failure the gateway answered (502/504) between them (the first run's failure, not the
/// second's), or a proxy fault that hit the first
/// one (a fault on its key, journalled when its request reached the proxy, at most 1.6 s
/// before the upstream received it: the longest delay). A reset before sending never
/// reaches the upstream, so it hits no execution.
struct Excuses<'a> {
    kills: Vec<f64>,
    /// The kills, with the instance each killed.
    killed_instance: Vec<(f64, Option<usize>)>,
    keyed: BTreeMap<&'a str, Vec<(f64, Fault)>>,
}

impl Excuses<'_> {
    /// Whether the run at `at` (after an earlier one at `previous`) of `key` was hit.
    fn hit(&self, key: &str, previous: f64, at: f64) -> bool {
        self.keyed.get(key).is_some_and(|ts| {
            ts.iter().any(|(t, kind)| {
                *kind != Fault::ProxyResetBefore
                    && *t > previous
                    && (at - 1.6..=at + 0.01).contains(t)
            })
        })
    }

    /// A kill from just before `t0` on counts: a request the dead gateway had sent can
    /// reach the upstream a little after it died.
    fn killed(&self, t0: f64, t1: f64) -> bool {
        self.kills.iter().any(|t| (t0 - 0.5..=t1).contains(t))
    }

    /// The kills that cut one of `attempts`: the instance it was sent to SIGKILLed while it
    /// ran, or less than 1 s after it ended without an answer (the gateway writes that its
    /// caller left a moment after it left). The times of those kills.
    fn cuts(&self, attempts: &[&Attempt]) -> Vec<f64> {
        let mut at: Vec<f64> = attempts
            .iter()
            .filter(|a| matches!(a.outcome, Outcome::NoAnswer(_)))
            .flat_map(|a| {
                self.killed_instance
                    .iter()
                    .filter(move |(t, i)| {
                        (*i == Some(a.instance) || i.is_none()) && (a.at..=a.end + 1.0).contains(t)
                    })
                    .map(|(t, _)| *t)
            })
            .collect();
        at.sort_by(f64::total_cmp);
        at.dedup();
        at
    }

    /// Whether running `key` again at `t1` after `t0` (the run before that at `before`)
    /// is excused.
    fn excused(&self, key: &str, failures: &[(f64, f64)], before: f64, t0: f64, t1: f64) -> bool {
        self.killed(t0, t1)
            || self.hit(key, before, t0)
            || failures.iter().any(|(_, e)| (t0..=t1 + 0.05).contains(e))
    }
}

/// The longest any request may wait for its answer, in seconds: the harness's route
/// `timeout` (3 s, longer than its `wait`, 1 s), then one ledger operation's bound
/// (10 s: an owner's completion that the ledger does not take in time no longer holds
/// the answer back, a claim or a read that gets no answer fails), and 4 s for a busy
/// machine. A caller that waits longer than this (see `agents`) and gets no answer, or
/// an answer after it, shows an entry point that hung on the ledger.
pub(crate) const ANSWER_LIMIT: f64 = 17.0;

pub(crate) fn check(
    store: StoreKind,
    duration: Duration,
    settled_in: f64,
    e: Entries,
    unresolved: Vec<String>,
    undelivered: Vec<String>,
    processing: Vec<String>,
) -> PhaseReport {
    let mut r = PhaseReport {
        store: store.name(),
        seconds: duration.as_secs(),
        settled_in,
        requests: e.attempts.len(),
        sweep_requests: e.attempts.iter().filter(|a| a.sweep).count(),
        intents: e.intents.len(),
        deliveries: e.deliveries.len(),
        processing_left: processing.len(),
        ..PhaseReport::default()
    };
    for a in &e.attempts {
        *r.outcomes.entry(bucket(&a.outcome)).or_default() += 1;
    }
    for f in &e.faults {
        if !f.detail.contains("failed") {
            *r.faults.entry(f.kind.name()).or_default() += 1;
        }
    }
    let excuses = Excuses {
        kills: e
            .faults
            .iter()
            .filter(|f| f.kind == Fault::Kill)
            .map(|f| f.at)
            .collect(),
        killed_instance: e
            .faults
            .iter()
            .filter(|f| f.kind == Fault::Kill && f.detail.starts_with("SIGKILL instance "))
            .map(|f| {
                let i = f.detail["SIGKILL instance ".len()..].trim().parse().ok();
                (f.at, i)
            })
            .collect(),
        keyed: {
            let mut m: BTreeMap<&str, Vec<(f64, Fault)>> = BTreeMap::new();
            for f in &e.faults {
                if let Some(k) = &f.key {
                    m.entry(k.as_str()).or_default().push((f.at, f.kind));
                }
            }
            m
        },
    };
    let mut by_intent: BTreeMap<&str, Vec<&Attempt>> = BTreeMap::new();
    for a in &e.attempts {
        by_intent.entry(a.intent.as_str()).or_default().push(a);
    }
    let unresolved: BTreeSet<String> = unresolved.into_iter().collect();
    let undelivered: BTreeSet<String> = undelivered.into_iter().collect();
    for intent in e.intents.values() {
        let attempts = by_intent.remove(intent.id.as_str()).unwrap_or_default();
        let mut execs: Vec<&Exec> = e.execs.iter().filter(|x| x.intent == intent.id).collect();
        execs.sort_by(|a, b| a.at.total_cmp(&b.at));
        let deliveries: Vec<_> = e
            .deliveries
            .iter()
            .filter(|d| d.intent == intent.id)
            .collect();
        if intent.class == Class::Event {
            *r.executions
                .entry("webhook event (deliveries)")
                .or_default()
                .entry(deliveries.len())
                .or_default() += 1;
        } else {
            let class = match (intent.churn, intent.class) {
                (true, Class::Action) => "action (key churn)",
                (true, _) => "write (key churn)",
                (false, c) => c.name(),
            };
            *r.executions
                .entry(class)
                .or_default()
                .entry(execs.len())
                .or_default() += 1;
        }
        let failures: Vec<(f64, f64)> = attempts
            .iter()
            .filter(|a| {
                matches!(
                    a.outcome,
                    Outcome::Answer {
                        status: 502 | 504,
                        ..
                    }
                )
            })
            .map(|a| (a.at, a.end))
            .collect();
        let mut broken: Vec<String> = Vec::new();
        let keys: BTreeSet<&str> = execs.iter().map(|x| x.key.as_str()).collect();
        if keys.len() > 1 && !intent.churn {
            broken.push(format!(
                "executions carried {} different downstream keys",
                keys.len()
            ));
        }
        if intent.churn {
            churn_rules(
                intent,
                &execs,
                &attempts,
                &failures,
                &excuses,
                &mut r.churn,
                &mut broken,
            );
        }
        match intent.class {
            _ if intent.churn => {}
            Class::Action if execs.len() > 1 => {
                broken.push(format!("action executed {} times", execs.len()));
            }
            Class::Write | Class::Job => {
                for (n, w) in execs.windows(2).enumerate() {
                    let before = if n > 0 { execs[n - 1].at } else { -1.0 };
                    if !excuses.excused(&w[0].key, &failures, before, w[0].at, w[1].at) {
                        broken.push(format!(
                            "executed again (exec #{} after #{}) with no crash and no upstream failure in between",
                            w[1].id, w[0].id
                        ));
                    }
                }
            }
            _ => {}
        }
        // An action that ran is `outcome_unknown` only when something went wrong with that
        // run: a kill, a fault that hit it, or an upstream failure the gateway answered.
        // One that never ran is `outcome_unknown` only after a kill, a proxy fault (its
        // downstream key is not known then) or an upstream failure.
        let unknown_at = attempts
            .iter()
            .filter(|a| {
                matches!(&a.outcome, Outcome::Answer { status: 409, code, .. } if code == "outcome_unknown")
            })
            .map(|a| a.end)
            .fold(f64::MAX, f64::min);
        if intent.class == Class::Action && unknown_at < f64::MAX {
            if let Some(x) = execs.first() {
                if !excuses.excused(&x.key, &failures, -1.0, x.at, unknown_at) {
                    broken.push(format!(
                        "outcome_unknown although its one run (exec #{}) met no crash and no upstream failure",
                        x.id
                    ));
                }
            } else {
                let first = attempts.iter().map(|a| a.at).fold(f64::MAX, f64::min);
                let proxy_fault = e
                    .faults
                    .iter()
                    .any(|f| f.key.is_some() && (first - 0.5..=unknown_at).contains(&f.at));
                if !proxy_fault
                    && !excuses.killed(first - 0.5, unknown_at)
                    && !failures.iter().any(|(a, _)| *a <= unknown_at)
                {
                    broken.push(
                        "outcome_unknown although it never reached the upstream, and no crash and no upstream failure explain it"
                            .into(),
                    );
                }
            }
        }
        for a in &attempts {
            if let Err(why) = documented(intent, &a.outcome, &execs) {
                broken.push(why);
            }
        }
        // Callers saw one execution's result, unless a gateway died in between.
        let mut seen: Vec<&Exec> = attempts
            .iter()
            .filter_map(|a| match a.outcome {
                Outcome::Answer { exec: Some(x), .. } => execs.iter().find(|e| e.id == x).copied(),
                _ => None,
            })
            .collect();
        seen.sort_by(|a, b| a.at.total_cmp(&b.at));
        seen.dedup_by_key(|x| x.id);
        for w in seen.windows(2) {
            if !excuses.killed(w[0].at, w[1].at) {
                broken.push(format!(
                    "callers got the results of two executions (#{} and #{})",
                    w[0].id, w[1].id
                ));
            }
        }
        if intent.class == Class::Event {
            let id = intent.event_id();
            if deliveries.iter().any(|d| d.key != id) {
                broken.push("a delivery did not carry the event id as its key".into());
            }
            for (n, w) in deliveries.windows(2).enumerate() {
                let before = if n > 0 { deliveries[n - 1].at } else { -1.0 };
                if !excuses.excused(&id, &[], before, w[0].at, w[1].at) {
                    broken.push(
                        "delivered again with no crash and no failed delivery in between".into(),
                    );
                }
            }
            if undelivered.contains(&intent.id) {
                broken.push("acknowledged with 200 but never delivered".into());
                r.lost += 1;
            }
            if attempts
                .iter()
                .any(|a| matches!(a.outcome, Outcome::Answer { status: 200, .. }))
            {
                r.events_acknowledged += 1;
            }
        }
        for a in &attempts {
            let took = a.end - a.at;
            if took > ANSWER_LIMIT {
                broken.push(format!(
                    "a request waited {took:.1} s, past the bound of {ANSWER_LIMIT} s ({})",
                    match &a.outcome {
                        Outcome::Answer { status, .. } => format!("answered {status}"),
                        Outcome::NoAnswer(why) => why.clone(),
                    }
                ));
            }
        }
        if unresolved.contains(&intent.id) {
            broken.push(
                "no final answer after the faults stopped (the settling sweep gave up)".into(),
            );
            r.lost += 1;
        }
        if !broken.is_empty() {
            broken.dedup();
            r.violations.push(Violation {
                intent: format!(
                    "{} ({}{})",
                    intent.id,
                    intent.class.name(),
                    if intent.keyed {
                        ", keyed"
                    } else {
                        ", fingerprinted"
                    }
                ),
                rule: broken.join("; "),
                history: history(intent, &execs, &attempts, &e, &deliveries),
                around: faults_around(intent, &execs, &attempts, &e),
            });
        }
    }
    // The records of key-churn attempts that a kill cut are left processing: allowed, up
    // to that many.
    let (churn_left, processing): (Vec<String>, Vec<String>) = processing
        .into_iter()
        .partition(|p| p.contains("/cw/") || p.contains("/ca/"));
    r.churn.processing_left = churn_left.len();
    r.processing_left = processing.len() + churn_left.len();
    if churn_left.len() > r.churn.cut_by_kill {
        for p in &churn_left {
            r.violations.push(Violation {
                intent: "ledger".into(),
                rule: format!(
                    "key-churn record left processing after the run settled, and more of them ({}) than attempts a kill cut ({}): {p}",
                    churn_left.len(),
                    r.churn.cut_by_kill
                ),
                history: Vec::new(),
                around: Vec::new(),
            });
        }
    }
    for p in processing {
        r.violations.push(Violation {
            intent: "ledger".into(),
            rule: format!("record left processing after the run settled: {p}"),
            history: Vec::new(),
            around: Vec::new(),
        });
    }
    r
}

/// How soon after a caller left one instance a new key sent to another instance may miss
/// that the caller left: the time the first instance takes to write it and the database's
/// notification to reach the second (docs/retry-patterns.md), under the chaos run's load.
const NOTIFIED_WITHIN: f64 = 0.5;

/// Whether the attempt that ran again at `at` (the last one sent before it) went to another
/// instance than the attempt before it, whose caller gave up less than
/// [`NOTIFIED_WITHIN`] before: the instances, and the gap.
fn across_instances(sorted: &[&&Attempt], at: f64) -> Option<(usize, usize, f64)> {
    let n = sorted.iter().rposition(|a| a.at <= at + 0.001)?;
    let (left, retry) = (sorted.get(n.checked_sub(1)?)?, sorted[n]);
    let gave_up = matches!(left.outcome, Outcome::NoAnswer(_));
    let gap = retry.at - left.end;
    (gave_up && left.instance != retry.instance && gap < NOTIFIED_WITHIN).then_some((
        left.instance,
        retry.instance,
        gap,
    ))
}

/// The rules of a key-churn intention (see the module docs), and its figures.
fn churn_rules(
    intent: &Intent,
    execs: &[&Exec],
    attempts: &[&Attempt],
    failures: &[(f64, f64)],
    excuses: &Excuses<'_>,
    figures: &mut ChurnFigures,
    broken: &mut Vec<String>,
) {
    figures.intents += 1;
    figures.attempts += attempts.len();
    figures.joined += attempts
        .iter()
        .filter(|a| matches!(&a.outcome, Outcome::Answer { churned, .. } if !churned.is_empty()))
        .count();
    let cuts = excuses.cuts(attempts);
    figures.cut_by_kill += cuts.len();
    // The agent's own promise: every attempt under a key nobody used before, and none
    // after an answer reached it.
    let made_up: BTreeSet<&str> = attempts.iter().filter_map(|a| a.key.as_deref()).collect();
    if made_up.len() != attempts.len() {
        broken.push("the key-churn agent sent a key twice (harness bug)".into());
    }
    let mut sorted: Vec<&&Attempt> = attempts.iter().collect();
    sorted.sort_by(|a, b| a.at.total_cmp(&b.at));
    if let Some(n) = sorted
        .iter()
        .position(|a| !super::agents::churn_retries(&a.outcome))
    {
        if n + 1 < sorted.len() {
            broken.push(format!(
                "the key-churn agent sent it again after an answer ({}) (harness bug)",
                describe(&sorted[n].outcome)
            ));
        }
    }
    for (n, again) in execs.iter().enumerate().skip(1) {
        // A run of a record seen before is held to that record's last run; a run of a new
        // record, to the run just before it.
        let m = execs[..n]
            .iter()
            .rposition(|x| x.key == again.key)
            .unwrap_or(n - 1);
        let first = execs[m];
        let before = if m > 0 { execs[m - 1].at } else { -1.0 };
        if first.key == again.key {
            // The same record run again (a made-up key that joined it, or its own key).
            if intent.class == Class::Action {
                broken.push(format!(
                    "action executed again (exec #{} after #{}, one record)",
                    again.id, first.id
                ));
            } else if !excuses.excused(&first.key, failures, before, first.at, again.at) {
                broken.push(format!(
                    "executed again (exec #{} after #{}, one record) with no crash and no upstream failure in between",
                    again.id, first.id
                ));
            }
            continue;
        }
        // A new record: a new key the gateway did not join to the first run's record.
        if let Some(t) = cuts
            .iter()
            .find(|t| (first.at - 1.0..=again.at).contains(*t))
        {
            figures.lost_to_kill.push(format!(
                "{}: exec #{} (t={:.2}s), an attempt cut by a kill at t={t:.2}s, then exec #{} (t={:.2}s) under a new key",
                intent.id, first.id, first.at, again.id, again.at
            ));
        } else if intent.class != Class::Action
            && failures
                .iter()
                .any(|(_, e)| (first.at..=again.at + 0.05).contains(e))
        {
            figures.after_upstream_failure += 1;
        } else if let Some(gap) = across_instances(&sorted, again.at) {
            figures.before_notified.push(format!(
                "{}: exec #{} (t={:.2}s), its caller left instance {} and the new key went to instance {} {:.0} ms later, then exec #{} (t={:.2}s)",
                intent.id, first.id, first.at, gap.0, gap.1, gap.2 * 1000.0, again.id, again.at
            ));
        } else {
            broken.push(format!(
                "executed again under a new key (exec #{} after #{}: another record, downstream key {} after {}) although its caller had no answer and no kill cut an attempt: the new key did not join the original",
                again.id, first.id, again.key, first.key
            ));
        }
    }
}

fn faults_around(
    intent: &Intent,
    execs: &[&Exec],
    attempts: &[&Attempt],
    e: &Entries,
) -> Vec<&'static str> {
    let start = execs
        .iter()
        .map(|x| x.at)
        .chain(attempts.iter().filter(|a| !a.sweep).map(|a| a.at))
        .fold(f64::MAX, f64::min)
        - 2.0;
    // A run's fate is decided within about a timeout (3 s) of it.
    let end = match execs.last() {
        Some(x) => x.at + 3.0,
        None => attempts
            .iter()
            .filter(|a| !a.sweep)
            .map(|a| a.end)
            .fold(0.0, f64::max),
    };
    let keys: BTreeSet<&str> = execs.iter().map(|x| x.key.as_str()).collect();
    let mut kinds: Vec<&'static str> = e
        .faults
        .iter()
        .filter(|f| (start..=end).contains(&f.at))
        .filter(|f| !f.detail.ends_with("(unchanged)") && !f.detail.contains("failed"))
        .filter(|f| match (&f.key, f.kind) {
            (Some(k), _) => keys.contains(k.as_str()),
            (None, Fault::StalledCaller) => f.detail.starts_with(&format!("{}:", intent.id)),
            (None, _) => true,
        })
        .map(|f| f.kind.name())
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

fn history(
    intent: &Intent,
    execs: &[&Exec],
    attempts: &[&Attempt],
    e: &Entries,
    deliveries: &[&super::journal::Delivery],
) -> Vec<String> {
    let mut lines: Vec<(f64, String)> = Vec::new();
    for x in execs {
        lines.push((x.at, format!("upstream exec #{} key {}", x.id, x.key)));
    }
    for d in deliveries {
        lines.push((d.at, format!("delivered, key {}", d.key)));
    }
    for a in attempts {
        lines.push((
            a.at,
            format!(
                "{}request to instance {}{} -> {} (after {:.2} s, patience {:.1} s)",
                if a.sweep { "sweep " } else { "" },
                a.instance,
                a.key
                    .as_deref()
                    .map(|k| format!(" key {k}"))
                    .unwrap_or_default(),
                describe(&a.outcome),
                a.end - a.at,
                a.patience
            ),
        ));
    }
    let keys: BTreeSet<&str> = execs.iter().map(|x| x.key.as_str()).collect();
    let (first, last) = (
        lines.iter().map(|l| l.0).fold(f64::MAX, f64::min),
        lines.iter().map(|l| l.0).fold(0.0, f64::max),
    );
    let event_id = intent.event_id();
    for f in &e.faults {
        let on_key = f
            .key
            .as_deref()
            .is_some_and(|k| keys.contains(k) || (intent.class == Class::Event && k == event_id));
        let global = f.key.is_none()
            && (first - 1.0..=last).contains(&f.at)
            && execs
                .iter()
                .any(|x| (x.at - 3.0..=x.at + 3.0).contains(&f.at))
            && !f.detail.ends_with("(unchanged)")
            && !f.detail.contains("restart failed");
        let mentions = f.detail.contains(&format!("{}:", intent.id));
        if on_key || (global && f.kind != Fault::StalledCaller) || mentions {
            lines.push((f.at, format!("FAULT {}: {}", f.kind.name(), f.detail)));
        }
    }
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    let n = lines.len();
    let mut out: Vec<String> = lines
        .into_iter()
        .map(|(t, s)| format!("t={t:7.2}s {s}"))
        .collect();
    if n > 40 {
        out.drain(20..n - 20);
        out.insert(20, format!("... {} lines left out ...", n - 40));
    }
    out
}

#[cfg(test)]
mod tests {
    //! The checker on made-up histories: it must flag each broken promise, and only those.

    use super::super::journal::{Delivery, FaultEvent};
    use super::*;

    fn history(intents: &[&Intent]) -> Entries {
        let mut e = Entries::default();
        for i in intents {
            e.intents.insert(i.id.clone(), (*i).clone());
        }
        e
    }

    fn exec(e: &mut Entries, intent: &Intent, key: &str, id: u64, at: f64) {
        e.execs.push(Exec {
            intent: intent.id.clone(),
            key: key.into(),
            id,
            at,
        });
    }

    fn answer(
        e: &mut Entries,
        intent: &Intent,
        at: f64,
        status: u16,
        code: &str,
        exec: Option<u64>,
    ) {
        e.attempts.push(Attempt {
            intent: intent.id.clone(),
            instance: 0,
            at,
            end: at + 0.1,
            patience: 8.0,
            outcome: Outcome::Answer {
                status,
                oncely: String::new(),
                code: code.into(),
                exec,
                answered: exec.map(|_| intent.id.clone()),
                retry: None,
                churned: String::new(),
            },
            sweep: false,
            key: None,
        });
    }

    fn fault(e: &mut Entries, kind: Fault, at: f64, key: Option<&str>) {
        e.faults.push(FaultEvent {
            kind,
            at,
            key: key.map(str::to_owned),
            detail: String::new(),
        });
    }

    fn run(e: Entries) -> PhaseReport {
        check(
            StoreKind::Sqlite,
            Duration::from_secs(1),
            0.0,
            e,
            Vec::new(),
            Vec::new(),
            Vec::new(),
        )
    }

    #[test]
    fn a_request_that_waited_past_the_bound_is_a_violation() {
        let slow = Intent::new(1, Class::Write, 0, 1);
        let quick = Intent::new(1, Class::Write, 0, 2);
        let mut e = history(&[&slow, &quick]);
        exec(&mut e, &slow, "k1", 1, 1.0);
        exec(&mut e, &quick, "k2", 2, 1.0);
        answer(&mut e, &slow, 1.0, 200, "", Some(1));
        answer(&mut e, &quick, 1.0, 200, "", Some(2));
        // A patient caller got its answer 20 s after it asked; the other within the bound.
        e.attempts[0].end = 21.0;
        e.attempts[0].patience = 40.0;
        e.attempts[1].end = 1.0 + ANSWER_LIMIT - 1.0;
        let r = run(e);
        assert_eq!(r.violations.len(), 1, "{r}");
        assert!(r.violations[0].intent.starts_with(&slow.id), "{r}");
        assert!(r.violations[0].rule.contains("past the bound"), "{r}");
    }

    #[test]
    fn an_action_that_ran_twice_is_a_violation_even_after_a_kill() {
        let a = Intent::new(1, Class::Action, 0, 1);
        let mut e = history(&[&a]);
        exec(&mut e, &a, "k", 1, 1.0);
        fault(&mut e, Fault::Kill, 1.5, None);
        exec(&mut e, &a, "k", 2, 2.0);
        let r = run(e);
        assert_eq!(r.violations.len(), 1);
        assert!(
            r.violations[0].rule.contains("action executed 2 times"),
            "{r}"
        );
    }

    #[test]
    fn a_write_may_run_again_after_a_kill_or_a_fault_on_its_key_but_not_otherwise() {
        let (killed, faulted, quiet) = (
            Intent::new(1, Class::Write, 0, 1),
            Intent::new(1, Class::Write, 0, 2),
            Intent::new(1, Class::Write, 0, 3),
        );
        let mut e = history(&[&killed, &faulted, &quiet]);
        exec(&mut e, &killed, "k1", 1, 1.0);
        fault(&mut e, Fault::Kill, 1.5, None);
        exec(&mut e, &killed, "k1", 2, 2.0);
        exec(&mut e, &faulted, "k2", 3, 3.0);
        fault(&mut e, Fault::ProxyResetAfter, 3.0, Some("k2"));
        exec(&mut e, &faulted, "k2", 4, 4.0);
        exec(&mut e, &quiet, "k3", 5, 5.0);
        fault(&mut e, Fault::ProxyResetAfter, 5.2, Some("other"));
        exec(&mut e, &quiet, "k3", 6, 6.0);
        let r = run(e);
        assert_eq!(r.violations.len(), 1, "{r}");
        assert!(r.violations[0].intent.starts_with(&quiet.id), "{r}");
        assert!(r.violations[0].rule.contains("executed again"), "{r}");
    }

    #[test]
    fn an_action_that_ran_is_outcome_unknown_only_after_something_went_wrong() {
        let (quiet, killed) = (
            Intent::new(1, Class::Action, 0, 1),
            Intent::new(1, Class::Action, 0, 2),
        );
        let mut e = history(&[&quiet, &killed]);
        exec(&mut e, &quiet, "k1", 1, 10.0);
        answer(&mut e, &quiet, 10.0, 201, "", Some(1));
        answer(&mut e, &quiet, 12.0, 409, "outcome_unknown", None);
        exec(&mut e, &killed, "k2", 2, 1.0);
        fault(&mut e, Fault::Kill, 1.2, None);
        answer(&mut e, &killed, 5.0, 409, "outcome_unknown", None);
        let r = run(e);
        assert_eq!(r.violations.len(), 1, "{r}");
        assert!(r.violations[0].intent.starts_with(&quiet.id), "{r}");
        assert!(r.violations[0].rule.contains("met no crash"), "{r}");
    }

    #[test]
    fn an_action_that_never_ran_is_outcome_unknown_only_after_a_fault() {
        let (quiet, faulted) = (
            Intent::new(1, Class::Action, 0, 1),
            Intent::new(1, Class::Action, 0, 2),
        );
        let mut e = history(&[&quiet, &faulted]);
        answer(&mut e, &quiet, 1.0, 504, "upstream_timeout", None);
        answer(&mut e, &quiet, 2.0, 409, "outcome_unknown", None);
        answer(&mut e, &faulted, 10.0, 409, "in_flight", None);
        fault(&mut e, Fault::ProxyResetBefore, 10.2, Some("k"));
        answer(&mut e, &faulted, 11.0, 409, "outcome_unknown", None);
        assert_eq!(run(e).violations.len(), 0);

        let mut e = history(&[&quiet]);
        answer(&mut e, &quiet, 1.0, 409, "in_flight", None);
        answer(&mut e, &quiet, 2.0, 409, "outcome_unknown", None);
        let r = run(e);
        assert!(
            r.violations[0].rule.contains("never reached the upstream"),
            "{r}"
        );
    }

    #[test]
    fn a_second_execution_with_another_downstream_key_is_a_violation() {
        let w = Intent::new(1, Class::Write, 0, 1);
        let mut e = history(&[&w]);
        exec(&mut e, &w, "k1", 1, 1.0);
        fault(&mut e, Fault::Kill, 1.5, None);
        exec(&mut e, &w, "k2", 2, 2.0);
        let r = run(e);
        assert!(
            r.violations[0].rule.contains("different downstream keys"),
            "{r}"
        );
    }

    #[test]
    fn answers_are_the_intentions_own_result_or_a_documented_refusal() {
        let (w, a) = (
            Intent::new(1, Class::Write, 0, 1),
            Intent::new(1, Class::Action, 0, 1),
        );
        let mut e = history(&[&w, &a]);
        exec(&mut e, &w, "k", 1, 1.0);
        answer(&mut e, &w, 1.0, 201, "", Some(1));
        answer(&mut e, &w, 1.1, 409, "in_flight", None);
        answer(&mut e, &w, 1.2, 503, "store_unavailable", None);
        answer(&mut e, &a, 1.0, 409, "outcome_unknown", None);
        answer(&mut e, &a, 1.1, 504, "upstream_timeout", None);
        assert_eq!(run(e).violations.len(), 0);

        let mut e = history(&[&w]);
        exec(&mut e, &w, "k", 1, 1.0);
        answer(&mut e, &w, 1.1, 409, "outcome_unknown", None);
        answer(&mut e, &w, 1.2, 201, "", Some(7));
        answer(&mut e, &w, 1.3, 500, "", None);
        let r = run(e);
        let rule = &r.violations[0].rule;
        assert!(
            rule.contains("undocumented answer 409 outcome_unknown"),
            "{r}"
        );
        assert!(rule.contains("execution Some(7), which never ran"), "{r}");
        assert!(rule.contains("undocumented answer 500"), "{r}");
    }

    #[test]
    fn callers_that_got_two_executions_results_without_a_kill_are_a_violation() {
        let w = Intent::new(1, Class::Write, 0, 1);
        let mut e = history(&[&w]);
        exec(&mut e, &w, "k", 1, 1.0);
        fault(&mut e, Fault::ProxySlow, 1.0, Some("k"));
        exec(&mut e, &w, "k", 2, 2.0);
        answer(&mut e, &w, 1.0, 201, "", Some(1));
        answer(&mut e, &w, 2.0, 201, "", Some(2));
        let r = run(e);
        assert!(
            r.violations[0].rule.contains("results of two executions"),
            "{r}"
        );
    }

    #[test]
    fn lost_answers_undelivered_events_and_records_left_processing_are_reported() {
        let (w, ev) = (
            Intent::new(1, Class::Write, 0, 1),
            Intent::new(1, Class::Event, 0, 1),
        );
        let mut e = history(&[&w, &ev]);
        answer(&mut e, &ev, 1.0, 200, "", None);
        e.deliveries.push(Delivery {
            intent: ev.id.clone(),
            key: ev.event_id(),
            at: 1.1,
        });
        e.deliveries.push(Delivery {
            intent: ev.id.clone(),
            key: ev.event_id(),
            at: 1.5,
        });
        let r = check(
            StoreKind::Postgres,
            Duration::from_secs(1),
            0.0,
            e,
            vec![w.id.clone()],
            vec![ev.id.clone()],
            vec!["rec_1 route POST /w/{id}".into()],
        );
        assert_eq!(r.lost, 2, "{r}");
        assert_eq!(r.violations.len(), 3, "{r}");
        assert!(
            r.violations
                .iter()
                .any(|v| v.rule.contains("delivered again")),
            "{r}"
        );
        assert!(
            r.violations
                .iter()
                .any(|v| v.rule.contains("never delivered")),
            "{r}"
        );
        assert!(
            r.violations
                .iter()
                .any(|v| v.rule.contains("sweep gave up")),
            "{r}"
        );
        assert!(
            r.violations
                .iter()
                .any(|v| v.rule.contains("left processing")),
            "{r}"
        );
    }
}
