//! Storage and the cluster: the store's engines (`database_url`, `s3_*`),
//! its byte budget, the workspace quota, the Python template of the warm
//! pool, and several nodes sharing one database (`advertise_url`,
//! `node_*`, `rate_limit_backend`).

use std::time::Duration;

use anyhow::{Context, bail};

use super::Config;

/// The host name and a random suffix.
fn default_node_id() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kiln".to_owned());
    format!("{host}-{}", &kiln_core::Nanoid::random().as_str()[..8])
}

impl Config {
    /// The store's engines: metadata (SQLite or Postgres) and blobs (the
    /// data dir or S3).
    pub fn store_backends(&self) -> anyhow::Result<kiln_store::Backends> {
        let meta = kiln_store::MetaBackend::from_url(self.database_url.as_deref())?;
        let set = |v: &Option<String>| {
            v.as_ref()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        };
        let blobs = match set(&self.s3_bucket) {
            None => {
                if self.s3_endpoint.is_some() || self.s3_region.is_some() {
                    bail!("s3_endpoint and s3_region need s3_bucket");
                }
                kiln_store::BlobBackend::Local
            }
            Some(bucket) => {
                let endpoint = set(&self.s3_endpoint);
                let allow_http = self.s3_allow_http.unwrap_or_else(|| {
                    endpoint
                        .as_deref()
                        .is_some_and(|e| e.starts_with("http://"))
                });
                if set(&self.s3_access_key_id).is_some()
                    != set(&self.s3_secret_access_key).is_some()
                {
                    bail!("s3_access_key_id and s3_secret_access_key go together");
                }
                kiln_store::BlobBackend::S3(kiln_store::S3Config {
                    bucket,
                    endpoint,
                    region: set(&self.s3_region),
                    path_style: self.s3_path_style,
                    allow_http,
                    access_key_id: set(&self.s3_access_key_id),
                    secret_access_key: set(&self.s3_secret_access_key),
                })
            }
        };
        Ok(kiln_store::Backends { meta, blobs })
    }

    /// Limits on the bytes the store keeps.
    pub fn storage_budget(&self) -> kiln_store::StorageBudget {
        kiln_store::StorageBudget {
            owner_quota_bytes: (self.user_storage_mb > 0)
                .then(|| self.user_storage_mb.saturating_mul(1024 * 1024)),
            min_free_bytes: self.min_free_disk_mb.saturating_mul(1024 * 1024),
        }
    }

    /// The workspace quota mode.
    pub fn quota_mode(&self) -> anyhow::Result<kiln_sandbox::QuotaMode> {
        use kiln_sandbox::QuotaMode;
        Ok(match self.workspace_quota.as_str() {
            "auto" => QuotaMode::Auto,
            "loop" => QuotaMode::Loop,
            "tmpfs" => QuotaMode::Tmpfs,
            "off" => QuotaMode::Off,
            other => bail!("workspace_quota must be auto, loop, tmpfs or off, not {other:?}"),
        })
    }

    /// The one Python template to start (`None`: all, chosen per run).
    pub fn python_template_only(
        &self,
    ) -> anyhow::Result<Option<kiln_core::lang::pyimports::PyTemplate>> {
        use kiln_core::lang::pyimports::PyTemplate;
        match self.python_template.as_str() {
            "auto" => Ok(None),
            "min" => Ok(Some(PyTemplate::Min)),
            "lean" => Ok(Some(PyTemplate::Lean)),
            "data" => Ok(Some(PyTemplate::Data)),
            "rich" => Ok(Some(PyTemplate::Rich)),
            other => bail!("python_template must be auto, min, lean, data or rich, not {other:?}"),
        }
    }

    /// Whether the Postgres database is configured.
    fn on_postgres(&self) -> bool {
        matches!(
            kiln_store::MetaBackend::from_url(self.database_url.as_deref()),
            Ok(kiln_store::MetaBackend::Postgres { .. })
        )
    }

