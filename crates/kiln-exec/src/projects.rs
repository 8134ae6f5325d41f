//! Persistent project directories: a directory of files owned by
//! (principal, name) that outlives runs, restarts and nodes' slots, has a
//! storage budget, and is bound read-write into a fresh jail at
//! [`kiln_sandbox::PROJECT_DIR`] (`/workspace`, the program's working
//! directory) for one run at a time. LibreChat's attached workspaces use
//! it; so can any face that needs a `/workspace` that persists.
//!
//! # Layout
//! `<dir>/<id>/tree/` holds a project's files, where `<id>` is derived from
//! (tenant, user, name) like a file session's id (any node with the same
//! `dir` finds it without a lookup table; two principals' projects of the
//! same name never meet). `<dir>` is under the server's data dir, not on a
//! slot filesystem (those are emptied after every run).
//!
//! # A run on a project
//! A run never writes the persistent tree. [`Projects::check_out`] copies
//! it into a working copy on the jail's slot filesystem (so the slot's
//! quota bounds what the run can write, however large), the jail gets that
//! copy at `/workspace`, and after the run (every process of the jail dead)
//! [`Projects::commit`] copies the working copy into a new tree, counting
//! bytes and entries against the budget, and swaps it for the old one with
//! one `renameat2(RENAME_EXCHANGE)`. A run that leaves the project over
//! its budget commits nothing: the project stays as it was before the run
//! and the caller is told ([`ProjectError::OverBudget`]). A crash between
//! the swap and the removal of the old tree leaves a `new-*` directory,
//! removed the next time the project is opened.
//!
//! # Host safety
//! Every host touch of a project's files resolves names one component at a
//! time below a directory descriptor with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | ...)` (the rule of [`crate::workspace`]): a
//! symlink a run planted is copied as a link, never followed; FIFOs,
//! sockets and devices are skipped; modes keep only the permission bits.
//! Reading and writing a file by relative path ([`Projects::read`],
//! [`Projects::write`], [`Projects::list`]) go through [`Workspace`].
//!
//! # One run at a time
//! [`Projects::turn_key`] names the project for the turn lock every
//! one-at-a-time environment uses ([`crate::sessions::FileSessions::take_turn`]);
//! the face holds the turn in the [`ProjectBinding`] it puts on the
//! request, so it lasts until the run's pipeline is done with the project.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_core::Nanoid;
use kiln_core::access::Caller;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};

use crate::sessions::{BadSessionName, FileSessions};
use crate::workspace::{BENEATH, Entry, Workspace};

/// Default storage budget of one project.
pub const DEFAULT_BUDGET_BYTES: u64 = 1024 * 1024 * 1024;
/// Most entries (files, directories, links) one project may hold.
pub const MAX_ENTRIES: u64 = 100_000;

/// The namespace of project ids (a project and a file session of the same
/// name differ).
const PROJECT: &[u8] = b"kiln project\0";
const TREE: &str = "tree";
/// Prefix of a project directory being removed by [`Projects::sweep`].
const GONE: &str = "gone-";

/// Where projects live and how large one may grow.
#[derive(Debug, Clone)]
pub struct ProjectsConfig {
    /// The projects' directory (under the server's data dir).
    pub dir: PathBuf,
    /// Bytes of file content (and link targets) one project may hold.
    pub budget_bytes: u64,
}

/// Why a project operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    #[error("project name must match ^[A-Za-z0-9_.:-]{{1,128}}$")]
    BadName(#[from] BadSessionName),
    /// The project would hold more than its budget: nothing was changed.
    #[error(
        "project storage budget exceeded ({used} bytes in {entries} entries; the budget is {budget} bytes and {MAX_ENTRIES} entries): this call's project changes were discarded"
    )]
    OverBudget {
        used: u64,
        entries: u64,
        budget: u64,
    },
    /// A path that is not a plain relative path inside the project.
    #[error("bad project path: {0}")]
    BadPath(String),
    #[error("project storage: {0}")]
    Io(#[from] io::Error),
}

impl From<rustix::io::Errno> for ProjectError {
    fn from(e: rustix::io::Errno) -> ProjectError {
        ProjectError::Io(e.into())
    }
}

/// The projects of this server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Projects {
    inner: Arc<ProjectsConfig>,
}

/// One project (it exists on disk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project {
    id: Nanoid,
    dir: PathBuf,
}

impl Project {
    /// Its id (the directory's name; also its turn key).
    pub fn id(&self) -> &Nanoid {
        &self.id
    }

    fn tree(&self) -> PathBuf {
        self.dir.join(TREE)
    }

