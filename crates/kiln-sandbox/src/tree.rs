//! Removing a directory tree that a jail built, whatever its shape.
//!
//! A jail controls everything below its workspace: it can nest directories
//! as deep as its inode quota allows (tens of thousands of levels, built
//! bottom-up with `rename` so no path is ever too long), make them
//! unreadable to itself, or fill them with symlinks. The usual recursive
//! removal (`std::fs::remove_dir_all`) keeps one stack frame and one open
//! directory per level: deep enough, it overflows the thread's stack (which
//! aborts the whole server) or runs out of descriptors.
//!
//! [`remove_tree`] walks the tree iteratively with at most three
//! descriptors open at any time and a constant amount of stack: it goes
//! down into the first directory it cannot remove, and back up through
//! `..` (checked against the device and inode it came from) once a
//! directory is empty. Every step is relative to an open directory
//! (`openat`/`unlinkat`) with `O_NOFOLLOW`, so a symlink is removed, never
//! followed, and nothing outside the tree is touched. Memory grows by 16
//! bytes per level of depth.
//!
//! It must only run once no process of the jail is left: a tree that keeps
//! changing underneath may make it fail (never escape); callers then fall
//! back to re-creating the slot's filesystem.

use std::ffi::{CStr, OsStr};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, open, openat};
use nix::sys::stat::{Mode, SFlag, fstat, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

/// Directories are opened for reading entries only, never following a
/// final symlink.
const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

fn io_err(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Identity of an open directory: (device, inode).
fn id(fd: &impl AsFd) -> io::Result<(u64, u64)> {
    let st = fstat(fd).map_err(io_err)?;
    Ok((st.st_dev, st.st_ino))
}

/// Removes `path` and everything below it (a file or symlink is simply
/// unlinked). The parent's components are resolved normally; `path`'s last
/// component and everything beneath it are never followed. A missing
/// `path` is not an error.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} has no parent directory", path.display()),
        ));
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let parent = match open(parent, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(io_err(e)),
    };
    remove_tree_at(&parent, name)
}

/// Removes the entry `name` of the open directory `parent` and, if it is
/// a directory, everything below it. See [`remove_tree`].
pub fn remove_tree_at(parent: &OwnedFd, name: &OsStr) -> io::Result<()> {
    let name_c = std::ffi::CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "name contains a NUL byte"))?;
    match unlinkat(parent, name_c.as_c_str(), UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::EISDIR) => {}
        Err(e) => return Err(io_err(e)),
    }
    let mut cur = match openat(parent, name_c.as_c_str(), DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(io_err(e)),
    };
    // Identities of the directories above `cur`, up to the tree's top.
    let mut above: Vec<(u64, u64)> = Vec::new();
    loop {
        match empty_or_descend(&cur)? {
            Step::Descend(child) => {
                above.push(id(&cur)?);
                cur = child;
            }
            Step::Empty => {
                let Some(expected) = above.pop() else {
                    drop(cur);
                    return match unlinkat(parent, name_c.as_c_str(), UnlinkatFlags::RemoveDir) {
                        Ok(()) | Err(Errno::ENOENT) => Ok(()),
                        Err(e) => Err(io_err(e)),
                    };
                };
                let up = openat(&cur, c"..", DIR_FLAGS, Mode::empty()).map_err(io_err)?;
                if id(&up)? != expected {
                    return Err(io::Error::other(
                        "the tree changed while it was being removed",
                    ));
                }
                // The emptied directory is removed when `up` is scanned again.
                cur = up;
            }
        }
    }
}

/// What one scan of a directory left to do.
enum Step {
    /// Every entry is gone.
    Empty,
    /// This non-empty subdirectory must be emptied first.
    Descend(OwnedFd),
}

