//! Raw system calls that neither `nix` nor `std` wrap safely: `clone3`,
//! `mount_setattr`, `close_range`, fd plumbing on raw fd numbers, forking,
//! signal reset, the `pre_exec` hook that hands the status pipe to the
//! helper, loop-device set-up and `atexit`.
//!
//! This is the only module of the crate that contains `unsafe`. Every function
//! here exposes a safe interface: the preconditions an `unsafe` block relies on
//! are either checked at run time (single-threadedness before forking) or
//! guaranteed by the function's own construction.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use nix::errno::Errno;
use nix::unistd::Pid;

/// `MOUNT_ATTR_RDONLY` from `<linux/mount.h>`.
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
/// `MOUNT_ATTR_NOSUID`.
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
/// `MOUNT_ATTR_NODEV`.
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
/// `MOUNT_ATTR_NOEXEC`.
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;

const AT_RECURSIVE: libc::c_uint = 0x8000;
const CLONE_PIDFD: u64 = 0x1000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

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

/// `struct mount_attr` for `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
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
    ensure_single_threaded()?;
    let mut pidfd: libc::c_int = -1;
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
    // SAFETY: `args` is a fully initialised clone_args of the size we pass and
    // outlives the call; `pidfd` points to a live c_int. Without CLONE_VM and
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

/// `mount_setattr(2)` on `path`: sets `set` attributes (MOUNT_ATTR_*) on the
/// mount at `path`, and on every mount below it when `recursive`.
pub fn mount_setattr(path: &Path, recursive: bool, set: u64) -> Result<(), Errno> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let mut attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: `c` is a NUL-terminated path and `attr` a valid mount_attr of
    // the size we pass; both outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags,
            std::ptr::addr_of_mut!(attr),
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r == -1 { Err(Errno::last()) } else { Ok(()) }
}

/// Marks every fd `>= first` close-on-exec (`close_range(first, ~0,
/// CLOSE_RANGE_CLOEXEC)`), falling back to walking `/proc/self/fd` on
/// kernels older than 5.11.
pub fn cloexec_from(first: RawFd) -> Result<(), Errno> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only changes fd flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let err = Errno::last();
    if err != Errno::ENOSYS && err != Errno::EINVAL {
        return Err(err);
    }
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd >= first)
        .collect();
    for fd in fds {
        // Errors are expected for the directory fd that read_dir already closed.
        let _ = set_cloexec(fd, true);
    }
    Ok(())
}

/// Closes every fd `>= first` (`close_range`, or a walk of `/proc/self/fd`
/// on kernels older than 5.9). Only for process start-up, before this
/// process opened anything of its own above `first`.
pub fn close_from(first: RawFd) -> Result<(), Errno> {
    // SAFETY: close_range only closes descriptors; per this function's
    // contract no Rust object owns a descriptor in the range.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as libc::c_uint,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let err = Errno::last();
    if err != Errno::ENOSYS {
        return Err(err);
    }
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd >= first)
        .collect();
    for fd in fds {
        // EBADF is expected for the directory fd read_dir already closed.
        close_raw(fd);
    }
    Ok(())
}

/// Sets or clears `FD_CLOEXEC` on a raw fd number.
pub fn set_cloexec(fd: RawFd, on: bool) -> Result<(), Errno> {
    // SAFETY: F_GETFD/F_SETFD only read and write descriptor flags; an invalid
    // fd yields EBADF.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags < 0 {
            return Err(Errno::last());
        }
        let new = if on {
            flags | libc::FD_CLOEXEC
        } else {
            flags & !libc::FD_CLOEXEC
        };
        if libc::fcntl(fd, libc::F_SETFD, new) < 0 {
            return Err(Errno::last());
        }
    }
    Ok(())
}

