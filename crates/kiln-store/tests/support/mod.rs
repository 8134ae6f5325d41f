//! What the store's tests share: the backends they run on (the embedded
//! pair, and Postgres + S3 on real servers), a fault-injecting object store.

#![allow(dead_code)]

pub mod faults;
#[path = "servers.rs"]
pub mod servers;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt as _;
use kiln_store::{Backends, BlobBackend, MetaBackend, S3Config, StorageBudget, Store, StoreConfig};
use object_store::ObjectStore;

pub const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// The engines a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// SQLite + a blob directory (the default).
    Embedded,
    /// Postgres + an S3 bucket on the test servers.
    PostgresS3,
}

/// One test's store location: a data directory, and for `PostgresS3` its
/// own database and bucket. Opening it again reaches the same data.
pub struct Fixture {
    pub kind: Kind,
    pub dir: tempfile::TempDir,
    pub backends: Backends,
    /// The bucket, seen directly (for `PostgresS3`).
    pub bucket: Option<Arc<dyn ObjectStore>>,
    pub database_url: Option<String>,
}

/// The S3 settings of a bucket on the test server.
pub fn s3_config(endpoint: &str, bucket: &str) -> S3Config {
    S3Config {
        bucket: bucket.to_owned(),
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".to_owned()),
        path_style: true,
        allow_http: true,
        access_key_id: Some("kiln-test".to_owned()),
        secret_access_key: Some("kiln-test-secret".to_owned()),
    }
}

impl Fixture {
    /// `None`: the servers are not installed and this is not CI (skip).
    pub fn new(kind: Kind) -> Option<Fixture> {
        let dir = tempfile::tempdir().unwrap();
        match kind {
            Kind::Embedded => Some(Fixture {
                kind,
                dir,
                backends: Backends::default(),
                bucket: None,
                database_url: None,
            }),
            Kind::PostgresS3 => {
                let pg = servers::postgres()?;
                let s3 = servers::s3()?;
                let url = pg.fresh_database();
                let cfg = s3_config(&s3.endpoint, &s3.fresh_bucket());
                let bucket = direct_client(&cfg);
                Some(Fixture {
                    kind,
                    dir,
                    backends: Backends {
                        meta: MetaBackend::Postgres { url: url.clone() },
                        blobs: BlobBackend::S3(cfg),
                    },
                    bucket: Some(bucket),
                    database_url: Some(url),
                })
            }
        }
    }

    pub async fn open(&self) -> Store {
        self.open_with(StorageBudget::default()).await
    }

    pub async fn open_with(&self, budget: StorageBudget) -> Store {
        Store::open_with(
            StoreConfig {
                dir: self.dir.path().to_path_buf(),
                retention: DAY,
                budget,
            },
            self.backends.clone(),
        )
        .await
        .unwrap()
    }

    /// Names of every blob (and, locally, staging file) the store holds.
    pub async fn blobs(&self) -> Vec<String> {
        match &self.bucket {
            None => files_under(&self.dir.path().join("blobs"))
                .into_iter()
                .map(|p| p.display().to_string())
                .collect(),
            Some(bucket) => bucket
                .list(None)
                .map_ok(|m| m.location.to_string())
                .try_collect()
                .await
                .unwrap(),
        }
    }
}

/// A client of the fixture's bucket of its own.
fn direct_client(cfg: &S3Config) -> Arc<dyn ObjectStore> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let b = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(&cfg.bucket)
        .with_endpoint(cfg.endpoint.clone().unwrap())
        .with_region("us-east-1")
        .with_access_key_id("kiln-test")
        .with_secret_access_key("kiln-test-secret")
        .with_virtual_hosted_style_request(false)
        .with_allow_http(true);
    Arc::new(b.build().unwrap())
}

/// Every non-directory entry under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                todo.push(entry.path());
            } else {
                out.push(entry.path());
            }
        }
    }
    out
}

/// Run each named `async fn name(kind: Kind)` on every backend: as
/// `embedded::name` and `postgres_s3::name`.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::support::Kind::Embedded).await
                }
            )*
        }
        mod postgres_s3 {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::support::Kind::PostgresS3).await
                }
            )*
        }
    };
}
