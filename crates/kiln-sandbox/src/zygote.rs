//! The fork-server (`kiln __zygote`): one long-lived host process that
//! embeds CPython, imports the data stack once (the preload, a never-used
//! template), and then forks a jail helper per warm `py` jail. The fork
//! becomes the helper (`jail::helper_main_with`), builds a fresh jail like any
//! other, and its program process — still a copy of the template that has
//! never run user code — parks confined as uid 1000 and, at the go, runs the
//! user's program in process instead of `execve`ing a new interpreter. So a
//! run pays neither interpreter start-up nor `import pandas`, and still
//! starts in a fresh process in its own namespaces, cgroups and uid range.
//!
//! Protocol on a `SOCK_SEQPACKET` pair (the fork-server's stdin):
//! 1. server → zygote: the [`ZygoteConfig`] as JSON;
//! 2. zygote → server: `{"ready": ZygoteInfo}` or `{"failed": "why"}`;
//! 3. per warm jail: server → zygote: one byte with four fds attached
//!    (control, stdout, stderr, status: the helper's fds 0–3); zygote →
//!    server: the helper's pid (4 bytes, little-endian) with its pidfd
//!    attached, or no fd and an error text.
//!
//! The fork-server never reads anything but these messages; it holds no
//! secret (its environment is exactly the jail's) and exits when the server
//! closes the socket or dies.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::cmsg_space;
use nix::fcntl::{FcntlArg, fcntl};
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};
use serde::{Deserialize, Serialize};

use crate::error::SandboxError;
use crate::run::{Started, pipes_for_forked};
use crate::spec::GoMsg;
use crate::sys::{self, Forked};
use crate::{embed, jail};

/// What the fork-server loads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZygoteConfig {
    /// The host's shared libpython (`libpython3.X.so.1.0`).
    pub libpython: PathBuf,
    /// Python source run once at start-up; must define the
    /// `_kiln_zygote` module whose `run(go: bytes)` runs one program and
    /// ends the process.
    pub preload: String,
    /// The complete environment of the interpreter (the jail's, with host
    /// paths where the preload needs a writable directory).
    pub env: Vec<(String, String)>,
}

/// What the fork-server reported once its preload finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZygoteInfo {
    pub pid: u32,
    /// Interpreter start-up plus preload.
    pub preload_ms: u64,
    /// Resident memory of the template after the preload (shared,
    /// copy-on-write, with every warm `py` jail).
    pub rss_bytes: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Hello {
    Ready(ZygoteInfo),
    Failed(String),
}

/// How long the preload may take.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest config message (the preload source is a few KiB).
const CONFIG_MAX: usize = 1 << 20;

/// Server-side handle of the fork-server.
#[derive(Debug)]
pub(crate) struct Zygote {
    sock: Arc<Mutex<OwnedFd>>,
    child: Mutex<std::process::Child>,
    info: ZygoteInfo,
    alive: Arc<AtomicBool>,
}

fn send(sock: &OwnedFd, bytes: &[u8], fds: &[RawFd]) -> nix::Result<()> {
    let iov = [IoSlice::new(bytes)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    loop {
        // A seqpacket message goes whole or not at all: after EINTR, resend.
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => return r.map(|_| ()),
        }
    }
}

/// Receives one message (up to `max` bytes) and the fds attached to it.
fn recv(sock: &OwnedFd, max: usize) -> nix::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; max];
    let mut space = cmsg_space!([RawFd; 4]);
    let (n, raw) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        // EINTR consumed nothing: receive again.
        let msg = loop {
            match recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => break r?,
            }
        };
        let mut raw = Vec::new();
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                raw.extend(fds);
            }
        }
        (msg.bytes, raw)
    };
    // Descriptors the kernel just installed for us (SCM_RIGHTS).
    let fds = raw
        .into_iter()
        .filter_map(sys::adopt_inherited_fd)
        .collect();
    buf.truncate(n);
    Ok((buf, fds))
}

