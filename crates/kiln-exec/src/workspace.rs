//! The one place the host touches files inside a workspace: a directory
//! untrusted code writes to (and that the host reads, as root, after the
//! run). The rule "never follow a path the jail controls" lives here and
//! nowhere else: every name is resolved below the workspace's root with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV)`, so
//! a symlink anywhere on the way — the last component or any directory
//! before it — fails with `ELOOP` instead of leading out, and files are
//! opened `O_NONBLOCK` and accepted only when `fstat` says they are regular
//! (a FIFO, socket or device is never read).
//!
//! Staging (before the run) creates every file with `O_CREAT | O_EXCL` and
//! every directory with `mkdirat` in a directory resolved the same way;
//! harvesting (after the run, when every process of the jail is dead)
//! lists directories through descriptors and opens outputs and the inputs
//! it compares through [`Workspace::open_regular`].

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

/// How every name inside a workspace is resolved.
pub(crate) const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// What a directory entry is (never followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// FIFO, socket, device or unknown.
    Other,
}

/// One entry of a listed directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The raw name (not necessarily UTF-8).
    pub name: std::ffi::OsString,
    pub kind: EntryKind,
}

/// An open workspace: its root directory and the jail user that owns what
/// staging writes.
#[derive(Debug)]
pub struct Workspace {
    root: OwnedFd,
    path: PathBuf,
    /// Host uid and gid of the jail user.
    owner: (u32, u32),
}

