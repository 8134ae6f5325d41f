//! Kernels: jails whose program is a long-lived interpreter evaluating
//! framed requests (a session's live state).
//!
//! A kernel is a parked jail (for `py`, a fork of a fork-server template:
//! creating one imports nothing) that gets a *kernel* go: the helper keeps
//! the go pipe open as the program's stdin and relays every later byte of
//! the control pipe to it. Frames both ways are `kind(1) + length(4, BE) +
//! payload`; the program (`kiln-core/src/lang/warm/python_kernel.py`)
//! answers on stdout with the evaluation's stdout (`o`) and stderr (`e`)
//! and one reply (`r`, JSON) per evaluation.
//!
//! Memory and pids limits are the kernel's cgroups', for its whole life;
//! each evaluation's usage is a difference of the groups' counters (CPU),
//! a peak window (memory) and its own clock (wall). A timeout interrupts
//! the evaluation (`i`: SIGINT in the kernel, which keeps its state); a
//! kernel that does not answer within the grace period is killed. A kernel
//! that dies for any reason is *lost*, with the reason, for good.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln_core::Limits;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::time::Instant;

use crate::cgroup::RunCgroups;
use crate::error::SandboxError;
use crate::run::{HelperProc, OutputSink, OutputStream, RunRequest, StartedParts};
use crate::sandbox::{Going, ParkSpec, Sandbox};
use crate::slots::{Slot, SlotLease};
use crate::spec::ParkMode;

/// Largest frame the server accepts from a kernel.
const MAX_FRAME: usize = 16 * 1024 * 1024;
/// How long a new kernel may take to say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How much of a kernel's own stderr is kept (to say why it died).
const STDERR_TAIL: usize = 4096;

/// How to start a kernel.
#[derive(Debug, Clone)]
pub struct KernelStart {
    /// How its jail is parked ([`ParkMode::Embedded`] for `py`, with the
    /// kernel program among its `etc_files`).
    pub park: ParkSpec,
    /// The kernel program and its environment (as a go's).
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The kernel's limits as a whole: memory, pids, files; `wall_time` is
    /// its longest life and `cpu_time` its CPU over that life (RLIMIT_CPU).
    pub limits: Limits,
}

/// Why a kernel is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelLost {
    /// The memory cgroup's OOM killer took it.
    OutOfMemory,
    /// An evaluation ran past its timeout and the interrupt was not
    /// obeyed within the grace period: the kernel was killed.
    Unresponsive,
    /// It was closed (by its owner or the registry).
    Closed,
    /// It ended by itself (`exit()`, a crash); what it printed last.
    Exited(String),
}

impl std::fmt::Display for KernelLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KernelLost::OutOfMemory => f.write_str("out of memory"),
            KernelLost::Unresponsive => {
                f.write_str("the evaluation ignored its interrupt and the kernel was killed")
            }
            KernelLost::Closed => f.write_str("closed"),
            KernelLost::Exited(tail) if tail.is_empty() => f.write_str("the kernel exited"),
            KernelLost::Exited(tail) => write!(f, "the kernel exited: {tail}"),
        }
    }
}

/// Why an evaluation has no result.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The kernel is gone (now or before); its session is over.
    #[error("session lost: {0}")]
    Lost(KernelLost),
    /// The kernel broke the protocol (a frame too large, a reply that is
    /// not JSON): it is killed.
    #[error("kernel protocol: {0}")]
    Protocol(String),
}

/// An error an evaluation raised (Jupyter's `ename`/`evalue`/`traceback`,
/// without the kernel's own frames).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EvalError {
    pub ename: String,
    pub evalue: String,
    pub traceback: Vec<String>,
}

/// A file under `/mnt/data` that an evaluation created or changed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EvalFile {
    /// Relative to `/mnt/data`, `/`-separated.
    pub path: String,
    pub size: u64,
}

/// What one evaluation did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvalResult {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// More was written than the caps keep.
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// `repr()` of the value of a final expression statement (`py`; for
    /// `js`, `util.inspect` of the completion value).
    pub value: Option<String>,
    /// That value as a PNG image, base64 (Jupyter's `image/png`): a
    /// matplotlib figure or axes, or an object with `_repr_png_`.
    pub value_png: Option<String>,
    pub error: Option<EvalError>,
    pub files: Vec<EvalFile>,
    /// The timeout interrupted it (the kernel lives on).
    pub timed_out: bool,
    pub wall_time: Duration,
    /// CPU of every process of the kernel during the evaluation.
    pub cpu_time: Option<Duration>,
    /// Peak memory of the kernel during the evaluation (the kernel's
    /// lifetime peak where the host cannot open a window).
    pub memory_peak: Option<u64>,
}