/// `dup2(from, to)` on raw fd numbers (the result has no `FD_CLOEXEC`).
pub fn dup2_raw(from: &impl AsRawFd, to: RawFd) -> Result<(), Errno> {
    // SAFETY: dup2 atomically replaces `to`; `from` is a live descriptor
    // borrowed for the duration of the call.
    let r = unsafe { libc::dup2(from.as_raw_fd(), to) };
    if r < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// Makes `fds[i]` appear as fd `i` (without close-on-exec), through copies
/// above 16 first: a source may already sit on a target number. A source
/// that sat on a target is replaced, so callers must not close the sources
/// afterwards (forget them; `close_from(fds.len())` closes the rest).
pub fn install_fds(fds: &[&OwnedFd]) -> Result<(), Errno> {
    use nix::fcntl::{FcntlArg, fcntl};
    let mut high = Vec::with_capacity(fds.len());
    for fd in fds {
        high.push(fcntl(fd, FcntlArg::F_DUPFD_CLOEXEC(16))?);
    }
    for (target, fd) in high.iter().enumerate() {
        dup2_raw(fd, target as RawFd)?;
    }
    // the copies (all above 16) close here
    Ok(())
}

/// Closes a raw fd number that this process does not otherwise own.
pub fn close_raw(fd: RawFd) {
    // SAFETY: closing a descriptor number; the callers use it on inherited
    // descriptors that no Rust object owns (e.g. the status fd in the user
    // program's process before exec).
    unsafe {
        libc::close(fd);
    }
}

/// Takes ownership of an fd number inherited from the parent process, if it
/// is open. Call at most once per fd number, at process start.
pub fn adopt_inherited_fd(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: F_GETFD only reads descriptor flags.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: the descriptor is open (checked above) and, per this function's
    // contract, was inherited and is not owned by anything else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
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

/// `struct prctl_mm_map` of `<linux/prctl.h>`.
#[repr(C)]
struct PrctlMmMap {
    start_code: u64,
    end_code: u64,
    start_data: u64,
    end_data: u64,
    start_brk: u64,
    brk: u64,
    start_stack: u64,
    arg_start: u64,
    arg_end: u64,
    env_start: u64,
    env_end: u64,
    auxv: *const u64,
    auxv_size: u32,
    exe_fd: u32,
}

const PR_SET_MM: libc::c_int = 35;
const PR_SET_MM_MAP: libc::c_ulong = 14;

/// Makes this process show `argv` and `env` as an `execve` of them would:
/// `/proc/self/comm` (so `ps`'s and psutil's name) becomes `argv[0]`'s file
/// name, and `/proc/self/cmdline` and `/proc/self/environ` read exactly
/// `argv` and `env`, NUL-terminated. The command line and environment are
/// copied into memory that lives as long as the process (they are what the
/// kernel reads from then on). Setting the map (`PR_SET_MM_MAP`, no
/// capability needed) fails on a kernel without checkpoint/restore support;
/// the name is set anyway.
pub fn set_exec_identity(argv: &[String], env: &[(String, String)]) -> io::Result<()> {
    let first = argv.first().ok_or_else(|| io::Error::other("empty argv"))?;
    let name = Path::new(first)
        .file_name()
        .map_or_else(|| first.as_bytes().to_vec(), |n| n.as_bytes().to_vec());
    let name = CString::new(name.into_iter().take(15).collect::<Vec<u8>>())
        .map_err(|_| io::Error::other("NUL in argv[0]"))?;
    nix::sys::prctl::set_name(&name)?;

    // what the map must repeat of the current layout
    let [
        start_code,
        end_code,
        start_stack,
        start_data,
        end_data,
        start_brk,
    ] = stat_fields([26, 27, 28, 45, 46, 47])?;
    let mut block = Vec::new();
    for a in argv {
        block.extend_from_slice(a.as_bytes());
        block.push(0);
    }
    let args_len = block.len();
    for (k, v) in env {
        block.extend_from_slice(k.as_bytes());
        block.push(b'=');
        block.extend_from_slice(v.as_bytes());
        block.push(0);
    }
    if block.iter().filter(|&&b| b == 0).count() != argv.len() + env.len() {
        return Err(io::Error::other("NUL inside an argument or variable"));
    }
    // lives until the process ends: the kernel reads it for /proc from now on
    let block: &'static [u8] = Box::leak(block.into_boxed_slice());
    let base = block.as_ptr() as u64;
    // SAFETY: brk(0) changes nothing and returns the current break.
    let brk = unsafe { libc::syscall(libc::SYS_brk, 0usize) };
    let map = PrctlMmMap {
        start_code,
        end_code,
        start_data,
        end_data,
        start_brk,
        brk: u64::try_from(brk).map_err(|_| io::Error::last_os_error())?,
        start_stack,
        arg_start: base,
        arg_end: base + args_len as u64,
        env_start: base + args_len as u64,
        env_end: base + block.len() as u64,
        auxv: std::ptr::null(),
        auxv_size: 0,
        exe_fd: u32::MAX,
    };
    let unused: libc::c_ulong = 0;
    // SAFETY: `map` is a fully initialised prctl_mm_map of the size passed;
    // the kernel only reads it. Every address in it is this process's own
    // (its current layout, and `block`, which is never freed); no auxv and
    // no exe file (exe_fd -1) are changed.
    let rc = unsafe {
        libc::prctl(
            PR_SET_MM,
            PR_SET_MM_MAP,
            &map as *const PrctlMmMap as libc::c_ulong,
            std::mem::size_of::<PrctlMmMap>() as libc::c_ulong,
            unused,
        )
    };
    Errno::result(rc).map(drop).map_err(io::Error::from)
}

/// `_exit(2)`: ends the process without running atexit handlers or flushing
/// stdio buffers inherited from the parent's copy of memory.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit is always safe to call and never returns.
    unsafe { libc::_exit(code) }
}

/// Landlock ABI version the kernel supports, if Landlock is enabled.
pub fn landlock_abi() -> Option<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attr, size 0 and the VERSION flag the call only
    // returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(v).ok().filter(|v| *v > 0)
}