    /// Whether the project exists: its tree is a directory (blocking).
    fn exists(&self) -> bool {
        std::fs::symlink_metadata(self.tree()).is_ok_and(|m| m.is_dir())
    }
}

/// A project bound to one request: the pipeline checks it out into the
/// run's jail at `/workspace` and commits it after the run. Holds the
/// project's turn (when the face took one) for as long as the request.
#[derive(Debug, Clone)]
pub struct ProjectBinding {
    pub projects: Projects,
    pub project: Project,
    pub turn: Option<Arc<crate::turns::Taken>>,
    /// Environment the run step gets on top of its language's (e.g.
    /// LibreChat's `LIBRECHAT_CODE_DATA_DIR`).
    pub env: Vec<(String, String)>,
}

impl ProjectBinding {
    /// `project` bound to one request once its turn (one run at a time, on
    /// `sessions`' turn locks under [`Projects::turn_key`]) is taken within
    /// `wait`; [`crate::turns::Busy`] when it is not.
    pub async fn take(
        projects: Projects,
        project: Project,
        sessions: &FileSessions,
        wait: std::time::Duration,
        env: Vec<(String, String)>,
    ) -> Result<ProjectBinding, crate::turns::Busy> {
        let turn = sessions
            .take_turn(Projects::turn_key(&project), wait)
            .await?;
        Ok(ProjectBinding {
            projects,
            project,
            turn: Some(Arc::new(turn)),
            env,
        })
    }
}

