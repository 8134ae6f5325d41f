//! The jail's init watching its program to the end, in one `poll` loop:
//!
//! - the control pipe: a parked jail's go line (passed on through the go
//!   pipe; the wall time starts there), then a kernel's input (relayed to
//!   its stdin); its end, or any other byte, is the server stopping the run;
//! - the exec pipe: `parked` (reported at once), a set-up failure, and its
//!   end once the program runs the user's code;
//! - the program's end: its `finished` status on the exit pipe (the
//!   fork-server's fork) or `SIGCHLD` (init's own fork; every orphan that
//!   init inherits is reaped on the way);
//! - the wall-time backstop: the spec's (or the go's) wall time plus a
//!   grace, in case the server is gone.
//!
//! A stop ends init at once: init is PID 1, so the kernel kills everything
//! else in the jail with it.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use super::init::{detach_stdio, exec_failure};
use super::{EXIT_REPORTED, JailError, report};
use crate::spec::{GO_MAX_BYTES, GoMsg, JailSpec, ParkMode, StatusMsg};
use crate::sys;

/// Init kills the jail itself this long after the wall time, in case the
/// server is gone.
const BACKSTOP_GRACE: Duration = Duration::from_secs(2);

/// How the program ended: its exit code, or the signal that killed it.
type Ended = (Option<i32>, Option<i32>);

/// How the program's end reaches init.
pub(super) enum Program {
    /// Forked by the fork-server: its `finished` line on the exit pipe.
    Remote { exit_r: OwnedFd },
    /// Forked by init: `SIGCHLD` through this signalfd.
    Child { pid: Pid, sigchld: SignalFd },
}

/// Blocks `SIGCHLD` and returns a signalfd for it (before the fork, so
/// that no exit is missed; the program process unblocks every signal).
pub(super) fn child_signals() -> Result<SignalFd, JailError> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGCHLD);
    set.thread_block()
        .map_err(|e| JailError::setup("block SIGCHLD", e))?;
    SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| JailError::setup("signalfd", e))
}

/// What init watches (see the module's text).
pub(super) struct Watch<'a> {
    pub spec: &'a JailSpec,
    pub control: &'a OwnedFd,
    /// The go pipe's write end (parked jails) until the go passed.
    pub go_w: Option<OwnedFd>,
    /// When init started: a run that is not parked counts from here.
    pub started: Instant,
    pub status: &'a File,
}

/// Ends init without a status: the server stopped the run (or is gone).
fn stop() -> ! {
    sys::exit_now(EXIT_REPORTED)
}

fn readable(fd: Option<&PollFd<'_>>) -> bool {
    fd.and_then(PollFd::revents).is_some_and(|r| !r.is_empty())
}

