//! cgroup v2 driver: one unified hierarchy. The jail's init is started
//! directly inside its run group with `CLONE_INTO_CGROUP`, so no attach
//! (the slow part on v1) is on the request path.
//!
//! Layout below our own group `<own>`:
//! - `<own>/kiln-server`: where the server's processes move if `<own>` held
//!   any (the "no internal processes" rule forbids enabling controllers for
//!   children of a group that has processes, except at the root);
//! - `<own>/kiln`: parent of every run, with `+memory +pids` delegated;
//! - `<own>/kiln/<run-id>`: one run.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use kiln_core::Limits;

use super::{CgroupStats, KILN_GROUP, detect, make_group, write_file};
use crate::error::SandboxError;

/// Where the server's processes go when our own group must become a
/// non-leaf.
pub const SERVER_LEAF: &str = "kiln-server";
const CONTROLLERS: [&str; 2] = ["memory", "pids"];

#[derive(Debug)]
pub struct V2 {
    /// `<own>/kiln`
    base: PathBuf,
}

fn read(path: &Path) -> Result<String, SandboxError> {
    fs::read_to_string(path).map_err(|e| SandboxError::io("read", path, e))
}

fn enabled(subtree_control: &str) -> bool {
    let on = detect::parse_controllers(subtree_control);
    CONTROLLERS.iter().all(|c| on.iter().any(|o| o == c))
}

fn enable_controllers(group: &Path) -> Result<(), SandboxError> {
    let control = group.join("cgroup.subtree_control");
    if !enabled(&read(&control)?) {
        write_file(&control, "+memory +pids")?;
    }
    Ok(())
}

/// Moves every process of `own` into `own/kiln-server`.
fn evacuate(own: &Path) -> Result<(), SandboxError> {
    let pids: Vec<String> = read(&own.join("cgroup.procs"))?
        .lines()
        .map(str::to_owned)
        .collect();
    if pids.is_empty() {
        return Ok(());
    }
    let leaf = own.join(SERVER_LEAF);
    match fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(SandboxError::io("create cgroup", &leaf, e)),
    }
    let target = leaf.join("cgroup.procs");
    for pid in pids {
        match fs::write(&target, &pid) {
            Ok(()) => {}
            // The process exited meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => return Err(SandboxError::io("move process to", &target, e)),
        }
    }
    Ok(())
}

impl V2 {
    pub fn setup(own: &Path) -> Result<V2, SandboxError> {
        let is_root = own.join("cgroup.procs").exists() && !own.join("cgroup.type").exists();
        let control = read(&own.join("cgroup.subtree_control"))?;
        if !enabled(&control) {
            if !is_root {
                evacuate(own)?;
            }
            enable_controllers(own)?;
        }
        let base = own.join(KILN_GROUP);
        match fs::create_dir(&base) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(SandboxError::io("create cgroup", &base, e)),
        }
        enable_controllers(&base)?;
        Ok(V2 { base })
    }

    pub fn parents(&self) -> Vec<PathBuf> {
        vec![self.base.clone()]
    }

    pub fn create(
        &self,
        name: &str,
        limits: &Limits,
        dirs: &mut Vec<PathBuf>,
    ) -> Result<(), SandboxError> {
        let dir = self.base.join(name);
        make_group(dir.clone(), dirs)?;
        write_file(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
        let swap = dir.join("memory.swap.max");
        if swap.exists() {
            write_file(&swap, "0")?;
        }
        // memory.oom.group stays 0: as on v1, the OOM killer takes the user
        // program (oom_score_adj 1000) and the jail's init reports it.
        // +1: the jail's init lives in the group (the helper does not).
        write_file(
            &dir.join("pids.max"),
            &(u64::from(limits.pids) + 1).to_string(),
        )?;
        Ok(())
    }
}