impl Projects {
    /// Opens (creating, mode 0700) the projects' directory.
    pub fn new(cfg: ProjectsConfig) -> io::Result<Projects> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&cfg.dir)?;
        Ok(Projects {
            inner: Arc::new(cfg),
        })
    }

    pub fn budget_bytes(&self) -> u64 {
        self.inner.budget_bytes
    }

    /// The id of `caller`'s project `name`.
    pub fn id(caller: &Caller, name: &str) -> Result<Nanoid, BadSessionName> {
        FileSessions::derive(PROJECT, caller, name)
    }

    /// The key of the project's turn lock (one run at a time).
    pub fn turn_key(project: &Project) -> &Nanoid {
        &project.id
    }

    fn project(&self, id: Nanoid) -> Project {
        let dir = self.inner.dir.join(id.as_str());
        Project { id, dir }
    }

    /// `caller`'s project `name`, created empty on first use.
    pub async fn open(&self, caller: &Caller, name: &str) -> Result<Project, ProjectError> {
        let project = self.project(Self::id(caller, name)?);
        let p = project.clone();
        blocking(move || {
            use std::os::unix::fs::DirBuilderExt;
            let mut b = std::fs::DirBuilder::new();
            b.mode(0o700);
            for d in [p.dir.clone(), p.tree()] {
                match b.create(&d) {
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e.into()),
                    _ => {}
                }
            }
            remove_leftovers(&p.dir)?;
            // the idle clock of [`Projects::sweep`]
            std::fs::File::open(&p.dir)?.set_modified(std::time::SystemTime::now())?;
            Ok(())
        })
        .await?;
        Ok(project)
    }

    /// Removes every project nobody opened for `idle` (its directory's
    /// modification time, set by [`Projects::open`] and by each commit, is
    /// older), with its files; returns how many. The clock is on disk, so
    /// it runs across restarts: a project of a bridge sandbox a restart
    /// forgot goes this way too. A project is first renamed out of the way
    /// (`gone-*`, one atomic step) and then removed: a call opening it at
    /// that moment gets a new, empty project, never a half-removed one.
    pub async fn sweep(&self, idle: std::time::Duration) -> Result<u64, ProjectError> {
        let dir = self.inner.dir.clone();
        blocking(move || {
            let cutoff = std::time::SystemTime::now()
                .checked_sub(idle)
                .unwrap_or(std::time::UNIX_EPOCH);
            let fd = open_dir_path(&dir)?;
            let mut stale = Vec::new();
            let mut listing = rustix::fs::Dir::read_from(&fd)?;
            while let Some(entry) = listing.read() {
                let entry = entry?;
                let Ok(name) = entry.file_name().to_str() else {
                    continue;
                };
                if name == "." || name == ".." {
                    continue;
                }
                if name.starts_with(GONE) {
                    // a removal a crash interrupted
                    stale.push((name.to_owned(), false));
                    continue;
                }
                let st = rustix::fs::statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW)?;
                let modified = std::time::UNIX_EPOCH
                    + std::time::Duration::new(
                        u64::try_from(st.st_mtime).unwrap_or(0),
                        u32::try_from(st.st_mtime_nsec).unwrap_or(0),
                    );
                if FileType::from_raw_mode(st.st_mode) == FileType::Directory && modified < cutoff {
                    stale.push((name.to_owned(), true));
                }
            }
            let mut removed = 0;
            for (name, rename_first) in stale {
                let doomed = if rename_first {
                    let doomed = format!("{GONE}{}", Nanoid::random());
                    rustix::fs::renameat(&fd, name.as_str(), &fd, doomed.as_str())?;
                    removed += 1;
                    doomed
                } else {
                    name
                };
                remove_child(fd.as_fd(), &doomed)?;
            }
            Ok(removed)
        })
        .await
    }

    /// `caller`'s project `name` if it exists.
    pub async fn find(&self, caller: &Caller, name: &str) -> Result<Option<Project>, ProjectError> {
        let project = self.project(Self::id(caller, name)?);
        let p = project.clone();
        let exists = blocking(move || Ok(p.exists())).await?;
        Ok(exists.then_some(project))
    }

    /// When `caller`'s project `name` was last opened (the idle clock of
    /// [`Projects::sweep`], on disk), if it exists.
    pub async fn last_opened(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<Option<std::time::SystemTime>, ProjectError> {
        let project = self.project(Self::id(caller, name)?);
        blocking(move || {
            // what `find` asks, and the clock, in one blocking step
            if !project.exists() {
                return Ok(None);
            }
            Ok(Some(std::fs::symlink_metadata(&project.dir)?.modified()?))
        })
        .await
    }

    /// Deletes `caller`'s project `name` and everything in it; `false` when
    /// there was none.
    pub async fn delete(&self, caller: &Caller, name: &str) -> Result<bool, ProjectError> {
        let Some(project) = self.find(caller, name).await? else {
            return Ok(false);
        };
        blocking(move || {
            remove_dir_tree(&project.dir)?;
            Ok(true)
        })
        .await
    }

    /// Bytes and entries the project holds.
    pub async fn usage(&self, project: &Project) -> Result<(u64, u64), ProjectError> {
        let tree = project.tree();
        blocking(move || {
            let root = open_dir_path(&tree)?;
            let mut count = Count::unlimited();
            walk(root.as_fd(), None, &mut count, 0)?;
            Ok((count.bytes, count.entries))
        })
        .await
    }

    /// The entries of directory `rel` ("" for the top); `None` when it is
    /// not a directory of the project.
    pub async fn list(
        &self,
        project: &Project,
        rel: &str,
    ) -> Result<Option<Vec<Entry>>, ProjectError> {
        let rel = checked(rel, true)?;
        let tree = project.tree();
        blocking(move || Ok(Workspace::open(&tree, (0, 0))?.read_dir(&rel)?)).await
    }

    /// The file `rel` when it is a regular file no larger than `max_bytes`
    /// (`None` when missing, not a file, reached through a link, or larger).
    pub async fn read(
        &self,
        project: &Project,
        rel: &str,
        max_bytes: u64,
    ) -> Result<Option<Vec<u8>>, ProjectError> {
        let rel = checked(rel, false)?;
        let tree = project.tree();
        blocking(move || {
            let ws = Workspace::open(&tree, (0, 0))?;
            let Some((file, size)) = ws.open_regular(&rel)? else {
                return Ok(None);
            };
            if size > max_bytes {
                return Ok(None);
            }
            let mut out = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
            io::Read::read_to_end(&mut io::Read::take(file, max_bytes), &mut out)?;
            Ok(Some(out))
        })
        .await
    }

    /// Writes `bytes` as the file `rel` (atomically; missing directories
    /// are created), unless the project would exceed its budget. Not for
    /// use while a run holds the project: take its turn first.
    pub async fn write(
        &self,
        project: &Project,
        rel: &str,
        bytes: Vec<u8>,
    ) -> Result<(), ProjectError> {
        let rel = checked(rel, false)?;
        let (used, entries) = self.usage(project).await?;
        let tree = project.tree();
        let budget = self.inner.budget_bytes;
        blocking(move || {
            let ws = Workspace::open(&tree, (0, 0))?;
            let old = ws.open_regular(&rel)?.map_or(0, |(_, size)| size);
            let used = used.saturating_sub(old) + bytes.len() as u64;
            if used > budget || entries + u64::from(old == 0) > MAX_ENTRIES {
                return Err(ProjectError::OverBudget {
                    used,
                    entries,
                    budget,
                });
            }
            ws.make_parents(&rel)?;
            ws.write_atomically(&rel, &bytes)?;
            Ok(())
        })
        .await
    }

    /// Copies the project into `work` (an empty directory the caller
    /// made: a run's working copy on its slot filesystem), every entry
    /// owned by `owner` (the jail's user).
    pub async fn check_out(
        &self,
        project: &Project,
        work: &Path,
        owner: (u32, u32),
    ) -> Result<(), ProjectError> {
        let (tree, work) = (project.tree(), work.to_path_buf());
        blocking(move || {
            let (src, dst) = (open_dir_path(&tree)?, open_dir_path(&work)?);
            let mut count = Count::unlimited();
            walk(src.as_fd(), Some((dst.as_fd(), Some(owner))), &mut count, 0)
        })
        .await
    }

    /// Makes the working copy `work` (after the run: no process writes it
    /// any more) the project's content, unless it is over the budget: then
    /// nothing changes and [`ProjectError::OverBudget`] says by how much.
    /// Returns the bytes the project now holds.
    pub async fn commit(&self, project: &Project, work: &Path) -> Result<u64, ProjectError> {
        let (dir, work) = (project.dir.clone(), work.to_path_buf());
        let budget = self.inner.budget_bytes;
        blocking(move || {
            let parent = open_dir_path(&dir)?;
            let fresh = format!("new-{}", Nanoid::random());
            rustix::fs::mkdirat(&parent, fresh.as_str(), Mode::from_raw_mode(0o700))?;
            let copied = (|| {
                let dst = open_beneath(parent.as_fd(), &cstr(&fresh)?, dir_flags())?;
                let src = open_dir_path(&work)?;
                let mut count = Count::limited(budget);
                walk(src.as_fd(), Some((dst.as_fd(), None)), &mut count, 0)?;
                Ok(count.bytes)
            })();
            match copied {
                Ok(bytes) => {
                    rustix::fs::renameat_with(
                        &parent,
                        fresh.as_str(),
                        &parent,
                        TREE,
                        RenameFlags::EXCHANGE,
                    )?;
                    // the old tree, now under the fresh name
                    remove_child(parent.as_fd(), &fresh)?;
                    Ok(bytes)
                }
                Err(e) => {
                    let _ = remove_child(parent.as_fd(), &fresh);
                    Err(e)
                }
            }
        })
        .await
    }
}

