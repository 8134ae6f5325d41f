//! Blob bytes: a local directory (object_store's `LocalFileSystem`) or any
//! object store (S3-compatible storage, or a test's fault-injecting one),
//! plus the two places where bytes cross into or out of an untrusted
//! workspace.
//!
//! Layout: `<session_id>/<file_id>.<version>` (under `<root>/` locally). The
//! random per-put version makes every write go to a fresh name, so a put
//! that loses a race on a duplicate id can never overwrite the bytes of the
//! object that won.
//!
//! Every write publishes its bytes atomically, whole or not at all: the
//! body is hashed and counted on the way and buffered up to one part; a body
//! that ends within it is stored with one `put`, a longer one as a multipart
//! upload (parts of `part_size`, at most [`PARTS_IN_FLIGHT`] in flight)
//! that is completed only after the last byte and aborted on any failure.
//! Locally both stream into a staging file `<path>#<n>` that is renamed
//! into place (fsynced); on S3 an object appears only when its `PUT` or
//! `CompleteMultipartUpload` succeeds.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _, TryStreamExt as _};
use object_store::local::LocalFileSystem;
use object_store::path::Path as BlobPath;
use object_store::{
    GetResultPayload, ObjectStore, ObjectStoreExt as _, PutPayload, WriteMultipart,
};
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt as _;
use tokio_util::io::ReaderStream;

use crate::StoreError;

/// Size of the parts handed to the multipart writer on local disk.
const LOCAL_PART: usize = 1024 * 1024;
/// Size of the parts of a remote multipart upload (S3 refuses parts under
/// 5 MiB but the last); a body that fits in one is sent with a single `PUT`.
pub(crate) const REMOTE_PART: usize = 8 * 1024 * 1024;
/// Parts being written concurrently per upload, before the body is polled again.
const PARTS_IN_FLIGHT: usize = 4;
/// Chunk size of streams read from disk.
pub(crate) const READ_CHUNK: usize = 64 * 1024;

/// The blob store.
#[derive(Debug, Clone)]
pub(crate) struct Blobs {
    store: Arc<dyn ObjectStore>,
    part_size: usize,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    /// A directory on this node: reads and copies go to the file directly.
    Local {
        fs: Arc<LocalFileSystem>,
        root: PathBuf,
    },
    /// An object store reached over the network (or a test's double).
    Remote,
}

/// What a completed write produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Written {
    pub size: u64,
    /// Lower-case hex SHA-256 of the bytes.
    pub sha256: String,
}

/// File name of a blob inside its session directory.
pub(crate) fn blob_name(file_id: &str, version: &str) -> String {
    format!("{file_id}.{version}")
}

/// Split a blob file name into `(file_id, version)`.
pub(crate) fn parse_blob_name(name: &str) -> Option<(&str, &str)> {
    let (file, version) = name.split_once('.')?;
    (!file.is_empty() && !version.is_empty()).then_some((file, version))
}

/// True for object_store's staging files (`<name>#<digits>`).
pub(crate) fn is_staging_name(name: &str) -> bool {
    match name.rsplit_once('#') {
        Some((_, suffix)) => !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

/// Run blocking filesystem work off the async runtime. A panic in `f` is
/// propagated; a task cancelled by runtime shutdown becomes an `Io` error.
pub(crate) async fn run_blocking<T, F>(op: &'static str, path: &Path, f: F) -> Result<T, StoreError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result,
        Err(join) => match join.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(join) => Err(StoreError::io(op, path, io::Error::other(join))),
        },
    }
}

fn map_missing(err: object_store::Error) -> StoreError {
    match err {
        object_store::Error::NotFound { .. } => StoreError::NotFound,
        other => StoreError::Blob(other),
    }
}

/// Where a write's bytes are going: held until they outgrow one part, then
/// a multipart upload.
enum Sink {
    Buffer { chunks: Vec<Bytes>, len: usize },
    Multipart(WriteMultipart),
}

