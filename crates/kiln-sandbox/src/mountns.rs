//! The server's own mount namespace.
//!
//! `kiln serve` moves into a mount namespace of its own before it starts any
//! thread. Its mounts (the slots' loop-mounted workspace filesystems) then
//! live only there. When the last Kiln process is gone, even after SIGKILL,
//! the kernel drops them and the loop devices clear themselves. Nothing
//! stays behind on the host, and every jail copies a short mount table
//! instead of the host's: a jail's `CLONE_NEWNS` copies every mount of its
//! helper's namespace, and tears each down again when the jail ends.
//!
//! The namespace is a slave of the host's: mounts the operator makes later
//! (a remounted data disk) still appear, and nothing propagates back.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};

/// How [`enter_own_mount_namespace`] went, once it was called.
static OUTCOME: OnceLock<Result<(), String>> = OnceLock::new();

/// Moves the calling process into a new mount namespace, a recursive slave
/// of the current one. Must be called while the process has a single
/// thread (before any runtime starts): the namespace belongs to a thread.
/// Records the outcome for [`own_mount_namespace`].
pub fn enter_own_mount_namespace() -> Result<(), String> {
    let r = enter();
    let _ = OUTCOME.set(r.clone());
    r
}

fn enter() -> Result<(), String> {
    new_mount_namespace(MsFlags::MS_SLAVE, "a slave of the host's mounts")
}

/// Moves the calling (single-threaded) process into a new mount namespace
/// whose mounts are all made `propagation` (`what` says which, for errors).
fn new_mount_namespace(propagation: MsFlags, what: &str) -> Result<(), String> {
    crate::sys::ensure_single_threaded().map_err(|e| e.to_string())?;
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare(CLONE_NEWNS): {e}"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | propagation,
        None::<&str>,
    )
    .map_err(|e| format!("make / {what}: {e}"))
}

/// Moves the calling (single-threaded) process into a copy of its mount
/// namespace without the mounts below `dir` that are not shared: the jail
/// launcher's for one-shot jails, with `dir` the slots directory. There the
/// kernel slots' filesystems are private mounts (see
/// `SlotFs::separates_kernels`): those mounted already are detached from
/// the copy, later ones never reach it. The other slots' shared mount
/// points stay, and with them every filesystem the server mounts there
/// later. Propagation is left as it was, so nothing detached here
/// propagates back. Returns how many mounts were detached.
pub(crate) fn enter_without_private_mounts_below(dir: &Path) -> Result<usize, String> {
    crate::sys::ensure_single_threaded().map_err(|e| e.to_string())?;
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("unshare(CLONE_NEWNS): {e}"))?;
    detach_private_mounts_below(dir)
}

/// Detaches, in the caller's mount namespace, every mount below `dir` that
/// is in no peer group (all of them in a private namespace); how many.
pub(crate) fn detach_private_mounts_below(dir: &Path) -> Result<usize, String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("read /proc/self/mountinfo: {e}"))?;
    let mut private: Vec<PathBuf> = info
        .lines()
        .filter_map(private_mount_point)
        .filter(|p| p.starts_with(dir) && p != dir)
        .collect();
    // deepest first: detaching a mount takes the ones below it along
    private.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    let mut detached = 0;
    for point in &private {
        match umount2(point, MntFlags::MNT_DETACH) {
            Ok(()) => detached += 1,
            // gone with a mount above it
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(format!("detach {}: {e}", point.display())),
        }
    }
    Ok(detached)
}

/// The mount point of a `/proc/self/mountinfo` line whose mount is in no
/// peer group (its optional fields, between the sixth field and `-`, hold
/// no `shared:`).
fn private_mount_point(line: &str) -> Option<PathBuf> {
    let fields: Vec<&str> = line.split(' ').collect();
    let point = fields.get(4)?;
    let mut optional = fields.get(6..)?.iter().take_while(|f| **f != "-");
    if optional.any(|f| f.starts_with("shared:")) {
        return None;
    }
    Some(PathBuf::from(crate::cgroup::detect::unescape(point)))
}

/// `None` when this process never tried (tests run servers in their own
/// process); else whether it has a mount namespace of its own.
pub fn own_mount_namespace() -> Option<Result<(), String>> {
    OUTCOME.get().cloned()
}

/// How many mounts this process sees: what every jail's `CLONE_NEWNS`
/// copies (and tears down again when the jail ends).
pub fn visible_mounts() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// Makes the calling process (the Python fork-server, before it loads
/// anything) see a runtime image's system instead of the host's: in a new
/// private mount namespace, the image's `/usr` and `/etc` are bound
/// read-only over the host's (and its `/usr/bin`, `/usr/lib`, ... over a
/// host's `/bin`, `/lib`, ... that are real directories, not merged-usr
/// links). A program executed afterwards is loaded by the image's dynamic
/// loader and C library, and `dlopen`s the image's libraries; the rest of
/// the host (the data dir, the jails' roots) stays visible. Single-threaded
/// callers only (the namespace belongs to the thread).
pub fn enter_image_system(image_root: &std::path::Path) -> Result<(), String> {
    new_mount_namespace(MsFlags::MS_PRIVATE, "private")?;
    let mut binds = vec![
        (image_root.join("usr"), std::path::PathBuf::from("/usr")),
        (image_root.join("etc"), std::path::PathBuf::from("/etc")),
    ];
    for top in ["bin", "sbin", "lib", "lib64"] {
        let host = std::path::Path::new("/").join(top);
        let real_dir = std::fs::symlink_metadata(&host).is_ok_and(|m| m.is_dir());
        let src = image_root.join("usr").join(top);
        if real_dir && src.is_dir() {
            binds.push((src, host));
        }
    }
    for (src, dst) in &binds {
        mount(
            Some(src.as_path()),
            dst.as_path(),
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| format!("bind {} over {}: {e}", src.display(), dst.display()))?;
        mount(
            None::<&str>,
            dst.as_path(),
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(|e| format!("make {} read-only: {e}", dst.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mounts_outside_every_peer_group_count_as_private() {
        let private =
            "120 27 7:3 / /run/kiln/slots/20 rw,nosuid,nodev,relatime - ext4 /dev/loop3 rw";
        let shared = "121 27 7:4 / /run/kiln/slots/3 rw,relatime shared:45 - ext4 /dev/loop4 rw";
        let slave = "122 27 7:5 / /run/kiln/slots/21 rw,relatime master:1 - ext4 /dev/loop5 rw";
        let escaped = "123 27 7:6 / /a\\040b rw - ext4 /dev/loop6 rw";
        assert_eq!(
            private_mount_point(private),
            Some(PathBuf::from("/run/kiln/slots/20"))
        );
        assert_eq!(private_mount_point(shared), None);
        assert_eq!(
            private_mount_point(slave),
            Some(PathBuf::from("/run/kiln/slots/21"))
        );
        assert_eq!(private_mount_point(escaped), Some(PathBuf::from("/a b")));
        assert_eq!(private_mount_point("garbage"), None);
    }
}