    /// This node among several (`advertise_url` set): `(node id, advertise
    /// URL, secret, dead after)`; `None` for a single node.
    pub fn nodes(&self) -> anyhow::Result<Option<(String, String, String, Duration)>> {
        let Some(url) = self
            .advertise_url
            .as_deref()
            .filter(|u| !u.trim().is_empty())
        else {
            return Ok(None);
        };
        let url = url.trim().trim_end_matches('/');
        let parsed = reqwest::Url::parse(url)
            .with_context(|| format!("advertise_url {url:?} is not a URL"))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
            bail!("advertise_url must be http://host:port (where the other nodes reach this one)");
        }
        if !self.on_postgres() {
            bail!("advertise_url (several nodes) needs a shared Postgres database_url");
        }
        let secret = self.node_secret.as_deref().unwrap_or_default();
        if secret.len() < 16 || !secret.bytes().all(|b| b.is_ascii_graphic()) {
            bail!(
                "node_secret must be set with advertise_url: at least 16 printable characters,                  the same on every node"
            );
        }
        if self.node_dead_after_secs < 3 {
            bail!("node_dead_after_secs must be at least 3 (heartbeats are a fifth of it apart)");
        }
        let id = match self.node_id.as_deref().map(str::trim) {
            Some(id) if !id.is_empty() => {
                if id.len() > 100 || !id.bytes().all(|b| b.is_ascii_graphic()) {
                    bail!("node_id must be at most 100 printable characters");
                }
                id.to_owned()
            }
            _ => default_node_id(),
        };
        Ok(Some((
            id,
            url.to_owned(),
            secret.to_owned(),
            Duration::from_secs(self.node_dead_after_secs),
        )))
    }

    /// Whether rate limits are counted in the shared database.
    pub fn shared_rate_limits(&self) -> anyhow::Result<bool> {
        match self.rate_limit_backend.trim() {
            "local" | "" => Ok(false),
            "postgres" if self.on_postgres() => Ok(true),
            "postgres" => bail!("rate_limit_backend = postgres needs a Postgres database_url"),
            other => bail!("rate_limit_backend must be local or postgres, not {other:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_nodes_need_postgres_a_secret_and_a_reachable_url() {
        let base = || Config {
            database_url: Some("postgres://kiln@db:5432/kiln".into()),
            advertise_url: Some("http://10.0.0.7:8000/".into()),
            node_secret: Some("0123456789abcdef0123".into()),
            ..Config::default()
        };
        // one node by default: nothing to advertise, rate limits in memory
        assert_eq!(Config::default().nodes().unwrap(), None);
        assert!(!Config::default().shared_rate_limits().unwrap());
        let (id, url, _, dead) = base().nodes().unwrap().unwrap();
        assert_eq!(url, "http://10.0.0.7:8000");
        assert_eq!(dead, Duration::from_secs(15));
        assert!(id.len() > 9, "host name and a random suffix: {id}");
        let named = Config {
            node_id: Some("kiln-a".into()),
            ..base()
        };
        assert_eq!(named.nodes().unwrap().unwrap().0, "kiln-a");
        let refused = |c: Config, what: &str| {
            let e = c.validate().unwrap_err();
            assert!(format!("{e:#}").contains(what), "{e:#}");
        };
        refused(
            Config {
                database_url: None,
                ..base()
            },
            "Postgres",
        );
        refused(
            Config {
                node_secret: Some("short".into()),
                ..base()
            },
            "node_secret",
        );
        refused(
            Config {
                advertise_url: Some("10.0.0.7:8000".into()),
                ..base()
            },
            "advertise_url",
        );
        refused(
            Config {
                rate_limit_backend: "postgres".into(),
                database_url: None,
                advertise_url: None,
                ..base()
            },
            "rate_limit_backend",
        );
        refused(
            Config {
                rate_limit_backend: "redis".into(),
                ..base()
            },
            "local or postgres",
        );
        let shared = Config {
            rate_limit_backend: "postgres".into(),
            ..base()
        };
        assert!(shared.validate().is_ok());
        assert!(shared.shared_rate_limits().unwrap());
    }

    #[test]
    #[allow(clippy::result_large_err)]
    fn storage_backends_come_from_kiln_database_url_and_the_s3_keys() {
        figment::Jail::expect_with(|jail| {
            // the default: the embedded pair
            let c = Config::load(None).map_err(|e| e.to_string())?;
            let b = c.store_backends().map_err(|e| e.to_string())?;
            assert_eq!(b.meta, kiln_store::MetaBackend::Sqlite);
            assert!(matches!(b.blobs, kiln_store::BlobBackend::Local));
            jail.set_env("KILN_DATABASE_URL", "postgres://kiln:pw@db:5432/kiln");
            jail.set_env("KILN_S3_BUCKET", "files");
            jail.set_env("KILN_S3_ENDPOINT", "http://minio:9000");
            jail.set_env("KILN_S3_PATH_STYLE", "true");
            let c = Config::load(None).map_err(|e| e.to_string())?;
            let b = c.store_backends().map_err(|e| e.to_string())?;
            assert_eq!(
                b.meta,
                kiln_store::MetaBackend::Postgres {
                    url: "postgres://kiln:pw@db:5432/kiln".into()
                }
            );
            let kiln_store::BlobBackend::S3(s3) = b.blobs else {
                panic!("not S3");
            };
            assert_eq!(s3.bucket, "files");
            assert!(s3.path_style);
            assert!(s3.allow_http, "an http:// endpoint allows plain HTTP");
            // what cannot work is refused at start
            jail.set_env("KILN_DATABASE_URL", "mysql://db/kiln");
            let e = Config::load(None).unwrap_err();
            assert!(format!("{e:#}").contains("postgres://"), "{e:#}");
            jail.set_env("KILN_DATABASE_URL", "");
            jail.set_env("KILN_S3_ACCESS_KEY_ID", "only-half");
            assert!(Config::load(None).is_err());
            Ok(())
        });
    }
}