/// Limits of one evaluation.
#[derive(Debug, Clone, Copy)]
pub struct EvalLimits {
    pub timeout: Duration,
    /// How long an interrupted evaluation may take to come back.
    pub grace: Duration,
    pub stdout_bytes: usize,
    pub stderr_bytes: usize,
}

#[derive(Debug, Deserialize)]
struct Reply {
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    png: Option<String>,
    #[serde(default)]
    error: Option<EvalError>,
    #[serde(default)]
    files: Vec<EvalFile>,
}

/// The kernel's stdout and the bytes read of the next frame.
struct Frames {
    stdout: pipe::Receiver,
    buf: Vec<u8>,
}

impl Frames {
    /// The next frame; `None` at EOF (the kernel is gone). Cancel-safe:
    /// what was read stays in `buf`.
    async fn next(&mut self) -> Result<Option<(u8, Vec<u8>)>, KernelError> {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if len > MAX_FRAME {
                    return Err(KernelError::Protocol(format!("frame of {len} bytes")));
                }
                if self.buf.len() >= 5 + len {
                    let kind = self.buf[0];
                    let payload = self.buf[5..5 + len].to_vec();
                    self.buf.drain(..5 + len);
                    return Ok(Some((kind, payload)));
                }
            }
            match self.stdout.read(&mut chunk).await {
                Ok(0) | Err(_) => return Ok(None),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut v = Vec::with_capacity(5 + payload.len());
    v.push(kind);
    v.extend_from_slice(&len.to_be_bytes());
    v.extend_from_slice(payload);
    v
}

/// Keeps at most `cap` bytes; `true` once something was cut.
fn keep(buf: &mut Vec<u8>, data: &[u8], cap: usize) -> (usize, bool) {
    let room = cap.saturating_sub(buf.len());
    let n = data.len().min(room);
    buf.extend_from_slice(&data[..n]);
    (n, n < data.len())
}

/// A live kernel. Dropping it kills the jail (its cgroups are removed in
/// the background); [`Kernel::close`] does it in order.
pub struct Kernel {
    name: String,
    workspace: PathBuf,
    control: tokio::sync::Mutex<Option<pipe::Sender>>,
    frames: tokio::sync::Mutex<Frames>,
    proc: Mutex<Option<HelperProc>>,
    cgroups: Mutex<Option<RunCgroups>>,
    lease: Mutex<Option<SlotLease>>,
    lost: Mutex<Option<KernelLost>>,
    stderr_tail: Arc<Mutex<Vec<u8>>>,
    pid: u32,
    /// How long building and parking the jail took, and then until the
    /// kernel said it was ready.
    park_time: Duration,
    ready_time: Duration,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel").field("name", &self.name).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sandbox {
    /// Starts a kernel under `slot`: parks a jail for `start.park`, sends
    /// the kernel go and waits until the program says it is ready. Its
    /// workspace is a new empty directory of the slot (gone with the slot).
    pub async fn start_kernel(
        &self,
        slot: &Slot,
        start: KernelStart,
    ) -> Result<Kernel, SandboxError> {
        self.start_kernel_as(slot, start, false).await
    }

    /// [`Sandbox::start_kernel`] for a kernel started ahead of any create
    /// (the kernel pool's refill): its jail is built, its program starts
    /// and it waits at idle CPU priority (`RunCgroups::set_ahead`), so a
    /// create that starts its own kernel meanwhile is not slowed by it. It
    /// runs at normal priority from [`Kernel::run_at_normal_priority`]
    /// (when it is taken) or its first evaluation, whichever comes first.
    pub async fn start_kernel_ahead(
        &self,
        slot: &Slot,
        start: KernelStart,
    ) -> Result<Kernel, SandboxError> {
        self.start_kernel_as(slot, start, true).await
    }

