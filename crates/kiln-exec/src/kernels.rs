//! Live kernels (Kiln's sessions API): a registry of long-lived
//! interpreters, each in its own jail under its own uid slot, with a
//! workspace that persists between evaluations. Not to be confused with
//! [`crate::sessions`] (seed 000's named *file* workspaces).
//!
//! - Owner: a kernel belongs to the principal that created it (its
//!   [`Owner`]); the faces ask the one access rule, `access::may`.
//! - Caps: at most `max_total` live kernels on the node (503 past it) and
//!   `max_per_owner` per owner (429), counted by [`crate::caps::Caps`] per
//!   principal (the owner's key), whatever face started the kernel and
//!   whatever it is named. The binary gives kernels slots of
//!   their own (`max_total` of them beyond the run concurrency and the warm
//!   pool), so kernels never starve one-shot runs of jails.
//! - Expiry: a kernel idle longer than its TTL (default 30 min) or older
//!   than `max_age` is closed by [`Kernels::sweep`].
//! - One evaluation at a time: a second call waits up to `busy_wait`,
//!   then [`KernelsError::Busy`] (409).
//! - Every evaluation is a run ([`crate::eval`], started through
//!   [`crate::Runs::start`]): its output, cancel (the session's interrupt
//!   cancels the run in progress, which interrupts the kernel), usage and
//!   audit record are the run's.
//! - A kernel that died (out of memory, unresponsive, exited) stays listed
//!   as lost, and every later call says why, until it is deleted or
//!   expires; its slot and workspace are released at once.
//! - Named kernels ([`crate::workers::Workers`]) keep the live Python state of a
//!   runtime session of LibreChat's stateful profile: each `/exec` call of
//!   that session runs through the one-shot pipeline in a [`Kernels::seat`]
//!   (its workspace emptied and staged from the session's files, the
//!   program evaluated in the kernel, the workspace harvested), so the
//!   response, the files and their de-duplication are the profile's; a lost
//!   kernel is replaced at the next call (its files persist, its variables
//!   do not).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use kiln_core::access::Caller;
use kiln_core::{Language, Limits, Nanoid, Owner, RelPath};
pub use kiln_sandbox::{EvalError, EvalFile, EvalResult, KernelLost, OutputSink, OutputStream};
use kiln_sandbox::{EvalLimits, KernelError, Sandbox};

use crate::caps::{CapError, CapGuard, Caps};
use crate::expiring::Expiring;
use crate::kernel_host::{HostedKernel, KernelHost, SandboxHost};
use crate::kernel_pool::{ParkedConfig, ParkedHost};
use crate::runs::{Cancel, CancelReason};
use crate::turns::Turn;
use crate::workspace::{EntryKind, Workspace};
use kiln_core::ExitStatus;
use kiln_sandbox::{BoxFuture, Jail, Jails, RunRequest, RunResult, SandboxError};
use tokio_util::sync::CancellationToken;

/// The registry's settings.
#[derive(Debug, Clone)]
pub struct KernelsConfig {
    /// Idle time after which a kernel is closed (a request may ask for
    /// less, never more).
    pub idle_ttl: Duration,
    /// Longest life of a kernel, however busy.
    pub max_age: Duration,
    /// Live kernels on this node.
    pub max_total: usize,
    /// Live kernels per owner.
    pub max_per_owner: usize,
    /// How long a call waits for the evaluation before it (409).
    pub busy_wait: Duration,
    /// How long an interrupted evaluation may take to come back before the
    /// kernel is killed.
    pub grace: Duration,
    /// The kernel's limits as a whole (memory, pids, files, output caps per
    /// evaluation); `wall_time` is the longest timeout of one evaluation.
    pub limits: Limits,
    /// Kernels of each session language kept started ahead, each under a
    /// fresh slot of its own ([`crate::kernel_pool`]); 0: every create
    /// starts its kernel.
    pub parked_per_language: usize,
}

