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

use std::sync::OnceLock;

use nix::mount::{MsFlags, mount};
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
