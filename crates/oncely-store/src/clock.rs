//! Where stores get "now" from: the system, or a clock a test moves by hand.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use oncely_core::Timestamp;

/// A source of the current time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Now.
    fn now(&self) -> Timestamp;

    /// How far this clock is ahead of the system clock (PostgreSQL adds this to the
    /// database's own clock, so tests can move time there too).
    fn offset(&self) -> Duration {
        Duration::ZERO
    }

    /// Time on a clock that never steps (`CLOCK_MONOTONIC`), from an arbitrary origin
    /// fixed per process. The SQLite store measures leases with it, so that a step of
    /// the wall clock neither lapses a live lease nor holds a dead one.
    fn monotonic(&self) -> Duration {
        monotonic_now()
    }
}

/// Time elapsed on the monotonic clock since this process first asked.
pub fn monotonic_now() -> Duration {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed()
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        system_now()
    }
}

/// The system time as a [`Timestamp`].
pub fn system_now() -> Timestamp {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp(since.as_millis() as i64)
}

/// The system clock moved forward by hand: tests of expiry and leases advance it instead
/// of sleeping.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    ahead_ms: Arc<AtomicI64>,
    stepped_ms: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock that starts at system time.
    pub fn new() -> ManualClock {
        ManualClock::default()
    }

    /// Moves the clock forward: time passes (the wall clock and the monotonic clock).
    pub fn advance(&self, by: Duration) {
        self.ahead_ms
            .fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }

    /// Steps the wall clock forward without time passing (the monotonic clock stays), as
    /// an operator or NTP stepping the system clock would.
    pub fn step_wall(&self, by: Duration) {
        self.stepped_ms
            .fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(
            system_now().0
                + self.ahead_ms.load(Ordering::SeqCst)
                + self.stepped_ms.load(Ordering::SeqCst),
        )
    }

    fn offset(&self) -> Duration {
        let ms = self.ahead_ms.load(Ordering::SeqCst) + self.stepped_ms.load(Ordering::SeqCst);
        Duration::from_millis(ms.max(0) as u64)
    }

    fn monotonic(&self) -> Duration {
        monotonic_now() + Duration::from_millis(self.ahead_ms.load(Ordering::SeqCst).max(0) as u64)
    }
}
