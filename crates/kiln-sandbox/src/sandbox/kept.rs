//! One-shot `py` jails kept per fixed uid slot (`JailSpec::keep`): after
//! a run in an embedded parked jail whose init cleared the jail and
//! reported, the jail waits here, under its slot, for the slot's next
//! park. That park hands it a fresh program (`Started::again`: its init
//! checks the jail as new first, `jail/keep.rs`) only when the jail's spec
//! is the one the park would build — the same image, limits, binds, the
//! slot's same cgroups and network namespace, the same fork-server — and
//! its workspace is still the directory bound into it; anything else uses
//! the slot (a cold run, another profile, a compile step's workspace) and
//! ends the kept jail first.
//!
//! On unless `keep_jails` is unset (`SandboxConfig`; `KILN_KEEP_JAILS`)
//! or the host cannot keep jails (`probe::keep_jails_blocker`): SECURITY.md
//! says what holds, BENCHMARKS.md what it saves.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::run::Started;

/// The name of a kept jail's workspace under its slot's area: one
/// directory per slot, emptied (not removed) by the slot's clean-up.
pub(crate) const KEPT_WORKSPACE: &str = "wk";

/// What a kept jail was built from: a park may reuse it only for the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeepKey {
    /// The spec's line, as the jail's starter got it.
    pub spec_line: Vec<u8>,
    /// The fork-server its init holds a socket to.
    pub template: String,
    /// Device and inode of the workspace directory bound at `/mnt/data`.
    pub workspace: (u64, u64),
}

#[derive(Debug)]
struct Kept {
    key: KeepKey,
    started: Started,
}

/// The kept jails by slot index.
#[derive(Debug, Default)]
pub(super) struct KeptJails {
    by_slot: Mutex<HashMap<u32, Kept>>,
}

impl KeptJails {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Kept>> {
        self.by_slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `started` (a run's clean end) for slot `index`.
    pub(super) fn put(&self, index: u32, key: KeepKey, started: Started) {
        // one a slot: an older one (never, as a slot runs one job) ends
        let old = self.map().insert(index, Kept { key, started });
        drop(old);
    }

    /// Takes slot `index`'s kept jail and what it was built from.
    pub(super) fn take(&self, index: u32) -> Option<(KeepKey, Started)> {
        self.map().remove(&index).map(|k| (k.key, k.started))
    }

    /// The fork-server template of each slot's kept jail, by slot index.
    pub(super) fn templates(&self) -> HashMap<u32, String> {
        self.map()
            .iter()
            .map(|(&i, k)| (i, k.key.template.clone()))
            .collect()
    }

    /// Ends every kept jail.
    pub(super) fn clear(&self) {
        let all: Vec<Kept> = self.map().drain().map(|(_, k)| k).collect();
        drop(all);
    }
}

/// The kept workspace of the slot whose area is `parent`, made if missing,
/// its mode and owner reset (a program may have changed them); returns
/// its path and (device, inode).
pub(super) fn workspace(
    parent: &Path,
    uid: u32,
    gid: u32,
) -> std::io::Result<(PathBuf, (u64, u64))> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let ws = parent.join(KEPT_WORKSPACE);
    match std::fs::create_dir(&ws) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&ws)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other(
            "the kept workspace is not a directory",
        ));
    }
    std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o700))?;
    std::os::unix::fs::chown(&ws, Some(uid), Some(gid))?;
    Ok((ws, (meta.dev(), meta.ino())))
}