impl Workspace {
    /// Opens the workspace directory `path` (the host directory bound at
    /// `/mnt/data`; trusted, created by the sandbox).
    pub fn open(path: &Path, owner: (u32, u32)) -> io::Result<Workspace> {
        let root = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Workspace {
            root,
            path: path.to_path_buf(),
            owner,
        })
    }

    /// The host path (for messages; never to open anything below it).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Resolves `rel` below the root without following any symlink.
    fn resolve(&self, rel: &str, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        if rel.is_empty() {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        Ok(rustix::fs::openat2(
            &self.root,
            rel,
            flags | OFlags::CLOEXEC,
            mode,
            BENEATH,
        )?)
    }

    /// The directory `rel` ("" for the root), resolved below the root.
    fn dir(&self, rel: &str) -> io::Result<OwnedFd> {
        if rel.is_empty() {
            return self.root.try_clone();
        }
        self.resolve(rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
    }

    /// `(parent directory, last component)` of `rel`.
    fn parent_of<'a>(&self, rel: &'a str) -> io::Result<(OwnedFd, &'a str)> {
        let (parent, name) = match rel.rsplit_once('/') {
            Some((p, n)) => (p, n),
            None => ("", rel),
        };
        if name.is_empty() || name == "." || name == ".." {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        Ok((self.dir(parent)?, name))
    }

    /// Creates every missing directory of `rel` ("a/b" for "a/b/c.csv"),
    /// mode 0755, owned by the jail user. A component that exists must be a
    /// real directory (it is left as it is).
    pub fn make_parents(&self, rel: &str) -> io::Result<()> {
        let mut prefix = String::new();
        let parts: Vec<&str> = rel.split('/').collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            if self.mkdir(&prefix)? {
                self.own_dir(&prefix, 0o755)?;
            } else {
                // exists: must be a directory reached without links
                self.dir(&prefix)?;
            }
        }
        Ok(())
    }

    /// `mkdirat` of `rel` in its parent; `false` when something exists
    /// there already.
    fn mkdir(&self, rel: &str) -> io::Result<bool> {
        let (parent, name) = self.parent_of(rel)?;
        match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o700)) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::EXIST) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the directory `rel` `mode` and the jail user as owner.
    fn own_dir(&self, rel: &str, mode: u32) -> io::Result<()> {
        let dir = File::from(self.dir(rel)?);
        dir.set_permissions(std::fs::Permissions::from_mode(mode))?;
        std::os::unix::fs::fchown(&dir, Some(self.owner.0), Some(self.owner.1))
    }

    /// Makes `rel` a directory owned by the jail user with `mode`,
    /// replacing a file or link of that name (the build directory of
    /// compiled languages).
    pub fn replace_with_dir(&self, rel: &str, mode: u32) -> io::Result<()> {
        let (parent, name) = self.parent_of(rel)?;
        match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
            Ok(_) => rustix::fs::unlinkat(&parent, name, AtFlags::empty())?,
            Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(e.into()),
        }
        self.mkdir(rel)?;
        self.own_dir(rel, mode)
    }

    /// Creates the new file `rel` (which must not exist), mode 0600, for
    /// writing. Its parent directories must exist.
    pub fn create_file(&self, rel: &str) -> io::Result<File> {
        Ok(File::from(self.resolve(
            rel,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            Mode::from_raw_mode(0o600),
        )?))
    }

    /// Gives a staged file its final owner and mode: writable inputs belong
    /// to the jail user (0644); read-only ones stay root's (0444).
    pub fn finish_file(&self, file: &File, read_only: bool) -> io::Result<()> {
        if read_only {
            file.set_permissions(std::fs::Permissions::from_mode(0o444))
        } else {
            file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
            std::os::unix::fs::fchown(file, Some(self.owner.0), Some(self.owner.1))
        }
    }

    /// Writes `bytes` as the file `rel` atomically: into a new temporary
    /// file beside it, then renamed over whatever file or link had that
    /// name (a link is replaced, never followed), so a reader sees the old
    /// file or the whole new one. Owned by the jail user, mode 0644. Its
    /// parent directories must exist.
    pub fn write_atomically(&self, rel: &str, bytes: &[u8]) -> io::Result<()> {
        let (parent, name) = self.parent_of(rel)?;
        let temp = format!(".{name}.kiln-part-{}", kiln_core::Nanoid::random().as_str());
        let file = rustix::fs::openat(
            &parent,
            temp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let mut file = File::from(file);
        let written = io::Write::write_all(&mut file, bytes)
            .and_then(|()| self.finish_file(&file, false))
            .and_then(|()| Ok(rustix::fs::renameat(&parent, temp.as_str(), &parent, name)?));
        if written.is_err() {
            let _ = rustix::fs::unlinkat(&parent, temp.as_str(), AtFlags::empty());
        }
        written
    }

    /// Removes the file (or link) `rel` if there is one.
    pub fn remove_file(&self, rel: &str) -> io::Result<()> {
        let (parent, name) = match self.parent_of(rel) {
            Ok(p) => p,
            // the parent is missing or not a real directory: nothing there
            Err(e) if is_absent(&e) => return Ok(()),
            Err(e) => return Err(e),
        };
        match rustix::fs::unlinkat(&parent, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Opens `rel` for reading when it is a regular file reached without
    /// any symlink; `None` for anything else (missing, a link, a directory,
    /// a FIFO, ...). Returns the file and its size when opened.
    pub fn open_regular(&self, rel: &str) -> io::Result<Option<(File, u64)>> {
        let fd = match self.resolve(rel, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty()) {
            Ok(fd) => fd,
            Err(e) if is_absent(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Ok(None);
        }
        Ok(Some((File::from(fd), st.st_size as u64)))
    }

    /// Whether `rel` is a regular file reached without any symlink. Never
    /// looks outside the workspace: a planted link on the way is "no".
    pub fn is_regular(&self, rel: &str) -> bool {
        let Ok(fd) = self.resolve(rel, OFlags::PATH, Mode::empty()) else {
            return false;
        };
        rustix::fs::fstat(&fd)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
    }

    /// The entries of directory `rel` ("" for the root), without `.` and
    /// `..`, each classified without following it. `None` when `rel` is not
    /// a real directory below the root.
    pub fn read_dir(&self, rel: &str) -> io::Result<Option<Vec<Entry>>> {
        let fd = match self.dir(rel) {
            Ok(fd) => fd,
            Err(e) if is_absent(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        let probe = fd.try_clone()?;
        let mut dir = rustix::fs::Dir::new(fd)?;
        let mut out = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let name: std::ffi::OsString =
                <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name).to_owned();
            let kind = match entry.file_type() {
                FileType::Unknown => {
                    match rustix::fs::statat(
                        probe.as_fd(),
                        name.as_os_str(),
                        AtFlags::SYMLINK_NOFOLLOW,
                    ) {
                        Ok(st) => kind_of(FileType::from_raw_mode(st.st_mode)),
                        Err(_) => EntryKind::Other,
                    }
                }
                t => kind_of(t),
            };
            out.push(Entry { name, kind });
        }
        Ok(Some(out))
    }
}

impl Workspace {
    /// Empties the workspace: removes every entry below the root, links as
    /// links, through directory descriptors (nothing is followed).
    /// Directories nested deeper than `kiln_core::path::MAX_DEPTH` are left
    /// (their parents then fail to go, with `ENOTEMPTY`); the first error
    /// is returned after everything removable went.
    pub fn clear(&self) -> io::Result<()> {
        clear_dir(self.root.as_fd(), 0)
    }
}

/// Empties the directory `dir` like [`Workspace::clear`].
pub(crate) fn clear_fd(dir: BorrowedFd<'_>) -> io::Result<()> {
    clear_dir(dir, 0)
}

fn clear_dir(dir: BorrowedFd<'_>, depth: usize) -> io::Result<()> {
    let fd = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut names = Vec::new();
    let mut listing = rustix::fs::Dir::new(fd.try_clone()?)?;
    while let Some(entry) = listing.read() {
        let entry = entry?;
        let name = entry.file_name().to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            names.push(name);
        }
    }
    let mut first_error = None;
    for name in names {
        let is_dir = rustix::fs::statat(&fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory);
        let removed = if is_dir {
            if depth < kiln_core::path::MAX_DEPTH {
                let sub = rustix::fs::openat(
                    &fd,
                    name.as_c_str(),
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(io::Error::from)
                .and_then(|sub| clear_dir(sub.as_fd(), depth + 1));
                if let Err(e) = sub {
                    first_error.get_or_insert(e);
                }
            }
            rustix::fs::unlinkat(&fd, name.as_c_str(), AtFlags::REMOVEDIR)
        } else {
            rustix::fs::unlinkat(&fd, name.as_c_str(), AtFlags::empty())
        };
        match removed {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => {
                first_error.get_or_insert(e.into());
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

fn kind_of(t: FileType) -> EntryKind {
    match t {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

/// Errors that mean "nothing usable there": missing, a symlink on the way
/// (`ELOOP`), a file where a directory was expected, a mount crossing.
fn is_absent(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::ELOOP | libc::ENOTDIR | libc::EXDEV)
    )
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::fs::{MetadataExt, symlink};

    use super::*;

    fn me() -> (u32, u32) {
        let m = std::fs::metadata("/proc/self").unwrap();
        (m.uid(), m.gid())
    }

    #[test]
    fn clear_empties_the_workspace_and_never_follows_a_link() {
        let (d, w) = ws();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep.txt"), "x").unwrap();
        std::fs::create_dir_all(d.path().join("a/b/c")).unwrap();
        std::fs::write(d.path().join("a/b/c/f.pkl"), "x").unwrap();
        std::fs::write(d.path().join("top"), "x").unwrap();
        symlink(outside.path(), d.path().join("a/link")).unwrap();
        symlink(outside.path().join("keep.txt"), d.path().join("l2")).unwrap();
        w.clear().unwrap();
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        assert!(
            outside.path().join("keep.txt").exists(),
            "nothing outside went"
        );
    }

    fn ws() -> (tempfile::TempDir, Workspace) {
        let d = tempfile::tempdir().unwrap();
        let w = Workspace::open(d.path(), me()).unwrap();
        (d, w)
    }

    #[test]
    fn files_are_created_once_below_made_parents() {
        let (d, w) = ws();
        w.make_parents("a/b/c.csv").unwrap();
        let mut f = w.create_file("a/b/c.csv").unwrap();
        f.write_all(b"x,y\n").unwrap();
        w.finish_file(&f, false).unwrap();
        assert_eq!(std::fs::read(d.path().join("a/b/c.csv")).unwrap(), b"x,y\n");
        let mode = std::fs::metadata(d.path().join("a/b/c.csv"))
            .unwrap()
            .mode();
        assert_eq!(mode & 0o777, 0o644);
        assert_eq!(
            w.create_file("a/b/c.csv").unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
    }

    #[test]
    fn no_symlink_is_followed_on_the_way_or_at_the_end() {
        let (d, w) = ws();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "host").unwrap();
        symlink(outside.path(), d.path().join("dir")).unwrap();
        symlink(outside.path().join("secret.txt"), d.path().join("file.txt")).unwrap();
        // reading through either link finds nothing
        assert!(w.open_regular("dir/secret.txt").unwrap().is_none());
        assert!(w.open_regular("file.txt").unwrap().is_none());
        assert!(!w.is_regular("dir/secret.txt"));
        assert!(!w.is_regular("dir/missing.txt"));
        // writing through one fails and creates nothing outside
        assert!(w.create_file("dir/new.txt").is_err());
        assert!(w.make_parents("dir/sub/x.txt").is_err());
        assert!(!outside.path().join("new.txt").exists());
        assert!(!outside.path().join("sub").exists());
        assert!(w.read_dir("dir").unwrap().is_none());
        // removing through it leaves the target alone
        w.remove_file("dir/secret.txt").unwrap();
        assert!(outside.path().join("secret.txt").exists());
    }

    #[test]
    fn only_regular_files_are_opened() {
        let (d, w) = ws();
        std::fs::write(d.path().join("a.txt"), "abc").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        let status = std::process::Command::new("mkfifo")
            .arg(d.path().join("pipe.txt"))
            .status()
            .unwrap();
        assert!(status.success());
        let (mut f, len) = w.open_regular("a.txt").unwrap().unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!((s.as_str(), len), ("abc", 3));
        assert!(w.open_regular("sub").unwrap().is_none());
        assert!(
            w.open_regular("pipe.txt").unwrap().is_none(),
            "never blocks on a FIFO"
        );
        assert!(w.open_regular("missing").unwrap().is_none());
        assert!(w.is_regular("a.txt") && !w.is_regular("sub"));
    }

    #[test]
    fn directories_are_listed_without_following_entries() {
        let (d, w) = ws();
        std::fs::write(d.path().join("f.txt"), "").unwrap();
        std::fs::create_dir(d.path().join("d")).unwrap();
        symlink("/etc", d.path().join("l")).unwrap();
        let mut entries = w.read_dir("").unwrap().unwrap();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let kinds: Vec<_> = entries
            .iter()
            .map(|e| (e.name.to_str().unwrap(), e.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("d", EntryKind::Dir),
                ("f.txt", EntryKind::File),
                ("l", EntryKind::Symlink)
            ]
        );
    }

    #[test]
    fn a_build_dir_replaces_a_planted_link() {
        let (d, w) = ws();
        symlink("/etc", d.path().join(".kiln-build")).unwrap();
        w.replace_with_dir(".kiln-build", 0o755).unwrap();
        let m = std::fs::symlink_metadata(d.path().join(".kiln-build")).unwrap();
        assert!(m.is_dir());
        // an existing directory is kept
        std::fs::write(d.path().join(".kiln-build/x"), "").unwrap();
        w.replace_with_dir(".kiln-build", 0o755).unwrap();
        assert!(d.path().join(".kiln-build/x").exists());
    }

    #[test]
    fn an_atomic_write_replaces_a_link_without_following_it() {
        let (d, w) = ws();
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(outside.path(), b"keep").unwrap();
        symlink(outside.path(), d.path().join("data.csv")).unwrap();
        w.write_atomically("data.csv", b"new").unwrap();
        assert_eq!(std::fs::read(outside.path()).unwrap(), b"keep");
        let meta = std::fs::symlink_metadata(d.path().join("data.csv")).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(std::fs::read(d.path().join("data.csv")).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
    }
}
