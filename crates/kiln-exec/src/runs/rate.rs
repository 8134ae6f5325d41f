//! Per-caller rate limit on starting runs: at most `max` starts in any
//! `window` (a sliding window of start times per caller).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A sliding-window limiter keyed by caller.
#[derive(Debug)]
pub struct RateLimit {
    max: usize,
    window: Duration,
    starts: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl RateLimit {
    pub fn new(max: u32, window: Duration) -> RateLimit {
        RateLimit {
            max: max.max(1) as usize,
            window,
            starts: Mutex::new(HashMap::new()),
        }
    }

    /// Records a start by `key` at `now`, or says how long until one is
    /// allowed.
    pub fn check(&self, key: &str, now: Instant) -> Result<(), Duration> {
        let mut starts = self.starts.lock().unwrap_or_else(|p| p.into_inner());
        let horizon = now.checked_sub(self.window);
        let expired = |t: &Instant| horizon.is_some_and(|h| *t <= h);
        // forget callers whose window is empty, now and then
        if starts.len() > 4096 {
            starts.retain(|_, q| q.back().is_some_and(|t| !expired(t)));
        }
        let q = starts.entry(key.to_owned()).or_default();
        while q.front().is_some_and(expired) {
            q.pop_front();
        }
        if q.len() >= self.max {
            let oldest = q.front().copied().unwrap_or(now);
            return Err((oldest + self.window).saturating_duration_since(now));
        }
        q.push_back(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_slides_per_caller() {
        let r = RateLimit::new(2, Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(r.check("a", t0).is_ok());
        assert!(r.check("a", t0 + Duration::from_secs(1)).is_ok());
        let wait = r.check("a", t0 + Duration::from_secs(2)).unwrap_err();
        assert_eq!(wait, Duration::from_secs(8));
        // another caller has its own budget
        assert!(r.check("b", t0 + Duration::from_secs(2)).is_ok());
        // the first start leaves the window
        assert!(r.check("a", t0 + Duration::from_secs(10)).is_ok());
    }
}
