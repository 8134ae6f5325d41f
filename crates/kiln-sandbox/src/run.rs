//! Server side of one run: spawns the helper with `tokio::process`, feeds it
//! the spec, captures stdout/stderr with caps, enforces the wall time and
//! cancellation by killing the helper (its death takes the whole jail down),
//! and collects the status line.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use kiln_core::{ExitStatus, Limits};
use nix::fcntl::OFlag;
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, pipe2};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::process::Command;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::SandboxError;
use crate::jail::keep::send_zygote;
use crate::launcher::{HelperFds, Via};
use crate::pause::PauseClock;
use crate::seqpacket;
use crate::spec::{JailSpec, STATUS_FD, StatusMsg, ZYGOTE_FD};
use crate::sys;

/// One program to run in a jail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRequest {
    /// Host directory bound at `/mnt/data`: a directory directly below the
    /// slot's [`crate::Slot::workspace_parent`] (where the workspace quota
    /// applies), owned by the slot's `host_uid()`.
    pub workspace: PathBuf,
    /// A persistent project's working copy, bound read-write at
    /// [`crate::PROJECT_DIR`] (`/workspace`), which becomes the program's
    /// working directory. Like `workspace`, a directory directly below the
    /// slot's workspace parent (the same quota), owned by the slot's
    /// `host_uid()`. `None`: no `/workspace`, the program starts in
    /// `/mnt/data`. Never with a parked jail (its mounts exist already).
    pub project: Option<PathBuf>,
    /// Program and arguments; `argv[0]` is an absolute path inside the jail.
    pub argv: Vec<String>,
    /// The complete environment (nothing of the host's is added).
    pub env: Vec<(String, String)>,
    pub limits: Limits,
    /// Name of the seccomp profile (a file in `resources/seccomp/profiles/`).
    pub seccomp_profile: String,
    /// Sees the program's output as it is captured, chunk by chunk, in
    /// order (only what fits under the caps: exactly the bytes the result
    /// holds).
    pub output: Option<OutputSink>,
    /// A services channel: the jail joins this network namespace, may
    /// create `AF_INET` stream sockets and connect to its one port. `None`
    /// (every run without an egress grant): no network at all.
    pub network: Option<crate::netns::JailNetwork>,
    /// A wall clock that stops while the run is paused (see `pause.rs`):
    /// paused time does not count against `limits.wall_time`. `None`: the
    /// wall time runs from the start to the end.
    pub pause: Option<crate::pause::PauseClock>,
    /// The language whose system (runtime image) the jail runs from (see
    /// `SandboxConfig::language_images`); `None`: the default one.
    pub language: Option<kiln_core::Language>,
}

impl Default for RunRequest {
    /// Nothing to run yet; the `default` seccomp profile and default limits.
    fn default() -> Self {
        RunRequest {
            workspace: PathBuf::new(),
            project: None,
            argv: Vec::new(),
            env: Vec::new(),
            limits: Limits::default(),
            seccomp_profile: crate::seccomp::DEFAULT_PROFILE.to_owned(),
            output: None,
            network: None,
            pause: None,
            language: None,
        }
    }
}

/// Which of the program's output streams a chunk comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

impl OutputStream {
    /// `"stdout"` or `"stderr"`: the stream's name on every wire.
    pub fn name(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }
}

/// The callback of an [`OutputSink`].
type OutputFn = dyn Fn(OutputStream, &[u8]) + Send + Sync;

/// Called with each chunk of output as the server reads it from the jail.
/// It runs on the task that supervises the jail: it must not block (append
/// to a buffer, notify, return).
#[derive(Clone)]
pub struct OutputSink(std::sync::Arc<OutputFn>);

impl OutputSink {
    pub fn new(f: impl Fn(OutputStream, &[u8]) + Send + Sync + 'static) -> OutputSink {
        OutputSink(std::sync::Arc::new(f))
    }

    /// Shows `data` to the callback (nothing for an empty chunk).
    pub fn call(&self, stream: OutputStream, data: &[u8]) {
        if !data.is_empty() {
            (self.0)(stream, data);
        }
    }
}

impl std::fmt::Debug for OutputSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutputSink")
    }
}

