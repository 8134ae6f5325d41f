//! One execution from request to result: authorize and stage inputs, run in
//! the sandbox, walk the workspace, store outputs, clean up.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use kiln_core::outcome::{ExitStatus, RunStatus, signal_name};
use kiln_core::{Language, Limits, Nanoid, Principal, RelPath, SessionKey};
use kiln_sandbox::{ParkedJail, RunRequest, RunResult, Sandbox, SandboxError, Slot, WarmPool};
use kiln_store::{NewObject, Store};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info_span, warn};

use crate::egress;
use crate::plan::plan_inputs;
use crate::types::*;
use crate::walker::{self, StagedInput, WalkLimits};

/// Executor settings.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// Limits of one run; a request's `timeout` may lower the wall time.
    pub limits: Limits,
    /// Walker caps.
    pub walk: WalkLimits,
    /// Executions that run at once; more wait in the queue.
    pub concurrency: usize,
    /// The egress gateway, when the operator configured services: runs of
    /// a principal that may use one get a grant and a channel to it.
    pub egress: Option<kiln_egress::Gateway>,
}

impl Default for ExecConfig {
    /// Workspaces live in each sandbox slot's quota-limited area
    /// (`Slot::workspace_parent`), so there is no directory to configure.
    fn default() -> Self {
        ExecConfig {
            limits: Limits::default(),
            walk: WalkLimits {
                max_output_files: 50,
                max_file_bytes: 10 * 1024 * 1024,
            },
            concurrency: 8,
            egress: None,
        }
    }
}

/// Runs executions. Cheap to clone.
#[derive(Clone)]
pub struct Executor {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    sandbox: Sandbox,
    cfg: ExecConfig,
    /// Parked jails per runtime; `None`: every run builds its jail.
    pool: Option<WarmPool>,
    /// One permit per execution that may run now.
    permits: Semaphore,
    /// Cancelled by [`Executor::kill_all`]: every running execution stops.
    kill_all: CancellationToken,
    /// Executions in flight, for [`Executor::wait_idle`].
    active: AtomicUsize,
    idle: Notify,
}

/// Counts an execution as active for its lifetime.
struct ActiveGuard<'a>(&'a Inner);

impl Drop for ActiveGuard<'_> {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Executor {
    /// The sandbox empties every slot's workspace area at start and before
    /// a slot is reused, so nothing left by a crash survives.
    ///
    /// With a `pool`, each run takes a parked jail of its language's profile
    /// (`py`, `js`, ... when the pool has one, else `exec`).
    pub fn new(store: Store, sandbox: Sandbox, cfg: ExecConfig, pool: Option<WarmPool>) -> Self {
        Executor {
            inner: Arc::new(Inner {
                store,
                sandbox,
                permits: Semaphore::new(cfg.concurrency.max(1)),
                cfg,
                pool,
                kill_all: CancellationToken::new(),
                active: AtomicUsize::new(0),
                idle: Notify::new(),
            }),
        }
    }

    /// Kill every running execution (shutdown after the grace period).
    pub fn kill_all(&self) {
        self.inner.kill_all.cancel();
    }

    /// Executions in flight.
    pub fn active(&self) -> usize {
        self.inner.active.load(Ordering::SeqCst)
    }

    /// Wait until no execution is in flight, at most `limit`.
    pub async fn wait_idle(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, async {
            loop {
                let notified = self.inner.idle.notified();
                if self.active() == 0 {
                    return;
                }
                notified.await;
            }
        })
        .await;
    }

    pub fn sandbox(&self) -> &Sandbox {
        &self.inner.sandbox
    }

    /// The warm pool, if runs use one.
    pub fn warm_pool(&self) -> Option<&WarmPool> {
        self.inner.pool.as_ref()
    }

    /// Run one execution to completion.
    pub async fn run(
        &self,
        principal: &Principal,
        req: ExecRequest,
        cancel: CancellationToken,
    ) -> Result<ExecResult, ExecError> {
        let inner = &*self.inner;
        inner.active.fetch_add(1, Ordering::SeqCst);
        let _active = ActiveGuard(inner);
        if inner.kill_all.is_cancelled() {
            return Err(ExecError::ShuttingDown);
        }
        // the run stops when the client goes away or when everything is killed
        let token = inner.kill_all.child_token();
        let _unlink = token.clone().drop_guard();
        {
            let (c, t) = (cancel, token.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = c.cancelled() => t.cancel(),
                    () = t.cancelled() => {}
                }
            });
        }
        let session_id = Nanoid::random();
        let span = info_span!("exec", session_id = %session_id, lang = req.lang.name());
        match inner
            .run(principal, req, session_id, token)
            .instrument(span)
            .await
        {
            Err(ExecError::Cancelled) if inner.kill_all.is_cancelled() => {
                Err(ExecError::ShuttingDown)
            }
            other => other,
        }
    }
}

