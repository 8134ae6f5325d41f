//! Per-run cgroups: detection of the host's layout, the [`CgroupDriver`]
//! (v1 on this host, v2 where `CLONE_INTO_CGROUP` is possible) and the
//! [`RunCgroups`] guard that removes a run's groups (or hands a slot's kept
//! ones back for their reset) — after every process in them is dead — even
//! on error paths.
//!
//! Groups are created only below our own group (read from
//! `/proc/self/cgroup`), under a `kiln/` parent: `<own>/kiln/<run-id>`
//! (`<server pid>-<slot>-<seq>`), and each fixed slot's kept groups
//! (`slot.rs`) `<own>/kiln/<server pid>-u<slot's first uid>.<n>`.

pub mod detect;
mod slot;
mod v1;
mod v2;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kiln_core::Limits;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::SandboxError;
use crate::slots::SlotLease;
use crate::spec::CgroupAttach;

pub(crate) use self::slot::SlotGroups;
use self::slot::{Baseline, GroupLimits, KeptSet, Lent};

/// Name of the parent group of all runs, below our own group.
pub const KILN_GROUP: &str = "kiln";

/// What the host offers for memory and pids limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CgroupSupport {
    /// cgroup v1 memory and pids hierarchies (and `cpu`, `cpuacct` when
    /// mounted: the same group when mounted together); our own group in
    /// each.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: Option<PathBuf>,
        cpuacct: Option<PathBuf>,
    },
    /// cgroup v2 with the memory and pids controllers; our own group.
    V2 {
        group: PathBuf,
        controllers: Vec<String>,
    },
    /// Neither: limits cannot be enforced.
    None,
}

/// Detects the cgroup layout from `/proc/self/mountinfo` and
/// `/proc/self/cgroup`. Returns problems that make it unusable.
pub fn detect_support() -> (CgroupSupport, Vec<String>) {
    let read = |p: &str| fs::read_to_string(p).map_err(|e| format!("read {p}: {e}"));
    let (mountinfo, cgroup) = match (read("/proc/self/mountinfo"), read("/proc/self/cgroup")) {
        (Ok(m), Ok(c)) => (m, c),
        (Err(e), _) | (_, Err(e)) => return (CgroupSupport::None, vec![e]),
    };
    support_from(&mountinfo, &cgroup, |dir| {
        fs::read_to_string(dir.join("cgroup.controllers")).ok()
    })
}

/// [`detect_support`] on given texts; `controllers` reads a v2 group's
/// `cgroup.controllers`.
pub fn support_from(
    mountinfo: &str,
    proc_cgroup: &str,
    controllers: impl Fn(&Path) -> Option<String>,
) -> (CgroupSupport, Vec<String>) {
    let mounts = detect::cgroup_mounts(mountinfo);
    let members = detect::memberships(proc_cgroup);
    let mut problems = Vec::new();
    if let Some(group) = detect::v2_group(&mounts, &members) {
        let ctl = controllers(&group)
            .map(|t| detect::parse_controllers(&t))
            .unwrap_or_default();
        if ctl.iter().any(|c| c == "memory") && ctl.iter().any(|c| c == "pids") {
            return (
                CgroupSupport::V2 {
                    group,
                    controllers: ctl,
                },
                problems,
            );
        }
    }
    match (
        detect::v1_group(&mounts, &members, "memory"),
        detect::v1_group(&mounts, &members, "pids"),
    ) {
        (Some(memory), Some(pids)) => (
            CgroupSupport::V1 {
                memory,
                pids,
                cpu: detect::v1_group(&mounts, &members, "cpu"),
                cpuacct: detect::v1_group(&mounts, &members, "cpuacct"),
            },
            problems,
        ),
        (memory, pids) => {
            if memory.is_none() {
                problems.push("cgroup: no memory controller in cgroup v1 or v2".to_owned());
            }
            if pids.is_none() {
                problems.push("cgroup: no pids controller in cgroup v1 or v2".to_owned());
            }
            (CgroupSupport::None, problems)
        }
    }
}

/// Creates and removes per-run groups.
#[derive(Debug)]
pub enum CgroupDriver {
    V1(v1::V1),
    V2(v2::V2),
}

