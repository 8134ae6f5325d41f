//! Runs as objects: the registry every face starts executions through.
//!
//! [`Runs::start`] takes a caller and a request and returns at once with a
//! [`Watch`] on the new run: an id, an event log ([`RunEvent`]s: queued,
//! started, output, file stored, done) any number of watchers can read
//! from the start, and a control side (cancel). The run itself executes on
//! a task of its own; an HTTP request only watches it, so a run can stream,
//! outlive its request, and be looked up, watched and cancelled from
//! elsewhere ([`Runs::get`]).
//!
//! Disconnect policy: dropping the `Watch` a run was started with (the
//! client went away) cancels the run — unless it was started detached, or
//! already ended. Finished runs are kept for a while (and within a byte
//! budget) so they can be collected later.
//!
//! A run that pauses for tool calls (programmatic tool calling) carries a
//! [`crate::ptc::Bridge`] in its request: the bridge, not the registry,
//! holds its rounds and `resume`, and its wall clock stops while paused
//! (`kiln_sandbox::PauseClock`). What a run does is a value, [`Work`]: a
//! program in a fresh jail, a programmatic run, the pipeline in a kernel's
//! seat (handed to the [`Execute`]r), or an evaluation in a live kernel
//! ([`crate::eval`], which the registry runs itself: it takes no queue
//! turn). An egress grant is minted when a run starts and revoked when it
//! ends (the run's id names its owner); and a run id stays node-local
//! (several nodes forward to the owner, the node that holds the run's
//! record).

mod audit;
pub mod log;
pub mod missing;
mod queue;
mod rate;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt as _;
use kiln_core::access::Caller;
use kiln_core::{Nanoid, Owner, Principal};
use kiln_sandbox::{OutputSink, OutputStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

pub use audit::{AUDIT_TARGET, AuditFile, AuditRecord, AuditSink, AuditUsage, TracingAudit};
pub use log::{CHUNK, EventLog, RunEvent, Step, Stream, Subscriber};
pub use queue::{QueueClosed, QueuePermit, RunQueue};
pub use rate::RateLimit;

use crate::types::{ExecError, ExecResult, Execute, OutputFile, Work};

/// Why a run was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// Someone asked (`POST /v1/runs/{id}/cancel`): the run ends with a
    /// result that says so.
    Requested,
    /// The client that started it went away: nobody waits for a result.
    Disconnected,
    /// The server is shutting down and the grace period is over.
    Shutdown,
}

/// The cancel side of a run: a token, and why it fired (the first reason
/// given wins; a token fired by its parent — the registry's kill switch —
/// means shutdown).
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    token: CancellationToken,
    reason: Arc<OnceLock<CancelReason>>,
}

impl Cancel {
    /// A cancel side that also fires with `parent`.
    fn child_of(parent: &CancellationToken) -> Cancel {
        Cancel {
            token: parent.child_token(),
            reason: Arc::default(),
        }
    }

    pub fn cancel(&self, reason: CancelReason) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    pub fn reason(&self) -> Option<CancelReason> {
        match self.reason.get() {
            Some(r) => Some(*r),
            None if self.token.is_cancelled() => Some(CancelReason::Shutdown),
            None => None,
        }
    }
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Queued,
    Running,
    /// Ended with a result (whatever the program's exit).
    Finished,
    /// Ended without a result (refused, or failed before one).
    Failed,
    /// Ended by a cancel.
    Cancelled,
}

impl Phase {
    pub fn as_str(&self) -> &'static str {
        match self {
            Phase::Queued => "queued",
            Phase::Running => "running",
            Phase::Finished => "finished",
            Phase::Failed => "failed",
            Phase::Cancelled => "cancelled",
        }
    }

    pub fn is_over(&self) -> bool {
        matches!(self, Phase::Finished | Phase::Failed | Phase::Cancelled)
    }
}

#[derive(Debug)]
struct Times {
    started: Option<SystemTime>,
    finished: Option<SystemTime>,
    /// When it ended (for retention).
    ended_at: Option<Instant>,
}

/// The phase a run ends in with `outcome`.
fn ended(outcome: &Result<ExecResult, ExecError>) -> Phase {
    match outcome {
        Ok(r) if r.cancelled => Phase::Cancelled,
        Ok(_) => Phase::Finished,
        Err(ExecError::Cancelled) => Phase::Cancelled,
        Err(_) => Phase::Failed,
    }
}

