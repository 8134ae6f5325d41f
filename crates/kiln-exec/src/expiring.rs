//! The one expiry rule of every registry: an entry expires once it has
//! been idle for its TTL (the registry's, or less) or has lived for the
//! maximum age, however busy. [`Expiring`] keeps the clocks; the registry
//! sweeps — it lists what expired, does what closing takes (kill a kernel,
//! delete a session's files), then removes each entry that is still
//! expired (one used meanwhile stays).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Entry<V> {
    value: V,
    created: Instant,
    used: Instant,
    ttl: Duration,
}

impl<V> Entry<V> {
    /// Made and used at `now`.
    fn new(value: V, ttl: Duration, now: Instant) -> Self {
        Entry {
            value,
            created: now,
            used: now,
            ttl,
        }
    }

    fn expired(&self, now: Instant, max_age: Duration) -> bool {
        now.saturating_duration_since(self.used) >= self.ttl
            || now.saturating_duration_since(self.created) >= max_age
    }
}

/// Values by key, with an idle TTL and a maximum age.
pub struct Expiring<K, V> {
    idle_ttl: Duration,
    max_age: Duration,
    map: Mutex<HashMap<K, Entry<V>>>,
}

impl<K, V> std::fmt::Debug for Expiring<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Expiring")
            .field("idle_ttl", &self.idle_ttl)
            .field("max_age", &self.max_age)
            .finish_non_exhaustive()
    }
}

impl<K: Eq + Hash + Clone, V: Clone> Expiring<K, V> {
    /// Entries idle for `idle_ttl` or older than `max_age` expire
    /// (`Duration::MAX`: no maximum age).
    pub fn new(idle_ttl: Duration, max_age: Duration) -> Self {
        Expiring {
            idle_ttl,
            max_age,
            map: Mutex::new(HashMap::new()),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<K, Entry<V>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `value` under `key`, used now, with the registry's idle TTL
    /// or `ttl` if that is less.
    pub fn insert(&self, key: K, value: V, ttl: Option<Duration>) {
        self.insert_at(key, value, ttl, Instant::now());
    }

    /// Adds `value` under `key`, made and used at `now`.
    pub fn insert_at(&self, key: K, value: V, ttl: Option<Duration>, now: Instant) {
        let ttl = ttl.map_or(self.idle_ttl, |t| t.min(self.idle_ttl));
        self.map().insert(key, Entry::new(value, ttl, now));
    }

    /// The value kept under `key`, used at `now`; `value` is added first
    /// (made and used at `now`) if there was none, so of two callers adding
    /// the same key at once both get the one kept.
    pub fn get_or_insert_at(&self, key: K, value: V, now: Instant) -> V {
        let ttl = self.idle_ttl;
        let mut map = self.map();
        let e = map
            .entry(key)
            .or_insert_with(|| Entry::new(value, ttl, now));
        e.used = now;
        e.value.clone()
    }

    /// Marks `key` used now (nothing if it is not kept).
    pub fn touch(&self, key: &K) {
        self.touch_at(key, Instant::now());
    }

    /// Marks `key` used at `at`.
    pub fn touch_at(&self, key: &K, at: Instant) {
        if let Some(e) = self.map().get_mut(key) {
            e.used = at;
        }
    }

    /// The value of `key` unless it is expired as of `now` (an expired
    /// one is missed, though kept until the sweep), marked used at `now`.
    pub fn use_at(&self, key: &K, now: Instant) -> Option<V> {
        let mut map = self.map();
        let e = map.get_mut(key)?;
        if e.expired(now, self.max_age) {
            return None;
        }
        e.used = now;
        Some(e.value.clone())
    }

    pub fn get(&self, key: &K) -> Option<V> {
        self.map().get(key).map(|e| e.value.clone())
    }

    pub fn contains(&self, key: &K) -> bool {
        self.map().contains_key(key)
    }

    pub fn remove(&self, key: &K) -> Option<V> {
        self.map().remove(key).map(|e| e.value)
    }

    /// Every value kept.
    pub fn values(&self) -> Vec<V> {
        self.map().values().map(|e| e.value.clone()).collect()
    }

    /// Removes and returns every value.
    pub fn drain(&self) -> Vec<V> {
        self.map().drain().map(|(_, e)| e.value).collect()
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entries expired as of `now` (still kept).
    pub fn expired(&self, now: Instant) -> Vec<(K, V)> {
        self.map()
            .iter()
            .filter(|(_, e)| e.expired(now, self.max_age))
            .map(|(k, e)| (k.clone(), e.value.clone()))
            .collect()
    }

    /// Removes `key` if it is expired as of `now` (not if it was used
    /// since).
    pub fn remove_expired(&self, key: &K, now: Instant) -> Option<V> {
        let mut map = self.map();
        if map.get(key)?.expired(now, self.max_age) {
            map.remove(key).map(|e| e.value)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn an_entry_expires_when_idle_for_its_ttl_and_a_use_restarts_the_clock() {
        let e: Expiring<&str, u32> = Expiring::new(100 * MS, Duration::MAX);
        let t0 = Instant::now();
        e.insert("a", 1, None);
        e.insert("short", 2, Some(10 * MS));
        e.insert("long", 3, Some(Duration::from_secs(3600)));
        let mut late = e.expired(t0 + 50 * MS);
        late.sort();
        assert_eq!(late, [("short", 2)], "a TTL may be lowered");
        let mut later = e.expired(t0 + 200 * MS);
        later.sort();
        assert_eq!(later, [("a", 1), ("long", 3), ("short", 2)], "never raised");
        std::thread::sleep(20 * MS);
        e.touch(&"a");
        // used after the sweep listed it: it stays
        let sweep = Instant::now();
        assert_eq!(e.remove_expired(&"a", sweep), None);
        assert_eq!(e.remove_expired(&"short", sweep), Some(2));
        assert_eq!(e.len(), 2);
        assert!(e.contains(&"a") && !e.contains(&"short"));
    }

    #[test]
    fn a_use_misses_an_expired_entry_and_restarts_a_live_ones_clock() {
        let e: Expiring<&str, u32> = Expiring::new(100 * MS, Duration::MAX);
        let t0 = Instant::now();
        e.insert_at("a", 1, None, t0);
        assert_eq!(e.use_at(&"a", t0 + 90 * MS), Some(1));
        // used at 90 ms: alive at 150 ms, missed at 190 ms but kept for the sweep
        assert!(e.expired(t0 + 150 * MS).is_empty());
        assert_eq!(e.use_at(&"a", t0 + 190 * MS), None);
        assert_eq!(e.expired(t0 + 190 * MS), [("a", 1)]);
        assert_eq!(e.use_at(&"missing", t0), None);
    }

    #[test]
    fn an_entry_expires_at_its_maximum_age_however_busy() {
        let e: Expiring<u8, ()> = Expiring::new(Duration::from_secs(60), 100 * MS);
        let t0 = Instant::now();
        e.insert(1, (), None);
        e.touch(&1);
        assert!(e.expired(t0 + 50 * MS).is_empty());
        assert_eq!(e.expired(t0 + 150 * MS), [(1, ())]);
        assert_eq!(e.remove_expired(&1, t0 + 150 * MS), Some(()));
        assert!(e.is_empty());
        e.insert(2, (), None);
        assert_eq!(e.drain(), [()]);
        assert!(e.get(&2).is_none() && e.values().is_empty());
    }
}
