//! Object and session metadata in SQLite (embedded) or Postgres (several
//! nodes), through sqlx: connection settings, the migrations of each
//! backend, and every query the store runs.
//!
//! Both backends run the same SQL text (`$N` placeholders, which sqlx's
//! SQLite driver binds by number too) except where they differ in kind:
//! the expired-object batch (SQLite's `rowid`; Postgres skips rows another
//! node's collection holds, `FOR UPDATE SKIP LOCKED`). [`with_pool!`] runs
//! one statement on whichever pool is open.
//!
//! All statements are single auto-commit statements, so concurrent writers
//! only ever wait on SQLite's write lock (bounded by `busy_timeout`) and never
//! hit the deferred-transaction upgrade that `busy_timeout` cannot resolve.

use std::collections::HashSet;
use std::path::Path;
use std::str::FromStr as _;
use std::time::Duration;

use kiln_core::{Nanoid, SessionKey};
use sqlx::error::ErrorKind;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use crate::{ObjectMeta, SessionInfo, StoreError};

/// Connections in the SQLite pool: one. SQLite serializes writes whatever
/// the pool size, and a connection's page cache is thrown away whenever
/// another connection has written since its last statement: with eight, taken
/// in turn, nearly every statement read its pages again from the WAL (32
/// reads of 4 KiB per scenario-D pair, measured), while one connection that
/// alone writes keeps its cache. The store holds a connection for one
/// statement at a time (no transaction, no streamed rows), so statements
/// only queue behind one another for the few dozen µs each takes.
const MAX_CONNECTIONS: u32 = 1;

/// Connections each node keeps to Postgres at most.
const PG_MAX_CONNECTIONS: u32 = 16;

/// How long a writer waits for SQLite's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a Postgres connection may take to open (or to be had from the
/// pool) before the operation fails instead of hanging.
const PG_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The open database: one pool of either backend.
#[derive(Debug, Clone)]
pub(crate) enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Run `$body` with `$p` bound to the open pool, whichever backend it is
/// (the body is compiled once per backend).
macro_rules! with_pool {
    ($pool:expr, |$p:ident| $body:expr) => {
        match $pool {
            $crate::meta::Pool::Sqlite($p) => $body,
            $crate::meta::Pool::Postgres($p) => $body,
        }
    };
}

/// What an object row's statement binds besides the object's own fields:
/// its size and the owner's quota as the databases' integers.
struct ObjectRowParams {
    size: i64,
    quota: Option<i64>,
}

impl ObjectRowParams {
    fn new(meta: &ObjectMeta, quota: Option<u64>) -> Result<Self, StoreError> {
        let size = i64::try_from(meta.size).map_err(|_| StoreError::TooLarge {
            limit: i64::MAX as u64,
        })?;
        let quota = quota.map(|q| i64::try_from(q).unwrap_or(i64::MAX));
        Ok(Self { size, quota })
    }
}

/// Binds `$1`–`$11` of a statement that writes an object row judged by the
/// owner's quota (`Meta::insert_object`, `Meta::insert_session_object`):
/// session, file, name, size, sha256, content type, read-only, created,
/// version, quota, owner.
macro_rules! bind_object_row {
    ($query:expr, $meta:expr, $row:expr, $owner:expr) => {
        $query
            .bind($meta.session_id.as_str())
            .bind($meta.file_id.as_str())
            .bind(&$meta.name)
            .bind($row.size)
            .bind(&$meta.sha256)
            .bind(&$meta.content_type)
            .bind($meta.read_only)
            .bind($meta.created_at_ms)
            .bind(&$meta.version)
            .bind($row.quota)
            .bind($owner)
    };
}
pub(crate) use with_pool;

/// The metadata database.
#[derive(Debug, Clone)]
pub(crate) struct Meta {
    pool: Pool,
}
/// One `objects` row as stored.
#[derive(sqlx::FromRow)]
struct ObjectRow {
    session_id: String,
    file_id: String,
    name: String,
    size: i64,
    sha256: String,
    content_type: String,
    read_only: bool,
    created_at: i64,
    version: String,
}

/// A session's key and, when it holds the object asked for, the object's
/// row (a `LEFT JOIN`: every object column is `NULL` when it does not).
#[derive(sqlx::FromRow)]
struct SessionObjectRow {
    session_key: String,
    session_id: Option<String>,
    file_id: Option<String>,
    name: Option<String>,
    size: Option<i64>,
    sha256: Option<String>,
    content_type: Option<String>,
    read_only: Option<bool>,
    created_at: Option<i64>,
    version: Option<String>,
}