/// Usage figures read after a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupStats {
    pub memory_peak: Option<u64>,
    pub oom_kills: u64,
    /// CPU time of every process that ran in the groups since the run's
    /// start (see [`RunCgroups::mark_start`]); `None` where the host does
    /// not account it per group (v2 `cpu.stat`, v1 `cpuacct.usage`).
    pub cpu: Option<Duration>,
    /// How long the run's group waited because it had used its CPU quota.
    pub cpu_throttled: Option<Duration>,
}

/// How much CPU runs get, in thousandths of a core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuLimits {
    /// One run's quota.
    pub per_run_millis: u32,
    /// The quota of the `kiln/` parent: every run together.
    pub all_runs_millis: u32,
}

/// The CFS period every quota is expressed in (100 ms, the kernel's
/// default).
pub const CPU_PERIOD_US: u64 = 100_000;

impl CpuLimits {
    /// Quota per period for `millis` thousandths of a core.
    pub fn quota_us(millis: u32) -> u64 {
        (u64::from(millis) * CPU_PERIOD_US / 1000).max(1000)
    }
}

impl CgroupDriver {
    /// Prepares the `kiln/` parent group(s) for the detected layout. The
    /// CPU quotas apply where the host has a `cpu` controller.
    pub fn setup(support: &CgroupSupport, cpu: CpuLimits) -> Result<CgroupDriver, SandboxError> {
        match support {
            CgroupSupport::V1 {
                memory,
                pids,
                cpu: cpu_dir,
                cpuacct,
            } => Ok(CgroupDriver::V1(v1::V1::setup(
                memory,
                pids,
                cpu_dir.as_deref(),
                cpuacct.as_deref(),
                cpu,
            )?)),
            CgroupSupport::V2 { group, .. } => Ok(CgroupDriver::V2(v2::V2::setup(group, cpu)?)),
            CgroupSupport::None => Err(SandboxError::Unsupported(vec![
                "no usable cgroup memory and pids controllers".to_owned(),
            ])),
        }
    }

    /// Whether runs get a CPU quota (the host has a `cpu` controller).
    pub fn limits_cpu(&self) -> bool {
        match self {
            CgroupDriver::V1(d) => d.limits_cpu(),
            CgroupDriver::V2(d) => d.limits_cpu(),
        }
    }

    /// Whether each run's CPU time is accounted per group (v2 always:
    /// `cpu.stat`; v1 with `cpuacct`), so a run's CPU budget holds for its
    /// whole jail; without it only RLIMIT_CPU per process applies.
    pub fn accounts_cpu(&self) -> bool {
        match self {
            CgroupDriver::V1(d) => d.accounts_cpu(),
            CgroupDriver::V2(_) => true,
        }
    }

    /// Sets the `kiln/` parent's CPU quota (every run together). Done once
    /// stale run groups are gone: a parent's quota may not be below a
    /// child's.
    pub fn apply_parent_cpu(&self) -> Result<(), SandboxError> {
        match self {
            CgroupDriver::V1(d) => d.apply_parent_cpu(),
            CgroupDriver::V2(d) => d.apply_parent_cpu(),
        }
    }

    /// The `kiln/` parent directories holding the run groups.
    pub fn parents(&self) -> Vec<PathBuf> {
        match self {
            CgroupDriver::V1(d) => d.parents(),
            CgroupDriver::V2(d) => d.parents(),
        }
    }

    /// Creates the groups of one run with its limits. `lease` is released
    /// when the groups are gone.
    pub(crate) fn create_run(
        &self,
        name: &str,
        limits: &Limits,
        lease: SlotLease,
    ) -> Result<RunCgroups, SandboxError> {
        let mut run = self.make(name, limits)?;
        run.lease = Some(lease);
        Ok(run)
    }

    /// Rewrites the memory and pids limits of groups made by this driver
    /// (a slot's kept set, `slot.rs`) from `old` to `new`.
    fn rewrite_limits(
        &self,
        dirs: &[PathBuf],
        old: GroupLimits,
        new: GroupLimits,
    ) -> Result<(), SandboxError> {
        match self {
            CgroupDriver::V1(_) => v1::rewrite_limits(dirs, old, new),
            CgroupDriver::V2(_) => v2::rewrite_limits(dirs, new),
        }
    }

