//! Kiln as a library: wiring of store, sandbox, executor and HTTP router,
//! the serve loop with graceful shutdown, and the `doctor` and `exec`
//! commands. `main.rs` is a thin CLI over this; integration tests start the
//! same server through [`testing`].

pub mod audit;
pub mod config;
pub mod doctor;
mod ops;
pub mod remote;
pub mod runtime;
pub mod testing;

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use config::{Auth, Config};
use kiln_core::Language;
use kiln_core::access::Caller;
use kiln_exec::kernels::Kernels;
use kiln_exec::sessions::FileSessions;
use kiln_exec::{
    ExecConfig, ExecRequest, Executor, Outputs, RunEvent, Runs, StartOptions, Stream, WalkLimits,
};
use kiln_sandbox::{JailSource, Sandbox, SandboxConfig, WarmConfig, ZygoteStart};
use kiln_store::{Store, StoreConfig};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Everything a running server holds.
pub struct Kiln {
    pub config: Config,
    pub store: Store,
    /// Where jails come from (the sandbox, and the warm pool if on).
    pub jails: JailSource,
    /// The run registry every face starts executions through.
    pub runs: Runs,
    /// Seed 000's named file sessions.
    pub sessions: Arc<FileSessions>,
    /// Live kernels (`/v1/sessions`); `None` when `max_sessions` is 0.
    pub kernels: Option<Kernels>,
    /// Persistent project directories (`<data_dir>/projects`).
    pub projects: kiln_exec::projects::Projects,
    /// The sandbox bridge's sandboxes (`/v1/sandbox`); `None` when
    /// `bridge_sandboxes_max` is 0.
    pub sandboxes: Option<kiln_exec::sandboxes::Sandboxes>,
    pub languages: Vec<kiln_api::LanguageHealth>,
    /// The runtime images jails run from (`runtime_image`, and each language's of
    /// `runtime_images`).
    pub images: runtime::jail::Images,
}

/// Open storage, probe and set up the sandbox, build the executor and the
/// run registry.
pub async fn build(config: Config) -> anyhow::Result<Kiln> {
    // the recorder first: what starts in the background (the fork-servers'
    // gauges) records before `serve` runs
    let _ = metrics_handle();
    let data = &config.data_dir;
    std::fs::create_dir_all(data).with_context(|| format!("create data dir {}", data.display()))?;
    let data = data
        .canonicalize()
        .with_context(|| format!("resolve {}", data.display()))?;

    let store = Store::open_with(
        StoreConfig {
            dir: data.join("store"),
            retention: Duration::from_secs(config.retention_hours * 3600),
            budget: config.storage_budget(),
        },
        config.store_backends()?,
    )
    .await
    .context("open store")?;

    let mut sc = SandboxConfig::default();
    if let Some(h) = &config.jail_helper {
        sc.helper = h.clone();
    }
    let work = prepare_work_dir(&config, &data)?;
    sc.root_dir = work.join("jail-root");
    sc.uid_base = config.uid_base;
    // parked warm jails and live kernels (those started ahead too) hold
    // slots of their own, beyond the concurrency
    sc.slots = config.slots();
    // kernel slots get their filesystem only while a kernel holds them
    sc.kernel_slots = config.kernel_slots();
    sc.slots_dir = Some(work.join("slots"));
    sc.workspace_bytes = config.workspace_mb * 1024 * 1024;
    sc.workspace_inodes = config.workspace_files;
    sc.workspace_quota = config.quota_mode()?;
    sc.allow_degraded = config.insecure_allow_degraded_sandbox;
    sc.keep_jails = config.keep_jails;
    if let Some(p) = &config.test_ns_last_pid {
        sc.ns_last_pid = p.clone();
    }
    (sc.cpu_per_run_millis, sc.cpu_all_runs_millis) = config.cpu_millis();
    // the host /etc entries some runtimes read (php.ini, ...), from the language table
    for name in kiln_core::lang::etc_binds() {
        if !sc.etc_binds.iter().any(|b| b == name) {
            sc.etc_binds.push(name.to_owned());
        }
    }
    let images = runtime::jail::configure(&config, &mut sc)?;
    let sandbox =
        Sandbox::new(sc).map_err(|e| anyhow::anyhow!("sandbox cannot be enforced: {e}"))?;

    let ec = ExecConfig {
        limits: config.limits(),
        walk: WalkLimits {
            max_output_files: config.max_output_files,
            max_file_bytes: config.max_output_file_mb * 1024 * 1024,
            max_total_bytes: config.max_run_output_mb * 1024 * 1024,
        },
        egress: build_egress(&config, &store)?,
        access: kiln_core::access::Policy {
            require_identity: config.require_identity,
        },
    };
    let jails = if config.warm_jails > 0 {
        // warm profiles come from the language table; the fork-server
        // (embedded py) starts in the background, on a runtime image inside
        // the image's system (its interpreter, its modules)
        let zygote = config.python_zygote.then(|| ZygoteStart {
            config_dir: zygote_config_dir(&data),
            only: config.python_template_only().unwrap_or(None),
        });
        JailSource::warm(
            sandbox,
            WarmConfig {
                max_total: config.warm_jails,
                max_per_profile: config.warm_per_runtime,
                min_per_profile: config.warm_min,
                decay_after: Duration::from_secs(60),
                limits: config.limits(),
            },
            zygote,
        )
    } else {
        JailSource::cold(sandbox)
    };
    let executor = Executor::new(store.clone(), Arc::new(jails.clone()), ec);
    let mut runs_config = config.runs();
    runs_config.audit = audit::sink(&config.audit_log).context("audit_log")?;
    let runs = Runs::new(Arc::new(executor), runs_config);
    let sessions = Arc::new(FileSessions::new(
        store.clone(),
        Duration::from_secs(config.session_ttl_secs),
    ));
    let kernels =
        (config.max_sessions > 0).then(|| Kernels::new(jails.sandbox().clone(), config.kernels()));
    let projects = kiln_exec::projects::Projects::new(kiln_exec::projects::ProjectsConfig {
        dir: data.join("projects"),
        budget_bytes: config.project_budget_bytes,
    })
    .context("projects dir")?;
    let languages = probe_languages(&images).await;
    let sandboxes = config.sandboxes().map(kiln_exec::sandboxes::Sandboxes::new);
    Ok(Kiln {
        config,
        store,
        jails,
        runs,
        sessions,
        kernels,
        projects,
        sandboxes,
        languages,
        images,
    })
}

