//! [`Sandbox`]: the executor's handle. Checks the host once, owns the slot
//! pool (with each slot's quota-limited workspace filesystem) and the cgroup
//! driver, decides what runs degraded, and runs one jail per
//! [`Sandbox::run`].
//!
//! Split by seam: `host.rs` (start-up checks, degraded mode), `setup.rs`
//! (the one set-up path every jail start takes), `parked.rs` (warm jails:
//! park, run parked, discard), `outcome.rs` (how a run ends).

mod host;
mod kept;
mod outcome;
mod parked;
mod setup;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;

use self::host::{check_searchable, prepare_root_dir, settle_report};
pub(crate) use self::kept::KEPT_WORKSPACE;
use self::outcome::{conclude, cpu_budget};
pub use self::parked::{ParkSpec, ParkedJail};
pub(crate) use self::setup::Going;
use self::setup::Prepared;
use crate::cgroup::CgroupDriver;
use crate::config::SandboxConfig;
use crate::error::SandboxError;
use crate::launcher::{Launcher, Via};
use crate::probe::{HostReport, probe_host_with};
use crate::quota::SlotFs;
use crate::run::{RunRequest, RunResult, supervise};
use crate::seccomp;
use crate::slots::{Slot, SlotPool};
use crate::spec::BpfInsns;
use crate::zygote::{Zygote, ZygoteConfig, ZygoteInfo};

#[derive(Debug)]
struct Inner {
    cfg: SandboxConfig,
    report: HostReport,
    /// `None` only when degraded.
    cgroups: Option<Arc<CgroupDriver>>,
    slots: Arc<SlotPool>,
    areas: Arc<SlotFs>,
    closed: AtomicBool,
    /// Compiled seccomp profiles by name (empty when degraded without).
    filters: HashMap<String, Vec<BpfInsns>>,
    /// The fork-servers for embedded warm jails by template name, once
    /// started.
    zygotes: std::sync::RwLock<HashMap<String, Zygote>>,
    /// Forks jail helpers; `None` if it could not start (helpers are
    /// spawned then). When the slot filesystems separate kernels, it forks
    /// only those of one-shot jails (parked ones included), in a mount
    /// namespace without the kernel slots' filesystems.
    launcher: Option<Launcher>,
    /// Forks kernel jails' helpers when the slot filesystems separate
    /// kernels (`areas.separates_kernels()`); `None` there (it could not
    /// start) means a spawned helper, both in the server's mount namespace,
    /// never `launcher`'s, which lacks their workspaces.
    kernel_launcher: Option<Launcher>,
    /// One-shot jails kept per fixed slot (`kept.rs`); `None`: off.
    kept: Option<kept::KeptJails>,
}

/// Native Linux jails. Cheap to clone; all clones share one slot pool.
#[derive(Debug, Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

