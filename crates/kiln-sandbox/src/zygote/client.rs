//! The server's handle of a fork-server: starts `kiln __zygote`, hands it
//! its config, waits for the preload, and gives each embedded jail's helper
//! its own socket to it.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::SandboxError;
use crate::seqpacket::{self, OwnedChild, recv, send, wait_readable};

use super::{Hello, ZygoteConfig, ZygoteInfo};

/// How long the preload may take.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// Server-side handle of the fork-server.
#[derive(Debug)]
pub(crate) struct Zygote {
    sock: Arc<Mutex<OwnedFd>>,
    _child: OwnedChild,
    info: ZygoteInfo,
    alive: Arc<AtomicBool>,
}

impl Zygote {
    /// Starts `helper __zygote`, hands it `cfg` and waits for the preload.
    /// Starts `helper __zygote SLOTS_DIR`: a fork-server in a runtime
    /// image's mount namespace drops the slots' filesystems from it (its
    /// forks join their jail's namespace; a private copy of a slot's mount
    /// would keep the filesystem and its loop device alive after the
    /// server unmounts it).
    pub(crate) async fn start(
        helper: &Path,
        cfg: &ZygoteConfig,
        slots_dir: &Path,
    ) -> Result<Zygote, SandboxError> {
        let helper = helper.to_path_buf();
        let cfg = cfg.clone();
        let slots_dir = slots_dir.to_path_buf();
        tokio::task::spawn_blocking(move || Zygote::start_blocking(&helper, &cfg, &slots_dir))
            .await
            .map_err(|e| SandboxError::Zygote(format!("start: {e}")))?
    }

    fn start_blocking(
        helper: &Path,
        cfg: &ZygoteConfig,
        slots_dir: &Path,
    ) -> Result<Zygote, SandboxError> {
        let err = |m: String| SandboxError::Zygote(m);
        // On every error below, dropping `child` kills it.
        let (ours, child) = seqpacket::spawn_peer(helper, "zygote", &[slots_dir.as_os_str()])
            .map_err(|e| err(format!("spawn {}: {e}", helper.display())))?;
        let config = serde_json::to_vec(cfg).map_err(|e| err(format!("encode config: {e}")))?;
        send(&ours, &config, &[]).map_err(|e| err(format!("send config: {e}")))?;
        wait_readable(&ours, START_TIMEOUT).map_err(err)?;
        let (bytes, _) = recv(&ours, 64 * 1024).map_err(|e| err(format!("read answer: {e}")))?;
        match serde_json::from_slice::<Hello>(&bytes) {
            Ok(Hello::Ready(info)) => Ok(Zygote {
                sock: Arc::new(Mutex::new(ours)),
                _child: child,
                info,
                alive: Arc::new(AtomicBool::new(true)),
            }),
            Ok(Hello::Failed(why)) => Err(err(why)),
            Err(_) => Err(err(
                "the fork-server ended during its preload (see its stderr above)".into(),
            )),
        }
    }

    pub(crate) fn info(&self) -> &ZygoteInfo {
        &self.info
    }

    /// Whether the fork-server still answers.
    pub(crate) fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// A socket to the fork-server for one jail helper (close-on-exec; the
    /// helper gets it on [`crate::spec::ZYGOTE_FD`]).
    pub(crate) fn client(&self) -> Result<OwnedFd, SandboxError> {
        if !self.alive() {
            return Err(SandboxError::Zygote("the fork-server is gone".into()));
        }
        let sock = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        sock.try_clone()
            .map_err(|e| SandboxError::Zygote(format!("dup socket: {e}")))
    }
}