impl Default for KernelsConfig {
    fn default() -> Self {
        KernelsConfig {
            idle_ttl: Duration::from_secs(30 * 60),
            max_age: Duration::from_secs(8 * 3600),
            max_total: 4,
            max_per_owner: 2,
            busy_wait: Duration::from_secs(2),
            grace: Duration::from_secs(3),
            limits: Limits::default(),
            parked_per_language: 0,
        }
    }
}

pub use crate::kernel_host::KernelsError;

/// What a face shows of a session.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub id: Nanoid,
    pub lang: &'static str,
    pub created_at: SystemTime,
    /// When it expires if left idle from now on (or at its maximum age).
    pub expires_at: SystemTime,
    pub last_used_at: SystemTime,
    pub evaluations: u64,
    pub busy: bool,
    /// Why it is gone, if it is.
    pub lost: Option<KernelLost>,
}

/// What a face shows of a session's use (its expiry runs on the
/// registry's [`Expiring`] clock).
struct Clock {
    last_used_at: SystemTime,
    evaluations: u64,
}

/// One live kernel and what the registry knows of it.
pub struct Kernel {
    id: Nanoid,
    owner: Owner,
    lang: &'static str,
    created: Instant,
    created_at: SystemTime,
    ttl: Duration,
    /// The kernel, holding its uid slot until it is gone.
    kernel: Box<dyn HostedKernel>,
    /// Its place under the owner's and the node's caps, given back as soon
    /// as the kernel is gone (lost, closed or expired).
    cap: Mutex<Option<CapGuard>>,
    clock: Mutex<Clock>,
    /// Held for the whole of an evaluation.
    turn: Turn,
    /// The cancel side of the run evaluating now, if any: the session's
    /// interrupt cancels it.
    current: Mutex<Option<Cancel>>,
    /// Runs of the pipeline using the kernel ([`Kernels::seat`]): its
    /// workspace stays until they are done with it, even once it is lost
    /// (their harvest must not take the files for deleted).
    seats: std::sync::atomic::AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Kernel {
    /// Who created it (faces ask [`kiln_core::access::may`] with it).
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// Host path of the session's `/mnt/data` (for `workspace.rs` only);
    /// `None` once the kernel is gone.
    pub fn workspace(&self) -> Option<std::path::PathBuf> {
        self.kernel.workspace().map(|(path, _)| path)
    }

    /// The uid and gid files written for the jail must belong to.
    pub fn file_owner(&self) -> Option<(u32, u32)> {
        self.kernel.workspace().map(|(_, owner)| owner)
    }

    pub fn id(&self) -> &Nanoid {
        &self.id
    }

    pub fn lang(&self) -> &'static str {
        self.lang
    }

    /// Memory the kernel holds now, bytes (see [`Kernel::memory_now`]).
    pub fn memory_now(&self) -> Option<u64> {
        self.kernel.memory_now()
    }

    pub fn info(&self, max_age: Duration) -> SessionInfo {
        let clock = lock(&self.clock);
        let idle_end = clock.last_used_at + self.ttl;
        let age_end = self.created_at + max_age;
        SessionInfo {
            id: self.id.clone(),
            lang: self.lang,
            created_at: self.created_at,
            expires_at: idle_end.min(age_end),
            last_used_at: clock.last_used_at,
            evaluations: clock.evaluations,
            busy: self.turn.busy(),
            lost: self.kernel.lost(),
        }
    }

    fn touch(&self, evaluated: bool) {
        let mut clock = lock(&self.clock);
        clock.last_used_at = SystemTime::now();
        clock.evaluations += u64::from(evaluated);
    }

    /// Releases the slot (and with it the workspace) once the kernel is
    /// gone.
    fn release_if_lost(&self) {
        if self.kernel.lost().is_some() {
            lock(&self.cap).take();
            if self.seats.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                self.kernel.release();
            }
        }
    }
}

/// The registry of this node's kernels. Cheap to clone.
#[derive(Clone)]
pub struct Kernels {
    inner: Arc<Inner>,
}

struct Inner {
    host: Arc<dyn KernelHost>,
    cfg: KernelsConfig,
    /// The sessions, with their idle TTL and maximum age.
    sessions: Expiring<Nanoid, Arc<Kernel>>,
    /// Live kernels (and kernels being started) per owner and on the node.
    caps: Caps,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("sessions", &self.inner.sessions.len())
            .finish()
    }
}