/// One `sessions` row as stored.
#[derive(sqlx::FromRow)]
struct SessionRow {
    id: String,
    session_key: String,
    created_at: i64,
}

/// An object row removed by garbage collection: what is needed to find its blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RemovedObject {
    pub session_id: String,
    pub file_id: String,
    pub version: String,
}

fn corrupt(what: String) -> StoreError {
    StoreError::Database(sqlx::Error::Decode(what.into()))
}

fn parse_id(column: &str, value: String) -> Result<Nanoid, StoreError> {
    Nanoid::try_from(value).map_err(|_| corrupt(format!("column {column} holds a non-nanoid")))
}

impl TryFrom<ObjectRow> for ObjectMeta {
    type Error = StoreError;

    fn try_from(row: ObjectRow) -> Result<Self, Self::Error> {
        Ok(ObjectMeta {
            session_id: parse_id("objects.session_id", row.session_id)?,
            file_id: parse_id("objects.file_id", row.file_id)?,
            name: row.name,
            size: u64::try_from(row.size)
                .map_err(|_| corrupt(format!("objects.size is negative: {}", row.size)))?,
            sha256: row.sha256,
            content_type: row.content_type,
            read_only: row.read_only,
            created_at_ms: row.created_at,
            version: row.version,
        })
    }
}

impl TryFrom<SessionRow> for SessionInfo {
    type Error = StoreError;

    fn try_from(row: SessionRow) -> Result<Self, Self::Error> {
        Ok(SessionInfo {
            id: parse_id("sessions.id", row.id)?,
            key: SessionKey::from_stored(row.session_key),
            created_at_ms: row.created_at,
        })
    }
}

/// An owner's total as the `owner_bytes` row holds it (none: nothing stored).
fn stored_bytes(row: Option<i64>) -> u64 {
    row.map_or(0, |bytes| u64::try_from(bytes).unwrap_or(0))
}

fn is_kind(err: &sqlx::Error, kind: ErrorKind) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.kind() == kind)
}

impl Meta {
    /// Open (creating if missing) the SQLite database at `path` and apply
    /// its migrations.
    pub(crate) async fn open_sqlite(path: &Path) -> Result<Meta, StoreError> {
        let options = SqliteConnectOptions::from_str("sqlite:")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        // No ping when a statement takes a connection: a file in this
        // process has nothing to find that the statement would not (a
        // crashed worker answers it with an error, and the ping sqlx does
        // when the connection goes back drops such a one); the ping was a
        // round trip to the connection's worker thread per statement.
        let pool = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .test_before_acquire(false)
            .connect_with(options)
            .await?;
        sqlx::migrate!("migrations/sqlite").run(&pool).await?;
        tracing::debug!(db = %path.display(), "metadata database open (SQLite)");
        Ok(Meta {
            pool: Pool::Sqlite(pool),
        })
    }

