//! cgroup v1 driver: separate `memory`, `pids` and (where mounted) `cpu`
//! hierarchies, and `cpuacct` for the CPU time of every process of a run
//! (its own hierarchy on some hosts, mounted with `cpu` on others). The
//! helper attaches itself by writing its pid to every `cgroup.procs` file
//! before it clones the jail (v1 has no `CLONE_INTO_CGROUP`).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kiln_core::Limits;

use super::slot::GroupLimits;
use super::{CPU_PERIOD_US, CgroupStats, CpuLimits, KILN_GROUP, detect, make_group, write_file};
use crate::error::SandboxError;

#[derive(Debug)]
pub struct V1 {
    /// `<own memory group>/kiln`
    memory: PathBuf,
    /// `<own pids group>/kiln`
    pids: PathBuf,
    /// `<own cpu group>/kiln`, where the host mounts the `cpu` controller.
    cpu: Option<PathBuf>,
    /// `<own cpuacct group>/kiln`, where the host mounts `cpuacct` in a
    /// hierarchy of its own (CPU time is then accounted per run there).
    cpuacct: Option<PathBuf>,
    /// The `cpu` hierarchy carries `cpuacct` too (`cpu,cpuacct`): a run's
    /// CPU time is read from its quota group.
    cpu_accounts: bool,
    limits: CpuLimits,
}

