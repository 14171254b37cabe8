//! The run's history: the intentions, every upstream execution and webhook delivery, every
//! fault injected and every request the callers sent with what they got back. The checker
//! reads only this.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use super::Fault;

/// What an intention is, by the first letter of its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Class {
    Write,
    Action,
    Job,
    /// An inbound webhook event.
    Event,
}

impl Class {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Class::Write => "write",
            Class::Action => "action",
            Class::Job => "job",
            Class::Event => "webhook",
        }
    }

    fn of(id: &str) -> Class {
        match id.as_bytes().first() {
            Some(b'a') => Class::Action,
            Some(b'j') => Class::Job,
            Some(b'e') => Class::Event,
            _ => Class::Write,
        }
    }
}

/// One business intention: the same request, sent again and again.
#[derive(Debug, Clone)]
pub(crate) struct Intent {
    /// `w3_0`: class letter, generation, index.
    pub(crate) id: String,
    pub(crate) class: Class,
    /// Sent with an `Idempotency-Key` (else identified by its fingerprint).
    pub(crate) keyed: bool,
    /// Which of the four accounts sends it.
    pub(crate) principal: u8,
    pub(crate) seed: u64,
    /// Sent by a key-churn caller (`agents::churn_agent`): a new `Idempotency-Key` made up
    /// for every attempt, so the intention is its body (and path), not a key.
    pub(crate) churn: bool,
}

impl Intent {
    pub(crate) fn new(seed: u64, class: Class, generation: u64, index: usize) -> Intent {
        let letter = match class {
            Class::Write => 'w',
            Class::Action => 'a',
            Class::Job => 'j',
            Class::Event => 'e',
        };
        Intent {
            id: format!("{letter}{generation}_{index}"),
            class,
            keyed: index % 2 == 0,
            principal: (index % 4) as u8,
            seed,
            churn: false,
        }
    }

    /// The `n`th intention of key-churn agent `agent`: a write or an action only that
    /// agent ever sends, under a key of its own making on every attempt (`cw3_0`, `ca3_1`).
    pub(crate) fn churn(seed: u64, class: Class, agent: u64, n: usize) -> Intent {
        let letter = if class == Class::Action { 'a' } else { 'w' };
        Intent {
            id: format!("c{letter}{agent}_{n}"),
            class,
            keyed: true,
            principal: (agent % 4) as u8,
            seed,
            churn: true,
        }
    }

    /// The `n`th intention of a stalled caller: a write never sent before, with a large
    /// answer.
    pub(crate) fn stalled(seed: u64, n: usize) -> Intent {
        Intent {
            id: format!("ws{n}"),
            class: Class::Write,
            keyed: n % 2 == 0,
            principal: (n % 4) as u8,
            seed,
            churn: false,
        }
    }

    /// The gateway path it is sent to.
    pub(crate) fn path(&self) -> String {
        match self.class {
            // Key-churn intentions have routes of their own (same classes), so that a
            // record of theirs left `processing` is known to be theirs.
            Class::Write if self.churn => format!("/cw/{}", self.id),
            Class::Action if self.churn => format!("/ca/{}", self.id),
            // Stalled callers' large answers have a route with a long timeout of their own,
            // so that only the stall, not the transfer time, is under test.
            Class::Write if self.id.starts_with("ws") => format!("/s/{}", self.id),
            Class::Write => format!("/w/{}", self.id),
            Class::Action => format!("/a/{}", self.id),
            Class::Job => format!("/j/{}", self.id),
            Class::Event => "/hooks/in".to_owned(),
        }
    }

    /// The request body (the same on every attempt).
    pub(crate) fn body(&self) -> String {
        match self.class {
            Class::Event => format!(r#"{{"id":"{}","type":"chaos.test"}}"#, self.event_id()),
            _ => format!(r#"{{"intent":"{}"}}"#, self.id),
        }
    }

    /// Its one key; none for a key-churn intention (its caller makes one up per attempt).
    pub(crate) fn idempotency_key(&self) -> Option<String> {
        (self.keyed && !self.churn && self.class != Class::Event)
            .then(|| format!("k-{}-{}", self.seed, self.id))
    }

    pub(crate) fn authorization(&self) -> String {
        format!("Bearer sk_chaos_{}", self.principal)
    }

    pub(crate) fn event_id(&self) -> String {
        format!("evt_{}_{}", self.seed, self.id)
    }
}

/// How large the upstream's answer to this intention is: 2 MiB for the first write of each
/// generation, 24 MiB for the intentions of stalled callers (`ws...`), else small.
pub(crate) fn big_body(id: &str) -> usize {
    if id.starts_with("ws") {
        24 << 20
    } else if id.starts_with('w') && id.ends_with("_0") {
        2 << 20
    } else {
        0
    }
}

/// The upstream ran an intention.
#[derive(Debug, Clone)]
pub(crate) struct Exec {
    pub(crate) intent: String,
    /// The downstream `Idempotency-Key` it received.
    pub(crate) key: String,
    /// Its number, echoed in the answer.
    pub(crate) id: u64,
    pub(crate) at: f64,
}

/// The webhook handler received an event.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub(crate) intent: String,
    pub(crate) key: String,
    pub(crate) at: f64,
}

/// A fault, when it hit, and (for the proxy) the downstream key of the request it hit.
#[derive(Debug, Clone)]
pub(crate) struct FaultEvent {
    pub(crate) kind: Fault,
    pub(crate) at: f64,
    pub(crate) key: Option<String>,
    pub(crate) detail: String,
}

/// What one request got.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    Answer {
        status: u16,
        /// `Oncely-Status`, or empty.
        oncely: String,
        /// The problem's `code`, or empty.
        code: String,
        /// The execution number in a 2xx body.
        exec: Option<u64>,
        /// The intention named by a 2xx body.
        answered: Option<String>,
        /// `X-Should-Retry` of a problem answer.
        retry: Option<bool>,
        /// `Oncely-Key-Churn` (the record a made-up key joined), or empty.
        churned: String,
    },
    /// Refused connection, reset, or the caller gave up waiting.
    NoAnswer(String),
}