/// Roughly the memory an ended run's outcome holds beyond its log: the
/// result repeats the output, and names its files.
fn outcome_bytes(outcome: &Result<ExecResult, ExecError>) -> usize {
    match outcome {
        Ok(r) => {
            let files: usize = r
                .files
                .iter()
                .map(|f| f.name.len() + std::mem::size_of::<OutputFile>())
                .sum();
            let deleted: usize = r.deleted_files.iter().map(String::len).sum();
            r.stdout.len() + r.stderr.len() + files + deleted
        }
        Err(e) => e.to_string().len(),
    }
}

/// One run's record, shared by the registry, its task and its watchers.
#[derive(Debug)]
struct Record {
    id: Nanoid,
    caller: Caller,
    lang: &'static str,
    detached: bool,
    created: SystemTime,
    cancel: Cancel,
    log: Arc<EventLog>,
    times: Mutex<Times>,
    /// `x-request-id` of the starting request (for the audit log).
    request_id: Option<String>,
    /// Files in and out, for the audit log.
    files: Mutex<AuditFiles>,
    /// The program's source, as the operator's view of the run shows it
    /// (at most [`KEPT_CODE_BYTES`]).
    code: KeptCode,
    /// The live kernel's session an evaluation ran in ([`Work::Eval`]).
    kernel: Option<Nanoid>,
}

/// Most bytes of a run's source its record keeps (the rest is cut at a
/// character boundary and the cut is said): enough for any program typed or
/// generated by hand, and bounded so a run record stays small.
pub const KEPT_CODE_BYTES: usize = 64 * 1024;

/// A run's source as its record keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptCode {
    /// The first [`KEPT_CODE_BYTES`] at most.
    pub text: String,
    /// Bytes of the whole source.
    pub bytes: usize,
}

impl KeptCode {
    pub fn of(code: &str) -> KeptCode {
        let mut end = code.len().min(KEPT_CODE_BYTES);
        while !code.is_char_boundary(end) {
            end -= 1;
        }
        KeptCode {
            text: code[..end].to_owned(),
            bytes: code.len(),
        }
    }

    /// Whether `text` is only the start of the source.
    pub fn truncated(&self) -> bool {
        self.text.len() < self.bytes
    }
}

#[derive(Debug, Default)]
struct AuditFiles {
    inputs: Vec<AuditFile>,
    outputs: Vec<AuditFile>,
}

impl Record {
    fn new(
        caller: Caller,
        lang: &'static str,
        code: KeptCode,
        kernel: Option<Nanoid>,
        opts: StartOptions,
        cancel: Cancel,
    ) -> Arc<Record> {
        let StartOptions { detach, request_id } = opts;
        Arc::new(Record {
            id: Nanoid::random(),
            caller,
            lang,
            detached: detach,
            created: SystemTime::now(),
            cancel,
            log: EventLog::new(),
            times: Mutex::new(Times {
                started: None,
                finished: None,
                ended_at: None,
            }),
            request_id,
            files: Mutex::default(),
            code,
            kernel,
        })
    }

    fn files(&self) -> MutexGuard<'_, AuditFiles> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn times(&self) -> MutexGuard<'_, Times> {
        self.times.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn phase(&self) -> Phase {
        match self.log.outcome() {
            Some(o) => ended(&o),
            None if self.times().started.is_some() => Phase::Running,
            None => Phase::Queued,
        }
    }
}

/// What an execution sees of its run: who started it, its cancel token, its
/// event log and the queue. The [`Execute`] implementation reports
/// progress through it.
#[derive(Debug, Clone)]
pub struct RunContext {
    record: Arc<Record>,
    queue: Arc<RunQueue>,
}

impl RunContext {
    /// A context outside any registry, with a queue of its own (tests, the
    /// CLI).
    pub fn standalone(caller: Caller, lang: &'static str) -> RunContext {
        RunContext {
            record: Record::new(
                caller,
                lang,
                KeptCode::of(""),
                None,
                StartOptions::default(),
                Cancel::default(),
            ),
            queue: Arc::new(RunQueue::new(1)),
        }
    }

    pub fn id(&self) -> &Nanoid {
        &self.record.id
    }

