//! Kiln's storage: object metadata in SQLite or Postgres (sqlx, migrations
//! per backend) and blobs on local disk or in an S3-compatible bucket
//! (object_store; every write published atomically). [`Backends`] picks the
//! engines; the default is the embedded pair in the data directory.
//!
//! Invariants:
//! - a metadata row exists only for a blob that is completely written
//!   (blob first, row second; delete removes the row first, then the blob);
//!   a crash in between leaves at most an orphan blob, which `gc` removes;
//! - objects are immutable once written;
//! - ownership is recorded per storage session as a [`SessionKey`];
//!   authorization decisions are made by callers, not here.
//!
//! PUBLIC API CONTRACT (other crates code against these signatures):
//!
//! ```text
//! pub struct StoreConfig { pub dir: PathBuf, pub retention: Duration, pub budget: StorageBudget }
//! pub struct Store;                                   // Clone (Arc inside)
//! impl Store {
//!   pub async fn open(cfg: StoreConfig) -> Result<Store, StoreError>;   // embedded backends
//!   pub async fn open_with(cfg: StoreConfig, backends: Backends) -> Result<Store, StoreError>;
//!   pub fn retention(&self) -> Duration;
//!   pub async fn create_session(&self, id: &Nanoid, key: &SessionKey) -> Result<(), StoreError>;
//!   pub async fn session(&self, id: &Nanoid) -> Result<Option<SessionInfo>, StoreError>;
//!   pub async fn put_stream<S>(&self, obj: NewObject, body: S, max_bytes: u64)
//!       -> Result<ObjectMeta, StoreError>
//!       where S: Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin;
//!   pub async fn create_session_with<S>(&self, key: &SessionKey, owner: &SessionKey, obj: NewObject, body: S, max_bytes: u64)
//!       -> Result<ObjectMeta, StoreError>;             // a session and its first object, one round-trip
//!   pub async fn put_stream_owned<S>(&self, obj: NewObject, owner: &SessionKey, body: S, max_bytes: u64)
//!       -> Result<ObjectMeta, StoreError>;
//!   pub async fn object(&self, session: &Nanoid, file: &Nanoid) -> Result<Option<ObjectMeta>, StoreError>;
//!   pub async fn session_object(&self, session: &Nanoid, file: &Nanoid)
//!       -> Result<Option<(SessionKey, Option<ObjectMeta>)>, StoreError>;
//!   pub async fn list(&self, session: &Nanoid) -> Result<Vec<ObjectMeta>, StoreError>;
//!   pub async fn read(&self, meta: &ObjectMeta)
//!       -> Result<BoxStream<'static, Result<Bytes, StoreError>>, StoreError>;
//!   pub async fn copy_to(&self, meta: &ObjectMeta, dest: &Path) -> Result<(), StoreError>;
//!   pub fn local_blob(&self, meta: &ObjectMeta) -> Result<Option<LocalBlob>, StoreError>;
//!   pub async fn delete(&self, session: &Nanoid, file: &Nanoid) -> Result<bool, StoreError>;
//!   pub async fn gc(&self) -> Result<GcReport, StoreError>;
//!   pub async fn gc_at(&self, now_ms: i64) -> Result<GcReport, StoreError>;
//! }
//! ```
//!
//! Layout: `<dir>/kiln.db` (SQLite, WAL) or the Postgres database; blobs
//! at `<session_id>/<file_id>.<version>` under `<dir>/blobs/` or in the
//! bucket.
//!
//! Retention: `gc_at` removes objects created before `now - retention`, then
//! sessions created before that cutoff that hold no objects any more (a
//! session keeps living while it still holds a younger object), then blobs
//! and staging files that no row names and that were last written more than
//! an hour ago (found by listing the bucket when blobs are remote). Several
//! nodes may collect at once: each expired row is removed by exactly one of
//! them, and removing a blob twice is harmless.

mod backend;
mod blobs;
mod error;
mod gc;
mod ledger;
mod meta;
mod nodes;
mod usage;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, TryStreamExt as _};
use kiln_core::{Nanoid, RelPath, SessionKey};
use rand::Rng as _;

pub use backend::{Backends, BlobBackend, MetaBackend, S3Config};
pub use blobs::LocalBlob;
pub use error::StoreError;
pub use nodes::{NodeRow, OwnerRecord, RateStep};
pub use usage::StoredBytes;

use crate::blobs::{Blobs, run_blocking};
use crate::meta::Meta;

