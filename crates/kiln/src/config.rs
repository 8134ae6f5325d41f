//! Configuration: defaults, then an optional TOML file, then `KILN_<KEY>`
//! environment variables, then command-line flags. Every key of [`Config`]
//! can be set in the TOML file (`key = value`) or as `KILN_<KEY>`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use kiln_core::Limits;
use serde::{Deserialize, Serialize};

/// Everything an operator can set.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Address to listen on.
    pub listen: String,
    /// SQLite database, blobs and workspaces live here.
    pub data_dir: PathBuf,
    /// Where run workspaces (each slot's filesystem) and the jail root's
    /// mount point live. Every directory above it must be searchable by
    /// others (the jails' uids resolve paths there). Unset: the data dir,
    /// or — when a directory above the data dir is closed to others, as
    /// `/root` is — `/var/lib/kiln/work-<hash of the data dir's path>`.
    pub work_dir: Option<PathBuf>,
    /// `none`, `api-key`, `jwt` or `api-key,jwt`. Unset: `api-key` when a
    /// key is set, else `none`.
    pub auth: Option<String>,
    /// The shared API key (also read from `LIBRECHAT_CODE_API_KEY` and `CI_API_KEY`).
    pub api_key: Option<String>,
    /// Refuse reads of stored files by requests that carry no user identity.
    pub require_identity: bool,
    /// JWT (LibreChat's CodeAPI token): the issuer tokens must name.
    pub jwt_issuer: String,
    /// JWT: the audience tokens must name.
    pub jwt_audience: String,
    /// JWT: accepted algorithms, e.g. `EdDSA,RS256`. Unset: EdDSA and RS256,
    /// plus HS256 when `jwt_hs256_secret` is set.
    pub jwt_allowed_algs: Option<String>,
    /// JWT: a JWKS file (`{"keys": [...]}`, Ed25519 or RSA, each with `kid`).
    pub jwt_jwks_file: Option<PathBuf>,
    /// JWT: a directory of public keys (PEM or JWK), the file name without
    /// extension being the `kid`.
    pub jwt_public_keys_dir: Option<PathBuf>,
    /// JWT: one public key file (PEM or JWK), under `jwt_kid`.
    pub jwt_public_key_file: Option<PathBuf>,
    /// JWT: the `kid` of `jwt_public_key_file` (LibreChat's default).
    pub jwt_kid: String,
    /// JWT: a shared HS256 secret (development; enables HS256).
    pub jwt_hs256_secret: Option<String>,
    /// JWT: the `kid` of `jwt_hs256_secret`.
    pub jwt_hs256_kid: String,
    /// JWT: clock skew allowed, seconds (at most 30).
    pub jwt_clock_skew_secs: u64,
    /// JWT: longest token lifetime (`exp - iat`) accepted, seconds (at most 300).
    pub jwt_max_lifetime_secs: u64,
    /// JWT: refuse tokens without `tenant_id` (else they get the default tenant).
    pub jwt_require_tenant: bool,
    /// Executions running at once; more requests queue.
    pub max_concurrency: u32,
    /// Memory limit per execution, MiB.
    pub memory_mb: u64,
    /// Process/thread limit per execution.
    pub pids: u32,
    /// Maximum wall time of a run, seconds (a request's `timeout` can only lower it).
    pub timeout_secs: u64,
    /// CPU-time limit of a run, seconds.
    pub cpu_secs: u64,
    /// Largest file a jailed process may write, MiB.
    pub file_size_mb: u64,
    /// Open files per jailed process.
    pub open_files: u64,
    /// stdout cap, bytes (the run is stopped with status `OL` beyond it).
    pub stdout_bytes: usize,
    /// stderr cap, bytes (status `EL` beyond it).
    pub stderr_bytes: usize,
    /// Size of the jail's `/tmp`, MiB.
    pub tmp_mb: u64,
    /// CPU one run may use, in cores (cgroup CPU quota; processes of one run
    /// share it however many they are).
    pub cpus_per_run: f64,
    /// CPU all runs together may use, in cores; `0`: every core of the
    /// machine but half a core, which the server keeps for itself.
    pub cpus_all_runs: f64,
    /// Largest uploaded file, MiB.
    pub max_upload_mb: u64,
    /// Most files one batch upload accepts.
    pub max_batch_files: usize,
    /// Most outputs reported per run.
    pub max_output_files: usize,
    /// Largest output file harvested, MiB.
    pub max_output_file_mb: u64,
    /// Most bytes all new outputs of one run may total, MiB (logical sizes:
    /// a sparse file counts in full); outputs past it are skipped and listed.
    pub max_run_output_mb: u64,
    /// Most bytes one user's stored files (uploads and outputs, until they
    /// expire) may total, MiB; past it uploads get 507 and outputs are
    /// skipped. 0: no quota.
    pub user_storage_mb: u64,
    /// Free space the data dir's filesystem always keeps, MiB: a file that
    /// would go below it is refused (uploads 507, outputs skipped). 0: none.
    pub min_free_disk_mb: u64,
    /// How long stored files are kept, hours (LibreChat assumes ≥ 24).
    pub retention_hours: u64,
    /// How often expired files are collected, seconds.
    pub gc_interval_secs: u64,
    /// Metadata database. Unset: the embedded SQLite database in the data
    /// dir. `postgres://user:password@host:port/db[?sslmode=require]`: a
    /// Postgres database several nodes share (migrated at start).
    pub database_url: Option<String>,
    /// Stored files' bytes. Unset: the data dir. A bucket name: an
    /// S3-compatible bucket (credentials from `s3_access_key_id` /
    /// `s3_secret_access_key` or the environment's `AWS_*`).
    pub s3_bucket: Option<String>,
    /// S3 endpoint, e.g. `http://minio:9000`. Unset: AWS (or `AWS_ENDPOINT`).
    pub s3_endpoint: Option<String>,
    /// S3 region. Unset: `AWS_REGION`, else `us-east-1`.
    pub s3_region: Option<String>,
    /// Address the bucket in the path (`endpoint/bucket/key`), as most
    /// self-hosted S3 servers need.
    pub s3_path_style: bool,
    /// Allow a plain-HTTP endpoint. Unset: when `s3_endpoint` is `http://`.
    pub s3_allow_http: Option<bool>,
    /// S3 access key. Unset: `AWS_ACCESS_KEY_ID` or the host's role.
    pub s3_access_key_id: Option<String>,
    /// S3 secret key. Unset: `AWS_SECRET_ACCESS_KEY` or the host's role.
    pub s3_secret_access_key: Option<String>,
    /// On SIGTERM, how long running executions may finish before they are killed, seconds.
    pub shutdown_grace_secs: u64,
    /// First host uid of the jail uid ranges (65 536 uids per concurrent execution).
    pub uid_base: u32,
    /// Size of each execution's workspace (`/mnt/data`), MiB; enforced by the kernel.
    pub workspace_mb: u64,
    /// Files and directories one workspace can hold.
    pub workspace_files: u64,
    /// How the workspace size is enforced: `auto` (loop-mounted ext4, else tmpfs), `loop`, `tmpfs`, `off`.
    pub workspace_quota: String,
    /// DEVELOPMENT ONLY: start even when a protection (cgroup limits, seccomp,
    /// workspace quota) cannot be enforced on this host, logging each loudly.
    pub insecure_allow_degraded_sandbox: bool,
    /// `text` or `json` logs.
    pub log_format: String,
    /// The binary run as the jail helper (`<helper> __jail`); default: this executable.
    pub jail_helper: Option<PathBuf>,
    /// Most warm (pre-built, parked) jails kept ready over all runtimes; 0
    /// turns the warm pool off. Each holds a uid slot and a little memory.
    pub warm_jails: u32,
    /// Most warm jails of one runtime (`py`, `js`, or the generic `exec`).
    pub warm_per_runtime: u32,
    /// Warm jails each runtime keeps while there is no demand.
    pub warm_min: u32,
    /// Start the Python fork-server: warm `py` jails are forks of an
    /// interpreter that imported numpy, pandas and matplotlib once.
    pub python_zygote: bool,
    /// Which preloaded Python templates the fork-servers hold: `auto` (a
    /// lean one, the interpreter and common stdlib modules; a data one with
    /// numpy, pandas and matplotlib; a rich one with seaborn, scipy,
    /// scikit-learn and statsmodels too; each run forks the smallest its
    /// imports need), or `lean`, `data` or `rich` (only that one, for every
    /// run).
    pub python_template: String,
    /// How long a finished run stays retrievable at `/v1/runs/{run_id}`, seconds.
    pub run_retention_secs: u64,
    /// Most memory finished runs kept for retrieval may hold, MiB (the oldest go first).
    pub run_retention_mb: u64,
    /// At most this many runs per user in `rate_limit_window_secs` (429 beyond); 0: no limit.
    pub rate_limit_runs: u32,
    /// The window of `rate_limit_runs`, seconds.
    pub rate_limit_window_secs: u64,
    /// Per-principal limit of `POST /exec` (`<count>/<s|min|hour|day>`, or `off`).
    pub rate_exec: String,
    /// Per-principal limit of `POST /upload` and `/upload/batch`.
    pub rate_upload: String,
    /// Per-principal limit of `GET /download/...`.
    pub rate_download: String,
    /// Per-principal limit of `GET /files/...` and object metadata.
    pub rate_list: String,
    /// Per-principal limit of the delete routes.
    pub rate_delete: String,
    /// Per-principal limit of `POST /runs/{run_id}/cancel`.
    pub rate_cancel: String,
    /// Seed 000's API: a session idle this long is emptied, files included,
    /// seconds (the seed's `session_ttl_minutes = 60`).
    pub session_ttl_secs: u64,
    /// Seed 000's API: most files one run may name in `files`.
    pub max_run_files: usize,
    /// Persistent projects (LibreChat's attached workspaces): bytes of
    /// files one project may hold (`<data_dir>/projects`). A run that
    /// leaves its project larger keeps nothing of its changes. What one run
    /// can write is also bounded by its slot's `workspace_bytes`.
    pub project_budget_bytes: u64,
    /// LibreChat's stateful profile: `stateless` (`runtime_session_hint`
    /// ignored), `affinity` (a hint names a runtime session whose
    /// `/mnt/data` persists) or `strict` (a hint is required).
    pub runtime_session_mode: String,
    /// LibreChat's stateful profile: `py` calls of one runtime session
    /// evaluate in one live kernel, so variables persist between calls as
    /// well as `/mnt/data` (each runtime session holds one of the
    /// `max_sessions` kernels of its user while it lives; without a free
    /// one a call runs in a fresh process). Off by default: the contract
    /// says each call is a fresh process.
    pub runtime_session_live: bool,
    /// Live kernels (`/v1/sessions`) this node runs at once, each in a jail
    /// with a uid slot of its own (beyond `max_concurrency` and the warm
    /// pool: kernels never take one-shot runs' slots); past it, 503. 0
    /// turns the sessions API off. `py` kernels need the Python fork-server.
    pub max_sessions: u32,
    /// Live kernels one user may hold; past it, 429.
    pub max_sessions_per_user: usize,
    /// A kernel idle this long is closed, seconds (a session may ask for less).
    pub session_idle_ttl_secs: u64,
    /// A kernel this old is closed however busy, seconds.
    pub session_max_age_secs: u64,
    /// How long an evaluation waits for the one in progress before 409, milliseconds.
    pub session_busy_wait_ms: u64,
    /// How long an evaluation interrupted by its timeout may take to come
    /// back before its kernel is killed (the session is then lost), seconds.
    pub session_interrupt_grace_secs: u64,
    /// Sandbox bridge (`/v1/sandbox`, docs/bridge.md): sandboxes one user
    /// may hold at once; past it, 429.
    pub bridge_sandboxes_per_user: usize,
    /// Sandbox bridge: sandboxes this node holds at once; past it, 503. 0
    /// turns the bridge off.
    pub bridge_sandboxes_max: usize,
    /// Sandbox bridge: a sandbox unused this long is removed with its
    /// `/workspace`, seconds.
    pub bridge_idle_ttl_secs: u64,
    /// Serve seed 004's stateful gateway at `/api/v1` (one live kernel
    /// per `user_uuid`; needs `max_sessions` > 0).
    pub seed004_api: bool,
    /// Serve seed 003's runtime daemon API under this path prefix
    /// (`/runtime`: `/runtime/code`, ...); empty: not served.
    pub runtime_api_prefix: String,
    /// Server-side URL transfers (seed 004's file import and export) may
    /// reach loopback and private addresses (link-local never). Off: only
    /// public addresses.
    pub url_fetch_allow_private: bool,
    /// Largest file a server-side URL transfer moves, MiB.
    pub url_fetch_max_mb: u64,
    /// `/metrics` asks for the API key as well (with auth `api-key`).
    pub metrics_require_key: bool,
    /// Serve the operator's web console at `/console/` (behind the API key
    /// like the API; see docs/console.md).
    pub console: bool,
    /// Where each ended run's audit record goes: `stderr` (the `kiln::audit`
    /// target of the log), a file path (JSON lines, appended), or `off`.
    pub audit_log: String,
    /// When `kiln serve` is PID 1 (a container without an init), keep PID 1
    /// as a minimal init that reaps orphans and forwards signals, and run
    /// the server as its child.
    pub pid1_init: bool,
    /// Egress services sandboxed code may call through the gateway, by name
    /// (`[services.deepl]` tables; see docs/egress.md). Empty: no run gets
    /// any network.
    pub services: BTreeMap<String, kiln_egress::ServiceConfig>,
    /// A TOML file with more `[services.<name>]` tables (kept apart from the
    /// main file, e.g. mounted from a secret store).
    pub services_file: Option<PathBuf>,
    /// Upstream calls in flight at once through the gateway, over all runs.
    pub egress_max_concurrent: usize,
    /// Upstream calls in flight at once for one run.
    pub egress_max_per_run: usize,
    /// How long the egress ledger keeps a call, days.
    pub egress_ledger_days: u64,
    /// Programmatic tool calling: the HMAC secret of continuation tokens.
    /// Unset: a random one per start (paused runs die with the process
    /// anyway).
    pub ptc_secret: Option<String>,
    /// Most programmatic runs alive (running or paused for tool results) at
    /// once; a paused run holds its jail. 0: half of `max_concurrency`.
    pub ptc_max_active: usize,
    /// Most programmatic runs one user may have alive at once (429 beyond),
    /// so one user leaving tool calls unanswered cannot hold every place.
    /// 0: half of `ptc_max_active` (at least 1).
    pub ptc_max_per_user: usize,
    /// Seconds a paused run waits for its tool results before it is ended.
    pub ptc_state_ttl_secs: u64,
    /// Seconds a client has to send a request head (also the idle limit of
    /// a kept-alive connection between requests).
    pub http_header_timeout_secs: u64,
    /// Longest pause, seconds, between two pieces of a request body (408 beyond).
    pub http_body_idle_timeout_secs: u64,
    /// Connections served at once; more get 503 with `Retry-After` and are closed.
    pub max_connections: usize,
    /// Largest JSON request body, MiB (413 beyond).
    pub max_json_mb: u64,
    /// Runs that may wait for an execution slot; more are refused with 503
    /// and `Retry-After` instead of queueing without bound. 0: no bound.
    pub max_queued_runs: usize,
    /// Several nodes: where the other nodes reach this one
    /// (`http://10.0.0.7:8000`). Set, the node records the owner of its
    /// kernels and runs in the shared database and forwards requests for
    /// other nodes' ones (needs a Postgres `database_url` and `node_secret`).
    /// Unset: a single node.
    pub advertise_url: Option<String>,
    /// This node's id among several. Unset: the host name and a random
    /// suffix (a restarted node is a new node).
    pub node_id: Option<String>,
    /// The secret every node sends with a forwarded request (at least 16
    /// characters, the same on every node, never given to clients).
    pub node_secret: Option<String>,
    /// A node whose heartbeat is older than this, seconds, is taken as gone:
    /// requests for its kernels and runs are answered 410 `session_lost`.
    pub node_dead_after_secs: u64,
    /// Where rate limits are counted: `local` (each node on its own) or
    /// `postgres` (in the shared database, one budget for every node).
    pub rate_limit_backend: String,
    /// Names Kiln is reached under (comma-separated: `kiln,kiln.example`,
    /// each with or without `:port`): a keyless server answers a `Host`
    /// that is not an IP address, nor `localhost` when listening on
    /// loopback or every address, nor one of these (nor `advertise_url`'s
    /// host) with 421 (DNS rebinding); a browser `Origin` naming one of
    /// these is taken as the server's own.
    pub allowed_hosts: String,
}