/// Where run workspaces and the jail root's mount point live (`work_dir`):
/// as configured; else the data dir `data` (absolute) when every directory
/// down to it is searchable by others, since the jails run as unprivileged
/// host uids that must resolve paths there; else a directory of its own
/// under `/var/lib/kiln`, named after the data dir's path, so that a data
/// dir below a closed directory (`/root` is 0700 on Debian) still works.
pub fn work_dir(config: &Config, data: &Path) -> PathBuf {
    if let Some(w) = &config.work_dir {
        return w.clone();
    }
    if searchable_by_others(data) {
        return data.to_path_buf();
    }
    use sha2::Digest;
    let digest = hex::encode(sha2::Sha256::digest(data.as_os_str().as_bytes()));
    PathBuf::from("/var/lib/kiln").join(format!("work-{}", &digest[..16]))
}

/// Every existing directory from `/` down to `path` has the others' search bit.
fn searchable_by_others(path: &Path) -> bool {
    path.ancestors()
        .filter_map(|p| std::fs::metadata(p).ok())
        .all(|m| m.mode() & 0o001 != 0)
}

/// [`work_dir`], created when it is Kiln's own fallback (searchable, whatever
/// the umask), with a warning saying why it is not the data dir.
fn prepare_work_dir(config: &Config, data: &Path) -> anyhow::Result<PathBuf> {
    let work = work_dir(config, data);
    if config.work_dir.is_none() && work != data {
        let closed = data
            .ancestors()
            .filter_map(|p| Some((p, std::fs::metadata(p).ok()?)))
            .filter(|(_, m)| m.mode() & 0o001 == 0)
            .map(|(p, _)| p.display().to_string())
            .last()
            .unwrap_or_default();
        warn!(
            data_dir = %data.display(),
            closed_dir = %closed,
            work_dir = %work.display(),
            "the jails' uids cannot search {closed}, so run workspaces live in {} (stored files stay in the data dir); \
             to keep them together: chmod o+x {closed}, or choose another data dir, or set work_dir",
            work.display()
        );
        for dir in [Path::new("/var/lib/kiln"), work.as_path()] {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                .with_context(|| format!("chmod 0755 {}", dir.display()))?;
        }
    }
    Ok(work)
}

/// The egress gateway, when services are configured: `${VAR}` credentials
/// from Kiln's environment (an unset one refuses the start), calls recorded
/// in the store's ledger.
fn build_egress(config: &Config, store: &Store) -> anyhow::Result<Option<kiln_egress::Gateway>> {
    let services = config.all_services()?;
    if services.is_empty() {
        info!("egress services: none configured (sandboxed code has no network)");
        return Ok(None);
    }
    let registry = kiln_egress::Registry::build(&services, &|name| std::env::var(name).ok())
        .context("egress services")?;
    for s in registry.iter() {
        info!(
            service = %s.name,
            upstream = %s.upstream,
            methods = ?s.methods.iter().map(|m| m.as_str()).collect::<Vec<_>>(),
            paths = ?s.paths.iter().map(|p| p.as_str()).collect::<Vec<_>>(),
            rate = ?s.rate().map(|r| r.to_string()),
            private_upstream = s.allow_private,
            "egress service enabled"
        );
    }
    let ledger = Arc::new(StoreLedger(store.clone()));
    Ok(Some(kiln_egress::Gateway::new(
        registry,
        config.egress_settings(),
        ledger,
    )))
}

/// The gateway's ledger in the store's `egress_calls` table.
struct StoreLedger(Store);

impl kiln_egress::Ledger for StoreLedger {
    fn record(
        &self,
        call: kiln_egress::CallRecord,
    ) -> futures::future::BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            self.0
                .record_egress_call(&call)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// The process-wide Prometheus recorder (installed once): latencies as
/// histograms, every series described ([`kiln_api::telemetry`]).
pub fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Suffix("_seconds".to_owned()),
                    &kiln_api::telemetry::BUCKETS,
                )
                .ok()?
                .install_recorder()
                .ok()?;
            kiln_api::telemetry::describe(env!("CARGO_PKG_VERSION"));
            Some(handle)
        })
        .clone()
}

/// The names a browser may reach the server under: `allowed_hosts` and
/// the host of `advertise_url` (other nodes forward to it by that name).
fn host_policy(
    config: &config::Config,
    listen: Option<std::net::SocketAddr>,
) -> kiln_api::origin::HostPolicy {
    let mut hosts = kiln_api::origin::HostPolicy::new(listen, &config.allowed_hosts);
    if let Some(host) = config
        .advertise_url
        .as_deref()
        .and_then(|u| reqwest::Url::parse(u.trim()).ok())
        .and_then(|u| u.host_str().map(str::to_owned))
    {
        hosts.allow(&host);
    }
    hosts
}

