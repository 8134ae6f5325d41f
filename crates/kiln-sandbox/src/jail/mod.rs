//! The jail: its starter, its init and its program process.
//!
//! Process tree: the jail's **starter** (host root, single-threaded: the
//! jail launcher, `launcher.rs`, or without one a spawned `kiln __jail`
//! helper **H**, which stays to wait) `clone3`s the jail's init **C** into
//! new user, mount, pid, ipc and uts namespaces and a network namespace — a
//! new one, or the slot's or services channel's that the starter joined
//! first (`slotnet.rs`, `netns.rs`) —, attaches it to the run's cgroups,
//! writes its uid/gid maps and releases it (`start.rs`). C (`init.rs`)
//! builds the root (`plan.rs`, `rootfs.rs`), has the user program **G**
//! forked (`exec.rs`: by C, or by the fork-server for an embedded jail) and
//! watches it to its end (`watch.rs`); then C reports on the status pipe
//! and exits, which makes the kernel kill whatever else is left in the pid
//! namespace.
//!
//! A **parked** (warm) jail is built the same way, but its program process
//! stops, fully confined, before it learns what to run; C waits for a
//! second line on the control pipe (the [`GoMsg`]) and passes it on through
//! the go pipe. Only then does the run's wall time start.
//!
//! This module runs in fresh single-threaded processes (the launcher, a
//! spawned helper, forks of the fork-server), so it may allocate freely
//! after forking. It must never be entered from the server itself.

mod confine;
mod exec;
mod init;
pub(crate) mod keep;
pub mod plan;
pub(crate) mod remote;
mod rootfs;
pub(crate) mod start;
mod watch;

/// The pid of a jail's program in the jail: the first process its init
/// (pid 1) forks, or the fork-server's fork into it.
pub(crate) const PROGRAM_PID: libc::pid_t = 2;

use std::fs::File;
use std::io::{BufRead, Write};
use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{Pid, getpid};

use crate::probe::JAIL_NAMESPACES;
use crate::seccomp;
use crate::spec::{CgroupAttach, GoMsg, ID_RANGE, JailSpec, STATUS_FD, StatusMsg, ZYGOTE_FD};
use crate::sys::{self, Forked};

/// Runs a parked, confined program process's user program in process
/// (the fork-server's embedded interpreter). Never returns.
pub type EmbeddedRunner = fn(&GoMsg) -> !;

/// The command line and name the jail's init shows.
const INIT_NAME: &str = "sandbox-init";

/// Exit code of C (and H) after it reported an error on the status pipe.
const EXIT_REPORTED: i32 = 3;

/// What the user program's process applies to itself just before `execve`,
/// prepared by the jail's starter before it clones.
pub(crate) struct Confinement {
    /// Seccomp programs in installation order (empty: no seccomp).
    pub filters: Vec<seccompiler::BpfProgram>,
    /// Landlock rules; `None`: no Landlock.
    pub landlock: Option<Vec<(std::path::PathBuf, plan::PathAccess)>>,
    /// The one TCP port the program may connect to (a services channel).
    pub connect_port: Option<u16>,
}

/// A failure inside the jail's processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JailError {
    /// `"<step>: <errno text>"`.
    Setup(String),
    /// `execve` of the user program failed.
    Exec(String),
}

impl JailError {
    fn setup(what: impl std::fmt::Display, e: impl std::fmt::Display) -> JailError {
        JailError::Setup(format!("{what}: {e}"))
    }

    /// The text of the failure.
    pub(crate) fn message(&self) -> &str {
        match self {
            JailError::Setup(m) | JailError::Exec(m) => m,
        }
    }

    fn into_status(self) -> StatusMsg {
        match self {
            JailError::Setup(m) => StatusMsg::Error(m),
            JailError::Exec(m) => StatusMsg::ExecFailed(m),
        }
    }
}

/// Writes one status line (a single `write`, below `PIPE_BUF` in practice).
fn report(status: &File, msg: &StatusMsg) {
    let mut f = status;
    // Nobody is left to tell if the server stopped listening.
    let _ = f.write_all(&msg.to_line());
}

