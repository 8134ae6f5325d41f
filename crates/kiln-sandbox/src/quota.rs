//! Workspace quotas enforced by the kernel. Every uid slot owns one
//! filesystem mounted at `<slots_dir>/<i>/`; a job's workspace is a
//! directory directly below it, so filling it ends in `ENOSPC` (bytes or
//! inodes) and never takes more of the host than the quota.
//!
//! Backends, tried in order ([`QuotaMode::Auto`]):
//! 1. a sparse ext4 image `<slots_dir>/<i>.img` on a loop device with
//!    autoclear, mounted `nosuid,nodev`: a sparse copy of one empty
//!    filesystem `mkfs.ext4` made at start-up (`template.img`, no journal,
//!    never mounted), so a slot costs no `mkfs` process; emptying a
//!    slot ends with one `FITRIM`, so deleted files give their blocks back
//!    to the host (the `discard` mount option did that block by block and
//!    made removing a large tree take seconds);
//! 2. a tmpfs with `size` and `nr_inodes` (memory-backed: the bytes count
//!    against RAM, not disk);
//! 3. plain directories: no quota (a problem [`crate::HostReport`] reports).
//!
//! Emptying a slot walks its trees (`tree.rs`, any depth, a few fds) when
//! they are small, and makes the slot's filesystem afresh when they are
//! large (more than [`RECREATE_ABOVE_INODES`] in use) or cannot be walked:
//! a new copy of the template and a mount take milliseconds, walking a
//! jail's 40,000-level chain takes seconds.
//!
//! Slots kept for live kernels (the last `on_demand` ones) get no
//! filesystem at start: [`SlotFs::take`] makes one when a kernel takes the
//! slot, or ahead of it for the few the slot pool keeps ready, and
//! [`SlotFs::give_back`] unmounts it and removes its image when the kernel
//! closes, so a large `max_sessions` costs an idle server a few mounts, not
//! one per kernel slot, and no start-up time.
//!
//! [`SlotFs::setup`] first unmounts whatever a previous server left at those
//! paths; [`SlotFs::teardown`] (on shutdown, on drop of the last
//! [`crate::Sandbox`] clone, and at process exit) unmounts everything and
//! removes the images and mount points.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, RwLock, Weak};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

use crate::cgroup::detect::unescape;
use crate::error::SandboxError;
use crate::sys;

/// Above this many inodes in use, a slot's filesystem is made afresh
/// rather than walked when the slot is emptied.
pub const RECREATE_ABOVE_INODES: u64 = 4096;

/// Inodes in use on the filesystem of `dir`.
// `fsfilcnt_t` is u64 here but u32 on some targets
#[allow(clippy::useless_conversion)]
fn inodes_used(dir: &Path) -> Option<u64> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    Some(u64::from(st.files()).saturating_sub(u64::from(st.files_free())))
}

/// Which backend to use for the workspace quota (configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuotaMode {
    /// Loop-mounted ext4, else tmpfs, else none.
    #[default]
    Auto,
    /// Loop-mounted ext4 only (else none).
    Loop,
    /// tmpfs only (else none).
    Tmpfs,
    /// No quota (refused unless the sandbox may run degraded).
    Off,
}

/// What limits the workspaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkspaceQuota {
    /// One loop-mounted ext4 image per slot.
    LoopExt4,
    /// One size-limited tmpfs per slot (memory-backed); `reason` says why
    /// not loop devices.
    Tmpfs { reason: String },
    /// No quota, and why.
    None { reason: String },
}

impl fmt::Display for WorkspaceQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkspaceQuota::LoopExt4 => {
                write!(
                    f,
                    "yes (loop-mounted ext4 image per slot: bytes and inodes)"
                )
            }
            WorkspaceQuota::Tmpfs { reason } => write!(
                f,
                "tmpfs per slot (memory-backed: workspace bytes count against RAM); \
                 no loop-device quota: {reason}"
            ),
            WorkspaceQuota::None { reason } => write!(f, "NO ({reason})"),
        }
    }
}

/// Where `mkfs.ext4` lives, looking in the sbin directories a server's PATH
/// often lacks.
pub fn find_mkfs() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(PathBuf::from)
        .chain(std::env::split_paths(&path))
        .map(|d| d.join("mkfs.ext4"))
        .find(|p| p.is_file())
}