impl Kernels {
    /// Kernels of `sandbox`, some started ahead (`parked_per_language`;
    /// needs a tokio runtime then).
    pub fn new(sandbox: Sandbox, cfg: KernelsConfig) -> Kernels {
        let host: Arc<dyn KernelHost> = SandboxHost::new(sandbox);
        if cfg.parked_per_language == 0 {
            return Kernels::hosted(host, cfg);
        }
        let parked = ParkedHost::start(
            host,
            ParkedConfig {
                per_language: cfg.parked_per_language,
                languages: Language::with_kernels().collect(),
                limits: cfg.limits.clone(),
                max_age: cfg.max_age,
            },
        );
        Kernels::hosted(parked, cfg)
    }

    /// A registry of kernels `host` starts.
    pub fn hosted(host: Arc<dyn KernelHost>, cfg: KernelsConfig) -> Kernels {
        Kernels {
            inner: Arc::new(Inner {
                host,
                caps: Caps::new(cfg.max_per_owner, cfg.max_total),
                sessions: Expiring::new(cfg.idle_ttl, cfg.max_age),
                cfg,
            }),
        }
    }

    pub fn config(&self) -> &KernelsConfig {
        &self.inner.cfg
    }

    /// Starts a kernel of `lang` for `owner`, idle TTL `ttl` (at most the
    /// configured one).
    pub async fn create(
        &self,
        owner: &Owner,
        lang: &str,
        ttl: Option<Duration>,
    ) -> Result<SessionInfo, KernelsError> {
        self.start(owner, lang, ttl).await
    }

    /// [`Kernels::create`] for `caller` (its principal owns the kernel).
    pub async fn create_as(
        &self,
        caller: &Caller,
        lang: &str,
        ttl: Option<Duration>,
    ) -> Result<SessionInfo, KernelsError> {
        self.start(&Owner::of(caller), lang, ttl).await
    }

    async fn start(
        &self,
        owner: &Owner,
        lang: &str,
        ttl: Option<Duration>,
    ) -> Result<SessionInfo, KernelsError> {
        let cfg = &self.inner.cfg;
        let language = Language::resolve(lang)
            .filter(|l| l.kernel().is_some())
            .ok_or_else(|| KernelsError::Language(lang.to_owned()))?;
        self.inner.host.can_start(language)?;
        self.forget_lost();
        let cap = self.inner.caps.acquire(owner).map_err(|e| match e {
            CapError::Principal(n) => KernelsError::OwnerCap(n),
            CapError::Total(n) => KernelsError::NodeFull(n),
        })?;
        let kernel = self
            .inner
            .host
            .start(language, cfg.limits.clone(), cfg.max_age)
            .await?;
        let now = SystemTime::now();
        let session = Arc::new(Kernel {
            id: Nanoid::random(),
            owner: owner.clone(),
            lang: language.name(),
            created: Instant::now(),
            created_at: now,
            ttl: ttl.map_or(cfg.idle_ttl, |t| t.min(cfg.idle_ttl)),
            kernel,
            cap: Mutex::new(Some(cap)),
            clock: Mutex::new(Clock {
                last_used_at: now,
                evaluations: 0,
            }),
            turn: Turn::default(),
            seats: std::sync::atomic::AtomicUsize::new(0),
            current: Mutex::new(None),
        });
        let info = session.info(cfg.max_age);
        let ttl = Some(session.ttl);
        self.inner.sessions.insert(session.id.clone(), session, ttl);
        metrics::gauge!("kiln_sessions_live").set(self.live() as f64);
        tracing::info!(
            session = %info.id,
            lang = info.lang,
            "session started"
        );
        Ok(info)
    }

    /// A jail source whose one jail is `session`'s kernel, for a run of the
    /// one-shot pipeline (see [`crate::Work::Seated`]): acquiring it
    /// empties the kernel's workspace for staging; running it evaluates the
    /// staged entry file in the kernel (a final expression's value is not
    /// shown, as in a fresh process; an exception's traceback goes to
    /// stderr with exit code 1, `SystemExit` exits with its code); its usage
    /// is the evaluation's.
    pub fn seat(&self, session: Arc<Kernel>) -> crate::JailOverride {
        crate::JailOverride(Arc::new(Seat {
            kernels: self.clone(),
            session,
        }))
    }