/// Where and how long the store keeps data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Data directory: holds `kiln.db` and `blobs/`. Created if missing.
    pub dir: PathBuf,
    /// How long objects and sessions live (the caller's default is 24 h).
    pub retention: Duration,
    /// Limits on the bytes stored.
    pub budget: StorageBudget,
}

/// Limits on the bytes stored, checked on every put (uploads and run
/// outputs alike): past one, the put fails with `QuotaExceeded` or
/// `DiskFull` and nothing of it remains. Sizes are logical (a sparse file
/// counts at its full length, as it is stored). Concurrent puts of one
/// owner are each judged in the statement that records the object, against
/// what the others committed, so together they never pass the quota (on
/// Postgres once the owner has stored something: the lock is the row of
/// their total); the bytes are first cut at what the owner had left when
/// the put began.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageBudget {
    /// Most bytes the sessions one owner created may hold; `None`: no quota.
    pub owner_quota_bytes: Option<u64>,
    /// Free space the store's filesystem always keeps; `0`: none.
    pub min_free_bytes: u64,
}

/// An object about to be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewObject {
    pub session_id: Nanoid,
    pub file_id: Nanoid,
    pub name: RelPath,
    pub content_type: String,
    pub read_only: bool,
}

/// A stored object's metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectMeta {
    pub session_id: Nanoid,
    pub file_id: Nanoid,
    /// The relative name the object was stored under.
    pub name: String,
    pub size: u64,
    /// Lower-case hex SHA-256 of the bytes.
    pub sha256: String,
    pub content_type: String,
    pub read_only: bool,
    /// When the row was written (Unix milliseconds).
    pub created_at_ms: i64,
    /// Random per put (32 hex characters); also names the blob.
    pub version: String,
}

impl ObjectMeta {
    /// A strong HTTP entity tag: the quoted SHA-256.
    pub fn etag(&self) -> String {
        format!("\"{}\"", self.sha256)
    }
}

/// A storage session and the key its objects are scoped to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub id: Nanoid,
    pub key: SessionKey,
    /// Unix milliseconds.
    pub created_at_ms: i64,
}

/// What one garbage collection removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Expired sessions (with no objects left).
    pub sessions: u64,
    /// Expired objects (rows and their blobs).
    pub objects: u64,
    /// Blobs without a row and staging files of uploads that never completed.
    pub orphan_blobs: u64,
}

/// Kiln's object store. Cheap to clone; clones share one database pool and
/// one blob directory.
#[derive(Debug, Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    meta: Meta,
    blobs: Blobs,
    retention: Duration,
    budget: StorageBudget,
    /// The store's directory (its filesystem's free space is the floor's
    /// when blobs are kept there).
    dir: PathBuf,
    /// What `kiln doctor` and the start-up log say is in use.
    names: (&'static str, &'static str),
    /// Owners this process last saw with less of their quota left than a
    /// put's own limit. An upload's first file ([`Store::create_session_with`])
    /// is judged after its bytes are written, so for these owners its bytes
    /// are cut at what is left first: an owner over the quota does not get
    /// a whole upload written to disk, only to have it refused. A hint, not
    /// the rule (the statement that records the object still judges): an
    /// owner missing here costs one whole write before the refusal marks it.
    near_quota: std::sync::Mutex<HashSet<String>>,
}

/// Owners [`Inner::near_quota`] remembers at most; past it the set starts
/// again (every owner then costs at most one more whole write).
const NEAR_QUOTA_MAX: usize = 4096;

/// Milliseconds since the Unix epoch, now.
fn now_ms() -> i64 {
    gc::system_time_ms(SystemTime::now())
}

/// A fresh blob version: 128 random bits as hex.
fn random_version() -> String {
    let bytes: [u8; 16] = rand::rng().random();
    hex::encode(bytes)
}

impl Store {
    /// Open (creating if needed) the embedded store in `cfg.dir` (SQLite
    /// and a blob directory) and apply migrations.
    pub async fn open(cfg: StoreConfig) -> Result<Store, StoreError> {
        Store::open_with(cfg, Backends::default()).await
    }

