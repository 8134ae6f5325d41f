//! The jail launcher (`kiln __launcher`): a small, single-threaded host
//! process the server starts once and that starts every jail: it clones
//! each jail's init itself (`jail/start.rs`), with no helper process in
//! between.
//!
//! Spawning `kiln __jail` for each jail cost about 1.2 ms of CPU: a fork of
//! the multi-threaded server (the hook that places the status pipe on fd 3
//! rules out `vfork`), an `execve` of the large `kiln` binary, the dynamic
//! loader's relocations and glibc's CPU-feature probing, whose `cpuid`
//! instructions trap to the hypervisor on a VM. A fork of the launcher per
//! jail (the helper H that cloned the init and then waited) still cost
//! its fork, page faults and exit; now the launcher does H's part (parse
//! the spec, the mount plan, the network namespace, the clone, the v1
//! cgroup attach, the uid maps, the release) and the init the rest (the
//! go, a kernel's input, the wall-time backstop). The launcher runs in the
//! state `kiln __jail` starts in: the same binary and code, an empty
//! environment, only its own descriptors, default signal dispositions
//! except `SIGPIPE` ignored (as Rust's runtime leaves it) and `SIGCHLD`
//! ignored (the init restores it), the server's cgroup, uid and limits.
//!
//! Protocol on a `SOCK_SEQPACKET` socket (the launcher's stdin):
//! 1. launcher → server: `r` once it is ready;
//! 2. per jail, server → launcher: `h` and the jail's spec (one line of
//!    JSON, no newline) with five or six fds attached: a reply socket, then
//!    the jail's control pipe, stdout, stderr, status pipe and, for an
//!    embedded warm jail, a socket to the fork-server. The answer, on the
//!    reply socket, is the init's pid (4 bytes, little-endian) with its
//!    pidfd attached, `!` and the text of a set-up failure, or another
//!    error text. A kernel's jail is asked for with `k`, its slot's
//!    mount point and a newline before the spec, and one more fd last: a
//!    detached copy of the slot's mount (`open_tree`), which the launcher
//!    attaches at that point for the clone and detaches again (see
//!    [`Launcher::start`]).
//!
//! The launcher ignores `SIGCHLD`, so the kernel reaps the inits; the
//! server follows each through its pidfd and kills it through it (the
//! whole pid namespace dies with it), and the init reports how its jail
//! ended on its status pipe. Each init's parent-death signal ties it to
//! the launcher, which exits when the server closes the socket. If the
//! launcher cannot start or dies, the server spawns `kiln __jail` per jail,
//! which starts the jail the same way and then waits for its init.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::fcntl::{FcntlArg, OFlag, fcntl};

use crate::error::SandboxError;
use crate::jail;
use crate::seqpacket::{self, OwnedChild, recv, recv_into, send, wait_readable};
use crate::sys;

/// First byte of an answer that carries the jail's set-up failure.
const SETUP_FAILED: u8 = b'!';
/// The largest request (`h` and a spec) the launcher reads.
const REQUEST_MAX: usize = 1 << 20;

/// How long the launcher may take to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Server-side handle of the launcher.
#[derive(Debug)]
pub(crate) struct Launcher {
    sock: OwnedFd,
    child: OwnedChild,
    alive: AtomicBool,
    /// Hands each kernel jail its slot's mount (the kernel launcher).
    slot_trees: bool,
}

/// The launcher a jail is started by and, for a kernel's jail started by
/// the kernel launcher, its slot's mount point (the slot's filesystem,
/// handed to the launcher as a detached copy).
#[derive(Debug)]
pub(crate) struct Via<'a> {
    pub launcher: &'a Launcher,
    pub slot_mount: Option<std::path::PathBuf>,
}

/// Request kinds: any jail, and a kernel's with its slot's mount.
const REQUEST: u8 = b'h';
const KERNEL_REQUEST: u8 = b'k';

