//! What the host provides for jails: [`probe_host`] and its [`HostReport`]
//! (for `kiln doctor`, startup logs and [`crate::Sandbox::new`]).

use std::fmt;
use std::path::Path;

use nix::unistd::{AccessFlags, Uid, access};

use crate::cgroup::{self, CgroupSupport};
use crate::sys;

/// The namespaces every jail is created with.
pub(crate) const JAIL_NAMESPACES: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS;

/// What the host offers; `problems` lists everything that prevents
/// enforcing a jail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostReport {
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// Effective uid 0 (needed to map uid ranges and manage cgroups).
    pub root: bool,
    /// A user+mount+pid+net+ipc+uts namespace could be created.
    pub user_namespaces: bool,
    pub cgroup: CgroupSupport,
    /// seccomp filter mode with the `errno` action is available.
    pub seccomp: bool,
    /// Landlock ABI version, if enabled (reported only; not required).
    pub landlock_abi: Option<u32>,
    pub problems: Vec<String>,
}

impl HostReport {
    /// Whether a jail with every limit can be built on this host.
    pub fn enforceable(&self) -> bool {
        self.problems.is_empty()
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
        match &self.cgroup {
            CgroupSupport::V1 { memory, pids } => writeln!(
                f,
                "cgroup: v1 (memory at {}, pids at {})",
                memory.display(),
                pids.display()
            )?,
            CgroupSupport::V2 { group, controllers } => writeln!(
                f,
                "cgroup: v2 at {} (controllers: {})",
                group.display(),
                controllers.join(" ")
            )?,
            CgroupSupport::None => writeln!(f, "cgroup: NONE usable")?,
        }
        writeln!(f, "seccomp filters: {}", yes(self.seccomp))?;
        match self.landlock_abi {
            Some(v) => writeln!(f, "landlock: abi {v}")?,
            None => writeln!(f, "landlock: not available")?,
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
    problems.extend(cg_problems);
    match &cgroup {
        CgroupSupport::V1 { memory, pids } => {
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
    let seccomp = seccomp_available();
    if !seccomp {
        problems.push("seccomp filter mode with errno action not available".to_owned());
    }
    HostReport {
        kernel,
        root,
        user_namespaces,
        cgroup,
        seccomp,
        landlock_abi: sys::landlock_abi(),
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_lists_problems_and_is_not_enforceable_with_any() {
        let mut r = HostReport {
            kernel: "6.18".into(),
            root: true,
            user_namespaces: true,
            cgroup: CgroupSupport::V1 {
                memory: "/sys/fs/cgroup/memory/x".into(),
                pids: "/sys/fs/cgroup/pids".into(),
            },
            seccomp: true,
            landlock_abi: Some(7),
            problems: vec![],
        };
        assert!(r.enforceable());
        let text = r.to_string();
        assert!(
            text.contains("cgroup: v1 (memory at /sys/fs/cgroup/memory/x"),
            "{text}"
        );
        assert!(text.ends_with("sandbox: enforceable"), "{text}");
        r.problems.push("seccomp missing".into());
        assert!(!r.enforceable());
        assert!(r.to_string().contains("\n  - seccomp missing"));
    }
}
