//! Live kernels (Kiln's sessions API): a registry of long-lived
//! interpreters, each in its own jail under its own uid slot, with a
//! workspace that persists between evaluations. Not to be confused with
//! [`crate::sessions`] (seed 000's named *file* workspaces).
//!
//! - Owner: a kernel belongs to the principal that created it (its user
//!   key); the faces check reads with the one access rule.
//! - Caps: at most `max_total` live kernels on the node (503 past it) and
//!   `max_per_owner` per owner (429), counted by [`crate::caps::Caps`] per
//!   principal (the owner's user key), whatever face started the kernel and
//!   whatever it is named. The binary gives kernels slots of
//!   their own (`max_total` of them beyond the run concurrency and the warm
//!   pool), so kernels never starve one-shot runs of jails.
//! - Expiry: a kernel idle longer than its TTL (default 30 min) or older
//!   than `max_age` is closed by [`Kernels::sweep`].
//! - One evaluation at a time: a second call waits up to `busy_wait`,
//!   then [`KernelsError::Busy`] (409).
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use kiln_core::access::Caller;
use kiln_core::lang::WarmRecipe;
use kiln_core::{Language, Limits, Nanoid, RelPath};
pub use kiln_sandbox::{EvalError, EvalFile, EvalResult, KernelLost, OutputSink, OutputStream};
use kiln_sandbox::{
    EvalLimits, Kernel, KernelError, KernelStart, ParkSpec, Sandbox, Slot, node_kernel_park,
    python_kernel_park,
};

use crate::caps::{CapError, CapGuard, Caps};
use crate::runs::{AuditFile, AuditRecord, AuditSink, AuditUsage};
use crate::workspace::{EntryKind, Workspace};
use kiln_core::ExitStatus;
use kiln_sandbox::{BoxFuture, Jail, Jails, RunRequest, RunResult, SandboxError};
use tokio_util::sync::CancellationToken;

/// The templates a `py` kernel may fork, in order of preference: the data
/// stack without the rich one's fork and exit cost, then the others.
const PY_KERNEL_TEMPLATES: &[&str] = &["py-data", "py", "py-lean"];

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
        }
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum KernelsError {
    #[error("unsupported session language {0:?}: sessions run py or js")]
    Language(String),
    #[error("no such session")]
    NotFound,
    #[error("the caller has {0} live sessions, the most allowed")]
    OwnerCap(usize),
    #[error("this node runs {0} live sessions, the most it allows")]
    NodeFull(usize),
    #[error("the session is busy with another evaluation")]
    Busy,
    #[error("session lost: {0}")]
    Lost(KernelLost),
    #[error("sessions are unavailable: {0}")]
    Unavailable(String),
    #[error("kernel failed: {0}")]
    Kernel(String),
    #[error("no such file")]
    FileNotFound,
    #[error("workspace: {0}")]
    Files(String),
}

impl From<KernelError> for KernelsError {
    fn from(e: KernelError) -> Self {
        match e {
            KernelError::Lost(l) => KernelsError::Lost(l),
            other => KernelsError::Kernel(other.to_string()),
        }
    }
}

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

struct Clock {
    last_used: Instant,
    last_used_at: SystemTime,
    evaluations: u64,
}

/// One live kernel and what the registry knows of it.
pub struct Session {
    id: Nanoid,
    owner: String,
    lang: &'static str,
    created: Instant,
    created_at: SystemTime,
    ttl: Duration,
    kernel: Kernel,
    /// Its uid slot, released as soon as the kernel is gone.
    slot: Mutex<Option<Slot>>,
    /// Its place under the owner's and the node's caps, given back as soon
    /// as the kernel is gone (lost, closed or expired).
    cap: Mutex<Option<CapGuard>>,
    clock: Mutex<Clock>,
    /// Held for the whole of an evaluation.
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Who created it, when a face said so ([`Kernels::create_as`]): the
    /// identity its evaluations are audited under.
    caller: Option<Caller>,
    /// Runs of the pipeline using the kernel ([`Kernels::seat`]): its
    /// workspace stays until they are done with it, even once it is lost
    /// (their harvest must not take the files for deleted).
    seats: std::sync::atomic::AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Session {
    /// The owner's user key (`SessionKey` of the creator).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Host path of the session's `/mnt/data` (for `workspace.rs` only);
    /// `None` once the kernel is gone.
    pub fn workspace(&self) -> Option<std::path::PathBuf> {
        lock(&self.slot)
            .as_ref()
            .map(|_| self.kernel.workspace().to_path_buf())
    }

    /// The uid and gid files written for the jail must belong to.
    pub fn file_owner(&self) -> Option<(u32, u32)> {
        lock(&self.slot)
            .as_ref()
            .map(|s| (s.host_uid(), s.host_gid()))
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
            busy: self.turn.try_lock().is_err(),
            lost: self.kernel.lost(),
        }
    }