/// What the host could offer, without creating anything (for `kiln doctor`).
pub fn probe() -> WorkspaceQuota {
    if !nix::unistd::Uid::effective().is_root() {
        return WorkspaceQuota::None {
            reason: "not running as root: cannot mount".to_owned(),
        };
    }
    match loop_unavailable() {
        None => WorkspaceQuota::LoopExt4,
        Some(reason) => WorkspaceQuota::Tmpfs { reason },
    }
}

/// Why loop-mounted ext4 cannot work here, if it cannot.
fn loop_unavailable() -> Option<String> {
    if find_mkfs().is_none() {
        return Some("mkfs.ext4 not found (install e2fsprogs)".to_owned());
    }
    let ext4 = fs::read_to_string("/proc/filesystems")
        .map(|t| {
            t.lines()
                .any(|l| l.split_whitespace().last() == Some("ext4"))
        })
        .unwrap_or(false);
    if !ext4 {
        return Some("the kernel has no ext4".to_owned());
    }
    match fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
    {
        Ok(_) => None,
        Err(e) => Some(format!("/dev/loop-control: {e}")),
    }
}

/// The slots' workspace filesystems.
#[derive(Debug)]
pub(crate) struct SlotFs {
    dir: PathBuf,
    slots: u32,
    /// The last `on_demand` slots are mounted only while taken.
    on_demand: u32,
    bytes: u64,
    inodes: u64,
    quota: WorkspaceQuota,
    /// The loop backend's empty filesystem has been made (`template.img`).
    template_made: Mutex<bool>,
    /// Every slot that is not a kernel's has a mount point of its own, a
    /// shared bind of its directory on itself (see
    /// [`SlotFs::separates_kernels`]).
    shared_points: bool,
    /// Set by [`SlotFs::teardown`]. Held exclusively while a slot's
    /// filesystem is mounted again (`recreate`) and during teardown, so a
    /// re-creation racing the teardown cannot leave a mount behind it;
    /// shared while a slot's filesystem is given back, so kernels closing
    /// together (a shutdown with many) unmount and remove their images side
    /// by side instead of one after another.
    torn_down: RwLock<bool>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn shared<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

fn exclusive<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

/// Live slot filesystems of this process, torn down at exit.
static LIVE: Mutex<Vec<Weak<SlotFs>>> = Mutex::new(Vec::new());

/// Teardowns under way, and their end. A server dropped on another thread
/// (its last reference) tears down in `Drop`, where [`LIVE`] can no longer
/// reach it; the exit hook waits for it, or the process would end half-way
/// through and leave the remaining slots mounted.
static TEARING_DOWN: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());
/// How long the exit hook waits for teardowns on other threads.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Counts one teardown under way while it lives.
struct TeardownUnderWay;

impl TeardownUnderWay {
    fn start() -> TeardownUnderWay {
        *lock(&TEARING_DOWN.0) += 1;
        TeardownUnderWay
    }
}

impl Drop for TeardownUnderWay {
    fn drop(&mut self) {
        let mut n = lock(&TEARING_DOWN.0);
        *n = n.saturating_sub(1);
        TEARING_DOWN.1.notify_all();
    }
}

extern "C" fn teardown_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let live: Vec<Arc<SlotFs>> = lock(&LIVE).iter().filter_map(Weak::upgrade).collect();
        for fs in live {
            fs.teardown();
        }
        let n = lock(&TEARING_DOWN.0);
        let _ = TEARING_DOWN
            .1
            .wait_timeout_while(n, EXIT_WAIT, |n| *n > 0)
            .unwrap_or_else(|p| p.into_inner());
    });
}

/// Whether more than `keep` mounts are stacked at `path` (0, or 1: a slot
/// directory's bind on itself, see [`SlotFs::separates_kernels`]). Asks
/// `statx` which mount is on top at `path` and at its parent: none is
/// mounted at `path` if they are the same, and a mount of the parent's own
/// filesystem there is the bind (a workspace filesystem is another
/// device). Only kernels that report no mount id make it read the whole
/// mount table, which holds one mount per live kernel: at 1,000 kernels
/// that read cost every kernel create and delete milliseconds.
fn mounted_above(path: &Path, keep: usize) -> bool {
    let parent = path.parent().unwrap_or(path);
    match (sys::mount_of(path), sys::mount_of(parent)) {
        (Ok(Some((top, top_dev))), Ok(Some((below, below_dev)))) => {
            top != below && (keep == 0 || top_dev != below_dev)
        }
        _ => mounts_at(path) > keep,
    }
}

