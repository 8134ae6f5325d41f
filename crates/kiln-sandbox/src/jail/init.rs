//! The jail's init (PID 1 of its pid namespace): waits to be released by the
//! helper, becomes uid 0 of its user namespace, builds and enters the root,
//! forks the user program and reaps every process until the user program
//! exits, then reports its status. When init exits the kernel kills all
//! processes left in the namespace (double-forked, setsid'd, daemonised).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{Gid, Pid, Uid, pipe2, read, sethostname, setresgid, setresuid, write};

use super::plan::{HOSTNAME, Op};
use super::{Confinement, EXIT_REPORTED, JailError, exec, open_devnull, report, rootfs};
use crate::spec::{JailSpec, ParkMode, StatusMsg};
use crate::sys::{self, Forked};

/// Runs C to completion and exits.
/// The pipes C gets from the helper.
pub(super) struct InitPipes {
    pub release_r: OwnedFd,
    pub release_w: OwnedFd,
    /// Read end of the go pipe (parked jails only), for the program process.
    pub go_r: Option<OwnedFd>,
    /// Embedded jails: the fork-server forks the program, not init.
    pub remote: Option<RemotePipes>,
}

/// What init of an embedded jail talks through: the fork-server forks the
/// program process into the jail once init says the root is ready.
pub(crate) struct RemotePipes {
    /// Init writes one byte here once the root is built and entered.
    pub ready_w: OwnedFd,
    /// The program's exec pipe (its setup failures, `parked`).
    pub exec_r: OwnedFd,
    /// The fork-server writes the program's `finished` status here.
    pub exit_r: OwnedFd,
}

pub(super) fn init_main(
    spec: &JailSpec,
    plan: &[Op],
    confinement: &Confinement,
    pipes: InitPipes,
    status: &File,
) -> ! {
    let msg = init(spec, plan, confinement, pipes, status).unwrap_or_else(JailError::into_status);
    let code = match msg {
        StatusMsg::Finished { .. } => 0,
        _ => EXIT_REPORTED,
    };
    report(status, &msg);
    sys::exit_now(code)
}

/// Blocks until the helper wrote the id maps. EOF means the helper died.
fn wait_for_release(release_r: &OwnedFd) -> Result<(), JailError> {
    let mut byte = [0u8; 1];
    loop {
        match read(release_r, &mut byte) {
            Ok(1) => return Ok(()),
            Ok(_) => {
                return Err(JailError::Setup(
                    "wait for release: helper exited".to_owned(),
                ));
            }
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(JailError::setup("wait for release", e)),
        }
    }
}

fn init(
    spec: &JailSpec,
    plan: &[Op],
    confinement: &Confinement,
    pipes: InitPipes,
    status: &File,
) -> Result<StatusMsg, JailError> {
    let InitPipes {
        release_r,
        release_w,
        go_r,
        remote,
    } = pipes;
    // If the helper dies (the server killed it), so do we — and with us the
    // whole pid namespace. Set before waiting, so a helper that died earlier
    // shows up as EOF on the release pipe instead.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| JailError::setup("set parent-death signal", e))?;
    drop(release_w);
    wait_for_release(&release_r)?;

    // Uid 0 of the new user namespace: without this the unmapped host root
    // credentials cannot even create files on the new tmpfs.
    let root_g = Gid::from_raw(0);
    let root_u = Uid::from_raw(0);
    setresgid(root_g, root_g, root_g).map_err(|e| JailError::setup("setresgid 0", e))?;
    setresuid(root_u, root_u, root_u).map_err(|e| JailError::setup("setresuid 0", e))?;
    // Changing credentials cleared the parent-death signal: set it again,
    // then make sure the helper did not die in between (it keeps the
    // release pipe's write end open for its whole life).
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| JailError::setup("set parent-death signal", e))?;
    let mut fds = [PollFd::new(release_r.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(0) => {}
        Ok(_) => return Err(JailError::Setup("helper exited during setup".to_owned())),
        Err(e) => return Err(JailError::setup("check helper", e)),
    }
    drop(release_r);
    sethostname(HOSTNAME).map_err(|e| JailError::setup("sethostname", e))?;
    // A cgroup namespace rooted at the run's own groups (we are in them
    // already): /proc/self/cgroup then shows "/" where it showed the host's
    // layout (container id, server pid, run counter). Made here rather
    // than by the helper's clone, which would root it in the helper's
    // cgroup on v2 (CLONE_INTO_CGROUP moves the child after its namespaces
    // exist). A program the fork-server forks joins it with the others.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP)
        .map_err(|e| JailError::setup("cgroup namespace", e))?;

    rootfs::build_and_enter(&spec.root_dir, plan)?;

    if let Some(remote) = remote {
        drop(go_r);
        return remote_program(remote, status);
    }

    let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| JailError::setup("exec pipe", e))?;
    let child = match sys::fork_single_threaded().map_err(|e| JailError::setup("fork", e))? {
        Forked::Child => {
            drop(err_r);
            // The embedded runner only runs in the fork-server's forks.
            exec::exec_main(spec, confinement, err_w, go_r, None)
        }
        Forked::Parent { pid, .. } => pid,
    };
    drop(err_w);
    drop(go_r);

    // The exec pipe closes without data once execve succeeded (or, parked,
    // once the program process starts the user's program). A parked
    // process first says so on it; that is passed on to the server.
    let (failure, read_result) = read_exec_pipe(err_r, status);
    if read_result.is_ok() && failure.is_empty() && spec.park == Some(ParkMode::Prestart) {
        // The pre-started runtime is running and reads the go on its stdin.
        report(status, &StatusMsg::Parked);
    }

    detach_stdio()?;
    read_result.map_err(|e| JailError::setup("read exec pipe", e))?;
    if !failure.is_empty() {
        let _ = reap_until(child);
        return Err(exec_failure(&failure));
    }

    let (code, signal) = reap_until(child)?;
    let usage =
        getrusage(UsageWho::RUSAGE_CHILDREN).map_err(|e| JailError::setup("getrusage", e))?;
    Ok(StatusMsg::Finished {
        code,
        signal,
        cpu_us: sys::timeval_micros(usage.user_time().as_ref())
            + sys::timeval_micros(usage.system_time().as_ref()),
    })
}

