//! How a process shows itself and what its memory keeps: the `execve`-like
//! identity of a forked program (`comm`, `cmdline`, `environ`), the process
//! name, and scrubbing secrets from memory.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use nix::errno::Errno;

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