/// Sets a v1 group's CFS quota to `millis` thousandths of a core.
fn set_quota(group: &Path, millis: u32) -> Result<(), SandboxError> {
    write_file(&group.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
    write_file(
        &group.join("cpu.cfs_quota_us"),
        &CpuLimits::quota_us(millis).to_string(),
    )
}

impl V1 {
    /// `cpu` and `cpuacct` are our own groups in those hierarchies, if
    /// mounted (the same directory when they are mounted together).
    pub fn setup(
        memory: &Path,
        pids: &Path,
        cpu: Option<&Path>,
        cpuacct: Option<&Path>,
        limits: CpuLimits,
    ) -> Result<V1, SandboxError> {
        let cpu_accounts = cpu.is_some() && cpu == cpuacct;
        let d = V1 {
            memory: memory.join(KILN_GROUP),
            pids: pids.join(KILN_GROUP),
            cpu: cpu.map(|c| c.join(KILN_GROUP)),
            cpuacct: cpuacct
                .filter(|_| !cpu_accounts)
                .map(|c| c.join(KILN_GROUP)),
            cpu_accounts,
            limits,
        };
        for p in [Some(&d.memory), Some(&d.pids), d.cpu.as_ref()]
            .into_iter()
            .flatten()
        {
            fs::create_dir_all(p).map_err(|e| SandboxError::io("create cgroup", p, e))?;
        }
        let cpuacct = match d.cpuacct {
            Some(c) => match fs::create_dir_all(&c) {
                Ok(()) => Some(c),
                Err(e) => {
                    tracing::warn!(path = %c.display(), error = %e,
                        "no cpuacct group: CPU time is not accounted per run");
                    None
                }
            },
            None => None,
        };
        Ok(V1 { cpuacct, ..d })
    }

    pub fn limits_cpu(&self) -> bool {
        self.cpu.is_some()
    }

    pub fn apply_parent_cpu(&self) -> Result<(), SandboxError> {
        match &self.cpu {
            Some(cpu) => set_quota(cpu, self.limits.all_runs_millis),
            None => Ok(()),
        }
    }

    pub fn parents(&self) -> Vec<PathBuf> {
        let mut v = vec![self.memory.clone(), self.pids.clone()];
        v.extend(self.cpu.clone());
        v.extend(self.cpuacct.clone());
        v
    }

    /// Creates `<memory>/kiln/<name>` (first in `dirs`: stats live there),
    /// `<pids>/kiln/<name>`, `<cpu>/kiln/<name>` with their limits and
    /// `<cpuacct>/kiln/<name>`; returns the CPU quota group.
    pub fn create(
        &self,
        name: &str,
        limits: &Limits,
        dirs: &mut Vec<PathBuf>,
    ) -> Result<Option<PathBuf>, SandboxError> {
        let mem = self.memory.join(name);
        make_group(mem.clone(), dirs)?;
        // a new group's memory+swap limit is unlimited: the limit first
        write_memory(&mem, limits.memory_bytes, false)?;
        let pids = self.pids.join(name);
        make_group(pids.clone(), dirs)?;
        write_pids(&pids, limits.pids)?;
        if let Some(parent) = &self.cpuacct {
            make_group(parent.join(name), dirs)?;
        }
        let Some(cpu) = &self.cpu else {
            return Ok(None);
        };
        let cpu = cpu.join(name);
        make_group(cpu.clone(), dirs)?;
        set_quota(&cpu, self.limits.per_run_millis)?;
        Ok(Some(cpu))
    }

    /// Whether each run's CPU time is accounted (a `cpuacct` hierarchy,
    /// alone or with `cpu`): what a whole-jail CPU budget needs.
    pub fn accounts_cpu(&self) -> bool {
        self.cpuacct.is_some() || (self.cpu.is_some() && self.cpu_accounts)
    }

    /// The group whose CPU time [`cpu_usage`] reads, if any.
    pub fn cpu_dir(&self, name: &str) -> Option<PathBuf> {
        match (&self.cpuacct, &self.cpu) {
            (Some(acct), _) => Some(acct.join(name)),
            (None, Some(cpu)) if self.cpu_accounts => Some(cpu.join(name)),
            _ => None,
        }
    }
}

/// Writes a memory limit of `bytes`, and the same for memory+swap: the jail
/// gets no swap at all (that file only exists when the kernel accounts
/// swap). The memory+swap limit may never be below the memory limit, so
/// it goes first when the limit is `raised`.
fn write_memory(mem: &Path, bytes: u64, raised: bool) -> Result<(), SandboxError> {
    let bytes = bytes.to_string();
    let limit = mem.join("memory.limit_in_bytes");
    let memsw = mem.join("memory.memsw.limit_in_bytes");
    let memsw = memsw.exists().then_some(memsw);
    if raised && let Some(m) = &memsw {
        write_file(m, &bytes)?;
        return write_file(&limit, &bytes);
    }
    write_file(&limit, &bytes)?;
    match &memsw {
        Some(m) => write_file(m, &bytes),
        None => Ok(()),
    }
}

/// Writes a pids limit of `pids` for the program: +1, the jail's init lives
/// in the group too (the launcher attaches it; no helper process does).
fn write_pids(group: &Path, pids: u32) -> Result<(), SandboxError> {
    write_file(&group.join("pids.max"), &(u64::from(pids) + 1).to_string())
}

/// Rewrites the limits of a slot's kept set (`dirs` as [`V1::create`] made
/// them: memory, then pids) from `old` to `new`, each only if it differs.
pub(super) fn rewrite_limits(
    dirs: &[PathBuf],
    old: GroupLimits,
    new: GroupLimits,
) -> Result<(), SandboxError> {
    if let (Some(mem), true) = (dirs.first(), old.memory_bytes != new.memory_bytes) {
        write_memory(mem, new.memory_bytes, new.memory_bytes > old.memory_bytes)?;
    }
    if let (Some(pids), true) = (dirs.get(1), old.pids != new.pids) {
        write_pids(pids, new.pids)?;
    }
    Ok(())
}

/// CPU time (user + system) charged so far to a v1 `cpuacct` group.
pub fn cpu_usage(cpuacct_dir: &Path) -> Option<Duration> {
    fs::read_to_string(cpuacct_dir.join("cpuacct.usage"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .map(Duration::from_nanos)
}

/// Peak memory and OOM kills of a v1 memory group.
pub fn stats(memory_dir: &Path) -> CgroupStats {
    let read = |f: &str| fs::read_to_string(memory_dir.join(f)).ok();
    CgroupStats {
        memory_peak: read("memory.max_usage_in_bytes").and_then(|t| t.trim().parse().ok()),
        // This kernel lists `oom_kill N` in memory.oom_control.
        oom_kills: read("memory.oom_control")
            .and_then(|t| detect::keyed_value(&t, "oom_kill"))
            .unwrap_or(0),
        ..CgroupStats::default()
    }
}

/// Restarts a v1 memory group's peak at its current usage (the kernel
/// resets `memory.max_usage_in_bytes` on any write).
pub fn reset_peak(memory_dir: &Path) {
    let _ = fs::write(memory_dir.join("memory.max_usage_in_bytes"), "0");
}

#[cfg(test)]
mod tests {
    use super::*;

    const CPU: CpuLimits = CpuLimits {
        per_run_millis: 1000,
        all_runs_millis: 1500,
    };

    fn limits() -> Limits {
        Limits {
            memory_bytes: 1 << 20,
            pids: 7,
            ..Limits::default()
        }
    }

    #[test]
    fn run_groups_get_limits_a_quota_and_a_cpuacct_group_when_there_is_one() {
        let root = tempfile::tempdir().expect("tempdir");
        let [mem, pids, cpu, acct] =
            ["memory", "pids", "cpu", "cpuacct"].map(|h| root.path().join(h));
        let d = V1::setup(&mem, &pids, Some(&cpu), Some(&acct), CPU).expect("setup");
        assert_eq!(d.parents().len(), 4);
        assert!(d.limits_cpu());
        d.apply_parent_cpu().expect("parent quota");
        assert_eq!(
            fs::read_to_string(cpu.join("kiln/cpu.cfs_quota_us")).expect("parent"),
            "150000"
        );
        let mut dirs = Vec::new();
        let quota = d.create("1-0-0", &limits(), &mut dirs).expect("create");
        assert_eq!(
            dirs,
            [
                mem.join("kiln/1-0-0"),
                pids.join("kiln/1-0-0"),
                acct.join("kiln/1-0-0"),
                cpu.join("kiln/1-0-0"),
            ]
        );
        assert_eq!(quota, Some(cpu.join("kiln/1-0-0")));
        assert_eq!(
            fs::read_to_string(cpu.join("kiln/1-0-0/cpu.cfs_quota_us")).expect("quota"),
            "100000"
        );
        assert_eq!(
            fs::read_to_string(pids.join("kiln/1-0-0/pids.max")).expect("pids"),
            "8"
        );
        // CPU time comes from the cpuacct hierarchy (v1's cpu does not count it)
        let used = d.cpu_dir("1-0-0").expect("cpu dir");
        assert_eq!(used, acct.join("kiln/1-0-0"));
        fs::write(used.join("cpuacct.usage"), "1500000\n").expect("usage");
        assert_eq!(cpu_usage(&used), Some(Duration::from_micros(1500)));
    }

    #[test]
    fn with_cpu_and_cpuacct_mounted_together_the_quota_group_is_read() {
        let root = tempfile::tempdir().expect("tempdir");
        let [mem, pids, both] = ["memory", "pids", "cpu,cpuacct"].map(|h| root.path().join(h));
        let d = V1::setup(&mem, &pids, Some(&both), Some(&both), CPU).expect("setup");
        assert_eq!(d.parents().len(), 3);
        let mut dirs = Vec::new();
        let quota = d
            .create("1-0-1", &limits(), &mut dirs)
            .expect("one group, made once");
        assert_eq!(dirs.len(), 3);
        assert_eq!(d.cpu_dir("1-0-1"), quota);
    }

    #[test]
    fn without_cpu_hierarchies_there_is_no_quota_and_no_cpu_figure() {
        let root = tempfile::tempdir().expect("tempdir");
        let [mem, pids] = ["memory", "pids"].map(|h| root.path().join(h));
        let d = V1::setup(&mem, &pids, None, None, CPU).expect("setup");
        assert_eq!(d.parents().len(), 2);
        assert!(!d.limits_cpu());
        let mut dirs = Vec::new();
        assert_eq!(
            d.create("1-0-2", &limits(), &mut dirs).expect("create"),
            None
        );
        assert!(d.cpu_dir("1-0-2").is_none());
    }
}
