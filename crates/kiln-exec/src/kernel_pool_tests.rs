//! Kernels started ahead, against a fake host: a hit hands out a kernel
//! started before the create, a refill follows each take, other limits or
//! an empty pool start their own kernel, a kernel of a template no longer
//! current (or dead) is replaced, shutdown closes every parked kernel, failed
//! starts back off.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_core::{Language, Limits};
use kiln_sandbox::{BoxFuture, EvalLimits, EvalResult, KernelError, KernelLost, OutputSink};

use super::*;

#[derive(Default)]
struct Seen {
    /// The host's count of starts when this one was asked for.
    n: usize,
    max_age: Mutex<Option<Duration>>,
    closed: AtomicBool,
    released: AtomicBool,
    dead: AtomicBool,
    /// Started at idle priority ([`KernelHost::start_ahead`]) and not yet
    /// taken.
    idle: AtomicBool,
}

struct FakeKernel(Arc<Seen>);

impl HostedKernel for FakeKernel {
    fn eval<'a>(
        &'a self,
        _code: &'a str,
        _limits: EvalLimits,
        _sink: Option<&'a OutputSink>,
    ) -> BoxFuture<'a, Result<EvalResult, KernelError>> {
        Box::pin(async { Ok(EvalResult::default()) })
    }

    fn interrupt(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { true })
    }

    fn lost(&self) -> Option<KernelLost> {
        (self.0.dead.load(Ordering::SeqCst) || self.0.closed.load(Ordering::SeqCst))
            .then_some(KernelLost::Closed)
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        self.0.closed.store(true, Ordering::SeqCst);
        Box::pin(async {})
    }

    fn workspace(&self) -> Option<(PathBuf, (u32, u32))> {
        None
    }

    fn release(&self) {
        self.0.released.store(true, Ordering::SeqCst);
    }

    fn memory_now(&self) -> Option<u64> {
        Some(self.0.n as u64)
    }

    fn taken(&self) {
        self.0.idle.store(false, Ordering::SeqCst);
    }
}

struct FakeHost {
    template: Mutex<String>,
    started: Mutex<Vec<Arc<Seen>>>,
    /// While set, starts wait for it to be cleared.
    hold: AtomicBool,
    /// This many starts fail before one succeeds.
    failing: AtomicUsize,
    /// When each start was tried.
    tried: Mutex<Vec<std::time::Instant>>,
}

impl FakeHost {
    fn new() -> Arc<FakeHost> {
        Arc::new(FakeHost {
            template: Mutex::new("py-data".to_owned()),
            started: Mutex::new(Vec::new()),
            hold: AtomicBool::new(false),
            failing: AtomicUsize::new(0),
            tried: Mutex::new(Vec::new()),
        })
    }

    fn started(&self) -> Vec<Arc<Seen>> {
        self.started.lock().unwrap().clone()
    }

    async fn start_as(
        &self,
        max_age: Duration,
        idle: bool,
    ) -> Result<Box<dyn HostedKernel>, KernelsError> {
        while self.hold.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.tried.lock().unwrap().push(std::time::Instant::now());
        let fail = self
            .failing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if fail.is_ok() {
            return Err(KernelsError::Kernel("no room for a jail".to_owned()));
        }
        let mut started = self.started.lock().unwrap();
        let seen = Arc::new(Seen {
            n: started.len(),
            max_age: Mutex::new(Some(max_age)),
            idle: AtomicBool::new(idle),
            ..Seen::default()
        });
        started.push(Arc::clone(&seen));
        Ok(Box::new(FakeKernel(seen)) as Box<dyn HostedKernel>)
    }
}

impl KernelHost for FakeHost {
    fn can_start(&self, _language: Language) -> Result<(), KernelsError> {
        Ok(())
    }

    fn template(&self, _language: Language) -> Result<String, KernelsError> {
        Ok(self.template.lock().unwrap().clone())
    }

    fn start(
        &self,
        _language: Language,
        _limits: Limits,
        max_age: Duration,
    ) -> BoxFuture<'_, Result<Box<dyn HostedKernel>, KernelsError>> {
        Box::pin(self.start_as(max_age, false))
    }

    fn start_ahead(
        &self,
        _language: Language,
        _limits: Limits,
        max_age: Duration,
    ) -> BoxFuture<'_, Result<Box<dyn HostedKernel>, KernelsError>> {
        Box::pin(self.start_as(max_age, true))
    }

    fn ready(&self) -> bool {
        true
    }
}

