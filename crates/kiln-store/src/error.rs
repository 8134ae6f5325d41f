//! The store's error type: one variant per way a storage operation fails.

use std::path::PathBuf;

/// Why a storage operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The body is larger than the caller's limit; nothing was stored.
    #[error("object is larger than the {limit}-byte limit")]
    TooLarge { limit: u64 },

    /// Storing it would take the owner past their byte quota; nothing was
    /// stored.
    #[error("the owner's storage quota of {quota} bytes is used up")]
    QuotaExceeded { quota: u64 },

    /// Storing it would take the disk below the free-space floor; nothing
    /// was stored.
    #[error("the disk is at its free-space floor of {floor} bytes")]
    DiskFull { floor: u64 },

    /// The session or object does not exist (or its bytes are gone).
    #[error("not found")]
    NotFound,

    /// A write collided with existing data (duplicate session or object id).
    #[error("conflict: {0}")]
    Conflict(String),

    /// A file to store is not a regular file (FIFO, socket, device,
    /// directory); symlinks fail earlier with an `Io` error (`ELOOP`).
    #[error("{} is not a regular file", path.display())]
    NotRegularFile { path: PathBuf },

    /// The metadata database failed.
    #[error("metadata database: {0}")]
    Database(#[from] sqlx::Error),

    /// The blob store failed.
    #[error("blob store: {0}")]
    Blob(#[from] object_store::Error),

    /// A filesystem operation of our own failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Applying the embedded schema migrations failed.
    #[error("metadata migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),

    /// The storage configuration is unusable (e.g. an unknown database URL).
    #[error("storage configuration: {0}")]
    Config(String),

    /// The client's body stream failed while we were storing it.
    #[error("reading the request body: {0}")]
    BodyRead(#[source] std::io::Error),
}

impl StoreError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