/// Init's side of an embedded jail: the root is ready; the fork-server's
/// program reports on the exec pipe, its exit status comes on the exit pipe.
/// Orphans are reparented to init and die with it.
fn remote_program(remote: RemotePipes, status: &File) -> Result<StatusMsg, JailError> {
    let RemotePipes {
        ready_w,
        exec_r,
        exit_r,
    } = remote;
    write(&ready_w, b"1").map_err(|e| JailError::setup("say ready", e))?;
    drop(ready_w);
    let (failure, read_result) = read_exec_pipe(exec_r, status);
    detach_stdio()?;
    read_result.map_err(|e| JailError::setup("read exec pipe", e))?;
    if !failure.is_empty() {
        return Err(exec_failure(&failure));
    }
    let mut line = Vec::new();
    BufReader::new(File::from(exit_r))
        .read_until(b'\n', &mut line)
        .map_err(|e| JailError::setup("read program status", e))?;
    match StatusMsg::parse_last(&line) {
        Some(msg @ StatusMsg::Finished { .. }) => Ok(msg),
        _ => Err(JailError::Setup(
            "the program ended without a status (is the fork-server gone?)".to_owned(),
        )),
    }
}

/// Init holds neither the output pipes nor stdin from now on: only the
/// program's processes do, so their EOF marks the run's end.
fn detach_stdio() -> Result<(), JailError> {
    let devnull = open_devnull()?;
    for fd in [0, 1, 2] {
        sys::dup2_raw(&devnull, fd).map_err(|e| JailError::setup("detach stdio", e))?;
    }
    Ok(())
}

/// The error a program process reported on its exec pipe.
fn exec_failure(failure: &[u8]) -> JailError {
    match StatusMsg::parse_last(failure) {
        Some(StatusMsg::ExecFailed(m)) => JailError::Exec(m),
        Some(StatusMsg::Error(m)) => JailError::Setup(m),
        _ => JailError::Setup(format!(
            "user program setup: {}",
            String::from_utf8_lossy(failure).trim()
        )),
    }
}

/// Reads the exec pipe to EOF. A `parked` line is reported on the status
/// pipe at once; everything else is the program process's failure.
fn read_exec_pipe(err_r: OwnedFd, status: &File) -> (Vec<u8>, std::io::Result<()>) {
    let parked = StatusMsg::Parked.to_line();
    let mut reader = BufReader::new(File::from(err_r));
    let mut failure = Vec::new();
    loop {
        let mut line = Vec::new();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return (failure, Ok(())),
            Ok(_) if line == parked => report(status, &StatusMsg::Parked),
            Ok(_) => failure.extend_from_slice(&line),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return (failure, Err(e)),
        }
    }
}

/// Reaps every child (orphans are re-parented to us) until `child` itself
/// has exited; returns its exit code or signal.
fn reap_until(child: Pid) -> Result<(Option<i32>, Option<i32>), JailError> {
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == child => return Ok((Some(code), None)),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == child => {
                return Ok((None, Some(sig as i32)));
            }
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(e) => return Err(JailError::setup("reap user program", e)),
        }
    }
}
