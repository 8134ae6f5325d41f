//! cgroup v1 driver: separate `memory` and `pids` hierarchies, and — where
//! the host mounts it — `cpuacct` for the CPU time of every process of a run.
//! The helper attaches itself by writing its pid to each group's
//! `cgroup.procs` before it clones the jail (v1 has no `CLONE_INTO_CGROUP`).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kiln_core::Limits;

use super::{CgroupStats, KILN_GROUP, detect, make_group, write_file};
use crate::error::SandboxError;

#[derive(Debug)]
pub struct V1 {
    /// `<own memory group>/kiln`
    memory: PathBuf,
    /// `<own pids group>/kiln`
    pids: PathBuf,
    /// `<own cpuacct group>/kiln`, when the host has that hierarchy (CPU
    /// time is then accounted per run; else only the init's view of it).
    cpuacct: Option<PathBuf>,
}

impl V1 {
    /// `cpuacct` is our own group in that hierarchy, if there is one.
    pub fn setup(memory: &Path, pids: &Path, cpuacct: Option<&Path>) -> Result<V1, SandboxError> {
        let d = V1 {
            memory: memory.join(KILN_GROUP),
            pids: pids.join(KILN_GROUP),
            cpuacct: cpuacct.map(|c| c.join(KILN_GROUP)),
        };
        for p in [&d.memory, &d.pids] {
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

    pub fn parents(&self) -> Vec<PathBuf> {
        let mut p = vec![self.memory.clone(), self.pids.clone()];
        p.extend(self.cpuacct.clone());
        p
    }

    /// Creates `<memory>/kiln/<name>` (first in `dirs`: stats live there) and
    /// `<pids>/kiln/<name>` with their limits.
    pub fn create(
        &self,
        name: &str,
        limits: &Limits,
        dirs: &mut Vec<PathBuf>,
    ) -> Result<(), SandboxError> {
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
        if let Some(parent) = &self.cpuacct {
            make_group(parent.join(name), dirs)?;
        }
        Ok(())
    }

    /// The group whose CPU time [`cpu_usage`] reads, if any.
    pub fn cpu_dir(&self, name: &str) -> Option<PathBuf> {
        self.cpuacct.as_ref().map(|c| c.join(name))
    }
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
        cpu: None,
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

    #[test]
    fn run_groups_get_limits_and_a_cpuacct_group_when_there_is_one() {
        let root = tempfile::tempdir().expect("tempdir");
        let (mem, pids, acct) = (
            root.path().join("memory"),
            root.path().join("pids"),
            root.path().join("cpuacct"),
        );
        let d = V1::setup(&mem, &pids, Some(&acct)).expect("setup");
        assert_eq!(d.parents().len(), 3);
        let mut dirs = Vec::new();
        let limits = Limits {
            memory_bytes: 1 << 20,
            pids: 7,
            ..Limits::default()
        };
        d.create("1-0-0", &limits, &mut dirs).expect("create");
        assert_eq!(
            dirs,
            [
                mem.join("kiln/1-0-0"),
                pids.join("kiln/1-0-0"),
                acct.join("kiln/1-0-0")
            ]
        );
        assert_eq!(
            fs::read_to_string(pids.join("kiln/1-0-0/pids.max")).expect("pids"),
            "9"
        );
        let cpu = d.cpu_dir("1-0-0").expect("cpu dir");
        fs::write(cpu.join("cpuacct.usage"), "1500000\n").expect("usage");
        assert_eq!(cpu_usage(&cpu), Some(Duration::from_micros(1500)));
        let without = V1::setup(&mem, &pids, None).expect("setup");
        assert_eq!(without.parents().len(), 2);
        assert!(without.cpu_dir("x").is_none());
    }
}