impl Execute for Executor {
    fn execute<'a>(
        &'a self,
        principal: &'a Principal,
        req: ExecRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<ExecResult, ExecError>> {
        Box::pin(self.run(principal, req, cancel))
    }
}

/// Removes a workspace when dropped, whatever happened.
struct WorkspaceGuard(PathBuf);

impl Drop for WorkspaceGuard {
    fn drop(&mut self) {
        let path = std::mem::take(&mut self.0);
        let remove = move || {
            if let Err(e) = fs::remove_dir_all(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                warn!(path = %path.display(), error = %e, "could not remove workspace");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(remove);
            }
            Err(_) => remove(),
        }
    }
}

impl Inner {
    async fn run(
        &self,
        principal: &Principal,
        req: ExecRequest,
        session_id: Nanoid,
        cancel: CancellationToken,
    ) -> Result<ExecResult, ExecError> {
        let started = Instant::now();
        let lang = req.lang;
        let limits = self
            .cfg
            .limits
            .clone()
            .with_requested_timeout(req.timeout_ms);

        // inputs are checked before any resource is taken
        let inputs = plan_inputs(req.files)?;
        let resolved = self.authorize(principal, inputs).await?;
        // deny by default: a grant only when the principal may use a service
        let grant = egress::mint(
            self.cfg.egress.as_ref(),
            principal,
            session_id.as_str(),
            limits.wall_time,
        );

        let t_queue = Instant::now();
        let _permit = tokio::select! {
            p = self.permits.acquire() => p.map_err(|_| ExecError::ShuttingDown)?,
            () = cancel.cancelled() => return Err(ExecError::Cancelled),
        };
        metrics::histogram!("kiln_exec_phase_seconds", "phase" => "queue")
            .record(t_queue.elapsed().as_secs_f64());

        // A parked jail (ready, or built now on a miss), or a bare slot.
        let t_acquire = Instant::now();
        let compiled = lang.spec().compile.is_some();
        let (slot, mut parked) = match &self.pool {
            // a granted run joins its own network namespace: a jail built for it
            Some(pool) if grant.is_none() => {
                let profile = if !compiled && pool.has_profile(lang.name()) {
                    lang.name()
                } else {
                    WARM_EXEC
                };
                let got = tokio::select! {
                    g = pool.get(profile) => g,
                    () = cancel.cancelled() => return Err(ExecError::Cancelled),
                };
                // a runtime's own warm jail failed (the fork-server died, say):
                // a generic one runs the same program the cold way
                let got = match got {
                    Err(e) if profile != WARM_EXEC => {
                        warn!(profile, error = %e, "warm jail unavailable; using a generic one");
                        tokio::select! {
                            g = pool.get(WARM_EXEC) => g.map_err(sandbox_error)?,
                            () = cancel.cancelled() => return Err(ExecError::Cancelled),
                        }
                    }
                    other => other.map_err(sandbox_error)?,
                };
                (got.slot, Some(got.jail))
            }
            _ => {
                let slot = tokio::select! {
                    s = self.sandbox.acquire_slot() => s,
                    () = cancel.cancelled() => return Err(ExecError::Cancelled),
                };
                (slot, None)
            }
        };
        metrics::histogram!("kiln_exec_phase_seconds", "phase" => "acquire")
            .record(t_acquire.elapsed().as_secs_f64());

        let t_store = Instant::now();
        self.store
            .create_session(&session_id, &principal.user_key())
            .await
            .map_err(|e| ExecError::Storage(e.to_string()))?;
        metrics::histogram!("kiln_exec_phase_seconds", "phase" => "store")
            .record(t_store.elapsed().as_secs_f64());

        let t_stage = Instant::now();
        // on the slot's own filesystem: the kernel enforces the workspace
        // quota there, and the sandbox empties it when the slot is released
        let ws = match &parked {
            Some(j) => j.workspace().to_path_buf(),
            None => slot.workspace_parent().join(session_id.as_str()),
        };
        let guard = WorkspaceGuard(ws.clone());
        let staged = self
            .stage(&ws, parked.is_none(), &slot, resolved, lang, &req.code)
            .await?;
        metrics::histogram!("kiln_exec_phase_seconds", "phase" => "stage")
            .record(t_stage.elapsed().as_secs_f64());

        let t_run = Instant::now();
        // languages: env and argv may depend on the limits (e.g. the JVM heap)
        let env = environment(lang, &limits);
        if let Some(argv) = lang.compile_argv(&limits) {
            let mut cl = limits.clone();
            cl.wall_time = lang.spec().compile_timeout;
            let r = self
                .sandbox_run(&slot, &ws, parked.take(), argv, &env, cl, None, &cancel)
                .await?;
            if !matches!(r.exit, ExitStatus::Code(0)) || r.timed_out || r.oom_killed {
                metrics::histogram!("kiln_exec_phase_seconds", "phase" => "run")
                    .record(t_run.elapsed().as_secs_f64());
                drop(guard);
                let message = compile_failure_message(&r);
                return Ok(self.finish(session_id, lang, r, message, started, Harvest::default()));
            }
        }
        // only the program itself gets the services channel, not a compile step
        let channel = match (&self.cfg.egress, grant) {
            (Some(gateway), Some(grant)) => Some(egress::RunChannel::open(gateway, grant)?),
            _ => None,
        };
        let mut env = env;
        if let Some(c) = &channel {
            env.extend(c.env());
        }
        let r = self
            .sandbox_run(
                &slot,
                &ws,
                parked.take(),
                lang.run_argv(&req.args, &limits),
                &env,
                limits,
                channel.as_ref().map(egress::RunChannel::network),
                &cancel,
            )
            .await;
        if let Some(c) = channel {
            c.close().await;
        }
        let r = r?;
        metrics::histogram!("kiln_exec_phase_seconds", "phase" => "run")
            .record(t_run.elapsed().as_secs_f64());

        // the jail is gone; harvest
        let t_harvest = Instant::now();
        let entry_hash = walker::hash_bytes(req.code.as_bytes());
        let entry = lang.spec().entry_file.to_owned();
        let walk_limits = self.cfg.walk.clone();
        let ws2 = ws.clone();
        let walked = tokio::task::spawn_blocking(move || {
            walker::walk(&ws2, &staged, (&entry, &entry_hash), &walk_limits)
        })
        .await
        .map_err(|e| ExecError::SandboxFailed(format!("walker panicked: {e}")))?
        .map_err(|e| ExecError::SandboxFailed(format!("walk workspace: {e}")))?;

        let mut harvest = Harvest::default();
        for g in walked.generated {
            let file_id = Nanoid::random();
            let Ok(name) = RelPath::parse(&g.name) else {
                harvest.failed += 1;
                continue;
            };
            let obj = NewObject {
                session_id: session_id.clone(),
                file_id: file_id.clone(),
                content_type: content_type(name.as_str()),
                name,
                read_only: false,
            };
            match self.store.put_file(obj, &ws.join(&g.name)).await {
                Ok(_) => harvest.files.push(OutputFile {
                    id: file_id,
                    name: g.name,
                    storage_session_id: session_id.clone(),
                    inherited: false,
                    modified_from: g.modified_from,
                    entity_id: None,
                }),
                Err(e) => {
                    warn!(file = %g.name, error = %e, "could not store output");
                    harvest.failed += 1;
                }
            }
        }
        harvest.attempted = harvest.files.len() as u32 + harvest.failed;
        for i in walked.inherited {
            harvest.files.push(OutputFile {
                id: i.id,
                name: i.name,
                storage_session_id: i.storage_session_id,
                inherited: true,
                modified_from: None,
                entity_id: i.entity_id,
            });
        }
        harvest.deleted = walked.deleted;
        harvest.truncation = walked.truncation;
        drop(guard);
        metrics::histogram!("kiln_exec_phase_seconds", "phase" => "harvest")
            .record(t_harvest.elapsed().as_secs_f64());

        Ok(self.finish(session_id, lang, r, None, started, harvest))
    }

