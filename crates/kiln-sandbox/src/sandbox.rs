//! [`Sandbox`]: the executor's handle. Checks the host once, owns the slot
//! pool (with each slot's quota-limited workspace filesystem) and the cgroup
//! driver, decides what runs degraded, and runs one jail per
//! [`Sandbox::run`].

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use kiln_core::{ExitStatus, Limits};
use tokio_util::sync::CancellationToken;

use crate::cgroup::{CgroupDriver, CgroupStats, RunCgroups};
use crate::config::SandboxConfig;
use crate::error::SandboxError;
use crate::launcher::Launcher;
use crate::probe::{HostReport, probe_host};
use crate::quota::{SlotFs, WorkspaceQuota};
use crate::run::{KillReason, RunRequest, RunResult, Started, Supervised, start_helper, supervise};
use crate::seccomp;
use crate::slots::{Slot, SlotLease, SlotPool};
use crate::spec::{BpfInsns, GoMsg, JailLimits, JailSpec, ParkMode, StatusMsg};
use crate::zygote::{Zygote, ZygoteConfig, ZygoteInfo};

/// Names of the protections a degraded sandbox can run without.
const WITHOUT_CGROUP: &str = "memory and pids limits (cgroups)";
const WITHOUT_SECCOMP: &str = "seccomp";
const WITHOUT_QUOTA: &str = "workspace quota";

#[derive(Debug)]
struct Inner {
    cfg: SandboxConfig,
    report: HostReport,
    /// `None` only when degraded.
    cgroups: Option<CgroupDriver>,
    slots: Arc<SlotPool>,
    areas: Arc<SlotFs>,
    closed: AtomicBool,
    /// Compiled seccomp profiles by name (empty when degraded without).
    filters: HashMap<String, Vec<BpfInsns>>,
    /// The fork-servers for embedded warm jails by template name, once
    /// started.
    zygotes: std::sync::RwLock<HashMap<String, Zygote>>,
    /// Forks jail helpers; `None` if it could not start (helpers are
    /// spawned then).
    launcher: Option<Launcher>,
}

/// Replaces the probe's guess about the workspace quota with what was set
/// up, then decides: every problem refuses the start unless
/// `allow_degraded`, which records what runs without protection.
fn settle_report(
    mut report: HostReport,
    quota: &WorkspaceQuota,
    allow_degraded: bool,
) -> Result<HostReport, SandboxError> {
    report
        .problems
        .retain(|p| !p.starts_with("no workspace quota"));
    report
        .warnings
        .retain(|w| !w.starts_with("workspace quota"));
    match quota {
        WorkspaceQuota::LoopExt4 => {}
        WorkspaceQuota::Tmpfs { .. } => report
            .warnings
            .push("workspace quota falls back to tmpfs: workspaces use RAM, not disk".to_owned()),
        WorkspaceQuota::None { reason } => report
            .problems
            .push(format!("no workspace quota: {reason}")),
    }
    report.workspace_quota = quota.clone();
    if report.problems.is_empty() {
        return Ok(report);
    }
    if !allow_degraded || !report.jail_possible() {
        return Err(SandboxError::Unsupported(report.problems.clone()));
    }
    if !report.cgroup_limits {
        report.degraded.push(WITHOUT_CGROUP.to_owned());
    }
    if !report.seccomp {
        report.degraded.push(WITHOUT_SECCOMP.to_owned());
    }
    if matches!(quota, WorkspaceQuota::None { .. }) {
        report.degraded.push(WITHOUT_QUOTA.to_owned());
    }
    Ok(report)
}

/// Native Linux jails. Cheap to clone; all clones share one slot pool.
#[derive(Debug, Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

/// Fails unless every ancestor of `path` is searchable by others: the jail's
/// init runs as an unprivileged host uid while it resolves bind sources.
fn check_searchable(path: &Path) -> Result<(), SandboxError> {
    for dir in path.ancestors().skip(1) {
        let meta = std::fs::metadata(dir).map_err(|e| SandboxError::io("stat", dir, e))?;
        if meta.mode() & 0o001 == 0 {
            return Err(SandboxError::PathNotSearchable {
                path: path.to_path_buf(),
            });
        }
    }
    Ok(())
}

