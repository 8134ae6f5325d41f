//! The fork-server process (`kiln __zygote`): reads its config, embeds and
//! preloads the interpreter, and forks the program process of each warm
//! `py` jail on request.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use serde::Serialize;

use crate::seqpacket::{self, recv, recv_into, send};
use crate::spec::{GoMsg, StatusMsg};
use crate::sys::{self, Forked};
use crate::{embed, jail};

use super::{Hello, ZygoteConfig, ZygoteInfo};

/// Largest config message (the preload source is a few KiB).
const CONFIG_MAX: usize = 1 << 20;

/// The only variable of a fork-server re-executed inside a runtime image's
/// system: its config (the preload and the jail's environment; no host
/// path, the image's root left out), replaced by that environment before
/// the interpreter starts.
const IN_IMAGE_CONFIG: &str = "KILN_ZYGOTE_CONFIG";

/// Moves into a mount namespace where the image's `/usr` and `/etc` are the
/// system, and executes this program again there, so that the image's
/// loader and C library load it and its `dlopen` of the image's libpython
/// works (a libpython of a newer distribution needs its own C library).
/// Returns only why that failed.
fn reexec_in_image(root: &std::path::Path, cfg: &ZygoteConfig) -> String {
    if let Err(e) = crate::mountns::enter_image_system(root) {
        return format!("enter the runtime image {}: {e}", root.display());
    }
    // `kiln __zygote SLOTS_DIR`: no workspace is needed here
    if let Some(slots) = std::env::args_os().nth(2)
        && let Err(e) = crate::mountns::detach_private_mounts_below(std::path::Path::new(&slots))
    {
        return format!("drop the slots' filesystems: {e}");
    }
    let inner = ZygoteConfig {
        image_root: None,
        ..cfg.clone()
    };
    let json = match serde_json::to_string(&inner) {
        Ok(j) => j,
        Err(e) => return format!("encode config: {e}"),
    };
    let (Ok(exe), Ok(arg0), Ok(arg1), Ok(var)) = (
        std::ffi::CString::new("/proc/self/exe"),
        std::ffi::CString::new("kiln"),
        std::ffi::CString::new("__zygote"),
        std::ffi::CString::new(format!("{IN_IMAGE_CONFIG}={json}")),
    ) else {
        return "the config holds a NUL byte".to_owned();
    };
    // the socket stays on fd 0 (inherited without close-on-exec)
    match nix::unistd::execve(&exe, &[arg0, arg1], &[var]) {
        Ok(never) => match never {},
        Err(e) => format!("execute the fork-server inside the runtime image: {e}"),
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
    let cfg = match std::env::var(IN_IMAGE_CONFIG) {
        // re-executed inside the image's system (below): the config read then
        Ok(json) => serde_json::from_str(&json).map_err(|e| format!("parse config: {e}"))?,
        Err(_) => {
            let (bytes, _) = recv(sock, CONFIG_MAX).map_err(|e| format!("read config: {e}"))?;
            let cfg: ZygoteConfig =
                serde_json::from_slice(&bytes).map_err(|e| format!("parse config: {e}"))?;
            if let Some(root) = &cfg.image_root {
                return Err(reexec_in_image(root, &cfg));
            }
            cfg
        }
    };
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
    // the interpreter's fork protocol: its locks are taken before the fork,
    // released here after it, and re-made in the child when it runs
    embed::before_fork();
    // The program is pid 2 of the jail, as the first process a cold jail's
    // init forks is; a kept jail's earlier programs (`jail/keep.rs`) then
    // show in no pid of the next (the cursor follows: `jail/mod.rs`).
    let forked = nix::sched::setns(&init_pidfd, CloneFlags::CLONE_NEWPID)
        .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
        .and_then(
            |()| match sys::clone3_fork_as(0, None, Some(crate::jail::PROGRAM_PID)) {
                // taken, or not ours to choose: any pid (a kept jail's
                // program then refuses to run: `jail::kept_program_pids`)
                Err(_) => sys::clone3_fork(0, None),
                forked => forked,
            },
        );
    if !matches!(forked, Ok(Forked::Child)) {
        embed::after_fork_parent();
    }
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