/// Waits until `sock` is readable, for at most `limit`. A signal arriving
/// meanwhile (the server's runtime gets them) only restarts the wait.
fn wait_readable(sock: &OwnedFd, limit: Duration) -> Result<(), String> {
    let until = Instant::now() + limit;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no answer within {limit:?}"));
        }
        // poll takes at most u16::MAX ms at a time; longer waits loop
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [nix::poll::PollFd::new(
            sock.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, ms) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => return Ok(()),
            Err(e) => return Err(format!("wait: {e}")),
        }
    }
}

impl Zygote {
    /// Starts `helper __zygote`, hands it `cfg` and waits for the preload.
    pub(crate) async fn start(helper: &Path, cfg: &ZygoteConfig) -> Result<Zygote, SandboxError> {
        let helper = helper.to_path_buf();
        let cfg = cfg.clone();
        tokio::task::spawn_blocking(move || Zygote::start_blocking(&helper, &cfg))
            .await
            .map_err(|e| SandboxError::Zygote(format!("start: {e}")))?
    }

    fn start_blocking(helper: &Path, cfg: &ZygoteConfig) -> Result<Zygote, SandboxError> {
        let err = |m: String| SandboxError::Zygote(m);
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| err(format!("socketpair: {e}")))?;
        let child = std::process::Command::new(helper)
            .arg0("kiln")
            .arg("__zygote")
            .env_clear()
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| err(format!("spawn {}: {e}", helper.display())))?;
        let config = serde_json::to_vec(cfg).map_err(|e| err(format!("encode config: {e}")))?;
        send(&ours, &config, &[]).map_err(|e| err(format!("send config: {e}")))?;
        let kill = |child: &mut std::process::Child| {
            let _ = child.kill();
            let _ = child.wait();
        };
        let mut child = child;
        if let Err(e) = wait_readable(&ours, START_TIMEOUT) {
            kill(&mut child);
            return Err(err(e));
        }
        let (bytes, _) = recv(&ours, 64 * 1024).map_err(|e| err(format!("read answer: {e}")))?;
        match serde_json::from_slice::<Hello>(&bytes) {
            Ok(Hello::Ready(info)) => Ok(Zygote {
                sock: Arc::new(Mutex::new(ours)),
                child: Mutex::new(child),
                info,
                alive: Arc::new(AtomicBool::new(true)),
            }),
            Ok(Hello::Failed(why)) => {
                kill(&mut child);
                Err(err(why))
            }
            Err(_) => {
                kill(&mut child);
                Err(err(
                    "the fork-server ended during its preload (see its stderr above)".into(),
                ))
            }
        }
    }

    pub(crate) fn info(&self) -> &ZygoteInfo {
        &self.info
    }

    /// Whether the fork-server still answers.
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Asks the fork-server for a new jail helper (a fork of the template);
    /// the caller writes its spec on the control pipe as for a spawned one.
    pub(crate) async fn fork_helper(&self, helper: &Path) -> Result<Started, SandboxError> {
        if !self.alive() {
            return Err(SandboxError::Zygote("the fork-server is gone".into()));
        }
        let (ends, child_ends) =
            pipes_for_forked().map_err(|e| SandboxError::io("create helper pipes", helper, e))?;
        let sock = Arc::clone(&self.sock);
        let alive = Arc::clone(&self.alive);
        let answer = tokio::task::spawn_blocking(move || {
            let sock = sock.lock().unwrap_or_else(|p| p.into_inner());
            let fds = [
                child_ends.control.as_raw_fd(),
                child_ends.stdout.as_raw_fd(),
                child_ends.stderr.as_raw_fd(),
                child_ends.status.as_raw_fd(),
            ];
            let r = send(&sock, b"f", &fds).and_then(|()| recv(&sock, 4096));
            // Ours are copies: the helper has its own now.
            drop(child_ends);
            if r.as_ref().is_ok_and(|(b, _)| b.is_empty()) || r.is_err() {
                alive.store(false, Ordering::SeqCst);
            }
            r
        })
        .await
        .map_err(|e| SandboxError::Zygote(format!("fork: {e}")))?
        .map_err(|e| SandboxError::Zygote(format!("fork: {e}")))?;
        let (bytes, mut fds) = answer;
        match (bytes.len(), fds.pop()) {
            (4, Some(pidfd)) => Started::forked(helper, pidfd, ends),
            (0, _) => Err(SandboxError::Zygote("the fork-server is gone".into())),
            _ => Err(SandboxError::Zygote(format!(
                "fork refused: {}",
                String::from_utf8_lossy(&bytes)
            ))),
        }
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        let mut child = self.child.lock().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Entry point of `kiln __zygote`. Never returns.
pub fn zygote_main() -> ! {
    // No parent-death signal: it fires when the *thread* that spawned us
    // exits (a tokio blocking thread retires after idling). The server's
    // death closes the socket instead, and we exit on its EOF.
    let Some(sock) = sys::adopt_inherited_fd(0) else {
        eprintln!("kiln __zygote: internal entry point of the sandbox (no socket on fd 0)");
        sys::exit_now(2);
    };
    match serve(&sock) {
        Ok(()) => sys::exit_now(0),
        Err(why) => {
            let hello = serde_json::to_vec(&Hello::Failed(why.clone())).unwrap_or_default();
            let _ = send(&sock, &hello, &[]);
            eprintln!("kiln __zygote: {why}");
            sys::exit_now(1)
        }
    }
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Loads the template, reports, then forks helpers until the socket closes.
fn serve(sock: &OwnedFd) -> Result<(), String> {
    sys::close_from(3).map_err(|e| format!("close inherited fds: {e}"))?;
    let (bytes, _) = recv(sock, CONFIG_MAX).map_err(|e| format!("read config: {e}"))?;
    let cfg: ZygoteConfig =
        serde_json::from_slice(&bytes).map_err(|e| format!("parse config: {e}"))?;
    sys::ensure_single_threaded_now().map_err(|e| e.to_string())?;
    embed::set_environment(&cfg.env).map_err(|e| e.to_string())?;
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;
    let t0 = Instant::now();
    embed::initialize(&cfg.libpython, &cfg.preload).map_err(|e| e.to_string())?;
    // Forking needs a single thread: a preload that started one (OpenBLAS
    // without OPENBLAS_NUM_THREADS=1, say) is refused here, not later.
    sys::ensure_single_threaded_now().map_err(|e| format!("after the preload: {e}"))?;
    let info = ZygoteInfo {
        pid: std::process::id(),
        preload_ms: u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX),
        rss_bytes: rss_bytes(),
    };
    let hello = serde_json::to_vec(&Hello::Ready(info)).map_err(|e| e.to_string())?;
    send(sock, &hello, &[]).map_err(|e| format!("report ready: {e}"))?;

    // Children are reaped by the kernel: the server watches each through
    // the pidfd it gets.
    sys::ignore_sigchld().map_err(|e| format!("ignore SIGCHLD: {e}"))?;
    loop {
        let (bytes, fds) = match recv(sock, 16) {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("read request: {e}")),
        };
        if bytes.is_empty() && fds.is_empty() {
            return Ok(()); // the server closed the socket
        }
        if fds.len() != 4 {
            let _ = send(sock, b"expected four fds", &[]);
            continue;
        }
        match sys::clone3_fork(0, None) {
            Ok(Forked::Child) => become_helper(fds),
            Ok(Forked::Parent { pid, pidfd }) => {
                drop(fds);
                let pid = u32::try_from(pid.as_raw()).unwrap_or(0).to_le_bytes();
                let sent = match &pidfd {
                    Some(p) => send(sock, &pid, &[p.as_raw_fd()]),
                    None => send(sock, b"no pidfd", &[]),
                };
                sent.map_err(|e| format!("answer: {e}"))?;
            }
            Err(e) => {
                let _ = send(sock, format!("fork: {e}").as_bytes(), &[]);
            }
        }
    }
}

