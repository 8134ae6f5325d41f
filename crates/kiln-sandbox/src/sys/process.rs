//! Processes: forking (`clone3`, `fork`) refused unless single-threaded,
//! the namespace probe, signal dispositions, `_exit`, `atexit`, reaping and
//! killing by pidfd.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::unistd::Pid;

const CLONE_PIDFD: u64 = 0x1000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` (CLONE_ARGS_SIZE_VER2, 88 bytes); every field is a
/// `__aligned_u64` on every architecture.
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Which side of a fork-like call we are on.
pub enum Forked {
    /// The new process.
    Child,
    /// The calling process; `pidfd` is only set by [`clone3_fork`].
    Parent { pid: Pid, pidfd: Option<OwnedFd> },
}

/// Number of threads of the calling process, from `/proc/self/stat`.
fn thread_count() -> io::Result<u64> {
    use std::io::Read;
    // One read: procfs regenerates the line on every read call.
    let mut buf = Vec::with_capacity(1024);
    std::fs::File::open("/proc/self/stat")?.read_to_end(&mut buf)?;
    let stat = String::from_utf8_lossy(&buf);
    // Field 20 (num_threads); fields after the `(comm)` are space separated.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| io::Error::other("unparsable /proc/self/stat"))?;
    after
        .split_whitespace()
        .nth(17)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| io::Error::other("unparsable /proc/self/stat"))
}

/// Fails unless the calling process has exactly one thread.
pub fn ensure_single_threaded() -> io::Result<()> {
    match thread_count()? {
        1 => Ok(()),
        n => Err(io::Error::other(format!(
            "refusing to fork a process with {n} threads"
        ))),
    }
}

/// `clone3` with fork semantics (no `CLONE_VM`), `SIGCHLD` as exit signal and
/// a pidfd for the child. `flags` are extra `CLONE_*` flags (namespaces);
/// `cgroup` is a cgroup2 directory fd to start the child in
/// (`CLONE_INTO_CGROUP`).
///
/// Refuses (without cloning) unless the calling process is single-threaded:
/// the child continues with a copy of the caller's memory and may allocate.
pub fn clone3_fork(flags: u64, cgroup: Option<RawFd>) -> io::Result<Forked> {
    clone3_fork_as(flags, cgroup, None)
}

/// [`clone3_fork`], the child taking pid `tid` in the pid namespace it is
/// born in (`set_tid`; the caller needs `CAP_SYS_ADMIN` over that
/// namespace). `EEXIST` when `tid` is taken there.
pub fn clone3_fork_as(
    flags: u64,
    cgroup: Option<RawFd>,
    tid: Option<libc::pid_t>,
) -> io::Result<Forked> {
    ensure_single_threaded()?;
    let mut pidfd: libc::c_int = -1;
    let tids: [libc::pid_t; 1] = [tid.unwrap_or(0)];
    let mut args = CloneArgs {
        flags: flags | CLONE_PIDFD,
        pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    if let Some(fd) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = fd as u64;
    }
    if tid.is_some() {
        args.set_tid = tids.as_ptr() as u64;
        args.set_tid_size = 1;
    }
    // SAFETY: `args` is a fully initialised clone_args of the size we pass and
    // outlives the call, as does `tids`, which `set_tid` points to when set;
    // `pidfd` points to a live c_int. Without CLONE_VM and
    // with a zero stack the kernel duplicates the address space like fork(2),
    // so the child runs on its own copy of this stack. We checked above that
    // the process is single-threaded, so no lock (malloc's included) can be
    // held by another thread at the time of the copy.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of_mut!(args),
            std::mem::size_of::<CloneArgs>(),
        )
    };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => {
            // SAFETY: with CLONE_PIDFD the kernel stored a fresh pidfd that
            // nothing else owns.
            let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
            Ok(Forked::Parent {
                pid: Pid::from_raw(pid as libc::pid_t),
                pidfd: Some(pidfd),
            })
        }
    }
}

/// `fork(2)`, refused unless the calling process is single-threaded.
pub fn fork_single_threaded() -> io::Result<Forked> {
    ensure_single_threaded()?;
    // SAFETY: the process is single-threaded (checked above), so the child
    // gets a consistent copy of every lock and may allocate.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => Ok(Forked::Child),
        Ok(nix::unistd::ForkResult::Parent { child }) => Ok(Forked::Parent {
            pid: child,
            pidfd: None,
        }),
        Err(e) => Err(e.into()),
    }
}

/// Checks whether this process may create the given namespaces: forks, calls
/// `unshare(flags)` in the child and reports the child's result. Safe to call
/// from a multi-threaded process: the child makes only raw system calls.
pub fn probe_unshare(flags: libc::c_int) -> Result<(), Errno> {
    // SAFETY: after fork the child calls only async-signal-safe functions
    // (unshare, _exit) and touches no memory shared with other threads.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Errno::last());
    }
    if pid == 0 {
        // SAFETY: raw system calls only; _exit never returns.
        unsafe {
            let code = if libc::unshare(flags) == 0 {
                0
            } else {
                *libc::__errno_location()
            };
            libc::_exit(code & 0xff);
        }
    }
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `status` is a valid out pointer; `pid` is our child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        if Errno::last() != Errno::EINTR {
            return Err(Errno::last());
        }
    }
    if libc::WIFEXITED(status) {
        match libc::WEXITSTATUS(status) {
            0 => Ok(()),
            e => Err(Errno::from_raw(e)),
        }
    } else {
        Err(Errno::ECHILD)
    }
}

/// Resets every signal disposition to the default and unblocks all signals,
/// so the user program does not inherit our `SIGPIPE` ignore (Rust's runtime
/// sets it) or a blocked mask.
pub fn reset_signals() -> Result<(), Errno> {
    for sig in 1..libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL involves no handler code. Signal numbers
        // the C library reserves for itself yield EINVAL, which we ignore.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
    // SAFETY: `set` is initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) != 0 {
            return Err(Errno::last());
        }
    }
    Ok(())
}

/// `_exit(2)`: ends the process without running atexit handlers or flushing
/// stdio buffers inherited from the parent's copy of memory.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit is always safe to call and never returns.
    unsafe { libc::_exit(code) }
}

/// Runs `f` when the process exits normally (`exit`, return from `main`,
/// the test harness's exit) — not on a fatal signal. `f` must not unwind.
pub fn at_exit(f: extern "C" fn()) -> io::Result<()> {
    // SAFETY: `f` is a plain function pointer valid for the whole program.
    if unsafe { libc::atexit(f) } != 0 {
        return Err(io::Error::other("atexit: no room for another handler"));
    }
    Ok(())
}

/// How a reaped child ended: exit code or signal, and the CPU time it and
/// the children it waited for used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub cpu_us: u64,
}

/// A `timeval` (CPU time from `rusage`) in microseconds.
pub fn timeval_micros(t: &libc::timeval) -> u64 {
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_usec).unwrap_or(0)
}

/// `wait4(-1, WNOHANG)`: reaps one child that has exited, whichever it is;
/// `None` when no child has (or there is no child at all).
pub fn reap_any_child() -> Result<Option<(i32, Reaped)>, Errno> {
    let mut status: libc::c_int = 0;
    // SAFETY: `rusage` is plain data the kernel fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = loop {
        // SAFETY: both out-pointers point at live, writable locals.
        let r = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG, &mut usage) };
        match r {
            -1 if Errno::last() == Errno::EINTR => continue,
            -1 if Errno::last() == Errno::ECHILD => return Ok(None),
            -1 => return Err(Errno::last()),
            0 => return Ok(None),
            pid => break pid,
        }
    };
    let (code, signal) = if libc::WIFSIGNALED(status) {
        (None, Some(libc::WTERMSIG(status)))
    } else {
        (Some(libc::WEXITSTATUS(status)), None)
    };
    Ok(Some((
        pid,
        Reaped {
            code,
            signal,
            cpu_us: timeval_micros(&usage.ru_utime) + timeval_micros(&usage.ru_stime),
        },
    )))
}

/// `pidfd_send_signal(pidfd, SIGKILL)`: kills the process the pidfd refers
/// to, never a process that reused its pid.
pub fn pidfd_kill(pidfd: &impl AsRawFd) -> Result<(), Errno> {
    // SAFETY: a plain system call on a descriptor the caller owns; a null
    // siginfo is allowed and means "as kill(2) would send it".
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0 as libc::c_uint,
        )
    };
    if r == -1 { Err(Errno::last()) } else { Ok(()) }
}

/// `pidfd_open(pid, 0)`: a pidfd of `pid` as the caller's pid namespace
/// numbers it (a jail's init opens its own as 1).
pub fn pidfd_open(pid: Pid) -> io::Result<OwnedFd> {
    // SAFETY: a plain system call taking two integers.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0 as libc::c_uint) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// `SIGCHLD` → `SIG_IGN` (the kernel reaps children as they exit) or back
/// to `SIG_DFL`.
pub fn set_sigchld_ignored(ignored: bool) -> Result<(), Errno> {
    use nix::sys::signal::{SigHandler, Signal, signal};
    let handler = if ignored {
        SigHandler::SigIgn
    } else {
        SigHandler::SigDfl
    };
    // SAFETY: SIG_IGN and SIG_DFL install no handler code.
    unsafe { signal(Signal::SIGCHLD, handler) }.map(|_| ())
}

/// Makes the process `cmd` spawns `chroot(2)` into `root` and start in `dir` (a path inside
/// that root) before it executes its program, with no process of its own in between: the way
/// kiln-bench spawns a runtime image's interpreter as a bare baseline (the program path is then
/// looked up inside `root`). Needs `CAP_SYS_CHROOT`. Fails for a path with a NUL byte.
pub fn chroot_before_exec(
    cmd: &mut std::process::Command,
    root: &std::path::Path,
    dir: &std::path::Path,
) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let c = |p: &std::path::Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))
    };
    // made here, in the parent: the hook must not allocate
    let (root, dir) = (c(root)?, c(dir)?);
    let hook = move || -> io::Result<()> {
        // SAFETY: chroot and chdir on NUL-terminated strings that live as long as the hook;
        // both are async-signal-safe and nothing is allocated (this runs between fork and
        // exec in a copy of a possibly multi-threaded process).
        unsafe {
            if libc::chroot(root.as_ptr()) != 0 || libc::chdir(dir.as_ptr()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the hook only calls async-signal-safe functions and does not allocate, as
    // required for code running between fork and exec.
    unsafe {
        cmd.pre_exec(hook);
    }
    Ok(())
}