/// Serve until `shutdown` is cancelled. Then stop accepting, let running
/// executions (attached and detached) finish for up to
/// `shutdown_grace_secs`, kill the rest.
pub async fn serve(
    kiln: Kiln,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let auth = kiln.config.auth_mode()?;
    let api_config = kiln_api::ApiConfig {
        auth: match auth {
            Auth::None => kiln_api::AuthMode::None,
            Auth::ApiKey => kiln_api::AuthMode::ApiKey,
            Auth::Jwt => kiln_api::AuthMode::Jwt,
            Auth::ApiKeyOrJwt => kiln_api::AuthMode::ApiKeyOrJwt,
        },
        jwt: kiln.config.jwt_verifier()?.map(std::sync::Arc::new),
        api_key: kiln.config.api_key.clone(),
        require_identity: kiln.config.require_identity,
        max_upload_bytes: kiln.config.max_upload_mb * 1024 * 1024,
        max_batch_files: kiln.config.max_batch_files,
        max_run_files: kiln.config.max_run_files,
        metrics_require_key: kiln.config.metrics_require_key,
        max_json_bytes: usize::try_from(kiln.config.max_json_mb * 1024 * 1024)
            .unwrap_or(usize::MAX),
        rate_limits: kiln.config.rate_rules()?,
        console: kiln.config.console,
        ptc: kiln.config.ptc_settings(),
        runtime_session_mode: kiln.config.runtime_session_mode()?,
        runtime_session_live: kiln.config.runtime_session_live,
        seed004_api: kiln.config.seed004_api,
        runtime_api_prefix: kiln.config.runtime_api_prefix(),
        url_fetch: kiln.config.url_fetch(),
        hosts: host_policy(&kiln.config, listener.local_addr().ok()),
        ..kiln_api::ApiConfig::default()
    };
    let conn_limits = kiln_api::server::ConnLimits {
        header_timeout: Duration::from_secs(kiln.config.http_header_timeout_secs.max(1)),
        body_idle_timeout: Duration::from_secs(kiln.config.http_body_idle_timeout_secs.max(1)),
        max_connections: kiln.config.max_connections.max(1),
    };
    let stop_new = CancellationToken::new();
    let runs = kiln.runs.clone();
    let cluster = match kiln.config.nodes()? {
        Some((id, url, secret, dead_after)) => Some(Arc::new(
            kiln_api::cluster::Cluster::new(id, url, secret, dead_after)
                .context("node-to-node client")?,
        )),
        None => None,
    };
    let rates = if kiln.config.shared_rate_limits()? {
        info!("rate limits: counted in the shared database");
        kiln_api::rate::RateLimits::shared(api_config.rate_limits, kiln.store.clone())
    } else {
        kiln_api::rate::RateLimits::new(api_config.rate_limits)
    };
    let state = kiln_api::AppState {
        store: kiln.store.clone(),
        runs: runs.clone(),
        sessions: Arc::clone(&kiln.sessions),
        rates: Arc::new(rates),
        ptc: Arc::new(kiln_api::programmatic::Programmatic::new(
            api_config.ptc.clone(),
        )),
        config: Arc::new(api_config),
        shutdown: stop_new.clone(),
        cluster: cluster.clone(),
        envs: kiln_api::Environments {
            projects: Some(kiln.projects.clone()),
            sandboxes: kiln.sandboxes.clone(),
            ..kiln_api::Environments::default()
        },
        operator: kiln_api::Operator {
            metrics: metrics_handle(),
            ops: Some(Arc::new(ops::SandboxOps(kiln.jails.clone()))),
            ..kiln_api::Operator::new(kiln_api::HealthInfo {
                version: env!("CARGO_PKG_VERSION").to_owned(),
                languages: kiln.languages.clone(),
                runtime_image: kiln.images.default.as_ref().map(image_health),
            })
        },
    }
    .with_kernels(kiln.kernels.clone());
    let sampler = kiln_api::admin::spawn_sampler(state.clone(), shutdown.clone());
    let heartbeat = match &cluster {
        Some(c) => {
            // the first heartbeat before the first request: a node others
            // cannot find would answer their forwarded requests as lost
            kiln.store
                .node_heartbeat(
                    &c.node_id,
                    &c.advertise_url,
                    false,
                    kiln_api::cluster::now_ms(),
                )
                .await
                .context("record this node in the shared database")?;
            info!(node_id = %c.node_id, advertise_url = %c.advertise_url,
                dead_after_s = c.dead_after.as_secs(), "one of several nodes");
            Some(spawn_heartbeat(
                kiln.store.clone(),
                Arc::clone(c),
                stop_new.clone(),
                shutdown.clone(),
            ))
        }
        None => None,
    };
    let app = kiln_api::router(state);

    // garbage collection of expired files, and of idle seed-000 sessions
    let gc_store = kiln.store.clone();
    let gc_sessions = Arc::clone(&kiln.sessions);
    let gc_every = Duration::from_secs(kiln.config.gc_interval_secs.max(1));
    let sweep_every = (kiln.sessions.ttl() / 4).clamp(Duration::from_secs(1), gc_every);
    let gc_stop = shutdown.clone();
    let gc_projects = kiln.projects.clone();
    let project_idle = (kiln.config.project_idle_ttl_secs > 0)
        .then(|| Duration::from_secs(kiln.config.project_idle_ttl_secs));
    let ledger_keep = Duration::from_secs(kiln.config.egress_ledger_days * 86_400);
    let gc = tokio::spawn(async move {
        let mut last_gc: Option<tokio::time::Instant> = None;
        loop {
            if last_gc.is_none_or(|t| t.elapsed() >= gc_every) {
                last_gc = Some(tokio::time::Instant::now());
                match gc_store.gc().await {
                    Ok(r) if r.objects + r.sessions + r.orphan_blobs > 0 => {
                        info!(
                            objects = r.objects,
                            sessions = r.sessions,
                            orphans = r.orphan_blobs,
                            "expired files collected"
                        );
                    }
                    Ok(_) => {}
                    Err(e) => error!(error = %e, "garbage collection failed"),
                }
                // a project's idle time is counted in days: once per collection
                if let Some(idle) = project_idle {
                    match gc_projects.sweep(idle).await {
                        Ok(0) => {}
                        Ok(n) => info!(projects = n, "idle projects removed"),
                        Err(e) => error!(error = %e, "removing idle projects failed"),
                    }
                }
            }
            match gc_sessions.sweep().await {
                Ok(0) => {}
                Ok(n) => info!(files = n, "idle sessions emptied"),
                Err(e) => error!(error = %e, "emptying idle sessions failed"),
            }
            let cutoff = std::time::SystemTime::now()
                .checked_sub(ledger_keep)
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(0));
            match gc_store.prune_egress_calls(cutoff).await {
                Ok(0) => {}
                Ok(n) => info!(calls = n, "old egress ledger entries removed"),
                Err(e) => error!(error = %e, "pruning the egress ledger failed"),
            }
            tokio::select! {
                () = tokio::time::sleep(sweep_every) => {}
                () = gc_stop.cancelled() => return,
            }
        }
    });

    // idle and too-old kernels are closed within a second of expiring
    let kernel_sweep = kiln.kernels.clone().map(|kernels| {
        let stop = shutdown.clone();
        tokio::spawn(async move {
            loop {
                let n = kernels.sweep().await;
                if n > 0 {
                    info!(sessions = n, "expired sessions closed");
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = stop.cancelled() => return,
                }
            }
        })
    });

    // idle bridge sandboxes are removed with their projects
    let sandbox_sweep = kiln.sandboxes.clone().map(|sandboxes| {
        let (stop, projects) = (shutdown.clone(), kiln.projects.clone());
        tokio::spawn(async move {
            loop {
                for s in sandboxes.sweep() {
                    match projects.delete(s.creator(), &s.project_name()).await {
                        Ok(_) => info!(sandbox = %s.id().as_str(), "idle sandbox removed"),
                        Err(e) => warn!(sandbox = %s.id().as_str(), error = %e, "removing an idle sandbox's project failed"),
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(5)) => {}
                    () = stop.cancelled() => return,
                }
            }
        })
    });

    let grace = Duration::from_secs(kiln.config.shutdown_grace_secs);
    // when the shutdown began (its grace period ends `grace` later)
    let began: Arc<OnceLock<tokio::time::Instant>> = Arc::default();
    let graceful = {
        let shutdown = shutdown.clone();
        let stop_new = stop_new.clone();
        let runs = runs.clone();
        let began = Arc::clone(&began);
        async move {
            shutdown.cancelled().await;
            let _ = began.set(tokio::time::Instant::now());
            info!(
                "draining: no new executions (503, /health says draining), waiting for running ones"
            );
            stop_new.cancel();
            runs.close();
            // keep the port open while runs finish, so that a balancer reads
            // `draining` and new requests get a 503 rather than a refused
            // connection; then stop accepting
            let _ = runs.wait_idle(grace).await;
        }
    };
    let server = kiln_api::server::serve(listener, app, conn_limits, graceful);
    tokio::pin!(server);
    let result = tokio::select! {
        r = &mut server => {
            // requests are answered; detached runs may still be going
            let left = began
                .get()
                .map(|t| (*t + grace).saturating_duration_since(tokio::time::Instant::now()))
                .unwrap_or_default();
            if !runs.wait_idle(left).await {
                warn!(grace_secs = grace.as_secs(), runs = runs.active(),
                    "grace period over: killing running executions");
                runs.kill_all();
            }
            r.context("serve")
        }
        () = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {
            warn!(grace_secs = grace.as_secs(), runs = runs.active(),
                "grace period over: killing running executions");
            runs.kill_all();
            // handlers now finish quickly with their runs killed
            match tokio::time::timeout(Duration::from_secs(10), &mut server).await {
                Ok(r) => r.context("serve"),
                Err(_) => Ok(()),
            }
        }
    };
    gc.abort();
    sampler.abort();
    if let Some(h) = heartbeat {
        h.abort();
    }
    if let Some(c) = &cluster {
        // what this node owned is lost now, not when its heartbeat is missed
        if let Err(e) = kiln.store.node_leave(&c.node_id).await {
            warn!(error = %e, "could not remove this node from the shared database");
        }
    }
    if let Some(t) = kernel_sweep {
        t.abort();
    }
    if let Some(t) = sandbox_sweep {
        t.abort();
    }
    if let Some(kernels) = &kiln.kernels {
        kernels.close_all().await;
    }
    runs.wait_idle(Duration::from_secs(10)).await;
    if let Some(pool) = kiln.jails.warm_pool() {
        pool.shutdown().await;
    }
    // unmount the slots' workspace filesystems now, in order, not at exit
    kiln.jails.sandbox().shutdown();
    info!("stopped");
    result
}