/// Mount points equal to `path` in the calling thread's mount namespace
/// (stacked mounts count once each).
fn mounts_at(path: &Path) -> usize {
    let Ok(info) = fs::read_to_string("/proc/thread-self/mountinfo") else {
        return 0;
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(&unescape(m)) == path)
        .count()
}

/// Unmounts what is mounted at `path`, topmost first, until `keep` mounts
/// are left there (the lowest ones).
fn unmount_all(path: &Path, keep: usize) -> Result<(), String> {
    for _ in 0..16 {
        if !mounted_above(path, keep) {
            return Ok(());
        }
        if let Err(e) = umount2(path, MntFlags::empty()) {
            if e != nix::errno::Errno::EBUSY {
                return Err(format!("unmount {}: {e}", path.display()));
            }
            umount2(path, MntFlags::MNT_DETACH)
                .map_err(|e| format!("detach {}: {e}", path.display()))?;
        }
    }
    Err(format!("{} stays mounted", path.display()))
}

/// Removes everything in `dir` (not `dir` itself, nor the names in
/// `keep`), never following links, whatever the shape of the trees in it
/// (see `tree.rs`).
fn empty_dir(dir: &Path, keep: &[&str]) -> io::Result<()> {
    let fd: std::os::fd::OwnedFd = fs::File::open(dir)?.into();
    for e in fs::read_dir(dir)? {
        let name = e?.file_name();
        if keep.iter().any(|k| name == *k) {
            continue;
        }
        crate::tree::remove_tree_at(&fd, &name)?;
    }
    Ok(())
}