/// Removes the entries of `dir` that can go at once (files, symlinks,
/// empty directories); stops at the first non-empty subdirectory and opens
/// it.
fn empty_or_descend(dir: &OwnedFd) -> io::Result<Step> {
    // A fresh descriptor per scan: `Dir` owns (and closes) it, and reading
    // starts at the first entry again.
    let scan = openat(dir, c".", DIR_FLAGS, Mode::empty()).map_err(io_err)?;
    let mut entries = Dir::from_fd(scan).map_err(io_err)?;
    for entry in entries.iter() {
        let entry = entry.map_err(io_err)?;
        let name: &CStr = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let is_dir = match entry.file_type() {
            Some(t) => t == Type::Directory,
            None => match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(io_err(e)),
            },
        };
        if !is_dir {
            match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => continue,
                Err(e) => return Err(io_err(e)),
            }
        }
        match unlinkat(dir, name, UnlinkatFlags::RemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(Errno::ENOTEMPTY | Errno::EEXIST) => {
                let child = openat(dir, name, DIR_FLAGS, Mode::empty()).map_err(io_err)?;
                return Ok(Step::Descend(child));
            }
            Err(e) => return Err(io_err(e)),
        }
    }
    Ok(Step::Empty)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A chain `depth` levels deep below `top/chain`, built bottom-up with
    /// renames as a jail would (no path is ever longer than two names).
    fn chain(top: &Path, depth: usize) {
        let a = top.join("a");
        let b = top.join("b");
        std::fs::create_dir(&a).expect("mkdir");
        for _ in 0..depth {
            std::fs::create_dir(&b).expect("mkdir");
            std::fs::rename(&a, b.join("a")).expect("rename");
            std::fs::rename(&b, &a).expect("rename");
        }
        std::fs::rename(&a, top.join("chain")).expect("rename");
    }

    #[test]
    fn a_chain_deeper_than_any_stack_goes_on_a_small_thread() {
        let top = tempfile::tempdir().expect("tempdir");
        chain(top.path(), 5_000);
        let path = top.path().join("chain");
        // 32 KiB of stack: one frame per level would need megabytes.
        let removed = std::thread::Builder::new()
            .stack_size(32 * 1024)
            .spawn(move || remove_tree(&path))
            .expect("thread")
            .join()
            .expect("no stack overflow");
        removed.expect("removed");
        assert!(!top.path().join("chain").exists());
    }

    #[test]
    fn removal_holds_a_bounded_number_of_descriptors() {
        let top = tempfile::tempdir().expect("tempdir");
        chain(top.path(), 1_000);
        let path = top.path().join("chain");
        // Bound the descriptors through RLIMIT_NOFILE, in a child process
        // (the limit is per process, and other tests run beside this one).
        let child = std::process::Command::new(std::env::current_exe().expect("exe"))
            .args([
                "--exact",
                "tree::tests::helper_remove_with_few_fds",
                "--nocapture",
                "--ignored",
            ])
            .env("KILN_TREE_TEST_PATH", &path)
            .output()
            .expect("spawn");
        assert!(
            child.status.success(),
            "{}",
            String::from_utf8_lossy(&child.stderr)
        );
        assert!(!path.exists(), "tree left");
    }

    /// Run by the test above in a child process: removes the tree with at
    /// most 7 descriptors above the ones the harness holds.
    #[test]
    #[ignore = "helper of removal_holds_a_bounded_number_of_descriptors"]
    fn helper_remove_with_few_fds() {
        let Some(path) = std::env::var_os("KILN_TREE_TEST_PATH") else {
            return;
        };
        let highest = std::fs::read_dir("/proc/self/fd")
            .expect("fds")
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .max()
            .unwrap_or(2);
        nix::sys::resource::setrlimit(
            nix::sys::resource::Resource::RLIMIT_NOFILE,
            highest + 8,
            highest + 8,
        )
        .expect("setrlimit");
        remove_tree(Path::new(&path)).expect("removal within the fd limit");
    }

    #[test]
    fn symlinks_are_removed_never_followed_and_odd_modes_do_not_stop_it() {
        let top = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("precious"), "x").expect("write");
        let t = top.path().join("t");
        std::fs::create_dir_all(t.join("d/e/f")).expect("mkdir");
        std::fs::write(t.join("d/e/f/file"), "x").expect("write");
        std::os::unix::fs::symlink(outside.path(), t.join("d/link")).expect("symlink");
        std::os::unix::fs::symlink(outside.path(), t.join("d/e/f/link")).expect("symlink");
        nix::unistd::mkfifo(&t.join("d/fifo"), Mode::from_bits_truncate(0o600)).expect("fifo");
        std::fs::set_permissions(t.join("d/e"), std::fs::Permissions::from_mode(0o000))
            .expect("chmod");
        remove_tree(&t).expect("removed");
        assert!(!t.exists());
        assert!(outside.path().join("precious").exists());
        // the top itself a symlink: only the link goes
        std::os::unix::fs::symlink(outside.path(), &t).expect("symlink");
        remove_tree(&t).expect("removed");
        assert!(outside.path().join("precious").exists());
    }

    #[test]
    fn wide_and_deep_trees_and_missing_paths() {
        let top = tempfile::tempdir().expect("tempdir");
        let t = top.path().join("t");
        for i in 0..20 {
            let d = t.join(format!("d{i}/x/y"));
            std::fs::create_dir_all(&d).expect("mkdir");
            for j in 0..20 {
                std::fs::write(d.join(format!("f{j}")), "x").expect("write");
            }
        }
        remove_tree(&t).expect("removed");
        assert!(!t.exists());
        remove_tree(&t).expect("a missing tree is fine");
        std::fs::write(&t, "file").expect("write");
        remove_tree(&t).expect("a file is unlinked");
        assert!(!t.exists());
    }
}