/// Several nodes: this node's heartbeat (a fifth of `dead_after` apart,
/// `draining` once `stop_new` fires), and every minute the removal of nodes
/// silent for an hour, of owner rows older than a day or whose node is
/// gone, and of rate-limit keys whose bucket is full again.
fn spawn_heartbeat(
    store: Store,
    cluster: Arc<kiln_api::cluster::Cluster>,
    stop_new: CancellationToken,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    const HOUR_MS: i64 = 3_600_000;
    tokio::spawn(async move {
        let every = (cluster.dead_after / 5).max(Duration::from_millis(500));
        let mut last_prune = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = stop.cancelled() => return,
            }
            let now = kiln_api::cluster::now_ms();
            if let Err(e) = store
                .node_heartbeat(
                    &cluster.node_id,
                    &cluster.advertise_url,
                    stop_new.is_cancelled(),
                    now,
                )
                .await
            {
                warn!(error = %e, "heartbeat failed");
            }
            if last_prune.elapsed() >= Duration::from_secs(60) {
                last_prune = tokio::time::Instant::now();
                match store.prune_nodes(now - HOUR_MS, now - 24 * HOUR_MS).await {
                    Ok(0) => {}
                    Ok(n) => info!(owners = n, "owner rows of closed or lost things removed"),
                    Err(e) => warn!(error = %e, "pruning nodes failed"),
                }
                if let Err(e) = store.prune_rates(now.saturating_mul(1000)).await {
                    warn!(error = %e, "pruning rate limits failed");
                }
            }
        }
    })
}