fn prepare_root_dir(root: &Path) -> Result<(), SandboxError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(root)
        .map_err(|e| SandboxError::io("create root dir", root, e))?;
    let meta = std::fs::symlink_metadata(root).map_err(|e| SandboxError::io("stat", root, e))?;
    if !meta.is_dir() || meta.uid() != 0 {
        return Err(SandboxError::Config(format!(
            "root_dir {} must be a directory owned by root",
            root.display()
        )));
    }
    if meta.permissions().mode() & 0o001 == 0 {
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| SandboxError::io("chmod", root, e))?;
    }
    check_searchable(root)
}

pub(crate) fn validate_request(req: &RunRequest) -> Result<(), SandboxError> {
    let bad = |m: String| Err(SandboxError::Request(m));
    let Some(program) = req.argv.first() else {
        return bad("argv is empty".into());
    };
    if !program.starts_with('/') {
        return bad(format!("argv[0] {program:?} is not an absolute path"));
    }
    if !seccomp::is_profile(&req.seccomp_profile) {
        return bad(format!("unknown seccomp profile {:?}", req.seccomp_profile));
    }
    if req.argv.iter().any(|a| a.contains('\0')) {
        return bad("argv contains a NUL byte".into());
    }
    for (k, v) in &req.env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return bad(format!("invalid environment variable {k:?}"));
        }
    }
    for dir in std::iter::once(&req.workspace).chain(&req.project) {
        if !dir.is_absolute() {
            return bad(format!("workspace {} is not absolute", dir.display()));
        }
        let meta =
            std::fs::metadata(dir).map_err(|e| SandboxError::io("stat workspace", dir, e))?;
        if !meta.is_dir() {
            return bad(format!("workspace {} is not a directory", dir.display()));
        }
        check_searchable(dir)?;
    }
    Ok(())
}

/// The workspace (and a project's working copy) must be a directory
/// directly below the slot's area, where the quota applies and which is
/// emptied when the slot is released.
fn check_workspace_location(req: &RunRequest, slot: &Slot) -> Result<(), SandboxError> {
    let parent = slot.workspace_parent();
    for dir in std::iter::once(&req.workspace).chain(&req.project) {
        if dir.parent() != Some(parent.as_path()) {
            return Err(SandboxError::Request(format!(
                "workspace {} is not directly below the slot's workspace parent {}",
                dir.display(),
                parent.display()
            )));
        }
    }
    Ok(())
}