    /// The session `id`, whoever owns it (the face checks the owner with
    /// the access rule).
    pub fn get(&self, id: &Nanoid) -> Result<Arc<Kernel>, KernelsError> {
        self.inner.sessions.get(id).ok_or(KernelsError::NotFound)
    }

    pub fn info(&self, session: &Kernel) -> SessionInfo {
        session.info(self.inner.cfg.max_age)
    }

    /// Live kernels on this node (and kernels being started).
    pub fn live(&self) -> usize {
        self.forget_lost();
        self.inner.caps.held()
    }

    /// Gives back the cap places of kernels that died since (a lost
    /// kernel counts against no cap).
    fn forget_lost(&self) {
        for s in self.inner.sessions.values() {
            if s.kernel.lost().is_some() {
                lock(&s.cap).take();
            }
        }
    }

    /// Marks `session` used now (`evaluated`: by one more evaluation).
    fn touch(&self, session: &Kernel, evaluated: bool) {
        session.touch(evaluated);
        self.inner.sessions.touch(&session.id);
    }

    /// Live kernels on this node running an evaluation now.
    pub fn busy(&self) -> usize {
        self.inner
            .sessions
            .values()
            .iter()
            .filter(|s| s.kernel.lost().is_none() && s.turn.busy())
            .count()
    }

    /// Whether a `py` kernel can be started now (the Python fork-server
    /// is up); `false` while it is still preloading.
    pub fn ready(&self) -> bool {
        self.inner.host.ready()
    }

    /// Evaluates `code` in `session` with a timeout of `timeout` (at most the
    /// configured one), waiting up to `busy_wait` for an evaluation in
    /// progress; `cancel` (the run's, see [`crate::eval`]) interrupts it.
    /// The evaluation runs on a task of its own: a caller that goes away
    /// does not cut it short (the kernel's replies stay in step).
    pub(crate) async fn evaluate(
        &self,
        session: Arc<Kernel>,
        code: String,
        timeout: Option<Duration>,
        sink: Option<OutputSink>,
        cancel: Option<Cancel>,
    ) -> Result<EvalResult, KernelsError> {
        let cfg = &self.inner.cfg;
        if let Some(lost) = session.kernel.lost() {
            return Err(KernelsError::Lost(lost));
        }
        let turn = session
            .turn
            .take(cfg.busy_wait)
            .await
            .map_err(|_| KernelsError::Busy)?;
        self.touch(&session, false);
        let limits = EvalLimits {
            timeout: timeout.map_or(cfg.limits.wall_time, |t| t.min(cfg.limits.wall_time)),
            grace: cfg.grace,
            stdout_bytes: cfg.limits.stdout_bytes,
            stderr_bytes: cfg.limits.stderr_bytes,
        };
        let token = cancel.as_ref().map(|c| c.token().clone());
        *lock(&session.current) = cancel;
        let kernels = self.clone();
        let task = tokio::spawn(async move {
            let eval = session.kernel.eval(&code, limits, sink.as_ref());
            tokio::pin!(eval);
            let result = match token {
                Some(token) => tokio::select! {
                    r = &mut eval => r,
                    () = token.cancelled() => {
                        // the interrupted evaluation still answers (or the
                        // kernel is killed past its grace)
                        session.kernel.interrupt().await;
                        eval.await
                    }
                },
                None => eval.await,
            };
            lock(&session.current).take();
            kernels.touch(&session, true);
            session.release_if_lost();
            if let Err(KernelError::Lost(why)) = &result {
                tracing::warn!(session = %session.id, reason = %why, "session lost");
                metrics::counter!("kiln_sessions_lost_total").increment(1);
            }
            drop(turn);
            result
        });
        let result = task
            .await
            .map_err(|e| KernelsError::Kernel(format!("evaluation task: {e}")))?;
        Ok(result?)
    }