/// Raises the soft limit of open files to the hard one: every live kernel
/// holds a few descriptors in the server (its pipes and process handle), so
/// a thousand kernels need more than the 1,024 a service usually starts
/// with (systemd's hard limit is 524,288). Jails set their own limit.
fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => info!(from = soft, to = hard, "open files limit raised"),
            Err(e) => warn!(error = %e, soft, hard, "open files limit not raised"),
        },
        Ok((soft, _)) => info!(limit = soft, "open files limit"),
        Err(e) => warn!(error = %e, "open files limit unknown"),
    }
}

/// `kiln serve`: log setup, build, bind, serve until SIGTERM/SIGINT.
pub async fn serve_until_signal(config: Config) -> anyhow::Result<()> {
    init_logging(&config.log_format);
    let addr = config.listen_addr()?;
    log_startup(&config)?;
    raise_open_files();
    match kiln_sandbox::own_mount_namespace() {
        Some(Ok(())) => info!(
            "mount namespace: Kiln's own (its slot filesystems vanish with its last process, even after SIGKILL)"
        ),
        Some(Err(e)) => warn!(error = %e,
            "mount namespace: the host's (a killed server leaves its slot filesystems mounted until the next start)"),
        None => {}
    }
    // the port first: a busy one is reported before the sandbox and the
    // languages start, naming who holds it
    let listener = match TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            let finding = doctor::judge_listen(addr, &doctor::bind_failure(addr, &e));
            anyhow::bail!(
                "cannot listen: {}{}",
                finding.message,
                finding.fix.map(|f| format!("; {f}")).unwrap_or_default()
            );
        }
    };
    // kernel slots are mounted only while a kernel holds them
    let slots = config.max_concurrency + config.warm_jails;
    let kiln = build(config).await?;
    match &kiln.images.default {
        Some(i) => info!(image = %i.id, digest = i.digest.as_deref().unwrap_or("-"),
            root = %i.root.display(), "jails run from a runtime image"),
        None => info!("jails run from the host's /usr (runtime_image = \"host\")"),
    }
    for (lang, i) in &kiln.images.by_language {
        match i {
            Some(i) => info!(lang = lang.name(), image = %i.id,
                digest = i.digest.as_deref().unwrap_or("-"), root = %i.root.display(),
                "this language's jails run from their own runtime image (runtime_images)"),
            None => info!(
                lang = lang.name(),
                "this language's jails run from the host's /usr (runtime_images)"
            ),
        }
    }
    for l in &kiln.languages {
        let image = l.image.as_ref().map_or("host", |i| i.id.as_str());
        match (&l.version, &l.reason) {
            (Some(v), _) => info!(lang = %l.name, version = %v, image, "language available"),
            (None, r) => {
                warn!(lang = %l.name, reason = r.as_deref().unwrap_or("unknown"), image, "language unavailable")
            }
        }
    }
    info!(report = %one_line(&kiln.jails.sandbox().report().to_string()), "sandbox ready");
    info!("live kernels: {}", kiln.config.sessions_sizing());
    // Every jail copies, then tears down, each mount the server sees (its
    // slot filesystems among them): the same judgement as `kiln doctor`'s.
    let mounts = doctor::judge_mounts(
        kiln_sandbox::visible_mounts().saturating_sub(slots as usize),
        slots,
    );
    match mounts.level {
        doctor::Level::Ok => info!("mount table: {}", mounts.message),
        _ => warn!(
            fix = mounts.fix.as_deref().unwrap_or_default(),
            "mount table: {}", mounts.message
        ),
    }
    let local = listener.local_addr()?;
    info!(addr = %local, "kiln listening (LibreChat: LIBRECHAT_CODE_BASEURL=http://<host>:<port>/v1)");
    if kiln.config.console {
        info!(url = %format!("http://{local}{}", kiln_api::console::PATH), "web console");
    }

    let shutdown = CancellationToken::new();
    let s = shutdown.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        s.cancel();
    });
    serve(kiln, listener, shutdown).await
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        error!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received"),
        _ = int.recv() => info!("SIGINT received"),
    }
}