    pub fn caller(&self) -> &Caller {
        &self.record.caller
    }

    pub fn principal(&self) -> &Principal {
        &self.record.caller.principal
    }

    /// Fires when the run is cancelled (see [`RunContext::cancel_reason`]).
    pub fn token(&self) -> &CancellationToken {
        self.record.cancel.token()
    }

    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.record.cancel.reason()
    }

    /// Cancels the run (the first reason given wins).
    pub fn cancel(&self, reason: CancelReason) {
        self.record.cancel.cancel(reason);
    }

    /// The run's cancel side, for whoever may cancel it from elsewhere (a
    /// kernel's interrupt cancels the evaluation it runs).
    pub fn cancel_side(&self) -> Cancel {
        self.record.cancel.clone()
    }

    /// The run's event log.
    pub fn log(&self) -> &Arc<EventLog> {
        &self.record.log
    }

    /// Waits for the run's turn to execute (reporting its position);
    /// `Cancelled` if the run is cancelled while it waits.
    pub async fn queue_turn(&self) -> Result<QueuePermit<'_>, ExecError> {
        let (ahead, turn) = self.queue.enter();
        self.record.log.push(RunEvent::Queued { position: ahead });
        let permit = tokio::select! {
            p = turn => p.map_err(|QueueClosed| ExecError::ShuttingDown)?,
            () = self.token().cancelled() => return Err(ExecError::Cancelled),
        };
        self.record.times().started = Some(SystemTime::now());
        Ok(permit)
    }

    /// A step begins (the run is running from the first on, if it took no
    /// queue turn).
    pub fn started(&self, step: Step) {
        self.record
            .times()
            .started
            .get_or_insert_with(SystemTime::now);
        self.record.log.push(RunEvent::Started { step });
    }

    /// Program output, as it is read.
    pub fn output(&self, stream: Stream, bytes: &[u8]) {
        self.record.log.output(stream, bytes);
    }

    /// A sink that appends the program's output to the log as it is read.
    pub fn output_sink(&self) -> OutputSink {
        let log = Arc::clone(&self.record.log);
        OutputSink::new(move |stream, bytes| {
            let s = match stream {
                OutputStream::Stdout => Stream::Stdout,
                OutputStream::Stderr => Stream::Stderr,
            };
            log.output(s, bytes);
        })
    }

    /// An output file was stored.
    pub fn file_stored(&self, f: &OutputFile, bytes: u64) {
        self.record.files().outputs.push(AuditFile {
            name: f.name.clone(),
            bytes,
        });
        self.record.log.push(RunEvent::File(f.clone()));
    }

    /// Reports the inputs placed in the workspace (for the audit log).
    pub fn inputs_staged(&self, files: impl IntoIterator<Item = (String, u64)>) {
        let mut inputs: Vec<AuditFile> = files
            .into_iter()
            .map(|(name, bytes)| AuditFile { name, bytes })
            .collect();
        inputs.sort_by(|a, b| a.name.cmp(&b.name));
        self.record.files().inputs = inputs;
    }

    /// Reports files the run wrote that are not stored (a kernel's
    /// workspace files), for the audit log.
    pub fn outputs_written(&self, files: impl IntoIterator<Item = (String, u64)>) {
        self.record.files().outputs.extend(
            files
                .into_iter()
                .map(|(name, bytes)| AuditFile { name, bytes }),
        );
    }
}

/// Registry settings.
#[derive(Debug, Clone)]
pub struct RunsConfig {
    /// Executions running at once; more wait in the queue.
    pub concurrency: usize,
    /// How long a finished run stays retrievable.
    pub keep_finished: Duration,
    /// Most memory (roughly: output and results) finished runs may hold;
    /// the oldest go first beyond it.
    pub keep_finished_bytes: usize,
    /// At most this many starts per caller in this window; `None`: no limit.
    pub rate_limit: Option<(u32, Duration)>,
    /// Most runs started but not yet executing (waiting for their turn);
    /// further starts are refused with `Busy`. `0`: no bound.
    pub max_waiting: usize,
    /// Where each ended run's audit record goes; `None`: not audited.
    pub audit: Option<Arc<dyn AuditSink>>,
}

impl Default for RunsConfig {
    fn default() -> Self {
        RunsConfig {
            concurrency: 8,
            keep_finished: Duration::from_secs(3600),
            keep_finished_bytes: 64 * 1024 * 1024,
            rate_limit: None,
            max_waiting: 0,
            audit: None,
        }
    }
}

