//! The kernel registry against a fake kernel host: one evaluation at a
//! time, idle expiry, caps per principal, cancel, a lost kernel; and an
//! evaluation as a run of the one registry.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_core::access::Caller;
use kiln_core::{Language, Limits};
use kiln_sandbox::{
    BoxFuture, EvalError, EvalLimits, EvalResult, KernelError, KernelLost, OutputSink, OutputStream,
};
use tokio::sync::Notify;

use super::*;
use crate::eval::Eval;
use crate::kernel_host::{HostedKernel, KernelHost};
use crate::runs::{AuditRecord, AuditSink, Phase, RunEvent, Runs, RunsConfig, StartOptions};

/// What one fake kernel went through.
#[derive(Default)]
struct Seen {
    lost: Mutex<Option<KernelLost>>,
    interrupted: Notify,
    interrupts: AtomicUsize,
    evaluating: Notify,
    closed: AtomicBool,
    released: AtomicBool,
}

#[derive(Default)]
struct FakeHost {
    kernels: Mutex<Vec<Arc<Seen>>>,
}

impl FakeHost {
    fn kernel(&self, i: usize) -> Arc<Seen> {
        Arc::clone(&self.kernels.lock().unwrap()[i])
    }
}

impl KernelHost for FakeHost {
    fn can_start(&self, _language: Language) -> Result<(), KernelsError> {
        Ok(())
    }

    fn start(
        &self,
        _language: Language,
        _limits: Limits,
        _max_age: Duration,
    ) -> BoxFuture<'_, Result<Box<dyn HostedKernel>, KernelsError>> {
        let seen = Arc::new(Seen::default());
        self.kernels.lock().unwrap().push(Arc::clone(&seen));
        Box::pin(async move { Ok(Box::new(FakeKernel(seen)) as Box<dyn HostedKernel>) })
    }

    fn ready(&self) -> bool {
        true
    }
}

/// Evaluates `block` until interrupted (then raises `KeyboardInterrupt`),
/// `oom` by dying, anything else by printing it.
struct FakeKernel(Arc<Seen>);

/// An evaluation that printed `stdout` and raised `ename`, if any.
fn answer(stdout: &str, ename: Option<&str>) -> EvalResult {
    EvalResult {
        stdout: stdout.as_bytes().to_vec(),
        error: ename.map(|ename| EvalError {
            ename: ename.into(),
            evalue: String::new(),
            traceback: Vec::new(),
        }),
        wall_time: Duration::from_millis(5),
        cpu_time: Some(Duration::from_millis(3)),
        memory_peak: Some(1 << 20),
        ..EvalResult::default()
    }
}

impl HostedKernel for FakeKernel {
    fn eval<'a>(
        &'a self,
        code: &'a str,
        _limits: EvalLimits,
        sink: Option<&'a OutputSink>,
    ) -> BoxFuture<'a, Result<EvalResult, KernelError>> {
        Box::pin(async move {
            if let Some(lost) = self.lost() {
                return Err(KernelError::Lost(lost));
            }
            self.0.evaluating.notify_one();
            match code {
                "block" => {
                    self.0.interrupted.notified().await;
                    Ok(answer("", Some("KeyboardInterrupt")))
                }
                "oom" => {
                    *self.0.lost.lock().unwrap() = Some(KernelLost::OutOfMemory);
                    Err(KernelError::Lost(KernelLost::OutOfMemory))
                }
                text => {
                    if let Some(sink) = sink {
                        sink.call(OutputStream::Stdout, text.as_bytes());
                    }
                    Ok(answer(text, None))
                }
            }
        })
    }

    fn interrupt(&self) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            self.0.interrupts.fetch_add(1, Ordering::SeqCst);
            self.0.interrupted.notify_one();
            self.lost().is_none()
        })
    }

    fn lost(&self) -> Option<KernelLost> {
        self.0.lost.lock().unwrap().clone()
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.0.closed.store(true, Ordering::SeqCst);
            *self.0.lost.lock().unwrap() = Some(KernelLost::Closed);
        })
    }

    fn workspace(&self) -> Option<(PathBuf, (u32, u32))> {
        None
    }

    fn release(&self) {
        self.0.released.store(true, Ordering::SeqCst);
    }

    fn memory_now(&self) -> Option<u64> {
        None
    }
}

fn registry(tweak: impl FnOnce(&mut KernelsConfig)) -> (Kernels, Arc<FakeHost>) {
    let host = Arc::new(FakeHost::default());
    let mut cfg = KernelsConfig {
        busy_wait: Duration::from_millis(50),
        ..KernelsConfig::default()
    };
    tweak(&mut cfg);
    (Kernels::hosted(host.clone(), cfg), host)
}