    /// Open the store on `backends`; `cfg.dir` is created either way and
    /// holds whatever of the store is embedded.
    pub async fn open_with(cfg: StoreConfig, backends: Backends) -> Result<Store, StoreError> {
        let dir = cfg.dir.clone();
        run_blocking("create directory", &cfg.dir, move || {
            std::fs::create_dir_all(&dir).map_err(|e| StoreError::io("create directory", &dir, e))
        })
        .await?;
        let blobs = match &backends.blobs {
            BlobBackend::Local => {
                let root = cfg.dir.join("blobs");
                run_blocking("create directory", &cfg.dir, move || {
                    Blobs::open_local(root)
                })
                .await?
            }
            BlobBackend::S3(s3) => Blobs::remote(s3.build()?),
            BlobBackend::Custom(store) => Blobs::remote(store.clone()),
        };
        let meta = match &backends.meta {
            MetaBackend::Sqlite => Meta::open_sqlite(&cfg.dir.join("kiln.db")).await?,
            MetaBackend::Postgres { url } => Meta::open_postgres(url).await?,
        };
        let names = (backends.meta.name(), backends.blobs.name());
        tracing::info!(dir = %cfg.dir.display(), retention_s = cfg.retention.as_secs(),
            metadata = names.0, blobs = names.1, "store open");
        Ok(Store {
            inner: Arc::new(Inner {
                meta,
                blobs,
                retention: cfg.retention,
                budget: cfg.budget,
                dir: cfg.dir,
                names,
                near_quota: std::sync::Mutex::default(),
            }),
        })
    }