impl SlotFs {
    /// Prepares `dir` and one workspace filesystem per slot with the first
    /// backend of `mode` that works, except for the last `on_demand` slots
    /// (mounted by [`SlotFs::take`]). With `separate_kernels`, the other
    /// slots' mount points are made shared first (see
    /// [`SlotFs::separates_kernels`]). Returns the reasons earlier backends
    /// failed. Fails only if `dir` itself is unusable.
    pub(crate) fn setup(
        dir: &Path,
        slots: u32,
        on_demand: u32,
        bytes: u64,
        inodes: u64,
        mode: QuotaMode,
        separate_kernels: bool,
    ) -> Result<(Arc<SlotFs>, Vec<String>), SandboxError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| SandboxError::io("create slots dir", dir, e))?;
        let dir = dir
            .canonicalize()
            .map_err(|e| SandboxError::io("resolve slots dir", dir, e))?;
        let meta = fs::metadata(&dir).map_err(|e| SandboxError::io("stat", &dir, e))?;
        if meta.uid() != 0 {
            return Err(SandboxError::Config(format!(
                "slots_dir {} must be owned by root",
                dir.display()
            )));
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o711))
            .map_err(|e| SandboxError::io("chmod", &dir, e))?;
        let mut this = SlotFs {
            dir,
            slots,
            on_demand: on_demand.min(slots),
            bytes,
            inodes,
            quota: WorkspaceQuota::None {
                reason: "disabled by configuration".to_owned(),
            },
            template_made: Mutex::new(false),
            shared_points: false,
            torn_down: RwLock::new(false),
        };
        this.clear_all()
            .and_then(|()| this.clear_beyond())
            .map_err(SandboxError::Setup)?;
        if separate_kernels && mode != QuotaMode::Off {
            match this.share_mount_points() {
                Ok(()) => this.shared_points = true,
                Err(e) => tracing::warn!(
                    error = %e,
                    "kernel slots stay visible to one-shot jails (each jail copies their mounts)"
                ),
            }
        }
        let mut failures = Vec::new();
        let order: &[QuotaMode] = match mode {
            QuotaMode::Auto => &[QuotaMode::Loop, QuotaMode::Tmpfs],
            QuotaMode::Loop => &[QuotaMode::Loop],
            QuotaMode::Tmpfs => &[QuotaMode::Tmpfs],
            QuotaMode::Off => &[],
        };
        for backend in order {
            match this.mount_all(*backend) {
                Ok(()) => {
                    this.quota = match backend {
                        QuotaMode::Loop => WorkspaceQuota::LoopExt4,
                        _ => WorkspaceQuota::Tmpfs {
                            reason: failures.join("; "),
                        },
                    };
                    failures.clear();
                    break;
                }
                Err(e) => {
                    tracing::warn!(backend = ?backend, error = %e, "workspace quota backend failed");
                    failures.push(e);
                    this.clear_all().map_err(SandboxError::Setup)?;
                }
            }
        }
        if !failures.is_empty() {
            this.quota = WorkspaceQuota::None {
                reason: failures.join("; "),
            };
        }
        let this = Arc::new(this);
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        if live.is_empty()
            && let Err(e) = sys::at_exit(teardown_at_exit)
        {
            tracing::warn!(error = %e, "slot filesystems will not be unmounted at exit");
        }
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&this));
        Ok((this, failures))
    }

    pub(crate) fn quota(&self) -> &WorkspaceQuota {
        &self.quota
    }

    /// The directory a slot's workspaces are created in.
    pub(crate) fn parent(&self, slot: u32) -> PathBuf {
        self.dir.join(slot.to_string())
    }

    fn image(&self, slot: u32) -> PathBuf {
        self.dir.join(format!("{slot}.img"))
    }

    /// The empty filesystem every loop-backed slot's image is copied from.
    fn template(&self) -> PathBuf {
        self.dir.join("template.img")
    }

    /// Whether the mounts of kernel slots can be kept out of the mount
    /// namespace one-shot jails are made from: every other slot's mount
    /// point is then a bind of its directory on itself, `MS_SHARED` (a
    /// peer group of its own), so a copy of the namespace made after it
    /// (the one-shot jails' launcher's, see `launcher.rs`) keeps receiving
    /// what is mounted and unmounted there (a slot's filesystem made
    /// afresh), while a kernel slot's filesystem, mounted on a plain
    /// directory of a namespace that propagates nothing (the server's own,
    /// a slave of the host's), reaches no copy.
    pub(crate) fn separates_kernels(&self) -> bool {
        self.shared_points
    }

    /// The slots directory, resolved (as `/proc/*/mountinfo` names it).
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many mounts at a slot's path are its mount point, not its
    /// filesystem: the shared bind of a slot that is not a kernel's.
    fn kept(&self, slot: u32) -> usize {
        usize::from(self.shared_points && slot < self.slots - self.on_demand)
    }

    /// Binds every slot's directory but the kernel slots' on itself and
    /// makes it shared (undone again if one fails).
    fn share_mount_points(&self) -> Result<(), String> {
        let shared: Vec<PathBuf> = (0..self.slots - self.on_demand)
            .map(|i| self.parent(i))
            .collect();
        for (n, point) in shared.iter().enumerate() {
            let made = mount(
                Some(point.as_path()),
                point.as_path(),
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| format!("bind {} on itself: {e}", point.display()))
            .and_then(|()| {
                mount(
                    None::<&str>,
                    point.as_path(),
                    None::<&str>,
                    MsFlags::MS_SHARED,
                    None::<&str>,
                )
                .map_err(|e| format!("make {} shared: {e}", point.display()))
            });
            if let Err(e) = made {
                for p in &shared[..=n] {
                    let _ = unmount_all(p, 0);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Unmounts a slot's filesystem (detached if busy) and removes its
    /// image.
    fn unmount(&self, slot: u32) -> Result<(), String> {
        unmount_all(&self.parent(slot), self.kept(slot))?;
        match fs::remove_file(self.image(slot)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(format!("remove {}: {e}", self.image(slot).display()))
            }
            _ => Ok(()),
        }
    }

    /// Unmounts and removes whatever is at every slot's paths and leaves
    /// empty root-owned 0711 mount points.
    fn clear_all(&self) -> Result<(), String> {
        for i in 0..self.slots {
            let parent = self.parent(i);
            self.unmount(i)?;
            match fs::symlink_metadata(&parent) {
                Ok(m) if m.is_dir() => empty_dir(&parent, &[])
                    .map_err(|e| format!("empty {}: {e}", parent.display()))?,
                Ok(_) => fs::remove_file(&parent)
                    .map_err(|e| format!("remove {}: {e}", parent.display()))?,
                Err(_) => {}
            }
            fs::DirBuilder::new()
                .mode(0o711)
                .create(&parent)
                .or_else(|e| match e.kind() {
                    io::ErrorKind::AlreadyExists => Ok(()),
                    _ => Err(e),
                })
                .and_then(|()| fs::set_permissions(&parent, fs::Permissions::from_mode(0o711)))
                .map_err(|e| format!("create {}: {e}", parent.display()))?;
        }
        Ok(())
    }

    /// Unmounts and removes the areas and images of slots beyond this
    /// server's (`<n>/`, `<n>.img` with `n >= slots`): what a previous
    /// server with more slots left when it was killed (its kernel slots'
    /// images, say).
    fn clear_beyond(&self) -> Result<(), String> {
        let entries =
            fs::read_dir(&self.dir).map_err(|e| format!("read {}: {e}", self.dir.display()))?;
        let stale: Vec<u32> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter_map(|n| n.trim_end_matches(".img").parse::<u32>().ok())
            .filter(|&n| n >= self.slots)
            .collect();
        for n in stale {
            let parent = self.parent(n);
            self.unmount(n)?;
            match fs::symlink_metadata(&parent) {
                Ok(m) if m.is_dir() => {
                    empty_dir(&parent, &[])
                        .and_then(|()| fs::remove_dir(&parent))
                        .map_err(|e| format!("remove {}: {e}", parent.display()))?;
                }
                Ok(_) => fs::remove_file(&parent)
                    .map_err(|e| format!("remove {}: {e}", parent.display()))?,
                Err(_) => {}
            }
        }
        Ok(())
    }

    fn mount_all(&self, backend: QuotaMode) -> Result<(), String> {
        let is_loop = backend == QuotaMode::Loop;
        if is_loop {
            if let Some(reason) = loop_unavailable() {
                return Err(reason);
            }
            self.make_template()?;
        }
        // the copy and the mount are mostly waiting: in parallel
        let results: Vec<Result<(), String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.slots - self.on_demand)
                .map(|i| {
                    s.spawn(move || {
                        if is_loop {
                            self.mount_loop(i)
                        } else {
                            self.mount_tmpfs(i)
                        }
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("slot set-up panicked".to_owned()))
                })
                .collect()
        });
        results.into_iter().collect::<Result<Vec<()>, String>>()?;
        Ok(())
    }

    /// Makes the empty filesystem the slots' images are copied from
    /// (replacing whatever a previous server left at its path): one
    /// `mkfs.ext4` for the server's life instead of one per slot.
    fn make_template(&self) -> Result<(), String> {
        let mut made = lock(&self.template_made);
        let mkfs = find_mkfs().ok_or("mkfs.ext4 not found")?;
        let image = self.template();
        match fs::remove_file(&image) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(format!("remove {}: {e}", image.display()));
            }
            _ => {}
        }
        drop(self.new_image(&image)?);
        let out = Command::new(&mkfs)
            .args([
                "-q",
                "-F",
                "-m",
                "0",
                "-O",
                "^has_journal",
                "-E",
                "nodiscard",
            ])
            .arg("-N")
            .arg(self.inodes.to_string())
            .arg(&image)
            .env_clear()
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("run {}: {e}", mkfs.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} {}: {} {}",
                mkfs.display(),
                image.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        *made = true;
        Ok(())
    }

    /// A new root-only image file of the quota's size, all hole.
    fn new_image(&self, image: &Path) -> Result<fs::File, String> {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(image)
            .map_err(|e| format!("create {}: {e}", image.display()))?;
        file.set_len(self.bytes)
            .map_err(|e| format!("size {}: {e}", image.display()))?;
        Ok(file)
    }

    /// Gives `slot` a sparse copy of the template and mounts it.
    fn mount_loop(&self, slot: u32) -> Result<(), String> {
        let image = self.image(slot);
        let parent = self.parent(slot);
        let file = self.new_image(&image)?;
        if !*lock(&self.template_made) {
            return Err("no template filesystem to copy".to_owned());
        }
        fs::File::open(self.template())
            .and_then(|template| copy_sparse(&template, &file))
            .map_err(|e| format!("copy the template to {}: {e}", image.display()))?;
        let (device, device_fd) =
            sys::loop_attach(&file).map_err(|e| format!("attach {}: {e}", image.display()))?;
        mount(
            Some(&device),
            &parent,
            Some("ext4"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            None::<&str>,
        )
        .map_err(|e| format!("mount {} on {}: {e}", device.display(), parent.display()))?;
        // The mount holds the device now; autoclear frees it on unmount.
        drop(device_fd);
        fs::set_permissions(&parent, fs::Permissions::from_mode(0o711))
            .map_err(|e| format!("chmod {}: {e}", parent.display()))
    }

    fn mount_tmpfs(&self, slot: u32) -> Result<(), String> {
        let parent = self.parent(slot);
        let options = format!("size={},nr_inodes={},mode=0711", self.bytes, self.inodes);
        mount(
            Some("tmpfs"),
            &parent,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(options.as_str()),
        )
        .map_err(|e| format!("mount tmpfs on {}: {e}", parent.display()))
    }

    /// Removes every workspace of `slot` (not ext4's `lost+found`). A slot
    /// holding many files, or a tree that cannot be removed, gets a new
    /// empty filesystem instead (loop and tmpfs backends), so no tree a jail
    /// can build keeps a slot out of use; only when that fails too is the
    /// error returned.
    pub(crate) fn empty(&self, slot: u32) -> Result<(), String> {
        if *shared(&self.torn_down) {
            return Ok(());
        }
        let parent = self.parent(slot);
        let can_recreate = !matches!(self.quota, WorkspaceQuota::None { .. });
        if can_recreate && inodes_used(&parent).is_some_and(|n| n > RECREATE_ABOVE_INODES) {
            match self.recreate(slot) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!(slot, error = %e, "re-creating the slot failed; emptying it")
                }
            }
        }
        // a kept jail's workspace (`sandbox/kept.rs`) is bound into its
        // jail: emptied, not removed
        let kept = crate::sandbox::KEPT_WORKSPACE;
        let emptied = empty_dir(&parent, &["lost+found", kept]).and_then(|()| {
            match empty_dir(&parent.join(kept), &[]) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        });
        let walked = match emptied {
            Ok(()) => {
                if self.quota == WorkspaceQuota::LoopExt4 {
                    // Freed blocks back to the host, in one batch.
                    if let Err(e) = fs::File::open(&parent).and_then(|d| sys::fstrim(&d)) {
                        tracing::debug!(slot, error = %e, "trim after emptying failed");
                    }
                }
                return Ok(());
            }
            Err(e) => format!("empty {}: {e}", parent.display()),
        };
        if !can_recreate {
            return Err(walked);
        }
        tracing::warn!(slot, error = %walked, "re-creating the slot's workspace filesystem");
        self.recreate(slot)
            .map_err(|e| format!("{walked}; re-creating it failed too: {e}"))
    }

    /// Gives an on-demand slot its own new empty filesystem (the same
    /// set-up as at start), for as long as it is taken.
    pub(crate) fn take(&self, slot: u32) -> Result<(), String> {
        self.recreate(slot)
    }

    /// Undoes [`SlotFs::take`]: unmounts the slot's filesystem (detached if
    /// busy; the loop device's autoclear frees it with the last user),
    /// removes its image and leaves an empty mount point.
    pub(crate) fn give_back(&self, slot: u32) -> Result<(), String> {
        let torn_down = shared(&self.torn_down);
        if *torn_down {
            return Ok(());
        }
        let parent = self.parent(slot);
        self.unmount(slot)?;
        // without a quota the workspaces were on the host filesystem
        empty_dir(&parent, &[]).map_err(|e| format!("empty {}: {e}", parent.display()))
    }

    /// Replaces a slot's filesystem by a new empty one: unmount (detached
    /// if busy), then the same set-up as at start.
    fn recreate(&self, slot: u32) -> Result<(), String> {
        let torn_down = exclusive(&self.torn_down);
        if *torn_down {
            return Err("the slot filesystems are torn down".to_owned());
        }
        self.unmount(slot)?;
        // Only the mount point is left; whatever is below it now is on the
        // host filesystem and came from no jail.
        match &self.quota {
            WorkspaceQuota::LoopExt4 => self.mount_loop(slot),
            WorkspaceQuota::Tmpfs { .. } => self.mount_tmpfs(slot),
            WorkspaceQuota::None { .. } => Ok(()),
        }
    }

    /// Unmounts every slot filesystem and removes images and mount points.
    /// Idempotent; later runs find no workspace parent.
    pub(crate) fn teardown(&self) {
        let _under_way = TeardownUnderWay::start();
        let mut torn_down = exclusive(&self.torn_down);
        if std::mem::replace(&mut *torn_down, true) {
            return;
        }
        for i in 0..self.slots {
            let parent = self.parent(i);
            if let Err(e) = unmount_all(&parent, 0) {
                tracing::error!(error = %e, "slot filesystem left mounted");
                continue;
            }
            let _ = fs::remove_file(self.image(i));
            let _ = empty_dir(&parent, &[]);
            let _ = fs::remove_dir(&parent);
        }
        let _ = fs::remove_file(self.template());
        let _ = fs::remove_dir(&self.dir);
    }

    /// Slot areas as plain directories under `dir`, for unit tests.
    #[cfg(test)]
    pub(crate) fn plain(dir: &Path, slots: u32) -> Arc<SlotFs> {
        let this = SlotFs {
            dir: dir.to_path_buf(),
            slots,
            on_demand: 0,
            bytes: 0,
            inodes: 0,
            quota: WorkspaceQuota::None {
                reason: "test".to_owned(),
            },
            template_made: Mutex::new(false),
            shared_points: false,
            torn_down: RwLock::new(false),
        };
        this.clear_all().expect("plain slot dirs");
        Arc::new(this)
    }
}

