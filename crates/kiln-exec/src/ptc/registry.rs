//! The registry of programmatic executions (the application layer of
//! LibreChat's programmatic tool calling): paused runs by id, the requests
//! in flight by their request id, the per-principal and node caps, and the
//! continuation tokens' signing. Domain state that the face
//! (`kiln-api`'s `codeapi::programmatic`) renders; the one wire value kept
//! here is the face's own last answer, opaque, replayed to a retry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::{Bridge, PtcLimits, ToolResult};
use crate::RunHandle;
use crate::caps::{CapGuard, Caps};
use crate::turns::Turn;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use kiln_core::Owner;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Settings of programmatic tool calling.
#[derive(Clone)]
pub struct PtcSettings {
    /// The continuation tokens' HMAC key; `None`: a random one per start
    /// (tokens then die with the process, as the paused runs do).
    pub secret: Option<Vec<u8>>,
    /// Most programmatic runs alive (running or paused) at once; more are
    /// refused with 503.
    pub max_active: usize,
    /// Most programmatic runs alive at once of one principal; more are
    /// refused with 429.
    pub max_per_user: usize,
    pub limits: PtcLimits,
}

impl Default for PtcSettings {
    fn default() -> Self {
        PtcSettings {
            secret: None,
            max_active: 4,
            max_per_user: 2,
            limits: PtcLimits::default(),
        }
    }
}

// The secret must never reach a log line.
impl std::fmt::Debug for PtcSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtcSettings")
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("max_active", &self.max_active)
            .field("max_per_user", &self.max_per_user)
            .field("limits", &self.limits)
            .finish()
    }
}

/// One programmatic execution.
pub struct Execution {
    pub run: RunHandle,
    pub bridge: Arc<Bridge>,
    pub owner: Owner,
    /// What the answers call `session_id` until the run has its outputs.
    pub session_id: String,
    /// Held while a request (the first, or a continuation) is served.
    pub busy: Turn,
    /// Its place under the caps, given back when the run ends.
    pub place: Mutex<Option<CapGuard>>,
    pub progress: Mutex<Progress>,
}

#[derive(Default)]
pub struct Progress {
    /// Output already returned as `partial_*`.
    pub stdout_at: usize,
    pub stderr_at: usize,
    /// Rounds already answered with `tool_call_required`.
    pub rounds_seen: u32,
    /// The last continuation's results and answer (a retry gets it again).
    pub last: Option<(Vec<(String, ToolResult)>, Value)>,
    pub touched: Option<Instant>,
}

impl Execution {
    /// Gives the run's place under the caps back (its run ended).
    pub fn release(&self) {
        lock(&self.place).take();
    }

    /// Marks it used now (the state TTL's clock).
    pub fn touch(&self) {
        lock(&self.progress).touched = Some(Instant::now());
    }
}

/// A request in flight, by its `X-LibreChat-Code-Request-ID`.
pub struct InFlight {
    pub owner: Owner,
    pub cancel: CancellationToken,
}

/// The registry of programmatic executions and requests in flight.
pub struct Programmatic {
    pub key: ring::hmac::Key,
    pub settings: PtcSettings,
    /// Programmatic runs alive, per principal and on the node.
    pub caps: Caps,
    pub executions: Mutex<HashMap<String, Arc<Execution>>>,
    pub requests: Mutex<HashMap<String, InFlight>>,
}

impl std::fmt::Debug for Programmatic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Programmatic")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Programmatic {
    pub fn new(settings: PtcSettings) -> Programmatic {
        let secret = settings.secret.clone().unwrap_or_else(|| {
            let mut s = vec![0u8; 32];
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut s)
                .expect("the system's random source works");
            s
        });
        Programmatic {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret),
            caps: Caps::new(settings.max_per_user.max(1), settings.max_active),
            settings,
            executions: Mutex::default(),
            requests: Mutex::default(),
        }
    }

    /// Forgets executions whose run ended and that were not touched for
    /// the state TTL, and those whose run the registry no longer keeps
    /// (its retention budget is the one every run counts against).
    ///
    /// Not an [`kiln_exec::expiring::Expiring`]: an execution goes with its
    /// run (the run registry's retention) or once the run is over and the
    /// execution untouched for the state TTL; while its run lives it is
    /// never expired here (the bridge's state TTL ends an unanswered round).
    pub fn sweep(&self, runs: &crate::Runs) {
        let ttl = self.settings.limits.state_ttl;
        lock(&self.executions).retain(|_, e| {
            let over = e.run.info().phase.is_over();
            let idle = lock(&e.progress).touched.is_none_or(|t| t.elapsed() >= ttl);
            let kept = runs.get(e.run.id()).is_some();
            kept && !(over && idle)
        });
    }

    pub fn token(&self, run_id: &str, owner: &Owner) -> String {
        let exp = unix_now() + self.settings.limits.state_ttl.as_secs();
        let payload = json!({"e": run_id, "o": owner.token_hash(), "x": exp}).to_string();
        let tag = ring::hmac::sign(&self.key, payload.as_bytes());
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload.as_bytes()),
            URL_SAFE_NO_PAD.encode(tag.as_ref())
        )
    }

    /// The token's `(run id, owner's token hash, expiry)` if this server
    /// signed it.
    pub fn verify(&self, token: &str) -> Option<(String, String, u64)> {
        let (payload, tag) = token.split_once('.')?;
        let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        ring::hmac::verify(&self.key, &payload, &tag).ok()?;
        let v: Value = serde_json::from_slice(&payload).ok()?;
        Some((
            v.get("e")?.as_str()?.to_owned(),
            v.get("o")?.as_str()?.to_owned(),
            v.get("x")?.as_u64()?,
        ))
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