fn log_startup(config: &Config) -> anyhow::Result<()> {
    let addr = config.listen_addr()?;
    match config.auth_mode()? {
        Auth::None if !addr.ip().is_loopback() => warn!(
            listen = %addr,
            "AUTH IS OFF and Kiln listens beyond loopback: anyone who can reach this port can run code. \
             Keep the port on a network only LibreChat reaches (a compose network with no published port, \
             or listen on 127.0.0.1), or turn on LibreChat's CodeAPI JWT and KILN_AUTH=jwt. \
             A shared key (KILN_API_KEY) only works with LibreChat builds that send one: current LibreChat \
             sends none, and every call would get 401 (docs/librechat.md)."
        ),
        Auth::None => info!("auth: none (loopback only)"),
        Auth::ApiKey => info!("auth: api-key (X-API-Key or Authorization: Bearer)"),
        Auth::Jwt => info!("auth: jwt (LibreChat's CodeAPI token as Authorization: Bearer)"),
        Auth::ApiKeyOrJwt => info!("auth: api-key or jwt"),
    }
    let l = config.limits();
    info!(
        memory_mb = config.memory_mb, pids = l.pids, timeout_s = config.timeout_secs,
        cpu_s = config.cpu_secs, stdout = l.stdout_bytes, stderr = l.stderr_bytes,
        concurrency = config.max_concurrency, retention_h = config.retention_hours,
        data_dir = %config.data_dir.display(), "limits"
    );
    Ok(())
}

/// Install the tracing subscriber once (`RUST_LOG` overrides the level).
/// `test` routes output through the test harness's capture.
pub fn init_logging(format: &str) {
    init_logging_with(format, "info", false);
}

pub(crate) fn init_logging_with(format: &str, default_level: &str, test: bool) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    // colours only for a person at a terminal: a file, a pipe or a
    // container's log collector gets plain text
    let ansi = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_target(false);
    let _ = match (format, test) {
        ("json", _) => builder.json().try_init(),
        (_, true) => builder.with_test_writer().try_init(),
        _ => builder.try_init(),
    };
}

/// A multi-line report as one line (`a; b; c`), so that one log record
/// stays on one line of the log.
pub fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// How `/health` names an image.
fn image_health(i: &runtime::jail::ImageRef) -> kiln_api::RuntimeImageHealth {
    kiln_api::RuntimeImageHealth {
        id: i.id.clone(),
        digest: i.digest.clone(),
    }
}

/// Each language's availability and version: its binaries in the runtime image its jails
/// run from (probed in a chroot of it), or on the host for the host's `/usr`.
pub async fn probe_languages(images: &runtime::jail::Images) -> Vec<kiln_api::LanguageHealth> {
    let mut out = Vec::new();
    for lang in Language::all() {
        let spec = lang.spec();
        let own = images.of(lang);
        let image = own.map(|i| i.root.as_path());
        let missing: Vec<&str> = spec
            .requires
            .iter()
            .copied()
            .filter(|p| !kiln_sandbox::source_of(image, Path::new(p)).exists())
            .collect();
        out.push(
            if !missing.is_empty() {
                kiln_api::LanguageHealth::unavailable(
                    spec,
                    format!("not installed: {}", missing.join(", ")),
                )
            } else {
                match probe_version(spec.version, image).await {
                    Some(v) => kiln_api::LanguageHealth::available(spec, Some(v)),
                    None => kiln_api::LanguageHealth::unavailable(spec, "version probe failed"),
                }
            }
            .on_image(own.map(image_health)),
        );
    }
    out
}

async fn probe_version(argv: &[&str], image: Option<&Path>) -> Option<String> {
    let mut cmd = match image {
        Some(root) => {
            // in a chroot of the image with a /proc of its own (java and go read
            // /proc/self/exe) and a /tmp of its own (java leaves hsperfdata there: the
            // shared image is never written), in a mount namespace that goes with them;
            // absolute paths: the probe's PATH (/usr/bin:/bin) is the one programs are
            // looked up in
            let mut c = tokio::process::Command::new("/usr/bin/unshare");
            c.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
                .arg(
                    "mount -t proc proc \"$0/proc\" && mount -t tmpfs tmpfs \"$0/tmp\" \
                     && exec /usr/sbin/chroot \"$0\" \"$@\"",
                )
                .arg(root)
                .args(argv);
            c
        }
        None => {
            let (prog, args) = argv.split_first()?;
            let mut c = tokio::process::Command::new(prog);
            c.args(args);
            c
        }
    };
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        cmd.env_clear().env("PATH", "/usr/bin:/bin").output(),
    )
    .await
    .ok()?
    .ok()?;
    let text = if out.stdout.iter().any(|b| !b.is_ascii_whitespace()) {
        out.stdout
    } else {
        out.stderr
    };
    String::from_utf8_lossy(&text)
        .lines()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_owned())
}