    async fn start_kernel_as(
        &self,
        slot: &Slot,
        start: KernelStart,
        ahead: bool,
    ) -> Result<Kernel, SandboxError> {
        let jail = self
            .park_as(slot, &start.park, &start.limits, None, ahead)
            .await?;
        let park_time = jail.build_time();
        let t_go = Instant::now();
        let req = RunRequest {
            workspace: jail.workspace().to_path_buf(),
            argv: start.argv,
            env: start.env,
            limits: start.limits,
            ..RunRequest::default()
        };
        let Going {
            name,
            workspace,
            mut started,
            mut cgroups,
            lease,
            line,
        } = self.go(jail, &req, true).await?;
        // the go ran it at normal priority; a kernel started ahead boots
        // and waits idle until it is taken
        if ahead && let Some(c) = cgroups.as_mut() {
            c.set_ahead(true);
        }
        started.send_line(&line).await;
        let StartedParts {
            proc,
            control,
            stdout,
            stderr,
            status,
        } = started.into_parts();
        let stderr_tail = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(drain_diagnostics(stderr, status, Arc::clone(&stderr_tail)));
        let mut frames = Frames {
            stdout,
            buf: Vec::new(),
        };
        let ready = tokio::time::timeout(READY_WITHIN, frames.next()).await;
        let mut kernel = Kernel {
            name,
            workspace,
            control: tokio::sync::Mutex::new(control),
            frames: tokio::sync::Mutex::new(frames),
            proc: Mutex::new(Some(proc)),
            cgroups: Mutex::new(cgroups),
            lease: Mutex::new(lease),
            lost: Mutex::new(None),
            stderr_tail,
            pid: 0,
            park_time,
            ready_time: t_go.elapsed(),
        };
        let failed = match ready {
            Ok(Ok(Some((b'r', payload)))) => {
                #[derive(Deserialize)]
                struct Ready {
                    ready: bool,
                    #[serde(default)]
                    pid: u32,
                }
                match serde_json::from_slice::<Ready>(&payload) {
                    Ok(r) if r.ready => {
                        kernel.pid = r.pid;
                        None
                    }
                    _ => Some("the kernel's first frame is not `ready`".to_owned()),
                }
            }
            Ok(Ok(Some((kind, _)))) => Some(format!("the kernel's first frame is {kind:?}")),
            Ok(Ok(None)) => Some("the kernel ended before it was ready".to_owned()),
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!("the kernel was not ready within {READY_WITHIN:?}")),
        };
        if let Some(why) = failed {
            let lost = kernel.end(None).await;
            return Err(SandboxError::Setup(format!("{why} ({lost})")));
        }
        tracing::debug!(kernel = %kernel.name, "kernel ready");
        Ok(kernel)
    }
}

/// Keeps the tail of the kernel's own stderr and drains its status pipe
/// (the jail's init reports there when the kernel ends).
async fn drain_diagnostics(
    mut stderr: pipe::Receiver,
    mut status: pipe::Receiver,
    tail: Arc<Mutex<Vec<u8>>>,
) {
    let mut buf = vec![0u8; 4096];
    let mut sbuf = [0u8; 1024];
    let (mut err_eof, mut status_eof) = (false, false);
    while !(err_eof && status_eof) {
        tokio::select! {
            r = stderr.read(&mut buf), if !err_eof => match r {
                Ok(0) | Err(_) => err_eof = true,
                Ok(n) => {
                    let mut t = lock(&tail);
                    t.extend_from_slice(&buf[..n]);
                    let over = t.len().saturating_sub(STDERR_TAIL);
                    t.drain(..over);
                }
            },
            r = status.read(&mut sbuf), if !status_eof => if matches!(r, Ok(0) | Err(_)) {
                status_eof = true;
            },
        }
    }
}

impl Kernel {
    /// Host path of the kernel's `/mnt/data`.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// The kernel program's pid inside its jail.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How long its start took: building and parking the jail, then the
    /// go until the kernel said it was ready.
    pub fn start_times(&self) -> (Duration, Duration) {
        (self.park_time, self.ready_time)
    }

    /// Memory its cgroup holds now, bytes (the kernel's variables, its
    /// imported modules, its `/tmp`); `None` once it is gone or where the
    /// host cannot say.
    pub fn memory_now(&self) -> Option<u64> {
        lock(&self.cgroups).as_ref().and_then(|c| c.memory_now())
    }

    /// Why the kernel is gone, once it is.
    pub fn lost(&self) -> Option<KernelLost> {
        lock(&self.lost).clone()
    }

    /// A kernel started ahead ([`Sandbox::start_kernel_ahead`]) runs at
    /// normal CPU priority from now on: its create took it. Nothing for
    /// any other kernel.
    pub fn run_at_normal_priority(&self) {
        if let Some(c) = lock(&self.cgroups).as_mut() {
            c.set_ahead(false);
        }
    }

