//! The HTTP layer's configuration ([`ApiConfig`]) and the shared handler
//! state ([`AppState`], [`HealthInfo`]).

use std::sync::Arc;

use kiln_core::LanguageSpec;
use kiln_exec::sessions::FileSessions;
use kiln_exec::{Runs, RunsConfig};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::ops::{History, Operations};

/// How long a call waits for its runtime session's previous call (spec
/// §13.4: 15 s, then 409).
pub const RUNTIME_BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// How callers authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AuthMode {
    /// Every route is open (network-level trust; current LibreChat sends no
    /// credentials unless JWT is configured).
    #[default]
    None,
    /// A shared key, accepted from `X-API-Key` or `Authorization: Bearer`.
    ApiKey,
    /// LibreChat's CodeAPI token (`Authorization: Bearer <JWT>`, spec
    /// §2.2); the caller is the token's, and nothing else names it.
    Jwt,
    /// Either: the shared key (identity from the request's hints, as with
    /// `ApiKey`) or a token (identity from the token alone).
    ApiKeyOrJwt,
}

impl AuthMode {
    pub fn accepts_key(self) -> bool {
        matches!(self, AuthMode::ApiKey | AuthMode::ApiKeyOrJwt)
    }

    pub fn accepts_jwt(self) -> bool {
        matches!(self, AuthMode::Jwt | AuthMode::ApiKeyOrJwt)
    }
}

/// Knobs of the HTTP layer. `Default` gives the documented defaults.
#[derive(Clone)]
pub struct ApiConfig {
    pub auth: AuthMode,
    /// The shared key for [`AuthMode::ApiKey`]; compared in constant time.
    /// With `ApiKey` and no key every authenticated route answers 401.
    pub api_key: Option<String>,
    /// Verifies tokens for [`AuthMode::Jwt`] / [`AuthMode::ApiKeyOrJwt`];
    /// without one those modes answer 500 (misconfigured).
    pub jwt: Option<Arc<crate::jwt::JwtVerifier>>,
    /// Refuse identity-less requests (no `User-Id`, body `user_id` or
    /// `kind=user&id=`) with 401 instead of treating them as `anonymous`.
    pub require_identity: bool,
    /// Largest accepted uploaded file, in bytes (413 beyond).
    pub max_upload_bytes: u64,
    /// Most file parts processed per upload request.
    pub max_batch_files: usize,
    /// Largest accepted JSON request body, in bytes (413 beyond).
    pub max_json_bytes: usize,
    /// Tenant every principal belongs to.
    pub tenant: String,
    /// Seed 000's API: most files one run may name in `files`.
    pub max_run_files: usize,
    /// `/metrics` asks for the API key too (with auth `api-key`); off, a
    /// scraper needs no key and the port should then stay private.
    pub metrics_require_key: bool,
    /// Per-principal rate limits of LibreChat's routes (spec §4).
    pub rate_limits: crate::limits::RateRules,
    /// Serve the operator's web console at `/console/`.
    pub console: bool,
    /// Programmatic tool calling: token secret, cap, limits.
    pub ptc: kiln_exec::ptc::registry::PtcSettings,
    /// LibreChat's stateful profile: what `runtime_session_hint` does.
    pub runtime_session_mode: RuntimeSessionMode,
    /// How long a call waits for its runtime session's previous call
    /// before 409 `runtime_session_busy` (spec §13.4: 15 s).
    pub runtime_session_busy_wait: std::time::Duration,
    /// LibreChat's stateful profile: `py` calls of one runtime session
    /// evaluate in one live kernel (`/v1/sessions`' registry), so
    /// variables persist too, not only `/mnt/data` (off: each call is a
    /// fresh process, as the contract says).
    pub runtime_session_live: bool,
    /// Serve seed 004's stateful gateway at `/api/v1` (needs sessions).
    pub seed004_api: bool,
    /// Serve seed 003's runtime daemon API under this prefix (`/runtime`);
    /// `None`: not served.
    pub runtime_api_prefix: Option<String>,
    /// What server-side transfers to and from client-named URLs may reach
    /// (seed 004's file import and export).
    pub url_fetch: kiln_exec::FetchPolicy,
    /// The `Host` and `Origin` values the server takes as its own
    /// (browsers: cross-site requests, DNS rebinding; [`crate::origin`]).
    pub hosts: crate::hosts::HostPolicy,
}

/// What `/exec` does with `runtime_session_hint` under the stateful
/// profile (spec §13.4, OSS `CODEAPI_RUNTIME_SESSION_MODE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RuntimeSessionMode {
    /// The hint is ignored, not even validated: every call is stateless.
    Stateless,
    /// A hint names a runtime session whose `/mnt/data` persists; no hint,
    /// a stateless call.
    #[default]
    Affinity,
    /// A hint is required (400 without one).
    Strict,
}