    /// Interrupts the evaluation running in `session`, if any: the run
    /// evaluating is cancelled (on request), which interrupts the kernel.
    pub async fn interrupt(&self, session: &Kernel) -> Result<(), KernelsError> {
        let current = lock(&session.current).clone();
        let alive = match current {
            Some(run) => {
                run.cancel(CancelReason::Requested);
                session.kernel.lost().is_none()
            }
            None => session.kernel.interrupt().await,
        };
        if !alive {
            session.release_if_lost();
            return Err(KernelsError::Lost(
                session.kernel.lost().unwrap_or(KernelLost::Closed),
            ));
        }
        Ok(())
    }

    /// The session's workspace, open for host access (`workspace.rs`: no
    /// path the jail controls is followed).
    fn workspace(session: &Kernel) -> Result<Workspace, KernelsError> {
        let (Some(path), Some(owner)) = (session.workspace(), session.file_owner()) else {
            return Err(KernelsError::Lost(
                session.kernel.lost().unwrap_or(KernelLost::Closed),
            ));
        };
        Workspace::open(&path, owner).map_err(|e| KernelsError::Files(e.to_string()))
    }

    /// Every regular file of the session's workspace (relative path, size),
    /// sorted; links and special files are not listed, nor followed.
    pub async fn list_files(
        &self,
        session: Arc<Kernel>,
    ) -> Result<Vec<(String, u64)>, KernelsError> {
        blocking(move || {
            let ws = Self::workspace(&session)?;
            let mut out = Vec::new();
            let mut dirs = vec![String::new()];
            while let Some(dir) = dirs.pop() {
                let Some(entries) = ws.read_dir(&dir).map_err(files_error)? else {
                    continue;
                };
                for e in entries {
                    let Some(name) = e.name.to_str() else {
                        continue;
                    };
                    let rel = if dir.is_empty() {
                        name.to_owned()
                    } else {
                        format!("{dir}/{name}")
                    };
                    match e.kind {
                        EntryKind::Dir => dirs.push(rel),
                        EntryKind::File => {
                            if let Some((_, size)) = ws.open_regular(&rel).map_err(files_error)? {
                                out.push((rel, size));
                            }
                        }
                        EntryKind::Symlink | EntryKind::Other => {}
                    }
                    if out.len() >= MAX_LISTED {
                        break;
                    }
                }
            }
            out.sort();
            Ok(out)
        })
        .await
    }

    /// The regular file `path` of the session's workspace and its size.
    pub async fn read_file(
        &self,
        session: Arc<Kernel>,
        path: RelPath,
    ) -> Result<(std::fs::File, u64), KernelsError> {
        blocking(move || {
            Self::workspace(&session)?
                .open_regular(path.as_str())
                .map_err(files_error)?
                .ok_or(KernelsError::FileNotFound)
        })
        .await
    }

    /// Writes `bytes` as the file `path` atomically (a temporary file
    /// renamed over a file or link of that name; parent directories
    /// created), owned by the kernel's user.
    pub async fn write_file(
        &self,
        session: Arc<Kernel>,
        path: RelPath,
        bytes: bytes::Bytes,
    ) -> Result<(), KernelsError> {
        blocking(move || {
            let ws = Self::workspace(&session)?;
            let rel = path.as_str();
            ws.make_parents(rel).map_err(files_error)?;
            ws.write_atomically(rel, &bytes).map_err(files_error)
        })
        .await
    }

    /// Deletes the file `path`; [`KernelsError::FileNotFound`] if there is
    /// no regular file of that name.
    pub async fn delete_file(
        &self,
        session: Arc<Kernel>,
        path: RelPath,
    ) -> Result<(), KernelsError> {
        blocking(move || {
            let ws = Self::workspace(&session)?;
            if !ws.is_regular(path.as_str()) {
                return Err(KernelsError::FileNotFound);
            }
            ws.remove_file(path.as_str()).map_err(files_error)
        })
        .await
    }

