//! [`Backoff`]: how long a pool that builds things ahead (warm jails, parked
//! kernels) waits after its builds of one kind fail, so a host that cannot
//! build one (a missing runtime, a full disk) is not hammered by a refill
//! loop.

use std::time::{Duration, Instant};

/// The first wait after a failure; each further failure in a row doubles it.
const FIRST_WAIT: Duration = Duration::from_millis(100);
/// Doublings at most: 100 ms × 2⁹ ≈ 51 s.
const MAX_DOUBLINGS: u32 = 9;

/// Failures in a row of one kind of build, and until when the next attempt
/// must wait: 100 ms after the first, doubling with each further one up to
/// about 51 s; a success clears it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backoff {
    failures_in_row: u32,
    until: Option<Instant>,
}

impl Backoff {
    /// Records a failure at `now`; returns the wait before the next attempt.
    pub fn failed(&mut self, now: Instant) -> Duration {
        self.failures_in_row = self.failures_in_row.saturating_add(1);
        let doublings = (self.failures_in_row - 1).min(MAX_DOUBLINGS);
        let wait = FIRST_WAIT * (1 << doublings);
        self.until = Some(now + wait);
        wait
    }

    /// Records a success: the next failure waits the first wait again.
    pub fn succeeded(&mut self) {
        *self = Backoff::default();
    }

    /// Whether an attempt may start at `now`.
    pub fn allows(&self, now: Instant) -> bool {
        self.until.is_none_or(|t| now >= t)
    }

    /// Whether the last attempt failed (no success since).
    pub fn failing(&self) -> bool {
        self.failures_in_row > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_in_a_row_doubles_the_wait_up_to_about_51_seconds() {
        let mut b = Backoff::default();
        let now = Instant::now();
        let waits: Vec<u64> = (0..12).map(|_| b.failed(now).as_millis() as u64).collect();
        assert_eq!(
            waits,
            [
                100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 51200, 51200, 51200
            ]
        );
    }

    #[test]
    fn an_attempt_waits_out_the_backoff_and_a_success_clears_it() {
        let mut b = Backoff::default();
        let now = Instant::now();
        assert!(b.allows(now) && !b.failing());
        b.failed(now);
        b.failed(now);
        assert!(b.failing());
        assert!(!b.allows(now + Duration::from_millis(199)));
        assert!(b.allows(now + Duration::from_millis(200)));
        b.succeeded();
        assert!(b.allows(now) && !b.failing());
        assert_eq!(b.failed(now), Duration::from_millis(100));
    }
}