impl RuntimeSessionMode {
    /// `stateless`, `affinity` or `strict`.
    pub fn parse(s: &str) -> Option<RuntimeSessionMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "stateless" => Some(RuntimeSessionMode::Stateless),
            "affinity" => Some(RuntimeSessionMode::Affinity),
            "strict" => Some(RuntimeSessionMode::Strict),
            _ => None,
        }
    }
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            auth: AuthMode::None,
            api_key: None,
            jwt: None,
            require_identity: false,
            max_upload_bytes: 25 * 1024 * 1024,
            max_batch_files: 200,
            max_json_bytes: 10 * 1024 * 1024,
            tenant: "local".to_owned(),
            max_run_files: 10,
            metrics_require_key: false,
            rate_limits: crate::limits::RateRules::default(),
            console: true,
            ptc: kiln_exec::ptc::registry::PtcSettings::default(),
            runtime_session_mode: RuntimeSessionMode::default(),
            runtime_session_busy_wait: RUNTIME_BUSY_WAIT,
            runtime_session_live: false,
            seed004_api: true,
            runtime_api_prefix: Some("/runtime".to_owned()),
            url_fetch: kiln_exec::FetchPolicy::default(),
            hosts: crate::hosts::HostPolicy::default(),
        }
    }
}

// The key must never reach a log line.
impl std::fmt::Debug for ApiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiConfig")
            .field("auth", &self.auth)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("jwt", &self.jwt)
            .field("require_identity", &self.require_identity)
            .field("max_upload_bytes", &self.max_upload_bytes)
            .field("max_batch_files", &self.max_batch_files)
            .field("max_json_bytes", &self.max_json_bytes)
            .field("tenant", &self.tenant)
            .field("max_run_files", &self.max_run_files)
            .field("rate_limits", &self.rate_limits)
            .field("metrics_require_key", &self.metrics_require_key)
            .field("console", &self.console)
            .field("ptc", &self.ptc)
            .field("runtime_session_mode", &self.runtime_session_mode)
            .field("runtime_session_live", &self.runtime_session_live)
            .field("seed004_api", &self.seed004_api)
            .field("runtime_api_prefix", &self.runtime_api_prefix)
            .field("url_fetch", &self.url_fetch)
            .field("hosts", &self.hosts)
            .finish()
    }
}

/// What `GET /health` reports; probed once by the binary at startup.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct HealthInfo {
    /// Server version (the binary's `CARGO_PKG_VERSION`).
    pub version: String,
    pub languages: Vec<LanguageHealth>,
    /// The runtime image jails run from (a language's own, if it has one, is its
    /// [`LanguageHealth::image`]); `None`: the host's `/usr`.
    pub runtime_image: Option<RuntimeImageHealth>,
}

/// The runtime image jails run from (docs/runtimes.md).
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct RuntimeImageHealth {
    /// `recipe-<hex>` (built from a recipe), `import-<hex>` (imported), or the root's path.
    pub id: String,
    /// SHA-256 of the recipe or of the imported archive.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// One runtime's availability on this host.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct LanguageHealth {
    pub name: String,
    /// The name people write (`python`, `javascript`, ...).
    #[serde(skip)]
    pub common_name: String,
    pub aliases: Vec<String>,
    /// First line of the version probe, when it ran.
    pub version: Option<String>,
    pub available: bool,
    /// Why the runtime is unavailable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The runtime image its jails run from (`runtime_images`, else `runtime_image`);
    /// `null`: the host's `/usr`.
    pub image: Option<RuntimeImageHealth>,
}

impl LanguageHealth {
    /// An available runtime with its probed version.
    pub fn available(spec: &LanguageSpec, version: Option<String>) -> Self {
        LanguageHealth {
            name: spec.name.to_owned(),
            common_name: spec.common_name.to_owned(),
            aliases: spec.aliases.iter().map(|a| (*a).to_owned()).collect(),
            version,
            available: true,
            reason: None,
            image: None,
        }
    }

    /// The same, running from `image` (`None`: the host's `/usr`).
    pub fn on_image(self, image: Option<RuntimeImageHealth>) -> Self {
        LanguageHealth { image, ..self }
    }

    /// A runtime that cannot be used on this host, and why.
    pub fn unavailable(spec: &LanguageSpec, reason: impl Into<String>) -> Self {
        LanguageHealth {
            name: spec.name.to_owned(),
            common_name: spec.common_name.to_owned(),
            aliases: spec.aliases.iter().map(|a| (*a).to_owned()).collect(),
            version: None,
            available: false,
            reason: Some(reason.into()),
            image: None,
        }
    }
}