    /// Every session this node holds (live or lost, not yet forgotten),
    /// oldest first: the operator's view, whoever owns them.
    pub fn list(&self) -> Vec<Arc<Kernel>> {
        let mut all = self.inner.sessions.values();
        all.sort_by_key(|s| s.created);
        all
    }

    /// Closes and forgets `id`.
    pub async fn delete(&self, id: &Nanoid) -> Result<(), KernelsError> {
        let session = self
            .inner
            .sessions
            .remove(id)
            .ok_or(KernelsError::NotFound)?;
        close(&session).await;
        metrics::gauge!("kiln_sessions_live").set(self.live() as f64);
        Ok(())
    }

    /// Closes every session idle past its TTL or older than the maximum
    /// age; returns how many.
    pub async fn sweep(&self) -> usize {
        let now = Instant::now();
        // an evaluation in progress holds its kernel (and will touch it)
        let expired: Vec<Arc<Kernel>> = self
            .inner
            .sessions
            .expired(now)
            .into_iter()
            .filter(|(_, s)| !s.turn.busy())
            .filter_map(|(id, _)| self.inner.sessions.remove_expired(&id, now))
            .collect();
        for s in &expired {
            tracing::info!(session = %s.id, "session expired");
            close(s).await;
        }
        if !expired.is_empty() {
            metrics::gauge!("kiln_sessions_live").set(self.live() as f64);
        }
        expired.len()
    }

    /// Closes every session, [`CLOSE_AT_ONCE`] at a time, then the kernels
    /// started ahead (shutdown). One after another, a node holding 1,000
    /// idle kernels took about a minute to stop — past an orchestrator's
    /// usual grace period, whose SIGKILL leaves the clean-up to the next
    /// start.
    pub async fn close_all(&self) {
        use futures::StreamExt;
        let all = self.inner.sessions.drain();
        futures::stream::iter(&all)
            .for_each_concurrent(CLOSE_AT_ONCE, |s| close(s))
            .await;
        self.inner.host.shutdown().await;
    }
}

/// A kernel lent to one run of the pipeline.
struct Seat {
    kernels: Kernels,
    session: Arc<Kernel>,
}

fn lost_error(session: &Kernel) -> SandboxError {
    SandboxError::Setup(format!(
        "session lost: {}",
        session.kernel.lost().unwrap_or(KernelLost::Closed)
    ))
}

impl Jails for Seat {
    fn acquire<'a>(
        &'a self,
        _lang: Language,
        _profile: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn Jail>, SandboxError>> {
        Box::pin(async move {
            let (Some(path), Some(owner)) = (self.session.workspace(), self.session.file_owner())
            else {
                return Err(lost_error(&self.session));
            };
            let jail = SeatJail::new(&self.kernels, &self.session, path.clone(), owner);
            let dir = path;
            tokio::task::spawn_blocking(move || Workspace::open(&dir, owner)?.clear())
                .await
                .map_err(|e| SandboxError::Setup(e.to_string()))?
                .map_err(|e| SandboxError::Setup(format!("empty the kernel's workspace: {e}")))?;
            Ok(Box::new(jail) as Box<dyn Jail>)
        })
    }
}

struct SeatJail {
    kernels: Kernels,
    session: Arc<Kernel>,
    path: std::path::PathBuf,
    owner: (u32, u32),
}

impl SeatJail {
    fn new(
        kernels: &Kernels,
        session: &Arc<Kernel>,
        path: std::path::PathBuf,
        owner: (u32, u32),
    ) -> SeatJail {
        session
            .seats
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        SeatJail {
            kernels: kernels.clone(),
            session: Arc::clone(session),
            path,
            owner,
        }
    }
}

impl Drop for SeatJail {
    fn drop(&mut self) {
        self.session
            .seats
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.session.release_if_lost();
    }
}

impl Jail for SeatJail {
    fn workspace(&self) -> &std::path::Path {
        &self.path
    }

    fn owner(&self) -> (u32, u32) {
        self.owner
    }

