//! Server side of one run: spawns the helper with `tokio::process`, feeds it
//! the spec, captures stdout/stderr with caps, enforces the wall time and
//! cancellation by killing the helper (its death takes the whole jail down),
//! and collects the status line.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kiln_core::{ExitStatus, Limits};
use nix::fcntl::OFlag;
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, pipe2};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::process::Command;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::SandboxError;
use crate::spec::{JailSpec, STATUS_FD, StatusMsg};
use crate::sys;

/// One program to run in a jail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRequest {
    /// Host directory bound at `/mnt/data`: a directory directly below the
    /// slot's [`crate::Slot::workspace_parent`] (where the workspace quota
    /// applies), owned by the slot's `host_uid()`.
    pub workspace: PathBuf,
    /// Program and arguments; `argv[0]` is an absolute path inside the jail.
    pub argv: Vec<String>,
    /// The complete environment (nothing of the host's is added).
    pub env: Vec<(String, String)>,
    pub limits: Limits,
    /// Name of the seccomp profile (a file in `resources/seccomp/profiles/`).
    pub seccomp_profile: String,
}

impl Default for RunRequest {
    /// Nothing to run yet; the `default` seccomp profile and default limits.
    fn default() -> Self {
        RunRequest {
            workspace: PathBuf::new(),
            argv: Vec::new(),
            env: Vec::new(),
            limits: Limits::default(),
            seccomp_profile: crate::seccomp::DEFAULT_PROFILE.to_owned(),
        }
    }
}

/// How a run ended. Produced for every run that got as far as executing the
/// user program (and for runs killed by a limit before that).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunResult {
    /// Exit code or terminating signal of the user program; `Signal(9)` when
    /// the jail was killed (timeout, output cap).
    pub exit: ExitStatus,
    /// Captured output, at most `limits.stdout_bytes` / `stderr_bytes`.
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// The cap was exceeded: the jail was killed at once.
    pub stdout_overflow: bool,
    pub stderr_overflow: bool,
    /// The wall time was exceeded: the jail was killed.
    pub timed_out: bool,
    /// The memory cgroup's OOM killer fired.
    pub oom_killed: bool,
    /// From spawning the helper to its exit (includes jail setup).
    pub wall_time: Duration,
    /// User+system time of the jail's processes (absent if killed).
    pub cpu_time: Option<Duration>,
    /// Peak memory of the run's cgroup.
    pub memory_peak: Option<u64>,
}

/// Why the server killed a jail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KillReason {
    Timeout,
    StdoutOverflow,
    StderrOverflow,
    Cancelled,
}

/// Output captured up to a cap.
#[derive(Debug)]
pub(crate) struct Capture {
    pub buf: Vec<u8>,
    cap: usize,
    pub overflow: bool,
    eof: bool,
}

impl Capture {
    fn new(cap: usize) -> Capture {
        Capture {
            buf: Vec::with_capacity(cap.min(64 * 1024)),
            cap,
            overflow: false,
            eof: false,
        }
    }

    /// Appends what fits; `true` when this call exceeded the cap.
    fn push(&mut self, data: &[u8]) -> bool {
        if self.overflow {
            return false;
        }
        let room = self.cap.saturating_sub(self.buf.len());
        if data.len() > room {
            self.buf.extend_from_slice(&data[..room]);
            self.overflow = true;
            return true;
        }
        self.buf.extend_from_slice(data);
        false
    }
}

/// What [`supervise`] observed.
#[derive(Debug)]
pub(crate) struct Supervised {
    pub helper_exit: std::process::ExitStatus,
    pub status: Option<StatusMsg>,
    pub stdout: Capture,
    pub stderr: Capture,
    pub killed: Option<KillReason>,
    pub wall_time: Duration,
}

/// How long to wait for the output pipes to close once the helper exited
/// (the jail's processes die with it; this only guards against a leak).
const DRAIN: Duration = Duration::from_secs(5);
/// How long the helper gets to kill and reap the jail after its control
/// pipe closed, before it is SIGKILLed.
const HARD_KILL_AFTER: Duration = Duration::from_secs(2);
/// The status pipe carries a line or two.
const STATUS_CAP: usize = 64 * 1024;