/// Runs `f` on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ProjectError> + Send + 'static,
) -> Result<T, ProjectError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ProjectError::Io(io::Error::other(e)))?
}

/// `rel` as a plain relative path ("" allowed only for the top when
/// `top_ok`); `..`, absolute paths and empty components are refused.
fn checked(rel: &str, top_ok: bool) -> Result<String, ProjectError> {
    let rel = rel.trim_start_matches("./");
    if rel.is_empty() && top_ok {
        return Ok(String::new());
    }
    kiln_core::RelPath::parse(rel)
        .map(|p| p.as_str().to_owned())
        .map_err(|e| ProjectError::BadPath(format!("{rel:?}: {e}")))
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY
}

fn cstr(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Opens a trusted host directory (the projects' dir, a slot's working
/// copy) without following a link at its last component.
fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        dir_flags() | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens `name` below `dir` the way the workspace rule says: beneath it,
/// no symlink, no magic link, no mount crossing.
fn open_beneath(dir: BorrowedFd<'_>, name: &CStr, flags: OFlags) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        dir,
        name,
        flags | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH,
    )?)
}

/// Bytes and entries seen by a walk, and the budget that stops it.
struct Count {
    bytes: u64,
    entries: u64,
    budget: Option<u64>,
}

impl Count {
    fn unlimited() -> Count {
        Count {
            bytes: 0,
            entries: 0,
            budget: None,
        }
    }

    fn limited(budget: u64) -> Count {
        Count {
            budget: Some(budget),
            ..Count::unlimited()
        }
    }

    fn add(&mut self, bytes: u64) -> Result<(), ProjectError> {
        self.bytes = self.bytes.saturating_add(bytes);
        self.entries += 1;
        match self.budget {
            Some(budget) if self.bytes > budget || self.entries > MAX_ENTRIES => {
                Err(ProjectError::OverBudget {
                    used: self.bytes,
                    entries: self.entries,
                    budget,
                })
            }
            _ => Ok(()),
        }
    }
}