/// `kiln doctor`: print what the host supports and what the configuration
/// gets wrong ([`doctor`]). Non-zero when the sandbox cannot be enforced or
/// a check fails.
pub fn doctor(config: &Config) -> ExitCode {
    let report = kiln_sandbox::probe_host();
    println!("Kiln {} doctor", env!("CARGO_PKG_VERSION"));
    println!("{report}");
    let mut image = (None, None);
    let languages = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(async {
            let mut sc = SandboxConfig::default();
            match runtime::jail::configure(config, &mut sc) {
                Ok(images) => {
                    match &images.default {
                        Some(i) => {
                            println!("runtime image: {}", describe_image(i));
                            image.0 = Some(i.id.clone());
                        }
                        None => println!("runtime image: none (jails run from the host's /usr)"),
                    }
                    for (lang, i) in &images.by_language {
                        let what = i
                            .as_ref()
                            .map_or_else(|| "none (the host's /usr)".to_owned(), describe_image);
                        println!("  {:<5} runs from its own: {what}", lang.name());
                    }
                    probe_languages(&images).await
                }
                Err(e) => {
                    println!("runtime image: FAILED {e:#}");
                    image.1 = Some(format!("{e:#}"));
                    Vec::new()
                }
            }
        }),
        Err(e) => {
            println!("languages: cannot probe ({e})");
            Vec::new()
        }
    };
    if !languages.is_empty() {
        println!("languages:");
    }
    for l in &languages {
        let image = l.image.as_ref().map_or("host", |i| i.id.as_str());
        match (&l.version, &l.reason) {
            (Some(v), _) => println!("  {:<5} ok      {v}  [{image}]", l.name),
            (None, r) => println!(
                "  {:<5} MISSING {}  [{image}]",
                l.name,
                r.as_deref().unwrap_or("")
            ),
        }
    }
    let mut findings = doctor::checks(config, &report, &languages);
    if image.1.is_some() {
        // no image, no languages probed: "all 0 languages" would read as a pass
        findings.retain(|f| f.check != "runtimes");
    }
    let mut judged = doctor::judge_image(image.0.as_deref(), image.1.as_deref());
    // languages runtime_images puts on the host's /usr while the rest run from an image
    let on_host: Vec<&str> = languages
        .iter()
        .filter(|l| l.image.is_none())
        .map(|l| l.name.as_str())
        .collect();
    if image.0.is_some() && !on_host.is_empty() {
        judged.message = format!(
            "{}, except the jails of {} (runtime_images: the host's /usr)",
            judged.message,
            on_host.join(", ")
        );
    }
    findings.insert(0, judged);
    println!("checks:");
    for f in &findings {
        println!("{f}");
    }
    let failed = findings
        .iter()
        .filter(|f| f.level == doctor::Level::Fail)
        .count();
    let warned = findings
        .iter()
        .filter(|f| f.level == doctor::Level::Warn)
        .count();
    let sandbox = if report.enforceable() {
        "enforceable"
    } else {
        "NOT enforceable"
    };
    println!("summary: sandbox {sandbox}; {failed} check(s) failed, {warned} warning(s)");
    if report.enforceable() && failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// An image as `kiln doctor` names it: id, digest and root.
fn describe_image(i: &runtime::jail::ImageRef) -> String {
    format!(
        "{} (digest {}) at {}",
        i.id,
        i.digest.as_deref().unwrap_or("-"),
        i.root.display()
    )
}

/// `kiln health`: `GET /health` from the server at the configured listen
/// address (a wildcard address is asked on loopback); success when it
/// answers 200 within `timeout`. A few lines of HTTP/1.0 over a socket, so
/// container images need no curl.
pub fn health_check(config: &Config, timeout: Duration) -> ExitCode {
    use std::io::{Read, Write};
    let mut addr = match config.listen_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kiln health: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let answer = (|| -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        // the address as Host: a keyless server answers addresses, not
        // names it was not told (origin.rs)
        s.write_all(format!("GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
        let mut head = Vec::new();
        s.take(4096).read_to_end(&mut head)?;
        Ok(String::from_utf8_lossy(&head)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned())
    })();
    match answer {
        Ok(status) if status.split_whitespace().nth(1) == Some("200") => {
            println!("kiln health: {addr} answers {status}");
            ExitCode::SUCCESS
        }
        Ok(status) => {
            eprintln!("kiln health: {addr} answers {status:?}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!(
                "kiln health: {addr}: {e} (is `kiln serve` running there? health asks the address \
                 `serve` was given: pass the same --listen or --config, or set KILN_LISTEN)"
            );
            ExitCode::FAILURE
        }
    }
}

/// What `kiln exec` runs: the language, the source file, input files to
/// place in `/mnt/data`, and where to save the outputs (`--out`).
#[derive(Clone, Copy)]
pub struct ExecFiles<'a> {
    pub lang: &'a str,
    pub file: &'a Path,
    pub inputs: &'a [PathBuf],
    pub out: Option<&'a Path>,
}

impl ExecFiles<'_> {
    /// The language, or an error that lists the names there are.
    pub fn language(&self) -> anyhow::Result<Language> {
        Language::resolve(self.lang).ok_or_else(|| {
            let names: Vec<&str> = Language::all().map(|l| l.name()).collect();
            anyhow::anyhow!(
                "unsupported language {:?}; use one of {} (or an alias such as python, node, golang)",
                self.lang,
                names.join(", ")
            )
        })
    }

    /// The source code.
    pub fn code(&self) -> anyhow::Result<String> {
        std::fs::read_to_string(self.file).with_context(|| format!("read {}", self.file.display()))
    }

    /// Each input file: its name in `/mnt/data` (the file's own name) and
    /// its bytes.
    pub fn input_files(&self) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let mut out: Vec<(String, Vec<u8>)> = Vec::new();
        for p in self.inputs {
            let name = p
                .file_name()
                .and_then(|n| n.to_str())
                .with_context(|| format!("--file {}: no usable file name", p.display()))?
                .to_owned();
            if out.iter().any(|(n, _)| *n == name) {
                anyhow::bail!("--file: two input files are named {name:?}");
            }
            let bytes = std::fs::read(p).with_context(|| format!("read {}", p.display()))?;
            out.push((name, bytes));
        }
        Ok(out)
    }

    /// Where the output `name` (relative to `/mnt/data`) is saved, if
    /// `--out` was given; a name that would leave the directory is refused.
    pub fn output_path(&self, name: &str) -> anyhow::Result<Option<PathBuf>> {
        let Some(dir) = self.out else {
            return Ok(None);
        };
        let rel = Path::new(name);
        if rel.as_os_str().is_empty()
            || !rel
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
        {
            anyhow::bail!("output file {name:?} is not a relative path below the output directory");
        }
        let dest = dir.join(rel);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("create {}", parent.display()))?;
        }
        Ok(Some(dest))
    }
}