impl Blobs {
    /// Use (creating, mode 0700) the directory `root` for blobs.
    pub(crate) fn open_local(root: PathBuf) -> Result<Blobs, StoreError> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .map_err(|e| StoreError::io("create directory", &root, e))?;
        let fs = Arc::new(
            LocalFileSystem::new_with_prefix(&root)?
                .with_fsync(true)
                .with_automatic_cleanup(true),
        );
        Ok(Blobs {
            store: fs.clone(),
            part_size: LOCAL_PART,
            kind: Kind::Local { fs, root },
        })
    }

    /// Keep blobs in `store` (S3, or a test's object store).
    pub(crate) fn remote(store: Arc<dyn ObjectStore>) -> Blobs {
        Blobs {
            store,
            part_size: REMOTE_PART,
            kind: Kind::Remote,
        }
    }

    /// The blob directory, when blobs are on this node's disk.
    pub(crate) fn local_root(&self) -> Option<&Path> {
        match &self.kind {
            Kind::Local { root, .. } => Some(root),
            Kind::Remote => None,
        }
    }

    /// The object store itself (the remote collector lists through it).
    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub(crate) fn location(session_id: &str, file_id: &str, version: &str) -> BlobPath {
        BlobPath::from(format!("{session_id}/{}", blob_name(file_id, version)))
    }

    /// Stream `body` into a new blob, hashing and counting on the way. When
    /// the body exceeds `max_bytes` or fails, or the store fails, nothing is
    /// published (a started multipart upload is aborted).
    pub(crate) async fn write<S>(
        &self,
        session_id: &str,
        file_id: &str,
        version: &str,
        mut body: S,
        max_bytes: u64,
    ) -> Result<Written, StoreError>
    where
        S: Stream<Item = Result<Bytes, StoreError>> + Send + Unpin,
    {
        let location = Self::location(session_id, file_id, version);
        if let Kind::Local { root, .. } = &self.kind {
            // object_store creates a missing session directory (and fsyncs
            // it) on the calling thread; create it off the runtime first.
            let root = root.clone();
            let session_dir = root.join(session_id);
            let dir = session_dir.clone();
            run_blocking("create directory", &session_dir, move || {
                create_session_dir(&root, &dir)
            })
            .await?;
        }
        let mut sink = Sink::Buffer {
            chunks: Vec::new(),
            len: 0,
        };
        let mut hasher = Sha256::new();
        let mut size = 0u64;

        let streamed: Result<(), StoreError> = async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk?;
                let len = chunk.len() as u64;
                if size.saturating_add(len) > max_bytes {
                    return Err(StoreError::TooLarge { limit: max_bytes });
                }
                size += len;
                hasher.update(&chunk);
                self.push(&mut sink, &location, chunk).await?;
            }
            Ok(())
        }
        .await;

        let done = match streamed {
            Ok(()) => match sink {
                Sink::Buffer { chunks, .. } => self
                    .store
                    .put(&location, PutPayload::from_iter(chunks))
                    .await
                    .map(|_| ())
                    .map_err(StoreError::from),
                // a failed completion aborts the upload itself
                Sink::Multipart(writer) => writer.finish().await.map(|_| ()).map_err(Into::into),
            },
            Err(err) => {
                if let Sink::Multipart(writer) = sink
                    && let Err(abort) = writer.abort().await
                {
                    tracing::warn!(blob = %location, error = %abort,
                        "aborting a failed upload; gc removes what it left");
                }
                Err(err)
            }
        };
        done?;
        Ok(Written {
            size,
            sha256: hex::encode(hasher.finalize()),
        })
    }

    /// Add `chunk` to the write; past one part, start (or feed) the
    /// multipart upload.
    async fn push(
        &self,
        sink: &mut Sink,
        location: &BlobPath,
        chunk: Bytes,
    ) -> Result<(), StoreError> {
        match sink {
            Sink::Buffer { chunks, len } => {
                *len += chunk.len();
                chunks.push(chunk);
                if *len > self.part_size {
                    let upload = self.store.put_multipart(location).await?;
                    let mut writer = WriteMultipart::new_with_chunk_size(upload, self.part_size);
                    for held in chunks.drain(..) {
                        writer.put(held);
                    }
                    *sink = Sink::Multipart(writer);
                }
            }
            Sink::Multipart(writer) => {
                writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
                writer.put(chunk);
            }
        }
        Ok(())
    }

    /// A stream of the blob's bytes: read from disk in chunks, or as the
    /// store sends them. A stream that fails part-way ends with an error.
    pub(crate) async fn read(
        &self,
        session_id: &str,
        file_id: &str,
        version: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, StoreError>>, StoreError> {
        let location = Self::location(session_id, file_id, version);
        let got = self.store.get(&location).await.map_err(map_missing)?;
        Ok(match got.payload {
            GetResultPayload::File(file, path) => {
                let file = tokio::fs::File::from_std(file);
                ReaderStream::with_capacity(file, READ_CHUNK)
                    .map_err(move |e| StoreError::io("read", path.clone(), e))
                    .boxed()
            }
            // a network store's chunks are whatever its reads returned:
            // cut them to the same bound as the disk's (without copying)
            GetResultPayload::Stream(stream) => stream
                .map_err(StoreError::Blob)
                .map_ok(|bytes| {
                    let pieces: Vec<Result<Bytes, StoreError>> = (0..bytes.len())
                        .step_by(READ_CHUNK)
                        .map(|at| Ok(bytes.slice(at..(at + READ_CHUNK).min(bytes.len()))))
                        .collect();
                    futures::stream::iter(pieces)
                })
                .try_flatten()
                .boxed(),
        })
    }

    /// Create `dest` (which must not exist, and is never followed if it is a
    /// symlink) with mode 0600 and copy the blob into it. A partial `dest` is
    /// removed on failure, as is one whose length is not `expected_size`.
    pub(crate) async fn copy_to(
        &self,
        session_id: &str,
        file_id: &str,
        version: &str,
        expected_size: u64,
        dest: &Path,
    ) -> Result<(), StoreError> {
        let location = Self::location(session_id, file_id, version);
        if let Kind::Local { fs, .. } = &self.kind {
            let src = fs.path_to_filesystem(&location)?;
            let dest_owned = dest.to_path_buf();
            return run_blocking("copy", dest, move || {
                copy_blocking(&src, &dest_owned, expected_size)
            })
            .await;
        }
        let mut stream = self.read(session_id, file_id, version).await?;
        let dest_owned = dest.to_path_buf();
        let file = run_blocking("create", dest, move || create_exclusive(&dest_owned)).await?;
        let mut file = tokio::fs::File::from_std(file);
        let copied: Result<(), StoreError> = async {
            let mut n = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                n += chunk.len() as u64;
                file.write_all(&chunk)
                    .await
                    .map_err(|e| StoreError::io("copy into", dest, e))?;
            }
            file.flush()
                .await
                .map_err(|e| StoreError::io("copy into", dest, e))?;
            check_size(location.as_ref(), n, expected_size, dest)
        }
        .await;
        if let Err(err) = copied {
            drop(file);
            remove_partial(dest);
            return Err(err);
        }
        Ok(())
    }

    /// The blob's file, when blobs are on this node's disk: a caller already
    /// on a blocking thread copies it from there in one step
    /// ([`LocalBlob::copy_into`]) instead of streaming it through the runtime.
    pub(crate) fn local(
        &self,
        session_id: &str,
        file_id: &str,
        version: &str,
        expected_size: u64,
    ) -> Result<Option<LocalBlob>, StoreError> {
        let Kind::Local { fs, .. } = &self.kind else {
            return Ok(None);
        };
        let location = Self::location(session_id, file_id, version);
        Ok(Some(LocalBlob {
            path: fs.path_to_filesystem(&location)?,
            size: expected_size,
        }))
    }

    /// Remove a blob; `false` when it was already gone (stores that answer
    /// a delete of a missing name with success report `true`).
    pub(crate) async fn delete(
        &self,
        session_id: &str,
        file_id: &str,
        version: &str,
    ) -> Result<bool, StoreError> {
        let location = Self::location(session_id, file_id, version);
        match self.store.delete(&location).await {
            Ok(()) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// Create a session directory if missing, making its entry in `root` durable.
fn create_session_dir(root: &Path, dir: &Path) -> Result<(), StoreError> {
    match std::fs::create_dir(dir) {
        Ok(()) => File::open(root)
            .and_then(|r| r.sync_all())
            .map_err(|e| StoreError::io("sync directory", root, e)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::io("create directory", dir, e)),
    }
}

/// Create `dest` for writing: `O_CREAT | O_EXCL` (never reuse or follow
/// what is there), `O_NOFOLLOW`, mode 0600.
fn create_exclusive(dest: &Path) -> Result<File, StoreError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(dest)
        .map_err(|e| StoreError::io("create", dest, e))
}

/// A copy must hold exactly the bytes the object's row records.
fn check_size(blob: &str, copied: u64, expected: u64, dest: &Path) -> Result<(), StoreError> {
    if copied == expected {
        return Ok(());
    }
    Err(StoreError::io(
        "copy into",
        dest,
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("blob {blob} holds {copied} bytes, expected {expected}"),
        ),
    ))
}

