//! What the host provides for jails: [`probe_host`] and its [`HostReport`]
//! (for `kiln doctor`, startup logs and [`crate::Sandbox::new`]).

use std::fmt;
use std::path::Path;

use nix::unistd::{AccessFlags, Uid, access};

use crate::cgroup::{self, CgroupSupport};
use crate::quota::{self, WorkspaceQuota};
use crate::sys;

/// The namespaces every jail is created with.
pub(crate) const JAIL_NAMESPACES: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// What the host offers and, for a [`crate::Sandbox`], what its jails
/// enforce. `problems` lists every missing protection (a sandbox refuses to
/// start with any unless `allow_degraded`), `warnings` what weakens the
/// jail without being required, `degraded` what a sandbox started with
/// `allow_degraded` runs without.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostReport {
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// Effective uid 0 (needed to map uid ranges and manage cgroups).
    pub root: bool,
    /// A user+mount+pid+net+ipc+uts namespace could be created.
    pub user_namespaces: bool,
    pub cgroup: CgroupSupport,
    /// `cgroup` has memory and pids controllers we can write to.
    pub cgroup_limits: bool,
    /// seccomp filter mode with the `errno` action is available.
    pub seccomp: bool,
    /// Landlock ABI version, if enabled (used when present; not required).
    pub landlock_abi: Option<u32>,
    /// How workspaces are limited: what the host could offer (from
    /// [`probe_host`]) or what a sandbox set up (from `Sandbox::report`).
    pub workspace_quota: WorkspaceQuota,
    /// Why this host cannot keep jails (`keep_jails`), if it cannot
    /// ([`keep_jails_blocker`]; also among the warnings).
    pub keep_jails_blocker: Option<String>,
    pub problems: Vec<String>,
    pub warnings: Vec<String>,
    /// Protections a sandbox runs without (development flag).
    pub degraded: Vec<String>,
}

impl HostReport {
    /// Whether a jail with every required protection can be built.
    pub fn enforceable(&self) -> bool {
        self.problems.is_empty()
    }

    /// Whether a jail can be built at all (root and namespaces); the other
    /// problems can be waived with `allow_degraded`.
    pub fn jail_possible(&self) -> bool {
        self.root && self.user_namespaces
    }
}

/// What the host cannot do for a run's CPU budget (`cpu_secs` over the
/// whole jail, read from the run's cgroup CPU counter): without per-group
/// CPU accounting only RLIMIT_CPU applies, per process.
pub fn cpu_budget_warning(cgroup: &CgroupSupport, cgroup_limits: bool) -> Option<String> {
    let what = match cgroup {
        CgroupSupport::V2 { .. } if cgroup_limits => return None,
        CgroupSupport::V1 {
            cpuacct: Some(_), ..
        } if cgroup_limits => return None,
        CgroupSupport::V1 { .. } if cgroup_limits => "cgroup v1 without cpuacct",
        _ => "no usable cgroups",
    };
    Some(format!(
        "no per-run CPU accounting ({what}): cpu_secs holds per process (RLIMIT_CPU) only, \
         not for a run's whole jail (a chain of forks, or a paused programmatic run, may use more)"
    ))
}

/// What a Landlock ABI version restricts in our jails.
fn landlock_scope(abi: u32) -> &'static str {
    match abi {
        0 => "nothing",
        1..=3 => "file access",
        4 | 5 => "file access, TCP bind/connect",
        6 => "file access, TCP bind/connect, signals and abstract sockets",
        _ => "file access, TCP bind/connect, signals and abstract sockets; no audit flooding",
    }
}