/// Reports one output file: where it was saved, or only its name.
pub(crate) fn report_output(name: &str, saved: Option<&Path>) {
    match saved {
        Some(p) => eprintln!("[kiln] output file: {name} (saved to {})", p.display()),
        None => eprintln!("[kiln] output file: {name} (not saved; use --out DIR)"),
    }
}

/// `kiln exec`: run one file through the same sandbox, print its output as
/// it is written, save the outputs in `--out`, exit with its exit code.
pub async fn exec_file(
    mut config: Config,
    job: ExecFiles<'_>,
    args: Vec<String>,
) -> anyhow::Result<ExitCode> {
    init_logging_with("text", "warn", false);
    let lang = job.language()?;
    let code = job.code()?;
    let mut files = Vec::new();
    for (name, content) in job.input_files()? {
        let name = kiln_core::RelPath::parse(&name)
            .map_err(|e| anyhow::anyhow!("--file {name:?}: {e}"))?;
        files.push(kiln_exec::InputFile::Inline { name, content });
    }
    let tmp = std::env::temp_dir().join(format!("kiln-exec-{}", std::process::id()));
    config.data_dir = tmp.clone();
    // one run: a warm pool or fork-server would only add start-up work
    config.warm_jails = 0;
    let kiln = build(config).await?;
    let result = run_local(
        &kiln,
        ExecRequest {
            lang,
            code,
            args,
            files,
            timeout_ms: None,
            outputs: Outputs::NewSession,
            project: None,
        },
        job,
    )
    .await;
    drop(kiln);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Runs `req` on `kiln`'s registry, printing its output as it comes and
/// saving its outputs (before the caller removes the temporary store).
async fn run_local(kiln: &Kiln, req: ExecRequest, job: ExecFiles<'_>) -> anyhow::Result<ExitCode> {
    let caller = Caller::identified("local", "cli");
    // the program's output is printed as it writes it (the run's events),
    // then whatever the result holds beyond that (a compile step's output)
    let mut streamed = [String::new(), String::new()];
    let result = match kiln.runs.start(caller, req, StartOptions::default()) {
        Ok(watch) => {
            let mut events = watch.subscribe();
            let mut outcome = None;
            while let Some(ev) = events.next().await {
                match ev {
                    RunEvent::Output { stream, text } => {
                        write_through(stream, &text);
                        streamed[stream as usize].push_str(&text);
                    }
                    RunEvent::Done(o) => outcome = Some((*o).clone()),
                    _ => {}
                }
            }
            outcome.unwrap_or_else(|| {
                Err(kiln_exec::ExecError::Internal(
                    "run ended without an outcome".into(),
                ))
            })
        }
        Err(e) => Err(e),
    };
    let r = result.map_err(|e| anyhow::anyhow!("execution failed: {e}"))?;
    for (stream, full) in [(Stream::Stdout, &r.stdout), (Stream::Stderr, &r.stderr)] {
        if let Some(rest) = full.strip_prefix(streamed[stream as usize].as_str()) {
            write_through(stream, rest);
        }
    }
    for f in &r.files {
        let dest = job.output_path(&f.name)?;
        if let Some(dest) = &dest {
            let meta = kiln
                .store
                .object(&f.storage_session_id, &f.id)
                .await
                .context("look up an output file")?
                .with_context(|| format!("output file {} is not in the store", f.name))?;
            kiln.store
                .copy_to(&meta, dest)
                .await
                .with_context(|| format!("save {}", dest.display()))?;
        }
        report_output(&f.name, dest.as_deref());
    }
    Ok(match r.exit {
        kiln_core::ExitStatus::Code(c) => ExitCode::from(c.clamp(0, 255) as u8),
        kiln_core::ExitStatus::Signal(s) => ExitCode::from((128 + s).clamp(0, 255) as u8),
    })
}

/// Writes `text` to our stdout or stderr at once.
pub(crate) fn write_through(stream: Stream, text: &str) {
    use std::io::Write as _;
    let _ = match stream {
        Stream::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes()).and_then(|()| out.flush())
        }
        Stream::Stderr => std::io::stderr().lock().write_all(text.as_bytes()),
    };
}

/// Where the fork-server's matplotlib writes its config and font cache.
/// The path stays in the memory of every warm program (the interpreter's
/// environment was built from it), so it must not name the deployment's
/// layout: a fixed, install-independent cache directory; the data dir
/// only when that cannot be made (an unprivileged development run).
fn zygote_config_dir(data: &std::path::Path) -> std::path::PathBuf {
    let neutral = std::path::PathBuf::from("/var/cache/kiln/mpl");
    match std::fs::create_dir_all(&neutral) {
        Ok(()) => neutral,
        Err(e) => {
            tracing::warn!(error = %e, dir = %neutral.display(),
                "the fork-server's matplotlib dir falls back to the data dir (its path is then visible to warm programs)");
            data.join("zygote").join("mpl")
        }
    }
}