fn remove_partial(dest: &Path) {
    if let Err(e) = std::fs::remove_file(dest) {
        tracing::warn!(dest = %dest.display(), error = %e, "removing a partial copy");
    }
}

/// An object's bytes in the local blob directory, with the length its row
/// records (see [`crate::Store::local_blob`]).
#[derive(Debug, Clone)]
pub struct LocalBlob {
    path: PathBuf,
    size: u64,
}

impl LocalBlob {
    /// Copy the bytes into `to` (blocking: call it on a blocking thread).
    /// `NotFound` when the blob is gone; an error when it does not hold the
    /// length the row records. `dest` names `to` in errors.
    pub fn copy_into(&self, to: &mut File, dest: &Path) -> Result<(), StoreError> {
        copy_file(&self.path, to, self.size, dest)
    }
}

/// Copy the blob file `src` into `to`, which must then hold `expected_size` bytes.
fn copy_file(src: &Path, to: &mut File, expected_size: u64, dest: &Path) -> Result<(), StoreError> {
    let mut from = File::open(src).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => StoreError::NotFound,
        _ => StoreError::io("open blob", src, e),
    })?;
    // std::io::copy between two files uses copy_file_range.
    io::copy(&mut from, to)
        .map_err(|e| StoreError::io("copy into", dest, e))
        .and_then(|n| check_size(&src.display().to_string(), n, expected_size, dest))
}

