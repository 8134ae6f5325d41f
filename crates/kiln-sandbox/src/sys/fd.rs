//! File descriptors on raw numbers: close-on-exec, closing ranges, `dup2`,
//! installing fds at fixed numbers, adopting inherited ones, handing one to a
//! spawned child, and registering one with tokio's reactor.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;

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
