//! The fork-server (`kiln __zygote`): one long-lived host process that
//! embeds CPython, imports the data stack once (the preload, a never-used
//! template), and then forks the program process of each warm `py` jail.
//! The jail itself (helper, init, namespaces, root, cgroups) is built like
//! any other by small `kiln __jail` processes; once its root is ready, the
//! helper asks the fork-server for the program: the fork joins the jail's
//! namespaces (`setns` through the init's pidfd) and cgroups, confines itself
//! exactly as a program process forked by the init would (uid 1000, limits,
//! Landlock, seccomp), parks, and at the go runs the user's program in
//! process instead of `execve`ing a new interpreter. So a run pays neither
//! interpreter start-up nor `import pandas`, still starts in a fresh process
//! in its own namespaces, cgroups and uid range, and the 90 MiB template is
//! copied once per run.
//!
//! Protocol on a `SOCK_SEQPACKET` socket (the fork-server's stdin; the
//! server and the helpers of embedded jails hold the other end):
//! 1. server → zygote: the [`ZygoteConfig`] as JSON;
//! 2. zygote → server: `{"ready": ZygoteInfo}` or `{"failed": "why"}`;
//! 3. per warm jail: helper → zygote: `g` and the [`crate::spec::JailSpec`]
//!    line, with seven fds attached: stdout, stderr, the exec pipe's write
//!    end, the go pipe's read end, the exit pipe's write end, the jail
//!    init's pidfd and a reply socket. The zygote forks the program into the
//!    init's pid namespace and answers on the reply socket with its pid
//!    (4 bytes, little-endian), or with an error text. When the program
//!    exits, the zygote reaps it and writes its [`StatusMsg::Finished`] line
//!    on the exit pipe, where the jail's init reads and reports it.
//!
//! Each request is one message and each answer goes to the requester's own
//! reply socket, so helpers may ask concurrently. The fork-server never reads
//! anything but these messages; it holds no secret (its environment is
//! exactly the jail's) and exits when every holder of the socket closed it.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use serde::{Deserialize, Serialize};

use crate::error::SandboxError;
use crate::seqpacket::{self, OwnedChild, recv, recv_into, send, wait_readable};
use crate::spec::{GoMsg, StatusMsg};
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
    _child: OwnedChild,
    info: ZygoteInfo,
    alive: Arc<AtomicBool>,
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
        // On every error below, dropping `child` kills it.
        let (ours, child) = seqpacket::spawn_peer(helper, "zygote")
            .map_err(|e| err(format!("spawn {}: {e}", helper.display())))?;
        let config = serde_json::to_vec(cfg).map_err(|e| err(format!("encode config: {e}")))?;
        send(&ours, &config, &[]).map_err(|e| err(format!("send config: {e}")))?;
        wait_readable(&ours, START_TIMEOUT).map_err(err)?;
        let (bytes, _) = recv(&ours, 64 * 1024).map_err(|e| err(format!("read answer: {e}")))?;
        match serde_json::from_slice::<Hello>(&bytes) {
            Ok(Hello::Ready(info)) => Ok(Zygote {
                sock: Arc::new(Mutex::new(ours)),
                _child: child,
                info,
                alive: Arc::new(AtomicBool::new(true)),
            }),
            Ok(Hello::Failed(why)) => Err(err(why)),
            Err(_) => Err(err(
                "the fork-server ended during its preload (see its stderr above)".into(),
            )),
        }
    }

    pub(crate) fn info(&self) -> &ZygoteInfo {
        &self.info
    }

    /// Whether the fork-server still answers.
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// A socket to the fork-server for one jail helper (close-on-exec; the
    /// helper gets it on [`crate::spec::ZYGOTE_FD`]).
    pub(crate) fn client(&self) -> Result<OwnedFd, SandboxError> {
        if !self.alive() {
            return Err(SandboxError::Zygote("the fork-server is gone".into()));
        }
        let sock = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        sock.try_clone()
            .map_err(|e| SandboxError::Zygote(format!("dup socket: {e}")))
    }
}

/// The fds of one program request, in protocol order.
pub(crate) struct ProgramFds<'a> {
    pub stdout: &'a dyn AsRawFd,
    pub stderr: &'a dyn AsRawFd,
    pub exec_w: &'a OwnedFd,
    pub go_r: &'a OwnedFd,
    pub exit_w: &'a OwnedFd,
    pub init_pidfd: &'a OwnedFd,
}

