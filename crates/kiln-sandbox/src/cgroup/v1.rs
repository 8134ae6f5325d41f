//! cgroup v1 driver: separate `memory`, `pids` and (where mounted) `cpu`
//! hierarchies. The helper attaches itself by writing its pid to every
//! `cgroup.procs` file before it clones the jail (v1 has no
//! `CLONE_INTO_CGROUP`).

use std::fs;
use std::path::{Path, PathBuf};

use kiln_core::Limits;

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
    pub fn setup(
        memory: &Path,
        pids: &Path,
        cpu: Option<&Path>,
        limits: CpuLimits,
    ) -> Result<V1, SandboxError> {
        let d = V1 {
            memory: memory.join(KILN_GROUP),
            pids: pids.join(KILN_GROUP),
            cpu: cpu.map(|c| c.join(KILN_GROUP)),
            limits,
        };
        for p in [Some(&d.memory), Some(&d.pids), d.cpu.as_ref()]
            .into_iter()
            .flatten()
        {
            fs::create_dir_all(p).map_err(|e| SandboxError::io("create cgroup", p, e))?;
        }
        Ok(d)
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
        v
    }

    /// Creates `<memory>/kiln/<name>` (first in `dirs`: stats live there),
    /// `<pids>/kiln/<name>` and `<cpu>/kiln/<name>` with their limits;
    /// returns the CPU group.
    pub fn create(
        &self,
        name: &str,
        limits: &Limits,
        dirs: &mut Vec<PathBuf>,
    ) -> Result<Option<PathBuf>, SandboxError> {
        let mem = self.memory.join(name);
        make_group(mem.clone(), dirs)?;
        let bytes = limits.memory_bytes.to_string();
        write_file(&mem.join("memory.limit_in_bytes"), &bytes)?;
        // Same value for memory+swap: the jail gets no swap at all. The file
        // only exists when the kernel accounts swap.
        let memsw = mem.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            write_file(&memsw, &bytes)?;
        }
        let pids = self.pids.join(name);
        make_group(pids.clone(), dirs)?;
        // +2: the helper and the jail's init live in the group too.
        write_file(
            &pids.join("pids.max"),
            &(u64::from(limits.pids) + 2).to_string(),
        )?;
        let Some(cpu) = &self.cpu else {
            return Ok(None);
        };
        let cpu = cpu.join(name);
        make_group(cpu.clone(), dirs)?;
        set_quota(&cpu, self.limits.per_run_millis)?;
        Ok(Some(cpu))
    }
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