fn owner(user: &str) -> Owner {
    Owner::of(&Caller::identified("local", user))
}

async fn session(kernels: &Kernels, user: &str) -> Arc<Kernel> {
    let info = kernels
        .create(&owner(user), "py", None)
        .await
        .expect("create");
    kernels.get(&info.id).expect("listed")
}

#[tokio::test]
async fn a_kernel_evaluates_one_thing_at_a_time() {
    let (kernels, host) = registry(|_| {});
    let s = session(&kernels, "alice").await;
    let first = tokio::spawn({
        let (kernels, s) = (kernels.clone(), Arc::clone(&s));
        async move { kernels.evaluate(s, "block".into(), None, None, None).await }
    });
    host.kernel(0).evaluating.notified().await;
    assert!(kernels.info(&s).busy);
    assert_eq!(kernels.busy(), 1);
    let second = kernels
        .evaluate(Arc::clone(&s), "1".into(), None, None, None)
        .await;
    assert_eq!(second.unwrap_err(), KernelsError::Busy);
    kernels.interrupt(&s).await.expect("interrupt");
    let r = first.await.unwrap().expect("the first answers");
    assert_eq!(r.error.unwrap().ename, "KeyboardInterrupt");
    // its turn is free again
    let r = kernels
        .evaluate(Arc::clone(&s), "hi".into(), None, None, None)
        .await
        .expect("evaluated");
    assert_eq!(r.stdout, b"hi");
    assert_eq!(kernels.info(&s).evaluations, 2);
}

#[tokio::test]
async fn an_idle_kernel_expires_and_a_busy_one_waits_for_its_evaluation() {
    let (kernels, host) = registry(|c| c.idle_ttl = Duration::from_millis(30));
    let idle = session(&kernels, "alice").await;
    let busy = session(&kernels, "bob").await;
    let running = tokio::spawn({
        let (kernels, s) = (kernels.clone(), Arc::clone(&busy));
        async move { kernels.evaluate(s, "block".into(), None, None, None).await }
    });
    host.kernel(1).evaluating.notified().await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(kernels.sweep().await, 1, "only the idle one");
    assert!(matches!(
        kernels.get(idle.id()),
        Err(KernelsError::NotFound)
    ));
    let seen = host.kernel(0);
    assert!(seen.closed.load(Ordering::SeqCst) && seen.released.load(Ordering::SeqCst));
    assert_eq!(kernels.live(), 1);
    kernels.interrupt(&busy).await.unwrap();
    running.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert_eq!(kernels.sweep().await, 1);
    assert_eq!(kernels.live(), 0);
}

#[tokio::test]
async fn kernels_are_capped_per_principal_and_per_node() {
    let (kernels, _) = registry(|c| {
        c.max_per_owner = 1;
        c.max_total = 2;
    });
    let mine = session(&kernels, "alice").await;
    let again = kernels.create(&owner("alice"), "py", None).await;
    assert_eq!(again.unwrap_err(), KernelsError::OwnerCap(1));
    session(&kernels, "bob").await;
    let third = kernels.create(&owner("carol"), "py", None).await;
    assert_eq!(third.unwrap_err(), KernelsError::NodeFull(2));
    // a closed kernel gives its place back
    kernels.delete(mine.id()).await.unwrap();
    session(&kernels, "alice").await;
    let unsupported = kernels.create(&owner("dave"), "bash", None).await;
    assert!(matches!(unsupported, Err(KernelsError::Language(_))));
}

#[tokio::test]
async fn a_lost_kernel_says_why_from_then_on_and_frees_its_place_and_slot() {
    let (kernels, host) = registry(|c| c.max_per_owner = 1);
    let s = session(&kernels, "alice").await;
    let lost = KernelsError::Lost(KernelLost::OutOfMemory);
    let r = kernels.evaluate(Arc::clone(&s), "oom".into(), None, None, None);
    assert_eq!(r.await.unwrap_err(), lost);
    assert!(host.kernel(0).released.load(Ordering::SeqCst));
    assert_eq!(kernels.info(&s).lost, Some(KernelLost::OutOfMemory));
    let r = kernels.evaluate(Arc::clone(&s), "1".into(), None, None, None);
    assert_eq!(r.await.unwrap_err(), lost);
    assert_eq!(kernels.interrupt(&s).await.unwrap_err(), lost);
    // it counts against no cap: the owner may start another
    assert_eq!(kernels.live(), 0);
    session(&kernels, "alice").await;
}