/// Two sinks are equal when they are the same callback.
impl PartialEq for OutputSink {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for OutputSink {}

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
    /// User+system time of every process of the jail: from the run's
    /// cgroup where the host accounts CPU per group (then also for killed
    /// runs; for a parked jail from the go on), else what the jail's init
    /// reaped (absent if killed).
    pub cpu_time: Option<Duration>,
    /// Peak memory of the run's cgroup.
    pub memory_peak: Option<u64>,
    /// How long the run waited because it had used its CPU quota
    /// (`SandboxConfig::cpu_per_run_millis`); `None` without a cpu
    /// controller.
    pub cpu_throttled: Option<Duration>,
}

impl Default for RunResult {
    /// An empty successful run (for tests and fakes of the sandbox).
    fn default() -> Self {
        RunResult {
            exit: ExitStatus::Code(0),
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_overflow: false,
            stderr_overflow: false,
            timed_out: false,
            oom_killed: false,
            wall_time: Duration::ZERO,
            cpu_time: None,
            memory_peak: None,
            cpu_throttled: None,
        }
    }
}

/// Why the server killed a jail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KillReason {
    Timeout,
    /// The jail as a whole (every process, paused or not) used its CPU
    /// budget ([`CpuBudget`]).
    CpuTime,
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

    /// Appends what fits, shows it to `sink`; `true` when this call
    /// exceeded the cap.
    fn push_to(&mut self, data: &[u8], stream: OutputStream, sink: Option<&OutputSink>) -> bool {
        let before = self.buf.len();
        let overflow = self.push(data);
        if let Some(sink) = sink {
            sink.call(stream, &self.buf[before..]);
        }
        overflow
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

/// What [`Started::drive`] observed.
#[derive(Debug)]
pub(crate) struct Supervised {
    /// How the helper process ended, in words.
    pub helper_exit: String,
    pub status: Option<StatusMsg>,
    pub stdout: Capture,
    pub stderr: Capture,
    pub killed: Option<KillReason>,
    pub wall_time: Duration,
    /// A kept jail whose run ended cleanly (`JailSpec::keep`): its init is
    /// alone in it and waits for the slot's next program. Dropped, it ends.
    pub kept: Option<Started>,
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

/// The server's ends of one helper's pipes.
struct ServerEnds {
    control: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    status: OwnedFd,
}

/// The helper's ends: its stdin (the control pipe: the spec line, then for
/// a parked jail the go line; closing it stops the jail), stdout, stderr and
/// the status pipe (fd 3). All `O_CLOEXEC` here, so concurrent spawns never
/// inherit them.
pub(crate) struct HelperPipes {
    pub control: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub status: OwnedFd,
}

fn make_pipes() -> std::io::Result<(ServerEnds, HelperPipes)> {
    let p = || pipe2(OFlag::O_CLOEXEC).map_err(std::io::Error::from);
    let (control_r, control_w) = p()?;
    let (stdout_r, stdout_w) = p()?;
    let (stderr_r, stderr_w) = p()?;
    let (status_r, status_w) = p()?;
    Ok((
        ServerEnds {
            control: control_w,
            stdout: stdout_r,
            stderr: stderr_r,
            status: status_r,
        },
        HelperPipes {
            control: control_r,
            stdout: stdout_w,
            stderr: stderr_w,
            status: status_w,
        },
    ))
}

/// The process the server follows for a jail: its init, cloned by the jail
/// launcher (a pidfd ties the server to it; the kernel reaps it for the
/// launcher), or a helper spawned by the server, the init's parent.
///
/// Dropped while it still runs (the run's future was dropped: a client
/// hung up), it ends the run the graceful way: the control pipe closes
/// with it, so the jail's init ends itself and with it the jail (a spawned
/// helper then reaps it), and only a process still there after
/// [`HARD_KILL_AFTER`] is killed, by a background task. Killing a spawned
/// helper at once would orphan the jail's init: a zombie for whoever
/// inherits it (the launcher reaps those; a server that is PID 1 would not).
pub(crate) struct HelperProc {
    /// `None` once handed to the background task.
    kind: Option<HelperKind>,
    exited: bool,
    /// Owned by the background task that ends it: dropped, kill at once.
    detached: bool,
}

enum HelperKind {
    Launched(AsyncFd<OwnedFd>),
    Spawned(tokio::process::Child),
}

impl HelperProc {
    pub(crate) fn launched(pidfd: AsyncFd<OwnedFd>) -> HelperProc {
        HelperProc {
            kind: Some(HelperKind::Launched(pidfd)),
            exited: false,
            detached: false,
        }
    }

    pub(crate) fn spawned(child: tokio::process::Child) -> HelperProc {
        HelperProc {
            kind: Some(HelperKind::Spawned(child)),
            exited: false,
            detached: false,
        }
    }

    /// SIGKILL: the init's death takes the jail down (a spawned helper's
    /// through the init's PDEATHSIG).
    pub(crate) fn kill(&self) {
        if self.exited {
            return;
        }
        match &self.kind {
            Some(HelperKind::Launched(pidfd)) => {
                let _ = sys::pidfd_kill(pidfd.get_ref());
            }
            // The helper is not reaped before `wait` returns, so the pid is
            // still ours.
            Some(HelperKind::Spawned(child)) => {
                if let Some(pid) = child.id() {
                    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                }
            }
            None => {}
        }
    }

    /// Waits for the helper's exit; describes how it ended.
    pub(crate) async fn wait(&mut self) -> std::io::Result<String> {
        let how = match &mut self.kind {
            Some(HelperKind::Launched(pidfd)) => {
                // A pidfd becomes readable once its process has exited.
                let _ready = pidfd.readable().await?;
                "exited (reaped by the jail launcher)".to_owned()
            }
            Some(HelperKind::Spawned(child)) => child.wait().await?.to_string(),
            None => "handed to the background".to_owned(),
        };
        self.exited = true;
        Ok(how)
    }

    /// Gives the helper [`HARD_KILL_AFTER`] to end, then kills it.
    async fn end_gracefully(mut self) {
        if tokio::time::timeout(HARD_KILL_AFTER, self.wait())
            .await
            .is_err()
        {
            tracing::warn!("jail helper did not stop within {HARD_KILL_AFTER:?}; killing it");
            self.kill();
            let _ = self.wait().await;
        }
    }
}

impl Drop for HelperProc {
    fn drop(&mut self) {
        if self.exited {
            return;
        }
        let runtime = tokio::runtime::Handle::try_current();
        match runtime {
            Ok(handle) if !self.detached => {
                let rest = HelperProc {
                    kind: self.kind.take(),
                    exited: false,
                    detached: true,
                };
                handle.spawn(rest.end_gracefully());
            }
            _ => self.kill(),
        }
    }
}

/// A helper that is running: its process and the server's pipe ends.
pub(crate) struct Started {
    path: PathBuf,
    proc: HelperProc,
    control: Option<pipe::Sender>,
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
    status: pipe::Receiver,
    /// Status bytes read while waiting for `parked`.
    status_bytes: Vec<u8>,
    /// A kept jail (`JailSpec::keep`): its run ends with its init's
    /// `finished` line, not with its init.
    keep: bool,
    /// A kept jail's: the server's end of the channel on which its init
    /// gets a fork-server socket for each program (`jail/keep.rs`).
    zygotes: Option<OwnedFd>,
}

impl std::fmt::Debug for Started {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Started").field("path", &self.path).finish()
    }
}

/// A running helper taken apart (see [`Started::into_parts`]).
pub(crate) struct StartedParts {
    pub proc: HelperProc,
    pub control: Option<pipe::Sender>,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    pub status: pipe::Receiver,
}

/// Starts a jail helper: forked by `launcher` when there is one that
/// answers, else spawned as `helper __jail` (argv[0] is what the jail sees
/// as /proc/1/cmdline: never the host path) with a cleared environment.
/// `zygote` is a socket to the fork-server, handed to the helper on
/// [`ZYGOTE_FD`] (embedded warm jails: the fork-server forks their program).
pub(crate) async fn start_helper(
    helper: &Path,
    launcher: Option<Via<'_>>,
    zygote: Option<OwnedFd>,
    spec_line: &[u8],
    keep: bool,
) -> Result<Started, SandboxError> {
    let (ends, child_ends) =
        make_pipes().map_err(|e| SandboxError::io("create helper pipes", helper, e))?;
    if let Some(Via {
        launcher,
        slot_mount,
    }) = launcher.filter(|v| v.launcher.alive())
    {
        // a kept jail's init holds no fork-server socket while its program
        // runs: it gets one for each program on a channel (`jail/keep.rs`),
        // the first one already on it
        let channel = match (keep, &zygote) {
            (true, Some(z)) => Some(zygote_channel(z).map_err(|e| {
                SandboxError::Zygote(format!("hand a kept jail the fork-server: {e}"))
            })?),
            _ => None,
        };
        let fds = HelperFds {
            control: &child_ends.control,
            stdout: &child_ends.stdout,
            stderr: &child_ends.stderr,
            status: &child_ends.status,
            zygote: match &channel {
                Some((_, init)) => Some(init),
                None => zygote.as_ref(),
            },
        };
        match launcher
            .launch(&fds, spec_line, slot_mount.as_deref())
            .await
        {
            Ok(pidfd) => {
                // The jail's init has its own copies: EOF and SIGPIPE work.
                drop(child_ends);
                drop(zygote);
                let pidfd = sys::async_readable(pidfd)
                    .map_err(|e| SandboxError::io("watch jail init pidfd", helper, e))?;
                let proc = HelperProc::launched(pidfd);
                let mut started = Started::new(helper, proc, ends)?;
                started.keep = keep;
                started.zygotes = channel.map(|(server, _)| server);
                return Ok(started);
            }
            Err(e @ SandboxError::Setup(_)) => return Err(e),
            Err(e) => tracing::warn!(error = %e, "spawning the jail helper instead"),
        }
    }
    let mut cmd = Command::new(helper);
    cmd.arg0("kiln")
        .arg("__jail")
        .env_clear()
        .stdin(Stdio::from(child_ends.control))
        .stdout(Stdio::from(child_ends.stdout))
        .stderr(Stdio::from(child_ends.stderr))
        .kill_on_drop(true);
    sys::pass_fd_to_child(&mut cmd, child_ends.status.as_raw_fd(), STATUS_FD);
    if let Some(z) = &zygote {
        sys::pass_fd_to_child(&mut cmd, z.as_raw_fd(), ZYGOTE_FD);
    }
    let child = cmd.spawn().map_err(|source| SandboxError::Spawn {
        path: helper.to_path_buf(),
        source,
    })?;
    // `cmd` still holds the status pipe's write end: gone with it.
    drop(cmd);
    drop(child_ends.status);
    drop(zygote);
    let mut started = Started::new(helper, HelperProc::spawned(child), ends)?;
    // A spawned helper reads the spec on its stdin, the control pipe; it
    // waits for its init's end, so its jail is never kept.
    match keep {
        true => started.send_line(&unkept(spec_line)?).await,
        false => started.send_line(spec_line).await,
    }
    Ok(started)
}

/// A kept jail's fork-server channel (`jail/keep.rs`): the server's end
/// and the init's, with a socket to the fork-server for the first program
/// already on it.
fn zygote_channel(zygote: &OwnedFd) -> nix::Result<(OwnedFd, OwnedFd)> {
    let (server, init) = seqpacket::pair()?;
    send_zygote(&server, zygote)?;
    Ok((server, init))
}

/// `spec_line` (a kept jail's) with `keep` off.
fn unkept(spec_line: &[u8]) -> Result<Vec<u8>, SandboxError> {
    let encode = |e: serde_json::Error| SandboxError::Request(format!("encode spec: {e}"));
    let mut spec: crate::spec::JailSpec = serde_json::from_slice(spec_line).map_err(encode)?;
    spec.keep = false;
    let mut line = serde_json::to_vec(&spec).map_err(encode)?;
    line.push(b'\n');
    Ok(line)
}

/// Reads what is in `rx` now into `capture` (every writer but a kept
/// jail's init is gone, so nothing more comes); `true` on an overflow.
fn drain_now(
    rx: &pipe::Receiver,
    capture: &mut Capture,
    stream: OutputStream,
    sink: Option<&OutputSink>,
    buf: &mut [u8],
) -> bool {
    let mut overflow = false;
    while let Ok(n @ 1..) = rx.try_read(buf) {
        overflow |= capture.push_to(&buf[..n], stream, sink);
    }
    overflow
}

impl Started {
    fn new(path: &Path, proc: HelperProc, ends: ServerEnds) -> Result<Started, SandboxError> {
        let io = |what: &'static str, e| SandboxError::io(what, path, e);
        Ok(Started {
            path: path.to_path_buf(),
            proc,
            control: Some(
                pipe::Sender::from_owned_fd(ends.control).map_err(|e| io("watch control", e))?,
            ),
            stdout: pipe::Receiver::from_owned_fd(ends.stdout)
                .map_err(|e| io("watch stdout", e))?,
            stderr: pipe::Receiver::from_owned_fd(ends.stderr)
                .map_err(|e| io("watch stderr", e))?,
            status: pipe::Receiver::from_owned_fd(ends.status)
                .map_err(|e| io("watch status", e))?,
            status_bytes: Vec::new(),
            keep: false,
            zygotes: None,
        })
    }

    /// Writes one line on the control pipe. A helper that died meanwhile
    /// shows up later as its exit.
    pub(crate) async fn send_line(&mut self, line: &[u8]) {
        if let Some(control) = self.control.as_mut()
            && let Err(e) = control.write_all(line).await
        {
            tracing::debug!(error = %e, "writing to the jail helper failed");
        }
    }

    /// Hands a kept jail (`JailSpec::keep`) a fresh program: its init
    /// checks the jail as new and has the program forked by the fork-server
    /// on `zygote` (a socket it drops once the program is forked); waits
    /// until it is parked. Fails (and the jail ends) when the init found
    /// anything left or the program could not be had.
    pub(crate) async fn again(&mut self, zygote: OwnedFd) -> Result<(), SandboxError> {
        let Some(channel) = &self.zygotes else {
            return Err(SandboxError::Helper("not a kept jail".to_owned()));
        };
        send_zygote(channel, &zygote)
            .map_err(|e| SandboxError::Helper(format!("hand the kept jail a fork-server: {e}")))?;
        drop(zygote);
        self.status_bytes.clear();
        self.send_line(crate::jail::keep::AGAIN).await;
        self.wait_parked().await
    }

    /// The process and the pipes, for a driver other than [`Started::drive`]
    /// (a kernel's: `kernel.rs`).
    pub(crate) fn into_parts(self) -> StartedParts {
        StartedParts {
            proc: self.proc,
            control: self.control,
            stdout: self.stdout,
            stderr: self.stderr,
            status: self.status,
        }
    }

    /// Waits until the jail reports `parked`. Fails with the jail's own
    /// report when it ends first (or with what the helper printed).
    pub(crate) async fn wait_parked(&mut self) -> Result<(), SandboxError> {
        let mut buf = [0u8; 1024];
        loop {
            if self
                .status_bytes
                .split(|b| *b == b'\n')
                .any(|l| serde_json::from_slice::<StatusMsg>(l).ok() == Some(StatusMsg::Parked))
            {
                return Ok(());
            }
            match self.status.read(&mut buf).await {
                Ok(n) if n > 0 && self.status_bytes.len() < STATUS_CAP => {
                    self.status_bytes.extend_from_slice(&buf[..n]);
                }
                _ => break,
            }
        }
        // The jail ended before it parked: tell why.
        self.control = None;
        let mut err = Vec::new();
        let _ = tokio::time::timeout(DRAIN, async {
            let _ = (&mut self.stderr)
                .take(STATUS_CAP as u64)
                .read_to_end(&mut err)
                .await;
        })
        .await;
        let exit = tokio::time::timeout(HARD_KILL_AFTER, self.proc.wait()).await;
        if exit.is_err() {
            self.proc.kill();
        }
        Err(match StatusMsg::parse_last(&self.status_bytes) {
            Some(StatusMsg::Error(m)) => SandboxError::Setup(m),
            Some(StatusMsg::ExecFailed(m)) => SandboxError::Exec(m),
            _ => SandboxError::Helper(format!(
                "the jail ended before it parked (stderr: {})",
                String::from_utf8_lossy(&err).trim()
            )),
        })
    }

    /// Sends the go (if any) and supervises the run to the end: captures
    /// output with caps, enforces the wall time from now on, kills on
    /// cancellation, and collects the status.
    ///
    /// Closing the control pipe asks the jail's init to end itself (and a
    /// spawned helper to reap it, so it never becomes an orphan zombie).
    /// SIGKILL of the init (or of the helper: the jail follows through
    /// PDEATHSIG) is the fallback when that
    /// takes longer than [`HARD_KILL_AFTER`].
    ///
    /// With a `pause` clock the wall time stops while it is paused (the
    /// CPU budget does not: CPU used while paused counts).
    pub(crate) async fn drive(
        mut self,
        go: Option<&[u8]>,
        limits: &Limits,
        cancel: &CancellationToken,
        sink: Option<&OutputSink>,
        pause: Option<&PauseClock>,
        budget: Option<&CpuBudget>,
    ) -> Result<Supervised, SandboxError> {
        let started = Instant::now();
        if let Some(go) = go {
            self.send_line(go).await;
        }
        let Started {
            path,
            mut proc,
            mut control,
            mut stdout,
            mut stderr,
            status: mut status_rx,
            mut status_bytes,
            keep,
            zygotes,
        } = self;
        let deadline = || match pause {
            Some(p) => p.deadline(started, limits.wall_time),
            None => started + limits.wall_time,
        };
        let mut pause_rx = pause.map(PauseClock::subscribe);
        let wall = tokio::time::sleep_until(deadline());
        tokio::pin!(wall);
        let mut cpu_poll = tokio::time::interval(CPU_POLL);
        cpu_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

        let mut out = Capture::new(limits.stdout_bytes);
        let mut err = Capture::new(limits.stderr_bytes);
        let mut status_eof = false;
        let mut killed = None;
        let mut exited = None;
        let mut wall_time = Duration::ZERO;
        let mut hard_kill_at = None;
        let mut drain_until = None;
        let (mut obuf, mut ebuf, mut sbuf) =
            (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024], [0u8; 1024]);

        // Asks the helper to kill the jail: closes the control pipe.
        macro_rules! stop {
            ($reason:expr) => {
                if killed.is_none() && exited.is_none() {
                    killed = Some($reason);
                    control = None;
                    hard_kill_at = Some(Instant::now() + HARD_KILL_AFTER);
                }
            };
        }

        let mut kept = false;
        loop {
            if keep
                && exited.is_none()
                && killed.is_none()
                && status_bytes.ends_with(b"\n")
                && matches!(
                    StatusMsg::parse_last(&status_bytes),
                    Some(StatusMsg::Finished { .. })
                )
            {
                // A kept jail's init reports only once every other process
                // of the jail is dead: what they wrote is in the pipes.
                wall_time = started.elapsed();
                let o = drain_now(&stdout, &mut out, OutputStream::Stdout, sink, &mut obuf);
                let e = drain_now(&stderr, &mut err, OutputStream::Stderr, sink, &mut ebuf);
                if o {
                    killed = Some(KillReason::StdoutOverflow);
                } else if e {
                    killed = Some(KillReason::StderrOverflow);
                }
                kept = true;
                exited = Some("kept for its slot's next run".to_owned());
                break;
            }
            if exited.is_some() && out.eof && err.eof && status_eof {
                break;
            }
            tokio::select! {
                r = stdout.read(&mut obuf), if !out.eof => match r {
                    Ok(0) | Err(_) => out.eof = true,
                    Ok(n) => {
                        if out.push_to(&obuf[..n], OutputStream::Stdout, sink) {
                            stop!(KillReason::StdoutOverflow);
                        }
                    }
                },
                r = stderr.read(&mut ebuf), if !err.eof => match r {
                    Ok(0) | Err(_) => err.eof = true,
                    Ok(n) => {
                        if err.push_to(&ebuf[..n], OutputStream::Stderr, sink) {
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
                r = proc.wait(), if exited.is_none() => {
                    wall_time = started.elapsed();
                    exited = Some(r.map_err(|e| SandboxError::io("wait for helper", &path, e))?);
                    control = None;
                    drain_until = Some(Instant::now() + DRAIN);
                }
                () = &mut wall, if killed.is_none() && exited.is_none() => {
                    stop!(KillReason::Timeout);
                }
                _ = cpu_poll.tick(), if budget.is_some() && killed.is_none() && exited.is_none() => {
                    if budget.is_some_and(CpuBudget::spent) {
                        stop!(KillReason::CpuTime);
                    }
                }
                () = crate::pause::changed(&mut pause_rx), if killed.is_none() && exited.is_none() => {
                    wall.as_mut().reset(deadline());
                }
                () = cancel.cancelled(), if killed.is_none() && exited.is_none() => {
                    stop!(KillReason::Cancelled);
                }
                () = maybe_sleep_until(hard_kill_at), if exited.is_none() => {
                    tracing::warn!("jail helper did not stop within {HARD_KILL_AFTER:?}; killing it");
                    proc.kill();
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
        let Some(helper_exit) = exited else {
            return Err(SandboxError::Helper("helper did not exit".to_owned()));
        };
        let status = StatusMsg::parse_last(&status_bytes);
        let kept = match control {
            Some(control) if kept => Some(Started {
                path,
                proc,
                control: Some(control),
                stdout,
                stderr,
                status: status_rx,
                status_bytes: Vec::new(),
                keep,
                zygotes,
            }),
            _ => None,
        };
        Ok(Supervised {
            helper_exit,
            status,
            stdout: out,
            stderr: err,
            killed,
            wall_time,
            kept,
        })
    }
}

/// Runs the helper for `spec` to the end (a jail built for this run only).
#[allow(clippy::too_many_arguments)] // what `drive` takes, plus the helper and its spec
pub(crate) async fn supervise(
    helper: &Path,
    launcher: Option<Via<'_>>,
    spec: &JailSpec,
    limits: &Limits,
    cancel: &CancellationToken,
    sink: Option<&OutputSink>,
    pause: Option<&PauseClock>,
    budget: Option<&CpuBudget>,
) -> Result<Supervised, SandboxError> {
    let mut spec_line =
        serde_json::to_vec(spec).map_err(|e| SandboxError::Request(format!("encode spec: {e}")))?;
    spec_line.push(b'\n');
    let started = start_helper(helper, launcher, None, &spec_line, false).await?;
    started
        .drive(None, limits, cancel, sink, pause, budget)
        .await
}

/// How often a run's CPU counter is read against its budget.
const CPU_POLL: Duration = Duration::from_millis(100);

/// A run's CPU budget for the whole jail: `limits.cpu_time` of CPU over
/// every process in its cgroup, read from the group's counter. RLIMIT_CPU
/// bounds each process alone, so a chain of forks (each under its own
/// limit) or a program computing while its wall clock is paused could
/// otherwise use far more; past the budget the jail is killed and the run
/// reports SIGXCPU, as RLIMIT_CPU's would.
#[derive(Debug, Clone)]
pub(crate) struct CpuBudget {
    meter: crate::cgroup::CpuMeter,
    limit: Duration,
}

impl CpuBudget {
    pub(crate) fn new(meter: crate::cgroup::CpuMeter, limit: Duration) -> CpuBudget {
        CpuBudget { meter, limit }
    }

    /// Whether the jail used more than its budget.
    fn spent(&self) -> bool {
        self.meter.used().is_some_and(|used| used > self.limit)
    }
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
    fn the_sink_sees_exactly_what_is_captured() {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let s2 = std::sync::Arc::clone(&seen);
        let sink = OutputSink::new(move |stream, data| {
            s2.lock().unwrap().push((stream, data.to_vec()));
        });
        let mut c = Capture::new(5);
        assert!(!c.push_to(b"abc", OutputStream::Stderr, Some(&sink)));
        assert!(c.push_to(b"defg", OutputStream::Stderr, Some(&sink)));
        assert!(!c.push_to(b"h", OutputStream::Stderr, Some(&sink)));
        let seen = seen.lock().unwrap();
        assert_eq!(
            *seen,
            [
                (OutputStream::Stderr, b"abc".to_vec()),
                (OutputStream::Stderr, b"de".to_vec())
            ]
        );
    }

    #[test]
    fn capture_splits_a_chunk_at_the_cap() {
        let mut c = Capture::new(4);
        assert!(c.push(b"0123456789"));
        assert_eq!(c.buf, b"0123");
    }
}