/// Copies the data of `from` into `to` (as long as `from`, all hole) one
/// data extent at a time (`SEEK_DATA`/`SEEK_HOLE`), so holes stay holes: a
/// 1 GiB empty ext4 image is well under a MiB of data. Where the filesystem
/// shares extents (XFS, btrfs), `copy_file_range` shares them.
fn copy_sparse(from: &fs::File, to: &fs::File) -> io::Result<()> {
    use nix::unistd::{Whence, lseek};
    let len = i64::try_from(from.metadata()?.len()).map_err(io::Error::other)?;
    let mut at = 0;
    while at < len {
        let start = match lseek(from, at, Whence::SeekData) {
            Ok(s) => s,
            // no data after `at`
            Err(nix::errno::Errno::ENXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = lseek(from, start, Whence::SeekHole)?;
        let (mut off_in, mut off_out) = (start, start);
        while off_in < end {
            let want = usize::try_from(end - off_in).map_err(io::Error::other)?;
            let n =
                nix::fcntl::copy_file_range(from, Some(&mut off_in), to, Some(&mut off_out), want)?;
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
            }
        }
        at = end;
    }
    Ok(())
}

impl Drop for SlotFs {
    fn drop(&mut self) {
        self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a thread of its own in a private mount namespace of its
    /// own (root only), so nothing it mounts outlives it or reaches the host.
    fn in_own_mount_namespace(f: impl FnOnce() + Send) -> bool {
        if !nix::unistd::Uid::effective().is_root() {
            return false;
        }
        std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("unshare");
                let flags = MsFlags::MS_REC | MsFlags::MS_PRIVATE;
                mount(None::<&str>, "/", None::<&str>, flags, None::<&str>).expect("private /");
                f();
            })
            .join()
            .expect("the test thread");
        });
        true
    }

    fn mount_tmpfs_at(path: &Path) {
        mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .expect("tmpfs");
    }

    #[test]
    fn unmounting_a_slot_removes_every_stacked_mount_but_the_kept_bind() {
        let top = tempfile::tempdir().expect("tempdir");
        let ran = in_own_mount_namespace(|| {
            let plain = top.path().join("plain");
            let shared = top.path().join("shared");
            fs::create_dir(&plain).expect("mkdir");
            fs::create_dir(&shared).expect("mkdir");
            assert!(!mounted_above(&plain, 0), "nothing mounted yet");
            mount_tmpfs_at(&plain);
            mount_tmpfs_at(&plain);
            assert_eq!(mounts_at(&plain), 2);
            assert!(mounted_above(&plain, 0) && mounted_above(&plain, 1));
            unmount_all(&plain, 0).expect("unmount");
            assert_eq!(mounts_at(&plain), 0);
            assert!(!mounted_above(&plain, 0));

            let bind = MsFlags::MS_BIND;
            mount(Some(&shared), &shared, None::<&str>, bind, None::<&str>).expect("bind");
            assert!(mounted_above(&shared, 0), "the bind is a mount");
            assert!(!mounted_above(&shared, 1), "the bind alone is kept");
            mount_tmpfs_at(&shared);
            assert!(mounted_above(&shared, 1), "a filesystem on the bind");
            unmount_all(&shared, 1).expect("unmount");
            assert_eq!(mounts_at(&shared), 1, "the bind stays");
            unmount_all(&shared, 0).expect("unmount");
            assert_eq!(mounts_at(&shared), 0);
        });
        if !ran {
            eprintln!("SKIPPED: needs root");
        }
    }

    #[test]
    fn emptying_removes_everything_but_kept_names_without_following_links() {
        let top = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("precious"), "x").expect("write");
        let fs = SlotFs::plain(top.path(), 1);
        let area = fs.parent(0);
        std::fs::create_dir_all(area.join("ws/a/b")).expect("mkdir");
        std::fs::write(area.join("ws/a/b/f"), "x").expect("write");
        std::os::unix::fs::symlink(outside.path(), area.join("ws/link")).expect("symlink");
        std::os::unix::fs::symlink(outside.path(), area.join("toplink")).expect("symlink");
        std::fs::create_dir(area.join("lost+found")).expect("mkdir");
        fs.empty(0).expect("empty");
        let left: Vec<_> = std::fs::read_dir(&area)
            .expect("read")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("lost+found")]);
        assert!(outside.path().join("precious").exists());
    }

    #[test]
    fn setting_up_fewer_slots_removes_the_areas_and_images_of_the_others() {
        let top = tempfile::tempdir().expect("tempdir");
        let many = SlotFs::plain(top.path(), 5);
        std::fs::write(many.parent(4).join("left"), "x").expect("write");
        std::fs::write(many.image(3), "image").expect("write");
        std::fs::write(top.path().join("notes"), "kept").expect("write");
        std::mem::forget(many); // killed: no teardown
        let few = SlotFs::plain(top.path(), 2);
        few.clear_beyond().expect("clear beyond");
        let mut left: Vec<String> = std::fs::read_dir(top.path())
            .expect("read")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["0", "1", "notes"]);
    }

    #[test]
    fn teardown_removes_the_slot_areas() {
        let top = tempfile::tempdir().expect("tempdir");
        let dir = top.path().join("slots");
        std::fs::create_dir(&dir).expect("mkdir");
        let fs = SlotFs::plain(&dir, 2);
        std::fs::write(fs.parent(1).join("left"), "x").expect("write");
        fs.teardown();
        assert!(!dir.exists(), "slots dir left behind");
        fs.teardown();
    }

    #[test]
    fn the_template_copy_keeps_its_data_and_its_holes() {
        use std::io::{Read, Seek, SeekFrom, Write};
        const LEN: u64 = 64 << 20;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut from = fs::File::create_new(dir.path().join("template")).expect("create");
        from.write_all(&[b'a'; 4096]).expect("write");
        from.seek(SeekFrom::Start(LEN / 2)).expect("seek");
        from.write_all(&[b'b'; 8192]).expect("write");
        from.set_len(LEN).expect("size");
        let to = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(dir.path().join("slot"))
            .expect("create");
        to.set_len(LEN).expect("size");
        let from = fs::File::open(dir.path().join("template")).expect("open");
        copy_sparse(&from, &to).expect("copy");
        let mut copied = Vec::new();
        (&to).read_to_end(&mut copied).expect("read");
        let mut original = Vec::new();
        // the copy moved the template's offset (SEEK_DATA)
        (&from).rewind().expect("rewind");
        (&from).read_to_end(&mut original).expect("read");
        assert_eq!(copied.len() as u64, LEN);
        assert!(copied == original, "the copy differs from the template");
        let allocated = to.metadata().expect("stat").blocks() * 512;
        assert!(
            allocated < 1 << 20,
            "the holes were filled: {allocated} bytes"
        );
    }

    #[test]
    fn quota_display_says_what_is_missing() {
        assert!(WorkspaceQuota::LoopExt4.to_string().starts_with("yes"));
        let t = WorkspaceQuota::Tmpfs {
            reason: "no loop".into(),
        }
        .to_string();
        assert!(t.contains("memory-backed") && t.contains("no loop"), "{t}");
        assert!(
            WorkspaceQuota::None { reason: "x".into() }
                .to_string()
                .starts_with("NO")
        );
    }
}