/// In a jail helper: asks the fork-server on `sock` for the program process
/// of the jail whose init `fds.init_pidfd` is; returns its pid.
pub(crate) fn request_program(
    sock: &OwnedFd,
    spec_line: &[u8],
    fds: &ProgramFds<'_>,
) -> Result<i32, String> {
    let (ours, theirs) = seqpacket::pair().map_err(|e| format!("socketpair: {e}"))?;
    let mut msg = Vec::with_capacity(spec_line.len() + 1);
    msg.push(b'g');
    msg.extend_from_slice(spec_line);
    let raw = [
        fds.stdout.as_raw_fd(),
        fds.stderr.as_raw_fd(),
        fds.exec_w.as_raw_fd(),
        fds.go_r.as_raw_fd(),
        fds.exit_w.as_raw_fd(),
        fds.init_pidfd.as_raw_fd(),
        theirs.as_raw_fd(),
    ];
    send(sock, &msg, &raw).map_err(|e| format!("ask the fork-server: {e}"))?;
    drop(theirs);
    let (bytes, _) = recv(&ours, 4096).map_err(|e| format!("fork-server answer: {e}"))?;
    match <[u8; 4]>::try_from(bytes.as_slice()) {
        Ok(pid) => Ok(i32::from_le_bytes(pid)),
        Err(_) if bytes.is_empty() => Err("the fork-server is gone".to_owned()),
        Err(_) => Err(format!(
            "the fork-server refused: {}",
            String::from_utf8_lossy(&bytes)
        )),
    }
}

