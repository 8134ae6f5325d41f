//! A kept jail's init between two programs (`JailSpec::keep`): after the
//! program's end it kills every other process of the jail and confirms
//! that it is alone before it reports the run (so a run is still over only
//! when every process of its jail is dead); after the server's `again`
//! (sent once the slot's clean-up ran) it checks or renews everything a
//! program could have left in the jail, and the jail takes a fresh program
//! only when it found all of it as new. Anything else ends the init, and
//! with it the jail: the server then builds a new one.
//!
//! What a program can leave, and what happens to it here:
//! - processes (background, double-forked, `setsid`): killed and reaped
//!   until the pid namespace holds init alone, confirmed in `/proc`;
//! - files in `/tmp` and `/dev/shm`: both tmpfs are detached and mounted
//!   new (`rootfs::renew_tmpfs`);
//! - SysV shared memory, semaphores and message queues, POSIX message
//!   queues (the jail's IPC namespace): checked empty, else the jail is
//!   not reused;
//! - the UTS names: checked unchanged;
//! - the workspace: the slot's clean-up empties it on the host (the same
//!   directory, bound here once);
//! - the network namespace and the cgroups: the slot's, checked by its
//!   clean-up; the server reuses a jail only with the same spec, so with
//!   the same namespace and groups.
//!
//! The init holds no socket to the fork-server while a program runs: the
//! server puts one on the jail's channel for each program (the first at
//! the jail's start, the next with its `again`), and the init drops it
//! once the fork-server forked the program ([`next_zygote`]).

use std::fs::File;
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};

use super::JailError;
use super::plan::{HOSTNAME, Op};
use super::rootfs;

/// The server's line that hands the kept jail a fresh program.
pub(crate) const AGAIN: &[u8] = b"again\n";

/// The server's message on a kept jail's fork-server channel: a socket to
/// the fork-server attached, for the jail's next program.
const ZYGOTE_MSG: &[u8] = b"z";

/// The server's side of [`next_zygote`]: puts `zygote` on a kept jail's
/// fork-server `channel` for its next program.
pub(crate) fn send_zygote(channel: &OwnedFd, zygote: &OwnedFd) -> nix::Result<()> {
    crate::seqpacket::send(channel, ZYGOTE_MSG, &[zygote.as_raw_fd()])
}

/// The fork-server socket for the jail's next program, from the server's
/// channel (`run.rs`, `zygote_channel` and `Started::again`): the init
/// drops it once the program is forked, so no socket to the fork-server
/// is in the jail while user code runs; the channel itself carries the
/// next one only after the program's processes are all gone. Its end (the
/// server dropped the jail) ends init quietly.
pub(super) fn next_zygote(channel: &OwnedFd) -> Result<OwnedFd, JailError> {
    let (bytes, mut fds) = crate::seqpacket::recv(channel, ZYGOTE_MSG.len() + 1)
        .map_err(|e| JailError::setup("fork-server channel", e))?;
    if bytes.is_empty() && fds.is_empty() {
        crate::sys::exit_now(0);
    }
    match fds.len() {
        1 if bytes == ZYGOTE_MSG => Ok(fds.remove(0)),
        n => Err(JailError::Setup(format!(
            "the fork-server channel sent {} bytes and {n} descriptors",
            bytes.len()
        ))),
    }
}

/// Kills every process of the jail but init and reaps them until init has
/// no child left, then confirms in `/proc` that init is alone.
pub(super) fn clear_processes() -> Result<(), JailError> {
    // The common case first: the program left nothing but zombies (which
    // are init's to reap). `kill(-1)` walks every process of the host, not
    // only the jail's: skipped when `/proc` shows init alone, which no
    // process can change (none is left to fork).
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(JailError::setup("reap the jail's processes", e)),
        }
    }
    if others_in("/proc")
        .map_err(|e| JailError::setup("list /proc", e))?
        .is_empty()
    {
        return Ok(());
    }
    loop {
        // -1 from a pid namespace's init: every process of the namespace
        // but itself; again after each reap, for a fork that raced it
        match kill(Pid::from_raw(-1), Signal::SIGKILL) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => return Err(JailError::setup("kill the jail's processes", e)),
        }
        match waitpid(Pid::from_raw(-1), None) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(Errno::ECHILD) => break,
            Err(e) => return Err(JailError::setup("reap the jail's processes", e)),
        }
    }
    let left = others_in("/proc").map_err(|e| JailError::setup("list /proc", e))?;
    match left.as_slice() {
        [] => Ok(()),
        pids => Err(JailError::Setup(format!(
            "processes left in the jail: {pids:?}"
        ))),
    }
}

/// The pids in the `/proc` at `proc` other than 1.
fn others_in(proc: &str) -> std::io::Result<Vec<i32>> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir(proc)? {
        if let Some(pid) = e?.file_name().to_str().and_then(|n| n.parse::<i32>().ok())
            && pid != 1
        {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// Waits for the server's next line on the control pipe: `Ok` on
/// [`AGAIN`]; its end (the server dropped the jail) or any other line ends
/// init quietly.
pub(super) fn wait_again(control: &OwnedFd) -> Result<(), JailError> {
    let mut line = Vec::with_capacity(AGAIN.len());
    let mut f = File::from(
        control
            .try_clone()
            .map_err(|e| JailError::setup("control pipe", e))?,
    );
    let mut byte = [0u8; 1];
    while line.len() < AGAIN.len() {
        match f.read(&mut byte) {
            Ok(1) => line.push(byte[0]),
            Ok(_) => crate::sys::exit_now(0),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => crate::sys::exit_now(0),
        }
    }
    if line != AGAIN {
        crate::sys::exit_now(0);
    }
    Ok(())
}

/// Before the next program: checks the IPC namespace and the UTS names
/// as new and renews `/tmp` and `/dev/shm` (see the module's text).
/// `domain` is the NIS domain name the jail started with (the host's).
pub(super) fn reset(plan: &[Op], domain: &std::ffi::OsStr) -> Result<(), JailError> {
    for kind in ["shm", "msg", "sem"] {
        let path = format!("/proc/sysvipc/{kind}");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| JailError::setup(format!("read {path}"), e))?;
        // a header line, then one line per object
        if text.lines().count() > 1 {
            return Err(JailError::Setup(format!("SysV IPC objects left: {kind}")));
        }
    }
    check_mqueue()?;
    let uts = nix::sys::utsname::uname().map_err(|e| JailError::setup("uname", e))?;
    if uts.nodename() != HOSTNAME || uts.domainname() != domain {
        return Err(JailError::Setup("the jail's UTS names changed".to_owned()));
    }
    rootfs::renew_tmpfs(plan)
}

/// POSIX message queues live in the IPC namespace's own mqueue filesystem,
/// mounted nowhere in the jail: mounted for a moment over `/tmp` (which is
/// renewed next) and listed.
fn check_mqueue() -> Result<(), JailError> {
    let at = Path::new("/tmp");
    mount(
        Some("mqueue"),
        at,
        Some("mqueue"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| JailError::setup("mount mqueue", e))?;
    let listed = std::fs::read_dir(at).map(|d| d.count());
    umount2(at, MntFlags::MNT_DETACH).map_err(|e| JailError::setup("unmount mqueue", e))?;
    match listed {
        Ok(0) => Ok(()),
        Ok(n) => Err(JailError::Setup(format!("{n} POSIX message queues left"))),
        Err(e) => Err(JailError::setup("list mqueue", e)),
    }
}
