//! One at a time: the one busy/turn rule of every registry. A [`Turn`] is
//! held for the whole of one use (a kernel's evaluation, a runtime
//! session's call); a second user waits for it up to a bound, then is told
//! [`Busy`]. [`Turns`] keeps a turn per key, made on first use and
//! forgotten once nobody holds or waits for it.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::OwnedMutexGuard;

/// The turn was held past the wait.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("busy")]
pub struct Busy;

/// One thing's turn. Cheap to clone: clones are the same turn.
#[derive(Debug, Clone, Default)]
pub struct Turn(Arc<tokio::sync::Mutex<()>>);

/// A turn taken; it ends when this is dropped.
#[derive(Debug)]
pub struct Taken(#[allow(dead_code)] OwnedMutexGuard<()>);

impl Turn {
    /// Waits up to `wait` for the turn.
    pub async fn take(&self, wait: Duration) -> Result<Taken, Busy> {
        tokio::time::timeout(wait, Arc::clone(&self.0).lock_owned())
            .await
            .map(Taken)
            .map_err(|_| Busy)
    }

    /// The turn if it is free now (no wait).
    pub fn try_take(&self) -> Option<Taken> {
        Arc::clone(&self.0).try_lock_owned().ok().map(Taken)
    }

    /// Whether someone has the turn now.
    pub fn busy(&self) -> bool {
        self.0.try_lock().is_err()
    }

    /// Whether anyone but this handle holds or waits for the turn.
    fn shared(&self) -> bool {
        Arc::strong_count(&self.0) > 1
    }
}

/// A turn per key.
#[derive(Debug)]
pub struct Turns<K> {
    turns: Mutex<HashMap<K, Turn>>,
}

impl<K> Default for Turns<K> {
    fn default() -> Self {
        Turns {
            turns: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone> Turns<K> {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<K, Turn>> {
        self.turns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits up to `wait` for `key`'s turn.
    pub async fn take(&self, key: &K, wait: Duration) -> Result<Taken, Busy> {
        let turn = self.map().entry(key.clone()).or_default().clone();
        turn.take(wait).await
    }

    /// Forgets the turns nobody holds or waits for.
    pub fn forget_unused(&self) {
        self.map().retain(|_, t| t.shared());
    }

    /// Keys with a turn kept.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Duration = Duration::ZERO;

    #[tokio::test]
    async fn a_turn_is_one_at_a_time_and_a_second_waits_then_is_busy() {
        let turn = Turn::default();
        let first = turn.take(NOW).await.expect("free");
        assert!(turn.busy());
        assert_eq!(
            turn.take(Duration::from_millis(20)).await.unwrap_err(),
            Busy
        );
        // a waiter gets it as soon as it is given back
        let waiter = tokio::spawn({
            let turn = turn.clone();
            async move { turn.take(Duration::from_secs(5)).await.is_ok() }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        assert!(waiter.await.unwrap());
        assert!(!turn.busy());
        let now = turn.try_take().expect("free, no wait");
        assert!(turn.try_take().is_none());
        drop(now);
    }

    #[tokio::test]
    async fn turns_are_per_key_and_unused_ones_are_forgotten() {
        let turns: Turns<&str> = Turns::default();
        let a = turns.take(&"a", NOW).await.expect("a is free");
        let b = turns.take(&"b", NOW).await.expect("another key's turn");
        assert_eq!(turns.take(&"a", NOW).await.unwrap_err(), Busy);
        drop(b);
        turns.forget_unused();
        assert_eq!(turns.len(), 1, "a is held, b is not");
        drop(a);
        turns.take(&"a", NOW).await.expect("free again");
        turns.forget_unused();
        assert!(turns.is_empty());
    }
}
