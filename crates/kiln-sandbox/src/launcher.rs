//! The jail launcher (`kiln __launcher`): a small, single-threaded host
//! process the server starts once and that forks the helper of every jail.
//!
//! Spawning `kiln __jail` for each jail cost about 1.2 ms of CPU: a fork of
//! the multi-threaded server (the hook that places the status pipe on fd 3
//! rules out `vfork`), an `execve` of the large `kiln` binary, the dynamic
//! loader's relocations and glibc's CPU-feature probing, whose `cpuid`
//! instructions trap to the hypervisor on a VM. A fork of the launcher
//! costs a fraction of that and starts the helper in the state `kiln __jail`
//! starts in: the same binary and code, an empty environment, only its own
//! descriptors, default signal dispositions except `SIGPIPE` ignored (as
//! Rust's runtime leaves it), the server's cgroup, uid and limits.
//!
//! Protocol on a `SOCK_SEQPACKET` socket (the launcher's stdin):
//! 1. launcher → server: `r` once it is ready;
//! 2. per helper, server → launcher: `h` with five or six fds attached: a
//!    reply socket, then what becomes the helper's fds 0–3 (control pipe,
//!    stdout, stderr, status pipe) and, for an embedded warm jail, 4 (a
//!    socket to the fork-server). The answer, on the reply socket, is the
//!    helper's pid (4 bytes, little-endian) with its pidfd attached, or an
//!    error text.
//!
//! The launcher ignores `SIGCHLD`, so the kernel reaps the helpers (and,
//! as their subreaper, any jail init a dead helper left behind); the
//! server follows each helper through its pidfd, and the helper reports how
//! its jail ended on its status pipe, as a spawned one does. The launcher
//! exits when the server closes the socket. If it cannot start or dies, the
//! server spawns `kiln __jail` per jail as before.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::fcntl::{FcntlArg, OFlag, fcntl};

use crate::error::SandboxError;
use crate::jail;
use crate::seqpacket::{self, OwnedChild, recv, recv_into, send, wait_readable};
use crate::sys::{self, Forked};

/// How long the launcher may take to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Server-side handle of the launcher.
#[derive(Debug)]
pub(crate) struct Launcher {
    sock: OwnedFd,
    child: OwnedChild,
    alive: AtomicBool,
}

/// The fds a launched helper gets, in protocol order.
pub(crate) struct HelperFds<'a> {
    pub control: &'a OwnedFd,
    pub stdout: &'a OwnedFd,
    pub stderr: &'a OwnedFd,
    pub status: &'a OwnedFd,
    pub zygote: Option<&'a OwnedFd>,
}

fn set_nonblocking(fd: &OwnedFd) -> nix::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).map(|_| ())
}

