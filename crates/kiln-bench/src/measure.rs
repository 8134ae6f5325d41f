//! The measuring loops: `workers` simulated clients that each take requests
//! from a [`Tickets`] source until it is empty, timing every request with
//! `Instant` and counting failures. The Kiln side runs the clients as
//! concurrent futures on the shared HTTP client; the baseline side runs them
//! as OS threads spawning processes. No sleeps anywhere in here.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::report::Tally;

/// What one successful request measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The request's latency (for D: the exec alone).
    pub latency: Duration,
    /// For D: upload + exec together.
    pub pair: Option<Duration>,
}

impl Sample {
    pub fn single(latency: Duration) -> Sample {
        Sample {
            latency,
            pair: None,
        }
    }
}

/// Everything one run of one side measured.
#[derive(Debug, Clone, Default)]
pub struct RunOutcome {
    /// Latencies of the successful requests.
    pub latencies: Vec<Duration>,
    /// Pair latencies of the successful requests that had one.
    pub pairs: Vec<Duration>,
    /// First request sent → last response received.
    pub wall: Duration,
    pub tally: Tally,
}

impl RunOutcome {
    /// Successful (verified) requests.
    pub fn ok(&self) -> usize {
        self.tally.attempted - self.tally.failed
    }

    pub(crate) fn record(&mut self, r: anyhow::Result<Sample>) {
        self.tally.attempted += 1;
        match r {
            Ok(s) => {
                self.latencies.push(s.latency);
                if let Some(p) = s.pair {
                    self.pairs.push(p);
                }
            }
            Err(e) => {
                self.tally.failed += 1;
                if self.tally.first_error.is_none() {
                    self.tally.first_error = Some(format!("{e:#}"));
                }
            }
        }
    }

    fn merge(&mut self, other: RunOutcome) {
        self.latencies.extend(other.latencies);
        self.pairs.extend(other.pairs);
        self.tally.absorb(other.tally);
    }
}

/// How requests are handed to the clients.
#[derive(Debug)]
pub enum Tickets {
    /// `total` requests shared by all clients (whoever is free takes the next).
    Shared { total: usize, next: AtomicUsize },
    /// Every client sends exactly this many, one after another.
    PerWorker(usize),
}

impl Tickets {
    pub fn shared(total: usize) -> Tickets {
        Tickets::Shared {
            total,
            next: AtomicUsize::new(0),
        }
    }

    /// The next request index for a client that has sent `sent` so far.
    fn take(&self, sent: usize) -> Option<usize> {
        match self {
            Tickets::Shared { total, next } => {
                let i = next.fetch_add(1, Ordering::Relaxed);
                (i < *total).then_some(i)
            }
            Tickets::PerWorker(n) => (sent < *n).then_some(sent),
        }
    }
}

/// Kiln side: `workers` concurrent clients; `one(worker, index)` sends and
/// verifies one request.
pub async fn kiln_workers<F, Fut>(workers: usize, tickets: Tickets, one: F) -> RunOutcome
where
    F: Fn(usize, usize) -> Fut,
    Fut: Future<Output = anyhow::Result<Sample>>,
{
    let tickets = &tickets;
    let one = &one;
    let start = Instant::now();
    let per_worker = futures::future::join_all((0..workers).map(|w| async move {
        let mut out = RunOutcome::default();
        let mut sent = 0;
        while let Some(i) = tickets.take(sent) {
            sent += 1;
            out.record(one(w, i).await);
        }
        out
    }))
    .await;
    let wall = start.elapsed();
    let mut all = RunOutcome::default();
    for o in per_worker {
        all.merge(o);
    }
    all.wall = wall;
    all
}

/// Baseline side: `workers` OS threads; `one(worker, index)` spawns and
/// verifies one process. Blocks the calling thread (use it from
/// `tokio::task::block_in_place`).
pub fn baseline_workers<F>(workers: usize, tickets: Tickets, one: F) -> RunOutcome
where
    F: Fn(usize, usize) -> anyhow::Result<Sample> + Sync,
{
    let tickets = &tickets;
    let one = &one;
    let start = Instant::now();
    let per_worker: Vec<RunOutcome> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                s.spawn(move || {
                    let mut out = RunOutcome::default();
                    let mut sent = 0;
                    while let Some(i) = tickets.take(sent) {
                        sent += 1;
                        out.record(one(w, i));
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| RunOutcome {
                    tally: Tally {
                        attempted: 1,
                        failed: 1,
                        first_error: Some("a baseline worker thread panicked".into()),
                    },
                    ..RunOutcome::default()
                })
            })
            .collect()
    });
    let wall = start.elapsed();
    let mut all = RunOutcome::default();
    for o in per_worker {
        all.merge(o);
    }
    all.wall = wall;
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test]
    async fn shared_tickets_are_each_sent_once_across_clients() {
        let seen = Mutex::new(Vec::new());
        let out = kiln_workers(4, Tickets::shared(30), |w, i| {
            seen.lock().unwrap().push(i);
            async move {
                assert!(w < 4);
                tokio::task::yield_now().await;
                Ok(Sample::single(Duration::from_millis(1)))
            }
        })
        .await;
        let mut seen = seen.into_inner().unwrap();
        seen.sort_unstable();
        assert_eq!(seen, (0..30).collect::<Vec<_>>());
        assert_eq!(out.tally.attempted, 30);
        assert_eq!(out.ok(), 30);
        assert_eq!(out.latencies.len(), 30);
    }

    #[tokio::test]
    async fn failures_are_counted_and_the_first_one_kept() {
        let out = kiln_workers(1, Tickets::shared(5), |_, i| async move {
            if i % 2 == 1 {
                anyhow::bail!("request {i} wrong")
            }
            Ok(Sample {
                latency: Duration::from_millis(2),
                pair: Some(Duration::from_millis(3)),
            })
        })
        .await;
        assert_eq!(out.tally.attempted, 5);
        assert_eq!(out.tally.failed, 2);
        assert_eq!(out.ok(), 3);
        assert_eq!(out.tally.first_error.as_deref(), Some("request 1 wrong"));
        assert_eq!(out.latencies.len(), 3);
        assert_eq!(out.pairs.len(), 3);
    }

    #[test]
    fn per_worker_tickets_give_every_thread_its_own_sequence() {
        let seen = Mutex::new(Vec::new());
        let out = baseline_workers(3, Tickets::PerWorker(4), |w, i| {
            seen.lock().unwrap().push((w, i));
            Ok(Sample::single(Duration::from_millis(1)))
        });
        let mut seen = seen.into_inner().unwrap();
        seen.sort_unstable();
        let want: Vec<(usize, usize)> = (0..3).flat_map(|w| (0..4).map(move |i| (w, i))).collect();
        assert_eq!(seen, want);
        assert_eq!(out.tally.attempted, 12);
        assert!(out.wall > Duration::ZERO);
    }

    #[test]
    fn a_panicking_baseline_thread_counts_as_a_failure() {
        let out = baseline_workers(2, Tickets::PerWorker(1), |w, _| {
            if w == 1 {
                panic!("boom");
            }
            Ok(Sample::single(Duration::from_millis(1)))
        });
        assert_eq!(out.tally.attempted, 2);
        assert_eq!(out.tally.failed, 1);
    }
}
