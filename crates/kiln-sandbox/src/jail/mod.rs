//! The jail helper process (`kiln __jail`), started by the server once per
//! run with a cleared environment, the [`JailSpec`] on stdin, the output
//! pipes on fds 1 and 2 and the status pipe on fd 3.
//!
//! Process tree: the helper **H** (host root) attaches itself to the run's
//! cgroups and `clone3`s the jail's init **C** into new user, mount, pid,
//! ipc and uts namespaces (`init.rs`) and a network namespace — a new one,
//! or the slot's or services channel's that H joined first (`slotnet.rs`,
//! `netns.rs`) —, writes C's uid/gid maps, releases it and waits. C builds the root (`plan.rs`, `rootfs.rs`), forks the user
//! program **G** (`exec.rs`) and reaps until G exits; then C reports on the
//! status pipe and exits, which makes the kernel kill whatever else is left
//! in the pid namespace.
//!
//! A **parked** (warm) jail is built the same way, but its program process
//! stops, fully confined, before it learns what to run; the helper waits for
//! a second line on the control pipe (the [`GoMsg`]) and passes it on
//! through the go pipe. Only then does the run's wall time start.
//!
//! This module runs in a fresh single-threaded process (spawned, or forked
//! by the fork-server), so it may allocate freely after forking. It must
//! never be entered from the server itself.

mod confine;
mod exec;
mod init;
pub mod plan;
pub(crate) mod remote;
mod rootfs;

use std::fs::File;
use std::io::{BufRead, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::stat::Mode;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{Pid, getpid, pipe2};

use crate::probe::JAIL_NAMESPACES;
use crate::seccomp;
use crate::spec::{
    CgroupAttach, GO_MAX_BYTES, GoMsg, ID_RANGE, JailSpec, ParkMode, STATUS_FD, StatusMsg,
    ZYGOTE_FD,
};
use crate::sys::{self, Forked};

/// Runs a parked, confined program process's user program in process
/// (the fork-server's embedded interpreter). Never returns.
pub type EmbeddedRunner = fn(&GoMsg) -> !;

/// The command line and name the jail's init (and its helper) shows.
const INIT_NAME: &str = "sandbox-init";

/// Exit code of C (and H) after it reported an error on the status pipe.
const EXIT_REPORTED: i32 = 3;
/// The helper kills the jail itself this long after the wall time, in case
/// the server is gone.
const BACKSTOP_GRACE: Duration = Duration::from_secs(2);

/// What the user program's process applies to itself just before `execve`,
/// prepared by the helper before it clones.
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

/// Waits for C. Kills it (and still reaps it, so the whole pid namespace is
/// gone when this returns) once `deadline` passes or when the server closes
/// the control pipe — the server's way of stopping a run, and what happens
/// if the server dies. With `relay` (a kernel's stdin), what the server
/// writes on the control pipe is passed on to it; without, any byte there
/// stops the run too.
fn wait_init(
    pid: Pid,
    pidfd: Option<&OwnedFd>,
    control: &OwnedFd,
    deadline: Instant,
    mut relay: Option<File>,
) -> Result<WaitStatus, JailError> {
    let mut buf = vec![0u8; 64 * 1024];
    if let Some(pidfd) = pidfd {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
            let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
            let mut fds = [
                PollFd::new(pidfd.as_fd(), PollFlags::POLLIN),
                PollFd::new(control.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, timeout) {
                Ok(0) => {
                    // Wall time plus grace: the server should have stopped us.
                    let _ = kill(pid, Signal::SIGKILL);
                    break;
                }
                Ok(_) => {
                    let init_done = fds[0].revents().is_some_and(|r| !r.is_empty());
                    if !init_done && let Some(to) = relay.as_mut() {
                        // EOF (or an error) on the control pipe stops the
                        // kernel; so does a kernel that no longer reads
                        // (EPIPE: it is gone)
                        let passed = match nix::unistd::read(control, &mut buf) {
                            Ok(0) => false,
                            Ok(n) => to.write_all(&buf[..n]).is_ok(),
                            Err(Errno::EINTR | Errno::EAGAIN) => true,
                            Err(_) => false,
                        };
                        if passed {
                            continue;
                        }
                    }
                    if !init_done {
                        let _ = kill(pid, Signal::SIGKILL);
                    }
                    break;
                }
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    let _ = kill(pid, Signal::SIGKILL);
                    let _ = waitpid(pid, None);
                    return Err(JailError::setup("wait for jail init", e));
                }
            }
        }
    }
    loop {
        match waitpid(pid, None) {
            Ok(ws) => return Ok(ws),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(JailError::setup("reap jail init", e)),
        }
    }
}