/// Entry point of `kiln __jail`. Never returns.
pub fn helper_main() -> ! {
    let Some(status_fd) = sys::adopt_inherited_fd(STATUS_FD) else {
        eprintln!("kiln __jail: internal entry point of the sandbox (no status pipe on fd 3)");
        sys::exit_now(2);
    };
    let status = File::from(status_fd);
    let code = match helper(&status) {
        Ok(()) => 0,
        Err(e) => {
            report(&status, &e.into_status());
            EXIT_REPORTED
        }
    };
    sys::exit_now(code)
}

fn open_devnull() -> Result<OwnedFd, JailError> {
    open("/dev/null", OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| JailError::setup("open /dev/null", e))
}

/// Writes C's uid and gid maps: inside 0..65536 ↦ the slot's host range.
fn write_id_maps(pid: Pid, base: u32) -> Result<(), JailError> {
    let map = format!("0 {base} {ID_RANGE}\n");
    let write = |file: &str, data: &str| {
        let path = format!("/proc/{pid}/{file}");
        std::fs::write(&path, data).map_err(|e| JailError::setup(format_args!("write {path}"), e))
    };
    write("uid_map", &map)?;
    // The jail may never change its groups (ours were dropped before clone).
    write("setgroups", "deny")?;
    write("gid_map", &map)
}

/// Clones the jail's init into its new namespaces with the user namespace
/// owned by `owner` (the host uid of the jail's root), not by host root.
///
/// The kernel charges per-user budgets of everything in a user namespace
/// (inotify instances and watches, pending signals, POSIX message queue
/// bytes, namespaces, ...) up the chain of namespace owners. Owned by root,
/// every jail's usage counted against host root's own limits: one jail
/// holding 128 inotify instances made `inotify_init` fail for every root
/// process and every other jail. Owned by the slot's uid, what a jail takes
/// comes out of that slot's budget alone.
///
/// The euid changes only around the clone; the capabilities stay
/// (`SECBIT_NO_SETUID_FIXUP`), so creating the namespaces is still a
/// privileged operation (hosts that restrict unprivileged user namespaces
/// still allow it) and the maps can be written afterwards.
fn clone_owned_by(
    owner: nix::unistd::Uid,
    namespaces: libc::c_int,
    cgroup: Option<i32>,
) -> Result<Forked, JailError> {
    use nix::unistd::{Uid, setresuid};
    sys::keep_caps_across_uid_changes().map_err(|e| JailError::setup("set securebits", e))?;
    let keep = Uid::from_raw(u32::MAX); // -1: unchanged
    setresuid(keep, owner, keep).map_err(|e| JailError::setup("become the jail's owner", e))?;
    let forked = sys::clone3_fork(namespaces as u64, cgroup);
    if let Ok(Forked::Child) = forked {
        return Ok(Forked::Child);
    }
    setresuid(keep, Uid::from_raw(0), keep)
        .map_err(|e| JailError::setup("back to host root", e))?;
    forked.map_err(|e| JailError::setup("clone3", e))
}

/// The Landlock rules of a program process, as its starter made them.
type LandlockRules = Option<Vec<(std::path::PathBuf, plan::PathAccess)>>;

/// The program process's confinement: the spec's seccomp programs and
/// `landlock` (the rules of the spec's mount plan).
fn confinement(spec: &JailSpec, landlock: LandlockRules) -> Confinement {
    Confinement {
        filters: spec
            .seccomp_filters
            .as_ref()
            .map(|programs| programs.iter().map(seccomp::from_insns).collect())
            .unwrap_or_default(),
        landlock,
        connect_port: spec.network.as_ref().map(|n| n.connect_port),
    }
}

/// The spec's mount plan and the program process's confinement (seccomp
/// programs, Landlock rules), computed on the host by the jail's starter.
fn prepare(spec: &JailSpec) -> (Vec<plan::Op>, Confinement) {
    let plan = plan::build(spec, &plan::RealHost);
    let landlock = spec.landlock.then(|| plan::landlock_rules(&plan));
    (plan, confinement(spec, landlock))
}