/// The fds a launched jail gets (sent in this order after the reply socket).
pub(crate) type HelperFds<'a> = jail::start::JailFds<'a>;

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
    /// With `slot_trees` too (the kernel launcher), each kernel's jail gets
    /// its own slot's filesystem (see [`Launcher::launch`]) and copies
    /// that one mount, not every other kernel's.
    pub(crate) fn start(
        helper: &Path,
        without_kernel_slots: Option<&Path>,
        slot_trees: bool,
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
            slot_trees: slot_trees && without_kernel_slots.is_some(),
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the launcher still answers.
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Starts the jail of `spec_line` (its JSON, one line) with `fds`;
    /// returns the pidfd of its init. The kernel launcher gets a detached
    /// copy of the mount at `slot_mount` (a kernel's slot) with it, attached
    /// there in its namespace only while it clones the jail. A jail the
    /// launcher could not start (its set-up failed) is a
    /// [`SandboxError::Setup`]; any other error means the launcher could
    /// not be used.
    pub(crate) async fn launch(
        &self,
        fds: &HelperFds<'_>,
        spec_line: &[u8],
        slot_mount: Option<&Path>,
    ) -> Result<OwnedFd, SandboxError> {
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
        let spec_line = spec_line.strip_suffix(b"\n").unwrap_or(spec_line);
        let mut msg = Vec::with_capacity(spec_line.len() + 1);
        let tree = match slot_mount.filter(|_| self.slot_trees) {
            Some(point) => {
                let tree = sys::open_tree_clone(point).map_err(|e| {
                    SandboxError::Setup(format!("copy the mount of {}: {e}", point.display()))
                })?;
                msg.push(KERNEL_REQUEST);
                msg.extend_from_slice(point.as_os_str().as_encoded_bytes());
                msg.push(b'\n');
                Some(tree)
            }
            None => {
                msg.push(REQUEST);
                None
            }
        };
        raw.extend(tree.as_ref().map(AsRawFd::as_raw_fd));
        msg.extend_from_slice(spec_line);
        if let Err(e) = send(&self.sock, &msg, &raw) {
            if e != nix::errno::Errno::EAGAIN {
                self.alive.store(false, Ordering::SeqCst);
            }
            return Err(err(format!("send request: {e}")));
        }
        // The launcher holds its own copies now: EOF on ours if it dies.
        drop(theirs);
        drop(tree);
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
            _ if bytes.first() == Some(&SETUP_FAILED) => Err(SandboxError::Setup(
                String::from_utf8_lossy(&bytes[1..]).into_owned(),
            )),
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
    // The kernel reaps our children (the jails' inits): the server watches
    // each by its pidfd.
    sys::set_sigchld_ignored(true).map_err(|e| format!("ignore SIGCHLD: {e}"))?;
    // A spawned helper's jail init left behind is orphaned to us, not to
    // the server (or whatever is PID 1), and reaped at once.
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| format!("become a subreaper: {e}"))?;
    // What every jail's start needs, opened once.
    let devnull = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map(OwnedFd::from)
        .map_err(|e| format!("open /dev/null: {e}"))?;
    let me = sys::pidfd_open(nix::unistd::getpid()).map_err(|e| format!("pidfd_open: {e}"))?;
    let home_netns = jail::open_home_netns().map_err(|e| e.message().to_owned())?;
    send(sock, b"r", &[]).map_err(|e| format!("report ready: {e}"))?;
    let mut buf = vec![0u8; REQUEST_MAX];
    loop {
        let (n, fds) = recv_into(sock, &mut buf).map_err(|e| format!("read request: {e}"))?;
        if n == 0 && fds.is_empty() {
            return Ok(()); // the server closed the socket
        }
        let Some(request) = (n < REQUEST_MAX)
            .then(|| Request::parse(&buf[..n], &fds, slots_dir))
            .flatten()
        else {
            continue; // not a request: its fds close here, the requester sees EOF
        };
        let start = jail::start::StartFds {
            jail: HelperFds {
                control: &fds[1],
                stdout: &fds[2],
                stderr: &fds[3],
                status: &fds[4],
                zygote: request.zygote,
            },
            devnull: &devnull,
            starter: &me,
            home_netns: &home_netns,
        };
        let started = match request.slot {
            Some((point, tree)) => with_slot_attached(point, tree, || {
                jail::start::start(request.spec, &start).map_err(|e| e.message().to_owned())
            }),
            None => jail::start::start(request.spec, &start).map_err(|e| e.message().to_owned()),
        };
        let answer = match started {
            Ok((pid, pidfd)) => send(&fds[0], &pid.as_raw().to_le_bytes(), &[pidfd.as_raw_fd()]),
            Err(e) => {
                let mut msg = vec![SETUP_FAILED];
                msg.extend_from_slice(e.as_bytes());
                send(&fds[0], &msg, &[])
            }
        };
        // The requester may have given up meanwhile; the jail then sees
        // its control pipe close and ends.
        let _ = answer;
        // the jail's init holds its own copies of the request's fds
    }
}

/// A request the launcher read: the jail's spec, the fork-server socket of
/// an embedded warm jail, and a kernel's slot mount point with the detached
/// copy of its filesystem.
struct Request<'a> {
    spec: &'a [u8],
    zygote: Option<&'a OwnedFd>,
    slot: Option<(&'a Path, &'a OwnedFd)>,
}

impl<'a> Request<'a> {
    /// `None` for anything but a request with its fds: the reply socket,
    /// the jail's four, the fork-server's socket if any, and for a
    /// kernel's jail (`k`) the slot's mount last, whose mount point must be
    /// a slot of `slots_dir`.
    fn parse(msg: &'a [u8], fds: &'a [OwnedFd], slots_dir: Option<&Path>) -> Option<Self> {
        let (&kind, body) = msg.split_first()?;
        match kind {
            REQUEST if (5..=6).contains(&fds.len()) => Some(Request {
                spec: body,
                zygote: fds.get(5),
                slot: None,
            }),
            KERNEL_REQUEST if (6..=7).contains(&fds.len()) => {
                let newline = body.iter().position(|&b| b == b'\n')?;
                let point = Path::new(std::ffi::OsStr::from_bytes(&body[..newline]));
                let dir = slots_dir?;
                let is_slot = point.parent() == Some(dir)
                    && point
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.parse::<u32>().is_ok());
                is_slot.then_some(())?;
                let (tree, rest) = fds.split_last()?;
                Some(Request {
                    spec: &body[newline + 1..],
                    zygote: rest.get(5),
                    slot: Some((point, tree)),
                })
            }
            _ => None,
        }
    }
}

/// Runs `start` (a kernel jail's clone) with the slot's filesystem `tree`
/// attached at `point` in the launcher's mount namespace, and detaches it
/// again: the jail's `CLONE_NEWNS` copies it, and the launcher's table
/// keeps no mount per live kernel.
fn with_slot_attached<T>(
    point: &Path,
    tree: &OwnedFd,
    start: impl FnOnce() -> Result<T, String>,
) -> Result<T, String> {
    sys::move_mount_to(tree, point)
        .map_err(|e| format!("attach the slot's filesystem at {}: {e}", point.display()))?;
    let started = start();
    if let Err(e) = nix::mount::umount2(point, nix::mount::MntFlags::MNT_DETACH) {
        // the next kernel's clone would copy it: stop serving
        eprintln!("kiln __launcher: detach {}: {e}", point.display());
        std::process::exit(1);
    }
    started
}