/// Entry point of `kiln __zygote`. Never returns.
pub fn zygote_main() -> ! {
    seqpacket::serve_stdin("zygote", serve, |sock, why| {
        let hello = serde_json::to_vec(&Hello::Failed(why.to_owned())).unwrap_or_default();
        let _ = send(sock, &hello, &[]);
    })
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

/// Loads the template, reports, then forks jail programs until the socket
/// closes.
fn serve(sock: &OwnedFd) -> Result<(), String> {
    sys::close_from(3).map_err(|e| format!("close inherited fds: {e}"))?;
    let (bytes, _) = recv(sock, CONFIG_MAX).map_err(|e| format!("read config: {e}"))?;
    let cfg: ZygoteConfig =
        serde_json::from_slice(&bytes).map_err(|e| format!("parse config: {e}"))?;
    sys::ensure_single_threaded().map_err(|e| e.to_string())?;
    // Programs are forks of this process: host root's supplementary groups
    // (gid 0 among them) must not follow them into the jail.
    nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups: {e}"))?;
    embed::set_environment(&cfg.env).map_err(|e| e.to_string())?;
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;
    let t0 = Instant::now();
    embed::initialize(&cfg.libpython, &cfg.preload).map_err(|e| e.to_string())?;
    // Forking needs a single thread: a preload that started one (OpenBLAS
    // without OPENBLAS_NUM_THREADS=1, say) is refused here, not later.
    sys::ensure_single_threaded().map_err(|e| format!("after the preload: {e}"))?;
    let info = ZygoteInfo {
        pid: std::process::id(),
        preload_ms: u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX),
        rss_bytes: rss_bytes(),
    };
    let hello = serde_json::to_vec(&Hello::Ready(info)).map_err(|e| e.to_string())?;
    send(sock, &hello, &[]).map_err(|e| format!("report ready: {e}"))?;

    // Programs are our children: each is reaped here and its status goes
    // to its jail's init through the exit pipe. Any other child (none is
    // expected: CLONE_PARENT, the only way a program could give us one, is
    // refused by seccomp) is reaped too, or it would stay a zombie in its
    // jail's pid namespace and keep the jail's init from ever finishing.
    // SIGCHLD arrives on a signalfd; the forks unblock it (reset_signals).
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    chld.thread_block()
        .map_err(|e| format!("block SIGCHLD: {e}"))?;
    let sigfd = SignalFd::with_flags(&chld, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(|e| format!("signalfd: {e}"))?;
    let own_pid_ns = std::fs::File::open("/proc/self/ns/pid")
        .map_err(|e| format!("open own pid namespace: {e}"))?;
    // pid -> write end of its jail's exit pipe.
    let mut live: HashMap<i32, OwnedFd> = HashMap::new();
    // One buffer for every request: a fresh 1 MiB one each time would be
    // zeroed, and after the previous fork every page it touches is a
    // copy-on-write fault (measured: 4 % of all CPU under load). What a
    // request wrote is zeroed again once its fork has its own copy, so no
    // fork sees an earlier jail's spec.
    let mut buf = vec![0u8; CONFIG_MAX];
    loop {
        let sock_ready = {
            let mut fds = [
                PollFd::new(sock.as_fd(), PollFlags::POLLIN),
                PollFd::new(sigfd.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(format!("poll: {e}")),
            }
            fds[0].revents().is_some_and(|r| !r.is_empty())
        };
        // Drain the coalesced SIGCHLDs, then reap whatever has exited.
        while let Ok(Some(_)) = sigfd.read_signal() {}
        reap_children(&mut live);
        if !sock_ready {
            continue;
        }
        let (n, fds) = recv_into(sock, &mut buf).map_err(|e| format!("read request: {e}"))?;
        if n == 0 && fds.is_empty() {
            return Ok(()); // the server and every helper closed the socket
        }
        let forked = handle_request(&mut buf[..n], fds, &own_pid_ns, &mut live);
        buf[..n].fill(0);
        forked?;
    }
}

/// Reaps every child that has exited; a program's status goes to its
/// jail's init.
fn reap_children(live: &mut HashMap<i32, OwnedFd>) {
    while let Ok(Some((pid, r))) = sys::reap_any_child() {
        if let Some(exit_w) = live.remove(&pid) {
            let msg = StatusMsg::Finished {
                code: r.code,
                signal: r.signal,
                cpu_us: r.cpu_us,
            };
            let _ = nix::unistd::write(&exit_w, &msg.to_line());
        }
    }
}

/// Forks the program a request asks for (see the module's protocol) and
/// answers on its reply socket. Only fails when the fork-server itself is
/// broken (it cannot return to its own pid namespace).
fn handle_request(
    request: &mut [u8],
    fds: Vec<OwnedFd>,
    own_pid_ns: &std::fs::File,
    live: &mut HashMap<i32, OwnedFd>,
) -> Result<(), String> {
    if request.first() != Some(&b'g') {
        return Ok(()); // not a request; its fds close here
    }
    let Ok(fds) = <[OwnedFd; 7]>::try_from(fds) else {
        return Ok(()); // no reply socket to answer on: the helper sees EOF
    };
    let [stdout, stderr, exec_w, go_r, exit_w, init_pidfd, reply] = fds;
    let forked = nix::sched::setns(&init_pidfd, CloneFlags::CLONE_NEWPID)
        .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
        .and_then(|()| sys::clone3_fork(0, None));
    // Our own children go back to our own pid namespace.
    let restored = nix::sched::setns(own_pid_ns, CloneFlags::CLONE_NEWPID);
    match forked {
        Ok(Forked::Child) => {
            drop(reply);
            drop(exit_w);
            become_program(
                &mut request[1..],
                [stdout, stderr, exec_w, go_r, init_pidfd],
            )
        }
        Ok(Forked::Parent { pid, .. }) => {
            restored.map_err(|e| format!("back to our pid namespace: {e}"))?;
            let _ = send(&reply, &pid.as_raw().to_le_bytes(), &[]);
            live.insert(pid.as_raw(), exit_w);
            Ok(())
        }
        Err(e) => {
            restored.map_err(|e| format!("back to our pid namespace: {e}"))?;
            let _ = send(&reply, format!("fork into the jail: {e}").as_bytes(), &[]);
            Ok(())
        }
    }
}

/// In the fork (already in the jail's pid namespace): installs /dev/null,
/// stdout and stderr as 0–2, the exec and go pipes and the init's pidfd
/// above them, closes everything else, joins the jail's cgroups and other
/// namespaces and becomes the jail's program process. Never returns.
fn become_program(spec_line: &mut [u8], fds: [OwnedFd; 5]) -> ! {
    let fail = |what: &str, e: &dyn std::fmt::Display| -> ! {
        eprintln!("kiln __zygote: program {what}: {e}");
        sys::exit_now(2)
    };
    if let Err(e) = sys::reset_signals() {
        fail("reset signals", &e);
    }
    // The fork-server gone, the jail's program goes too.
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        fail("set parent-death signal", &e);
    }
    let devnull = match nix::fcntl::open(
        "/dev/null",
        OFlag::O_RDWR | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(f) => f,
        Err(e) => fail("open /dev/null", &e),
    };
    // 0-3: /dev/null, stdout, stderr, /dev/null; 4-6: exec, go, init pidfd.
    let order = [
        &devnull, &fds[0], &fds[1], &devnull, &fds[2], &fds[3], &fds[4],
    ];
    if let Err(e) = sys::install_fds(&order) {
        fail("install fds", &e);
    }
    for fd in [4, 5, 6] {
        if let Err(e) = sys::set_cloexec(fd, true) {
            fail("mark fds", &e);
        }
    }
    // Not dropped: an original may sit on 0-6 by now, replaced by dup2;
    // close_from closes the rest (the socket, originals, copies).
    std::mem::forget(fds);
    std::mem::forget(devnull);
    if let Err(e) = sys::close_from(7) {
        fail("close fds", &e);
    }
    let (Some(exec_w), Some(go_r), Some(init_pidfd)) = (
        sys::adopt_inherited_fd(4),
        sys::adopt_inherited_fd(5),
        sys::adopt_inherited_fd(6),
    ) else {
        fail("adopt fds", &"missing");
    };
    jail::forked_program_main(spec_line, exec_w, go_r, init_pidfd, run_embedded)
}

/// The parked program process's last step: the process takes the go's
/// command line and environment as its own in the kernel's eyes (`ps`,
/// `/proc/self/{comm,cmdline,environ}` show `python3 -u main.py ARGS`, not
/// the fork-server's `kiln __zygote`), then the preload's runner takes over
/// (it ends the process itself).
fn run_embedded(go: &GoMsg) -> ! {
    // An execve here would make the process dumpable again (no privilege
    // changes at it), so its /proc files are its own: /proc/self/environ
    // readable, as in a cold run. Leaving uid 0 had cleared the flag.
    if let Err(e) = nix::sys::prctl::set_dumpable(true) {
        eprintln!("kiln: set dumpable: {e}");
        sys::exit_now(1)
    }
    // best effort: without checkpoint/restore support in the kernel only
    // the name changes; the run itself is the same either way
    let _ = sys::set_exec_identity(&go.argv, &go.env);
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
