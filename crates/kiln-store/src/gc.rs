//! Garbage collection: objects and sessions past the retention, and the
//! leftovers of crashes in the blob store (blobs without a metadata row,
//! staging files of uploads that never completed). A local blob directory
//! is scanned; a remote store is listed through its API, session by session
//! (one metadata query per session), and only names Kiln writes
//! (`<session>/<file>.<version>`) are ever removed from it.
//!
//! Leftovers are judged by age only: a blob or staging file is removed when
//! it has not been written for [`ORPHAN_AGE`] and no row names it. A blob is
//! renamed into place right after its last write and its row is inserted
//! right after that, so a blob that is still being stored is always young.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::TryStreamExt as _;
use kiln_core::Nanoid;
use object_store::ObjectStoreExt as _;

use crate::blobs::{Blobs, is_staging_name, parse_blob_name, run_blocking};
use crate::meta::Meta;
use crate::{GcReport, StoreError};

/// Unreferenced blobs and staging files younger than this are left alone.
pub(crate) const ORPHAN_AGE: Duration = Duration::from_secs(60 * 60);

/// Rows removed per statement, so one collection never holds SQLite's write
/// lock for long.
const BATCH: i64 = 500;

pub(crate) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn system_time_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => duration_ms(d),
        Err(before) => -duration_ms(before.duration()),
    }
}

/// Remove everything that expired as of `now_ms`.
pub(crate) async fn collect(
    meta: &Meta,
    blobs: &Blobs,
    retention: Duration,
    now_ms: i64,
) -> Result<GcReport, StoreError> {
    let cutoff = now_ms.saturating_sub(duration_ms(retention));
    let mut report = GcReport::default();

    loop {
        let removed = meta.delete_objects_before(cutoff, BATCH).await?;
        for obj in &removed {
            // The row is gone; a blob that cannot be removed now is an
            // orphan that a later sweep removes.
            if let Err(e) = blobs
                .delete(&obj.session_id, &obj.file_id, &obj.version)
                .await
            {
                tracing::warn!(session = %obj.session_id, file = %obj.file_id, error = %e,
                    "removing an expired blob");
            }
        }
        report.objects += removed.len() as u64;
        if (removed.len() as i64) < BATCH {
            break;
        }
    }

    report.sessions = meta.delete_empty_sessions_before(cutoff).await?;
    let orphan_cutoff = now_ms.saturating_sub(duration_ms(ORPHAN_AGE));
    report.orphan_blobs = match blobs.local_root() {
        Some(root) => sweep(meta, root, orphan_cutoff).await?,
        None => sweep_remote(meta, blobs, orphan_cutoff).await?,
    };

    if report != GcReport::default() {
        tracing::info!(
            sessions = report.sessions,
            objects = report.objects,
            orphan_blobs = report.orphan_blobs,
            "storage gc"
        );
    }
    Ok(report)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryKind {
    Dir,
    /// A regular file, symlink or anything else that is not a directory.
    NotDir,
}

#[derive(Debug)]
struct Entry {
    name: String,
    kind: EntryKind,
    mtime_ms: i64,
}

/// List a directory without following symlinks. A directory that vanished
/// lists as empty.
fn scan_dir(dir: &Path) -> Result<Vec<Entry>, StoreError> {
    let read = match std::fs::read_dir(dir) {
        Ok(read) => read,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::io("list", dir, e)),
    };
    let mut entries = Vec::new();
    for item in read {
        let item = item.map_err(|e| StoreError::io("list", dir, e))?;
        let meta = match item.metadata() {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(StoreError::io("stat", item.path(), e)),
        };
        let Ok(name) = item.file_name().into_string() else {
            tracing::warn!(path = %item.path().display(), "non-UTF-8 name in the blob directory");
            continue;
        };
        entries.push(Entry {
            name,
            kind: if meta.is_dir() {
                EntryKind::Dir
            } else {
                EntryKind::NotDir
            },
            // An unreadable mtime counts as "just written": never removed.
            mtime_ms: meta.modified().map(system_time_ms).unwrap_or(i64::MAX),
        });
    }
    Ok(entries)
}

/// Remove `paths` (never following symlinks); returns how many were removed.
/// When `dir` should now be empty it is removed too (ignored if it is not).
fn remove_files(paths: &[PathBuf], dir: Option<&Path>) -> u64 {
    let mut removed = 0;
    for path in paths {
        match std::fs::remove_file(path) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "removing an orphan blob"),
        }
    }
    if let Some(dir) = dir {
        // Fails harmlessly when an upload has started in the meantime;
        // object_store recreates a missing parent before staging a file.
        let _ = std::fs::remove_dir(dir);
    }
    removed
}

