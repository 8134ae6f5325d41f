//! cgroup v1 driver: separate `memory` and `pids` hierarchies. The helper
//! attaches itself by writing its pid to both `cgroup.procs` files before it
//! clones the jail (v1 has no `CLONE_INTO_CGROUP`).

use std::fs;
use std::path::{Path, PathBuf};

use kiln_core::Limits;

use super::{CgroupStats, KILN_GROUP, detect, make_group, write_file};
use crate::error::SandboxError;

#[derive(Debug)]
pub struct V1 {
    /// `<own memory group>/kiln`
    memory: PathBuf,
    /// `<own pids group>/kiln`
    pids: PathBuf,
}

impl V1 {
    pub fn setup(memory: &Path, pids: &Path) -> Result<V1, SandboxError> {
        let d = V1 {
            memory: memory.join(KILN_GROUP),
            pids: pids.join(KILN_GROUP),
        };
        for p in [&d.memory, &d.pids] {
            fs::create_dir_all(p).map_err(|e| SandboxError::io("create cgroup", p, e))?;
        }
        Ok(d)
    }

    pub fn parents(&self) -> Vec<PathBuf> {
        vec![self.memory.clone(), self.pids.clone()]
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
        Ok(())
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
    }
}