/// Everything the faces are served from, in a few groups: what every
/// request meets (configuration, shutdown, rates, this node), the engine
/// (the store, the run registry, file sessions, the programmatic
/// executions), the live environments, and what the operator reads. A
/// handler that needs one group extracts only it (`State<Operator>`,
/// `State<Environments>`, the admission's [`crate::kit::Door`]: axum's
/// `FromRef`). Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<ApiConfig>,
    /// Cancelled when the server begins shutting down: new runs are refused
    /// with 503 (runs already in flight are left to finish).
    pub shutdown: CancellationToken,
    /// The rate limiters of [`ApiConfig::rate_limits`].
    pub rates: Arc<crate::limits::RateLimits>,
    /// This node among several (owners recorded, requests forwarded);
    /// `None`: a single node.
    pub cluster: Option<Arc<crate::node::Cluster>>,
    pub store: kiln_store::Store,
    /// The run registry every face starts executions through.
    pub runs: Runs,
    /// Seed 000's named file sessions.
    pub sessions: Arc<FileSessions>,
    /// Programmatic executions and requests in flight.
    pub ptc: Arc<kiln_exec::ptc::registry::Programmatic>,
    /// Live kernels, named kernels, projects and sandboxes.
    pub envs: Environments,
    /// What the operator's routes read: health, metrics, the sandbox.
    pub operator: Operator,
}

/// The live environments beside the run registry; each `None` when its
/// routes are off (they answer 503).
#[derive(Clone, Default)]
pub struct Environments {
    /// Live kernels (Kiln's sessions API).
    pub kernels: Option<kiln_exec::kernels::Kernels>,
    /// Kernels by name over `kernels` (the compatibility faces' workers).
    pub workers: Option<kiln_exec::workers::Workers>,
    /// The live kernels of LibreChat's runtime sessions
    /// (`runtime_session_live`), counted against each user's cap.
    pub runtime_kernels: Option<kiln_exec::workers::Workers>,
    /// Server-side URL transfers under `config.url_fetch`; `None` also
    /// when the HTTP client could not be built.
    pub fetcher: Option<kiln_exec::Fetcher>,
    /// Persistent project directories (LibreChat's attached workspaces, a
    /// bridge sandbox's `/workspace`).
    pub projects: Option<kiln_exec::projects::Projects>,
    /// The sandbox bridge's sandboxes (`/v1/sandbox`).
    pub sandboxes: Option<kiln_exec::sandboxes::Sandboxes>,
}

impl Environments {
    /// The live kernels, or 503 when sessions are off.
    pub fn kernels(&self) -> Result<&kiln_exec::kernels::Kernels, crate::error::ApiError> {
        self.kernels.as_ref().ok_or_else(|| {
            crate::error::ApiError::Kernel(kiln_exec::kernels::KernelsError::Unavailable(
                "sessions are off".into(),
            ))
        })
    }
}

/// What the operator's routes (`/health`, `/metrics`, `/admin/status`)
/// read beside the engine.
#[derive(Clone)]
pub struct Operator {
    pub health: Arc<HealthInfo>,
    /// Renders `/metrics`; `None` → `/metrics` answers 404.
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// What the sandbox knows, for `/admin/status` (`None`: not reported).
    pub ops: Option<Arc<dyn Operations>>,
    /// The last hour of key numbers (filled by `admin::spawn_sampler`).
    pub history: Arc<History>,
}

impl Operator {
    /// `health`, with no metrics, no sandbox report and an empty hour.
    pub fn new(health: HealthInfo) -> Operator {
        Operator {
            health: Arc::new(health),
            metrics: None,
            ops: None,
            history: Arc::new(History::hour(std::time::Duration::from_secs(10))),
        }
    }
}

impl axum::extract::FromRef<AppState> for Operator {
    fn from_ref(state: &AppState) -> Operator {
        state.operator.clone()
    }
}

impl axum::extract::FromRef<AppState> for Environments {
    fn from_ref(state: &AppState) -> Environments {
        state.envs.clone()
    }
}

impl AppState {
    /// A state whose runs execute on `exec`, with default registry
    /// settings, sessions idle for an hour expiring, no metrics and no
    /// live environments.
    pub fn new(
        store: kiln_store::Store,
        exec: Arc<dyn kiln_exec::Execute>,
        config: ApiConfig,
        health: HealthInfo,
    ) -> AppState {
        AppState {
            runs: Runs::new(exec, RunsConfig::default()),
            sessions: Arc::new(FileSessions::new(
                store.clone(),
                std::time::Duration::from_secs(3600),
            )),
            store,
            rates: Arc::new(crate::limits::RateLimits::new(config.rate_limits)),
            ptc: Arc::new(kiln_exec::ptc::registry::Programmatic::new(
                config.ptc.clone(),
            )),
            config: Arc::new(config),
            shutdown: CancellationToken::new(),
            cluster: None,
            envs: Environments::default(),
            operator: Operator::new(health),
        }
    }

    /// Live kernels `kernels` for the sessions API and the compatibility
    /// faces, and the URL fetcher of `config.url_fetch`.
    pub fn with_kernels(mut self, kernels: Option<kiln_exec::kernels::Kernels>) -> AppState {
        use kiln_exec::workers::Workers;
        self.envs.workers = kernels.clone().map(Workers::new);
        self.envs.runtime_kernels = kernels.clone().map(Workers::new);
        self.envs.kernels = kernels;
        self.envs.fetcher = kiln_exec::Fetcher::new(self.config.url_fetch.clone())
            .inspect_err(|e| tracing::error!(error = %e, "URL transfers are unavailable"))
            .ok();
        self
    }
}