impl Watch<'_> {
    /// Watches until the program ends; returns its `finished` status (or
    /// the set-up failure it reported). Exits instead when the run is
    /// stopped.
    pub(super) fn run(self, exec_r: OwnedFd, program: Program) -> Result<StatusMsg, JailError> {
        let Watch {
            spec,
            control,
            mut go_w,
            started,
            status,
        } = self;
        let grace = |from: Instant, ms: u64| from + Duration::from_millis(ms) + BACKSTOP_GRACE;
        // a parked jail's wall time starts at its go
        let mut deadline = match go_w {
            Some(_) => None,
            None => Some(grace(started, spec.limits.wall_ms)),
        };
        let mut go_line = Vec::new();
        // A kernel's stdin: the control pipe's bytes after the go go there.
        let mut relay: Option<File> = None;
        let mut exec = Some(exec_r);
        let mut exec_buf = Vec::new();
        let mut failure = Vec::new();
        let mut child_end: Option<Ended> = None;
        let mut buf = vec![0u8; 64 * 1024];
        let parked_line = StatusMsg::Parked.to_line();
        loop {
            if exec.is_none()
                && let (Program::Child { .. }, Some((code, signal))) = (&program, child_end)
            {
                let usage = getrusage(UsageWho::RUSAGE_CHILDREN)
                    .map_err(|e| JailError::setup("getrusage", e))?;
                return Ok(StatusMsg::Finished {
                    code,
                    signal,
                    cpu_us: sys::timeval_micros(usage.user_time().as_ref())
                        + sys::timeval_micros(usage.system_time().as_ref()),
                });
            }
            let end_fd = match &program {
                Program::Remote { exit_r } => exec.is_none().then(|| exit_r.as_fd()),
                Program::Child { sigchld, .. } => Some(sigchld.as_fd()),
            };
            let mut fds = vec![PollFd::new(control.as_fd(), PollFlags::POLLIN)];
            let exec_at = exec.as_ref().map(|e| {
                fds.push(PollFd::new(e.as_fd(), PollFlags::POLLIN));
                fds.len() - 1
            });
            let end_at = end_fd.map(|fd| {
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
                fds.len() - 1
            });
            let timeout = match deadline {
                None => PollTimeout::NONE,
                Some(at) => {
                    let ms = at.saturating_duration_since(Instant::now()).as_millis();
                    PollTimeout::try_from(i32::try_from(ms).unwrap_or(i32::MAX))
                        .unwrap_or(PollTimeout::MAX)
                }
            };
            match poll(&mut fds, timeout) {
                // Wall time plus grace: the server should have stopped us.
                Ok(0) => stop(),
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(JailError::setup("poll", e)),
            }
            let control_ready = readable(fds.first());
            let exec_ready = readable(exec_at.and_then(|i| fds.get(i)));
            let end_ready = readable(end_at.and_then(|i| fds.get(i)));
            drop(fds);

            if control_ready {
                let n = match nix::unistd::read(control, &mut buf) {
                    Ok(0) => stop(),
                    Ok(n) => n,
                    Err(Errno::EINTR | Errno::EAGAIN) => continue,
                    Err(_) => stop(),
                };
                let bytes = &buf[..n];
                if let Some(to) = relay.as_mut() {
                    // a kernel that no longer reads (EPIPE: it is gone)
                    if to.write_all(bytes).is_err() {
                        stop();
                    }
                } else if let Some(w) = go_w.take() {
                    go_line.extend_from_slice(bytes);
                    let Some(i) = go_line.iter().position(|&b| b == b'\n') else {
                        if go_line.len() > GO_MAX_BYTES {
                            return Err(too_large());
                        }
                        go_w = Some(w);
                        continue;
                    };
                    let rest = go_line.split_off(i + 1);
                    if go_line.len() > GO_MAX_BYTES {
                        return Err(too_large());
                    }
                    let go: GoMsg = serde_json::from_slice(&go_line)
                        .map_err(|e| JailError::setup("parse go message", e))?;
                    deadline = Some(grace(Instant::now(), go.wall_ms));
                    let mut w = File::from(w);
                    // A jail that died meanwhile shows up as its exit.
                    let _ = w.write_all(&go_line);
                    go_line = Vec::new();
                    if go.kernel {
                        if !rest.is_empty() && w.write_all(&rest).is_err() {
                            stop();
                        }
                        relay = Some(w);
                    } else if !rest.is_empty() {
                        stop();
                    }
                } else {
                    // nothing else may come: the server stops the run
                    stop();
                }
            }

            if exec_ready && let Some(e) = exec.as_ref() {
                match nix::unistd::read(e, &mut buf) {
                    Ok(0) => {
                        // The program runs the user's code (or failed).
                        exec = None;
                        detach_stdio()?;
                        if !failure.is_empty() {
                            return Err(exec_failure(&failure));
                        }
                        if spec.park == Some(ParkMode::Prestart)
                            && matches!(program, Program::Child { .. })
                        {
                            // The pre-started runtime runs and reads the go
                            // on its stdin.
                            report(status, &StatusMsg::Parked);
                        }
                    }
                    Ok(n) => {
                        exec_buf.extend_from_slice(&buf[..n]);
                        while let Some(i) = exec_buf.iter().position(|&b| b == b'\n') {
                            let line: Vec<u8> = exec_buf.drain(..=i).collect();
                            if line == parked_line {
                                report(status, &StatusMsg::Parked);
                            } else {
                                failure.extend_from_slice(&line);
                            }
                        }
                    }
                    Err(Errno::EINTR | Errno::EAGAIN) => {}
                    Err(e) => return Err(JailError::setup("read exec pipe", e)),
                }
                if exec.is_none() {
                    // a last line without its newline
                    failure.append(&mut exec_buf);
                }
            }

            if end_ready {
                match &program {
                    Program::Remote { exit_r } => return remote_status(exit_r),
                    Program::Child { pid, sigchld } => {
                        // drain the signalfd, then reap every child that ended
                        while let Ok(Some(_)) = sigchld.read_signal() {}
                        if let Some(end) = reap(*pid)? {
                            child_end = Some(end);
                        }
                    }
                }
            }
        }
    }
}

fn too_large() -> JailError {
    JailError::Setup("go message too large or cut short".to_owned())
}

/// The fork-server's `finished` line for the program.
fn remote_status(exit_r: &OwnedFd) -> Result<StatusMsg, JailError> {
    let mut line = Vec::new();
    let copy = exit_r
        .try_clone()
        .map_err(|e| JailError::setup("read program status", e))?;
    BufReader::new(File::from(copy))
        .read_until(b'\n', &mut line)
        .map_err(|e| JailError::setup("read program status", e))?;
    match StatusMsg::parse_last(&line) {
        Some(msg @ StatusMsg::Finished { .. }) => Ok(msg),
        _ => Err(JailError::Setup(
            "the program ended without a status (is the fork-server gone?)".to_owned(),
        )),
    }
}

/// Reaps every child that has ended (orphans are re-parented to init);
/// returns the program's exit code or signal once it is among them.
fn reap(program: Pid) -> Result<Option<Ended>, JailError> {
    let mut ended = None;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == program => {
                ended = Some((Some(code), None));
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == program => {
                ended = Some((None, Some(sig as i32)));
            }
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return Ok(ended),
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(e) => return Err(JailError::setup("reap user program", e)),
        }
    }
}