/// How a run is started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StartOptions {
    /// Keep running when the client that started it goes away.
    pub detach: bool,
    /// The starting request's id, recorded in the audit log.
    pub request_id: Option<String>,
}

/// A snapshot of a run.
#[derive(Debug, Clone)]
pub struct RunInfo {
    pub id: Nanoid,
    pub owner: Owner,
    pub lang: &'static str,
    pub detached: bool,
    pub phase: Phase,
    pub created_at: SystemTime,
    pub started_at: Option<SystemTime>,
    pub finished_at: Option<SystemTime>,
    /// How it ended, once it has.
    pub outcome: Option<Arc<Result<ExecResult, ExecError>>>,
}

/// A handle on a run in the registry. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RunHandle(Arc<Record>);

impl RunHandle {
    pub fn id(&self) -> &Nanoid {
        &self.0.id
    }

    /// Who started it.
    pub fn caller(&self) -> &Caller {
        &self.0.caller
    }

    pub fn info(&self) -> RunInfo {
        let t = self.0.times();
        let (started_at, finished_at) = (t.started, t.finished);
        drop(t);
        RunInfo {
            id: self.0.id.clone(),
            owner: Owner::of(&self.0.caller),
            lang: self.0.lang,
            detached: self.0.detached,
            phase: self.0.phase(),
            created_at: self.0.created,
            started_at,
            finished_at,
            outcome: self.0.log.outcome(),
        }
    }

    /// Its source, as kept (see [`KEPT_CODE_BYTES`]).
    pub fn code(&self) -> &KeptCode {
        &self.0.code
    }

    /// The files placed in its workspace and the outputs it stored so far
    /// (names relative to `/mnt/data`, bytes).
    pub fn files(&self) -> (Vec<AuditFile>, Vec<AuditFile>) {
        let f = self.0.files();
        (f.inputs.clone(), f.outputs.clone())
    }

    /// What the program wrote to `stream` so far.
    pub fn text(&self, stream: Stream) -> String {
        self.0.log.text(stream)
    }

    /// Its events from the first on.
    pub fn subscribe(&self) -> Subscriber {
        self.0.log.subscribe()
    }

    /// Asks the run to stop: its processes are killed and it ends with a
    /// result saying it was cancelled. Nothing happens to an ended run.
    pub fn cancel(&self) {
        if self.0.log.outcome().is_none() {
            self.0.cancel.cancel(CancelReason::Requested);
        }
    }

    /// Waits for the run to end.
    pub async fn outcome(&self) -> Arc<Result<ExecResult, ExecError>> {
        let mut sub = self.0.log.subscribe();
        if let Some(o) = self.0.log.outcome() {
            return o;
        }
        while let Some(ev) = sub.next().await {
            if let RunEvent::Done(o) = ev {
                return o;
            }
        }
        // a log always ends with Done
        Arc::new(Err(ExecError::Internal(
            "run ended without an outcome".into(),
        )))
    }
}

/// The handle a run was started with. Dropping it — the client went away —
/// cancels the run unless it was started detached or is over.
#[derive(Debug)]
pub struct Watch {
    handle: RunHandle,
}

impl Watch {
    pub fn handle(&self) -> &RunHandle {
        &self.handle
    }

    pub fn id(&self) -> &Nanoid {
        self.handle.id()
    }
}

impl std::ops::Deref for Watch {
    type Target = RunHandle;
    fn deref(&self) -> &RunHandle {
        &self.handle
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let r = &self.handle.0;
        if !r.detached && r.log.outcome().is_none() {
            tracing::info!(run = %r.id, "client went away: cancelling its run");
            r.cancel.cancel(CancelReason::Disconnected);
        }
    }
}

#[derive(Debug, Default)]
struct Table {
    runs: HashMap<Nanoid, Arc<Record>>,
    /// Ended runs, oldest first, with the bytes each holds.
    ended: VecDeque<(Nanoid, usize)>,
    ended_bytes: usize,
}

