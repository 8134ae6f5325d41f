//! The jail's init (PID 1 of its pid namespace): cloned by its starter (the
//! jail launcher, or a spawned helper), waits to be released, becomes uid 0
//! of its user namespace, builds and enters the root, has the user program
//! forked (by itself, or by the fork-server for an embedded jail) and
//! watches it to its end (`watch.rs`: the go, a kernel's input, the
//! wall-time backstop, reaping), then reports its status. When init exits
//! the kernel kills all processes left in the namespace (double-forked,
//! setsid'd, daemonised).

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;
use nix::unistd::{Gid, Pid, Uid, pipe2, read, sethostname, setresgid, setresuid, write};

use super::plan::{HOSTNAME, Op};
use super::start::StartFds;
use super::{
    Confinement, EXIT_REPORTED, INIT_NAME, JailError, exec, keep, remote, report, rootfs, watch,
};
use crate::spec::{JailSpec, STATUS_FD, StatusMsg};
use crate::sys::{self, Forked};

/// What C gets from its starter (see `start.rs`).
pub(super) struct Start<'a> {
    /// The starter's descriptors, in the starter's numbering.
    pub fds: &'a StartFds<'a>,
    /// Released (one byte) once the uid/gid maps are written.
    pub release_r: OwnedFd,
    /// Embedded jails: the fork-server forks the program, not init.
    pub zygote: Option<&'a OwnedFd>,
    /// The spec's line as the server sent it, for the fork-server.
    pub spec_line: &'a [u8],
    /// The program's Landlock rules (JSON), for the fork-server.
    pub landlock_json: &'a [u8],
}

/// C's descriptors once it took them over (see [`take_fds`]).
struct Own {
    status: OwnedFd,
    control: OwnedFd,
    release_r: OwnedFd,
    starter: OwnedFd,
    zygote: Option<OwnedFd>,
}

/// Runs C to completion and exits.
pub(super) fn init_main(
    spec: &JailSpec,
    plan: &[Op],
    confinement: &Confinement,
    start: Start<'_>,
) -> ! {
    let own = match take_fds(&start) {
        Ok(own) => own,
        Err(e) => {
            let _ = write(start.fds.jail.status, &e.into_status().to_line());
            sys::exit_now(EXIT_REPORTED)
        }
    };
    let status = File::from(own.status);
    let rest = Rest {
        control: own.control,
        release_r: own.release_r,
        starter: own.starter,
        zygote: own.zygote,
    };
    let msg =
        init(spec, plan, confinement, &start, rest, &status).unwrap_or_else(JailError::into_status);
    let code = match msg {
        StatusMsg::Finished { .. } => 0,
        _ => EXIT_REPORTED,
    };
    report(&status, &msg);
    sys::exit_now(code)
}

/// Makes C's descriptors 0 `/dev/null`, 1 stdout, 2 stderr, 3 the status
/// pipe, then the control pipe, the release pipe, the starter's pidfd and
/// the fork-server socket (close-on-exec), and closes every other one: C is
/// a copy of its starter, and the jail launcher holds its socket to the
/// server and the other jails' requests.
fn take_fds(start: &Start<'_>) -> Result<Own, JailError> {
    let f = &start.fds.jail;
    let mut keep = vec![
        start.fds.devnull,
        f.stdout,
        f.stderr,
        f.status,
        f.control,
        &start.release_r,
        start.fds.starter,
    ];
    keep.extend(start.zygote);
    sys::install_fds(&keep).map_err(|e| JailError::setup("install fds", e))?;
    let count = keep.len() as i32;
    // The originals stay unowned here (C never returns to the starter's
    // frames that own them); close_from closes them.
    sys::close_from(count).map_err(|e| JailError::setup("close inherited fds", e))?;
    let take = |n: i32| -> Result<OwnedFd, JailError> {
        sys::set_cloexec(n, true).map_err(|e| JailError::setup("mark fd", e))?;
        sys::adopt_inherited_fd(n).ok_or_else(|| JailError::Setup(format!("fd {n} missing")))
    };
    Ok(Own {
        status: take(STATUS_FD)?,
        control: take(4)?,
        release_r: take(5)?,
        starter: take(6)?,
        zygote: match start.zygote {
            Some(_) => Some(take(7)?),
            None => None,
        },
    })
}

/// C's descriptors but the status pipe.
struct Rest {
    control: OwnedFd,
    release_r: OwnedFd,
    starter: OwnedFd,
    zygote: Option<OwnedFd>,
}