    /// Creates groups named `name` with `limits`, holding no slot lease.
    fn make(&self, name: &str, limits: &Limits) -> Result<RunCgroups, SandboxError> {
        let mut run = RunCgroups::orphan(matches!(self, CgroupDriver::V2(_)), Vec::new());
        // Every directory is pushed as soon as it exists, so an error below
        // still removes it (Drop).
        match self {
            CgroupDriver::V1(d) => {
                run.cpu = d.create(name, limits, &mut run.dirs)?;
                run.cpu_dir = d.cpu_dir(name);
            }
            CgroupDriver::V2(d) => {
                run.cpu = d.create(name, limits, &mut run.dirs)?;
                run.cpu_dir = run.dirs.first().cloned();
            }
        }
        Ok(run)
    }

    /// Removes run groups of processes that no longer exist (a previous
    /// server that crashed). Groups still holding processes are left alone.
    pub fn sweep_stale(&self) {
        for parent in self.parents() {
            let Ok(entries) = fs::read_dir(&parent) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name();
                let Some(owner) = name
                    .to_str()
                    .and_then(|n| n.split('-').next())
                    .and_then(|p| p.parse::<i32>().ok())
                else {
                    continue;
                };
                if owner == std::process::id() as i32
                    || Path::new(&format!("/proc/{owner}")).exists()
                {
                    continue;
                }
                let path = e.path();
                if procs(&path).is_empty() && fs::remove_dir(&path).is_ok() {
                    tracing::info!(path = %path.display(), "removed stale run cgroup");
                }
            }
        }
    }
}