    /// Connect to the Postgres database at `url` and apply its migrations
    /// (sqlx holds an advisory lock while migrating, so nodes starting at
    /// once migrate one after the other).
    pub(crate) async fn open_postgres(url: &str) -> Result<Meta, StoreError> {
        let options = PgConnectOptions::from_str(url)?.application_name("kiln");
        let pool = PgPoolOptions::new()
            .max_connections(PG_MAX_CONNECTIONS)
            .acquire_timeout(PG_ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await?;
        sqlx::migrate!("migrations/postgres").run(&pool).await?;
        tracing::debug!("metadata database open (Postgres)");
        Ok(Meta {
            pool: Pool::Postgres(pool),
        })
    }

    /// The pool, for the store's other tables (`ledger.rs`, `usage.rs`).
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Close every connection (checkpointing SQLite's WAL on the last one).
    pub(crate) async fn close(&self) {
        with_pool!(&self.pool, |p| p.close().await)
    }

    /// Record a new session bound to `key`, its bytes counted against
    /// `owner`'s. `Conflict` if `id` exists.
    pub(crate) async fn insert_session(
        &self,
        id: &Nanoid,
        key: &SessionKey,
        owner: &SessionKey,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        // executed to its end, so a failure to commit is this call's error
        let res = with_pool!(&self.pool, |p| {
            sqlx::query(
                "INSERT INTO sessions (id, session_key, owner, created_at) VALUES ($1, $2, $3, $4)",
            )
            .bind(id.as_str())
            .bind(key.as_str())
            .bind(owner.as_str())
            .bind(now_ms)
            .execute(p)
            .await
            .map(|_| ())
        });
        match res {
            Ok(()) => Ok(()),
            Err(e) if is_kind(&e, ErrorKind::UniqueViolation) => {
                Err(StoreError::Conflict(format!("session {id} already exists")))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Record a new session (bound to `key`, counted against `owner`) and
    /// its first object in one round-trip to the database: on SQLite two
    /// statements sent as one, on Postgres one statement (the session row a
    /// data-modifying `WITH`). The session row is always written (as when
    /// it is created before its first put); the object row only when
    /// `quota` is `None` or the owner's total with it stays within `quota`,
    /// judged in the statement that writes it: on SQLite under the write
    /// lock, on Postgres with the owner's total row locked, so two puts
    /// racing cannot both pass on the same total. Returns whether the
    /// object was recorded. `Conflict` if the session or object exists.
    pub(crate) async fn insert_session_object(
        &self,
        key: &SessionKey,
        owner: &SessionKey,
        meta: &ObjectMeta,
        quota: Option<u64>,
    ) -> Result<bool, StoreError> {
        let row = ObjectRowParams::new(meta, quota)?;
        let sql = match &self.pool {
            // read to the last row (`fetch_all`): the statements run to
            // their end, so a failure to commit is this call's error
            // (SQLite commits an auto-commit statement stopped after its
            // first row only when it is reset, and sqlx ignores what that
            // reset returns)
            Pool::Sqlite(_) => {
                "INSERT INTO sessions (id, session_key, owner, created_at) \
                 VALUES ($1, $12, $11, $8); \
                 INSERT INTO objects (session_id, file_id, name, size, sha256, content_type, \
                 read_only, created_at, version) \
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9 \
                 WHERE $10 IS NULL \
                 OR COALESCE((SELECT bytes FROM owner_bytes WHERE owner = $11), 0) + $4 <= $10 \
                 RETURNING 1"
            }
            // `FOR UPDATE` waits for a put of the same owner that holds the
            // row and then reads the total it committed
            Pool::Postgres(_) => {
                "WITH s AS (INSERT INTO sessions (id, session_key, owner, created_at) \
                 VALUES ($1, $12, $11, $8) RETURNING id), \
                 total AS (SELECT bytes FROM owner_bytes WHERE owner = $11 FOR UPDATE) \
                 INSERT INTO objects (session_id, file_id, name, size, sha256, content_type, \
                 read_only, created_at, version) \
                 SELECT s.id, $2, $3, $4, $5, $6, $7, $8, $9 FROM s \
                 WHERE $10::BIGINT IS NULL \
                 OR COALESCE((SELECT bytes FROM total), 0) + $4 <= $10::BIGINT \
                 RETURNING 1"
            }
        };
        let res: Result<Vec<(i32,)>, sqlx::Error> = with_pool!(&self.pool, |p| {
            bind_object_row!(sqlx::query_as(sql), meta, row, owner.as_str())
                .bind(key.as_str())
                .fetch_all(p)
                .await
        });
        match res {
            Ok(rows) => Ok(!rows.is_empty()),
            Err(e) if is_kind(&e, ErrorKind::UniqueViolation) => Err(StoreError::Conflict(
                format!("session {} or its object already exists", meta.session_id),
            )),
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) async fn session(&self, id: &Nanoid) -> Result<Option<SessionInfo>, StoreError> {
        let row: Option<SessionRow> = with_pool!(&self.pool, |p| sqlx::query_as(
            "SELECT id, session_key, created_at FROM sessions WHERE id = $1"
        )
        .bind(id.as_str())
        .fetch_optional(p)
        .await?);
        row.map(SessionInfo::try_from).transpose()
    }

    /// The owner of session `id` (`None`: no such session).
    pub(crate) async fn session_owner(&self, id: &Nanoid) -> Result<Option<String>, StoreError> {
        let row: Option<(Option<String>, String)> = with_pool!(&self.pool, |p| sqlx::query_as(
            "SELECT owner, session_key FROM sessions WHERE id = $1"
        )
        .bind(id.as_str())
        .fetch_optional(p)
        .await?);
        Ok(row.map(|(owner, key)| owner.unwrap_or(key)))
    }

    /// Bytes stored in every session `owner` created: one row of the totals
    /// the `objects` triggers keep (migrations `0005_owner_bytes` of SQLite,
    /// `0003_owner_bytes` of Postgres), not a sum over the owner's objects.
    pub(crate) async fn owner_bytes(&self, owner: &str) -> Result<u64, StoreError> {
        let row: Option<(i64,)> = with_pool!(&self.pool, |p| sqlx::query_as(
            "SELECT bytes FROM owner_bytes WHERE owner = $1"
        )
        .bind(owner)
        .fetch_optional(p)
        .await?);
        Ok(stored_bytes(row.map(|(bytes,)| bytes)))
    }

    /// Record a completely written object, counted against `owner` (its
    /// session's), when `quota` is `None` or the owner's total with it stays
    /// within `quota`, judged in the statement that writes it (on SQLite
    /// under the write lock, on Postgres with the owner's total row locked,
    /// as [`Meta::insert_session_object`]), so that puts of one owner racing
    /// cannot both pass on the same total. Returns whether it was recorded.
    /// `NotFound` when its session does not exist, `Conflict` when the id is
    /// taken.
    pub(crate) async fn insert_object(
        &self,
        meta: &ObjectMeta,
        owner: &str,
        quota: Option<u64>,
    ) -> Result<bool, StoreError> {
        let row = ObjectRowParams::new(meta, quota)?;
        let sql = match &self.pool {
            // read to the last row: see `insert_session_object`
            Pool::Sqlite(_) => {
                "INSERT INTO objects (session_id, file_id, name, size, sha256, content_type, \
                 read_only, created_at, version) \
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9 \
                 WHERE $10 IS NULL \
                 OR COALESCE((SELECT bytes FROM owner_bytes WHERE owner = $11), 0) + $4 <= $10 \
                 RETURNING 1"
            }
            Pool::Postgres(_) => {
                "WITH total AS (SELECT bytes FROM owner_bytes WHERE owner = $11 FOR UPDATE) \
                 INSERT INTO objects (session_id, file_id, name, size, sha256, content_type, \
                 read_only, created_at, version) \
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9 \
                 WHERE $10::BIGINT IS NULL \
                 OR COALESCE((SELECT bytes FROM total), 0) + $4 <= $10::BIGINT \
                 RETURNING 1"
            }
        };
        let res: Result<Vec<(i32,)>, sqlx::Error> = with_pool!(&self.pool, |p| {
            bind_object_row!(sqlx::query_as(sql), meta, row, owner)
                .fetch_all(p)
                .await
        });
        match res {
            Ok(rows) => Ok(!rows.is_empty()),
            Err(e) if is_kind(&e, ErrorKind::ForeignKeyViolation) => Err(StoreError::NotFound),
            Err(e) if is_kind(&e, ErrorKind::UniqueViolation) => Err(StoreError::Conflict(
                format!("object {}/{} already exists", meta.session_id, meta.file_id),
            )),
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) async fn object(
        &self,
        session: &Nanoid,
        file: &Nanoid,
    ) -> Result<Option<ObjectMeta>, StoreError> {
        let row: Option<ObjectRow> = with_pool!(&self.pool, |p| sqlx::query_as(
            "SELECT session_id, file_id, name, size, sha256, content_type, read_only, \
             created_at, version FROM objects WHERE session_id = $1 AND file_id = $2",
        )
        .bind(session.as_str())
        .bind(file.as_str())
        .fetch_optional(p)
        .await?);
        row.map(ObjectMeta::try_from).transpose()
    }

    /// Session `session`'s key and its object `file` in one statement:
    /// `None` when the session does not exist, `(key, None)` when the object
    /// does not.
    pub(crate) async fn session_object(
        &self,
        session: &Nanoid,
        file: &Nanoid,
    ) -> Result<Option<(SessionKey, Option<ObjectMeta>)>, StoreError> {
        let row: Option<SessionObjectRow> = with_pool!(&self.pool, |p| sqlx::query_as(
            "SELECT s.session_key, o.session_id, o.file_id, o.name, o.size, o.sha256, \
             o.content_type, o.read_only, o.created_at, o.version FROM sessions s \
             LEFT JOIN objects o ON o.session_id = s.id AND o.file_id = $2 WHERE s.id = $1",
        )
        .bind(session.as_str())
        .bind(file.as_str())
        .fetch_optional(p)
        .await?);
        let Some(row) = row else {
            return Ok(None);
        };
        let key = SessionKey::from_stored(row.session_key);
        let object = match (
            row.session_id,
            row.file_id,
            row.name,
            row.size,
            row.sha256,
            row.content_type,
            row.read_only,
            row.created_at,
            row.version,
        ) {
            (
                Some(session_id),
                Some(file_id),
                Some(name),
                Some(size),
                Some(sha256),
                Some(content_type),
                Some(read_only),
                Some(created_at),
                Some(version),
            ) => Some(ObjectMeta::try_from(ObjectRow {
                session_id,
                file_id,
                name,
                size,
                sha256,
                content_type,
                read_only,
                created_at,
                version,
            })?),
            _ => None,
        };
        Ok(Some((key, object)))
    }

    /// Every object of a session, ordered by name (then id, for ties).
    pub(crate) async fn list(&self, session: &Nanoid) -> Result<Vec<ObjectMeta>, StoreError> {
        let rows: Vec<ObjectRow> = with_pool!(&self.pool, |p| sqlx::query_as(
            "SELECT session_id, file_id, name, size, sha256, content_type, read_only, \
             created_at, version FROM objects WHERE session_id = $1 ORDER BY name, file_id",
        )
        .bind(session.as_str())
        .fetch_all(p)
        .await?);
        rows.into_iter().map(ObjectMeta::try_from).collect()
    }

    /// Remove one object row; returns the removed row's blob version.
    pub(crate) async fn delete_object(
        &self,
        session: &Nanoid,
        file: &Nanoid,
    ) -> Result<Option<String>, StoreError> {
        let version: Option<(String,)> = with_pool!(&self.pool, |p| sqlx::query_as(
            "DELETE FROM objects WHERE session_id = $1 AND file_id = $2 RETURNING version",
        )
        .bind(session.as_str())
        .bind(file.as_str())
        .fetch_optional(p)
        .await?);
        Ok(version.map(|(v,)| v))
    }

    /// Remove up to `limit` object rows created before `cutoff_ms`. Each row
    /// is returned to the one caller that removed it, so of several nodes
    /// collecting at once each deletes the blobs of its own rows; on
    /// Postgres they skip the rows another node is removing instead of
    /// waiting for it.
    pub(crate) async fn delete_objects_before(
        &self,
        cutoff_ms: i64,
        limit: i64,
    ) -> Result<Vec<RemovedObject>, StoreError> {
        let rows: Vec<(String, String, String)> = match &self.pool {
            Pool::Sqlite(p) => {
                sqlx::query_as(
                    "DELETE FROM objects WHERE rowid IN \
                     (SELECT rowid FROM objects WHERE created_at < $1 LIMIT $2) \
                     RETURNING session_id, file_id, version",
                )
                .bind(cutoff_ms)
                .bind(limit)
                .fetch_all(p)
                .await?
            }
            Pool::Postgres(p) => {
                sqlx::query_as(
                    "DELETE FROM objects WHERE (session_id, file_id) IN \
                     (SELECT session_id, file_id FROM objects WHERE created_at < $1 \
                      LIMIT $2 FOR UPDATE SKIP LOCKED) \
                     RETURNING session_id, file_id, version",
                )
                .bind(cutoff_ms)
                .bind(limit)
                .fetch_all(p)
                .await?
            }
        };
        Ok(rows
            .into_iter()
            .map(|(session_id, file_id, version)| RemovedObject {
                session_id,
                file_id,
                version,
            })
            .collect())
    }

    /// Remove sessions created before `cutoff_ms` that hold no objects any
    /// more; returns how many were removed. On Postgres a put into one of
    /// them can commit between the check and the delete (the foreign key
    /// then refuses the delete): nothing is removed this time and the next
    /// collection tries again.
    pub(crate) async fn delete_empty_sessions_before(
        &self,
        cutoff_ms: i64,
    ) -> Result<u64, StoreError> {
        let res = with_pool!(&self.pool, |p| sqlx::query(
            "DELETE FROM sessions WHERE created_at < $1 AND NOT EXISTS \
             (SELECT 1 FROM objects WHERE objects.session_id = sessions.id)",
        )
        .bind(cutoff_ms)
        .execute(p)
        .await
        .map(|r| r.rows_affected()));
        match res {
            Ok(n) => Ok(n),
            Err(e) if is_kind(&e, ErrorKind::ForeignKeyViolation) => {
                tracing::debug!("an expired session got an object while being collected");
                Ok(0)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// `(file_id, version)` of every object recorded in a session, by the
    /// session's raw name in the blob store.
    pub(crate) async fn blob_versions(
        &self,
        session_id: &str,
    ) -> Result<HashSet<(String, String)>, StoreError> {
        let rows: Vec<(String, String)> = with_pool!(&self.pool, |p| sqlx::query_as(
            "SELECT file_id, version FROM objects WHERE session_id = $1"
        )
        .bind(session_id)
        .fetch_all(p)
        .await?);
        Ok(rows.into_iter().collect())
    }
}