async fn maybe_sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Waits for an optional future; pending forever when there is none.
async fn maybe<F: std::future::Future + Unpin>(f: &mut Option<F>) -> F::Output {
    match f {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

/// Runs the helper for `spec` to the end.
///
/// The helper's stdin carries the spec (one JSON line) and then stays open as
/// a control channel: closing it asks the helper to kill the jail and reap
/// it, so the jail's init never becomes an orphan zombie. SIGKILL of the
/// helper (the jail follows through PDEATHSIG) is the fallback when that
/// takes longer than [`HARD_KILL_AFTER`].
pub(crate) async fn supervise(
    helper: &Path,
    spec: &JailSpec,
    limits: &Limits,
    cancel: &CancellationToken,
) -> Result<Supervised, SandboxError> {
    let mut spec_line =
        serde_json::to_vec(spec).map_err(|e| SandboxError::Request(format!("encode spec: {e}")))?;
    spec_line.push(b'\n');
    // O_CLOEXEC: only the helper gets it, through the dup onto fd 3.
    let (status_r, status_w) = pipe2(OFlag::O_CLOEXEC)
        .map_err(|e| SandboxError::io("create status pipe", helper, e.into()))?;

    let mut cmd = Command::new(helper);
    // argv[0] is what the jail sees as /proc/1/cmdline: never the host path
    cmd.arg0("kiln")
        .arg("__jail")
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    sys::pass_fd_to_child(&mut cmd, status_w.as_raw_fd(), STATUS_FD);

    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|source| SandboxError::Spawn {
        path: helper.to_path_buf(),
        source,
    })?;
    drop(status_w);
    let pid = child.id().map(|p| Pid::from_raw(p as i32));
    let hard_kill = || {
        if let Some(pid) = pid {
            // The helper is not reaped before `wait` returns, so the pid is
            // still ours. Its death SIGKILLs the jail's init (PDEATHSIG),
            // which tears down the whole pid namespace.
            let _ = kill(pid, Signal::SIGKILL);
        }
    };

    let mut status_rx = pipe::Receiver::from_owned_fd(status_r)
        .map_err(|e| SandboxError::io("watch status pipe", helper, e))?;
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        hard_kill();
        return Err(SandboxError::Helper("helper pipes missing".to_owned()));
    };

    // Hands stdin back once the spec is written; it then is the control pipe.
    let mut write_spec = Some(Box::pin(async move {
        let r = stdin.write_all(&spec_line).await;
        (stdin, r)
    }));
    let mut control = None;
    let wall = tokio::time::sleep_until(started + limits.wall_time);
    tokio::pin!(wall);

    let mut out = Capture::new(limits.stdout_bytes);
    let mut err = Capture::new(limits.stderr_bytes);
    let mut status_bytes = Vec::new();
    let mut status_eof = false;
    let mut killed = None;
    let mut exited = None;
    let mut wall_time = Duration::ZERO;
    let mut hard_kill_at = None;
    let mut drain_until = None;
    let (mut obuf, mut ebuf, mut sbuf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024], [0u8; 1024]);

    // Asks the helper to kill the jail: closes the control pipe (or abandons
    // the spec write, which closes it too).
    macro_rules! stop {
        ($reason:expr) => {
            if killed.is_none() && exited.is_none() {
                killed = Some($reason);
                write_spec = None;
                control = None;
                hard_kill_at = Some(Instant::now() + HARD_KILL_AFTER);
            }
        };
    }

    loop {
        if exited.is_some() && out.eof && err.eof && status_eof {
            break;
        }
        tokio::select! {
            (stdin, r) = maybe(&mut write_spec) => {
                write_spec = None;
                match r {
                    Ok(()) => control = Some(stdin),
                    // The helper died before reading; its exit tells why.
                    Err(e) => tracing::debug!(error = %e, "writing the jail spec failed"),
                }
            }
            r = stdout.read(&mut obuf), if !out.eof => match r {
                Ok(0) | Err(_) => out.eof = true,
                Ok(n) => {
                    if out.push(&obuf[..n]) {
                        stop!(KillReason::StdoutOverflow);
                    }
                }
            },
            r = stderr.read(&mut ebuf), if !err.eof => match r {
                Ok(0) | Err(_) => err.eof = true,
                Ok(n) => {
                    if err.push(&ebuf[..n]) {
                        stop!(KillReason::StderrOverflow);
                    }
                }
            },
            r = status_rx.read(&mut sbuf), if !status_eof => match r {
                Ok(0) | Err(_) => status_eof = true,
                Ok(n) => {
                    let room = STATUS_CAP.saturating_sub(status_bytes.len());
                    status_bytes.extend_from_slice(&sbuf[..n.min(room)]);
                }
            },
            r = child.wait(), if exited.is_none() => {
                wall_time = started.elapsed();
                exited = Some(r.map_err(|e| SandboxError::io("wait for helper", helper, e))?);
                control = None;
                drain_until = Some(Instant::now() + DRAIN);
            }
            () = &mut wall, if killed.is_none() && exited.is_none() => {
                stop!(KillReason::Timeout);
            }
            () = cancel.cancelled(), if killed.is_none() && exited.is_none() => {
                stop!(KillReason::Cancelled);
            }
            () = maybe_sleep_until(hard_kill_at), if exited.is_none() => {
                tracing::warn!("jail helper did not stop within {HARD_KILL_AFTER:?}; killing it");
                hard_kill();
                hard_kill_at = None;
            }
            () = maybe_sleep_until(drain_until) => {
                tracing::warn!(
                    stdout_eof = out.eof, stderr_eof = err.eof, status_eof,
                    "jail output still open {DRAIN:?} after the helper exited"
                );
                break;
            }
        }
    }
    drop(control);
    let Some(helper_exit) = exited else {
        return Err(SandboxError::Helper("helper did not exit".to_owned()));
    };
    Ok(Supervised {
        helper_exit,
        status: StatusMsg::parse_last(&status_bytes),
        stdout: out,
        stderr: err,
        killed,
        wall_time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_the_prefix_and_flags_overflow_once() {
        let mut c = Capture::new(5);
        assert!(!c.push(b"abc"));
        assert!(!c.push(b"de"));
        assert!(!c.overflow, "exactly the cap is not an overflow");
        assert!(c.push(b"f"));
        assert!(!c.push(b"ghi"), "overflow is reported once");
        assert_eq!(c.buf, b"abcde");
        assert!(c.overflow);
    }

    #[test]
    fn capture_splits_a_chunk_at_the_cap() {
        let mut c = Capture::new(4);
        assert!(c.push(b"0123456789"));
        assert_eq!(c.buf, b"0123");
    }
}
