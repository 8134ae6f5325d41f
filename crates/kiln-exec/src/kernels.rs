//! Live kernels (Kiln's sessions API): a registry of long-lived
//! interpreters, each in its own jail under its own uid slot, with a
//! workspace that persists between evaluations. Not to be confused with
//! [`crate::sessions`] (seed 000's named *file* workspaces).
//!
//! - Owner: a kernel belongs to the principal that created it (its user
//!   key); the faces check reads with the one access rule.
//! - Caps: at most `max_total` live kernels on the node (503 past it) and
//!   `max_per_owner` per owner (429). The binary gives kernels slots of
//!   their own (`max_total` of them beyond the run concurrency and the warm
//!   pool), so kernels never starve one-shot runs of jails.
//! - Expiry: a kernel idle longer than its TTL (default 30 min) or older
//!   than `max_age` is closed by [`Kernels::sweep`].
//! - One evaluation at a time: a second call waits up to `busy_wait`,
//!   then [`KernelsError::Busy`] (409).
//! - A kernel that died (out of memory, unresponsive, exited) stays listed
//!   as lost, and every later call says why, until it is deleted or
//!   expires; its slot and workspace are released at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use kiln_core::lang::WarmRecipe;
use kiln_core::{Language, Limits, Nanoid, RelPath};
pub use kiln_sandbox::{EvalError, EvalFile, EvalResult, KernelLost, OutputSink, OutputStream};
use kiln_sandbox::{
    EvalLimits, Kernel, KernelError, KernelStart, Sandbox, Slot, python_kernel_park,
};

use crate::workspace::{EntryKind, Workspace};

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
    #[error("unsupported session language {0:?}: sessions run py")]
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
    clock: Mutex<Clock>,
    /// Held for the whole of an evaluation.
    turn: Arc<tokio::sync::Mutex<()>>,
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
            lock(&self.slot).take();
        }
    }
}

#[derive(Default)]
struct State {
    sessions: HashMap<Nanoid, Arc<Session>>,
    /// Kernels being started, by owner (they count against the caps).
    starting: HashMap<String, usize>,
}

impl State {
    fn live(&self, owner: Option<&str>) -> usize {
        let sessions = self
            .sessions
            .values()
            .filter(|s| owner.is_none_or(|o| s.owner == o))
            .filter(|s| s.kernel.lost().is_none())
            .count();
        let starting = match owner {
            Some(o) => self.starting.get(o).copied().unwrap_or(0),
            None => self.starting.values().sum(),
        };
        sessions + starting
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
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("sessions", &lock(&self.inner.state).sessions.len())
            .finish()
    }
}

/// Undoes a reservation made for a kernel being started.
struct Reservation<'a> {
    state: &'a Mutex<State>,
    owner: String,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut state = lock(self.state);
        if let Some(n) = state.starting.get_mut(&self.owner) {
            *n -= 1;
            if *n == 0 {
                state.starting.remove(&self.owner);
            }
        }
    }
}

impl Kernels {
    pub fn new(sandbox: Sandbox, cfg: KernelsConfig) -> Kernels {
        Kernels {
            inner: Arc::new(Inner {
                sandbox,
                cfg,
                state: Mutex::new(State::default()),
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
        let cfg = &self.inner.cfg;
        let language = Language::resolve(lang)
            .filter(|l| l.name() == "py")
            .ok_or_else(|| KernelsError::Language(lang.to_owned()))?;
        let Some(WarmRecipe::Embedded { interpreter, .. }) = &language.spec().warm else {
            return Err(KernelsError::Language(lang.to_owned()));
        };
        let template = PY_KERNEL_TEMPLATES
            .iter()
            .find(|t| self.inner.sandbox.has_zygote(t))
            .ok_or_else(|| {
                KernelsError::Unavailable("no Python fork-server is running".to_owned())
            })?;
        let _reservation = {
            let mut state = lock(&self.inner.state);
            let mine = state.live(Some(owner));
            if mine >= cfg.max_per_owner {
                return Err(KernelsError::OwnerCap(mine));
            }
            let all = state.live(None);
            if all >= cfg.max_total {
                return Err(KernelsError::NodeFull(all));
            }
            *state.starting.entry(owner.to_owned()).or_default() += 1;
            Reservation {
                state: &self.inner.state,
                owner: owner.to_owned(),
            }
        };
        let mut limits = cfg.limits.clone();
        // the evaluation timeouts are the registry's; the jail's own wall and
        // CPU clocks only bound the kernel's life
        limits.wall_time = cfg.max_age + Duration::from_secs(60);
        limits.cpu_time = limits.wall_time;
        let slot = self.inner.sandbox.acquire_slot().await;
        let start = KernelStart {
            park: python_kernel_park(template),
            argv: vec![
                (*interpreter).to_owned(),
                "-u".to_owned(),
                format!("/etc/kiln/{}", kiln_core::lang::warm::PYTHON_KERNEL_NAME),
            ],
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
            clock: Mutex::new(Clock {
                last_used: Instant::now(),
                last_used_at: now,
                evaluations: 0,
            }),
            turn: Arc::new(tokio::sync::Mutex::new(())),
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

    /// Live kernels on this node.
    pub fn live(&self) -> usize {
        lock(&self.inner.state).live(None)
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
        let task = tokio::spawn(async move {
            let result = session.kernel.eval(&code, limits, sink.as_ref()).await;
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
    lock(&session.slot).take();
}
