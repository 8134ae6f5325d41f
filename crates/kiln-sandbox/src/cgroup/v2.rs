//! cgroup v2 driver: one unified hierarchy. The jail's init is started
//! directly inside its run group with `CLONE_INTO_CGROUP`, so no attach
//! (the slow part on v1) is on the request path.
//!
//! Layout below our own group `<own>`:
//! - `<own>/kiln-server`: where the server's processes move if `<own>` held
//!   any (the "no internal processes" rule forbids enabling controllers for
//!   children of a group that has processes, except at the root);
//! - `<own>/kiln`: parent of every run, with `+memory +pids` (and `+cpu`
//!   where available) delegated and the CPU quota of all runs together;
//! - `<own>/kiln/<run-id>`: one run.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use kiln_core::Limits;

use super::slot::GroupLimits;
use super::{CPU_PERIOD_US, CgroupStats, CpuLimits, KILN_GROUP, detect, make_group, write_file};
use crate::error::SandboxError;

/// Where the server's processes go when our own group must become a
/// non-leaf.
pub const SERVER_LEAF: &str = "kiln-server";
const CONTROLLERS: [&str; 2] = ["memory", "pids"];

#[derive(Debug)]
pub struct V2 {
    /// `<own>/kiln`
    base: PathBuf,
    /// The `cpu` controller is delegated to the runs.
    cpu: bool,
    limits: CpuLimits,
}

/// `cpu.max` for `millis` thousandths of a core.
fn cpu_max(millis: u32) -> String {
    format!("{} {CPU_PERIOD_US}", CpuLimits::quota_us(millis))
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

/// Delegates `cpu` below `group` if the group has it; whether it is on.
fn enable_cpu(group: &Path) -> bool {
    let control = group.join("cgroup.subtree_control");
    let on = |t: &str| detect::parse_controllers(t).iter().any(|c| c == "cpu");
    if fs::read_to_string(&control).is_ok_and(|t| on(&t)) {
        return true;
    }
    let available = fs::read_to_string(group.join("cgroup.controllers")).is_ok_and(|t| on(&t));
    available && fs::write(&control, "+cpu").is_ok()
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
    pub fn setup(own: &Path, limits: CpuLimits) -> Result<V2, SandboxError> {
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
        let cpu = enable_cpu(own) && enable_cpu(&base);
        Ok(V2 { base, cpu, limits })
    }

    pub fn limits_cpu(&self) -> bool {
        self.cpu
    }

    pub fn apply_parent_cpu(&self) -> Result<(), SandboxError> {
        if !self.cpu {
            return Ok(());
        }
        write_file(
            &self.base.join("cpu.max"),
            &cpu_max(self.limits.all_runs_millis),
        )
    }

    pub fn parents(&self) -> Vec<PathBuf> {
        vec![self.base.clone()]
    }

    pub fn create(
        &self,
        name: &str,
        limits: &Limits,
        dirs: &mut Vec<PathBuf>,
    ) -> Result<Option<PathBuf>, SandboxError> {
        let dir = self.base.join(name);
        make_group(dir.clone(), dirs)?;
        write_limits(&dir, GroupLimits::of(limits))?;
        let swap = dir.join("memory.swap.max");
        if swap.exists() {
            write_file(&swap, "0")?;
        }
        // memory.oom.group stays 0: as on v1, the OOM killer takes the user
        // program (oom_score_adj 1000) and the jail's init reports it.
        if !self.cpu {
            return Ok(None);
        }
        write_file(&dir.join("cpu.max"), &cpu_max(self.limits.per_run_millis))?;
        Ok(Some(dir))
    }
}

/// Writes a run group's memory and pids limits (+1: the jail's init lives
/// in the group, the helper does not).
fn write_limits(dir: &Path, limits: GroupLimits) -> Result<(), SandboxError> {
    write_file(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
    write_file(
        &dir.join("pids.max"),
        &(u64::from(limits.pids) + 1).to_string(),
    )
}

/// Rewrites the limits of a slot's kept set (its one group in `dirs`).
pub(super) fn rewrite_limits(dirs: &[PathBuf], new: GroupLimits) -> Result<(), SandboxError> {
    match dirs.first() {
        Some(dir) => write_limits(dir, new),
        None => Ok(()),
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
        ..CgroupStats::default()
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

    const CPU: CpuLimits = CpuLimits {
        per_run_millis: 1000,
        all_runs_millis: 1500,
    };

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
        let d = V2::setup(own, CPU).expect("setup");
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
        V2::setup(own, CPU).expect("setup");
        assert!(!own.join(SERVER_LEAF).exists(), "no evacuation needed");
    }

    #[test]
    fn run_groups_get_memory_swap_and_pids_limits() {
        let dir = fake_group();
        let d = V2::setup(dir.path(), CPU).expect("setup");
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
                ..CgroupStats::default()
            }
        );
        assert!(!run.join("cpu.max").exists(), "no cpu controller here");
        // CPU time is counted with or without the controller
        fs::write(run.join("cpu.stat"), "usage_usec 2500\nuser_usec 2000\n").expect("cpu");
        assert_eq!(
            cpu_usage(&run),
            Some(std::time::Duration::from_micros(2500))
        );
    }

    #[test]
    fn with_a_cpu_controller_runs_and_their_parent_get_quotas() {
        let dir = fake_group();
        let own = dir.path();
        fs::write(own.join("cgroup.controllers"), "cpu memory pids\n").expect("controllers");
        fs::write(
            own.join(KILN_GROUP).join("cgroup.controllers"),
            "cpu memory pids\n",
        )
        .expect("controllers");
        let d = V2::setup(own, CPU).expect("setup");
        assert!(d.limits_cpu());
        d.apply_parent_cpu().expect("parent quota");
        assert_eq!(
            fs::read_to_string(own.join(KILN_GROUP).join("cpu.max")).expect("parent"),
            "150000 100000"
        );
        let mut dirs = Vec::new();
        let cpu = d
            .create("1-0-1", &Limits::default(), &mut dirs)
            .expect("create");
        let run = own.join(KILN_GROUP).join("1-0-1");
        assert_eq!(cpu, Some(run.clone()));
        assert_eq!(
            fs::read_to_string(run.join("cpu.max")).expect("run"),
            "100000 100000"
        );
    }

    #[test]
    fn subtree_control_needs_both_controllers() {
        assert!(enabled("cpu memory pids\n"));
        assert!(!enabled("memory\n"));
        assert!(!enabled(""));
    }
}