    /// Whether its CPU group runs at idle priority now (its `cpu.idle`);
    /// `None` where the host has no `cpu.idle` or the kernel is gone.
    pub fn at_idle_priority(&self) -> Option<bool> {
        lock(&self.cgroups).as_ref().and_then(|c| c.idle_now())
    }

    /// Evaluates `code`, showing its output to `sink` as it arrives.
    pub async fn eval(
        &self,
        code: &str,
        limits: EvalLimits,
        sink: Option<&OutputSink>,
    ) -> Result<EvalResult, KernelError> {
        if let Some(lost) = self.lost() {
            return Err(KernelError::Lost(lost));
        }
        // the user's code never runs at idle priority, taken or not
        self.run_at_normal_priority();
        let mut frames = self.frames.lock().await;
        let (cpu0, mut window) = {
            let cgroups = lock(&self.cgroups);
            match cgroups.as_ref() {
                Some(c) => (c.live_stats().cpu, c.peak_window()),
                None => (None, None),
            }
        };
        let request = serde_json::to_vec(&serde_json::json!({ "code": code }))
            .map_err(|e| KernelError::Protocol(e.to_string()))?;
        let t0 = Instant::now();
        if !self.send(&frame(b'x', &request)).await {
            return Err(KernelError::Lost(self.end(None).await));
        }
        let mut result = EvalResult::default();
        let timeout = tokio::time::sleep_until(t0 + limits.timeout);
        tokio::pin!(timeout);
        let mut kill_at: Option<Instant> = None;
        let reply = loop {
            let next = tokio::select! {
                f = frames.next() => f,
                () = &mut timeout, if kill_at.is_none() => {
                    result.timed_out = true;
                    kill_at = Some(Instant::now() + limits.grace);
                    self.send(&frame(b'i', &[])).await;
                    continue;
                }
                () = sleep_until_opt(kill_at) => {
                    drop(frames);
                    return Err(KernelError::Lost(self.end(Some(KernelLost::Unresponsive)).await));
                }
            };
            match next {
                Ok(Some((b'o', data))) => {
                    let (n, cut) = keep(&mut result.stdout, &data, limits.stdout_bytes);
                    result.stdout_truncated |= cut;
                    if let Some(s) = sink {
                        s.call(OutputStream::Stdout, &data[..n]);
                    }
                }
                Ok(Some((b'e', data))) => {
                    let (n, cut) = keep(&mut result.stderr, &data, limits.stderr_bytes);
                    result.stderr_truncated |= cut;
                    if let Some(s) = sink {
                        s.call(OutputStream::Stderr, &data[..n]);
                    }
                }
                Ok(Some((b'r', data))) => break data,
                Ok(Some((kind, _))) => {
                    drop(frames);
                    self.end(None).await;
                    return Err(KernelError::Protocol(format!("unknown frame kind {kind}")));
                }
                Ok(None) => {
                    drop(frames);
                    return Err(KernelError::Lost(self.end(None).await));
                }
                Err(e) => {
                    drop(frames);
                    self.end(None).await;
                    return Err(e);
                }
            }
        };
        result.wall_time = t0.elapsed();
        let reply: Reply = match serde_json::from_slice(&reply) {
            Ok(r) => r,
            Err(e) => {
                drop(frames);
                self.end(None).await;
                return Err(KernelError::Protocol(format!("reply: {e}")));
            }
        };
        result.value = reply.value;
        result.value_png = reply.png;
        result.error = reply.error;
        result.files = reply.files;
        {
            let cgroups = lock(&self.cgroups);
            if let Some(c) = cgroups.as_ref() {
                let now = c.live_stats();
                result.cpu_time = now.cpu.zip(cpu0).map(|(b, a)| b.saturating_sub(a));
                result.memory_peak = window.as_mut().and_then(|w| w.peak()).or(now.memory_peak);
            }
        }
        Ok(result)
    }

    /// Interrupts the evaluation running now (SIGINT in the kernel: a
    /// `KeyboardInterrupt` in Python); nothing if none runs. `false` if the
    /// kernel is gone.
    pub async fn interrupt(&self) -> bool {
        self.lost().is_none() && self.send(&frame(b'i', &[])).await
    }

    /// Ends the kernel in order: kills the jail, waits for the helper and
    /// removes the cgroups.
    pub async fn close(&self) {
        self.end(Some(KernelLost::Closed)).await;
    }

    async fn send(&self, bytes: &[u8]) -> bool {
        let mut control = self.control.lock().await;
        match control.as_mut() {
            Some(c) => c.write_all(bytes).await.is_ok(),
            None => false,
        }
    }

