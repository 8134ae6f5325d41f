//! A run's wall clock that can stop: a run paused while the host does work
//! for it (programmatic tool calling: the program waits for tool results)
//! must not spend its wall time waiting. The server's deadline is the
//! run's start plus its wall time plus every paused interval; while paused
//! there is none. The CPU budget does not stop: a paused program should
//! burn no CPU, and one that keeps computing while "paused" (a process it
//! left running) still meets RLIMIT_CPU, its cgroup's quota and the whole
//! jail's CPU budget, which the server reads from the jail's cgroup
//! (`run.rs`, `CpuBudget`).
//!
//! The jail init's own backstop (it ends the jail a grace after the wall
//! time, in case the server is gone) cannot see the clock, so a pausable
//! run's jail is given its wall time plus [`PauseClock::max_paused`]; past
//! that much paused time the server stops the run as timed out.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PauseState {
    /// Paused since then; `None` while running.
    since: Option<Instant>,
    /// Paused time before `since`.
    total: Duration,
}

impl PauseState {
    fn paused_total(&self, now: Instant) -> Duration {
        self.total + self.since.map_or(Duration::ZERO, |s| now - s)
    }
}

/// A wall clock that stops while paused. Cheap to clone; every clone is
/// the same clock.
#[derive(Debug, Clone)]
pub struct PauseClock {
    state: Arc<watch::Sender<PauseState>>,
    max_paused: Duration,
}

impl PartialEq for PauseClock {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

impl Eq for PauseClock {}

impl PauseClock {
    /// A running clock that may be paused for `max_paused` in all.
    pub fn new(max_paused: Duration) -> PauseClock {
        PauseClock {
            state: Arc::new(watch::Sender::new(PauseState::default())),
            max_paused,
        }
    }

    /// Stops the clock (nothing if it is stopped).
    pub fn pause(&self) {
        self.state.send_modify(|s| {
            if s.since.is_none() {
                s.since = Some(Instant::now());
            }
        });
    }

    /// Starts the clock again (nothing if it runs).
    pub fn resume(&self) {
        self.state.send_modify(|s| {
            if let Some(since) = s.since.take() {
                s.total += since.elapsed();
            }
        });
    }

    pub fn is_paused(&self) -> bool {
        self.state.borrow().since.is_some()
    }

    /// Time spent paused so far (the current pause included).
    pub fn paused_total(&self) -> Duration {
        self.state.borrow().paused_total(Instant::now())
    }

    /// Most paused time a run may have.
    pub fn max_paused(&self) -> Duration {
        self.max_paused
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<PauseState> {
        self.state.subscribe()
    }

    /// When a run started at `started` with `wall` must end: its wall time
    /// plus the time it was paused; while paused, when the pause budget
    /// runs out.
    pub(crate) fn deadline(&self, started: Instant, wall: Duration) -> Instant {
        let s = *self.state.borrow();
        match s.since {
            None => started + wall + s.total,
            Some(since) => since + self.max_paused.saturating_sub(s.total),
        }
    }
}

/// Waits for the clock to change (never, without a clock).
pub(crate) async fn changed(rx: &mut Option<watch::Receiver<PauseState>>) {
    match rx {
        Some(rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn near(a: Instant, b: Instant) -> bool {
        let d = if a > b { a - b } else { b - a };
        d < Duration::from_millis(20)
    }

    #[test]
    fn paused_time_moves_the_deadline_and_the_budget_bounds_a_pause() {
        let clock = PauseClock::new(Duration::from_secs(60));
        let started = Instant::now();
        let wall = Duration::from_secs(2);
        assert_eq!(clock.deadline(started, wall), started + wall);
        clock.pause();
        assert!(clock.is_paused());
        let paused_at = Instant::now();
        // while paused, the only deadline is the pause budget
        assert!(near(
            clock.deadline(started, wall),
            paused_at + Duration::from_secs(60)
        ));
        std::thread::sleep(Duration::from_millis(50));
        clock.resume();
        assert!(!clock.is_paused());
        let paused = clock.paused_total();
        assert!(paused >= Duration::from_millis(50), "{paused:?}");
        assert_eq!(clock.deadline(started, wall), started + wall + paused);
        // a second pause spends the rest of the budget only
        clock.pause();
        assert!(near(
            clock.deadline(started, wall),
            Instant::now() + Duration::from_secs(60) - paused
        ));
    }
}