/// Makes `fd` appear as fd `target` (without `FD_CLOEXEC`) in the process
/// that `cmd` spawns, and nowhere else: `fd` itself should be `O_CLOEXEC` so
/// concurrent spawns never inherit it.
pub fn pass_fd_to_child(cmd: &mut tokio::process::Command, fd: RawFd, target: RawFd) {
    let hook = move || -> io::Result<()> {
        // Only async-signal-safe calls (dup2, fcntl), no allocation: this runs
        // between fork and exec in a copy of a multi-threaded process.
        // SAFETY: plain descriptor syscalls on numbers owned by this child.
        unsafe {
            if fd == target {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(fd, target) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the hook only calls async-signal-safe functions and does not
    // allocate, as required for code running between fork and exec.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// Empty the capability bounding set and the ambient set of the calling
/// process, so no later transition (file capabilities, setuid binaries) can
/// ever hand a capability back. Needs CAP_SETPCAP in the current user
/// namespace (the jail's root has it before it drops to uid 1000).
pub fn drop_bounding_and_ambient_caps() -> Result<(), Errno> {
    // SAFETY: PR_CAP_AMBIENT with PR_CAP_AMBIENT_CLEAR_ALL takes no pointers;
    // the unused arguments are zero as the man page requires.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r != 0 {
        return Err(Errno::last());
    }
    for cap in 0..64 as libc::c_ulong {
        // SAFETY: PR_CAPBSET_DROP takes a capability number by value and no
        // pointers; numbers past the kernel's last capability fail with EINVAL.
        let r = unsafe {
            libc::prctl(
                libc::PR_CAPBSET_DROP,
                cap,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        if r != 0 {
            let e = Errno::last();
            if e == Errno::EINVAL {
                break;
            }
            return Err(e);
        }
    }
    Ok(())
}

/// `PR_SET_SECUREBITS` with `SECBIT_NO_SETUID_FIXUP`: changing the
/// effective uid away from 0 keeps the capability sets. Needs
/// `CAP_SETPCAP`. The bit is not inherited into a new user namespace.
pub fn keep_caps_across_uid_changes() -> Result<(), Errno> {
    // SAFETY: PR_SET_SECUREBITS takes its value by value and no pointers;
    // the unused arguments are zero.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_SECUREBITS,
            libc::SECBIT_NO_SETUID_FIXUP as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r != 0 { Err(Errno::last()) } else { Ok(()) }
}

/// `LOOP_CTL_GET_FREE` from `<linux/loop.h>`.
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
/// `LOOP_CONFIGURE` (Linux 5.8).
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
/// `LOOP_SET_FD` and `LOOP_SET_STATUS64`, for older kernels.
const LOOP_SET_FD: libc::c_ulong = 0x4C00;
const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
/// The device detaches itself when its last user (the mount) goes away.
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config`.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

fn loop_info(flags: u32) -> LoopInfo64 {
    LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: flags,
        lo_file_name: [0; 64],
        lo_crypt_name: [0; 64],
        lo_encrypt_key: [0; 32],
        lo_init: [0; 2],
    }
}

/// Binds `backing` to a free loop device with autoclear set and returns the
/// device's path and an open descriptor of it. Keep the descriptor until the
/// device is mounted: autoclear detaches the device when its last user goes
/// away, so after unmounting nothing is left behind.
pub fn loop_attach(backing: &impl AsRawFd) -> io::Result<(std::path::PathBuf, OwnedFd)> {
    use std::os::unix::fs::OpenOptionsExt;
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/loop-control")?;
    // Another process may take the device between GET_FREE and CONFIGURE.
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a number.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = std::path::PathBuf::from(format!("/dev/loop{n}"));
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)?;
        let cfg = LoopConfig {
            fd: u32::try_from(backing.as_raw_fd())
                .map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?,
            block_size: 0,
            info: loop_info(LO_FLAGS_AUTOCLEAR),
            reserved: [0; 8],
        };
        // SAFETY: `cfg` is a fully initialised loop_config that outlives the
        // call; the kernel only reads it.
        let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE as _, &cfg) };
        if r == 0 {
            return Ok((path, OwnedFd::from(dev)));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EBUSY) => continue,
            Some(libc::EINVAL | libc::ENOTTY) => {
                // Kernel before 5.8: bind, then set the flags.
                // SAFETY: LOOP_SET_FD takes the backing descriptor by value.
                let r =
                    unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_FD as _, backing.as_raw_fd()) };
                if r != 0 {
                    let err = io::Error::last_os_error();
                    if err.raw_os_error() == Some(libc::EBUSY) {
                        continue;
                    }
                    return Err(err);
                }
                let info = loop_info(LO_FLAGS_AUTOCLEAR);
                // SAFETY: `info` is a fully initialised loop_info64 that
                // outlives the call; the kernel only reads it.
                let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_SET_STATUS64 as _, &info) };
                if r != 0 {
                    let err = io::Error::last_os_error();
                    // SAFETY: LOOP_CLR_FD takes no argument; it undoes SET_FD.
                    unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CLR_FD as _) };
                    return Err(err);
                }
                return Ok((path, OwnedFd::from(dev)));
            }
            _ => return Err(err),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::ResourceBusy,
        "every free loop device was taken by someone else",
    ))
}

/// Overwrites `bytes` with zeros in a way the compiler cannot drop as a
/// dead store (memory about to be freed, or never read again by us but
/// readable by the program that inherits this process's memory).
pub fn scrub(bytes: &mut [u8]) {
    for b in bytes.iter_mut() {
        // SAFETY: `b` is a valid, exclusive reference to one byte.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

/// Zeroes a path's bytes, then frees it.
pub fn scrub_path(path: std::path::PathBuf) {
    let mut v = path.into_os_string().into_vec();
    scrub(&mut v);
}

/// Zeroes a string's bytes, then frees it.
pub fn scrub_string(s: String) {
    let mut v = s.into_bytes();
    scrub(&mut v);
}

/// Numbered fields `numbers` of `/proc/self/stat` (1: the pid, 2: the
/// name, which is skipped over: it may hold spaces and parentheses).
fn stat_fields<const N: usize>(numbers: [usize; N]) -> io::Result<[u64; N]> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let bad = || io::Error::other("unparsable /proc/self/stat");
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(bad)?;
    // `rest` starts at field 3 (state)
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let mut out = [0; N];
    for (o, n) in out.iter_mut().zip(numbers) {
        *o = n
            .checked_sub(3)
            .and_then(|i| fields.get(i)?.parse().ok())
            .ok_or_else(bad)?;
    }
    Ok(out)
}

/// Fields 48 and 49 of `/proc/self/stat`: where the kernel reads this
/// process's command line from.
fn arg_area() -> io::Result<(u64, u64)> {
    let [start, end] = stat_fields([48, 49])?;
    Ok((start, end))
}

/// Shows this process as `name`: its `comm` (what `ps` and
/// `/proc/<pid>/comm` show) and its command line (`/proc/<pid>/cmdline`),
/// whose bytes (the argument area the kernel set up at exec) are
/// overwritten with `name` and NULs. No privilege is needed (unlike
/// `PR_SET_MM`, which wants `CAP_SYS_RESOURCE` in the initial user
/// namespace, lost once the helper is in the jail's). Children made by
/// fork inherit both. The process must not read its arguments afterwards.
pub fn set_process_name(name: &str) -> io::Result<()> {
    let comm = std::ffi::CString::new(name).map_err(|_| io::Error::other("NUL in name"))?;
    nix::sys::prctl::set_name(&comm)?;
    let (start, end) = arg_area()?;
    let len = end.saturating_sub(start) as usize;
    if len == 0 {
        return Ok(());
    }
    let bytes = comm.as_bytes();
    // keep at least one NUL at the end so readers see one terminated string
    let keep = bytes.len().min(len - 1);
    // SAFETY: [start, end) is this process's argument area as the kernel
    // reports it: part of the initial stack mapping, readable and
    // writable, and never freed. The helper is single-threaded here, and
    // nothing reads the arguments after this point (std's args() would see
    // the new bytes, which are still valid NUL-terminated strings).
    unsafe {
        let area = std::slice::from_raw_parts_mut(start as usize as *mut u8, len);
        area.fill(0);
        area[..keep].copy_from_slice(&bytes[..keep]);
    }
    Ok(())
}

/// `FITRIM` (`_IOWR('X', 121, struct fstrim_range)`).
const FITRIM: libc::c_ulong = 0xC018_5879;

/// `struct fstrim_range`.
#[repr(C)]
struct FstrimRange {
    start: u64,
    len: u64,
    minlen: u64,
}

/// `FITRIM` on the filesystem of the open directory `dir`: discards every
/// free block (what `fstrim` does), so a loop-mounted image gives freed
/// space back to the host in one batch. Returns the bytes trimmed.
pub fn fstrim(dir: &impl AsRawFd) -> io::Result<u64> {
    let mut range = FstrimRange {
        start: 0,
        len: u64::MAX,
        minlen: 0,
    };
    // SAFETY: `range` is a fully initialised fstrim_range that outlives the
    // call; the kernel reads it and writes the trimmed length back.
    let r = unsafe { libc::ioctl(dir.as_raw_fd(), FITRIM as _, &mut range) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(range.len)
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

/// Registers `fd` with tokio's reactor for readiness to read (a pidfd: its
/// process exited; a socket: a message arrived).
pub fn async_readable(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the `OwnedFd` is a valid open descriptor and the `AsyncFd`
    // takes ownership of it: nothing can close or replace it while it is
    // registered.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    };
    registered.map_err(io::Error::from)
}
