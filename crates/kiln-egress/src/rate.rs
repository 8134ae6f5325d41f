//! Rate limits: `"60/min"` parsed into a [`Rate`], enforced by a keyed token
//! bucket ([`Limiter`]): each key (a service, or a service and a user) may
//! burst up to `count` calls and then gets `count` per `per` back, evenly.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `count` calls per `per`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub per: Duration,
}

impl Rate {
    /// Parses `"<count>/<unit>"`, unit one of `s`/`sec`/`second`,
    /// `m`/`min`/`minute`, `h`/`hour`, `d`/`day`.
    pub fn parse(s: &str) -> Result<Rate, String> {
        let (count, unit) = s
            .split_once('/')
            .ok_or_else(|| format!("rate {s:?} is not <count>/<unit> (e.g. \"60/min\")"))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| format!("rate {s:?}: {count:?} is not a whole number"))?;
        if count == 0 {
            return Err(format!("rate {s:?}: the count must be at least 1"));
        }
        let secs = match unit.trim() {
            "s" | "sec" | "second" => 1,
            "m" | "min" | "minute" => 60,
            "h" | "hour" => 3600,
            "d" | "day" => 86_400,
            other => {
                return Err(format!(
                    "rate {s:?}: unknown unit {other:?} (use s, min, hour or day)"
                ));
            }
        };
        Ok(Rate {
            count,
            per: Duration::from_secs(secs),
        })
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = match self.per.as_secs() {
            1 => "s",
            60 => "min",
            3600 => "hour",
            86_400 => "day",
            n => return write!(f, "{}/{n}s", self.count),
        };
        write!(f, "{}/{unit}", self.count)
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Keys kept before full buckets are forgotten (a full bucket is the same
/// as no bucket).
const PRUNE_ABOVE: usize = 4096;

/// A token bucket per key.
#[derive(Debug)]
pub struct Limiter {
    rate: Rate,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Limiter {
    pub fn new(rate: Rate) -> Limiter {
        Limiter {
            rate,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn rate(&self) -> Rate {
        self.rate
    }

    fn refill_per_sec(&self) -> f64 {
        f64::from(self.rate.count) / self.rate.per.as_secs_f64()
    }

    /// Takes one token for `key` at `now`, or says how long until one is
    /// there.
    pub fn take(&self, key: &str, now: Instant) -> Result<(), Duration> {
        let cap = f64::from(self.rate.count);
        let per_sec = self.refill_per_sec();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() > PRUNE_ABOVE {
            buckets.retain(|_, b| {
                b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * per_sec < cap
            });
        }
        let b = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: cap,
            at: now,
        });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * per_sec).min(cap);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / per_sec))
        }
    }

    /// Gives back a token taken by [`Limiter::take`] for a call that was
    /// refused later for another reason.
    pub fn give_back(&self, key: &str) {
        let cap = f64::from(self.rate.count);
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = buckets.get_mut(key) {
            b.tokens = (b.tokens + 1.0).min(cap);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_in_the_seed_shape_and_print_back() {
        let r = Rate::parse("60/min").expect("parse");
        assert_eq!(r.count, 60);
        assert_eq!(r.per, Duration::from_secs(60));
        assert_eq!(r.to_string(), "60/min");
        assert_eq!(Rate::parse("5/s").expect("parse").to_string(), "5/s");
        assert_eq!(
            Rate::parse(" 100 / hour ").expect("parse").to_string(),
            "100/hour"
        );
        for bad in ["60", "0/min", "x/min", "60/fortnight", "-1/s", ""] {
            assert!(Rate::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_bucket_allows_its_burst_then_refills_evenly() {
        let l = Limiter::new(Rate::parse("3/min").expect("rate"));
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(l.take("deepl", t0).is_ok());
        }
        let wait = l.take("deepl", t0).expect_err("burst exhausted");
        assert!(
            wait > Duration::from_secs(19) && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
        // another key has its own bucket
        assert!(l.take("other", t0).is_ok());
        // one token is back after a third of a minute
        assert!(l.take("deepl", t0 + Duration::from_secs(20)).is_ok());
        assert!(l.take("deepl", t0 + Duration::from_secs(20)).is_err());
    }

    #[test]
    fn a_token_given_back_can_be_taken_again() {
        let l = Limiter::new(Rate::parse("1/hour").expect("rate"));
        let t0 = Instant::now();
        assert!(l.take("k", t0).is_ok());
        assert!(l.take("k", t0).is_err());
        l.give_back("k");
        assert!(l.take("k", t0).is_ok());
    }

    #[test]
    fn many_keys_do_not_grow_without_bound() {
        let l = Limiter::new(Rate::parse("10/s").expect("rate"));
        let t0 = Instant::now();
        for i in 0..(PRUNE_ABOVE * 2) {
            let _ = l.take(&format!("u{i}"), t0);
        }
        // a second later every bucket is full again and is forgotten
        let _ = l.take("last", t0 + Duration::from_secs(2));
        let n = l.buckets.lock().expect("lock").len();
        assert!(n <= PRUNE_ABOVE + 1, "{n} buckets kept");
    }
}
