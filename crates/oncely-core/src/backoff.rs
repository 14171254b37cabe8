//! Exponential backoff, the one rule every retry loop of oncely follows: the owner's
//! ledger writes and lease renewals, task lease renewals, the proxy's `retries`, webhook
//! redeliveries and the server's reconciliation.

use std::time::Duration;

/// The pause before try `n + 1` after `n` failed ones: `first` doubled `n` times, at most
/// `max` (`n = 0` is `first`).
pub fn exponential(first: Duration, n: u32, max: Duration) -> Duration {
    let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
    first.saturating_mul(factor).min(max)
}

/// A pause uniform in `[0, ceiling]` ("full jitter"), so that callers that failed
/// together do not come back together. `unit` is a random number in `[0, 1)`.
pub fn full_jitter(ceiling: Duration, unit: f64) -> Duration {
    let millis = ceiling.as_millis() as f64 * unit.clamp(0.0, 1.0);
    Duration::from_millis(millis.round() as u64).min(ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_first_and_stops_at_max() {
        let ms = Duration::from_millis;
        let max = Duration::from_secs(2);
        assert_eq!(exponential(ms(50), 0, max), ms(50));
        assert_eq!(exponential(ms(50), 1, max), ms(100));
        assert_eq!(exponential(ms(50), 5, max), ms(1600));
        assert_eq!(exponential(ms(50), 6, max), max);
        assert_eq!(exponential(ms(50), u32::MAX, max), max);
        assert_eq!(
            exponential(Duration::from_secs(3600), 40, Duration::MAX),
            Duration::from_secs(3600).saturating_mul(1 << 31)
        );
    }

    #[test]
    fn jitter_stays_within_its_ceiling() {
        let c = Duration::from_millis(1000);
        assert_eq!(full_jitter(c, 0.0), Duration::ZERO);
        assert_eq!(full_jitter(c, 0.5), Duration::from_millis(500));
        assert_eq!(full_jitter(c, 0.99999), c);
        assert_eq!(full_jitter(c, 7.0), c);
    }
}
