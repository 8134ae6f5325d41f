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
    /// Host directory bound at `/mnt/data`; must exist and be owned by the
    /// slot's `host_uid()`; every ancestor needs `o+x`.
    pub workspace: PathBuf,
    /// Program and arguments; `argv[0]` is an absolute path inside the jail.
    pub argv: Vec<String>,
    /// The complete environment (nothing of the host's is added).
    pub env: Vec<(String, String)>,
    pub limits: Limits,
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
/// The status pipe carries a line or two.
const STATUS_CAP: usize = 64 * 1024;

async fn maybe_sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs the helper for `spec` to the end.
pub(crate) async fn supervise(
    helper: &Path,
    spec: &JailSpec,
    limits: &Limits,
    cancel: &CancellationToken,
) -> Result<Supervised, SandboxError> {
    let spec_json =
        serde_json::to_vec(spec).map_err(|e| SandboxError::Request(format!("encode spec: {e}")))?;
    // O_CLOEXEC: only the helper gets it, through the dup onto fd 3.
    let (status_r, status_w) = pipe2(OFlag::O_CLOEXEC)
        .map_err(|e| SandboxError::io("create status pipe", helper, e.into()))?;

    let mut cmd = Command::new(helper);
    cmd.arg("__jail")
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
    let kill_helper = || {
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
        kill_helper();
        return Err(SandboxError::Helper("helper pipes missing".to_owned()));
    };

    let write_spec = async move {
        let r = stdin.write_all(&spec_json).await;
        drop(stdin);
        r
    };
    tokio::pin!(write_spec);
    let wall = tokio::time::sleep_until(started + limits.wall_time);
    tokio::pin!(wall);

    let mut out = Capture::new(limits.stdout_bytes);
    let mut err = Capture::new(limits.stderr_bytes);
    let mut status_bytes = Vec::new();
    let mut status_eof = false;
    let mut spec_written = false;
    let mut killed = None;
    let mut exited = None;
    let mut wall_time = Duration::ZERO;
    let mut drain_until = None;
    let (mut obuf, mut ebuf, mut sbuf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024], [0u8; 1024]);

    loop {
        if exited.is_some() && out.eof && err.eof && status_eof {
            break;
        }
        tokio::select! {
            r = &mut write_spec, if !spec_written => {
                spec_written = true;
                if let Err(e) = r {
                    // The helper died before reading; its exit tells why.
                    tracing::debug!(error = %e, "writing the jail spec failed");
                }
            }
            r = stdout.read(&mut obuf), if !out.eof => match r {
                Ok(0) | Err(_) => out.eof = true,
                Ok(n) => {
                    if out.push(&obuf[..n]) && killed.is_none() && exited.is_none() {
                        killed = Some(KillReason::StdoutOverflow);
                        kill_helper();
                    }
                }
            },
            r = stderr.read(&mut ebuf), if !err.eof => match r {
                Ok(0) | Err(_) => err.eof = true,
                Ok(n) => {
                    if err.push(&ebuf[..n]) && killed.is_none() && exited.is_none() {
                        killed = Some(KillReason::StderrOverflow);
                        kill_helper();
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
                drain_until = Some(Instant::now() + DRAIN);
            }
            () = &mut wall, if killed.is_none() && exited.is_none() => {
                killed = Some(KillReason::Timeout);
                kill_helper();
            }
            () = cancel.cancelled(), if killed.is_none() && exited.is_none() => {
                killed = Some(KillReason::Cancelled);
                kill_helper();
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