/// Remove blobs without a row and staging files, both older than `cutoff_ms`.
async fn sweep(meta: &Meta, root: &Path, cutoff_ms: i64) -> Result<u64, StoreError> {
    let root = root.to_path_buf();
    let top = {
        let dir = root.clone();
        run_blocking("list", &root, move || scan_dir(&dir)).await?
    };
    let mut removed = 0;
    let mut stray = Vec::new();
    for entry in top {
        let path = root.join(&entry.name);
        if entry.kind == EntryKind::NotDir {
            // Nothing is stored directly under the root.
            if entry.mtime_ms < cutoff_ms {
                stray.push(path);
            }
            continue;
        }
        let files = {
            let dir = path.clone();
            run_blocking("list", &path, move || scan_dir(&dir)).await?
        };
        // Read the rows after listing: a row inserted in between belongs to
        // a blob written moments ago, which is too young to be touched.
        let known = meta.blob_versions(&entry.name).await?;
        let mut doomed = Vec::new();
        for file in &files {
            if file.kind == EntryKind::Dir {
                tracing::warn!(path = %path.join(&file.name).display(),
                    "unexpected directory in the blob store; left alone");
                continue;
            }
            if file.mtime_ms >= cutoff_ms {
                continue;
            }
            let referenced = !is_staging_name(&file.name)
                && parse_blob_name(&file.name)
                    .is_some_and(|(f, v)| known.contains(&(f.to_owned(), v.to_owned())));
            if !referenced {
                doomed.push(path.join(&file.name));
            }
        }
        if doomed.is_empty() && !files.is_empty() {
            continue;
        }
        let now_empty = doomed.len() == files.len();
        let dir = path.clone();
        removed += run_blocking("remove", &path, move || {
            Ok(remove_files(&doomed, now_empty.then_some(dir.as_path())))
        })
        .await?;
    }
    if !stray.is_empty() {
        removed += run_blocking("remove", &root, move || Ok(remove_files(&stray, None))).await?;
    }
    Ok(removed)
}

/// Remove blobs without a row that were last written before `cutoff_ms`,
/// listing the store session by session. An incomplete multipart upload is
/// invisible to listing; the bucket's lifecycle rule for incomplete uploads
/// removes those (docs/deploy.md).
async fn sweep_remote(meta: &Meta, blobs: &Blobs, cutoff_ms: i64) -> Result<u64, StoreError> {
    let store = blobs.store();
    let top = store.list_with_delimiter(None).await?;
    let mut removed = 0;
    for prefix in top.common_prefixes {
        let session = prefix.as_ref().to_owned();
        if Nanoid::try_from(session.clone()).is_err() {
            continue; // not a session of ours
        }
        let listed: Vec<object_store::ObjectMeta> = store.list(Some(&prefix)).try_collect().await?;
        // Read the rows after listing: a row inserted in between belongs
        // to a blob written moments ago, which is too young to be touched.
        let known = meta.blob_versions(&session).await?;
        for obj in listed {
            let Some(name) = obj.location.filename() else {
                continue;
            };
            let ours = obj.location.parts().count() == 2
                && parse_blob_name(name)
                    .is_some_and(|(f, v)| Nanoid::try_from(f.to_owned()).is_ok() && is_version(v));
            if !ours || obj.last_modified.timestamp_millis() >= cutoff_ms {
                continue;
            }
            let (file, version) = parse_blob_name(name).unwrap_or_default();
            if known.contains(&(file.to_owned(), version.to_owned())) {
                continue;
            }
            match store.delete(&obj.location).await {
                Ok(()) => removed += 1,
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => tracing::warn!(blob = %obj.location, error = %e,
                    "removing an orphan blob"),
            }
        }
    }
    Ok(removed)
}

/// A blob version as `random_version` makes it: 32 lower-case hex digits.
fn is_version(v: &str) -> bool {
    v.len() == 32 && v.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_times_convert_to_signed_milliseconds() {
        assert_eq!(
            system_time_ms(UNIX_EPOCH + Duration::from_millis(1500)),
            1500
        );
        assert_eq!(system_time_ms(UNIX_EPOCH - Duration::from_millis(20)), -20);
    }

    #[test]
    fn scanning_a_missing_directory_lists_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(scan_dir(&dir.path().join("gone")).unwrap().is_empty());
    }

    #[test]
    fn scanning_reports_directories_and_never_follows_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::os::unix::fs::symlink("sub", dir.path().join("link")).unwrap();
        let mut entries = scan_dir(dir.path()).unwrap();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let kinds: Vec<_> = entries.iter().map(|e| (e.name.as_str(), e.kind)).collect();
        assert_eq!(
            kinds,
            [("link", EntryKind::NotDir), ("sub", EntryKind::Dir)]
        );
    }

    #[test]
    fn removing_files_removes_the_emptied_directory() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("s");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(sub.join("a"), b"x").unwrap();
        assert_eq!(
            remove_files(&[sub.join("a"), sub.join("missing")], Some(&sub)),
            1
        );
        assert!(!sub.exists());
    }
}