/// In the fork: installs the four fds as 0–3 and runs the jail helper with
/// the embedded runner. Never returns.
fn become_helper(fds: Vec<OwnedFd>) -> ! {
    let fail = |what: &str, e: &dyn std::fmt::Display| -> ! {
        eprintln!("kiln __zygote: helper {what}: {e}");
        sys::exit_now(2)
    };
    if let Err(e) = sys::reset_signals() {
        fail("reset signals", &e);
    }
    // Move them out of the way first: a received fd may already sit on one
    // of the target numbers.
    let mut high = Vec::with_capacity(4);
    for fd in &fds {
        match fcntl(fd, FcntlArg::F_DUPFD_CLOEXEC(16)) {
            Ok(h) => high.push(h),
            Err(e) => fail("dup", &e),
        }
    }
    for (target, fd) in high.iter().enumerate() {
        if let Err(e) = sys::dup2_raw(fd, target as RawFd) {
            fail("dup2", &e);
        }
    }
    // Everything else (the socket, the received copies) goes; the helper
    // itself marks the status fd close-on-exec.
    if let Err(e) = sys::close_from(4) {
        fail("close fds", &e);
    }
    std::mem::forget(fds);
    std::mem::forget(high);
    jail::helper_main_with(Some(run_embedded))
}

