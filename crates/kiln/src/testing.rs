//! Test support: start a real Kiln server on `127.0.0.1:0` with a fresh
//! data directory, as integration tests (and the LibreChat end-to-end test)
//! need. Not used by the binary.

use std::path::Path;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// A running server; stopped (gracefully) when dropped.
pub struct TestServer {
    /// `http://127.0.0.1:PORT` (no trailing slash, no `/v1`).
    pub base_url: String,
    /// The data directory (removed on drop).
    pub data_dir: tempfile::TempDir,
    pub shutdown: CancellationToken,
    /// Host uids this server's jails run as.
    pub uid_range: std::ops::Range<u32>,
    /// The warm pool, when the configuration turns it on.
    pub warm: Option<kiln_sandbox::WarmPool>,
    /// The server's store (tests break it to see a real internal fault).
    pub store: kiln_store::Store,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
}

impl TestServer {
    /// Start a server whose jail helper is `helper` (integration tests pass
    /// `env!("CARGO_BIN_EXE_kiln")`), after `tweak` adjusted the config.
    pub async fn start(
        helper: &Path,
        tweak: impl FnOnce(&mut Config),
    ) -> anyhow::Result<TestServer> {
        let data_dir = tempfile::Builder::new().prefix("kiln-test-").tempdir()?;
        let mut cfg = Config {
            listen: "127.0.0.1:0".into(),
            data_dir: data_dir.path().to_owned(),
            jail_helper: Some(helper.to_owned()),
            shutdown_grace_secs: 5,
            // every suite runs on the default runtime image, as a server does;
            // KILN_RUNTIME_IMAGE names another (`host`: the host's /usr; docs/runtimes.md)
            runtime_image: std::env::var("KILN_RUNTIME_IMAGE")
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| Config::default().runtime_image),
            runtime_dir: std::env::var_os("KILN_RUNTIME_DIR")
                .filter(|v| !v.is_empty())
                .map_or_else(|| Config::default().runtime_dir, Into::into),
            // a few kernel slots, not the machine-sized default: test
            // servers share the uid space (32 slots' worth each); a test
            // wanting the defaults sets them and a uid range of its own
            max_sessions: 3,
            max_sessions_per_user: 2,
            // one warm jail per profile (py-min, py-lean, py-data, py, js,
            // exec), not the default's room to grow: with max_concurrency 8
            // and the 3 kernel slots, 17 slots in all
            warm_jails: 6,
            // no kernels started ahead (each holds a slot of its own): a
            // test of them turns them on with a uid range of its own
            parked_kernels: 0,
            ..Config::default()
        };
        tweak(&mut cfg);
        cfg.validate()?;
        crate::init_logging_with("text", "info", true);
        let slots = cfg.slots();
        let uid_range = cfg.uid_base..cfg.uid_base + slots * 65_536;
        let kiln = crate::build(cfg).await?;
        let warm = kiln.jails.warm_pool().cloned();
        let store = kiln.store.clone();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let base_url = format!("http://{}", listener.local_addr()?);
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(crate::serve(kiln, listener, shutdown.clone()));
        Ok(TestServer {
            base_url,
            data_dir,
            shutdown,
            uid_range,
            warm,
            store,
            handle: Some(handle),
        })
    }

    /// Waits until the warm pool parks jails for `profile` (e.g. `py` once
    /// the fork-server finished its preload) and every profile is filled.
    pub async fn wait_warm(&self, profile: &str, limit: std::time::Duration) -> bool {
        let Some(pool) = &self.warm else {
            return false;
        };
        let until = tokio::time::Instant::now() + limit;
        while !pool.has_profile(profile) {
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        pool.wait_filled(until.saturating_duration_since(tokio::time::Instant::now()))
            .await
    }

    /// `base_url` + `/v1`, what LibreChat's `LIBRECHAT_CODE_BASEURL` holds.
    pub fn v1(&self) -> String {
        format!("{}/v1", self.base_url)
    }

    /// Stop gracefully and wait for the server to finish.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        match self.handle.take() {
            Some(h) => h.await?,
            None => Ok(()),
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