    /// The metadata backend in use: `sqlite` or `postgres`.
    pub fn metadata_backend(&self) -> &'static str {
        self.inner.names.0
    }

    /// The blob backend in use: `local`, `s3` or `custom`.
    pub fn blob_backend(&self) -> &'static str {
        self.inner.names.1
    }

    /// How long objects and sessions live.
    pub fn retention(&self) -> Duration {
        self.inner.retention
    }

    /// Close the database pool (waits for connections in use). Every clone
    /// is affected; later calls fail.
    pub async fn close(&self) {
        self.inner.meta.close().await;
    }

    /// Record a new storage session bound to `key`, owned by `key` (a
    /// user's own session). `Conflict` if `id` exists.
    pub async fn create_session(&self, id: &Nanoid, key: &SessionKey) -> Result<(), StoreError> {
        self.inner.meta.insert_session(id, key, key, now_ms()).await
    }

    /// Record a new storage session bound to `key` whose bytes count
    /// against `owner`'s quota (an agent's or skill's files uploaded by a
    /// user). `Conflict` if `id` exists.
    pub async fn create_session_owned(
        &self,
        id: &Nanoid,
        key: &SessionKey,
        owner: &SessionKey,
    ) -> Result<(), StoreError> {
        self.inner
            .meta
            .insert_session(id, key, owner, now_ms())
            .await
    }

    /// Bytes stored in the sessions `owner` created.
    pub async fn owner_bytes(&self, owner: &SessionKey) -> Result<u64, StoreError> {
        self.inner.meta.owner_bytes(owner.as_str()).await
    }

    /// Free bytes (for unprivileged users) on the filesystem of the store's
    /// directory.
    pub fn free_bytes(&self) -> Result<u64, StoreError> {
        let dir = &self.inner.dir;
        let st = nix::sys::statvfs::statvfs(dir.as_path())
            .map_err(|e| StoreError::io("statvfs", dir, std::io::Error::from(e)))?;
        // The field types are `u64` on 64-bit Linux but narrower on some
        // 32-bit targets; the conversions keep this portable.
        #[allow(clippy::useless_conversion)]
        let free = u64::from(st.blocks_available()).saturating_mul(u64::from(st.fragment_size()));
        Ok(free)
    }

    /// The most bytes a put into `owner`'s session may write under the
    /// budget, and the error to report when the budget, not the caller's
    /// `max_bytes`, is what cut it.
    async fn budget_limit(
        &self,
        owner: &str,
        max_bytes: u64,
    ) -> Result<(u64, Option<StoreError>), StoreError> {
        let mut limit = max_bytes;
        let mut cut = None;
        if let Some(quota) = self.inner.budget.owner_quota_bytes {
            let stored = self.inner.meta.owner_bytes(owner).await?;
            let left = quota.saturating_sub(stored);
            self.mark_near_quota(owner, left < limit);
            if left < limit {
                limit = left;
                cut = Some(StoreError::QuotaExceeded { quota });
            }
        }
        let (floor, floor_cut) = self.floor_limit(limit)?;
        Ok((floor, floor_cut.or(cut)))
    }

    /// Remember (`near`) or forget that `owner` has less of the quota left
    /// than a put's limit ([`Inner::near_quota`]).
    fn mark_near_quota(&self, owner: &str, near: bool) {
        let mut set = self
            .inner
            .near_quota
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !near {
            set.remove(owner);
        } else if !set.contains(owner) {
            if set.len() >= NEAR_QUOTA_MAX {
                set.clear();
            }
            set.insert(owner.to_owned());
        }
    }

    fn is_near_quota(&self, owner: &str) -> bool {
        self.inner
            .near_quota
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(owner)
    }

    /// The most bytes a put may write under the disk's floor (the free
    /// space the store's filesystem keeps), at most `max_bytes`, and
    /// `DiskFull` when the floor is what set it.
    fn floor_limit(&self, max_bytes: u64) -> Result<(u64, Option<StoreError>), StoreError> {
        let floor = self.inner.budget.min_free_bytes;
        // the floor guards the disk the blobs are written to
        if floor > 0 && self.inner.blobs.local_root().is_some() {
            let left = self.free_bytes()?.saturating_sub(floor);
            if left < max_bytes {
                return Ok((left, Some(StoreError::DiskFull { floor })));
            }
        }
        Ok((max_bytes, None))
    }

    pub async fn session(&self, id: &Nanoid) -> Result<Option<SessionInfo>, StoreError> {
        self.inner.meta.session(id).await
    }

    /// Store a client's body, at most `max_bytes` long, as a new object.
    ///
    /// `NotFound` if the session does not exist, `Conflict` if the file id
    /// is taken, `TooLarge` past the limit, `BodyRead` if the body fails;
    /// after any error nothing of this put remains.
    pub async fn put_stream<S>(
        &self,
        obj: NewObject,
        body: S,
        max_bytes: u64,
    ) -> Result<ObjectMeta, StoreError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin,
    {
        let Some(owner) = self.inner.meta.session_owner(&obj.session_id).await? else {
            return Err(StoreError::NotFound);
        };
        self.put(obj, &owner, body.map_err(StoreError::BodyRead), max_bytes)
            .await
    }

    /// [`Store::put_stream`] into a session the caller has just created
    /// with [`Store::create_session_owned`] (or `create_session`: its key is
    /// its owner), whose owner it passes instead of the store reading it
    /// back. A session that does not exist is still `NotFound` (the object
    /// row's foreign key refuses it after the bytes were written; they are
    /// removed again).
    pub async fn put_stream_owned<S>(
        &self,
        obj: NewObject,
        owner: &SessionKey,
        body: S,
        max_bytes: u64,
    ) -> Result<ObjectMeta, StoreError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin,
    {
        self.put(
            obj,
            owner.as_str(),
            body.map_err(StoreError::BodyRead),
            max_bytes,
        )
        .await
    }

    /// Create session `obj.session_id`, bound to `key` and counted against
    /// `owner`'s quota, with `body` as its first object: the blob first,
    /// then the session row and the object row in one round-trip to the
    /// database, the quota judged in the statement that writes the object
    /// row (so two uploads of one owner racing cannot both pass on the same
    /// total). What [`Store::create_session_owned`] and a
    /// [`Store::put_stream_owned`] do, in one database round-trip instead of
    /// two.
    ///
    /// Errors as `put_stream`'s; `Conflict` if the session exists. After a
    /// refusal by the quota the session exists without the object (as it
    /// would had it been created first); after any other error of the
    /// bytes (`TooLarge`, `DiskFull`, `BodyRead`) neither exists.
    pub async fn create_session_with<S>(
        &self,
        key: &SessionKey,
        owner: &SessionKey,
        obj: NewObject,
        body: S,
        max_bytes: u64,
    ) -> Result<ObjectMeta, StoreError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin,
    {
        let quota = self.inner.budget.owner_quota_bytes;
        // An owner last seen near the quota has the bytes cut at what is
        // left, as a put does (one read more); any other is judged after.
        let (limit, cut) = if quota.is_some() && self.is_near_quota(owner.as_str()) {
            self.budget_limit(owner.as_str(), max_bytes).await?
        } else {
            self.floor_limit(max_bytes)?
        };
        let sid = obj.session_id.clone();
        let meta = match self
            .write_blob(
                obj,
                owner.as_str(),
                body.map_err(StoreError::BodyRead),
                limit,
                cut,
            )
            .await
        {
            Ok(meta) => meta,
            // cut at what the owner had left
            Err(StoreError::QuotaExceeded { quota }) => {
                return Err(self.refused_by_quota(&sid, key, owner, quota).await);
            }
            // past the caller's limit: what refused it is the quota when
            // the owner had less than that limit left (as a put that read
            // the total first cuts the bytes at what is left)
            Err(StoreError::TooLarge { limit }) => {
                if let Some(quota) = quota {
                    let stored = self.inner.meta.owner_bytes(owner.as_str()).await?;
                    if quota.saturating_sub(stored) < limit {
                        return Err(self.refused_by_quota(&sid, key, owner, quota).await);
                    }
                }
                return Err(StoreError::TooLarge { limit });
            }
            Err(err) => return Err(err),
        };
        let recorded = self
            .inner
            .meta
            .insert_session_object(key, owner, &meta, quota)
            .await;
        self.settle_row(&meta, owner.as_str(), quota, recorded)
            .await?;
        tracing::debug!(session = %meta.session_id, file = %meta.file_id,
            name = %meta.name, size = meta.size, "session created with its object");
        Ok(meta)
    }

    /// What became of the row of a blob just written (`recorded`, from a
    /// statement that judges the quota): written, or the blob removed and
    /// the error to answer, `QuotaExceeded` (the owner then remembered as
    /// near the quota) when the statement refused it by the quota.
    async fn settle_row(
        &self,
        meta: &ObjectMeta,
        owner: &str,
        quota: Option<u64>,
        recorded: Result<bool, StoreError>,
    ) -> Result<(), StoreError> {
        let err = match recorded {
            Ok(true) => return Ok(()),
            // refused by the quota (the owner's puts that committed first
            // left no room for it)
            Ok(false) => {
                self.mark_near_quota(owner, true);
                let quota = quota.unwrap_or_default();
                tracing::info!(session = %meta.session_id, owner = %owner,
                    reason = %StoreError::QuotaExceeded { quota }, "put refused");
                StoreError::QuotaExceeded { quota }
            }
            Err(err) => err,
        };
        self.discard_blob(meta).await;
        Err(err)
    }

    /// An upload's first file refused by the quota before its row was
    /// written: the session is made without it (as when the statement that
    /// records the object refuses it) and the owner remembered as near the
    /// quota. The error to answer: `QuotaExceeded`, or what refused the
    /// session (`Conflict` if it exists).
    async fn refused_by_quota(
        &self,
        sid: &Nanoid,
        key: &SessionKey,
        owner: &SessionKey,
        quota: u64,
    ) -> StoreError {
        self.mark_near_quota(owner.as_str(), true);
        match self.create_session_owned(sid, key, owner).await {
            Ok(()) => StoreError::QuotaExceeded { quota },
            Err(err) => err,
        }
    }

    /// Remove the blob of a put whose row was not written: the blob is
    /// this put's alone (a fresh version); without a row it is garbage.
    async fn discard_blob(&self, meta: &ObjectMeta) {
        let (sid, fid) = (meta.session_id.as_str(), meta.file_id.as_str());
        if let Err(e) = self.inner.blobs.delete(sid, fid, &meta.version).await {
            tracing::warn!(session = sid, file = fid, error = %e,
                "removing the blob of a failed put; gc will remove it");
        }
    }

    /// Blob first, row second: the row is only written for complete bytes.
    async fn put<S>(
        &self,
        obj: NewObject,
        owner: &str,
        body: S,
        max_bytes: u64,
    ) -> Result<ObjectMeta, StoreError>
    where
        S: Stream<Item = Result<Bytes, StoreError>> + Send + Unpin,
    {
        let (limit, cut) = self.budget_limit(owner, max_bytes).await?;
        let meta = self.write_blob(obj, owner, body, limit, cut).await?;
        let quota = self.inner.budget.owner_quota_bytes;
        let recorded = self.inner.meta.insert_object(&meta, owner, quota).await;
        self.settle_row(&meta, owner, quota, recorded).await?;
        tracing::debug!(session = %meta.session_id, file = %meta.file_id, name = %meta.name,
            size = meta.size, "object stored");
        Ok(meta)
    }

    /// Write `body` as a new blob of `obj` (at most `limit` bytes: past it
    /// `cut` when a budget set the limit, else `TooLarge`), durably; the
    /// metadata its row will hold.
    async fn write_blob<S>(
        &self,
        obj: NewObject,
        owner: &str,
        body: S,
        limit: u64,
        cut: Option<StoreError>,
    ) -> Result<ObjectMeta, StoreError>
    where
        S: Stream<Item = Result<Bytes, StoreError>> + Send + Unpin,
    {
        let inner = &self.inner;
        let version = random_version();
        let (sid, fid) = (obj.session_id.as_str(), obj.file_id.as_str());
        let written = match (
            inner.blobs.write(sid, fid, &version, body, limit).await,
            cut,
        ) {
            (Err(StoreError::TooLarge { .. }), Some(cut)) => {
                tracing::info!(session = sid, owner = %owner, reason = %cut, "put refused");
                return Err(cut);
            }
            (written, _) => written?,
        };
        Ok(ObjectMeta {
            session_id: obj.session_id.clone(),
            file_id: obj.file_id.clone(),
            name: obj.name.as_str().to_owned(),
            size: written.size,
            sha256: written.sha256,
            content_type: obj.content_type,
            read_only: obj.read_only,
            created_at_ms: now_ms(),
            version,
        })
    }

    pub async fn object(
        &self,
        session: &Nanoid,
        file: &Nanoid,
    ) -> Result<Option<ObjectMeta>, StoreError> {
        self.inner.meta.object(session, file).await
    }

    /// Session `session`'s key and its object `file`, read together (one
    /// statement where [`Store::session`] and [`Store::object`] are two):
    /// `None` when the session does not exist, `(key, None)` when the object
    /// does not.
    pub async fn session_object(
        &self,
        session: &Nanoid,
        file: &Nanoid,
    ) -> Result<Option<(SessionKey, Option<ObjectMeta>)>, StoreError> {
        self.inner.meta.session_object(session, file).await
    }

    /// Every object of a session, ordered by name.
    pub async fn list(&self, session: &Nanoid) -> Result<Vec<ObjectMeta>, StoreError> {
        self.inner.meta.list(session).await
    }

    /// The object's bytes as a stream (read from disk in chunks, or as the
    /// bucket sends them). `NotFound` when the bytes are gone; a read that
    /// fails part-way ends the stream with an error, never early.
    pub async fn read(
        &self,
        meta: &ObjectMeta,
    ) -> Result<BoxStream<'static, Result<Bytes, StoreError>>, StoreError> {
        self.inner
            .blobs
            .read(
                meta.session_id.as_str(),
                meta.file_id.as_str(),
                &meta.version,
            )
            .await
    }

    /// Materialise the object at `dest`, which must not exist: it is created
    /// with `O_CREAT | O_EXCL | O_NOFOLLOW`, mode 0600, and removed again if
    /// the copy fails. The caller sets ownership and mode afterwards.
    pub async fn copy_to(&self, meta: &ObjectMeta, dest: &Path) -> Result<(), StoreError> {
        self.inner
            .blobs
            .copy_to(
                meta.session_id.as_str(),
                meta.file_id.as_str(),
                &meta.version,
                meta.size,
                dest,
            )
            .await
    }

    /// The object's bytes as a file on this node's disk, when the blobs are
    /// kept here (`None` on S3): a caller on a blocking thread copies them in
    /// one step, where [`Store::read`] streams them through the runtime (a
    /// hop to a blocking thread per read).
    pub fn local_blob(&self, meta: &ObjectMeta) -> Result<Option<LocalBlob>, StoreError> {
        self.inner.blobs.local(
            meta.session_id.as_str(),
            meta.file_id.as_str(),
            &meta.version,
            meta.size,
        )
    }

    /// Delete an object (row first, then blob); `false` if it did not exist.
    /// The session row stays.
    pub async fn delete(&self, session: &Nanoid, file: &Nanoid) -> Result<bool, StoreError> {
        let Some(version) = self.inner.meta.delete_object(session, file).await? else {
            return Ok(false);
        };
        if let Err(e) = self
            .inner
            .blobs
            .delete(session.as_str(), file.as_str(), &version)
            .await
        {
            // The object is gone for every reader; the bytes become an orphan.
            tracing::warn!(session = %session, file = %file, error = %e,
                "removing a deleted object's blob; gc will remove it");
        }
        Ok(true)
    }

    /// Collect garbage as of now.
    pub async fn gc(&self) -> Result<GcReport, StoreError> {
        self.gc_at(now_ms()).await
    }

    /// Collect garbage as of `now_ms` (Unix milliseconds).
    pub async fn gc_at(&self, now_ms: i64) -> Result<GcReport, StoreError> {
        gc::collect(
            &self.inner.meta,
            &self.inner.blobs,
            self.inner.retention,
            now_ms,
        )
        .await
    }
}