impl Default for Config {
    fn default() -> Self {
        let l = Limits::default();
        Config {
            listen: "127.0.0.1:8000".into(),
            data_dir: PathBuf::from("./kiln-data"),
            work_dir: None,
            auth: None,
            api_key: None,
            jwt_issuer: "librechat".to_owned(),
            jwt_audience: "codeapi".to_owned(),
            jwt_allowed_algs: None,
            jwt_jwks_file: None,
            jwt_public_keys_dir: None,
            jwt_public_key_file: None,
            jwt_kid: "lc-codeapi-2026-05".to_owned(),
            jwt_hs256_secret: None,
            jwt_hs256_kid: "hs256-dev".to_owned(),
            jwt_clock_skew_secs: 30,
            jwt_max_lifetime_secs: 300,
            jwt_require_tenant: false,
            require_identity: false,
            max_concurrency: 8,
            memory_mb: l.memory_bytes / (1024 * 1024),
            pids: l.pids,
            timeout_secs: l.wall_time.as_secs(),
            cpu_secs: l.cpu_time.as_secs(),
            file_size_mb: l.file_size_bytes / (1024 * 1024),
            open_files: l.open_files,
            stdout_bytes: l.stdout_bytes,
            stderr_bytes: l.stderr_bytes,
            tmp_mb: l.tmp_bytes / (1024 * 1024),
            cpus_per_run: 1.0,
            cpus_all_runs: 0.0,
            max_upload_mb: 25,
            max_batch_files: 200,
            max_output_files: 50,
            max_output_file_mb: 10,
            max_run_output_mb: 100,
            user_storage_mb: 2048,
            min_free_disk_mb: 1024,
            retention_hours: 24,
            gc_interval_secs: 600,
            database_url: None,
            s3_bucket: None,
            s3_endpoint: None,
            s3_region: None,
            s3_path_style: false,
            s3_allow_http: None,
            s3_access_key_id: None,
            s3_secret_access_key: None,
            shutdown_grace_secs: 20,
            uid_base: 200_000,
            workspace_mb: 1024,
            workspace_files: 65_536,
            workspace_quota: "auto".into(),
            insecure_allow_degraded_sandbox: false,
            log_format: "text".into(),
            jail_helper: None,
            warm_jails: 5,
            warm_per_runtime: 3,
            warm_min: 1,
            python_zygote: true,
            python_template: "auto".into(),
            run_retention_secs: 3600,
            run_retention_mb: 64,
            rate_limit_runs: 0,
            rate_limit_window_secs: 60,
            rate_exec: "600/min".to_owned(),
            rate_upload: "600/min".to_owned(),
            rate_download: "1200/min".to_owned(),
            rate_list: "1200/min".to_owned(),
            rate_delete: "600/min".to_owned(),
            rate_cancel: "600/min".to_owned(),
            session_ttl_secs: 3600,
            max_run_files: 10,
            project_budget_bytes: kiln_exec::projects::DEFAULT_BUDGET_BYTES,
            runtime_session_mode: "affinity".to_owned(),
            runtime_session_live: false,
            max_sessions: 3,
            max_sessions_per_user: 2,
            session_idle_ttl_secs: 30 * 60,
            session_max_age_secs: 8 * 3600,
            session_busy_wait_ms: 2000,
            session_interrupt_grace_secs: 3,
            bridge_sandboxes_per_user: 4,
            bridge_sandboxes_max: 64,
            bridge_idle_ttl_secs: 3600,
            seed004_api: true,
            runtime_api_prefix: "/runtime".to_owned(),
            url_fetch_allow_private: false,
            url_fetch_max_mb: 25,
            metrics_require_key: false,
            console: true,
            audit_log: "stderr".into(),
            pid1_init: true,
            services: BTreeMap::new(),
            services_file: None,
            egress_max_concurrent: 8,
            egress_max_per_run: 4,
            egress_ledger_days: 90,
            ptc_secret: None,
            ptc_max_active: 0,
            ptc_max_per_user: 0,
            ptc_state_ttl_secs: 600,
            http_header_timeout_secs: 10,
            http_body_idle_timeout_secs: 30,
            max_connections: 512,
            max_json_mb: 10,
            max_queued_runs: 64,
            advertise_url: None,
            node_id: None,
            node_secret: None,
            node_dead_after_secs: 15,
            rate_limit_backend: "local".to_owned(),
            allowed_hosts: String::new(),
        }
    }
}