impl Sandbox {
    /// Probes the host, sets up each slot's workspace filesystem and the
    /// cgroup parents, and prepares the root mount point. Fails with
    /// [`SandboxError::Unsupported`] if a protection is missing — unless
    /// `cfg.allow_degraded`, which starts anyway (never without root and
    /// namespaces) and logs an ERROR per missing protection.
    pub fn new(cfg: SandboxConfig) -> Result<Sandbox, SandboxError> {
        cfg.validate()?;
        let probed = probe_host_with(&cfg.ns_last_pid);
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
        // every system jails run from (the default, each language's own)
        // has the directories bound
        let systems = cfg.systems();
        for b in systems
            .iter()
            .flat_map(|(_, s)| cfg.ro_binds.iter().map(|b| s.source_of(b)))
        {
            if !b.exists() {
                return Err(SandboxError::Config(format!(
                    "ro_bind {} does not exist",
                    b.display()
                )));
            }
            check_searchable(&b)?;
        }
        // Kernel slots' mounts are kept out of one-shot jails where the
        // server has a mount namespace of its own, which propagates nothing.
        let separate =
            cfg.kernel_slots > 0 && matches!(crate::mountns::own_mount_namespace(), Some(Ok(())));
        let (areas, _) = SlotFs::setup(
            &cfg.slots_dir(),
            cfg.slots,
            cfg.kernel_slots,
            cfg.workspace_bytes,
            cfg.workspace_inodes,
            cfg.workspace_quota,
            separate,
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
            Some(Arc::new(c))
        } else {
            None
        };
        tracing::info!(
            cgroup = ?cgroups.as_deref().map(CgroupDriver::parents),
            whole_jail_cpu_budget = cgroups.as_deref().is_some_and(CgroupDriver::accounts_cpu),
            cpu_per_run = f64::from(cpu.per_run_millis) / 1000.0,
            cpu_all_runs = f64::from(cpu.all_runs_millis) / 1000.0,
            slots = cfg.slots,
            kernel_slots_on_demand = cfg.kernel_slots,
            uid_base = cfg.uid_base,
            workspace_quota = %report.workspace_quota,
            workspace_bytes = cfg.workspace_bytes,
            workspace_inodes = cfg.workspace_inodes,
            landlock_abi = ?report.landlock_abi,
            "sandbox ready"
        );
        let slots = SlotPool::new(
            cfg.uid_base,
            cfg.slots,
            cfg.kernel_slots,
            Arc::clone(&areas),
            // only where seccomp limits sockets to AF_UNIX (`slotnet.rs`)
            !filters.is_empty(),
            cgroups.clone(),
        );
        // the first kernels find their filesystems made
        slots.refill();
        let separate_kernels = areas.separates_kernels();
        let launcher = start_launcher(
            &cfg.helper,
            separate_kernels.then_some(areas.dir()),
            false,
            "jail launcher",
        );
        // Kernel jails are made from a namespace without kernel slots too,
        // each handed its own slot's mount, where the kernel can copy mounts
        // (`open_tree`); else from the server's, holding every kernel's.
        let slot_trees = separate_kernels && crate::sys::open_tree_clone(areas.dir()).is_ok();
        let kernel_launcher = separate_kernels
            .then(|| {
                start_launcher(
                    &cfg.helper,
                    slot_trees.then_some(areas.dir()),
                    slot_trees,
                    "kernel jail launcher",
                )
            })
            .flatten();
        // a host that cannot have a kept jail's program reset its next pid
        // runs every `py` jail once instead (`probe::keep_jails_blocker`)
        let kept = match (cfg.keep_jails, &report.keep_jails_blocker) {
            (true, None) => Some(kept::KeptJails::default()),
            (true, Some(why)) => {
                tracing::warn!(reason = %why, "keep_jails is set, but this host cannot keep jails: every py run builds a new jail");
                None
            }
            (false, _) => None,
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
                kernel_launcher,
                kept,
            }),
        })
    }

    /// Refuses further runs and unmounts every slot's workspace filesystem,
    /// removing images and mount points. Call once no run is in flight (a
    /// run still going keeps its workspace until it ends, detached). Also
    /// done when the last clone is dropped and at process exit.
    pub fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        if let Some(kept) = &self.inner.kept {
            kept.clear();
        }
        self.inner.slots.remove_cgroups();
        self.inner.areas.teardown();
    }

    /// Ends every kept jail (`kept.rs`): with the warm pool's shutdown no
    /// jail waits for a next program any more.
    pub(crate) fn end_kept_jails(&self) {
        if let Some(kept) = &self.inner.kept {
            kept.clear();
        }
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
            .as_deref()
            .map(CgroupDriver::parents)
            .unwrap_or_default()
    }

    /// Takes a free uid slot, waiting while all are busy: one without a
    /// kept jail (`kept.rs`) when one is free, as any other use of a slot
    /// ends its kept jail.
    pub async fn acquire_slot(&self) -> Slot {
        self.acquire_slot_keeping(None).await
    }

    /// [`Sandbox::acquire_slot`] for a park of `park`: a jail that would
    /// be kept (`ParkMode::Embedded`, with `keep_jails`) takes a slot
    /// whose kept jail is of its template when one is free (the park then
    /// reuses it), else one without a kept jail; any other park takes a
    /// slot without a kept jail when one is free. In mixed traffic a `js`
    /// park thus leaves the kept `py` jails to the next `py` parks.
    pub async fn acquire_slot_for(&self, park: &ParkSpec) -> Slot {
        let keeps = park.mode == crate::spec::ParkMode::Embedded;
        self.acquire_slot_keeping(keeps.then_some(park.template.as_str()))
            .await
    }

    /// A free slot ranked by its kept jail: of `template` (when kept) 0,
    /// none 1, another 2.
    async fn acquire_slot_keeping(&self, template: Option<&str>) -> Slot {
        let Some(kept) = &self.inner.kept else {
            return self.inner.slots.acquire().await;
        };
        self.inner
            .slots
            .acquire_ranked(|| {
                let kept = kept.templates();
                move |i: u32| match (kept.get(&i), template) {
                    (None, _) => 1,
                    (Some(t), Some(want)) if t == want => 0,
                    (Some(_), _) => 2,
                }
            })
            .await
    }

    /// Takes a free slot kept for live kernels (`kernel_slots`), waiting
    /// while all are busy, with its workspace filesystem (made ahead for a
    /// few, else now); the filesystem goes away again when the slot is
    /// dropped and its runs are over. Without kernel slots, any free slot.
    pub async fn acquire_kernel_slot(&self) -> Result<Slot, SandboxError> {
        self.inner
            .slots
            .acquire_on_demand()
            .await
            .map_err(SandboxError::Setup)
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
        self.admit(slot)?;
        let degraded = &self.inner.report.degraded;
        let prepared = self.prepare(slot, setup::run_name(slot), &req, None)?;
        if !degraded.is_empty() {
            tracing::warn!(without = ?degraded, "INSECURE: jail runs without some protections");
        }
        let Prepared {
            name,
            spec,
            cgroups,
            lease,
        } = prepared;
        let budget = cpu_budget(cgroups.as_ref(), &req.limits);
        let supervised = supervise(
            &self.inner.cfg.helper,
            self.launcher_for(slot),
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
        let z = Zygote::start(&self.inner.cfg.helper, cfg, self.inner.areas.dir()).await?;
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

    /// The launcher that forks the helpers of `slot`'s jails (`None`:
    /// spawn them): a kernel slot's when kernels are kept apart, which
    /// hands the jail its slot's filesystem.
    fn launcher_for(&self, slot: &Slot) -> Option<Via<'_>> {
        if self.inner.areas.separates_kernels() && self.inner.slots.is_on_demand(slot.index()) {
            self.inner.kernel_launcher.as_ref().map(|launcher| Via {
                launcher,
                slot_mount: Some(slot.workspace_parent()),
            })
        } else {
            self.inner.launcher.as_ref().map(|launcher| Via {
                launcher,
                slot_mount: None,
            })
        }
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

/// Starts a jail launcher (`what` names it in the log); `None` if it cannot
/// start: its helpers are spawned then.
fn start_launcher(
    helper: &std::path::Path,
    without_kernel_slots: Option<&std::path::Path>,
    slot_trees: bool,
    what: &str,
) -> Option<Launcher> {
    match Launcher::start(helper, without_kernel_slots, slot_trees) {
        Ok(l) => {
            tracing::info!(
                pid = l.pid(),
                without_kernel_slots = without_kernel_slots.is_some(),
                "{what} ready"
            );
            Some(l)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no {what}: its jails spawn their helpers");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compile-time: the executor shares a `Sandbox` across tasks and spawns
    /// `run` futures on a multi-threaded runtime.
    #[allow(dead_code)]
    fn sandbox_and_run_future_are_shareable(sb: &Sandbox, slot: &Slot, req: RunRequest) {
        fn shareable<T: Send + Sync + Clone + 'static>(_: &T) {}
        fn sendable<T: Send>(_: &T) {}
        shareable(sb);
        sendable(&sb.run(slot, req, CancellationToken::new()));
    }
}