#[derive(Debug, Default)]
struct Audit(Mutex<Vec<AuditRecord>>);

impl AuditSink for Audit {
    fn record(&self, r: &AuditRecord) {
        self.0.lock().unwrap().push(r.clone());
    }
}

/// A run registry whose executor is never asked (evaluations run in their
/// kernel), auditing into the returned sink.
fn runs() -> (Runs, Arc<Audit>) {
    struct Unused;
    impl crate::Execute for Unused {
        fn execute<'a>(
            &'a self,
            _run: &'a crate::RunContext,
            _work: crate::Work,
        ) -> futures::future::BoxFuture<'a, Result<crate::ExecResult, crate::ExecError>> {
            Box::pin(async { Err(crate::ExecError::Internal("no executor here".into())) })
        }
    }
    let audit = Arc::new(Audit::default());
    let cfg = RunsConfig {
        audit: Some(audit.clone()),
        ..RunsConfig::default()
    };
    (Runs::new(Arc::new(Unused), cfg), audit)
}

#[tokio::test]
async fn an_evaluation_is_a_run_with_its_output_usage_and_audit_record() {
    let (kernels, _) = registry(|_| {});
    let (runs, audit) = runs();
    let s = session(&kernels, "alice").await;
    let caller = Caller::identified("local", "alice");
    let work = crate::Work::Eval(Eval::new(&kernels, Arc::clone(&s), "hi".into(), None));
    let w = runs.start(caller, work, StartOptions::default()).unwrap();
    let outcome = w.outcome().await;
    let r = outcome.as_ref().as_ref().expect("a result");
    assert_eq!(r.stdout, "hi");
    assert_eq!(r.evaluation.as_ref().unwrap().stdout, b"hi");
    let usage = r.usage.run.as_ref().expect("the run step's usage");
    assert_eq!(usage.cpu, Some(Duration::from_millis(3)));
    assert_eq!(usage.memory_peak, Some(1 << 20));
    let mut sub = w.subscribe();
    let mut printed = String::new();
    while let Some(ev) = sub.next().await {
        if let RunEvent::Output { text, .. } = ev {
            printed.push_str(&text);
        }
    }
    assert_eq!(printed, "hi");
    assert_eq!(w.info().phase, Phase::Finished);
    let records = audit.0.lock().unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].event, "evaluation");
    assert_eq!(records[0].run_id, w.id().as_str());
    assert_eq!(records[0].session_id.as_deref(), Some(s.id().as_str()));
}

#[tokio::test]
async fn cancelling_an_evaluations_run_interrupts_its_kernel_and_the_state_stays() {
    let (kernels, host) = registry(|_| {});
    let (runs, _) = runs();
    let s = session(&kernels, "alice").await;
    let caller = Caller::identified("local", "alice");
    let start = |code: &str| {
        let work = crate::Work::Eval(Eval::new(&kernels, Arc::clone(&s), code.into(), None));
        runs.start(caller.clone(), work, StartOptions::default())
            .unwrap()
    };
    // by the registry's cancel
    let w = start("block");
    host.kernel(0).evaluating.notified().await;
    w.cancel();
    let outcome = tokio::time::timeout(Duration::from_secs(5), w.outcome())
        .await
        .expect("a cancel interrupts the kernel");
    let r = outcome
        .as_ref()
        .as_ref()
        .expect("the interrupted evaluation answers");
    assert!(r.cancelled);
    assert_eq!(
        r.evaluation.as_ref().unwrap().error.as_ref().unwrap().ename,
        "KeyboardInterrupt"
    );
    assert_eq!(w.info().phase, Phase::Cancelled);
    // by the session's interrupt: it cancels the run evaluating
    let w = start("block");
    host.kernel(0).evaluating.notified().await;
    kernels.interrupt(&s).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(5), w.outcome())
        .await
        .expect("the session's interrupt ends the run evaluating");
    assert!(outcome.as_ref().as_ref().unwrap().cancelled);
    assert_eq!(host.kernel(0).interrupts.load(Ordering::SeqCst), 2);
    // the kernel lives on; a busy kernel fails its run with the kernel's error
    let blocker = start("block");
    host.kernel(0).evaluating.notified().await;
    let busy = start("1").outcome().await;
    assert_eq!(
        busy.as_ref().as_ref().unwrap_err(),
        &crate::ExecError::Kernel(KernelsError::Busy)
    );
    blocker.cancel();
    let w = start("still here");
    assert_eq!(
        w.outcome().await.as_ref().as_ref().unwrap().stdout,
        "still here"
    );
}