    /// Kills what is left of the kernel (closing the control pipe makes the
    /// helper kill and reap the jail), waits for it, removes its cgroups
    /// and records why it is lost: `reason`, else out of memory when the
    /// OOM killer fired, else what it printed last. Idempotent.
    async fn end(&self, reason: Option<KernelLost>) -> KernelLost {
        if let Some(lost) = self.lost() {
            return lost;
        }
        self.control.lock().await.take();
        let proc = lock(&self.proc).take();
        if let Some(mut proc) = proc
            && tokio::time::timeout(Duration::from_secs(5), proc.wait())
                .await
                .is_err()
        {
            proc.kill();
            let _ = proc.wait().await;
        }
        let cgroups = lock(&self.cgroups).take();
        let oom = match cgroups {
            Some(c) => c.finish().await.map(|s| s.oom_kills > 0).unwrap_or(false),
            None => false,
        };
        lock(&self.lease).take();
        let lost = match reason {
            Some(r) => r,
            None if oom => KernelLost::OutOfMemory,
            None => {
                let tail = String::from_utf8_lossy(&lock(&self.stderr_tail))
                    .trim()
                    .to_owned();
                // node's own heap limit comes before the cgroup's
                if tail.contains("JavaScript heap out of memory") {
                    KernelLost::OutOfMemory
                } else {
                    KernelLost::Exited(tail)
                }
            }
        };
        let mut slot = lock(&self.lost);
        slot.get_or_insert(lost).clone()
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The park spec of a `py` kernel: an embedded jail of `template` with the
/// kernel program in `/etc/kiln/`.
pub fn python_kernel_park(template: &str) -> ParkSpec {
    ParkSpec {
        mode: ParkMode::Embedded,
        template: template.to_owned(),
        etc_files: vec![(
            kiln_core::lang::warm::PYTHON_KERNEL_NAME.to_owned(),
            kiln_core::lang::warm::PYTHON_KERNEL.to_owned(),
        )],
        ..ParkSpec::exec()
    }
}

/// The park spec of a `js` kernel: a pre-started node running the kernel
/// program, with `env` (the `js` runtime's environment, as a one-shot warm
/// `js` jail's). A shell moves the protocol to fd 3 and points node's fd 1
/// at the jail's stderr, so bytes written behind node's back (a child
/// process with inherited stdio) cannot break the frames.
pub fn node_kernel_park(node: &str, env: Vec<(String, String)>) -> ParkSpec {
    let name = kiln_core::lang::warm::NODE_KERNEL_NAME;
    ParkSpec {
        mode: ParkMode::Prestart,
        argv: vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            format!("exec {node} --expose-internals /etc/kiln/{name} 3>&1 1>&2"),
        ],
        env,
        etc_files: vec![(
            name.to_owned(),
            kiln_core::lang::warm::NODE_KERNEL.to_owned(),
        )],
        ..ParkSpec::exec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_kind_and_big_endian_length() {
        assert_eq!(frame(b'x', b"ab"), [b'x', 0, 0, 0, 2, b'a', b'b']);
        assert_eq!(frame(b'i', b""), [b'i', 0, 0, 0, 0]);
    }

    #[test]
    fn keep_stops_at_the_cap_and_says_so() {
        let mut buf = Vec::new();
        assert_eq!(keep(&mut buf, b"abc", 5), (3, false));
        assert_eq!(keep(&mut buf, b"defg", 5), (2, true));
        assert_eq!(keep(&mut buf, b"h", 5), (0, true));
        assert_eq!(buf, b"abcde");
    }

    #[test]
    fn the_kernel_program_is_shipped_in_etc() {
        let park = python_kernel_park("py-data");
        assert_eq!(park.mode, ParkMode::Embedded);
        assert_eq!(park.template, "py-data");
        assert!(park.etc_files[0].1.contains("def evaluate"));
    }

    #[test]
    fn the_node_kernel_is_prestarted_with_the_protocol_on_fd_3() {
        let park = node_kernel_park("/usr/bin/node", vec![("HOME".into(), "/mnt/data".into())]);
        assert_eq!(park.mode, ParkMode::Prestart);
        assert_eq!(
            park.argv[2],
            "exec /usr/bin/node --expose-internals /etc/kiln/node_kernel.js 3>&1 1>&2"
        );
        assert_eq!(park.etc_files[0].0, "node_kernel.js");
        assert!(park.etc_files[0].1.contains("const PROTO = 3;"));
    }
}
