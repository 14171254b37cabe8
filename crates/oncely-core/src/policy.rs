//! Operation classes and what each does with an upstream answer.
//!
//! | class | duplicate in the window | upstream failure |
//! | --- | --- | --- |
//! | `read` | forwarded every time | forwarded |
//! | `write` | the stored first response | released: a retry executes again, same downstream key |
//! | `action` | the stored first response | ambiguous failures become `outcome_unknown` |
//! | `job` | the job, then its stored response | as `write` |

use std::fmt;
use std::str::FromStr;

/// What kind of operation a route (or tool, or webhook) performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Safe to repeat: never deduplicated.
    Read,
    /// A reversible write: replayed; failures are released so a retry runs again.
    Write,
    /// A consequential action: replayed; a failure that may hide an effect is
    /// `outcome_unknown` until someone reconciles it.
    Action,
    /// Slow work: a job with an id and a status endpoint; fails like `write`.
    Job,
    /// An inbound webhook event, claimed once and delivered by a queue.
    Webhook,
}

impl Class {
    /// The class's name as written in config and shown in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Read => "read",
            Class::Write => "write",
            Class::Action => "action",
            Class::Job => "job",
            Class::Webhook => "webhook",
        }
    }

    /// Whether a take-over of a lapsed lease may execute again (`write`, `job`), or must
    /// mark the record `outcome_unknown` because the lost call may have acted (`action`).
    pub fn reexecutes_after_lapse(self) -> bool {
        !matches!(self, Class::Action)
    }

    /// What to do with the result of an upstream call.
    pub fn dispose(self, result: UpstreamResult) -> Disposition {
        match result {
            UpstreamResult::Answered(status) if is_storable(status) => Disposition::Store,
            UpstreamResult::Answered(status) if self == Class::Action && hides_effect(status) => {
                Disposition::OutcomeUnknown
            }
            UpstreamResult::Answered(_) | UpstreamResult::FailedBeforeSend => Disposition::Release,
            UpstreamResult::LostAfterSend if self == Class::Action => Disposition::OutcomeUnknown,
            UpstreamResult::LostAfterSend => Disposition::Release,
        }
    }
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Class {
    type Err = String;
    fn from_str(s: &str) -> Result<Class, String> {
        Ok(match s {
            "read" => Class::Read,
            "write" => Class::Write,
            "action" => Class::Action,
            "job" => Class::Job,
            "webhook" => Class::Webhook,
            other => {
                return Err(format!(
                    "unknown class {other:?} (use read, write, action or job)"
                ))
            }
        })
    }
}

/// How an upstream call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamResult {
    /// The upstream answered with this status.
    Answered(u16),
    /// The call failed before the request was sent (connection refused, DNS): nothing
    /// can have happened upstream.
    FailedBeforeSend,
    /// The request was sent and then the answer was lost (timeout, reset): the action may
    /// or may not have happened.
    LostAfterSend,
}

/// What the ledger does with a finished upstream call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Keep the answer and replay it to duplicates.
    Store,
    /// Forget the attempt: the next identical request executes again.
    Release,
    /// Nobody knows whether the action happened: block repeats until reconciled.
    OutcomeUnknown,
}

/// Whether an upstream status is kept for replay: 2xx and 4xx, except 401, 403, 408,
/// 409, 425 and 429, which say "not now" or "not you" rather than "done".
pub fn is_storable(status: u16) -> bool {
    matches!(status, 200..=299)
        || (matches!(status, 400..=499) && !matches!(status, 401 | 403 | 408 | 409 | 425 | 429))
}

/// A 5xx other than 503 may have been sent after the effect took place.
fn hides_effect(status: u16) -> bool {
    (500..=599).contains(&status) && status != 503
}

#[cfg(test)]
mod tests {
    use super::*;
    use UpstreamResult::*;

    #[test]
    fn storable_statuses() {
        for s in [200, 201, 202, 204, 299, 400, 404, 410, 422, 499] {
            assert!(is_storable(s), "{s}");
        }
        for s in [
            100, 301, 304, 401, 403, 408, 409, 425, 429, 500, 502, 503, 504,
        ] {
            assert!(!is_storable(s), "{s}");
        }
    }

    #[test]
    fn write_and_job_release_every_failure() {
        for class in [Class::Write, Class::Job] {
            assert_eq!(class.dispose(Answered(201)), Disposition::Store);
            assert_eq!(class.dispose(Answered(422)), Disposition::Store);
            assert_eq!(class.dispose(Answered(500)), Disposition::Release);
            assert_eq!(class.dispose(Answered(429)), Disposition::Release);
            assert_eq!(class.dispose(FailedBeforeSend), Disposition::Release);
            assert_eq!(class.dispose(LostAfterSend), Disposition::Release);
            assert!(class.reexecutes_after_lapse());
        }
    }

    #[test]
    fn action_keeps_ambiguity() {
        let a = Class::Action;
        assert_eq!(a.dispose(Answered(200)), Disposition::Store);
        assert_eq!(a.dispose(Answered(500)), Disposition::OutcomeUnknown);
        assert_eq!(a.dispose(Answered(502)), Disposition::OutcomeUnknown);
        assert_eq!(a.dispose(Answered(504)), Disposition::OutcomeUnknown);
        assert_eq!(a.dispose(Answered(503)), Disposition::Release);
        assert_eq!(a.dispose(Answered(429)), Disposition::Release);
        assert_eq!(a.dispose(FailedBeforeSend), Disposition::Release);
        assert_eq!(a.dispose(LostAfterSend), Disposition::OutcomeUnknown);
        assert!(!a.reexecutes_after_lapse());
    }

    #[test]
    fn names_round_trip() {
        for c in [
            Class::Read,
            Class::Write,
            Class::Action,
            Class::Job,
            Class::Webhook,
        ] {
            assert_eq!(c.as_str().parse::<Class>().unwrap(), c);
        }
        assert!("delete".parse::<Class>().is_err());
    }
}