/// Joins a network namespace the server made: a services channel's (see
/// `netns.rs`) or the slot's (`slotnet.rs`), through the server's
/// descriptor of it, checked by inode so that a reused descriptor number can
/// never lead into another run's namespace.
fn join_network(path: &std::path::Path, inode: u64) -> Result<(), JailError> {
    let fd = open(path, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| JailError::setup(format_args!("open {}", path.display()), e))?;
    let ino = nix::sys::stat::fstat(&fd)
        .map_err(|e| JailError::setup("fstat network namespace", e))?
        .st_ino;
    if ino != inode {
        return Err(JailError::Setup(format!(
            "network namespace: {} is not the run's namespace",
            path.display()
        )));
    }
    nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| JailError::setup("join the network namespace", e))
}

/// The program process of an embedded jail as forked by the fork-server,
/// already in the jail's pid namespace: joins the jail's cgroups and its
/// other namespaces through its init's pidfd, then goes on exactly like a
/// program process its init forked. Never returns.
///
/// Its memory is a copy of the fork-server's and will be the user
/// program's: the request line (`spec_line`, in the fork-server's receive
/// buffer) and every host path parsed from it are zeroed before the
/// program could read them.
pub(crate) fn forked_program_main(
    spec_line: &mut [u8],
    exec_w: OwnedFd,
    go_r: OwnedFd,
    init_pidfd: OwnedFd,
    runner: EmbeddedRunner,
) -> ! {
    let fail = |e: JailError| -> ! {
        let _ = nix::unistd::write(&exec_w, &e.into_status().to_line());
        sys::exit_now(127)
    };
    // The spec's line, then the starter's Landlock rules (see
    // `remote::request_program`): the mount plan is the starter's to build;
    // made again here it cost a `statx` of every host path it depends on
    // and the allocations, in a process whose every touched page is a copy.
    let (spec_part, rules_part) = match spec_line.iter().position(|&b| b == b'\n') {
        Some(i) => (&spec_line[..i], &spec_line[i + 1..]),
        None => (&spec_line[..], &[][..]),
    };
    let parsed = serde_json::from_slice::<JailSpec>(spec_part);
    let rules = serde_json::from_slice::<LandlockRules>(rules_part);
    sys::scrub(spec_line);
    let mut spec = match parsed {
        Ok(s) => s,
        Err(e) => fail(JailError::setup("parse spec", e)),
    };
    let landlock = match rules {
        // The starter made them from this same spec.
        Ok(rules) if rules.is_some() == spec.landlock => rules,
        Ok(_) => fail(JailError::Setup(
            "the helper's Landlock rules do not match the spec".to_owned(),
        )),
        Err(e) => fail(JailError::setup("parse the helper's Landlock rules", e)),
    };
    let confinement = confinement(&spec, landlock);
    // "0" is the writer itself (our pid here is the jail's, not the host's).
    let procs: Vec<std::path::PathBuf> = match &spec.cgroup {
        None => Vec::new(),
        Some(CgroupAttach::V1 { procs }) => procs.clone(),
        Some(CgroupAttach::V2 { dir }) => vec![dir.join("cgroup.procs")],
    };
    for p in procs {
        if let Err(e) = std::fs::write(&p, "0") {
            fail(JailError::setup("attach to the run's cgroups", e));
        }
        sys::scrub_path(p);
    }
    spec.scrub_host_paths();
    if spec.keep
        && let Err(e) = kept_program_pids()
    {
        fail(e);
    }
    let others = nix::sched::CloneFlags::from_bits_truncate(
        (JAIL_NAMESPACES & !libc::CLONE_NEWPID) | libc::CLONE_NEWCGROUP,
    );
    if let Err(e) = nix::sched::setns(&init_pidfd, others) {
        fail(JailError::setup("join the jail's namespaces", e));
    }
    // A kept jail's init is not in the run's groups: the program's own
    // cgroup namespace, rooted at the run's groups it is in now, shows it
    // "/" as a program its init forked sees.
    if spec.keep
        && let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP)
    {
        fail(JailError::setup("cgroup namespace", e));
    }
    drop(init_pidfd);
    // Uid 0 of the jail, as a program its init forked starts: our host uid
    // has no mapping there, and only the change from uid 0 to the jail's
    // user clears the capabilities that joining the user namespace gave us.
    let root_g = nix::unistd::Gid::from_raw(0);
    let root_u = nix::unistd::Uid::from_raw(0);
    if let Err(e) = nix::unistd::setresgid(root_g, root_g, root_g)
        .and_then(|()| nix::unistd::setresuid(root_u, root_u, root_u))
    {
        fail(JailError::setup("become the jail's uid 0", e));
    }
    exec::exec_main(&spec, &confinement, exec_w, Some(go_r), Some(runner))
}