    fn touch(&self, evaluated: bool) {
        let mut clock = lock(&self.clock);
        clock.last_used = Instant::now();
        clock.last_used_at = SystemTime::now();
        clock.evaluations += u64::from(evaluated);
    }

    fn expired(&self, now: Instant, max_age: Duration) -> bool {
        let idle = now.saturating_duration_since(lock(&self.clock).last_used);
        idle >= self.ttl || now.saturating_duration_since(self.created) >= max_age
    }

    /// Releases the slot (and with it the workspace) once the kernel is
    /// gone.
    fn release_if_lost(&self) {
        if self.kernel.lost().is_some() {
            lock(&self.cap).take();
            if self.seats.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                lock(&self.slot).take();
            }
        }
    }
}

#[derive(Default)]
struct State {
    sessions: HashMap<Nanoid, Arc<Session>>,
}

impl State {
    /// Gives back the cap places of kernels that died since (a lost
    /// kernel counts against no cap).
    fn forget_lost(&self) {
        for s in self.sessions.values() {
            if s.kernel.lost().is_some() {
                lock(&s.cap).take();
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
    sandbox: Sandbox,
    cfg: KernelsConfig,
    state: Mutex<State>,
    /// Live kernels (and kernels being started) per owner and on the node.
    caps: Caps,
    /// Where each evaluation's audit record goes (the runs' sink).
    audit: Option<Arc<dyn AuditSink>>,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("sessions", &lock(&self.inner.state).sessions.len())
            .finish()
    }
}

impl Kernels {
    pub fn new(sandbox: Sandbox, cfg: KernelsConfig) -> Kernels {
        Kernels::audited(sandbox, cfg, None)
    }

    /// [`Kernels::new`] whose evaluations ([`Kernels::exec`]) each leave
    /// an `evaluation` record in `audit` (runs of the pipeline in a
    /// [`Kernels::seat`] are audited as runs instead).
    pub fn audited(
        sandbox: Sandbox,
        cfg: KernelsConfig,
        audit: Option<Arc<dyn AuditSink>>,
    ) -> Kernels {
        Kernels {
            inner: Arc::new(Inner {
                sandbox,
                caps: Caps::new(cfg.max_per_owner, cfg.max_total),
                cfg,
                state: Mutex::new(State::default()),
                audit,
            }),
        }
    }

    pub fn config(&self) -> &KernelsConfig {
        &self.inner.cfg
    }

    /// Starts a kernel of `lang` for `owner` (a user key), idle TTL
    /// `ttl` (at most the configured one).
    pub async fn create(
        &self,
        owner: &str,
        lang: &str,
        ttl: Option<Duration>,
    ) -> Result<SessionInfo, KernelsError> {
        self.start(owner, None, lang, ttl).await
    }

    /// [`Kernels::create`] for `caller` (its user key owns the kernel), who
    /// is named in the audit records of its evaluations.
    pub async fn create_as(
        &self,
        caller: &Caller,
        lang: &str,
        ttl: Option<Duration>,
    ) -> Result<SessionInfo, KernelsError> {
        let owner = caller.principal.user_key();
        self.start(owner.as_str(), Some(caller.clone()), lang, ttl)
            .await
    }

    async fn start(
        &self,
        owner: &str,
        caller: Option<Caller>,
        lang: &str,
        ttl: Option<Duration>,
    ) -> Result<SessionInfo, KernelsError> {
        let cfg = &self.inner.cfg;
        let language = Language::resolve(lang)
            .filter(|l| matches!(l.name(), "py" | "js"))
            .ok_or_else(|| KernelsError::Language(lang.to_owned()))?;
        let (park, argv, template) = self.kernel_program(language)?;
        lock(&self.inner.state).forget_lost();
        let cap = self.inner.caps.acquire(owner).map_err(|e| match e {
            CapError::Principal(n) => KernelsError::OwnerCap(n),
            CapError::Total(n) => KernelsError::NodeFull(n),
        })?;
        let mut limits = cfg.limits.clone();
        // the evaluation timeouts are the registry's; the jail's own wall and
        // CPU clocks only bound the kernel's life
        limits.wall_time = cfg.max_age + Duration::from_secs(60);
        limits.cpu_time = limits.wall_time;
        let slot = self
            .inner
            .sandbox
            .acquire_kernel_slot()
            .await
            .map_err(|e| KernelsError::Unavailable(e.to_string()))?;
        let start = KernelStart {
            park,
            argv,
            env: language.environment(&cfg.limits),
            limits,
        };
        let kernel = self
            .inner
            .sandbox
            .start_kernel(&slot, start)
            .await
            .map_err(|e| KernelsError::Kernel(e.to_string()))?;
        let now = SystemTime::now();
        let session = Arc::new(Session {
            id: Nanoid::random(),
            owner: owner.to_owned(),
            lang: language.name(),
            created: Instant::now(),
            created_at: now,
            ttl: ttl.map_or(cfg.idle_ttl, |t| t.min(cfg.idle_ttl)),
            kernel,
            slot: Mutex::new(Some(slot)),
            cap: Mutex::new(Some(cap)),
            clock: Mutex::new(Clock {
                last_used: Instant::now(),
                last_used_at: now,
                evaluations: 0,
            }),
            turn: Arc::new(tokio::sync::Mutex::new(())),
            seats: std::sync::atomic::AtomicUsize::new(0),
            caller,
        });
        let info = session.info(cfg.max_age);
        let (park, ready) = session.kernel.start_times();
        lock(&self.inner.state)
            .sessions
            .insert(session.id.clone(), session);
        metrics::gauge!("kiln_sessions_live").set(self.live() as f64);
        tracing::info!(
            session = %info.id,
            template,
            park_ms = park.as_secs_f64() * 1000.0,
            ready_ms = ready.as_secs_f64() * 1000.0,
            "session started"
        );
        Ok(info)
    }

    /// How a kernel of `language` is parked and started, and the template
    /// it forks (`py`) or `node` (`js`, a pre-started node like a warm `js`
    /// jail's, in the same environment).
    fn kernel_program(
        &self,
        language: Language,
    ) -> Result<(ParkSpec, Vec<String>, &'static str), KernelsError> {
        let cfg = &self.inner.cfg;
        match &language.spec().warm {
            Some(WarmRecipe::Embedded { interpreter, .. }) => {
                let template = PY_KERNEL_TEMPLATES
                    .iter()
                    .find(|t| self.inner.sandbox.has_zygote(t))
                    .ok_or_else(|| {
                        KernelsError::Unavailable("no Python fork-server is running".to_owned())
                    })?;
                let argv = vec![
                    (*interpreter).to_owned(),
                    "-u".to_owned(),
                    format!("/etc/kiln/{}", kiln_core::lang::warm::PYTHON_KERNEL_NAME),
                ];
                Ok((python_kernel_park(template), argv, template))
            }
            Some(WarmRecipe::Prestart { .. }) => {
                let node = language.spec().run[0];
                if !std::path::Path::new(node).is_file() {
                    return Err(KernelsError::Unavailable(format!(
                        "{node} is not installed"
                    )));
                }
                let park = node_kernel_park(node, language.environment(&cfg.limits));
                let argv = park.argv.clone();
                Ok((park, argv, "node"))
            }
            None => Err(KernelsError::Language(language.name().to_owned())),
        }
    }

    /// A jail source whose one jail is `session`'s kernel, for a run of the
    /// one-shot pipeline (see [`crate::ExecRequest::jail`]): acquiring it
    /// empties the kernel's workspace for staging; running it evaluates the
    /// staged entry file in the kernel (a final expression's value is not
    /// shown, as in a fresh process; an exception's traceback goes to
    /// stderr with exit code 1, `SystemExit` exits with its code); its usage
    /// is the evaluation's.
    pub fn seat(&self, session: Arc<Session>) -> crate::JailOverride {
        crate::JailOverride(Arc::new(Seat {
            kernels: self.clone(),
            session,
        }))
    }

    /// The session `id`, whoever owns it (the face checks the owner with
    /// the access rule).
    pub fn get(&self, id: &Nanoid) -> Result<Arc<Session>, KernelsError> {
        lock(&self.inner.state)
            .sessions
            .get(id)
            .cloned()
            .ok_or(KernelsError::NotFound)
    }

    pub fn info(&self, session: &Session) -> SessionInfo {
        session.info(self.inner.cfg.max_age)
    }

    /// Live kernels on this node (and kernels being started).
    pub fn live(&self) -> usize {
        lock(&self.inner.state).forget_lost();
        self.inner.caps.held()
    }

    /// Live kernels on this node running an evaluation now.
    pub fn busy(&self) -> usize {
        lock(&self.inner.state)
            .sessions
            .values()
            .filter(|s| s.kernel.lost().is_none() && s.turn.try_lock().is_err())
            .count()
    }

    /// Whether a `py` kernel can be started now (the Python fork-server
    /// is up); `false` while it is still preloading.
    pub fn ready(&self) -> bool {
        PY_KERNEL_TEMPLATES
            .iter()
            .any(|t| self.inner.sandbox.has_zygote(t))
    }

    /// Evaluates `code` in `session` with a timeout of `timeout` (at most the
    /// configured one), waiting up to `busy_wait` for an evaluation in
    /// progress. The evaluation runs on a task of its own: a caller that
    /// goes away does not cut it short (the kernel's replies stay in step).
    pub async fn exec(
        &self,
        session: Arc<Session>,
        code: String,
        timeout: Option<Duration>,
        sink: Option<OutputSink>,
    ) -> Result<EvalResult, KernelsError> {
        self.evaluate(session, code, timeout, sink, true).await
    }

    async fn evaluate(
        &self,
        session: Arc<Session>,
        code: String,
        timeout: Option<Duration>,
        sink: Option<OutputSink>,
        audited: bool,
    ) -> Result<EvalResult, KernelsError> {
        let cfg = &self.inner.cfg;
        if let Some(lost) = session.kernel.lost() {
            return Err(KernelsError::Lost(lost));
        }
        let turn = tokio::time::timeout(cfg.busy_wait, Arc::clone(&session.turn).lock_owned())
            .await
            .map_err(|_| KernelsError::Busy)?;
        session.touch(false);
        let limits = EvalLimits {
            timeout: timeout.map_or(cfg.limits.wall_time, |t| t.min(cfg.limits.wall_time)),
            grace: cfg.grace,
            stdout_bytes: cfg.limits.stdout_bytes,
            stderr_bytes: cfg.limits.stderr_bytes,
        };
        let audit = self.inner.audit.clone().filter(|_| audited);
        let task = tokio::spawn(async move {
            let started_at = SystemTime::now();
            let result = session.kernel.eval(&code, limits, sink.as_ref()).await;
            if let Some(audit) = audit {
                audit.record(&evaluation_record(&session, started_at, &result));
            }
            session.touch(true);
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

    /// Interrupts the evaluation running in `session`, if any.
    pub async fn interrupt(&self, session: &Session) -> Result<(), KernelsError> {
        if !session.kernel.interrupt().await {
            session.release_if_lost();
            return Err(KernelsError::Lost(
                session.kernel.lost().unwrap_or(KernelLost::Closed),
            ));
        }
        Ok(())
    }

    /// The session's workspace, open for host access (`workspace.rs`: no
    /// path the jail controls is followed).
    fn workspace(session: &Session) -> Result<Workspace, KernelsError> {
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
        session: Arc<Session>,
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
        session: Arc<Session>,
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
        session: Arc<Session>,
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
        session: Arc<Session>,
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
    pub fn list(&self) -> Vec<Arc<Session>> {
        let mut all: Vec<Arc<Session>> =
            lock(&self.inner.state).sessions.values().cloned().collect();
        all.sort_by_key(|s| s.created);
        all
    }

    /// Closes and forgets `id`.
    pub async fn delete(&self, id: &Nanoid) -> Result<(), KernelsError> {
        let session = lock(&self.inner.state)
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
        let max_age = self.inner.cfg.max_age;
        let expired: Vec<Arc<Session>> = {
            let mut state = lock(&self.inner.state);
            let ids: Vec<Nanoid> = state
                .sessions
                .values()
                .filter(|s| s.expired(now, max_age) && s.turn.try_lock().is_ok())
                .map(|s| s.id.clone())
                .collect();
            ids.iter()
                .filter_map(|id| state.sessions.remove(id))
                .collect()
        };
        for s in &expired {
            tracing::info!(session = %s.id, "session expired");
            close(s).await;
        }
        if !expired.is_empty() {
            metrics::gauge!("kiln_sessions_live").set(self.live() as f64);
        }
        expired.len()
    }

    /// Closes every session (shutdown).
    pub async fn close_all(&self) {
        let all: Vec<Arc<Session>> = lock(&self.inner.state)
            .sessions
            .drain()
            .map(|(_, s)| s)
            .collect();
        for s in &all {
            close(s).await;
        }
    }
}

/// A kernel lent to one run of the pipeline.
struct Seat {
    kernels: Kernels,
    session: Arc<Session>,
}

fn lost_error(session: &Session) -> SandboxError {
    SandboxError::Setup(format!(
        "session lost: {}",
        session.kernel.lost().unwrap_or(KernelLost::Closed)
    ))
}

impl Jails for Seat {
    fn acquire<'a>(
        &'a self,
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
    session: Arc<Session>,
    path: std::path::PathBuf,
    owner: (u32, u32),
}

impl SeatJail {
    fn new(
        kernels: &Kernels,
        session: &Arc<Session>,
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
                false,
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

/// The audit record of one evaluation in `session`'s kernel.
fn evaluation_record(
    session: &Session,
    started_at: SystemTime,
    result: &Result<EvalResult, KernelError>,
) -> AuditRecord {
    let unix_ms = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    };
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    // a kernel a face started without saying who: its owner key
    let (tenant, user_id, identified) = match &session.caller {
        Some(c) => (
            c.principal.tenant.clone(),
            c.principal.user_id.clone(),
            c.identified,
        ),
        None => (String::new(), session.owner.clone(), false),
    };
    let ok = result.as_ref().ok();
    AuditRecord {
        event: "evaluation",
        run_id: Nanoid::random().as_str().to_owned(),
        session_id: Some(session.id.as_str().to_owned()),
        request_id: None,
        tenant,
        user_id,
        identified,
        lang: session.lang,
        status: if ok.is_some() { "finished" } else { "failed" },
        exit_code: None,
        signal: None,
        run_status: ok.and_then(|r| {
            if r.timed_out {
                Some("TO")
            } else {
                r.error.as_ref().map(|_| "RE")
            }
        }),
        error: match result {
            Ok(r) => r
                .error
                .as_ref()
                .map(|e| format!("{}: {}", e.ename, e.evalue)),
            Err(e) => Some(e.to_string()),
        },
        created_at_ms: unix_ms(started_at),
        finished_at_ms: unix_ms(SystemTime::now()),
        compile: None,
        run: ok.map(|r| AuditUsage {
            wall_ms: ms(r.wall_time),
            cpu_ms: r.cpu_time.map(ms),
            memory_peak_bytes: r.memory_peak,
        }),
        files_in: Vec::new(),
        files_out: ok
            .map(|r| {
                r.files
                    .iter()
                    .map(|f| AuditFile {
                        name: f.path.clone(),
                        bytes: f.size,
                    })
                    .collect()
            })
            .unwrap_or_default(),
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

async fn close(session: &Session) {
    session.kernel.close().await;
    lock(&session.cap).take();
    lock(&session.slot).take();
}