/// What happened while a parked jail waited.
enum Parked {
    /// The go message arrived (raw line, checked to parse).
    Go(Vec<u8>, GoMsg),
    /// The control pipe closed (the server dropped the warm jail) or the
    /// jail died: it has been killed and reaped.
    Ended(WaitStatus),
}

/// Waits until the server sends the go or closes the control pipe, or the
/// jail's init exits on its own (a setup failure it has reported).
fn wait_go(pid: Pid, pidfd: Option<&OwnedFd>, control: &OwnedFd) -> Result<Parked, JailError> {
    let kill_and_reap = || -> Result<Parked, JailError> {
        let _ = kill(pid, Signal::SIGKILL);
        loop {
            match waitpid(pid, None) {
                Ok(ws) => return Ok(Parked::Ended(ws)),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(JailError::setup("reap jail init", e)),
            }
        }
    };
    loop {
        let mut fds = vec![PollFd::new(control.as_fd(), PollFlags::POLLIN)];
        if let Some(pidfd) = pidfd {
            fds.push(PollFd::new(pidfd.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(e) => {
                let _ = kill_and_reap();
                return Err(JailError::setup("wait for go", e));
            }
        }
        if fds
            .get(1)
            .and_then(PollFd::revents)
            .is_some_and(|r| !r.is_empty())
        {
            return kill_and_reap();
        }
        if fds[0].revents().is_some_and(|r| !r.is_empty()) {
            break;
        }
    }
    // The go is the only thing the server sends after the spec (and it
    // waits for `parked` first), so reading ahead past its newline loses
    // nothing.
    let mut line = Vec::new();
    let read = control
        .try_clone()
        .map(|fd| {
            std::io::BufReader::new(File::from(fd))
                .take(GO_MAX_BYTES as u64 + 1)
                .read_until(b'\n', &mut line)
        })
        .and_then(|r| r);
    match read {
        Ok(0) => kill_and_reap(),
        Ok(_) if line.len() > GO_MAX_BYTES || !line.ends_with(b"\n") => {
            let _ = kill_and_reap();
            Err(JailError::Setup(
                "go message too large or cut short".to_owned(),
            ))
        }
        Ok(_) => match serde_json::from_slice::<GoMsg>(&line) {
            Ok(go) => Ok(Parked::Go(line, go)),
            Err(e) => {
                let _ = kill_and_reap();
                Err(JailError::setup("parse go message", e))
            }
        },
        Err(e) => {
            let _ = kill_and_reap();
            Err(JailError::setup("read go message", e))
        }
    }
}

/// The Landlock rules of a program process, as its helper made them.
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
/// programs, Landlock rules), computed on the host by the helper.
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
    // The spec's line, then the helper's Landlock rules (see
    // `remote::request_program`): the mount plan is the helper's to build;
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
        // The helper made them from this same spec.
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
    let others = nix::sched::CloneFlags::from_bits_truncate(
        (JAIL_NAMESPACES & !libc::CLONE_NEWPID) | libc::CLONE_NEWCGROUP,
    );
    if let Err(e) = nix::sched::setns(&init_pidfd, others) {
        fail(JailError::setup("join the jail's namespaces", e));
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

fn helper(status: &File) -> Result<(), JailError> {
    sys::set_cloexec(STATUS_FD, true).map_err(|e| JailError::setup("mark status fd", e))?;
    // The fork-server's socket, for embedded jails; it never reaches the
    // jail (close-on-exec, and dropped in the init's clone).
    let zygote = sys::adopt_inherited_fd(ZYGOTE_FD);
    if zygote.is_some() {
        sys::set_cloexec(ZYGOTE_FD, true).map_err(|e| JailError::setup("mark zygote fd", e))?;
    }
    // Nothing but 0-3 may travel into the jail.
    sys::close_from(ZYGOTE_FD + 1).map_err(|e| JailError::setup("close inherited fds", e))?;

    // The spec is one line; stdin then stays open as the control pipe (see
    // `wait_init`), kept on a close-on-exec fd above 3.
    let stdin = std::io::stdin();
    let mut line = String::new();
    stdin
        .lock()
        .read_line(&mut line)
        .map_err(|e| JailError::setup("read spec", e))?;
    let spec: JailSpec =
        serde_json::from_str(&line).map_err(|e| JailError::setup("parse spec", e))?;
    let zygote = match (spec.park, zygote) {
        (Some(ParkMode::Embedded), Some(z)) => Some(z),
        (Some(ParkMode::Embedded), None) => {
            return Err(JailError::Setup(
                "embedded park mode without a fork-server socket".to_owned(),
            ));
        }
        (_, _) => None,
    };
    let control = stdin
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| JailError::setup("keep control pipe", e))?;
    let devnull = open_devnull()?;
    sys::dup2_raw(&devnull, 0).map_err(|e| JailError::setup("stdin from /dev/null", e))?;

    // Host root's supplementary groups (gid 0 among them) must not follow
    // the jail; inside, setgroups is denied, so drop them here.
    nix::unistd::setgroups(&[]).map_err(|e| JailError::setup("setgroups", e))?;
    let (plan, confinement) = prepare(&spec);
    // What the fork-server's program process applies (see `request_program`).
    let landlock_json = match &zygote {
        Some(_) => serde_json::to_vec(&confinement.landlock)
            .map_err(|e| JailError::setup("encode the Landlock rules", e))?,
        None => Vec::new(),
    };

    let cgroup_fd = match &spec.cgroup {
        None => None,
        Some(CgroupAttach::V1 { procs }) => {
            let me = getpid().to_string();
            for p in procs {
                std::fs::write(p, &me)
                    .map_err(|e| JailError::setup(format_args!("attach to {}", p.display()), e))?;
            }
            None
        }
        Some(CgroupAttach::V2 { dir }) => Some(
            open(
                dir,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| JailError::setup(format_args!("open cgroup {}", dir.display()), e))?,
        ),
    };

    let (release_r, release_w) =
        pipe2(OFlag::O_CLOEXEC).map_err(|e| JailError::setup("release pipe", e))?;
    let (go_r, go_w) = if spec.park.is_some() {
        let (r, w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| JailError::setup("go pipe", e))?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    // Embedded: the init says when its root is ready, the fork-server's
    // program reports on the exec pipe and its status arrives on the exit
    // pipe.
    let remote = match &zygote {
        Some(_) => {
            let pipe = || pipe2(OFlag::O_CLOEXEC).map_err(|e| JailError::setup("pipe", e));
            Some((pipe()?, pipe()?, pipe()?))
        }
        None => None,
    };
    let (remote_init, remote_helper) = match remote {
        Some(((ready_r, ready_w), (exec_r, exec_w), (exit_r, exit_w))) => (
            Some(init::RemotePipes {
                ready_w,
                exec_r,
                exit_r,
            }),
            Some((ready_r, exec_w, exit_w)),
        ),
        None => (None, None),
    };
    // the jail's init inherits the namespace joined here
    let joined = match (&spec.network, &spec.slot_netns) {
        (Some(net), _) => Some((&net.netns_path, net.netns_inode)),
        (None, Some(slot)) => Some((&slot.netns_path, slot.netns_inode)),
        (None, None) => None,
    };
    let namespaces = match joined {
        None => JAIL_NAMESPACES,
        Some((path, inode)) => {
            join_network(path, inode)?;
            JAIL_NAMESPACES & !libc::CLONE_NEWNET
        }
    };
    // What the jail sees of its init (PID 1): a neutral name, not the
    // launcher's or helper's command line.
    sys::set_process_name(INIT_NAME).map_err(|e| JailError::setup("name the jail's init", e))?;
    let mut started = Instant::now();
    let forked = clone_owned_by(
        nix::unistd::Uid::from_raw(spec.id_base),
        namespaces,
        cgroup_fd.as_ref().map(|f| f.as_raw_fd()),
    )?;
    let (pid, pidfd) = match forked {
        Forked::Child => {
            drop(cgroup_fd);
            drop(devnull);
            drop(control);
            drop(go_w);
            drop(zygote);
            drop(remote_helper);
            let pipes = init::InitPipes {
                release_r,
                release_w,
                go_r,
                remote: remote_init,
            };
            init::init_main(&spec, &plan, &confinement, pipes, status)
        }
        Forked::Parent { pid, pidfd } => (pid, pidfd),
    };
    drop(remote_init);
    drop(release_r);
    drop(cgroup_fd);

    if let Err(e) = write_id_maps(pid, spec.id_base) {
        let _ = kill(pid, Signal::SIGKILL);
        let _ = waitpid(pid, None);
        return Err(e);
    }
    // Kept open until we exit: init checks it to see that we are alive.
    let mut release = File::from(release_w);
    release
        .write_all(b"1")
        .map_err(|e| JailError::setup("release jail init", e))?;

    if let (Some(zygote), Some((ready_r, exec_w, exit_w)), Some(go_r), Some(init_pidfd)) =
        (zygote, remote_helper, &go_r, &pidfd)
    {
        // EOF instead: the init failed and reported; it is reaped below.
        let mut byte = [0u8; 1];
        let ready = loop {
            match nix::unistd::read(&ready_r, &mut byte) {
                Err(Errno::EINTR) => continue,
                r => break matches!(r, Ok(1)),
            }
        };
        if ready {
            let fds = remote::ProgramFds {
                stdout: &1,
                stderr: &2,
                exec_w: &exec_w,
                go_r,
                exit_w: &exit_w,
                init_pidfd,
            };
            let spec_line = line.strip_suffix('\n').unwrap_or(&line);
            if let Err(e) =
                remote::request_program(&zygote, spec_line.as_bytes(), &landlock_json, &fds)
            {
                let _ = kill(pid, Signal::SIGKILL);
                let _ = waitpid(pid, None);
                return Err(JailError::setup("fork the program", e));
            }
        }
    }
    drop(go_r);

    // Only the jail holds the output pipes from now on, so their EOF marks
    // the jail's end.
    for fd in [1, 2] {
        sys::dup2_raw(&devnull, fd).map_err(|e| JailError::setup("detach output", e))?;
    }
    let mut wall_ms = spec.limits.wall_ms;
    // A kernel's stdin: the control pipe's bytes after the go go there.
    let mut relay = None;
    if let Some(go_w) = go_w {
        match wait_go(pid, pidfd.as_ref(), &control)? {
            Parked::Ended(ws) => {
                drop(release);
                return match ws {
                    WaitStatus::Exited(_, 0 | EXIT_REPORTED) | WaitStatus::Signaled(..) => Ok(()),
                    other => Err(JailError::Setup(format!(
                        "parked jail init ended without a status: {other:?}"
                    ))),
                };
            }
            Parked::Go(line, go) => {
                started = Instant::now();
                wall_ms = go.wall_ms;
                let mut w = File::from(go_w);
                // A jail that died meanwhile shows up below as init's exit.
                let _ = w.write_all(&line);
                if go.kernel {
                    relay = Some(w);
                }
            }
        }
    }
    let deadline = started + Duration::from_millis(wall_ms) + BACKSTOP_GRACE;
    let ended = wait_init(pid, pidfd.as_ref(), &control, deadline, relay)?;
    drop(release);
    match ended {
        WaitStatus::Exited(_, 0 | EXIT_REPORTED) => Ok(()),
        other => Err(JailError::Setup(format!(
            "jail init ended without a status: {other:?}"
        ))),
    }
}