    fn run(
        &mut self,
        req: RunRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<RunResult, SandboxError>> {
        Box::pin(async move {
            let entry = Language::resolve(self.session.lang)
                .map(|l| l.spec().entry_file)
                .ok_or_else(|| lost_error(&self.session))?;
            let (path, owner) = (self.path.clone(), self.owner);
            let code = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
                let ws = Workspace::open(&path, owner)?;
                let Some((mut f, _)) = ws.open_regular(entry)? else {
                    return Err(std::io::Error::other("the entry file is not staged"));
                };
                let mut code = String::new();
                std::io::Read::read_to_string(&mut f, &mut code)?;
                Ok(code)
            })
            .await
            .map_err(|e| SandboxError::Setup(e.to_string()))?
            .map_err(|e| SandboxError::Setup(format!("read the program: {e}")))?;
            let stderr_cap = req.limits.stderr_bytes;
            // audited as the run it is part of
            let exec = self.kernels.evaluate(
                Arc::clone(&self.session),
                code,
                Some(req.limits.wall_time),
                req.output.clone(),
                None,
            );
            let result = tokio::select! {
                r = exec => r,
                () = cancel.cancelled() => {
                    let _ = self.kernels.interrupt(&self.session).await;
                    return Err(SandboxError::Cancelled(None));
                }
            };
            as_run_result(result, stderr_cap)
        })
    }
}

/// An evaluation as the pipeline sees a program's run.
fn as_run_result(
    result: Result<EvalResult, KernelsError>,
    stderr_cap: usize,
) -> Result<RunResult, SandboxError> {
    let e = match result {
        Ok(e) => e,
        Err(KernelsError::Lost(why)) => {
            return Ok(RunResult {
                exit: ExitStatus::Signal(9),
                stderr: format!("session lost: {why}\n").into_bytes(),
                oom_killed: why == KernelLost::OutOfMemory,
                timed_out: why == KernelLost::Unresponsive,
                ..RunResult::default()
            });
        }
        Err(other) => return Err(SandboxError::Setup(other.to_string())),
    };
    let mut stderr = e.stderr;
    let mut code = 0;
    match &e.error {
        Some(err) if err.ename == "SystemExit" => {
            code = match err.evalue.as_str() {
                "" | "None" => 0,
                v => v.parse().unwrap_or_else(|_| {
                    stderr.extend_from_slice(format!("{v}\n").as_bytes());
                    1
                }),
            };
        }
        Some(_) if e.timed_out => {}
        Some(err) => {
            code = 1;
            for line in &err.traceback {
                stderr.extend_from_slice(line.as_bytes());
                stderr.push(b'\n');
            }
        }
        None => {}
    }
    let cut = stderr.len() > stderr_cap;
    stderr.truncate(stderr_cap);
    Ok(RunResult {
        exit: if e.timed_out {
            ExitStatus::Signal(9)
        } else {
            ExitStatus::Code(code)
        },
        stdout: e.stdout,
        stderr,
        stdout_overflow: e.stdout_truncated,
        stderr_overflow: e.stderr_truncated || cut,
        timed_out: e.timed_out,
        oom_killed: false,
        wall_time: e.wall_time,
        cpu_time: e.cpu_time,
        memory_peak: e.memory_peak,
        cpu_throttled: None,
    })
}

/// Most files a listing shows.
const MAX_LISTED: usize = 10_000;

fn files_error(e: std::io::Error) -> KernelsError {
    match e.raw_os_error() {
        Some(libc::EDQUOT | libc::ENOSPC) => {
            KernelsError::Files("the workspace is full".to_owned())
        }
        Some(libc::ELOOP | libc::ENOTDIR | libc::EXDEV) => KernelsError::FileNotFound,
        _ => KernelsError::Files(e.to_string()),
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, KernelsError> + Send + 'static,
) -> Result<T, KernelsError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| KernelsError::Files(e.to_string()))?
}

/// Kernels closed at once at shutdown. Closing one is mostly waiting (the
/// jail killed and reaped, its slot's filesystem unmounted), little CPU.
const CLOSE_AT_ONCE: usize = 32;

async fn close(session: &Kernel) {
    session.kernel.close().await;
    lock(&session.cap).take();
    session.kernel.release();
}

#[cfg(test)]
#[path = "kernels_tests.rs"]
mod tests;
