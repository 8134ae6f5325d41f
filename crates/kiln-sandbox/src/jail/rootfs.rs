//! Executes a root plan inside the jail's fresh mount namespace (in the
//! jail's init, as uid 0 of its user namespace), then `pivot_root`s into it
//! and makes `/` read-only.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::{Mode, umask};
use nix::sys::statvfs::{FsFlags, statvfs};
use nix::unistd::{chdir, pivot_root};

use super::JailError;
use super::plan::{Op, Source};
use crate::sys::{self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

/// Size of the root tmpfs (it only holds `/etc` files and mount points).
const ROOT_TMPFS: &str = "size=1m,mode=755";

fn ms_flags(attrs: u64) -> MsFlags {
    let mut f = MsFlags::empty();
    if attrs & MOUNT_ATTR_RDONLY != 0 {
        f |= MsFlags::MS_RDONLY;
    }
    if attrs & MOUNT_ATTR_NOSUID != 0 {
        f |= MsFlags::MS_NOSUID;
    }
    if attrs & MOUNT_ATTR_NODEV != 0 {
        f |= MsFlags::MS_NODEV;
    }
    if attrs & MOUNT_ATTR_NOEXEC != 0 {
        f |= MsFlags::MS_NOEXEC;
    }
    f
}

/// Sets mount attributes. Uses `mount_setattr` (recursive, and it leaves the
/// locked flags of mounts from a more privileged namespace alone); on kernels
/// without it, falls back to a bind remount of the top mount that re-states
/// the locked noexec/atime flags, or the kernel would refuse it.
fn set_attrs(path: &Path, recursive: bool, attrs: u64) -> Result<(), Errno> {
    match sys::mount_setattr(path, recursive, attrs) {
        Err(Errno::ENOSYS) => {
            let st = statvfs(path)?;
            let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | ms_flags(attrs);
            let f = st.flags();
            for (fs_flag, ms) in [
                (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
                (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
                (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
                (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
                (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
                (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
            ] {
                if f.contains(fs_flag) {
                    flags |= ms;
                }
            }
            mount(None::<&str>, path, None::<&str>, flags, None::<&str>)
        }
        r => r,
    }
}

/// The jail's own per-user limits (`/proc/sys/user/*` of its user
/// namespace, writable by its root). The namespace is owned by the slot's
/// uid, so what the jail takes is charged to that uid on the host as well
/// (see `clone_owned_by`); these keep each jail well inside that.
/// No namespace of any kind may be created inside a jail (seccomp refuses
/// it too). Entries the kernel lacks are skipped.
pub const USER_NS_LIMITS: &[(&str, &str)] = &[
    ("max_inotify_instances", "64"),
    ("max_inotify_watches", "8192"),
    ("max_fanotify_groups", "0"),
    ("max_fanotify_marks", "0"),
    ("max_user_namespaces", "0"),
    ("max_mnt_namespaces", "0"),
    ("max_pid_namespaces", "0"),
    ("max_net_namespaces", "0"),
    ("max_ipc_namespaces", "0"),
    ("max_uts_namespaces", "0"),
    ("max_cgroup_namespaces", "0"),
    ("max_time_namespaces", "0"),
];

/// Writes [`USER_NS_LIMITS`] through the jail's fresh procfs at `proc`.
/// A kept jail's program makes its own cgroup namespace (its init is not
/// in the run's groups): two may exist, the init's and the running
/// program's, so the program still can make none.
fn limit_user_namespace(proc: &Path, kept: bool) -> Result<(), JailError> {
    for &(name, value) in USER_NS_LIMITS {
        let value = match name {
            "max_cgroup_namespaces" if kept => "2",
            _ => value,
        };
        let path = proc.join("sys/user").join(name);
        match fs::write(&path, value) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(err(format_args!("write /proc/sys/user/{name}"), e)),
        }
    }
    Ok(())
}

/// `root_dir` joined with an in-jail absolute path.
fn under(root: &Path, jail_path: &Path) -> PathBuf {
    root.join(jail_path.strip_prefix("/").unwrap_or(jail_path))
}

fn err(what: impl std::fmt::Display, e: impl std::fmt::Display) -> JailError {
    JailError::Setup(format!("{what}: {e}"))
}

/// Runs `make` at `path`; if the parent is missing, makes it (0755, and
/// its own missing parents) and runs `make` once more. Each step of the
/// plan is tried first and checked only when it fails: most of a root's
/// entries go into directories the plan made just before, so looking
/// first (a `statx` of the parent, then of the path) was a wasted system
/// call or two per entry.
fn with_parent<T>(path: &Path, make: impl Fn(&Path) -> std::io::Result<T>) -> std::io::Result<T> {
    match make(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => match path.parent() {
            Some(parent) if parent != path => {
                make_dir_io(parent, 0o755)?;
                make(path)
            }
            _ => Err(e),
        },
        r => r,
    }
}

/// `mkdir` with exactly `mode` (the umask is 0 while the root is built, see
/// [`build_and_enter`]); missing parents are made 0755. An existing
/// directory is given `mode`, as `create_dir_all` + `chmod` did.
fn make_dir_io(path: &Path, mode: u32) -> std::io::Result<()> {
    match with_parent(path, |p| DirBuilder::new().mode(mode).create(p)) {
        Err(e) if e.kind() == ErrorKind::AlreadyExists && path.is_dir() => {
            fs::set_permissions(path, fs::Permissions::from_mode(mode))
        }
        r => r,
    }
}

fn make_dir(path: &Path, mode: u32) -> Result<(), JailError> {
    make_dir_io(path, mode).map_err(|e| err(format_args!("mkdir {}", path.display()), e))
}

/// Creates an empty directory or file to bind `src` on, matching its type;
/// one that is there already is used as it is.
fn make_mount_point(src: &Path, dst: &Path) -> Result<(), JailError> {
    let meta = fs::metadata(src).map_err(|e| err(format_args!("stat {}", src.display()), e))?;
    if meta.is_dir() {
        match with_parent(dst, |p| DirBuilder::new().mode(0o755).create(p)) {
            Err(e) if e.kind() == ErrorKind::AlreadyExists && dst.is_dir() => Ok(()),
            r => r.map_err(|e| err(format_args!("mkdir {}", dst.display()), e)),
        }
    } else {
        match with_parent(dst, create_file) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(err(format_args!("create {}", dst.display()), e)),
        }
    }
}

/// Creates a file that is not there yet, mode 0644.
fn create_file(path: &Path) -> std::io::Result<fs::File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
}

/// Writes a new file of the root, mode 0644 (a file the plan wrote before
/// is overwritten and given 0644 again).
fn write_file(at: &Path, contents: &str) -> std::io::Result<()> {
    match with_parent(at, create_file) {
        Ok(mut f) => f.write_all(contents.as_bytes()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => fs::write(at, contents)
            .and_then(|()| fs::set_permissions(at, fs::Permissions::from_mode(0o644))),
        Err(e) => Err(e),
    }
}

fn run_op(root: &Path, op: &Op) -> Result<(), JailError> {
    match op {
        Op::Dir { path, mode } => make_dir(&under(root, path), *mode),
        Op::Symlink { path, target } => {
            let at = under(root, path);
            with_parent(&at, |p| symlink(target, p))
                .map_err(|e| err(format_args!("symlink {}", path.display()), e))
        }
        Op::File { path, contents } => {
            let at = under(root, path);
            write_file(&at, contents).map_err(|e| err(format_args!("write {}", path.display()), e))
        }
        Op::Bind {
            src,
            dst,
            recursive,
            attrs,
            only_if_dst_exists,
        } => {
            let target = under(root, dst);
            let source = match src {
                Source::Host(p) => p.clone(),
                Source::Jail(p) => under(root, p),
            };
            if *only_if_dst_exists {
                if fs::symlink_metadata(&target).is_err() {
                    return Ok(());
                }
            } else {
                make_mount_point(&source, &target)?;
            }
            let mut flags = MsFlags::MS_BIND;
            if *recursive {
                flags |= MsFlags::MS_REC;
            }
            mount(Some(&source), &target, None::<&str>, flags, None::<&str>).map_err(|e| {
                err(
                    format_args!("bind {} on {}", source.display(), dst.display()),
                    e,
                )
            })?;
            set_attrs(&target, *recursive, *attrs)
                .map_err(|e| err(format_args!("set mount attributes of {}", dst.display()), e))
        }
        Op::Tmpfs {
            dst,
            options,
            attrs,
        } => {
            let target = under(root, dst);
            make_dir(&target, 0o755)?;
            mount_tmpfs(&target, options, *attrs)
                .map_err(|e| err(format_args!("mount tmpfs on {}", dst.display()), e))
        }
        Op::Proc { dst, kept } => {
            let target = under(root, dst);
            make_dir(&target, 0o555)?;
            mount(
                Some("proc"),
                &target,
                Some("proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&str>,
            )
            .map_err(|e| err(format_args!("mount proc on {}", dst.display()), e))?;
            limit_user_namespace(&target, *kept)
        }
        Op::SetAttr { dst, attrs } => set_attrs(&under(root, dst), false, *attrs)
            .map_err(|e| err(format_args!("set mount attributes of {}", dst.display()), e)),
    }
}

fn mount_tmpfs(target: &Path, options: &str, attrs: u64) -> Result<(), Errno> {
    mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        ms_flags(attrs),
        Some(options),
    )
}

/// In the entered root of a kept jail: every writable tmpfs of the plan
/// (`/tmp`, `/dev/shm`; not `/dev`, which is read-only) detached and a new
/// empty one mounted in its place, as the plan made it. Nothing is deleted
/// file by file: what a program left there goes with the old mount.
pub(super) fn renew_tmpfs(ops: &[Op]) -> Result<(), JailError> {
    for op in ops {
        if let Op::Tmpfs {
            dst,
            options,
            attrs,
        } = op
            && dst != Path::new("/dev")
        {
            umount2(dst.as_path(), MntFlags::MNT_DETACH)
                .map_err(|e| err(format_args!("detach tmpfs {}", dst.display()), e))?;
            mount_tmpfs(dst, options, *attrs)
                .map_err(|e| err(format_args!("mount tmpfs on {}", dst.display()), e))?;
        }
    }
    Ok(())
}

/// Builds the new root on `root_dir` and switches to it. Must run in a
/// private mount namespace as uid 0 of the jail's user namespace.
pub fn build_and_enter(root_dir: &Path, ops: &[Op]) -> Result<(), JailError> {
    // Every entry is created with its final mode (no `chmod` after it);
    // the caller's umask is back once the root is entered.
    let umask_before = umask(Mode::empty());
    let built = build_and_enter_unmasked(root_dir, ops);
    umask(umask_before);
    built
}

fn build_and_enter_unmasked(root_dir: &Path, ops: &[Op]) -> Result<(), JailError> {
    // Nothing we mount may propagate back to the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| err("make / private", e))?;
    mount(
        Some("tmpfs"),
        root_dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(ROOT_TMPFS),
    )
    .map_err(|e| {
        err(
            format_args!("mount root tmpfs on {}", root_dir.display()),
            e,
        )
    })?;
    for op in ops {
        run_op(root_dir, op)?;
    }
    chdir(root_dir).map_err(|e| err(format_args!("chdir {}", root_dir.display()), e))?;
    pivot_root(".", ".").map_err(|e| err("pivot_root", e))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| err("detach old root", e))?;
    chdir("/").map_err(|e| err("chdir /", e))?;
    set_attrs(
        Path::new("/"),
        false,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
    )
    .map_err(|e| err("make / read-only", e))
}