/// One request of a caller.
#[derive(Debug, Clone)]
pub(crate) struct Attempt {
    pub(crate) intent: String,
    pub(crate) instance: usize,
    pub(crate) at: f64,
    pub(crate) end: f64,
    /// How long the caller would wait for the answer, in seconds.
    pub(crate) patience: f64,
    pub(crate) outcome: Outcome,
    /// Sent by the settling sweep after the faults stopped.
    pub(crate) sweep: bool,
    /// The `Idempotency-Key` made up for this attempt (key-churn intentions only).
    pub(crate) key: Option<String>,
}

#[derive(Debug, Default)]
pub(crate) struct Entries {
    pub(crate) intents: BTreeMap<String, Intent>,
    pub(crate) execs: Vec<Exec>,
    pub(crate) deliveries: Vec<Delivery>,
    pub(crate) faults: Vec<FaultEvent>,
    pub(crate) attempts: Vec<Attempt>,
}

/// The shared history of one phase.
#[derive(Debug)]
pub(crate) struct Journal {
    start: Instant,
    pub(crate) seed: u64,
    entries: Mutex<Entries>,
}

impl Journal {
    pub(crate) fn new(seed: u64) -> Journal {
        Journal {
            start: Instant::now(),
            seed,
            entries: Mutex::new(Entries::default()),
        }
    }

    /// Seconds since the phase began.
    pub(crate) fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Entries) -> T) -> T {
        f(&mut self.entries.lock().expect("journal lock"))
    }

    pub(crate) fn intent(&self, intent: &Intent) {
        self.with(|e| {
            e.intents
                .entry(intent.id.clone())
                .or_insert_with(|| intent.clone());
        });
    }

    pub(crate) fn exec(&self, intent: &str, key: &str, id: u64) {
        let at = self.now();
        self.with(|e| {
            e.execs.push(Exec {
                intent: intent.to_owned(),
                key: key.to_owned(),
                id,
                at,
            })
        });
    }

    pub(crate) fn delivery(&self, intent: &str, key: &str) {
        let at = self.now();
        self.with(|e| {
            e.deliveries.push(Delivery {
                intent: intent.to_owned(),
                key: key.to_owned(),
                at,
            })
        });
    }

    pub(crate) fn fault(&self, kind: Fault, key: Option<String>, detail: String) {
        let at = self.now();
        self.with(|e| {
            e.faults.push(FaultEvent {
                kind,
                at,
                key,
                detail,
            })
        });
    }

    pub(crate) fn attempt(&self, attempt: Attempt) {
        self.with(|e| e.attempts.push(attempt));
    }

    /// Every registered intention.
    pub(crate) fn intents(&self) -> Vec<Intent> {
        self.with(|e| e.intents.values().cloned().collect())
    }

    /// Intentions answered 200 by the webhook endpoint (acknowledged events).
    pub(crate) fn acknowledged_events(&self) -> Vec<String> {
        self.with(|e| {
            let mut ids: Vec<String> = e
                .attempts
                .iter()
                .filter(|a| {
                    Class::of(&a.intent) == Class::Event
                        && matches!(a.outcome, Outcome::Answer { status: 200, .. })
                })
                .map(|a| a.intent.clone())
                .collect();
            ids.sort();
            ids.dedup();
            ids
        })
    }

    /// What the requests for `intent` got so far.
    pub(crate) fn outcomes(&self, intent: &str) -> Vec<Outcome> {
        self.with(|e| {
            e.attempts
                .iter()
                .filter(|a| a.intent == intent)
                .map(|a| a.outcome.clone())
                .collect()
        })
    }

    pub(crate) fn delivered(&self, intent: &str) -> bool {
        self.with(|e| e.deliveries.iter().any(|d| d.intent == intent))
    }

    /// Takes the history out for checking.
    pub(crate) fn take(&self) -> Entries {
        self.with(std::mem::take)
    }
}