/// The host name and a random suffix.
fn default_node_id() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kiln".to_owned());
    format!("{host}-{}", &kiln_core::Nanoid::random().as_str()[..8])
}

/// Authentication mode after resolving defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    None,
    ApiKey,
    /// LibreChat's CodeAPI token only.
    Jwt,
    /// The shared key or a token.
    ApiKeyOrJwt,
}

impl Config {
    /// `cpus_per_run` and `cpus_all_runs` in thousandths of a core, as the
    /// sandbox takes them (`None`: the sandbox's automatic value).
    pub fn cpu_millis(&self) -> (u32, Option<u32>) {
        let millis = |c: f64| (c * 1000.0).round() as u32;
        let all = (self.cpus_all_runs > 0.0).then(|| millis(self.cpus_all_runs));
        (millis(self.cpus_per_run), all)
    }

    /// Layer defaults, `file`, and the environment.
    pub fn load(file: Option<&std::path::Path>) -> anyhow::Result<Config> {
        let mut fig = Figment::from(Serialized::defaults(Config::default()));
        if let Some(f) = file {
            if !f.exists() {
                bail!("config file {} does not exist", f.display());
            }
            fig = fig.merge(Toml::file(f));
        }
        // the seeds' names for the key, weakest first
        for alias in ["CI_API_KEY", "LIBRECHAT_CODE_API_KEY"] {
            if let Ok(v) = std::env::var(alias)
                && !v.is_empty()
            {
                fig = fig.merge(Serialized::default("api_key", v));
            }
        }
        // only known keys: other KILN_* variables (KILN_CONFIG, test settings)
        // must not trip the unknown-key check meant for typos in the file
        let known: Vec<String> = match serde_json::to_value(Config::default()) {
            Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
            _ => Vec::new(),
        };
        fig = fig.merge(
            Env::prefixed("KILN_")
                .filter(move |k| known.iter().any(|n| k.as_str().eq_ignore_ascii_case(n))),
        );
        let cfg: Config = fig.extract().context("read configuration")?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.listen_addr()?;
        self.auth_mode()?;
        if self.max_concurrency == 0 {
            bail!("max_concurrency must be at least 1");
        }
        if self.timeout_secs == 0 || self.memory_mb < 16 || self.pids < 4 {
            bail!("timeout_secs must be > 0, memory_mb >= 16 and pids >= 4");
        }
        self.quota_mode()?;
        self.store_backends()?;
        let cores_ok = |c: f64| c.is_finite() && (0.01..=4096.0).contains(&c);
        if !cores_ok(self.cpus_per_run)
            || !(self.cpus_all_runs == 0.0 || cores_ok(self.cpus_all_runs))
        {
            bail!("cpus_per_run (and cpus_all_runs unless 0) must be between 0.01 and 4096 cores");
        }
        if self.warm_jails > 256 || (self.warm_jails > 0 && self.warm_per_runtime == 0) {
            bail!(
                "warm_jails must be at most 256, and warm_per_runtime at least 1 when warm jails are on"
            );
        }
        if self.warm_min > self.warm_per_runtime {
            bail!("warm_min must not exceed warm_per_runtime");
        }
        if self.rate_limit_runs > 0 && self.rate_limit_window_secs == 0 {
            bail!("rate_limit_window_secs must be at least 1 when rate_limit_runs is set");
        }
        self.rate_rules()?;
        if self.project_budget_bytes == 0 {
            bail!("project_budget_bytes must be at least 1");
        }
        if self.session_ttl_secs == 0 {
            bail!("session_ttl_secs must be at least 1");
        }
        self.runtime_session_mode()?;
        if self.max_sessions > 256 || self.max_sessions_per_user == 0 {
            bail!("max_sessions must be at most 256 and max_sessions_per_user at least 1");
        }
        if self.bridge_sandboxes_per_user == 0 || self.bridge_idle_ttl_secs == 0 {
            bail!("bridge_sandboxes_per_user and bridge_idle_ttl_secs must be at least 1");
        }
        if self.runtime_session_live && self.max_sessions == 0 {
            bail!("runtime_session_live needs live kernels: max_sessions must be at least 1");
        }
        if let Some(p) = self.runtime_api_prefix()
            && (p.len() < 2
                || !p.starts_with('/')
                || p.ends_with('/')
                || p.contains("//")
                || ["/v1", "/api", "/console", "/metrics", "/openapi.json"]
                    .iter()
                    .any(|taken| p == *taken || p.starts_with(&format!("{taken}/")))
                || !p
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_')))
        {
            bail!(
                "runtime_api_prefix must be empty or a path like /runtime (letters, digits, '-', '_', '/'; not under /v1, /api, /console), not {p:?}"
            );
        }
        if self.url_fetch_max_mb == 0 || self.url_fetch_max_mb > 4096 {
            bail!("url_fetch_max_mb must be between 1 and 4096");
        }
        if self.session_idle_ttl_secs == 0 || self.session_max_age_secs == 0 {
            bail!("session_idle_ttl_secs and session_max_age_secs must be at least 1");
        }
        if self.egress_max_concurrent == 0 || self.egress_max_per_run == 0 {
            bail!("egress_max_concurrent and egress_max_per_run must be at least 1");
        }
        self.python_template_only()?;
        self.nodes()?;
        self.shared_rate_limits()?;
        if !matches!(self.log_format.as_str(), "text" | "json") {
            bail!("log_format must be text or json");
        }
        Ok(())
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

    /// The one Python template to start (`None`: all, chosen per run).
    pub fn python_template_only(
        &self,
    ) -> anyhow::Result<Option<kiln_core::lang::pyimports::PyTemplate>> {
        use kiln_core::lang::pyimports::PyTemplate;
        match self.python_template.as_str() {
            "auto" => Ok(None),
            "lean" => Ok(Some(PyTemplate::Lean)),
            "data" => Ok(Some(PyTemplate::Data)),
            "rich" => Ok(Some(PyTemplate::Rich)),
            other => bail!("python_template must be auto, lean, data or rich, not {other:?}"),
        }
    }

    /// `listen` as an address: `ip:port`, or `name:port` with the name
    /// resolved (its first address; `localhost` is `127.0.0.1`).
    pub fn listen_addr(&self) -> anyhow::Result<SocketAddr> {
        let listen = self.listen.trim();
        if let Ok(addr) = listen.parse() {
            return Ok(addr);
        }
        let Some((host, port)) = listen.rsplit_once(':') else {
            bail!(
                "listen address {:?} has no port: use host:port, e.g. 127.0.0.1:8000 or 0.0.0.0:8000",
                self.listen
            );
        };
        let Ok(port) = port.parse::<u16>() else {
            bail!(
                "listen address {:?}: {port:?} is not a port number (use host:port, e.g. 127.0.0.1:8000)",
                self.listen
            );
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
            .map(Iterator::collect)
            .unwrap_or_default();
        // IPv4 first: `localhost` resolves to ::1 and 127.0.0.1, and clients
        // configured with 127.0.0.1 are the common case
        addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or(addrs.first())
            .copied()
            .with_context(|| {
                format!(
                    "listen address {:?}: the host name {host:?} does not resolve; use an IP address, \
                     e.g. 127.0.0.1:{port} (this host only) or 0.0.0.0:{port} (every interface)",
                    self.listen
                )
            })
    }

    /// Programmatic tool calling's settings (`ptc_*`).
    /// `runtime_session_mode`, parsed.
    pub fn runtime_session_mode(&self) -> anyhow::Result<kiln_api::RuntimeSessionMode> {
        kiln_api::RuntimeSessionMode::parse(&self.runtime_session_mode).with_context(|| {
            format!(
                "runtime_session_mode must be stateless, affinity or strict, not {:?}",
                self.runtime_session_mode
            )
        })
    }

    pub fn ptc_settings(&self) -> kiln_api::programmatic::PtcSettings {
        let ttl = std::time::Duration::from_secs(self.ptc_state_ttl_secs.max(1));
        let max_active = match self.ptc_max_active {
            0 => (self.max_concurrency as usize / 2).max(1),
            n => n,
        };
        kiln_api::programmatic::PtcSettings {
            secret: self
                .ptc_secret
                .as_deref()
                .filter(|s| !s.is_empty())
                .map(|s| s.as_bytes().to_vec()),
            max_active,
            max_per_user: match self.ptc_max_per_user {
                0 => (max_active / 2).max(1),
                n => n,
            },
            limits: kiln_exec::ptc::PtcLimits {
                state_ttl: ttl,
                // the client's 20 round trips, each with the whole TTL
                max_paused: ttl * 20,
                ..kiln_exec::ptc::PtcLimits::default()
            },
        }
    }

    /// The per-principal limits of LibreChat's routes (`rate_*`).
    pub fn rate_rules(&self) -> anyhow::Result<kiln_api::rate::RateRules> {
        let rule = |key: &str, v: &str| -> anyhow::Result<Option<kiln_api::rate::Rule>> {
            if matches!(v.trim(), "off" | "0" | "") {
                return Ok(None);
            }
            let r = kiln_egress::Rate::parse(v).map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
            Ok(Some(kiln_api::rate::Rule {
                max: r.count,
                window: r.per,
            }))
        };
        Ok(kiln_api::rate::RateRules {
            exec: rule("rate_exec", &self.rate_exec)?,
            upload: rule("rate_upload", &self.rate_upload)?,
            download: rule("rate_download", &self.rate_download)?,
            fetch: rule("rate_list", &self.rate_list)?,
            delete: rule("rate_delete", &self.rate_delete)?,
            cancel: rule("rate_cancel", &self.rate_cancel)?,
        })
    }

    /// With JWT on, some key must be configured and the limits hold.
    fn check_jwt_keys(&self) -> anyhow::Result<()> {
        if self.jwt_jwks_file.is_none()
            && self.jwt_public_keys_dir.is_none()
            && self.jwt_public_key_file.is_none()
            && self.jwt_hs256_secret.as_deref().is_none_or(str::is_empty)
        {
            bail!(
                "auth uses jwt but no key is configured: set jwt_jwks_file, jwt_public_keys_dir, \
                 jwt_public_key_file or jwt_hs256_secret"
            );
        }
        if self.jwt_clock_skew_secs > kiln_api::jwt::MAX_SKEW_SECS {
            bail!("jwt_clock_skew_secs must be at most 30");
        }
        if self.jwt_max_lifetime_secs == 0
            || self.jwt_max_lifetime_secs > kiln_api::jwt::MAX_LIFETIME_SECS
        {
            bail!("jwt_max_lifetime_secs must be between 1 and 300");
        }
        if let Some(algs) = &self.jwt_allowed_algs {
            kiln_api::jwt::parse_algs(algs)?;
        }
        Ok(())
    }

    /// The token verifier of the JWT settings, its keys read from their
    /// files; `None` unless auth uses JWT.
    pub fn jwt_verifier(&self) -> anyhow::Result<Option<kiln_api::jwt::JwtVerifier>> {
        use kiln_api::jwt::{JwtKeys, JwtVerifier, parse_algs};
        if !matches!(self.auth_mode()?, Auth::Jwt | Auth::ApiKeyOrJwt) {
            return Ok(None);
        }
        let mut keys = JwtKeys::default();
        if let Some(f) = &self.jwt_jwks_file {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("read jwt_jwks_file {}", f.display()))?;
            keys.add_jwks(&text)?;
        }
        if let Some(d) = &self.jwt_public_keys_dir {
            keys.add_dir(d)?;
        }
        if let Some(f) = &self.jwt_public_key_file {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("read jwt_public_key_file {}", f.display()))?;
            keys.add_public_key(&self.jwt_kid, &text)?;
        }
        if let Some(secret) = self.jwt_hs256_secret.as_deref().filter(|s| !s.is_empty()) {
            keys.add_hs256(&self.jwt_hs256_kid, secret.as_bytes());
        }
        let mut v = JwtVerifier::new(keys, "local")?;
        v.issuer = self.jwt_issuer.clone();
        v.audience = self.jwt_audience.clone();
        if let Some(algs) = &self.jwt_allowed_algs {
            v.allowed_algs = parse_algs(algs)?;
        }
        v.skew_secs = self.jwt_clock_skew_secs;
        v.max_lifetime_secs = self.jwt_max_lifetime_secs;
        v.require_tenant = self.jwt_require_tenant;
        Ok(Some(v))
    }

    pub fn auth_mode(&self) -> anyhow::Result<Auth> {
        let key_set = self.api_key.as_deref().is_some_and(|k| !k.is_empty());
        match self.auth.as_deref() {
            None | Some("") => Ok(if key_set { Auth::ApiKey } else { Auth::None }),
            Some("none") => Ok(Auth::None),
            Some("api-key") | Some("api_key") => {
                if !key_set {
                    bail!("auth is api-key but no KILN_API_KEY (or LIBRECHAT_CODE_API_KEY) is set");
                }
                Ok(Auth::ApiKey)
            }
            Some("jwt") => {
                self.check_jwt_keys()?;
                Ok(Auth::Jwt)
            }
            Some("api-key,jwt") | Some("jwt,api-key") => {
                if !key_set {
                    bail!(
                        "auth is api-key,jwt but no KILN_API_KEY (or LIBRECHAT_CODE_API_KEY) is set"
                    );
                }
                self.check_jwt_keys()?;
                Ok(Auth::ApiKeyOrJwt)
            }
            Some(other) => {
                bail!("unknown auth mode {other:?} (use none, api-key, jwt or api-key,jwt)")
            }
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

    /// Settings of the run registry.
    pub fn runs(&self) -> kiln_exec::RunsConfig {
        kiln_exec::RunsConfig {
            concurrency: self.max_concurrency as usize,
            keep_finished: Duration::from_secs(self.run_retention_secs),
            keep_finished_bytes: usize::try_from(self.run_retention_mb * 1024 * 1024)
                .unwrap_or(usize::MAX),
            rate_limit: (self.rate_limit_runs > 0).then(|| {
                (
                    self.rate_limit_runs,
                    Duration::from_secs(self.rate_limit_window_secs),
                )
            }),
            max_waiting: self.max_queued_runs,
            // opened by `build` (a file sink is IO)
            audit: None,
        }
    }

    /// Every configured service: `services` plus those of `services_file`
    /// (a name in both is an error).
    pub fn all_services(&self) -> anyhow::Result<BTreeMap<String, kiln_egress::ServiceConfig>> {
        let mut all = self.services.clone();
        if let Some(f) = &self.services_file {
            #[derive(Deserialize)]
            #[serde(deny_unknown_fields)]
            struct File {
                #[serde(default)]
                services: BTreeMap<String, kiln_egress::ServiceConfig>,
            }
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("read services_file {}", f.display()))?;
            let file: File = Figment::from(Toml::string(&text))
                .extract()
                .with_context(|| format!("services_file {}", f.display()))?;
            for (name, s) in file.services {
                if all.insert(name.clone(), s).is_some() {
                    bail!(
                        "service {name:?} is configured both in the configuration and in {}",
                        f.display()
                    );
                }
            }
        }
        Ok(all)
    }

    /// The gateway's settings.
    pub fn egress_settings(&self) -> kiln_egress::EgressSettings {
        kiln_egress::EgressSettings {
            max_concurrent_calls: self.egress_max_concurrent,
            max_concurrent_per_grant: self.egress_max_per_run,
            ..kiln_egress::EgressSettings::default()
        }
    }

    /// `runtime_api_prefix`, `None` when empty (seed 003's face off).
    pub fn runtime_api_prefix(&self) -> Option<String> {
        let p = self.runtime_api_prefix.trim();
        (!p.is_empty()).then(|| p.to_owned())
    }

    /// What server-side URL transfers may reach.
    pub fn url_fetch(&self) -> kiln_exec::FetchPolicy {
        kiln_exec::FetchPolicy {
            allow_private: self.url_fetch_allow_private,
            max_bytes: self.url_fetch_max_mb * 1024 * 1024,
            ..kiln_exec::FetchPolicy::default()
        }
    }

    /// Limits of one run.
    /// The sandbox bridge's registry settings (`/v1/sandbox`); `None`: off.
    pub fn sandboxes(&self) -> Option<kiln_exec::sandboxes::SandboxesConfig> {
        (self.bridge_sandboxes_max > 0).then(|| kiln_exec::sandboxes::SandboxesConfig {
            per_principal: self.bridge_sandboxes_per_user,
            total: self.bridge_sandboxes_max,
            idle_ttl: Duration::from_secs(self.bridge_idle_ttl_secs),
        })
    }

    /// The live kernels' registry settings (`/v1/sessions`).
    pub fn kernels(&self) -> kiln_exec::kernels::KernelsConfig {
        kiln_exec::kernels::KernelsConfig {
            idle_ttl: Duration::from_secs(self.session_idle_ttl_secs),
            max_age: Duration::from_secs(self.session_max_age_secs),
            max_total: self.max_sessions as usize,
            max_per_owner: self.max_sessions_per_user,
            busy_wait: Duration::from_millis(self.session_busy_wait_ms),
            grace: Duration::from_secs(self.session_interrupt_grace_secs),
            limits: self.limits(),
        }
    }

    pub fn limits(&self) -> Limits {
        Limits {
            wall_time: Duration::from_secs(self.timeout_secs),
            cpu_time: Duration::from_secs(self.cpu_secs),
            memory_bytes: self.memory_mb * 1024 * 1024,
            pids: self.pids,
            file_size_bytes: self.file_size_mb * 1024 * 1024,
            open_files: self.open_files,
            stdout_bytes: self.stdout_bytes,
            stderr_bytes: self.stderr_bytes,
            tmp_bytes: self.tmp_mb * 1024 * 1024,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_brief() {
        let c = Config::default();
        assert_eq!(c.listen, "127.0.0.1:8000");
        assert_eq!(c.memory_mb, 512);
        assert_eq!(c.pids, 256);
        assert_eq!(c.timeout_secs, 30);
        assert_eq!(c.auth_mode().unwrap(), Auth::None);
    }

    #[test]
    fn a_key_without_explicit_mode_means_api_key() {
        let c = Config {
            api_key: Some("k".into()),
            ..Config::default()
        };
        assert_eq!(c.auth_mode().unwrap(), Auth::ApiKey);
        let c = Config {
            auth: Some("api-key".into()),
            ..Config::default()
        };
        assert!(c.auth_mode().is_err());
        let c = Config {
            auth: Some("bogus".into()),
            ..Config::default()
        };
        assert!(c.auth_mode().is_err());
    }

    #[test]
    fn jwt_needs_a_key_and_builds_a_verifier_from_it() {
        let c = Config {
            auth: Some("jwt".into()),
            ..Config::default()
        };
        assert!(c.auth_mode().is_err(), "jwt without any key");
        let c = Config {
            auth: Some("jwt".into()),
            jwt_hs256_secret: Some("s".into()),
            ..Config::default()
        };
        assert_eq!(c.auth_mode().unwrap(), Auth::Jwt);
        let v = c.jwt_verifier().unwrap().expect("a verifier");
        assert_eq!(
            (v.issuer.as_str(), v.audience.as_str()),
            ("librechat", "codeapi")
        );
        assert!(v.allowed_algs.contains(&jsonwebtoken::Algorithm::HS256));
        let both = Config {
            auth: Some("api-key,jwt".into()),
            jwt_hs256_secret: Some("s".into()),
            ..Config::default()
        };
        assert!(both.auth_mode().is_err(), "api-key,jwt without a key");
        let too_long = Config {
            jwt_max_lifetime_secs: 301,
            ..c.clone()
        };
        assert!(too_long.auth_mode().is_err());
        let missing = Config {
            auth: Some("jwt".into()),
            jwt_public_key_file: Some("/nonexistent/key.pem".into()),
            ..Config::default()
        };
        assert!(
            missing.jwt_verifier().is_err(),
            "an unreadable key file stops the start"
        );
        assert!(Config::default().jwt_verifier().unwrap().is_none());
    }

    #[test]
    fn rate_limits_parse_per_class_and_turn_off() {
        let c = Config {
            rate_exec: "20/min".into(),
            rate_cancel: "off".into(),
            ..Config::default()
        };
        let r = c.rate_rules().unwrap();
        assert_eq!(r.exec, Some(kiln_api::rate::Rule::new(20, 60)));
        assert_eq!(r.cancel, None);
        assert_eq!(r.download, Some(kiln_api::rate::Rule::new(1200, 60)));
        let bad = Config {
            rate_upload: "lots".into(),
            ..Config::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    // figment::Jail's closure must return figment's own (large) error type
    #[allow(clippy::result_large_err)]
    fn toml_file_and_env_layer_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("kiln.toml");
        std::fs::write(&f, "memory_mb = 256\npids = 64\n").unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("KILN_PIDS", "32");
            let c = Config::load(Some(&f)).map_err(|e| e.to_string())?;
            assert_eq!(c.memory_mb, 256);
            assert_eq!(c.pids, 32);
            Ok(())
        });
    }

    /// Seed 002's registry entry, exactly as the issue writes it.
    const SEED_002: &str = r#"
[services.deepl]
upstream = "https://api.deepl.com"
allowed_methods = ["POST", "GET"]
allowed_paths = ["/v2/document", "/v2/document/*"]
inject_header = { Authorization = "DeepL-Auth-Key ${DEEPL_API_KEY}" }   # from Kiln's environment
max_body_bytes = 31457280
rate = "60/min"
"#;

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

    #[test]
    #[allow(clippy::result_large_err)]
    fn seed_002s_service_entry_works_as_written_with_the_key_from_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("kiln.toml");
        std::fs::write(&f, SEED_002).unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("DEEPL_API_KEY", "0123456789-seed-key:fx");
            let c = Config::load(Some(&f)).map_err(|e| e.to_string())?;
            let deepl = &c.services["deepl"];
            assert_eq!(deepl.max_body_bytes, 31_457_280);
            assert_eq!(deepl.rate.as_deref(), Some("60/min"));
            let all = c.all_services().map_err(|e| e.to_string())?;
            let reg = kiln_egress::Registry::build(&all, &|n| std::env::var(n).ok())
                .map_err(|e| e.to_string())?;
            let s = reg.get("deepl").expect("deepl");
            assert_eq!(
                s.inject_headers[0].1,
                "DeepL-Auth-Key 0123456789-seed-key:fx"
            );
            assert!(!format!("{c:?}").contains("0123456789-seed-key"));
            Ok(())
        });
        // without the variable Kiln refuses to start, naming it
        figment::Jail::expect_with(|_jail| {
            let c = Config::load(Some(&f)).map_err(|e| e.to_string())?;
            let e = kiln_egress::Registry::build(&c.all_services().unwrap(), &|n| {
                std::env::var(n).ok()
            })
            .expect_err("unset key");
            assert!(e.to_string().contains("DEEPL_API_KEY"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn services_can_live_in_their_own_file_but_not_twice() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("services.toml");
        std::fs::write(&f, SEED_002).unwrap();
        let c = Config {
            services_file: Some(f.clone()),
            ..Config::default()
        };
        assert!(c.all_services().unwrap().contains_key("deepl"));
        let mut twice = c.clone();
        twice.services = c.all_services().unwrap();
        assert!(twice.all_services().is_err());
        std::fs::write(
            &f,
            "[services.x]
upstream = 1
",
        )
        .unwrap();
        assert!(c.all_services().is_err());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("kiln.toml");
        std::fs::write(&f, "memroy_mb = 256\n").unwrap();
        assert!(Config::load(Some(&f)).is_err());
    }

    #[test]
    fn cpu_quotas_default_to_one_core_per_run_and_auto_for_all() {
        let c = Config::default();
        assert_eq!(c.cpu_millis(), (1000, None));
        c.validate().expect("defaults are valid");
        let c = Config {
            cpus_per_run: 0.5,
            cpus_all_runs: 1.5,
            ..Config::default()
        };
        assert_eq!(c.cpu_millis(), (500, Some(1500)));
        for (per_run, all) in [(0.0, 0.0), (f64::NAN, 0.0), (1.0, 0.001), (-1.0, 0.0)] {
            let c = Config {
                cpus_per_run: per_run,
                cpus_all_runs: all,
                ..Config::default()
            };
            assert!(c.validate().is_err(), "{per_run} {all}");
        }
    }

    #[test]
    fn runtime_session_mode_is_affinity_unless_set_to_a_known_mode() {
        let c = Config::default();
        assert_eq!(
            c.runtime_session_mode().unwrap(),
            kiln_api::RuntimeSessionMode::Affinity
        );
        let c = Config {
            runtime_session_mode: "Strict".into(),
            ..Config::default()
        };
        assert_eq!(
            c.runtime_session_mode().unwrap(),
            kiln_api::RuntimeSessionMode::Strict
        );
        let c = Config {
            runtime_session_mode: "sticky".into(),
            ..Config::default()
        };
        assert!(c.validate().is_err());
    }
}