/// Pids listed in a group's `cgroup.procs` (empty when the group is gone).
pub(crate) fn procs(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Writes a control file.
pub(crate) fn write_file(path: &Path, value: &str) -> Result<(), SandboxError> {
    fs::write(path, value).map_err(|e| SandboxError::io("write", path, e))
}

/// Creates one group directory and records it in `dirs`.
pub(crate) fn make_group(dir: PathBuf, dirs: &mut Vec<PathBuf>) -> Result<(), SandboxError> {
    fs::create_dir(&dir).map_err(|e| SandboxError::io("create cgroup", &dir, e))?;
    dirs.push(dir);
    Ok(())
}

/// How long finishing waits before SIGKILLing whatever is left in a group.
const KILL_AFTER: Duration = Duration::from_millis(300);
/// How long finishing waits in total.
const GIVE_UP: Duration = Duration::from_secs(10);

/// The peak memory of the groups since [`RunCgroups::peak_window`].
#[derive(Debug)]
pub(crate) enum PeakWindow {
    V2(fs::File),
    V1(PathBuf),
}

impl PeakWindow {
    pub(crate) fn peak(&self) -> Option<u64> {
        match self {
            PeakWindow::V2(f) => {
                use std::os::unix::fs::FileExt;
                let mut buf = [0u8; 32];
                let n = f.read_at(&mut buf, 0).ok()?;
                std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
            }
            PeakWindow::V1(dir) => v1::stats(dir).memory_peak,
        }
    }
}

/// Reads a run's group CPU counter (v2 `cpu.stat` `usage_usec`, v1
/// `cpuacct.usage`) relative to a base.
#[derive(Debug, Clone)]
pub(crate) struct CpuMeter {
    v2: bool,
    dir: PathBuf,
    base: Duration,
}

impl CpuMeter {
    /// CPU time used since the base; `None` once the group is gone.
    pub(crate) fn used(&self) -> Option<Duration> {
        let now = if self.v2 {
            v2::cpu_usage(&self.dir)
        } else {
            v1::cpu_usage(&self.dir)
        }?;
        Some(now.saturating_sub(self.base))
    }
}

/// The groups of one run. [`RunCgroups::finish`] waits for them to empty,
/// reads the stats and removes them (a slot's kept set: hands it back to be
/// reset in the slot's clean-up); dropping an unfinished guard hands the
/// same work to a background thread.
#[derive(Debug)]
pub struct RunCgroups {
    v2: bool,
    /// Groups not removed yet; the first is where memory statistics live.
    dirs: Vec<PathBuf>,
    /// The group with the run's CPU quota, if any.
    cpu: Option<PathBuf>,
    /// The group whose CPU time is read (v1 `cpuacct`, v2 the run group).
    cpu_dir: Option<PathBuf>,
    /// Its CPU time when the run's program started (see `mark_start`).
    cpu_base: Option<Duration>,
    /// The OOM kills and throttled time counted before the run (a slot's
    /// kept set; zero for the run's own groups).
    base: Baseline,
    /// A slot's kept set: handed back for its reset instead of removed.
    kept: Option<Lent>,
    /// A kept v2 set's peak since the run took it.
    peak: Option<PeakWindow>,
    /// The groups run at idle CPU priority (`cpu.idle`): a jail built
    /// ahead for the warm pool, until its go (see [`RunCgroups::set_ahead`]).
    ahead: bool,
    done: bool,
    lease: Option<SlotLease>,
}

impl RunCgroups {
    /// Groups `dirs` with no limits of their own to track (being made, or
    /// to be removed).
    fn orphan(v2: bool, dirs: Vec<PathBuf>) -> RunCgroups {
        RunCgroups {
            v2,
            dirs,
            cpu: None,
            cpu_dir: None,
            cpu_base: None,
            base: Baseline::default(),
            kept: None,
            peak: None,
            ahead: false,
            done: false,
            lease: None,
        }
    }

    /// A slot's kept `set` lent to one run.
    fn lent(
        v2: bool,
        set: KeptSet,
        kept: Lent,
        peak: Option<PeakWindow>,
        lease: SlotLease,
    ) -> RunCgroups {
        RunCgroups {
            v2,
            dirs: set.dirs,
            cpu: set.cpu,
            cpu_dir: set.cpu_dir,
            cpu_base: Some(set.base.cpu),
            base: set.base,
            kept: Some(kept),
            peak,
            ahead: false,
            done: false,
            lease: Some(lease),
        }
    }

    /// The directories, the quota group and the CPU-time group, which the
    /// caller now owns.
    fn into_parts(mut self) -> (Vec<PathBuf>, Option<PathBuf>, Option<PathBuf>) {
        self.done = true;
        (
            std::mem::take(&mut self.dirs),
            self.cpu.take(),
            self.cpu_dir.take(),
        )
    }

    /// Removes the (empty) groups now, or leaves what is still busy to the
    /// background thread of `Drop`.
    fn remove_or_leave(mut self) {
        if let Ok(true) = self.try_remove() {
            self.done = true;
        }
    }

    /// How the helper joins these groups.
    pub fn attach(&self) -> CgroupAttach {
        if self.v2 {
            CgroupAttach::V2 {
                dir: self.dirs.first().cloned().unwrap_or_default(),
            }
        } else {
            CgroupAttach::V1 {
                procs: self.dirs.iter().map(|d| d.join("cgroup.procs")).collect(),
            }
        }
    }

    /// CPU time charged to the groups so far.
    fn cpu_usage(&self) -> Option<Duration> {
        self.cpu_meter_from(Duration::ZERO)?.used()
    }

    fn cpu_meter_from(&self, base: Duration) -> Option<CpuMeter> {
        Some(CpuMeter {
            v2: self.v2,
            dir: self.cpu_dir.clone()?,
            base,
        })
    }

    /// A reader of the CPU time every process of the jail used since the
    /// program started ([`RunCgroups::mark_start`]; a cold jail's since its
    /// groups were made): the whole jail's CPU, forks and all. `None` where
    /// the host does not account CPU per group (v1 without `cpuacct`).
    pub(crate) fn cpu_meter(&self) -> Option<CpuMeter> {
        self.cpu_meter_from(self.cpu_base.unwrap_or_default())
    }

    /// A jail built ahead of any request (the warm pool's refill) runs at
    /// idle CPU priority until its go: its start-up (a `js` jail's node
    /// boots for ~30 ms of CPU) then takes only CPU no run wants, instead
    /// of landing on the request that arrives while it builds. A request
    /// that finds no parked jail has its own built at normal priority.
    /// Nothing on a host without `cpu.idle` (kernels before 5.15) or
    /// without a CPU group.
    pub(crate) fn set_ahead(&mut self, on: bool) {
        if self.ahead == on {
            return;
        }
        let Some(cpu) = &self.cpu else {
            return;
        };
        match fs::write(cpu.join("cpu.idle"), if on { "1" } else { "0" }) {
            Ok(()) => self.ahead = on,
            Err(e) => {
                tracing::debug!(group = %cpu.display(), error = %e, "cpu.idle not written");
            }
        }
    }

    /// Whether the CPU group runs at idle priority now, as its `cpu.idle`
    /// reads; `None` without a CPU group or `cpu.idle`.
    pub(crate) fn idle_now(&self) -> Option<bool> {
        let text = fs::read_to_string(self.cpu.as_ref()?.join("cpu.idle")).ok()?;
        Some(text.trim() == "1")
    }

    /// The program starts now (the go of a parked jail): figures read at
    /// the end count from here, not from when the jail was built; a jail
    /// built ahead runs at normal priority from here.
    pub(crate) fn mark_start(&mut self) {
        self.set_ahead(false);
        self.cpu_base = self.cpu_usage();
        if !self.v2
            && let Some(memory) = self.dirs.first()
        {
            v1::reset_peak(memory);
        }
    }

    /// Usage so far while the groups still run (a kernel between two
    /// evaluations): CPU since `mark_start`, peak memory, OOM kills.
    pub(crate) fn live_stats(&self) -> CgroupStats {
        self.read_stats()
    }

    /// Memory the groups hold now (v2 `memory.current`, v1
    /// `memory.usage_in_bytes`); `None` if it cannot be read.
    pub(crate) fn memory_now(&self) -> Option<u64> {
        let memory = self.dirs.first()?;
        let file = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        fs::read_to_string(memory.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Starts a new peak-memory window and returns a reader of its peak:
    /// cgroup v2 (Linux 6.12+) resets `memory.peak` for one open descriptor
    /// only, v1 resets the group's `max_usage_in_bytes`. `None` if neither
    /// works (then only the groups' lifetime peak is known).
    pub(crate) fn peak_window(&self) -> Option<PeakWindow> {
        let memory = self.dirs.first()?;
        if self.v2 {
            use std::io::Write;
            let mut f = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(memory.join("memory.peak"))
                .ok()?;
            f.write_all(b"reset\n").ok()?;
            Some(PeakWindow::V2(f))
        } else {
            v1::reset_peak(memory);
            Some(PeakWindow::V1(memory.clone()))
        }
    }

    fn busy(&self) -> bool {
        self.dirs.iter().any(|d| !procs(d).is_empty())
    }

    fn kill_all(&self) {
        for d in &self.dirs {
            if self.v2 && fs::write(d.join("cgroup.kill"), "1").is_ok() {
                continue;
            }
            for pid in procs(d) {
                // ESRCH (already gone) is fine.
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }

    fn read_stats(&self) -> CgroupStats {
        let Some(dir) = self.dirs.first() else {
            return CgroupStats::default();
        };
        let mut stats = if self.v2 {
            v2::stats(dir)
        } else {
            v1::stats(dir)
        };
        stats.oom_kills = stats.oom_kills.saturating_sub(self.base.oom_kills);
        if let Some(p) = &self.peak {
            stats.memory_peak = p.peak();
        }
        stats.cpu = self
            .cpu_usage()
            .map(|now| now.saturating_sub(self.cpu_base.unwrap_or_default()));
        if let Some(cpu) = &self.cpu {
            let text = fs::read_to_string(cpu.join("cpu.stat")).unwrap_or_default();
            stats.cpu_throttled = if self.v2 {
                detect::keyed_value(&text, "throttled_usec").map(Duration::from_micros)
            } else {
                detect::keyed_value(&text, "throttled_time").map(Duration::from_nanos)
            }
            .map(|t| t.saturating_sub(self.base.throttled));
        }
        stats
    }

    /// Removes the groups that are empty; `true` once all are gone.
    fn try_remove(&mut self) -> Result<bool, SandboxError> {
        let mut err = None;
        self.dirs.retain(|d| match fs::remove_dir(d) {
            Ok(()) => false,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => true,
            Err(e) => {
                err = Some(SandboxError::io("remove cgroup", d, e));
                true
            }
        });
        match err {
            Some(e) => Err(e),
            None => Ok(self.dirs.is_empty()),
        }
    }

    /// One step of teardown; `Some(stats)` when done.
    fn step(
        &mut self,
        started: Instant,
        stats: &mut Option<CgroupStats>,
    ) -> Result<bool, SandboxError> {
        if self.busy() {
            if started.elapsed() >= KILL_AFTER {
                self.kill_all();
            }
            return Ok(false);
        }
        if stats.is_none() {
            *stats = Some(self.read_stats());
        }
        if let Some(kept) = self.kept.take() {
            // a slot's set: reset in the slot's clean-up, not removed (and
            // not left idle by a parked jail that never ran)
            self.set_ahead(false);
            self.peak = None;
            kept.hand_back(
                std::mem::take(&mut self.dirs),
                self.cpu.take(),
                self.cpu_dir.take(),
            );
            return Ok(true);
        }
        self.try_remove()
    }

    /// Waits until no process is left in the groups (killing stragglers after
    /// a short grace), reads the statistics and removes the groups.
    pub async fn finish(mut self) -> Result<CgroupStats, SandboxError> {
        let started = Instant::now();
        let mut stats = None;
        loop {
            match self.step(started, &mut stats) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) if started.elapsed() >= GIVE_UP => return Err(e),
                Err(_) => {}
            }
            if started.elapsed() >= GIVE_UP {
                return Err(SandboxError::CgroupBusy {
                    path: self.dirs.first().cloned().unwrap_or_default(),
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.done = true;
        self.lease.take();
        Ok(stats.unwrap_or_default())
    }

    /// Blocking teardown used from the background thread.
    fn finish_blocking(&mut self) {
        let started = Instant::now();
        let mut stats = None;
        while started.elapsed() < GIVE_UP * 6 {
            if let Ok(true) = self.step(started, &mut stats) {
                self.done = true;
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        tracing::error!(dirs = ?self.dirs, "run cgroups could not be removed");
        // Mark done anyway: the directories are reported, retrying forever
        // would only leak the thread.
        self.done = true;
    }
}

impl Drop for RunCgroups {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut rest = RunCgroups {
            v2: self.v2,
            dirs: std::mem::take(&mut self.dirs),
            cpu: self.cpu.take(),
            cpu_dir: self.cpu_dir.take(),
            cpu_base: self.cpu_base,
            base: self.base,
            kept: self.kept.take(),
            peak: self.peak.take(),
            ahead: self.ahead,
            done: false,
            lease: self.lease.take(),
        };
        if rest.dirs.is_empty() {
            rest.done = true;
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("kiln-cgroup-reap".into())
            .spawn(move || rest.finish_blocking());
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start cgroup cleanup thread");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid_host_with_hugetlb_only_v2_uses_v1() {
        let (support, problems) = support_from(
            HYBRID_MOUNTINFO,
            "8:pids:/\n4:memory:/process_api/x\n0::/\n",
            |_| Some("hugetlb\n".to_owned()),
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            support,
            CgroupSupport::V1 {
                memory: "/sys/fs/cgroup/memory/process_api/x".into(),
                pids: "/sys/fs/cgroup/pids".into(),
                cpu: None,
                cpuacct: None,
            }
        );
    }

    #[test]
    fn v2_with_memory_and_pids_is_preferred() {
        let (support, _) = support_from(
            HYBRID_MOUNTINFO,
            "8:pids:/\n4:memory:/\n0::/kiln.service\n",
            |d| {
                assert_eq!(d, Path::new("/sys/fs/cgroup/unified/kiln.service"));
                Some("cpu io memory pids\n".to_owned())
            },
        );
        assert!(
            matches!(support, CgroupSupport::V2 { ref group, .. } if group == Path::new("/sys/fs/cgroup/unified/kiln.service"))
        );
    }

    #[test]
    fn missing_controllers_are_reported() {
        let (support, problems) = support_from(
            "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
            "0::/\n",
            |_| Some("cpu io\n".to_owned()),
        );
        assert_eq!(support, CgroupSupport::None);
        assert_eq!(problems.len(), 2, "{problems:?}");
    }
}
