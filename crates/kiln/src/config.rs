//! Configuration: defaults, then an optional TOML file, then `KILN_<KEY>`
//! environment variables, then command-line flags. Every key of [`Config`]
//! can be set in the TOML file (`key = value`) or as `KILN_<KEY>`.

use std::collections::BTreeMap;
use std::path::PathBuf;

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
    /// Where runtime images live (`kiln runtime build|import|list`; docs/runtimes.md).
    pub runtime_dir: PathBuf,
    /// The runtime image jails run from: `default` (the image of the compiled-in recipe), an
    /// image id (`recipe-…`, `import-…`), an absolute path to a root filesystem, or `host`:
    /// the host's `/usr` and `/etc` entries (for development, or a host where an image
    /// cannot be built). A server whose image is not built refuses to start, naming
    /// `kiln runtime build` (docs/runtimes.md).
    pub runtime_image: String,
    /// Languages whose jails run from another image than `runtime_image`: a table
    /// (`[runtime_images]`, `r = "import-…"`) or `KILN_RUNTIME_IMAGES="r=import-…,py=host"`.
    /// Each value takes what `runtime_image` takes; a language not named runs from
    /// `runtime_image`. An unknown language or image is refused at start.
    pub runtime_images: RuntimeImages,
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
    /// The default leaves room above every profile's `warm_min` for one
    /// profile in demand to grow to `warm_per_runtime`: when the minima fill
    /// it, a profile that misses cannot grow, and back-to-back runs of one
    /// profile wait for a jail to be built (BENCHMARKS.md, "the warm pool").
    pub warm_jails: u32,
    /// Keep a one-shot `py` jail per uid slot and hand it the slot's next
    /// program once it is found as new, instead of building a jail per
    /// run (`kiln-sandbox/src/sandbox/kept.rs`). On by default (SECURITY.md,
    /// "A one-shot jail kept per slot"; BENCHMARKS.md has what it saves);
    /// a host whose `/proc/sys` is read-only cannot keep jails and runs
    /// every one once, with a warning at start.
    pub keep_jails: bool,
    /// Tests only, never read from a file or the environment: a file that
    /// stands for `/proc/sys/kernel/ns_last_pid` in the start-up check of
    /// whether jails can be kept (`kiln_sandbox::SandboxConfig::ns_last_pid`).
    #[serde(skip)]
    pub test_ns_last_pid: Option<PathBuf>,
    /// Most warm jails of one runtime (`py`, `js`, or the generic `exec`).
    pub warm_per_runtime: u32,
    /// Warm jails each runtime keeps while there is no demand.
    pub warm_min: u32,
    /// Start the Python fork-server: warm `py` jails are forks of an
    /// interpreter that imported numpy, pandas and matplotlib once.
    pub python_zygote: bool,
    /// Which preloaded Python templates the fork-servers hold: `auto` (a
    /// min one, the interpreter alone; a lean one, the interpreter and
    /// common stdlib modules; a data one with numpy, pandas and matplotlib;
    /// a rich one with seaborn, scipy, scikit-learn and statsmodels too;
    /// each run forks the smallest its imports need), or `min`, `lean`,
    /// `data` or `rich` (only that one, for every run).
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
    /// Persistent projects: one nobody used for this long is removed with
    /// its files, seconds (default 30 days; 0: kept until deleted). The
    /// clock is on disk, so it counts across restarts.
    pub project_idle_ttl_secs: u64,
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
    /// pool: kernels never take one-shot runs' slots, and a kernel slot is
    /// mounted only while a kernel holds it); past it, 503. 0 turns the
    /// sessions API off. `py` kernels need the Python fork-server. Default:
    /// sized from the machine's memory ([`SessionSizing`]).
    pub max_sessions: u32,
    /// Live kernels one user (principal) may hold; past it, 429. Default:
    /// half of the default `max_sessions`.
    pub max_sessions_per_user: usize,
    /// Kernels of each session language (`py`, `js`) kept started ahead,
    /// each in its own jail under a fresh kernel slot no session has used,
    /// so a create only takes one (`kiln_kernel_pool_takes_total`); a create
    /// that finds none starts its own. They hold slots beyond
    /// `max_sessions` (never a user's room) and count against the memory
    /// `max_sessions` may take. 0: every create starts its kernel.
    pub parked_kernels: u32,
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
        let sized = SessionSizing::for_this_machine();
        Config {
            listen: "127.0.0.1:8000".into(),
            data_dir: PathBuf::from("./kiln-data"),
            runtime_dir: PathBuf::from("/var/lib/kiln/runtimes"),
            runtime_image: DEFAULT_IMAGE.to_owned(),
            runtime_images: RuntimeImages::default(),
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
            warm_jails: 8,
            keep_jails: true,
            test_ns_last_pid: None,
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
            project_idle_ttl_secs: 30 * 86_400,
            runtime_session_mode: "affinity".to_owned(),
            runtime_session_live: false,
            max_sessions: sized.max_sessions,
            max_sessions_per_user: sized.max_sessions_per_user,
            parked_kernels: 1,
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

mod auth;
mod egress;
mod images;
mod limits;
mod server;
mod sessions;
mod storage;

pub use self::auth::Auth;
pub use self::images::RuntimeImages;
pub use self::sessions::{MOST_PARKED_KERNELS, SessionSizing};

/// `runtime_image`'s default: the compiled-in recipe's image.
pub const DEFAULT_IMAGE: &str = "default";
/// `runtime_image = "host"`: jails run from the host's `/usr`, no image.
pub const HOST_IMAGE: &str = "host";

impl Config {
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
        images::check_image_name("runtime_image", &self.runtime_image)?;
        self.runtime_images()?;
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
        let most = SessionSizing::for_this_machine().most_sessions;
        if self.max_sessions > most || self.max_sessions_per_user == 0 {
            bail!(
                "max_sessions must be at most {most} here ({} MiB of memory per idle kernel) \
                 and max_sessions_per_user at least 1",
                sessions::IDLE_KERNEL_BYTES >> 20
            );
        }
        if self.parked_kernels > MOST_PARKED_KERNELS || self.kernel_slots() > most {
            bail!(
                "parked_kernels must be at most {MOST_PARKED_KERNELS}, and max_sessions plus the \
                 kernels parked ahead ({} per session language) at most {most} here",
                self.parked_kernels
            );
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
    fn the_default_warm_pool_leaves_room_for_a_profile_in_demand_to_grow() {
        // Every warm profile keeps warm_min jails; one that misses grows its target
        // towards warm_per_runtime only while the targets together fit in warm_jails.
        let c = Config::default();
        let mut profiles = std::collections::BTreeSet::new();
        for lang in kiln_core::Language::all() {
            let own = lang.warm_profile();
            profiles.insert(own);
            profiles.extend(kiln_core::Language::sibling_profiles(own));
        }
        let minima = profiles.len() as u32 * c.warm_min;
        assert!(
            c.warm_jails >= minima + (c.warm_per_runtime - c.warm_min),
            "warm_jails {} leaves no room to grow above the minima of {profiles:?}",
            c.warm_jails
        );
    }

    #[test]
    fn jails_run_from_the_default_image_unless_host_is_asked_for() {
        let c = Config::default();
        assert_eq!(c.runtime_image(), Some("default"));
        let host = Config {
            runtime_image: "host".to_owned(),
            ..Config::default()
        };
        host.validate().unwrap();
        assert_eq!(host.runtime_image(), None);
        for ok in [
            "recipe-0123456789abcdef",
            "import-0123456789abcdef",
            "/srv/rootfs",
        ] {
            let c = Config {
                runtime_image: ok.to_owned(),
                ..Config::default()
            };
            c.validate().unwrap();
            assert_eq!(c.runtime_image(), Some(ok));
        }
        for bad in ["", "Host", "debian:13", "recipe-../x", "rootfs"] {
            let c = Config {
                runtime_image: bad.to_owned(),
                ..Config::default()
            };
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("runtime_image must be"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn default_live_kernels_give_seed_004s_25_users_under_one_key_room_on_a_big_machine() {
        let c = Config::default();
        let sized = SessionSizing::for_this_machine();
        assert_eq!(c.max_sessions, sized.max_sessions);
        assert_eq!(c.max_sessions_per_user, sized.max_sessions_per_user);
        c.validate().expect("the sized defaults are valid");
        match sized.memory_bytes {
            // like the 24 GiB machine the defaults are checked on
            Some(m) if m >= 7 << 30 => assert!(
                c.max_sessions_per_user >= 25,
                "{} per principal on {m} bytes",
                c.max_sessions_per_user
            ),
            _ => eprintln!("SKIPPED: a machine under 7 GiB ({:?})", sized.memory_bytes),
        }
    }

    #[test]
    fn kernels_started_ahead_hold_slots_beyond_max_sessions_and_count_against_memory() {
        let most = SessionSizing::for_this_machine().most_sessions;
        let langs = kiln_core::Language::with_kernels().count() as u32;
        let c = Config {
            max_sessions: 10,
            parked_kernels: 2,
            ..Config::default()
        };
        c.validate().unwrap();
        assert_eq!(c.parked_kernel_slots(), 2 * langs);
        assert_eq!(c.kernel_slots(), 10 + 2 * langs);
        let off = Config {
            max_sessions: 0,
            ..c.clone()
        };
        assert_eq!(off.kernel_slots(), 0, "no sessions, none started ahead");
        let full = Config {
            max_sessions: most,
            parked_kernels: 1,
            ..Config::default()
        };
        let err = full.validate().unwrap_err().to_string();
        assert!(err.contains("parked_kernels"), "{err}");
        Config {
            parked_kernels: 0,
            ..full
        }
        .validate()
        .unwrap();
        let many = Config {
            parked_kernels: MOST_PARKED_KERNELS + 1,
            ..Config::default()
        };
        assert!(many.validate().is_err());
    }

    #[test]
    // figment::Jail's closure must return figment's own (large) error type
    #[allow(clippy::result_large_err)]
    fn toml_file_and_env_layer_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("kiln.toml");
        std::fs::write(&f, "memory_mb = 256\npids = 64\nmax_sessions = 7\n").unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("KILN_PIDS", "32");
            jail.set_env("KILN_MAX_SESSIONS_PER_USER", "1");
            let c = Config::load(Some(&f)).map_err(|e| e.to_string())?;
            assert_eq!(c.memory_mb, 256);
            assert_eq!(c.pids, 32);
            // explicit values win over the machine-sized defaults
            assert_eq!((c.max_sessions, c.max_sessions_per_user), (7, 1));
            Ok(())
        });
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("kiln.toml");
        std::fs::write(&f, "memroy_mb = 256\n").unwrap();
        assert!(Config::load(Some(&f)).is_err());
    }

    /// A TOML literal of a JSON value (what `Config` serialises to).
    fn toml_literal(v: &serde_json::Value) -> String {
        use serde_json::Value;
        match v {
            Value::Array(items) => {
                let items: Vec<String> = items.iter().map(toml_literal).collect();
                format!("[{}]", items.join(", "))
            }
            Value::Object(m) => {
                let pairs: Vec<String> = m
                    .iter()
                    .map(|(k, v)| format!("{} = {}", Value::from(k.as_str()), toml_literal(v)))
                    .collect();
                format!("{{ {} }}", pairs.join(", "))
            }
            // strings in JSON's escapes, which TOML's basic strings share
            other => other.to_string(),
        }
    }

    /// Every key of README's configuration table is a key of `Config` that a
    /// TOML file may set: each one set alone (to its default, so the check
    /// is about the name and the type) parses.
    #[test]
    fn every_documented_key_is_one_a_file_can_set() {
        let readme = include_str!("../../../README.md");
        let section = readme
            .split("\n## Configuration")
            .nth(1)
            .expect("README has a configuration section");
        let section = section.split("\n## ").next().unwrap_or_default();
        let Ok(serde_json::Value::Object(defaults)) = serde_json::to_value(Config::default())
        else {
            panic!("Config serialises to a map");
        };
        let mut documented = 0;
        for line in section.lines() {
            let Some(rest) = line.strip_prefix("| `") else {
                continue;
            };
            let key = rest.split('`').next().unwrap_or_default();
            documented += 1;
            let value = defaults
                .get(key)
                .unwrap_or_else(|| panic!("README documents {key:?}, which Config does not have"));
            if value.is_null() {
                continue;
            }
            let file = format!("{key} = {}", toml_literal(value));
            let parsed: Result<Config, _> = Figment::from(Serialized::defaults(Config::default()))
                .merge(Toml::string(&file))
                .extract();
            assert!(parsed.is_ok(), "{file}: {parsed:?}");
        }
        assert!(documented > 50, "only {documented} keys in README's table");
    }
}