/// Walks the directory `src`, counting every entry; with `dst`, copies
/// each into it (directories, regular files and links; anything else is
/// skipped), owned by `dst`'s owner when given (else by root), keeping
/// only permission bits. Never follows a link.
fn walk(
    src: BorrowedFd<'_>,
    dst: Option<(BorrowedFd<'_>, Option<(u32, u32)>)>,
    count: &mut Count,
    depth: usize,
) -> Result<(), ProjectError> {
    if depth > kiln_core::path::MAX_DEPTH {
        return Err(ProjectError::BadPath(format!(
            "directories nested deeper than {}",
            kiln_core::path::MAX_DEPTH
        )));
    }
    let mut names = Vec::new();
    let mut listing = rustix::fs::Dir::read_from(src)?;
    while let Some(entry) = listing.read() {
        let name = entry?.file_name().to_owned();
        if name.as_bytes() != b"." && name.as_bytes() != b".." {
            names.push(name);
        }
    }
    for name in names {
        let st = match rustix::fs::statat(src, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(io::Error::from(e).into()),
        };
        let mode = Mode::from_raw_mode(st.st_mode & 0o777);
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {
                count.add(0)?;
                let from = open_beneath(src, &name, dir_flags())?;
                let to = match dst {
                    Some((d, owner)) => {
                        rustix::fs::mkdirat(d, name.as_c_str(), Mode::from_raw_mode(0o700))?;
                        let to = open_beneath(d, &name, dir_flags())?;
                        finish(to.as_fd(), mode, owner)?;
                        Some((to, owner))
                    }
                    None => None,
                };
                let to_ref = to.as_ref().map(|(fd, owner)| (fd.as_fd(), *owner));
                walk(from.as_fd(), to_ref, count, depth + 1)?;
            }
            FileType::RegularFile => {
                let from = open_beneath(src, &name, OFlags::RDONLY | OFlags::NONBLOCK)?;
                let size = rustix::fs::fstat(&from)?;
                if FileType::from_raw_mode(size.st_mode) != FileType::RegularFile {
                    continue;
                }
                count.add(size.st_size as u64)?;
                if let Some((d, owner)) = dst {
                    let to = rustix::fs::openat2(
                        d,
                        name.as_c_str(),
                        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o600),
                        BENEATH,
                    )?;
                    let mut to = std::fs::File::from(to);
                    // no more than was counted, should the file still grow
                    let from = std::fs::File::from(from);
                    io::copy(&mut io::Read::take(from, size.st_size as u64), &mut to)?;
                    finish(to.as_fd(), mode, owner)?;
                }
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(src, name.as_c_str(), Vec::new())?;
                count.add(target.as_bytes().len() as u64)?;
                if let Some((d, owner)) = dst {
                    rustix::fs::symlinkat(target.as_c_str(), d, name.as_c_str())?;
                    if let Some((uid, gid)) = owner {
                        rustix::fs::chownat(
                            d,
                            name.as_c_str(),
                            Some(rustix::fs::Uid::from_raw(uid)),
                            Some(rustix::fs::Gid::from_raw(gid)),
                            AtFlags::SYMLINK_NOFOLLOW,
                        )?;
                    }
                }
            }
            // FIFOs, sockets, devices: not project content
            _ => {}
        }
    }
    Ok(())
}

/// Gives a copied entry its permission bits and owner (root without one).
fn finish(fd: BorrowedFd<'_>, mode: Mode, owner: Option<(u32, u32)>) -> io::Result<()> {
    rustix::fs::fchmod(fd, mode)?;
    if let Some((uid, gid)) = owner {
        rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )?;
    }
    Ok(())
}

/// Removes the directory `name` below `parent` and everything in it,
/// through descriptors (nothing followed).
fn remove_child(parent: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    let c = cstr(name)?;
    let dir = open_beneath(parent, &c, dir_flags())?;
    let cleared = crate::workspace::clear_fd(dir.as_fd());
    let removed = rustix::fs::unlinkat(parent, c.as_c_str(), AtFlags::REMOVEDIR);
    cleared?;
    Ok(removed?)
}

/// Removes a project's directory (trusted path) and everything in it.
fn remove_dir_tree(dir: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name().and_then(|n| n.to_str()))
    else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    remove_child(open_dir_path(parent)?.as_fd(), name)
}

/// Removes what an interrupted commit left in a project's directory.
fn remove_leftovers(dir: &Path) -> Result<(), ProjectError> {
    let fd = open_dir_path(dir)?;
    let mut stale = Vec::new();
    let mut listing = rustix::fs::Dir::read_from(&fd)?;
    while let Some(entry) = listing.read() {
        let entry = entry?;
        if let Ok(name) = entry.file_name().to_str()
            && name.starts_with("new-")
        {
            stale.push(name.to_owned());
        }
    }
    for name in stale {
        remove_child(fd.as_fd(), &name)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
