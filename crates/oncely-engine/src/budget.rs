//! The memory answers in flight may hold, over every route: what owner tasks keep of
//! the answers they are recording, and what their callers have not read yet.
//!
//! An owner never waits on its caller (a caller that stops reading must not hold up the
//! recording, nor the lease), so what the caller has not read is held in memory; the
//! budget bounds that, and the kept answers, together. When it is spent, an owner keeps
//! recording but stops keeping the body (the record is completed as too large to keep:
//! duplicates get `result_too_large`, never a second execution), and a caller that lags
//! behind is cut off (its body ends with an error) while the owner records the answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The budget: bytes reserved now, and the most that may be.
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicU64,
    limit: u64,
}

impl Budget {
    pub(crate) fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            used: AtomicU64::new(0),
            limit,
        })
    }

    /// Bytes reserved now.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self, n: u64) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = used.checked_add(n).filter(|next| *next <= self.limit) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(now) => used = now,
            }
        }
    }

    /// An empty reservation, to grow.
    pub(crate) fn empty(self: &Arc<Self>) -> Reservation {
        Reservation {
            budget: self.clone(),
            n: 0,
        }
    }

    /// Reserves `n` bytes, if the budget allows.
    pub(crate) fn reserve(self: &Arc<Self>, n: u64) -> Option<Reservation> {
        let mut r = self.empty();
        r.grow(n).then_some(r)
    }
}

/// Bytes reserved; given back when dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<Budget>,
    n: u64,
}

impl Reservation {
    /// Reserves `n` more bytes; false (and nothing reserved) when the budget is spent.
    pub(crate) fn grow(&mut self, n: u64) -> bool {
        if self.budget.take(n) {
            self.n += n;
            true
        } else {
            false
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.n, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_and_given_back() {
        let budget = Budget::new(10);
        let mut a = budget.reserve(4).unwrap();
        assert!(a.grow(4));
        assert!(!a.grow(3), "8 + 3 is over 10");
        let b = budget.reserve(2).unwrap();
        assert!(budget.reserve(1).is_none());
        drop(a);
        assert_eq!(budget.used(), 2);
        drop(b);
        assert_eq!(budget.used(), 0);
    }
}