impl Sandbox {
    /// Probes the host, sets up each slot's workspace filesystem and the
    /// cgroup parents, and prepares the root mount point. Fails with
    /// [`SandboxError::Unsupported`] if a protection is missing — unless
    /// `cfg.allow_degraded`, which starts anyway (never without root and
    /// namespaces) and logs an ERROR per missing protection.
    pub fn new(cfg: SandboxConfig) -> Result<Sandbox, SandboxError> {
        cfg.validate()?;
        let probed = probe_host();
        if !probed.jail_possible() {
            return Err(SandboxError::Unsupported(probed.problems.clone()));
        }
        let filters = if probed.seccomp {
            seccomp::compile_all()?
        } else {
            HashMap::new()
        };
        if !cfg.helper.is_file() {
            return Err(SandboxError::Config(format!(
                "helper {} is not a file",
                cfg.helper.display()
            )));
        }
        prepare_root_dir(&cfg.root_dir)?;
        for b in &cfg.ro_binds {
            if !b.exists() {
                return Err(SandboxError::Config(format!(
                    "ro_bind {} does not exist",
                    b.display()
                )));
            }
            check_searchable(b)?;
        }
        let (areas, _) = SlotFs::setup(
            &cfg.slots_dir(),
            cfg.slots,
            cfg.workspace_bytes,
            cfg.workspace_inodes,
            cfg.workspace_quota,
        )?;
        check_searchable(&areas.parent(0))?;
        // On error, dropping `areas` unmounts everything again.
        let report = settle_report(probed, areas.quota(), cfg.allow_degraded)?;
        for p in &report.problems {
            tracing::error!(
                problem = %p,
                "INSECURE: the sandbox runs without this protection (allow_degraded is set)"
            );
        }
        let mut report = report;
        let cpu = cfg.cpu_limits();
        let cgroups = if report.cgroup_limits {
            let c = CgroupDriver::setup(&report.cgroup, cpu)?;
            c.sweep_stale();
            if let Err(e) = c.apply_parent_cpu() {
                tracing::warn!(error = %e, "CPU quota of all runs together not set");
                report
                    .warnings
                    .push(format!("CPU quota of all runs together not set: {e}"));
            }
            let said = |r: &HostReport| r.warnings.iter().any(|w| w.contains("cpu controller"));
            if !c.limits_cpu() && !said(&report) {
                report.warnings.push(
                    "no cgroup cpu controller: a run's processes may take every core".to_owned(),
                );
            }
            Some(c)
        } else {
            None
        };
        tracing::info!(
            cgroup = ?cgroups.as_ref().map(CgroupDriver::parents),
            whole_jail_cpu_budget = cgroups.as_ref().is_some_and(CgroupDriver::accounts_cpu),
            cpu_per_run = f64::from(cpu.per_run_millis) / 1000.0,
            cpu_all_runs = f64::from(cpu.all_runs_millis) / 1000.0,
            slots = cfg.slots,
            uid_base = cfg.uid_base,
            workspace_quota = %report.workspace_quota,
            workspace_bytes = cfg.workspace_bytes,
            workspace_inodes = cfg.workspace_inodes,
            landlock_abi = ?report.landlock_abi,
            "sandbox ready"
        );
        let slots = SlotPool::new(cfg.uid_base, cfg.slots, Arc::clone(&areas));
        let launcher = match Launcher::start(&cfg.helper) {
            Ok(l) => {
                tracing::info!(pid = l.pid(), "jail launcher ready");
                Some(l)
            }
            Err(e) => {
                tracing::warn!(error = %e, "no jail launcher: every jail spawns its helper");
                None
            }
        };
        Ok(Sandbox {
            inner: Arc::new(Inner {
                cfg,
                report,
                cgroups,
                slots,
                areas,
                closed: AtomicBool::new(false),
                filters,
                zygotes: std::sync::RwLock::new(HashMap::new()),
                launcher,
            }),
        })
    }