impl fmt::Display for HostReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yes = |b: bool| if b { "yes" } else { "NO" };
        writeln!(f, "kernel: {}", self.kernel)?;
        writeln!(f, "running as root: {}", yes(self.root))?;
        writeln!(
            f,
            "namespaces (user, mount, pid, net, ipc, uts): {}",
            yes(self.user_namespaces)
        )?;
        let where_ = match &self.cgroup {
            CgroupSupport::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
            } => {
                let at = |d: &Option<std::path::PathBuf>| {
                    d.as_ref()
                        .map_or("NOT mounted".to_owned(), |c| format!("at {}", c.display()))
                };
                format!(
                    "cgroup v1: memory at {}, pids at {}, cpu {}, cpuacct {}",
                    memory.display(),
                    pids.display(),
                    at(cpu),
                    at(cpuacct)
                )
            }
            CgroupSupport::V2 { group, controllers } => format!(
                "cgroup v2 at {}: {}",
                group.display(),
                controllers.join(" ")
            ),
            CgroupSupport::None => "no memory and pids controllers".to_owned(),
        };
        writeln!(
            f,
            "memory and pids limits: {} ({where_})",
            yes(self.cgroup_limits)
        )?;
        writeln!(
            f,
            "seccomp filter (allow-list per profile): {}",
            yes(self.seccomp)
        )?;
        match self.landlock_abi {
            Some(v) => writeln!(f, "landlock: yes (ABI {v}: {})", landlock_scope(v))?,
            None => writeln!(
                f,
                "landlock: NO (not in this kernel: file access is limited by the mount layout only)"
            )?,
        }
        writeln!(f, "workspace quota: {}", self.workspace_quota)?;
        if !self.degraded.is_empty() {
            writeln!(
                f,
                "DEGRADED (development flag): running WITHOUT {}",
                self.degraded.join(", ")
            )?;
        }
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        if self.problems.is_empty() {
            write!(f, "sandbox: enforceable")
        } else {
            write!(f, "sandbox: NOT enforceable")?;
            for p in &self.problems {
                write!(f, "\n  - {p}")?;
            }
            Ok(())
        }
    }
}

/// Where a kept jail's program resets its pid namespace's next pid
/// (`jail/mod.rs`), through the host's `/proc`.
pub(crate) const NS_LAST_PID: &str = "/proc/sys/kernel/ns_last_pid";

/// Why this host cannot keep jails (`keep_jails`), if it cannot: a kept
/// jail's program, still root of the host, writes its pid namespace's
/// next pid to `ns_last_pid` (the path of [`NS_LAST_PID`]), which a host
/// whose `/proc/sys` is read-only (some containers) refuses. Opened for
/// writing, nothing written.
pub fn keep_jails_blocker(ns_last_pid: &Path) -> Option<String> {
    let opened = std::fs::OpenOptions::new().write(true).open(ns_last_pid);
    opened.err().map(|e| {
        format!(
            "cannot keep jails: {} is not writable ({e}), so a kept jail's program \
             could not reset its next pid; every py run builds a new jail (keep_jails is off)",
            ns_last_pid.display()
        )
    })
}

fn seccomp_available() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail")
        .map(|t| t.split_whitespace().any(|a| a == "errno"))
        .unwrap_or(false)
}

fn writable(dir: &Path) -> bool {
    access(&dir.join("cgroup.procs"), AccessFlags::W_OK).is_ok()
}

/// Probes the host. Forks once to try creating the jail's namespaces.
pub fn probe_host() -> HostReport {
    probe_host_with(Path::new(NS_LAST_PID))
}