/// Blocks until the starter wrote the id maps. EOF means the starter died.
fn wait_for_release(release_r: &OwnedFd) -> Result<(), JailError> {
    let mut byte = [0u8; 1];
    loop {
        match read(release_r, &mut byte) {
            Ok(1) => return Ok(()),
            Ok(_) => {
                return Err(JailError::Setup(
                    "wait for release: the jail's starter exited".to_owned(),
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
    start: &Start<'_>,
    own: Rest,
    status: &File,
) -> Result<StatusMsg, JailError> {
    let Rest {
        control,
        release_r,
        starter,
        zygote,
    } = own;
    let started = Instant::now();
    // The launcher ignores SIGCHLD (the kernel reaps its children); C
    // reaps its own.
    sys::set_sigchld_ignored(false).map_err(|e| JailError::setup("restore SIGCHLD", e))?;
    // What the jail sees of its init (PID 1): a neutral name, not the
    // launcher's or helper's command line.
    sys::set_process_name(INIT_NAME).map_err(|e| JailError::setup("name the jail's init", e))?;
    // If the starter dies (the jail launcher or a spawned helper: the
    // server's death ends both), so do we — and with us the whole pid
    // namespace. Set before waiting, so a starter that died earlier shows
    // up as EOF on the release pipe instead.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| JailError::setup("set parent-death signal", e))?;
    wait_for_release(&release_r)?;
    drop(release_r);

    // Uid 0 of the new user namespace: without this the unmapped host root
    // credentials cannot even create files on the new tmpfs.
    let root_g = Gid::from_raw(0);
    let root_u = Uid::from_raw(0);
    setresgid(root_g, root_g, root_g).map_err(|e| JailError::setup("setresgid 0", e))?;
    setresuid(root_u, root_u, root_u).map_err(|e| JailError::setup("setresuid 0", e))?;
    // Changing credentials cleared the parent-death signal: set it again,
    // then make sure the starter did not die in between (its pidfd turns
    // readable when it exits).
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| JailError::setup("set parent-death signal", e))?;
    let mut fds = [PollFd::new(starter.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(0) => {}
        Ok(_) => {
            return Err(JailError::Setup(
                "the jail's starter exited during setup".to_owned(),
            ));
        }
        Err(e) => return Err(JailError::setup("check the jail's starter", e)),
    }
    drop(starter);
    sethostname(HOSTNAME).map_err(|e| JailError::setup("sethostname", e))?;
    // A cgroup namespace rooted at the run's own groups (we are in them
    // already): /proc/self/cgroup then shows "/" where it showed the host's
    // layout (container id, server pid, run counter). Made here rather
    // than by the starter's clone, which would root it in the starter's
    // cgroup on v2 (CLONE_INTO_CGROUP moves the child after its namespaces
    // exist). A program the fork-server forks joins it with the others.
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP)
        .map_err(|e| JailError::setup("cgroup namespace", e))?;

    rootfs::build_and_enter(&spec.root_dir, plan)?;

    let pipe = || pipe2(OFlag::O_CLOEXEC).map_err(|e| JailError::setup("pipe", e));
    let (go_r, go_w) = match spec.park {
        Some(_) => {
            let (r, w) = pipe()?;
            (Some(r), Some(w))
        }
        None => (None, None),
    };
    let (exec_r, exec_w) = pipe()?;
    let watch = watch::Watch {
        spec,
        control: &control,
        go_w,
        started,
        status,
    };

    if let Some(zygote) = zygote {
        // The fork-server forks the program into our pid namespace; its
        // `finished` status comes on the exit pipe. Orphans are
        // re-parented to init and die with it.
        let Some(go_r) = go_r else {
            return Err(JailError::Setup(
                "an embedded jail is always parked".to_owned(),
            ));
        };
        if spec.keep {
            // `zygote` is the channel each program's fork-server socket
            // comes on (`keep::next_zygote`)
            drop((watch, exec_r, exec_w, go_r));
            return kept(spec, plan, start, &zygote, &control, status);
        }
        let (exit_r, exit_w) = pipe()?;
        let me = sys::pidfd_open(Pid::from_raw(1))
            .map_err(|e| JailError::setup("pidfd of the jail's init", e))?;
        let fds = remote::ProgramFds {
            stdout: &1,
            stderr: &2,
            exec_w: &exec_w,
            go_r: &go_r,
            exit_w: &exit_w,
            init_pidfd: &me,
        };
        remote::request_program(&zygote, start.spec_line, start.landlock_json, &fds)
            .map_err(|e| JailError::setup("fork the program", e))?;
        // Nothing of the fork-server's stays in the jail.
        drop(zygote);
        drop((exec_w, exit_w, go_r, me));
        return watch.run(exec_r, watch::Program::Remote { exit_r });
    }

    // SIGCHLD is taken through a signalfd (the program process unblocks
    // every signal first thing).
    let sigchld = watch::child_signals()?;
    let child = match sys::fork_single_threaded().map_err(|e| JailError::setup("fork", e))? {
        Forked::Child => {
            drop(exec_r);
            drop(sigchld);
            drop(watch);
            // The embedded runner only runs in the fork-server's forks.
            exec::exec_main(spec, confinement, exec_w, go_r, None)
        }
        Forked::Parent { pid, .. } => pid,
    };
    drop(exec_w);
    drop(go_r);
    watch.run(
        exec_r,
        watch::Program::Child {
            pid: child,
            sigchld,
        },
    )
}

/// A kept jail's init (`JailSpec::keep`, `keep.rs`): has a fresh program
/// forked and watches it, clears the jail and reports the run, then waits
/// for the server's `again` and checks the jail as new before the next
/// one; returns (and so ends the jail) on the first failure. Each program
/// is forked by the fork-server on a socket that came on `channel` for it
/// alone and is dropped once the program is forked: no socket to the
/// fork-server is in the jail while user code runs. Keeps the channel and
/// its own copies of the output pipes between runs: no program reaches
/// them (init is not dumpable, and a program is never init's child).
fn kept(
    spec: &JailSpec,
    plan: &[Op],
    start: &Start<'_>,
    channel: &OwnedFd,
    control: &OwnedFd,
    status: &File,
) -> Result<StatusMsg, JailError> {
    nix::sys::prctl::set_dumpable(false).map_err(|e| JailError::setup("not dumpable", e))?;
    let kept_copy =
        |r: std::io::Result<OwnedFd>| r.map_err(|e| JailError::setup("keep the output pipes", e));
    let out = kept_copy(std::io::stdout().as_fd().try_clone_to_owned())?;
    let err = kept_copy(std::io::stderr().as_fd().try_clone_to_owned())?;
    let domain = nix::sys::utsname::uname()
        .map_err(|e| JailError::setup("uname", e))?
        .domainname()
        .to_owned();
    let me = sys::pidfd_open(Pid::from_raw(1))
        .map_err(|e| JailError::setup("pidfd of the jail's init", e))?;
    let pipe = || pipe2(OFlag::O_CLOEXEC).map_err(|e| JailError::setup("pipe", e));
    loop {
        let (go_r, go_w) = pipe()?;
        let (exec_r, exec_w) = pipe()?;
        let (exit_r, exit_w) = pipe()?;
        let fds = remote::ProgramFds {
            stdout: &out,
            stderr: &err,
            exec_w: &exec_w,
            go_r: &go_r,
            exit_w: &exit_w,
            init_pidfd: &me,
        };
        let zygote = keep::next_zygote(channel)?;
        remote::request_program(&zygote, start.spec_line, start.landlock_json, &fds)
            .map_err(|e| JailError::setup("fork the program", e))?;
        drop(zygote);
        drop((exec_w, exit_w, go_r));
        let watch = watch::Watch {
            spec,
            control,
            go_w: Some(go_w),
            started: Instant::now(),
            status,
        };
        let msg = watch.run(exec_r, watch::Program::Remote { exit_r })?;
        if keep::clear_processes().is_err() {
            // reported as a jail that ends: its pid namespace goes with it
            return Ok(msg);
        }
        report(status, &msg);
        keep::wait_again(control)?;
        keep::reset(plan, &domain)?;
    }
}

/// Init holds neither the output pipes nor stdin from now on: only the
/// program's processes do, so their EOF marks the run's end.
pub(super) fn detach_stdio() -> Result<(), JailError> {
    // fd 0 is /dev/null (see `take_fds`)
    for fd in [1, 2] {
        sys::dup2_raw(&0, fd).map_err(|e| JailError::setup("detach stdio", e))?;
    }
    Ok(())
}

/// The error a program process reported on its exec pipe.
pub(super) fn exec_failure(failure: &[u8]) -> JailError {
    match StatusMsg::parse_last(failure) {
        Some(StatusMsg::ExecFailed(m)) => JailError::Exec(m),
        Some(StatusMsg::Error(m)) => JailError::Setup(m),
        _ => JailError::Setup(format!(
            "user program setup: {}",
            String::from_utf8_lossy(failure).trim()
        )),
    }
}