/// Peak memory (`memory.peak`, kernel 5.19+) and OOM kills of a v2 group.
pub fn stats(dir: &Path) -> CgroupStats {
    let read = |f: &str| fs::read_to_string(dir.join(f)).ok();
    CgroupStats {
        memory_peak: read("memory.peak").and_then(|t| t.trim().parse().ok()),
        oom_kills: read("memory.events")
            .and_then(|t| detect::keyed_value(&t, "oom_kill"))
            .unwrap_or(0),
        cpu: None,
    }
}

/// CPU time (user + system) charged so far to a v2 group: `usage_usec` of
/// `cpu.stat`, which every group has whether or not the cpu controller is
/// enabled.
pub fn cpu_usage(dir: &Path) -> Option<std::time::Duration> {
    fs::read_to_string(dir.join("cpu.stat"))
        .ok()
        .and_then(|t| detect::keyed_value(&t, "usage_usec"))
        .map(std::time::Duration::from_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory tree shaped like a non-root cgroup2 group that holds
    /// processes (regular files stand in for the control files).
    fn fake_group() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let own = dir.path();
        fs::write(own.join("cgroup.type"), "domain\n").expect("type");
        fs::write(own.join("cgroup.procs"), "123\n456\n").expect("procs");
        fs::write(own.join("cgroup.subtree_control"), "").expect("control");
        fs::create_dir(own.join(KILN_GROUP)).expect("kiln");
        fs::write(own.join(KILN_GROUP).join("cgroup.subtree_control"), "").expect("kiln control");
        dir
    }

    #[test]
    fn setup_moves_our_processes_to_a_leaf_and_delegates_controllers() {
        let dir = fake_group();
        let own = dir.path();
        let d = V2::setup(own).expect("setup");
        assert_eq!(d.parents(), vec![own.join(KILN_GROUP)]);
        // Each pid is written to the leaf (the last write stays in a plain file).
        assert_eq!(
            fs::read_to_string(own.join(SERVER_LEAF).join("cgroup.procs")).expect("leaf"),
            "456"
        );
        for group in [own.to_path_buf(), own.join(KILN_GROUP)] {
            assert_eq!(
                fs::read_to_string(group.join("cgroup.subtree_control")).expect("control"),
                "+memory +pids"
            );
        }
    }

    #[test]
    fn setup_leaves_a_group_with_controllers_already_delegated_alone() {
        let dir = fake_group();
        let own = dir.path();
        fs::write(own.join("cgroup.subtree_control"), "cpu memory pids\n").expect("control");
        V2::setup(own).expect("setup");
        assert!(!own.join(SERVER_LEAF).exists(), "no evacuation needed");
    }

    #[test]
    fn run_groups_get_memory_swap_and_pids_limits() {
        let dir = fake_group();
        let d = V2::setup(dir.path()).expect("setup");
        let limits = Limits {
            memory_bytes: 1 << 20,
            pids: 7,
            ..Limits::default()
        };
        let mut dirs = Vec::new();
        d.create("1-0-0", &limits, &mut dirs).expect("create");
        let run = dir.path().join(KILN_GROUP).join("1-0-0");
        assert_eq!(dirs, vec![run.clone()]);
        let read = |f: &str| fs::read_to_string(run.join(f)).expect(f);
        assert_eq!(read("memory.max"), "1048576");
        assert_eq!(read("pids.max"), "8");
        fs::write(run.join("memory.peak"), "4096\n").expect("peak");
        fs::write(run.join("memory.events"), "oom 1\noom_kill 2\n").expect("events");
        assert_eq!(
            stats(&run),
            CgroupStats {
                memory_peak: Some(4096),
                oom_kills: 2,
                cpu: None,
            }
        );
        fs::write(run.join("cpu.stat"), "usage_usec 2500\nuser_usec 2000\n").expect("cpu");
        assert_eq!(
            cpu_usage(&run),
            Some(std::time::Duration::from_micros(2500))
        );
    }

    #[test]
    fn subtree_control_needs_both_controllers() {
        assert!(enabled("cpu memory pids\n"));
        assert!(!enabled("memory\n"));
        assert!(!enabled(""));
    }
}
