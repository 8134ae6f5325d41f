//! Which engines hold the store: the metadata database (SQLite in the data
//! directory, or Postgres) and the blob store (a directory next to it, or
//! an S3-compatible bucket). The embedded pair is the default; several
//! nodes share one Postgres database and one bucket.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::{BackoffConfig, ObjectStore, RetryConfig};

use crate::StoreError;

/// How long an S3 request is retried (connection failures, 5xx, throttling)
/// before the operation fails: a few quick tries, so that an unreachable
/// bucket fails an upload in seconds rather than object_store's default of
/// up to three minutes. Each request also has object_store's limits: 5 s to
/// connect, 30 s in all.
const RETRY: RetryConfig = RetryConfig {
    backoff: BackoffConfig {
        init_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(2),
        base: 2.0,
    },
    max_retries: 3,
    retry_timeout: Duration::from_secs(15),
};

/// Where metadata and blobs live.
#[derive(Debug, Clone, Default)]
pub struct Backends {
    pub meta: MetaBackend,
    pub blobs: BlobBackend,
}

/// The metadata database.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum MetaBackend {
    /// `<dir>/kiln.db` (WAL), for one node.
    #[default]
    Sqlite,
    /// A Postgres database (`postgres://user:pass@host:port/db?sslmode=...`),
    /// shared by every node. Migrated on open.
    Postgres { url: String },
}

impl MetaBackend {
    /// The backend a `KILN_DATABASE_URL` names: unset or empty is the
    /// embedded SQLite database; `postgres://` or `postgresql://` is Postgres.
    pub fn from_url(url: Option<&str>) -> Result<MetaBackend, StoreError> {
        match url.map(str::trim) {
            None | Some("") => Ok(MetaBackend::Sqlite),
            Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => {
                Ok(MetaBackend::Postgres { url: u.to_owned() })
            }
            Some(u) => Err(StoreError::Config(format!(
                "database_url must be a postgres:// URL (or unset for the embedded SQLite \
                 database), not {:?}",
                u.split(':').next().unwrap_or_default()
            ))),
        }
    }

    /// `sqlite` or `postgres`.
    pub fn name(&self) -> &'static str {
        match self {
            MetaBackend::Sqlite => "sqlite",
            MetaBackend::Postgres { .. } => "postgres",
        }
    }
}

/// The blob store.
#[derive(Debug, Clone, Default)]
pub enum BlobBackend {
    /// `<dir>/blobs/`, for one node.
    #[default]
    Local,
    /// An S3-compatible bucket.
    S3(S3Config),
    /// Any object store: a test's fault-injecting double, or a backend the
    /// embedding program builds itself. Treated like S3 (nothing on local
    /// disk; orphans are found by listing).
    Custom(Arc<dyn ObjectStore>),
}

impl BlobBackend {
    /// `local`, `s3` or `custom`.
    pub fn name(&self) -> &'static str {
        match self {
            BlobBackend::Local => "local",
            BlobBackend::S3(_) => "s3",
            BlobBackend::Custom(_) => "custom",
        }
    }
}

/// An S3-compatible bucket. Credentials come from the environment
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, or the
/// instance's / container's role) unless set here, as do settings left
/// `None` here (`AWS_REGION`, `AWS_ENDPOINT`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Config {
    pub bucket: String,
    /// e.g. `http://127.0.0.1:9000` for MinIO/SeaweedFS/moto; `None`: AWS.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Address the bucket in the path (`endpoint/bucket/key`), as most
    /// self-hosted servers need, rather than as a virtual host.
    pub path_style: bool,
    /// Allow plain `http://` endpoints (a server on a private network).
    pub allow_http: bool,
    /// Static credentials; `None`: the environment's.
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("path_style", &self.path_style)
            .field("allow_http", &self.allow_http)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl S3Config {
    /// Build the client. Nothing is sent yet; a wrong bucket or credentials
    /// show on first use.
    pub(crate) fn build(&self) -> Result<Arc<dyn ObjectStore>, StoreError> {
        // reqwest's rustls has no provider of its own in this workspace
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = AmazonS3Builder::from_env()
            .with_retry(RETRY)
            .with_bucket_name(&self.bucket)
            .with_virtual_hosted_style_request(!self.path_style)
            .with_allow_http(self.allow_http);
        if let Some(endpoint) = &self.endpoint {
            b = b.with_endpoint(endpoint);
        }
        if let Some(region) = &self.region {
            b = b.with_region(region);
        }
        if let Some(id) = &self.access_key_id {
            b = b.with_access_key_id(id);
        }
        if let Some(secret) = &self.secret_access_key {
            b = b.with_secret_access_key(secret);
        }
        Ok(Arc::new(b.build()?))
    }
}