/// The parked program process's last step: the preload's runner takes over
/// (it ends the process itself).
fn run_embedded(go: &GoMsg) -> ! {
    #[derive(Serialize)]
    struct Run<'a> {
        argv: &'a [String],
        env: &'a [(String, String)],
    }
    let json = serde_json::to_vec(&Run {
        argv: &go.argv,
        env: &go.env,
    })
    .unwrap_or_default();
    let hex: String = json.iter().map(|b| format!("{b:02x}")).collect();
    let code = format!("import _kiln_zygote\n_kiln_zygote.run(bytes.fromhex('{hex}'))\n");
    match embed::run_in_child(&code) {
        Ok(_) => eprintln!("kiln: the Python runner returned"),
        Err(e) => eprintln!("kiln: {e}"),
    }
    sys::exit_now(1)
}

/// Finds the host's shared libpython for `python3` (the interpreter the
/// `py` language runs): asks it where its `INSTSONAME` lives.
pub fn find_libpython(python: &Path) -> Result<PathBuf, SandboxError> {
    let out = std::process::Command::new(python)
        .args([
            "-I",
            "-c",
            "import os, sysconfig as s; print(os.path.join(s.get_config_var('LIBDIR') or '', \
             s.get_config_var('INSTSONAME') or ''))",
        ])
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .map_err(|e| SandboxError::Zygote(format!("run {}: {e}", python.display())))?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !out.status.success() || !path.is_file() {
        return Err(SandboxError::Zygote(format!(
            "no shared libpython for {} (looked for {:?}; install libpython3-dev or libpython3.X)",
            python.display(),
            path
        )));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

    #[test]
    fn waiting_for_the_fork_server_survives_signals() {
        // A handled signal makes poll(2) fail with EINTR whatever SA_RESTART says;
        // the server's runtime handles SIGCHLD, so this happens in practice.
        let rt = tokio::runtime::Runtime::new().unwrap();
        let _handler = rt.block_on(async {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()).unwrap()
        });
        let (a, b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            tid_tx.send(nix::sys::pthread::pthread_self()).unwrap();
            wait_readable(&a, Duration::from_secs(10))
        });
        let tid = tid_rx.recv().unwrap();
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(20));
            nix::sys::pthread::pthread_kill(tid, nix::sys::signal::Signal::SIGUSR1).unwrap();
        }
        send(&b, b"ready", &[]).unwrap();
        assert_eq!(waiter.join().unwrap(), Ok(()));
    }

    #[test]
    fn waiting_for_the_fork_server_gives_up_after_the_limit() {
        let (a, _b) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let e = wait_readable(&a, Duration::from_millis(50)).unwrap_err();
        assert!(e.contains("no answer within"), "{e}");
    }
}