    /// Refuses further runs and unmounts every slot's workspace filesystem,
    /// removing images and mount points. Call once no run is in flight (a
    /// run still going keeps its workspace until it ends, detached). Also
    /// done when the last clone is dropped and at process exit.
    pub fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.areas.teardown();
    }

    /// What the host provides (for `kiln doctor` and startup logs).
    pub fn report(&self) -> &HostReport {
        &self.inner.report
    }

    pub fn config(&self) -> &SandboxConfig {
        &self.inner.cfg
    }

    /// The `kiln/` parent cgroups under which every run's groups live
    /// (none when running degraded without cgroups).
    pub fn cgroup_parents(&self) -> Vec<PathBuf> {
        self.inner
            .cgroups
            .as_ref()
            .map(CgroupDriver::parents)
            .unwrap_or_default()
    }

    /// Takes a free uid slot, waiting while all are busy.
    pub async fn acquire_slot(&self) -> Slot {
        self.inner.slots.acquire().await
    }

    /// Runs one program in a fresh jail under `slot`'s uids. Returns only
    /// after every process of the jail is dead and its cgroups are removed.
    /// Non-zero exits, signals, timeouts, OOM and output caps are results;
    /// `cancel` firing kills the jail and yields [`SandboxError::Cancelled`].
    pub async fn run(
        &self,
        slot: &Slot,
        req: RunRequest,
        cancel: CancellationToken,
    ) -> Result<RunResult, SandboxError> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(SandboxError::ShutDown);
        }
        if !slot.belongs_to(&self.inner.slots) {
            return Err(SandboxError::ForeignSlot(slot.index()));
        }
        check_workspace_location(&req, slot)?;
        validate_request(&req)?;
        let degraded = &self.inner.report.degraded;
        if !degraded.is_empty() {
            tracing::warn!(without = ?degraded, "INSECURE: jail runs without some protections");
        }
        let name = Self::run_name(slot);
        // Without cgroups the lease alone keeps the slot reserved until the
        // helper (and with it the jail) is gone.
        let (cgroups, lease) = match &self.inner.cgroups {
            Some(driver) => (
                Some(driver.create_run(&name, &req.limits, slot.lease())?),
                None,
            ),
            None => (None, Some(slot.lease())),
        };
        let spec = self.jail_spec(slot, &req, cgroups.as_ref(), None, Vec::new());
        let budget = cpu_budget(cgroups.as_ref(), &req.limits);
        let supervised = supervise(
            &self.inner.cfg.helper,
            self.inner.launcher.as_ref(),
            &spec,
            &req.limits,
            &cancel,
            req.output.as_ref(),
            req.pause.as_ref(),
            budget.as_ref(),
        )
        .await;
        conclude(&name, supervised, cgroups, lease).await
    }

    fn jail_spec(
        &self,
        slot: &Slot,
        req: &RunRequest,
        cgroups: Option<&RunCgroups>,
        park: Option<ParkMode>,
        etc_files: Vec<(String, String)>,
    ) -> JailSpec {
        JailSpec {
            root_dir: self.inner.cfg.root_dir.clone(),
            ro_binds: self.inner.cfg.ro_binds.clone(),
            etc_binds: self.inner.cfg.etc_binds.clone(),
            workspace: req.workspace.clone(),
            project: req.project.clone(),
            argv: req.argv.clone(),
            env: req.env.clone(),
            id_base: slot.id_base(),
            limits: {
                let mut l = JailLimits::from_limits(&req.limits);
                // the helper's backstop cannot see a pause clock: it gets
                // the whole pause budget on top (the server still stops
                // the run at its paused-aware deadline)
                if let Some(p) = &req.pause {
                    let extra = u64::try_from(p.max_paused().as_millis()).unwrap_or(u64::MAX);
                    l.wall_ms = l.wall_ms.saturating_add(extra);
                }
                l
            },
            cgroup: cgroups.map(RunCgroups::attach),
            seccomp_filters: self
                .inner
                .filters
                .get(&seccomp::variant(
                    &req.seccomp_profile,
                    req.network.is_some(),
                ))
                .cloned(),
            landlock: self.inner.report.landlock_abi.is_some(),
            park,
            etc_files,
            network: req.network.as_ref().map(crate::netns::JailNetwork::spec),
        }
    }

    /// A unique name for a run's cgroups and parked workspace.
    fn run_name(slot: &Slot) -> String {
        // process-wide sequence: several Sandboxes in one process (tests)
        // must never pick the same group name
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        format!("{}-{}-{}", std::process::id(), slot.index(), seq)
    }

    /// Builds a jail under `slot` and parks it before its program runs: a
    /// warm jail. Everything a run needs is done here (namespaces, mounts,
    /// cgroup attach, uid, rlimits, Landlock, seccomp; for
    /// [`ParkMode::Prestart`] the runtime is started; for
    /// [`ParkMode::Embedded`] the process is a fork of the fork-server's
    /// preloaded interpreter). `limits` are the configured ones: a request
    /// can later only lower the wall and CPU time.
    ///
    /// The workspace is `workspace` (a directory directly below the slot's
    /// workspace parent, e.g. the one a compile step used) or a new empty
    /// one, owned by the slot's uid.
    pub async fn park(
        &self,
        slot: &Slot,
        park: &ParkSpec,
        limits: &Limits,
        workspace: Option<PathBuf>,
    ) -> Result<ParkedJail, SandboxError> {
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(SandboxError::ShutDown);
        }
        if !slot.belongs_to(&self.inner.slots) {
            return Err(SandboxError::ForeignSlot(slot.index()));
        }
        let t0 = std::time::Instant::now();
        let name = Self::run_name(slot);
        let workspace = match workspace {
            Some(w) => w,
            None => {
                let ws = slot.workspace_parent().join(format!("w{name}"));
                let (uid, gid) = (slot.host_uid(), slot.host_gid());
                let dir = ws.clone();
                tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                    std::fs::create_dir(&dir)?;
                    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
                    std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                })
                .await
                .map_err(|e| SandboxError::Helper(format!("create workspace: {e}")))?
                .map_err(|e| SandboxError::io("create workspace", &ws, e))?;
                ws
            }
        };
        let req = RunRequest {
            workspace,
            project: None,
            argv: if park.mode == ParkMode::Prestart {
                park.argv.clone()
            } else {
                vec!["/parked".to_owned()]
            },
            env: park.env.clone(),
            limits: limits.clone(),
            seccomp_profile: park.seccomp_profile.clone(),
            output: None,
            network: None,
            pause: None,
        };
        check_workspace_location(&req, slot)?;
        validate_request(&req)?;
        let (cgroups, lease) = match &self.inner.cgroups {
            Some(driver) => (
                Some(driver.create_run(&name, &req.limits, slot.lease())?),
                None,
            ),
            None => (None, Some(slot.lease())),
        };
        let spec = self.jail_spec(
            slot,
            &req,
            cgroups.as_ref(),
            Some(park.mode),
            park.etc_files.clone(),
        );
        let mut spec_line = serde_json::to_vec(&spec)
            .map_err(|e| SandboxError::Request(format!("encode spec: {e}")))?;
        spec_line.push(b'\n');
        let parked = async {
            let zygote = match park.mode {
                ParkMode::Embedded => match self.zygotes().get(&park.template) {
                    Some(z) => Some(z.client()?),
                    None => {
                        return Err(SandboxError::Request(format!(
                            "no fork-server for the embedded template {:?}",
                            park.template
                        )));
                    }
                },
                _ => None,
            };
            let launcher = self.inner.launcher.as_ref();
            let mut started = start_helper(&self.inner.cfg.helper, launcher, zygote).await?;
            started.send_line(&spec_line).await;
            started.wait_parked().await?;
            Ok(started)
        };
        let started = match parked.await {
            Ok(s) => s,
            Err(e) => {
                // the helper (if any) is gone with `parked`; its groups next
                if let Some(c) = cgroups {
                    let _ = c.finish().await;
                }
                return Err(e);
            }
        };
        Ok(ParkedJail {
            name,
            slot_index: slot.index(),
            workspace: req.workspace,
            started,
            cgroups,
            lease,
            mode: park.mode,
            build_time: t0.elapsed(),
        })
    }

    /// Runs `req` in a parked jail of `slot`: sends the go (argv, env, the
    /// request's wall and CPU time) and supervises the run like
    /// [`Sandbox::run`]. `req.workspace` must be the jail's workspace; for
    /// [`ParkMode::Prestart`] and [`ParkMode::Embedded`] `req.argv` goes to
    /// the waiting runtime rather than to `execve`.
    pub async fn run_parked(
        &self,
        slot: &Slot,
        jail: ParkedJail,
        req: RunRequest,
        cancel: CancellationToken,
    ) -> Result<RunResult, SandboxError> {
        if jail.slot_index != slot.index() || req.workspace != jail.workspace {
            let e = SandboxError::Request(format!(
                "parked jail {} belongs to slot {} and workspace {}",
                jail.name,
                jail.slot_index,
                jail.workspace.display()
            ));
            self.discard(jail).await;
            return Err(e);
        }
        if let Err(e) = validate_request(&req) {
            self.discard(jail).await;
            return Err(e);
        }
        if req.network.is_some() || req.pause.is_some() || req.project.is_some() {
            self.discard(jail).await;
            return Err(SandboxError::Request(
                "a parked jail has no services channel, pause clock or project: run it in a jail built for it".to_owned(),
            ));
        }
        let limits = JailLimits::from_limits(&req.limits);
        let go = GoMsg {
            argv: req.argv,
            env: req.env,
            wall_ms: limits.wall_ms,
            cpu_secs: limits.cpu_secs,
            kernel: false,
        };
        let mut go_line = serde_json::to_vec(&go)
            .map_err(|e| SandboxError::Request(format!("encode go: {e}")))?;
        go_line.push(b'\n');
        let ParkedJail {
            name,
            started,
            mut cgroups,
            lease,
            ..
        } = jail;
        if let Some(c) = cgroups.as_mut() {
            c.mark_start();
        }
        let budget = cpu_budget(cgroups.as_ref(), &req.limits);
        let supervised = started
            .drive(
                Some(&go_line),
                &req.limits,
                &cancel,
                req.output.as_ref(),
                None,
                budget.as_ref(),
            )
            .await;
        conclude(&name, supervised, cgroups, lease).await
    }

    /// Tears down a parked jail that will not run: closes its control pipe
    /// (the helper kills and reaps the jail) and removes its cgroups. Its
    /// workspace goes when the slot is released.
    pub async fn discard(&self, jail: ParkedJail) {
        let ParkedJail {
            started,
            cgroups,
            lease,
            ..
        } = jail;
        let never = CancellationToken::new();
        never.cancel();
        let limits = Limits::default();
        // Cancelled at once: the same path as a cancelled run, so the
        // helper gets its grace to reap before it is killed.
        let _ = started.drive(None, &limits, &never, None, None, None).await;
        if let Some(c) = cgroups {
            let _ = c.finish().await;
        }
        drop(lease);
    }

    /// Starts the fork-server (`helper __zygote`) of the template named
    /// `template` with `cfg` and waits for its preload. Once it runs,
    /// [`ParkMode::Embedded`] jails whose [`ParkSpec::template`] names it
    /// can be built.
    pub async fn start_zygote(
        &self,
        template: &str,
        cfg: &ZygoteConfig,
    ) -> Result<ZygoteInfo, SandboxError> {
        if let Some(z) = self.zygotes().get(template) {
            return Ok(z.info().clone());
        }
        let z = Zygote::start(&self.inner.cfg.helper, cfg).await?;
        let mut zygotes = self
            .inner
            .zygotes
            .write()
            .unwrap_or_else(|p| p.into_inner());
        // A concurrent start lost the race: its process goes with `z`.
        Ok(zygotes
            .entry(template.to_owned())
            .or_insert(z)
            .info()
            .clone())
    }

    fn zygotes(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Zygote>> {
        self.inner.zygotes.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the fork-server of `template` runs and answers (its
    /// embedded warm jails are possible).
    pub fn has_zygote(&self, template: &str) -> bool {
        self.zygotes().get(template).is_some_and(Zygote::alive)
    }

    /// The jail launcher's pid while it answers (`None`: every helper is
    /// spawned).
    pub fn launcher_pid(&self) -> Option<u32> {
        self.inner
            .launcher
            .as_ref()
            .filter(|l| l.alive())
            .map(Launcher::pid)
    }

    /// What the fork-server of `template` reported at start-up, if it
    /// runs.
    pub fn zygote_info(&self, template: &str) -> Option<ZygoteInfo> {
        self.zygotes().get(template).map(|z| z.info().clone())
    }

    /// Every fork-server started (alive or not), by template name, sorted.
    pub fn zygote_infos(&self) -> Vec<(String, ZygoteInfo)> {
        let mut all: Vec<_> = self
            .zygotes()
            .iter()
            .map(|(name, z)| (name.clone(), z.info().clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

/// How a warm jail's program process is prepared (see [`Sandbox::park`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkSpec {
    pub mode: ParkMode,
    /// [`ParkMode::Prestart`]: the runtime started at park time.
    pub argv: Vec<String>,
    /// [`ParkMode::Prestart`]: its environment.
    pub env: Vec<(String, String)>,
    /// Files under `/etc/kiln/` in the jail (a runtime's bootstrap).
    pub etc_files: Vec<(String, String)>,
    pub seccomp_profile: String,
    /// [`ParkMode::Embedded`]: the name of the template (fork-server) the
    /// program is forked from.
    pub template: String,
}

impl ParkSpec {
    /// A jail that waits to `execve` whatever the go names.
    pub fn exec() -> ParkSpec {
        ParkSpec {
            mode: ParkMode::Exec,
            argv: Vec::new(),
            env: Vec::new(),
            etc_files: Vec::new(),
            seccomp_profile: seccomp::DEFAULT_PROFILE.to_owned(),
            template: String::new(),
        }
    }
}

/// A jail built ahead and parked before its program runs. Use it once with
/// [`Sandbox::run_parked`] or tear it down with [`Sandbox::discard`];
/// dropping it kills the helper (and with it the jail) and leaves the
/// cgroups to a background thread.
#[derive(Debug)]
pub struct ParkedJail {
    pub(crate) name: String,
    pub(crate) slot_index: u32,
    pub(crate) workspace: PathBuf,
    pub(crate) started: Started,
    pub(crate) cgroups: Option<RunCgroups>,
    pub(crate) lease: Option<SlotLease>,
    mode: ParkMode,
    build_time: Duration,
}

impl ParkedJail {
    /// Host path of the directory bound at `/mnt/data`.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    pub fn mode(&self) -> ParkMode {
        self.mode
    }

    /// How long building and parking took.
    pub fn build_time(&self) -> Duration {
        self.build_time
    }
}

/// Ends a run, whatever happened: removes its cgroups (waiting until they
/// are empty, for the statistics), releases the slot lease, and maps what
/// the helper reported to the run's result.
/// The whole jail's CPU budget of a run in `cgroups` (none where the host
/// does not account CPU per group: then RLIMIT_CPU per process is all).
fn cpu_budget(cgroups: Option<&RunCgroups>, limits: &Limits) -> Option<crate::run::CpuBudget> {
    let meter = cgroups?.cpu_meter()?;
    Some(crate::run::CpuBudget::new(meter, limits.cpu_time))
}

async fn conclude(
    name: &str,
    supervised: Result<Supervised, SandboxError>,
    cgroups: Option<RunCgroups>,
    lease: Option<SlotLease>,
) -> Result<RunResult, SandboxError> {
    let stats = match cgroups {
        Some(c) => c.finish().await,
        None => Ok(CgroupStats::default()),
    };
    drop(lease);
    let s = supervised?;
    tracing::debug!(
        run = %name,
        wall_ms = s.wall_time.as_millis() as u64,
        killed = ?s.killed,
        status = ?s.status,
        "jail finished"
    );
    into_result(s, stats?)
}

/// Maps what the helper reported to a run's result.
fn into_result(s: Supervised, stats: CgroupStats) -> Result<RunResult, SandboxError> {
    let (exit, cpu_time) = match (s.status, s.killed) {
        (_, Some(KillReason::Cancelled)) => {
            return Err(SandboxError::Cancelled(Some(crate::KilledUsage {
                wall_time: s.wall_time,
                cpu_time: stats.cpu,
                memory_peak: stats.memory_peak,
            })));
        }
        (
            Some(StatusMsg::Finished {
                code,
                signal,
                cpu_us,
            }),
            _,
        ) => {
            let exit = match (code, signal) {
                (_, Some(sig)) => ExitStatus::Signal(sig),
                (Some(code), None) => ExitStatus::Code(code),
                (None, None) => ExitStatus::Signal(libc::SIGKILL),
            };
            (exit, Some(Duration::from_micros(cpu_us)))
        }
        (Some(StatusMsg::Error(m)), None) => return Err(SandboxError::Setup(m)),
        (Some(StatusMsg::ExecFailed(m)), None) => return Err(SandboxError::Exec(m)),
        (_, Some(_)) => (ExitStatus::Signal(libc::SIGKILL), None),
        (None | Some(StatusMsg::Parked), None) if stats.oom_kills > 0 => {
            (ExitStatus::Signal(libc::SIGKILL), None)
        }
        (None | Some(StatusMsg::Parked), None) => {
            let tail = String::from_utf8_lossy(&s.stderr.buf);
            let tail: String = tail
                .chars()
                .rev()
                .take(500)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            return Err(SandboxError::Helper(format!(
                "{} (stderr: {})",
                s.helper_exit,
                tail.trim()
            )));
        }
    };
    // the jail used its CPU budget: reported as RLIMIT_CPU's would be
    let exit = match s.killed {
        Some(KillReason::CpuTime) => ExitStatus::Signal(libc::SIGXCPU),
        _ => exit,
    };
    // the run's cgroup sees every process (also those killed with the jail,
    // and a warm `py` program, which is not the init's child); the init's
    // rusage only those it reaped
    let cpu_time = stats.cpu.or(cpu_time);
    Ok(RunResult {
        exit,
        stdout: s.stdout.buf,
        stderr: s.stderr.buf,
        stdout_overflow: s.stdout.overflow,
        stderr_overflow: s.stderr.overflow,
        timed_out: s.killed == Some(KillReason::Timeout),
        oom_killed: stats.oom_kills > 0,
        wall_time: s.wall_time,
        cpu_time,
        memory_peak: stats.memory_peak,
        cpu_throttled: stats.cpu_throttled,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(argv: &[&str]) -> RunRequest {
        RunRequest {
            workspace: std::env::temp_dir(),
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            ..RunRequest::default()
        }
    }

    /// Compile-time: the executor shares a `Sandbox` across tasks and spawns
    /// `run` futures on a multi-threaded runtime.
    #[allow(dead_code)]
    fn sandbox_and_run_future_are_shareable(sb: &Sandbox, slot: &Slot, req: RunRequest) {
        fn shareable<T: Send + Sync + Clone + 'static>(_: &T) {}
        fn sendable<T: Send>(_: &T) {}
        shareable(sb);
        sendable(&sb.run(slot, req, CancellationToken::new()));
    }

    #[test]
    fn requests_with_relative_or_empty_argv_are_refused() {
        assert!(matches!(
            validate_request(&req(&[])),
            Err(SandboxError::Request(_))
        ));
        assert!(matches!(
            validate_request(&req(&["python3"])),
            Err(SandboxError::Request(_))
        ));
        assert!(validate_request(&req(&["/usr/bin/python3"])).is_ok());
    }

    #[test]
    fn requests_with_bad_environment_are_refused() {
        let mut r = req(&["/bin/true"]);
        r.env = vec![("A=B".into(), "c".into())];
        assert!(matches!(
            validate_request(&r),
            Err(SandboxError::Request(_))
        ));
        r.env = vec![("A".into(), "c\0d".into())];
        assert!(matches!(
            validate_request(&r),
            Err(SandboxError::Request(_))
        ));
    }

    fn report() -> HostReport {
        HostReport {
            kernel: "6.18".into(),
            root: true,
            user_namespaces: true,
            cgroup: crate::CgroupSupport::None,
            cgroup_limits: false,
            seccomp: true,
            landlock_abi: None,
            workspace_quota: WorkspaceQuota::LoopExt4,
            problems: vec!["cgroup: no memory controller in cgroup v1 or v2".into()],
            warnings: vec![],
            degraded: vec![],
        }
    }

    #[test]
    fn a_missing_protection_refuses_the_start_without_the_degraded_flag() {
        let e = settle_report(report(), &WorkspaceQuota::LoopExt4, false).expect_err("refused");
        assert!(matches!(e, SandboxError::Unsupported(p) if p.len() == 1));
    }

    #[test]
    fn the_degraded_flag_records_every_protection_it_waives() {
        let quota = WorkspaceQuota::None {
            reason: "no mounts".into(),
        };
        let r = settle_report(report(), &quota, true).expect("degraded start");
        assert_eq!(r.degraded, vec![WITHOUT_CGROUP, WITHOUT_QUOTA]);
        assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
        assert!(r.to_string().contains("DEGRADED"));
    }

    #[test]
    fn the_degraded_flag_never_waives_namespaces() {
        let mut r = report();
        r.user_namespaces = false;
        r.problems
            .push("cannot create the jail's namespaces: EPERM".into());
        assert!(settle_report(r, &WorkspaceQuota::LoopExt4, true).is_err());
    }

    #[test]
    fn a_tmpfs_quota_is_a_warning_and_a_missing_one_a_problem() {
        let mut ok = report();
        ok.problems.clear();
        ok.cgroup_limits = true;
        let tmpfs = WorkspaceQuota::Tmpfs {
            reason: "no loop".into(),
        };
        let r = settle_report(ok.clone(), &tmpfs, false).expect("tmpfs is enough");
        assert!(
            r.warnings.iter().any(|w| w.contains("tmpfs")),
            "{:?}",
            r.warnings
        );
        assert_eq!(r.workspace_quota, tmpfs);
        let none = WorkspaceQuota::None {
            reason: "off".into(),
        };
        assert!(settle_report(ok, &none, false).is_err());
    }

    #[test]
    fn unsearchable_ancestors_are_reported() {
        let top = tempfile::tempdir().expect("tempdir");
        let inner = top.path().join("ws");
        std::fs::create_dir(&inner).expect("mkdir");
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        assert!(matches!(
            check_searchable(&inner),
            Err(SandboxError::PathNotSearchable { .. })
        ));
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
        assert!(check_searchable(&inner).is_ok());
    }
}