fn copy_blocking(src: &Path, dest: &Path, expected_size: u64) -> Result<(), StoreError> {
    let mut to = create_exclusive(dest)?;
    if let Err(err) = copy_file(src, &mut to, expected_size, dest) {
        drop(to);
        remove_partial(dest);
        return Err(err);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_names_round_trip() {
        let name = blob_name("V1StGXR8_Z5jdHi6B-myT", "0a1b");
        assert_eq!(name, "V1StGXR8_Z5jdHi6B-myT.0a1b");
        assert_eq!(
            parse_blob_name(&name),
            Some(("V1StGXR8_Z5jdHi6B-myT", "0a1b"))
        );
        assert_eq!(parse_blob_name("noversion"), None);
        assert_eq!(parse_blob_name(".v"), None);
        assert_eq!(parse_blob_name("f."), None);
    }

    #[test]
    fn staging_names_are_recognised() {
        assert!(is_staging_name("abc.0a1b#1"));
        assert!(is_staging_name("abc.0a1b#42"));
        assert!(!is_staging_name("abc.0a1b"));
        assert!(!is_staging_name("abc.0a1b#"));
        assert!(!is_staging_name("abc#x1"));
    }

    #[tokio::test]
    async fn copy_removes_the_partial_destination_when_sizes_disagree() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::write(&src, b"12345").unwrap();
        let dest = dir.path().join("dest");
        let err = copy_blocking(&src, &dest, 6).unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Io {
                    op: "copy into",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(!dest.exists());
    }
}
