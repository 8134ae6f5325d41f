//! The wire protocol between the server and the jail helper: the
//! [`JailSpec`] the server writes to the helper's stdin, and the
//! [`StatusMsg`] lines the jail writes to the status fd (fd 3).
//!
//! Both are plain serde data so the two sides can be tested apart.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The fd on which the helper finds the status pipe's write end.
pub const STATUS_FD: i32 = 3;
/// Where a helper for an embedded warm jail finds its socket to the
/// fork-server.
pub const ZYGOTE_FD: i32 = 4;

/// In-jail uid and gid of the user program.
pub const JAIL_UID: u32 = 1000;

/// Size of one slot's uid range (inside uid 0..65536).
pub const ID_RANGE: u32 = 65536;

/// One classic BPF program as `(code, jt, jf, k)` instructions.
pub type BpfInsns = Vec<(u16, u8, u8, u32)>;

/// Everything the helper needs to build and run one jail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JailSpec {
    /// Empty host directory the jail's root tmpfs is mounted on.
    pub root_dir: PathBuf,
    /// Host paths bound read-only at the same path inside.
    pub ro_binds: Vec<PathBuf>,
    /// Names under the host's `/etc` bound read-only (when present).
    pub etc_binds: Vec<String>,
    /// A runtime image's root filesystem on the host: when set, `ro_binds`,
    /// the merged-/usr links and `etc_binds` come from beneath it instead of
    /// from the host's `/` (nothing of the host's `/usr` reaches the jail).
    #[serde(default)]
    pub image_root: Option<PathBuf>,
    /// Host directory bound read-write at `/mnt/data`.
    pub workspace: PathBuf,
    /// Host directory bound read-write at [`crate::PROJECT_DIR`], the
    /// program's working directory; `None`: it starts in `/mnt/data`.
    #[serde(default)]
    pub project: Option<PathBuf>,
    /// Program and arguments; `argv[0]` is an absolute path inside the jail.
    pub argv: Vec<String>,
    /// The complete environment of the program.
    pub env: Vec<(String, String)>,
    /// First host uid/gid of the slot's range (inside 0 ↦ `id_base`).
    pub id_base: u32,
    pub limits: JailLimits,
    /// How to join the run's cgroups; `None` only in degraded mode (the host
    /// has no usable memory and pids controllers).
    pub cgroup: Option<CgroupAttach>,
    /// The run's seccomp profile, compiled by the server at start-up, in
    /// installation order; `None` only in degraded mode (no seccomp).
    pub seccomp_filters: Option<Vec<BpfInsns>>,
    /// Landlock must be in force (the host has it): the run fails if the
    /// kernel refuses it. Without, the jail runs without Landlock.
    pub landlock: bool,
    /// Build the jail now and park it until a [`GoMsg`] arrives on the
    /// control pipe (a warm jail); `None`: run `argv` at once.
    #[serde(default)]
    pub park: Option<ParkMode>,
    /// Read-only files created under `/etc/kiln/` in the jail (name,
    /// contents), e.g. a runtime's warm-start bootstrap.
    #[serde(default)]
    pub etc_files: Vec<(String, String)>,
    /// Join this network namespace (the services channel, see `netns.rs`)
    /// instead of creating an empty one; `None`: no network at all.
    #[serde(default)]
    pub network: Option<NetworkSpec>,
    /// Join the slot's own network namespace (`slotnet.rs`: no network at
    /// all, made once per slot) instead of creating an empty one; only
    /// without `network`.
    #[serde(default)]
    pub slot_netns: Option<SlotNetnsSpec>,
    /// An embedded parked jail kept for its slot's next run
    /// (`sandbox/kept.rs`): its init survives the program, clears the jail
    /// and waits for the server's `again` to have a fresh program forked.
    /// Its init is then never in the run's cgroups (the program makes its
    /// own cgroup namespace), so that the groups' checks count the
    /// program's processes alone.
    #[serde(default)]
    pub keep: bool,
}

/// A slot's network namespace, which its jails join one after another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotNetnsSpec {
    /// `/proc/<server pid>/fd/<n>`: the server's descriptor of it.
    pub netns_path: PathBuf,
    /// Its inode, checked before joining.
    pub netns_inode: u64,
}

/// The network namespace a jail with a services channel joins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkSpec {
    /// `/proc/<server pid>/fd/<n>`: the server's descriptor of the
    /// namespace, open for the whole run.
    pub netns_path: PathBuf,
    /// The namespace's inode, checked before joining.
    pub netns_inode: u64,
    /// The one TCP port the program may connect to (Landlock).
    pub connect_port: u16,
}

impl JailSpec {
    /// Zeroes and frees everything that names the host (the root and
    /// workspace directories, the bind sources, the cgroup paths), keeping
    /// what the program's process still needs (limits, argv, environment,
    /// park mode). See `forked_program_main`.
    pub(crate) fn scrub_host_paths(&mut self) {
        use crate::sys::{scrub_path, scrub_string};
        scrub_path(std::mem::take(&mut self.root_dir));
        scrub_path(std::mem::take(&mut self.workspace));
        if let Some(r) = self.image_root.take() {
            scrub_path(r);
        }
        // the program still needs to know whether there is one (its cwd)
        if let Some(project) = self.project.as_mut() {
            scrub_path(std::mem::take(project));
        }
        std::mem::take(&mut self.ro_binds)
            .into_iter()
            .for_each(scrub_path);
        std::mem::take(&mut self.etc_binds)
            .into_iter()
            .for_each(scrub_string);
        match self.cgroup.take() {
            Some(CgroupAttach::V1 { procs }) => procs.into_iter().for_each(scrub_path),
            Some(CgroupAttach::V2 { dir }) => scrub_path(dir),
            None => {}
        }
        if let Some(net) = self.slot_netns.take() {
            scrub_path(net.netns_path);
        }
        self.id_base = 0;
    }
}