    /// Check every by-reference input against its storage session's owner
    /// and resolve it to stored metadata.
    async fn authorize(
        &self,
        principal: &Principal,
        inputs: Vec<InputFile>,
    ) -> Result<Vec<Resolved>, ExecError> {
        let mut out = Vec::with_capacity(inputs.len());
        let mut keys: HashMap<Nanoid, Option<SessionKey>> = HashMap::new();
        for f in inputs {
            match f {
                InputFile::Inline { name, content } => out.push(Resolved::Inline { name, content }),
                InputFile::Ref(r) => {
                    let stored = match keys.get(&r.storage_session_id) {
                        Some(k) => k.clone(),
                        None => {
                            let k = self
                                .store
                                .session(&r.storage_session_id)
                                .await
                                .map_err(|e| ExecError::Storage(e.to_string()))?
                                .map(|s| s.key);
                            keys.insert(r.storage_session_id.clone(), k.clone());
                            k
                        }
                    };
                    let Some(stored) = stored else {
                        return Err(ExecError::Unauthorized);
                    };
                    if !ref_allowed(principal, &r, &stored) {
                        return Err(ExecError::Unauthorized);
                    }
                    let meta = self
                        .store
                        .object(&r.storage_session_id, &r.id)
                        .await
                        .map_err(|e| ExecError::Storage(e.to_string()))?
                        .ok_or(ExecError::Unauthorized)?;
                    out.push(Resolved::Ref {
                        r,
                        meta: Box::new(meta),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Build the workspace: inputs, then the entry file. Returns what the
    /// walker needs to know about each staged input.
    async fn stage(
        &self,
        ws: &Path,
        create: bool,
        slot: &Slot,
        inputs: Vec<Resolved>,
        lang: Language,
        code: &str,
    ) -> Result<HashMap<String, StagedInput>, ExecError> {
        let (uid, gid) = (slot.host_uid(), slot.host_gid());
        let setup = |e: std::io::Error| ExecError::SandboxSetup(format!("stage workspace: {e}"));
        {
            let ws = ws.to_owned();
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                // a parked jail's workspace exists already (bound at /mnt/data)
                if create {
                    fs::create_dir(&ws)?;
                    fs::set_permissions(&ws, fs::Permissions::from_mode(0o700))?;
                }
                chown(&ws, Some(uid), Some(gid))
            })
            .await
            .map_err(|e| ExecError::SandboxSetup(e.to_string()))?
            .map_err(setup)?;
        }

        let mut staged = HashMap::new();
        for input in inputs {
            let name = match &input {
                Resolved::Ref { r, .. } => r.name.clone(),
                Resolved::Inline { name, .. } => name.clone(),
            };
            let dest = ws.join(name.as_str());
            make_parents(ws, &name, uid, gid).await.map_err(setup)?;
            match input {
                Resolved::Ref { r, meta } => {
                    self.store
                        .copy_to(&meta, &dest)
                        .await
                        .map_err(|e| ExecError::Storage(format!("stage {}: {e}", r.name)))?;
                    let read_only = meta.read_only;
                    set_owner(&dest, read_only, uid, gid).await.map_err(setup)?;
                    staged.insert(
                        name.as_str().to_owned(),
                        StagedInput {
                            origin: Some((r.id, r.storage_session_id)),
                            sha256: meta.sha256,
                            size: meta.size,
                            read_only,
                            entity_id: r.entity_id,
                        },
                    );
                }
                Resolved::Inline { content, .. } => {
                    let sha256 = walker::hash_bytes(&content);
                    let size = content.len() as u64;
                    write_new(&dest, content).await.map_err(setup)?;
                    set_owner(&dest, false, uid, gid).await.map_err(setup)?;
                    staged.insert(
                        name.as_str().to_owned(),
                        StagedInput {
                            origin: None,
                            sha256,
                            size,
                            read_only: false,
                            entity_id: None,
                        },
                    );
                }
            }
        }

        // the code goes last: it wins over an input of the same name
        let entry = ws.join(lang.spec().entry_file);
        let _ = tokio::fs::remove_file(&entry).await;
        write_new(&entry, code.as_bytes().to_vec())
            .await
            .map_err(setup)?;
        set_owner(&entry, false, uid, gid).await.map_err(setup)?;
        staged.remove(lang.spec().entry_file);
        stage_language_support(ws, lang, code, uid, gid)
            .await
            .map_err(setup)?;
        Ok(staged)
    }

    /// Runs one program: in `parked` if given (its workspace is `ws`), else
    /// in a jail built for it.
    #[allow(clippy::too_many_arguments)]
    async fn sandbox_run(
        &self,
        slot: &Slot,
        ws: &Path,
        parked: Option<ParkedJail>,
        argv: Vec<String>,
        env: &[(String, String)],
        limits: Limits,
        network: Option<kiln_sandbox::JailNetwork>,
        cancel: &CancellationToken,
    ) -> Result<RunResult, ExecError> {
        let req = RunRequest {
            workspace: ws.to_owned(),
            argv,
            env: env.to_vec(),
            limits,
            network,
            ..RunRequest::default()
        };
        let r = match parked {
            Some(jail) => {
                self.sandbox
                    .run_parked(slot, jail, req, cancel.clone())
                    .await
            }
            None => self.sandbox.run(slot, req, cancel.clone()).await,
        };
        r.map_err(sandbox_error)
    }

    fn finish(
        &self,
        session_id: Nanoid,
        lang: Language,
        r: RunResult,
        forced_message: Option<&str>,
        started: Instant,
        h: Harvest,
    ) -> ExecResult {
        let (status, mut message) = classify(&r);
        if let Some(m) = forced_message {
            message = Some(m.to_owned());
        }
        let mut stderr = String::from_utf8_lossy(&r.stderr).into_owned();
        if let Some(note) = stop_note(&r, status, message.as_deref()) {
            if !stderr.is_empty() && !stderr.ends_with('\n') {
                stderr.push('\n');
            }
            stderr.push_str(&note);
            stderr.push('\n');
        }
        metrics::histogram!("kiln_exec_duration_seconds", "lang" => lang.name())
            .record(started.elapsed().as_secs_f64());
        metrics::counter!("kiln_exec_total", "lang" => lang.name(),
            "status" => status.map(|s| s.code()).unwrap_or("OK"))
        .increment(1);
        let delivery = (h.failed > 0).then(|| DeliveryFailure {
            attempted: h.attempted,
            delivered: h.attempted - h.failed,
            failed: h.failed,
        });
        ExecResult {
            session_id,
            stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
            stderr,
            files: h.files,
            deleted_files: h.deleted,
            truncation: h.truncation,
            delivery,
            exit: r.exit,
            status,
            message,
            wall_time: r.wall_time,
        }
    }
}

#[derive(Default)]
struct Harvest {
    files: Vec<OutputFile>,
    deleted: Vec<String>,
    truncation: Option<Truncation>,
    attempted: u32,
    failed: u32,
}

enum Resolved {
    Ref {
        r: InputRef,
        meta: Box<kiln_store::ObjectMeta>,
    },
    Inline {
        name: RelPath,
        content: Vec<u8>,
    },
}

/// May `principal` read a ref whose storage session is owned by `stored`?
fn ref_allowed(principal: &Principal, r: &InputRef, stored: &SessionKey) -> bool {
    if let Ok(k) = SessionKey::derive(
        principal,
        r.kind,
        r.resource_id.as_deref(),
        r.version.as_deref(),
    ) && &k == stored
    {
        return true;
    }
    // G1 refs carry no kind; an `entity_id` names the agent that owns them
    if let Some(entity) = &r.entity_id
        && let Ok(k) = SessionKey::derive(principal, kiln_core::Kind::Agent, Some(entity), None)
    {
        return &k == stored;
    }
    false
}

/// Map a sandbox result to the API's `status` and `message`.
pub fn classify(r: &RunResult) -> (Option<RunStatus>, Option<String>) {
    if r.stdout_overflow {
        return (
            Some(RunStatus::StdoutOverflow),
            Some("stdout length exceeded".into()),
        );
    }
    if r.stderr_overflow {
        return (
            Some(RunStatus::StderrOverflow),
            Some("stderr length exceeded".into()),
        );
    }
    if r.timed_out {
        return (Some(RunStatus::Timeout), Some("Time limit exceeded".into()));
    }
    if r.oom_killed {
        return (Some(RunStatus::Signal), Some("Out of memory".into()));
    }
    match r.exit {
        ExitStatus::Code(0) => (None, None),
        ExitStatus::Code(_) => (Some(RunStatus::RuntimeError), None),
        ExitStatus::Signal(24) => (
            Some(RunStatus::Timeout),
            Some("CPU time limit exceeded".into()),
        ),
        ExitStatus::Signal(25) => (
            Some(RunStatus::Signal),
            Some("File size limit exceeded".into()),
        ),
        ExitStatus::Signal(s) => (
            Some(RunStatus::Signal),
            Some(format!("Killed by {}", signal_name(s))),
        ),
    }
}

/// The one-line note appended to stderr when Kiln stopped the run.
fn stop_note(r: &RunResult, status: Option<RunStatus>, message: Option<&str>) -> Option<String> {
    let status = status?;
    let why = match status {
        RunStatus::Timeout if r.timed_out => {
            format!(
                "time limit of {:.1} s exceeded",
                r.wall_time.as_secs_f64().round()
            )
        }
        RunStatus::RuntimeError => return None,
        _ => message?.to_owned(),
    };
    Some(format!("[kiln] execution stopped: {why}"))
}

/// The complete environment of a jailed process. Nothing from the host.
/// The base below, then the language table's own variables (placeholders
/// filled from `limits`), which win over the base.
pub fn environment(lang: Language, limits: &Limits) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/mnt/data"),
        ("USER", "sandbox"),
        ("LOGNAME", "sandbox"),
        ("LANG", "C.UTF-8"),
        ("LC_ALL", "C.UTF-8"),
        ("TMPDIR", "/tmp"),
        ("TERM", "dumb"),
        ("OPENBLAS_NUM_THREADS", "1"),
        ("MKL_NUM_THREADS", "1"),
        ("OMP_NUM_THREADS", "1"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    env.push(("SANDBOX_LANGUAGE".into(), lang.name().into()));
    for (k, v) in lang.env(limits) {
        env.retain(|(ek, _)| *ek != k);
        env.push((k, v));
    }
    env
}

/// The warm-pool profile of languages without one of their own.
pub const WARM_EXEC: &str = "exec";

fn sandbox_error(e: SandboxError) -> ExecError {
    match e {
        SandboxError::Cancelled => ExecError::Cancelled,
        e @ SandboxError::Setup(_) => {
            warn!(error = %e, "sandbox setup failed");
            ExecError::SandboxSetup(e.to_string())
        }
        e => {
            warn!(error = %e, "sandbox run failed");
            ExecError::SandboxFailed(e.to_string())
        }
    }
}

/// The `message` of a run whose compile step failed. Output overflows keep
/// their own message (`None`).
fn compile_failure_message(r: &RunResult) -> Option<&'static str> {
    if r.stdout_overflow || r.stderr_overflow {
        None
    } else if r.timed_out || r.exit == ExitStatus::Signal(24) {
        // the compile budget (wall) or RLIMIT_CPU's SIGXCPU
        Some("Compilation time limit exceeded")
    } else if r.oom_killed {
        Some("Out of memory during compilation")
    } else {
        Some("Compilation failed")
    }
}

/// Stage what the language table asks for next to the code (languages):
/// its support files that apply to `code`, read-only, under `.kiln/`, and the jail-owned build
/// directory `.kiln-build/` of compiled languages. Both are hidden, so the
/// walker never reports them. Runs before any user code: the workspace holds
/// only what staging created, so a path found here is ours to replace.
async fn stage_language_support(
    ws: &Path,
    lang: Language,
    code: &str,
    uid: u32,
    gid: u32,
) -> std::io::Result<()> {
    use kiln_core::lang::{BUILD_DIR, SUPPORT_DIR};
    for f in lang.support_files_for(code) {
        let name = RelPath::parse(&format!("{SUPPORT_DIR}/{}", f.name))
            .map_err(|e| std::io::Error::other(format!("support file {}: {e}", f.name)))?;
        make_parents(ws, &name, uid, gid).await?;
        let dest = ws.join(name.as_str());
        let _ = tokio::fs::remove_file(&dest).await;
        write_new(&dest, f.contents.as_bytes().to_vec()).await?;
        set_owner(&dest, true, uid, gid).await?;
    }
    if lang.needs_build_dir() {
        let dir = ws.join(BUILD_DIR);
        tokio::task::spawn_blocking(move || {
            match fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    fs::remove_file(&dir)?;
                    fs::create_dir(&dir)?;
                }
                Err(_) => fs::create_dir(&dir)?,
            }
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?;
            chown(&dir, Some(uid), Some(gid))
        })
        .await
        .map_err(std::io::Error::other)??;
    }
    Ok(())
}

/// Content type guessed from a file name (outputs, and uploads that declare
/// none).
pub fn content_type(name: &str) -> String {
    mime_guess::from_path(name)
        .first_or_octet_stream()
        .essence_str()
        .to_owned()
}

async fn make_parents(ws: &Path, name: &RelPath, uid: u32, gid: u32) -> std::io::Result<()> {
    let dirs: Vec<PathBuf> = name.ancestors().map(|a| ws.join(a)).collect();
    tokio::task::spawn_blocking(move || {
        for d in dirs {
            match fs::symlink_metadata(&d) {
                Ok(m) if m.is_dir() => continue,
                Ok(_) => {
                    return Err(std::io::Error::other(format!(
                        "{} is not a directory",
                        d.display()
                    )));
                }
                Err(_) => {
                    fs::create_dir(&d)?;
                    fs::set_permissions(&d, fs::Permissions::from_mode(0o755))?;
                    chown(&d, Some(uid), Some(gid))?;
                }
            }
        }
        Ok(())
    })
    .await
    .map_err(std::io::Error::other)?
}

async fn write_new(dest: &Path, content: Vec<u8>) -> std::io::Result<()> {
    let dest = dest.to_owned();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&dest)?;
        f.write_all(&content)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Writable inputs belong to the jail user; read-only ones stay root's, 0444.
async fn set_owner(p: &Path, read_only: bool, uid: u32, gid: u32) -> std::io::Result<()> {
    let p = p.to_owned();
    tokio::task::spawn_blocking(move || {
        if read_only {
            fs::set_permissions(&p, fs::Permissions::from_mode(0o444))
        } else {
            fs::set_permissions(&p, fs::Permissions::from_mode(0o644))?;
            chown(&p, Some(uid), Some(gid))
        }
    })
    .await
    .map_err(std::io::Error::other)?
}