impl Launcher {
    /// Starts `helper __launcher` and waits until it is ready (blocking,
    /// a few milliseconds). With `without_kernel_slots` (the slots
    /// directory), the launcher and the helpers it forks live in a copy of
    /// the server's mount namespace that holds none of the kernel slots'
    /// filesystems (`mountns::enter_without_private_mounts_below`): every
    /// jail's `CLONE_NEWNS` copies that table, so 1,000 idle kernels must
    /// not make each one-shot jail copy and tear down 1,000 more mounts.
    pub(crate) fn start(
        helper: &Path,
        without_kernel_slots: Option<&Path>,
    ) -> Result<Launcher, SandboxError> {
        let err = |m: String| SandboxError::Helper(format!("jail launcher: {m}"));
        let args: Vec<&std::ffi::OsStr> = without_kernel_slots
            .map(|d| d.as_os_str())
            .into_iter()
            .collect();
        let (ours, child) = seqpacket::spawn_peer(helper, "launcher", &args)
            .map_err(|e| err(format!("spawn {}: {e}", helper.display())))?;
        let ready = wait_readable(&ours, START_TIMEOUT)
            .and_then(|()| recv(&ours, 16).map_err(|e| e.to_string()))
            .and_then(|(bytes, _)| match bytes.as_slice() {
                b"r" => Ok(()),
                b"" => Err("it ended before it was ready (see its stderr)".to_owned()),
                other => Err(format!(
                    "unexpected answer {:?}",
                    String::from_utf8_lossy(other)
                )),
            })
            // A launcher that stops reading must never block a runtime thread.
            .and_then(|()| set_nonblocking(&ours).map_err(|e| e.to_string()));
        // On an error, dropping `child` kills it.
        ready.map_err(err)?;
        Ok(Launcher {
            sock: ours,
            child,
            alive: AtomicBool::new(true),
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the launcher still answers.
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Forks a helper with `fds` as its 0–3 (and 4); returns its pidfd.
    pub(crate) async fn launch(&self, fds: &HelperFds<'_>) -> Result<OwnedFd, SandboxError> {
        let err = |m: String| SandboxError::Helper(format!("jail launcher: {m}"));
        if !self.alive() {
            return Err(err("gone".to_owned()));
        }
        let (ours, theirs) = seqpacket::pair().map_err(|e| err(format!("socketpair: {e}")))?;
        set_nonblocking(&ours).map_err(|e| err(format!("reply socket: {e}")))?;
        let reply =
            sys::async_readable(ours).map_err(|e| err(format!("watch reply socket: {e}")))?;
        let mut raw: Vec<RawFd> = vec![
            theirs.as_raw_fd(),
            fds.control.as_raw_fd(),
            fds.stdout.as_raw_fd(),
            fds.stderr.as_raw_fd(),
            fds.status.as_raw_fd(),
        ];
        raw.extend(fds.zygote.map(AsRawFd::as_raw_fd));
        if let Err(e) = send(&self.sock, b"h", &raw) {
            if e != nix::errno::Errno::EAGAIN {
                self.alive.store(false, Ordering::SeqCst);
            }
            return Err(err(format!("send request: {e}")));
        }
        // The launcher holds its own copy now: EOF on ours if it dies.
        drop(theirs);
        let (bytes, mut got) = loop {
            let mut ready = reply
                .readable()
                .await
                .map_err(|e| err(format!("wait for answer: {e}")))?;
            match ready.try_io(|fd| recv(fd.get_ref(), 4096).map_err(std::io::Error::from)) {
                Ok(r) => break r.map_err(|e| err(format!("read answer: {e}")))?,
                Err(_would_block) => continue,
            }
        };
        match (<[u8; 4]>::try_from(bytes.as_slice()), got.pop()) {
            (Ok(_pid), Some(pidfd)) if got.is_empty() => Ok(pidfd),
            _ if bytes.is_empty() => {
                self.alive.store(false, Ordering::SeqCst);
                Err(err("gone".to_owned()))
            }
            _ => Err(err(format!("refused: {}", String::from_utf8_lossy(&bytes)))),
        }
    }
}

/// Entry point of `kiln __launcher [SLOTS_DIR]`. Never returns.
pub fn launcher_main() -> ! {
    let slots_dir = std::env::args_os().nth(2).map(std::path::PathBuf::from);
    seqpacket::serve_stdin(
        "launcher",
        |sock| serve(sock, slots_dir.as_deref()),
        |_, _| {},
    )
}

fn serve(sock: &OwnedFd, slots_dir: Option<&Path>) -> Result<(), String> {
    sys::close_from(3).map_err(|e| format!("close inherited fds: {e}"))?;
    sys::ensure_single_threaded().map_err(|e| e.to_string())?;
    if let Some(dir) = slots_dir
        && let Err(e) = crate::mountns::enter_without_private_mounts_below(dir)
    {
        // jails still work, each copying the kernel slots' mounts too
        eprintln!("kiln __launcher: kernel slots stay visible to its jails: {e}");
    }
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;
    // The kernel reaps our children: the server watches each by its pidfd.
    sys::set_sigchld_ignored(true).map_err(|e| format!("ignore SIGCHLD: {e}"))?;
    // A jail's init whose helper died is orphaned to us, not to the
    // server (or whatever is PID 1), and reaped at once like our children.
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| format!("become a subreaper: {e}"))?;
    send(sock, b"r", &[]).map_err(|e| format!("report ready: {e}"))?;
    let mut buf = [0u8; 16];
    loop {
        let (n, fds) = recv_into(sock, &mut buf).map_err(|e| format!("read request: {e}"))?;
        if n == 0 && fds.is_empty() {
            return Ok(()); // the server closed the socket
        }
        if &buf[..n] != b"h" || !(5..=6).contains(&fds.len()) {
            continue; // not a request: its fds close here, the requester sees EOF
        }
        match sys::clone3_fork(0, None) {
            Ok(Forked::Child) => become_helper(fds),
            Ok(Forked::Parent { pid, pidfd }) => {
                let answer = match &pidfd {
                    Some(p) => send(&fds[0], &pid.as_raw().to_le_bytes(), &[p.as_raw_fd()]),
                    None => send(&fds[0], b"clone3 gave no pidfd", &[]),
                };
                // The requester may have given up meanwhile; the helper
                // then sees its control pipe close and ends.
                let _ = answer;
            }
            Err(e) => {
                let _ = send(&fds[0], format!("fork: {e}").as_bytes(), &[]);
            }
        }
    }
}

/// In the fork: installs the received fds (all but the reply socket) as
/// 0, 1, 2, ... and runs the jail helper. Never returns.
fn become_helper(fds: Vec<OwnedFd>) -> ! {
    let fail = |what: &str, e: &dyn std::fmt::Display| -> ! {
        eprintln!("kiln __launcher: helper {what}: {e}");
        sys::exit_now(2)
    };
    if let Err(e) = sys::set_sigchld_ignored(false) {
        fail("restore SIGCHLD", &e);
    }
    let targets: Vec<&OwnedFd> = fds[1..].iter().collect();
    if let Err(e) = sys::install_fds(&targets) {
        fail("install fds", &e);
    }
    let count = (fds.len() - 1) as RawFd;
    // Not dropped: an original may sit on a target by now, replaced by
    // dup2; close_from closes the rest (our socket, originals, copies).
    std::mem::forget(fds);
    if let Err(e) = sys::close_from(count) {
        fail("close fds", &e);
    }
    jail::helper_main()
}