#[derive(Debug)]
struct Inner {
    exec: Arc<dyn Execute>,
    queue: Arc<RunQueue>,
    cfg: RunsConfig,
    table: Mutex<Table>,
    rate: Option<RateLimit>,
    /// Cancelled by [`Runs::kill_all`].
    kill_all: CancellationToken,
    closed: AtomicBool,
    /// Runs not ended yet, for [`Runs::wait_idle`].
    active: AtomicUsize,
    /// Of those, kernel evaluations (they take no queue turn).
    evaluating: AtomicUsize,
    idle: Notify,
}

impl std::fmt::Debug for dyn Execute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Execute")
    }
}

/// The run registry. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Runs {
    inner: Arc<Inner>,
}

impl Runs {
    pub fn new(exec: Arc<dyn Execute>, cfg: RunsConfig) -> Runs {
        Runs {
            inner: Arc::new(Inner {
                exec,
                queue: Arc::new(RunQueue::new(cfg.concurrency)),
                rate: cfg
                    .rate_limit
                    .map(|(max, window)| RateLimit::new(max, window)),
                cfg,
                table: Mutex::new(Table::default()),
                kill_all: CancellationToken::new(),
                closed: AtomicBool::new(false),
                active: AtomicUsize::new(0),
                evaluating: AtomicUsize::new(0),
                idle: Notify::new(),
            }),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.inner.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a run and returns at once. Refused when the registry is
    /// closed (`ShuttingDown`) or the caller is over its rate limit
    /// (`RateLimited`); everything else (bad inputs included) ends the run
    /// with an error its watchers see.
    pub fn start(
        &self,
        caller: Caller,
        work: impl Into<Work>,
        opts: StartOptions,
    ) -> Result<Watch, ExecError> {
        let work = work.into();
        let inner = &self.inner;
        if inner.closed.load(Ordering::SeqCst) || inner.kill_all.is_cancelled() {
            return Err(ExecError::ShuttingDown);
        }
        if let Some(retry_after) = self.saturated() {
            metrics::counter!("kiln_runs_refused_total", "reason" => "queue_full").increment(1);
            return Err(ExecError::Busy { retry_after });
        }
        self.admit(&caller)?;
        // the run's token also fires when everything is killed (shutdown)
        let cancel = Cancel::child_of(&inner.kill_all);
        let kernel = match &work {
            Work::Eval(e) => Some(e.session_id().clone()),
            _ => None,
        };
        let evaluation = kernel.is_some();
        let record = Record::new(
            caller,
            work.lang(),
            KeptCode::of(work.code()),
            kernel,
            opts,
            cancel,
        );
        self.expire();
        self.table()
            .runs
            .insert(record.id.clone(), Arc::clone(&record));
        inner.active.fetch_add(1, Ordering::SeqCst);
        if evaluation {
            inner.evaluating.fetch_add(1, Ordering::SeqCst);
        }
        metrics::gauge!("kiln_runs_active").increment(1.0);

        let ctx = RunContext {
            record: Arc::clone(&record),
            queue: Arc::clone(&inner.queue),
        };
        let runs = self.clone();
        let span = tracing::info_span!("run", run_id = %record.id, lang = record.lang);
        tokio::spawn(
            async move {
                let execution = std::panic::AssertUnwindSafe(match work {
                    Work::Eval(e) => e.run(&ctx).boxed(),
                    work => runs.inner.exec.execute(&ctx, work),
                });
                let outcome = match execution.catch_unwind().await {
                    Ok(r) => r,
                    Err(panic) => {
                        let what = panic
                            .downcast_ref::<&str>()
                            .map(|s| (*s).to_owned())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_default();
                        tracing::error!(panic = %what, "execution panicked");
                        Err(ExecError::Internal(format!("execution panicked: {what}")))
                    }
                };
                let outcome = match outcome {
                    Err(ExecError::Cancelled)
                        if ctx.cancel_reason() == Some(CancelReason::Shutdown) =>
                    {
                        Err(ExecError::ShuttingDown)
                    }
                    other => other,
                };
                if evaluation {
                    runs.inner.evaluating.fetch_sub(1, Ordering::SeqCst);
                }
                runs.end(&ctx.record, outcome);
            }
            .instrument(span),
        );
        Ok(Watch {
            handle: RunHandle(record),
        })
    }

    /// Counts one start of code by `caller` against the per-caller rate
    /// limit (`RateLimited` past it). [`Runs::start`] asks it for every
    /// run, kernel evaluations included.
    pub fn admit(&self, caller: &Caller) -> Result<(), ExecError> {
        match &self.inner.rate {
            Some(rate) => rate
                .check(caller.principal.user_key().as_str(), Instant::now())
                .map_err(|retry_after| ExecError::RateLimited { retry_after }),
            None => Ok(()),
        }
    }

    /// When as many runs wait for their turn as `max_waiting` allows: a
    /// guess at how long until one may start (a turn per slot, a second
    /// each, 1–30 s). Faces ask before they read a large body.
    pub fn saturated(&self) -> Option<Duration> {
        let inner = &self.inner;
        let max = inner.cfg.max_waiting;
        if max == 0 {
            return None;
        }
        let waiting = inner
            .active
            .load(Ordering::SeqCst)
            .saturating_sub(inner.evaluating.load(Ordering::SeqCst))
            .saturating_sub(inner.queue.running());
        (waiting >= max).then(|| {
            let turns = waiting / inner.queue.capacity() + 1;
            Duration::from_secs(turns.clamp(1, 30) as u64)
        })
    }

    /// Records the end of a run.
    fn end(&self, record: &Arc<Record>, outcome: Result<ExecResult, ExecError>) {
        {
            let mut t = record.times();
            t.finished = Some(SystemTime::now());
            t.ended_at = Some(Instant::now());
        }
        if let Some(sink) = &self.inner.cfg.audit {
            sink.record(&AuditRecord::of(record, ended(&outcome), &outcome));
        }
        if let Ok(result) = &outcome {
            missing::count(record.lang, result);
        }
        let kept = outcome_bytes(&outcome);
        record.log.finish(outcome);
        {
            let size = record.log.size() + record.code.text.len() + kept + 512;
            let mut table = self.table();
            table.ended.push_back((record.id.clone(), size));
            table.ended_bytes += size;
        }
        self.expire();
        let inner = &self.inner;
        metrics::gauge!("kiln_runs_active").decrement(1.0);
        if inner.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            inner.idle.notify_waiters();
        }
    }

    /// Forgets ended runs past their time or beyond the byte budget.
    /// Not an [`crate::expiring::Expiring`]: retention counts from a run's
    /// end, not its last use, and a byte budget over all ended runs drops
    /// the oldest first, so the ended runs are a queue in end order.
    fn expire(&self) {
        let cfg = &self.inner.cfg;
        let mut table = self.table();
        while let Some((id, size)) = table.ended.front().cloned() {
            let too_old = table.runs.get(&id).is_none_or(|r| {
                r.times()
                    .ended_at
                    .is_some_and(|t| t.elapsed() >= cfg.keep_finished)
            });
            if !too_old && table.ended_bytes <= cfg.keep_finished_bytes {
                break;
            }
            table.ended.pop_front();
            table.ended_bytes -= size;
            table.runs.remove(&id);
        }
    }

    /// The run `id`, while it runs or is kept.
    pub fn get(&self, id: &Nanoid) -> Option<RunHandle> {
        self.expire();
        self.table().runs.get(id).cloned().map(RunHandle)
    }

    /// Every run running or still kept, newest first (the operator's
    /// console lists them).
    pub fn list(&self) -> Vec<RunHandle> {
        self.expire();
        let mut runs: Vec<RunHandle> = self.table().runs.values().cloned().map(RunHandle).collect();
        runs.sort_by(|a, b| {
            b.0.created
                .cmp(&a.0.created)
                .then_with(|| a.0.id.as_str().cmp(b.0.id.as_str()))
        });
        runs
    }

    /// The execution queue.
    pub fn queue(&self) -> &RunQueue {
        &self.inner.queue
    }

    /// Refuses new runs from now on (shutdown begins); running ones go on.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
    }

    /// Kills every run (shutdown after the grace period).
    pub fn kill_all(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.kill_all.cancel();
    }

    /// Runs not ended yet.
    pub fn active(&self) -> usize {
        self.inner.active.load(Ordering::SeqCst)
    }

    /// Waits until no run is left, at most `limit`; `true` when none is.
    pub async fn wait_idle(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, async {
            loop {
                let notified = self.inner.idle.notified();
                if self.active() == 0 {
                    return;
                }
                notified.await;
            }
        })
        .await
        .is_ok()
    }
}

#[cfg(test)]
mod tests;