/// What a parked jail's program process does before and after the go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParkMode {
    /// Confined and waiting; at the go, `execve` the go's argv and env.
    Exec,
    /// `execve` the spec's argv at once, with stdin a pipe that receives the
    /// go message (a pre-started runtime reads it, then runs the user's
    /// program in the same never-used process).
    Prestart,
    /// Confined and waiting inside a fork of the fork-server's preloaded
    /// interpreter; at the go, the embedded runtime runs the program in
    /// process (see `zygote/`).
    Embedded,
}

/// The second line on a parked jail's control pipe: what to run now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GoMsg {
    /// Program and arguments (`argv[0]` absolute inside the jail).
    pub argv: Vec<String>,
    /// The complete environment of the program.
    pub env: Vec<(String, String)>,
    /// Wall time of this run in milliseconds (the jail init's backstop).
    pub wall_ms: u64,
    /// RLIMIT_CPU soft limit in whole seconds; only ever lowers the parked
    /// jail's limit.
    pub cpu_secs: u64,
    /// The program is a kernel (`kernel.rs`): after the go, the go pipe
    /// stays open as its stdin and the helper relays every later byte of
    /// the control pipe to it (closing the control pipe still stops the
    /// jail).
    #[serde(default)]
    pub kernel: bool,
}

/// Largest go message a jail accepts (argv + env).
pub const GO_MAX_BYTES: usize = 4 * 1024 * 1024;

/// The limits the helper enforces itself (the cgroup limits are set by the
/// server before the helper starts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JailLimits {
    /// Wall time in milliseconds; the helper kills the jail after this plus a
    /// grace period even if the server does not.
    pub wall_ms: u64,
    /// RLIMIT_CPU soft limit in whole seconds (hard = soft + 1).
    pub cpu_secs: u64,
    pub open_files: u64,
    pub file_size_bytes: u64,
    /// RLIMIT_NPROC for the in-jail user.
    pub nproc: u64,
    /// Size of `/tmp` and `/dev/shm`.
    pub tmp_bytes: u64,
}

impl JailLimits {
    pub fn from_limits(l: &kiln_core::Limits) -> JailLimits {
        let cpu_ms = l.cpu_time.as_millis();
        JailLimits {
            wall_ms: u64::try_from(l.wall_time.as_millis()).unwrap_or(u64::MAX),
            cpu_secs: u64::try_from(cpu_ms.div_ceil(1000))
                .unwrap_or(u64::MAX)
                .max(1),
            open_files: l.open_files,
            file_size_bytes: l.file_size_bytes,
            nproc: u64::from(l.pids),
            tmp_bytes: l.tmp_bytes,
        }
    }
}

/// How the helper joins the run's cgroups.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupAttach {
    /// cgroup v1: write the helper's own pid to each `cgroup.procs` file
    /// before cloning, so the jail inherits the groups.
    V1 { procs: Vec<PathBuf> },
    /// cgroup v2: start the jail's init directly in this group
    /// (`CLONE_INTO_CGROUP`).
    V2 { dir: PathBuf },
}

/// One line on the status fd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusMsg {
    /// The user program ended; `cpu_us` is user+system time of everything
    /// the jail's init reaped.
    Finished {
        code: Option<i32>,
        signal: Option<i32>,
        cpu_us: u64,
    },
    /// The user program could not be executed (`execve` failed).
    ExecFailed(String),
    /// The jail could not be built: `"<step>: <errno text>"`.
    Error(String),
    /// A warm jail is built and its program process waits for the go.
    Parked,
}

impl StatusMsg {
    /// One JSON line.
    pub fn to_line(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_else(|_| {
            // Serialising these plain variants cannot fail; keep a valid line anyway.
            br#"{"error":"status: serialisation failed"}"#.to_vec()
        });
        v.push(b'\n');
        v
    }

    /// The last well-formed message in `bytes` (the status pipe's content),
    /// not counting `parked`, which only marks progress.
    pub fn parse_last(bytes: &[u8]) -> Option<StatusMsg> {
        bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| serde_json::from_slice(l).ok())
            .rfind(|m| *m != StatusMsg::Parked)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn error_status_has_the_documented_shape() {
        let line = StatusMsg::Error("mount /usr: EPERM".into()).to_line();
        assert_eq!(line, b"{\"error\":\"mount /usr: EPERM\"}\n");
    }

    #[test]
    fn parse_last_takes_the_final_wellformed_line() {
        let mut bytes = StatusMsg::Error("x".into()).to_line();
        bytes.extend_from_slice(b"garbage\n");
        bytes.extend(
            StatusMsg::Finished {
                code: Some(3),
                signal: None,
                cpu_us: 7,
            }
            .to_line(),
        );
        assert_eq!(
            StatusMsg::parse_last(&bytes),
            Some(StatusMsg::Finished {
                code: Some(3),
                signal: None,
                cpu_us: 7
            })
        );
        assert_eq!(StatusMsg::parse_last(b""), None);
        assert_eq!(StatusMsg::parse_last(b"{\"finished\":"), None);
    }

    #[test]
    fn cpu_limit_rounds_up_to_whole_seconds() {
        let l = kiln_core::Limits {
            cpu_time: Duration::from_millis(1500),
            ..Default::default()
        };
        assert_eq!(JailLimits::from_limits(&l).cpu_secs, 2);
        let l = kiln_core::Limits {
            cpu_time: Duration::from_millis(0),
            ..Default::default()
        };
        assert_eq!(JailLimits::from_limits(&l).cpu_secs, 1);
    }
}