/// [`probe_host`], with whether jails can be kept judged by `ns_last_pid`
/// ([`keep_jails_blocker`]; `SandboxConfig::ns_last_pid`, another file only
/// in tests).
pub(crate) fn probe_host_with(ns_last_pid: &Path) -> HostReport {
    let mut problems = Vec::new();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let root = Uid::effective().is_root();
    if !root {
        problems.push("not running as root: cannot map uid ranges or manage cgroups".to_owned());
    }
    let user_namespaces = match sys::probe_unshare(JAIL_NAMESPACES) {
        Ok(()) => true,
        Err(e) => {
            problems.push(format!("cannot create the jail's namespaces: {e}"));
            false
        }
    };
    let (cgroup, cg_problems) = cgroup::detect_support();
    let before = problems.len();
    problems.extend(cg_problems);
    match &cgroup {
        CgroupSupport::V1 { memory, pids, .. } => {
            for d in [memory, pids] {
                if !writable(d) {
                    problems.push(format!("cgroup {} is not writable", d.display()));
                }
            }
        }
        CgroupSupport::V2 { group, .. } => {
            if !writable(group) {
                problems.push(format!("cgroup {} is not writable", group.display()));
            }
        }
        CgroupSupport::None => {}
    }
    let cgroup_limits = problems.len() == before && cgroup != CgroupSupport::None;
    let cpu_controller = match &cgroup {
        CgroupSupport::V1 { cpu, .. } => cpu.as_deref().is_some_and(writable),
        CgroupSupport::V2 { controllers, .. } => controllers.iter().any(|c| c == "cpu"),
        CgroupSupport::None => false,
    };
    let seccomp = seccomp_available();
    if !seccomp {
        problems.push("seccomp filter mode with errno action not available".to_owned());
    }
    let landlock_abi = sys::landlock_abi();
    let mut warnings = Vec::new();
    if landlock_abi.is_none() {
        warnings.push("no Landlock: jails run without it".to_owned());
    }
    if cgroup_limits && !cpu_controller {
        warnings.push("no cgroup cpu controller: a run's processes may take every core".to_owned());
    }
    if let Some(w) = cpu_budget_warning(&cgroup, cgroup_limits) {
        warnings.push(w);
    }
    let keep_blocker = keep_jails_blocker(ns_last_pid);
    warnings.extend(keep_blocker.clone());
    let workspace_quota = quota::probe();
    match &workspace_quota {
        WorkspaceQuota::LoopExt4 => {}
        WorkspaceQuota::Tmpfs { .. } => warnings
            .push("workspace quota falls back to tmpfs: workspaces use RAM, not disk".to_owned()),
        WorkspaceQuota::None { reason } => problems.push(format!("no workspace quota: {reason}")),
    }
    HostReport {
        kernel,
        root,
        user_namespaces,
        cgroup,
        cgroup_limits,
        seccomp,
        landlock_abi,
        workspace_quota,
        keep_jails_blocker: keep_blocker,
        problems,
        warnings,
        degraded: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> HostReport {
        HostReport {
            kernel: "6.18".into(),
            root: true,
            user_namespaces: true,
            cgroup: CgroupSupport::V1 {
                memory: "/sys/fs/cgroup/memory/x".into(),
                pids: "/sys/fs/cgroup/pids".into(),
                cpu: Some("/sys/fs/cgroup/cpu".into()),
                cpuacct: Some("/sys/fs/cgroup/cpuacct".into()),
            },
            cgroup_limits: true,
            seccomp: true,
            landlock_abi: Some(7),
            workspace_quota: WorkspaceQuota::LoopExt4,
            keep_jails_blocker: None,
            problems: vec![],
            warnings: vec![],
            degraded: vec![],
        }
    }

    #[test]
    fn jails_are_kept_only_where_ns_last_pid_opens_for_writing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ns_last_pid");
        std::fs::write(&file, "1").unwrap();
        assert_eq!(keep_jails_blocker(&file), None);
        // a directory never opens for writing, as a read-only mount's file
        let why = keep_jails_blocker(dir.path()).expect("not writable");
        assert!(
            why.starts_with("cannot keep jails: ") && why.contains("keep_jails is off"),
            "{why}"
        );
    }

    #[test]
    fn report_says_line_by_line_what_is_enforced() {
        let r = full();
        assert!(r.enforceable());
        let text = r.to_string();
        for line in [
            "namespaces (user, mount, pid, net, ipc, uts): yes",
            "memory and pids limits: yes (cgroup v1: memory at /sys/fs/cgroup/memory/x, pids at /sys/fs/cgroup/pids, cpu at /sys/fs/cgroup/cpu, cpuacct at /sys/fs/cgroup/cpuacct)",
            "seccomp filter (allow-list per profile): yes",
            "landlock: yes (ABI 7: file access, TCP bind/connect, signals and abstract sockets; no audit flooding)",
            "workspace quota: yes (loop-mounted ext4 image per slot: bytes and inodes)",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(text.ends_with("sandbox: enforceable"), "{text}");
    }

    #[test]
    fn report_lists_what_is_missing_and_what_runs_degraded() {
        let mut r = full();
        r.cgroup = CgroupSupport::None;
        r.cgroup_limits = false;
        r.landlock_abi = None;
        r.workspace_quota = WorkspaceQuota::Tmpfs {
            reason: "/dev/loop-control: No such file or directory".into(),
        };
        r.problems
            .push("cgroup: no memory controller in cgroup v1 or v2".into());
        r.warnings.push("no Landlock: jails run without it".into());
        r.degraded.push("memory and pids limits".into());
        assert!(!r.enforceable());
        assert!(r.jail_possible());
        let text = r.to_string();
        assert!(
            text.contains("memory and pids limits: NO (no memory and pids controllers)"),
            "{text}"
        );
        assert!(text.contains("landlock: NO"), "{text}");
        assert!(
            text.contains("workspace quota: tmpfs per slot (memory-backed"),
            "{text}"
        );
        assert!(
            text.contains("DEGRADED (development flag): running WITHOUT memory and pids limits"),
            "{text}"
        );
        assert!(text.contains("warning: no Landlock"), "{text}");
        assert!(
            text.contains("sandbox: NOT enforceable\n  - cgroup: no memory controller"),
            "{text}"
        );
        r.user_namespaces = false;
        assert!(!r.jail_possible());
    }
}
