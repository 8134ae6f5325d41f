//! Mounts and the block devices behind them: `mount_setattr`, loop devices
//! for the quota-limited workspace filesystems, and `FITRIM`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;

/// `MOUNT_ATTR_RDONLY` from `<linux/mount.h>`.
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
/// `MOUNT_ATTR_NOSUID`.
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
/// `MOUNT_ATTR_NODEV`.
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
/// `MOUNT_ATTR_NOEXEC`.
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;

const AT_RECURSIVE: libc::c_uint = 0x8000;

/// `struct mount_attr` for `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
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

/// Which mount `path` is on, as `statx` reports it (the final component is
/// not followed): its mount id (`STATX_MNT_ID`) and the device of its
/// filesystem. `Ok(None)` on kernels that report no mount id (before
/// Linux 5.8). A path that is a mount point reports the mount on top.
pub fn mount_of(path: &Path) -> io::Result<Option<(u64, (u32, u32))>> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: an all-zero `statx` is a valid value of the plain C struct.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statx buffer;
    // both outlive the call, which writes only into `st`.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT,
            libc::STATX_MNT_ID,
            &mut st,
        )
    };
    if r == -1 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSYS) => Ok(None),
            _ => Err(e),
        };
    }
    if st.stx_mask & libc::STATX_MNT_ID == 0 {
        return Ok(None);
    }
    Ok(Some((st.stx_mnt_id, (st.stx_dev_major, st.stx_dev_minor))))
}

/// `open_tree(path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)`: a detached copy
/// of the mount at `path` (a bind of it; not the mounts below it), which
/// [`move_mount_to`] attaches elsewhere, in another mount namespace too.
/// Linux 5.2.
pub fn open_tree_clone(path: &Path) -> io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call, which
    // reads only it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(r).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel just returned `fd`, open and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `move_mount(tree, "", AT_FDCWD, to, MOVE_MOUNT_F_EMPTY_PATH)`: attaches
/// the detached mount `tree` (from [`open_tree_clone`]) at `to` in the
/// caller's mount namespace.
pub fn move_mount_to(tree: &impl AsRawFd, to: &Path) -> io::Result<()> {
    let c = CString::new(to.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` and the empty string are NUL-terminated and outlive the
    // call; `tree` is an open descriptor the caller holds.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