const MAX_AGE: Duration = Duration::from_secs(3600);

fn py() -> Language {
    Language::resolve("py").unwrap()
}

fn pool(host: &Arc<FakeHost>, per_language: usize) -> Arc<ParkedHost> {
    ParkedHost::start(
        Arc::clone(host) as Arc<dyn KernelHost>,
        ParkedConfig {
            per_language,
            languages: vec![py()],
            limits: Limits::default(),
            max_age: MAX_AGE,
        },
    )
}

/// Which fake kernel `k` is (its start's index, which the fake gives as
/// its memory).
fn index_of(_host: &FakeHost, k: &dyn HostedKernel) -> usize {
    k.memory_now().expect("a fake kernel") as usize
}

fn stats(p: &ParkedHost) -> ParkedStats {
    p.stats()
        .into_iter()
        .find(|(l, _)| *l == py())
        .map(|(_, s)| s)
        .unwrap_or_default()
}

async fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(std::time::Instant::now() < until, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_create_takes_the_kernel_started_ahead_and_another_is_started_behind_it() {
    let host = FakeHost::new();
    let p = pool(&host, 1);
    assert!(p.wait_filled(Duration::from_secs(5)).await);
    assert_eq!(host.started().len(), 1);
    // started ahead with room for its parking in its own life clock
    assert_eq!(
        *host.started()[0].max_age.lock().unwrap(),
        Some(MAX_AGE + PARKED_AT_MOST)
    );
    let k = p.start(py(), Limits::default(), MAX_AGE).await.unwrap();
    assert_eq!(index_of(&host, k.as_ref()), 0, "the one started ahead");
    wait_for("a refill", || stats(&p).ready == 1).await;
    let k2 = p.start(py(), Limits::default(), MAX_AGE).await.unwrap();
    assert_eq!(index_of(&host, k2.as_ref()), 1, "another kernel");
    let s = stats(&p);
    assert_eq!((s.hits, s.misses), (2, 0));
    // never more parked than asked for
    wait_for("the second refill", || stats(&p).ready == 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(host.started().len(), 3);
}

#[tokio::test]
async fn kernels_started_ahead_wait_at_idle_priority_and_a_create_takes_one_at_normal_priority() {
    let host = FakeHost::new();
    let p = pool(&host, 1);
    assert!(p.wait_filled(Duration::from_secs(5)).await);
    assert!(
        host.started()[0].idle.load(Ordering::SeqCst),
        "the refill starts its kernel at idle priority"
    );
    let k = p.start(py(), Limits::default(), MAX_AGE).await.unwrap();
    assert_eq!(index_of(&host, k.as_ref()), 0, "the one started ahead");
    assert!(
        !host.started()[0].idle.load(Ordering::SeqCst),
        "a kernel handed to a create still at idle priority"
    );
    // the next one waits idle again; a create that finds none starts its
    // own at normal priority
    wait_for("a refill", || stats(&p).ready == 1).await;
    assert!(host.started()[1].idle.load(Ordering::SeqCst));
    let other = Limits {
        memory_bytes: Limits::default().memory_bytes * 2,
        ..Limits::default()
    };
    let own = p.start(py(), other, MAX_AGE).await.unwrap();
    assert_eq!(index_of(&host, own.as_ref()), 2, "started for it");
    assert!(!host.started()[2].idle.load(Ordering::SeqCst));
}

#[tokio::test]
async fn a_create_with_other_limits_or_finding_none_starts_its_own_kernel() {
    let host = FakeHost::new();
    let p = pool(&host, 1);
    assert!(p.wait_filled(Duration::from_secs(5)).await);
    let other = Limits {
        memory_bytes: Limits::default().memory_bytes * 2,
        ..Limits::default()
    };
    let k = p.start(py(), other, MAX_AGE).await.unwrap();
    assert_eq!(index_of(&host, k.as_ref()), 1, "started for it");
    assert_eq!(*host.started()[1].max_age.lock().unwrap(), Some(MAX_AGE));
    let k = p.start(py(), Limits::default(), MAX_AGE * 2).await.unwrap();
    assert_eq!(
        index_of(&host, k.as_ref()),
        2,
        "another life: started for it"
    );
    assert_eq!(stats(&p).ready, 1, "the parked one is still there");
    // the pool is empty and its refill cannot finish: a create starts its own
    let k = p.start(py(), Limits::default(), MAX_AGE).await.unwrap();
    assert_eq!(index_of(&host, k.as_ref()), 0);
    host.hold.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let waiting = tokio::spawn({
        let p = Arc::clone(&p);
        async move { p.start(py(), Limits::default(), MAX_AGE).await.map(|_| ()) }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    host.hold.store(false, Ordering::SeqCst);
    waiting.await.unwrap().unwrap();
    let s = stats(&p);
    assert_eq!((s.hits, s.misses), (1, 3));
}

#[tokio::test]
async fn a_kernel_parked_for_another_template_or_dead_is_replaced_not_handed_out() {
    let host = FakeHost::new();
    *host.template.lock().unwrap() = "py-lean".to_owned();
    let p = pool(&host, 1);
    assert!(p.wait_filled(Duration::from_secs(5)).await);
    *host.template.lock().unwrap() = "py-data".to_owned();
    let k = p.start(py(), Limits::default(), MAX_AGE).await.unwrap();
    assert_eq!(index_of(&host, k.as_ref()), 1, "not the lean one");
    assert_eq!(stats(&p).misses, 1);
    wait_for("the lean kernel closed and released", || {
        let s = &host.started()[0];
        s.closed.load(Ordering::SeqCst) && s.released.load(Ordering::SeqCst)
    })
    .await;
    wait_for("a data kernel parked", || stats(&p).ready == 1).await;
    let parked = host.started().last().cloned().unwrap();
    parked.dead.store(true, Ordering::SeqCst);
    let k = p.start(py(), Limits::default(), MAX_AGE).await.unwrap();
    assert!(!Arc::ptr_eq(
        &parked,
        &host.started()[index_of(&host, k.as_ref())]
    ));
    wait_for("the dead kernel released", || {
        parked.released.load(Ordering::SeqCst)
    })
    .await;
    assert!(stats(&p).retired >= 2);
}

#[tokio::test]
async fn shutdown_closes_and_releases_every_parked_kernel_and_stops_refilling() {
    let host = FakeHost::new();
    let p = pool(&host, 2);
    assert!(p.wait_filled(Duration::from_secs(5)).await);
    p.shutdown().await;
    let started = host.started();
    assert_eq!(started.len(), 2);
    for s in &started {
        assert!(s.closed.load(Ordering::SeqCst) && s.released.load(Ordering::SeqCst));
    }
    assert_eq!(stats(&p).ready, 0);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(host.started().len(), 2, "no refill after shutdown");
    // a create still works, on demand
    p.start(py(), Limits::default(), MAX_AGE).await.unwrap();
    assert_eq!(stats(&p).misses, 1);
}

#[tokio::test]
async fn shutdown_does_not_wait_for_a_kernel_still_starting_at_idle_priority() {
    let host = FakeHost::new();
    // the refill's start never ends by itself (a busy node gives an idle
    // kernel no CPU)
    host.hold.store(true, Ordering::SeqCst);
    let p = pool(&host, 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    tokio::time::timeout(Duration::from_secs(2), p.shutdown())
        .await
        .expect("shutdown waited for a kernel starting ahead");
    host.hold.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        host.started().is_empty(),
        "the start went on after shutdown"
    );
}

#[tokio::test]
async fn failed_starts_are_retried_after_a_wait_that_doubles_until_one_succeeds() {
    let host = FakeHost::new();
    host.failing.store(3, Ordering::SeqCst);
    let p = pool(&host, 1);
    wait_for("a kernel parked after three failures", || {
        stats(&p).built == 1
    })
    .await;
    let tried = host.tried.lock().unwrap().clone();
    assert_eq!(tried.len(), 4, "three failed starts and one that worked");
    let gaps: Vec<Duration> = tried.windows(2).map(|w| w[1] - w[0]).collect();
    for (gap, least) in gaps.iter().zip([100, 200, 400]) {
        assert!(
            *gap >= Duration::from_millis(least),
            "retried after {gap:?}, before the {least} ms back-off: {gaps:?}"
        );
    }
    assert_eq!(stats(&p).build_failures, 3);
    p.shutdown().await;
}