/// A kept jail's program (`keep.rs`) numbers its processes as a cold
/// jail's first program does: it is [`PROGRAM_PID`] (the fork-server gave
/// it that pid), and the jail's next pid is the one after it, whatever
/// earlier programs in the jail had. Else a program could count how many
/// processes ran in the slot before it. Written while this process is
/// still root of the host, through the host's `/proc` (the jail's is
/// read-only there), to its own, the jail's, pid namespace.
fn kept_program_pids() -> Result<(), JailError> {
    if nix::unistd::getpid().as_raw() != PROGRAM_PID {
        return Err(JailError::Setup(format!(
            "a kept jail's program must be pid {PROGRAM_PID}"
        )));
    }
    std::fs::write(crate::probe::NS_LAST_PID, PROGRAM_PID.to_string())
        .map_err(|e| JailError::setup("reset the kept jail's next pid", e))
}

/// A spawned helper (no jail launcher): starts the jail as the launcher
/// would (`start.rs`), then only waits for its init, whose parent it stays
/// (the server watches and kills the helper; the init's parent-death signal
/// follows). Reports if the init ended without a status.
fn helper(status: &File) -> Result<(), JailError> {
    sys::set_cloexec(STATUS_FD, true).map_err(|e| JailError::setup("mark status fd", e))?;
    // The fork-server's socket, for embedded jails; it never reaches the
    // jail (close-on-exec, and dropped in the init's clone).
    let zygote = sys::adopt_inherited_fd(ZYGOTE_FD);
    if zygote.is_some() {
        sys::set_cloexec(ZYGOTE_FD, true).map_err(|e| JailError::setup("mark zygote fd", e))?;
    }
    sys::close_from(ZYGOTE_FD + 1).map_err(|e| JailError::setup("close inherited fds", e))?;

    // The spec is one line; stdin then stays open as the control pipe,
    // which the jail's init watches.
    let stdin = std::io::stdin();
    let mut line = String::new();
    stdin
        .lock()
        .read_line(&mut line)
        .map_err(|e| JailError::setup("read spec", e))?;
    let control = stdin
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| JailError::setup("keep control pipe", e))?;
    let devnull = open_devnull()?;
    let me = sys::pidfd_open(getpid()).map_err(|e| JailError::setup("pidfd_open", e))?;
    let home_netns = open_home_netns()?;
    let out =
        |fd| sys::adopt_inherited_fd(fd).ok_or_else(|| JailError::Setup(format!("no fd {fd}")));
    let (stdout, stderr) = (out(1)?, out(2)?);
    let status_fd = status
        .try_clone()
        .map_err(|e| JailError::setup("status fd", e))?;
    let fds = start::StartFds {
        jail: start::JailFds {
            control: &control,
            stdout: &stdout,
            stderr: &stderr,
            status: &OwnedFd::from(status_fd),
            zygote: zygote.as_ref(),
        },
        devnull: &devnull,
        starter: &me,
        home_netns: &home_netns,
    };
    let spec_line = line.strip_suffix('\n').unwrap_or(&line);
    let (pid, _pidfd) = start::start(spec_line.as_bytes(), &fds)?;
    // Only the jail holds the pipes from now on, so their EOF marks its end.
    drop((control, zygote));
    for fd in [0, 1, 2] {
        sys::dup2_raw(&devnull, fd).map_err(|e| JailError::setup("detach output", e))?;
    }
    std::mem::forget((stdout, stderr));
    loop {
        match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, 0 | EXIT_REPORTED)) => return Ok(()),
            Ok(other) => {
                return Err(JailError::Setup(format!(
                    "jail init ended without a status: {other:?}"
                )));
            }
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(JailError::setup("reap jail init", e)),
        }
    }
}

/// The starter's own network namespace (see [`start::StartFds`]).
pub(crate) fn open_home_netns() -> Result<OwnedFd, JailError> {
    open(
        "/proc/self/ns/net",
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| JailError::setup("open own network namespace", e))
}
