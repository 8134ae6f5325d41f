//! Kiln as a library: wiring of store, sandbox, executor and HTTP router,
//! the serve loop with graceful shutdown, and the `doctor` and `exec`
//! commands. `main.rs` is a thin CLI over this; integration tests start the
//! same server through [`testing`].

pub mod config;
pub mod testing;

use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use config::{Auth, Config};
use kiln_core::{Language, Principal};
use kiln_exec::{ExecConfig, ExecRequest, Executor, WalkLimits};
use kiln_sandbox::{ParkMode, ParkSpec, Sandbox, SandboxConfig, WarmConfig, WarmPool};
use kiln_store::{Store, StoreConfig};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Everything a running server holds.
pub struct Kiln {
    pub config: Config,
    pub store: Store,
    pub executor: Executor,
    pub languages: Vec<kiln_api::LanguageHealth>,
}

/// Open storage, probe and set up the sandbox, build the executor.
pub async fn build(config: Config) -> anyhow::Result<Kiln> {
    let data = &config.data_dir;
    std::fs::create_dir_all(data).with_context(|| format!("create data dir {}", data.display()))?;
    let data = data
        .canonicalize()
        .with_context(|| format!("resolve {}", data.display()))?;

    let store = Store::open(StoreConfig {
        dir: data.join("store"),
        retention: Duration::from_secs(config.retention_hours * 3600),
    })
    .await
    .context("open store")?;

    let mut sc = SandboxConfig::default();
    if let Some(h) = &config.jail_helper {
        sc.helper = h.clone();
    }
    sc.root_dir = data.join("jail-root");
    sc.uid_base = config.uid_base;
    // parked warm jails hold slots of their own, beyond the concurrency
    sc.slots = config.max_concurrency + config.warm_jails;
    sc.slots_dir = Some(data.join("slots"));
    sc.workspace_bytes = config.workspace_mb * 1024 * 1024;
    sc.workspace_inodes = config.workspace_files;
    sc.workspace_quota = config.quota_mode()?;
    sc.allow_degraded = config.insecure_allow_degraded_sandbox;
    // the host /etc entries some runtimes read (php.ini, ...), from the language table
    for name in kiln_core::lang::etc_binds() {
        if !sc.etc_binds.iter().any(|b| b == name) {
            sc.etc_binds.push(name.to_owned());
        }
    }
    let sandbox =
        Sandbox::new(sc).map_err(|e| anyhow::anyhow!("sandbox cannot be enforced: {e}"))?;

    let ec = ExecConfig {
        limits: config.limits(),
        walk: WalkLimits {
            max_output_files: config.max_output_files,
            max_file_bytes: config.max_output_file_mb * 1024 * 1024,
        },
        concurrency: config.max_concurrency as usize,
        egress: build_egress(&config, &store)?,
    };
    let pool = (config.warm_jails > 0).then(|| start_warm_pool(&sandbox, &config, &data));
    let executor = Executor::new(store.clone(), sandbox, ec, pool);
    let languages = probe_languages().await;
    Ok(Kiln {
        config,
        store,
        executor,
        languages,
    })
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

/// Starts the warm pool: generic jails (`exec`), pre-started node (`js`)
/// when node is installed, and — once the fork-server has finished its
/// preload, in the background — embedded Python (`py`). Until then, or if
/// the fork-server cannot start, `py` runs in generic warm jails.
fn start_warm_pool(sandbox: &Sandbox, config: &Config, data: &std::path::Path) -> WarmPool {
    let limits = config.limits();
    let mut profiles = vec![(kiln_exec::WARM_EXEC.to_owned(), ParkSpec::exec())];
    if let Some(js) = Language::resolve("js")
        && std::path::Path::new("/usr/bin/node").is_file()
    {
        profiles.push((
            js.name().to_owned(),
            ParkSpec {
                mode: ParkMode::Prestart,
                // node runs index.js itself once the preloaded bootstrap
                // has read the go: same main module and stack as a cold run
                argv: vec![
                    "/usr/bin/node".to_owned(),
                    "--require".to_owned(),
                    "/etc/kiln/node_warm.js".to_owned(),
                    "index.js".to_owned(),
                ],
                env: kiln_exec::environment(js, &limits),
                etc_files: vec![(
                    "node_warm.js".to_owned(),
                    kiln_core::lang::warm::NODE_BOOTSTRAP.to_owned(),
                )],
                seccomp_profile: kiln_sandbox::DEFAULT_SECCOMP_PROFILE.to_owned(),
            },
        ));
    }
    let pool = WarmPool::start(
        sandbox.clone(),
        WarmConfig {
            max_total: config.warm_jails,
            max_per_profile: config.warm_per_runtime,
            min_per_profile: config.warm_min,
            decay_after: Duration::from_secs(60),
            limits: limits.clone(),
        },
        profiles,
    );
    if config.python_zygote {
        let (sandbox, pool2, data) = (sandbox.clone(), pool.clone(), data.to_path_buf());
        tokio::spawn(async move {
            match start_python_zygote(&sandbox, &limits, &data).await {
                Ok(info) => {
                    metrics::gauge!("kiln_zygote_rss_bytes").set(info.rss_bytes as f64);
                    info!(
                        pid = info.pid,
                        preload_ms = info.preload_ms,
                        rss_mib = info.rss_bytes / (1024 * 1024),
                        "python fork-server ready: py runs fork a preloaded interpreter"
                    );
                    pool2.add_profile(
                        "py",
                        ParkSpec {
                            mode: ParkMode::Embedded,
                            ..ParkSpec::exec()
                        },
                    );
                }
                Err(e) => {
                    warn!(error = %e, "python fork-server unavailable: py runs start a fresh interpreter")
                }
            }
        });
    }
    pool
}

async fn start_python_zygote(
    sandbox: &Sandbox,
    limits: &kiln_core::Limits,
    data: &std::path::Path,
) -> anyhow::Result<kiln_sandbox::ZygoteInfo> {
    let py = Language::resolve("py").context("the py language")?;
    let libpython = kiln_sandbox::find_libpython(std::path::Path::new("/usr/bin/python3"))?;
    // matplotlib wants a writable config dir while the template imports it;
    // the forks get the jail's own (MPLCONFIGDIR in their environment)
    let mpl = data.join("zygote").join("mpl");
    std::fs::create_dir_all(&mpl).with_context(|| format!("create {}", mpl.display()))?;
    // The variables of a run's environment in the same order, so a fork only
    // changes the values that differ (see `run` in python_template.py):
    // PYTHONPATH empty (CPython ignores an empty one; the jail's directory is
    // no host path to import from), MPLCONFIGDIR on the host.
    let env = kiln_exec::environment(py, limits)
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "PYTHONPATH" => (k, String::new()),
            "MPLCONFIGDIR" => (k, mpl.display().to_string()),
            _ => (k, v),
        })
        .collect();
    let cfg = kiln_sandbox::ZygoteConfig {
        libpython,
        preload: kiln_core::lang::warm::PYTHON_TEMPLATE.to_owned(),
        env,
    };
    Ok(sandbox.start_zygote(&cfg).await?)
}

/// The process-wide Prometheus recorder (installed once).
pub fn metrics_handle() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| PrometheusBuilder::new().install_recorder().ok())
        .clone()
}

/// Serve until `shutdown` is cancelled. Then stop accepting, let running
/// executions finish for up to `shutdown_grace_secs`, kill the rest.
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
        },
        api_key: kiln.config.api_key.clone(),
        require_identity: kiln.config.require_identity,
        max_upload_bytes: kiln.config.max_upload_mb * 1024 * 1024,
        max_batch_files: kiln.config.max_batch_files,
        ..kiln_api::ApiConfig::default()
    };
    let stop_new = CancellationToken::new();
    let state = kiln_api::AppState {
        store: kiln.store.clone(),
        exec: Arc::new(kiln.executor.clone()),
        config: Arc::new(api_config),
        health: Arc::new(kiln_api::HealthInfo {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            languages: kiln.languages.clone(),
        }),
        metrics: metrics_handle(),
        shutdown: stop_new.clone(),
    };
    let app = kiln_api::router(state);

    // garbage collection of expired files
    let gc_store = kiln.store.clone();
    let gc_every = Duration::from_secs(kiln.config.gc_interval_secs.max(1));
    let gc_stop = shutdown.clone();
    let ledger_keep = Duration::from_secs(kiln.config.egress_ledger_days * 86_400);
    let gc = tokio::spawn(async move {
        loop {
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
                () = tokio::time::sleep(gc_every) => {}
                () = gc_stop.cancelled() => return,
            }
        }
    });

    let grace = Duration::from_secs(kiln.config.shutdown_grace_secs);
    let executor = kiln.executor.clone();
    let graceful = {
        let shutdown = shutdown.clone();
        let stop_new = stop_new.clone();
        async move {
            shutdown.cancelled().await;
            info!("shutting down: no new executions, waiting for running ones");
            stop_new.cancel();
        }
    };
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(graceful)
        .into_future();
    tokio::pin!(server);
    let result = tokio::select! {
        r = &mut server => r.context("serve"),
        () = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {
            warn!(grace_secs = grace.as_secs(), "grace period over: killing running executions");
            executor.kill_all();
            // handlers now finish quickly with their runs killed
            match tokio::time::timeout(Duration::from_secs(10), &mut server).await {
                Ok(r) => r.context("serve"),
                Err(_) => Ok(()),
            }
        }
    };
    gc.abort();
    executor.wait_idle(Duration::from_secs(10)).await;
    if let Some(pool) = executor.warm_pool() {
        pool.shutdown().await;
    }
    // unmount the slots' workspace filesystems now, in order, not at exit
    executor.sandbox().shutdown();
    info!("stopped");
    result
}

/// `kiln serve`: log setup, build, bind, serve until SIGTERM/SIGINT.
pub async fn serve_until_signal(config: Config) -> anyhow::Result<()> {
    init_logging(&config.log_format);
    let addr = config.listen_addr()?;
    log_startup(&config)?;
    let kiln = build(config).await?;
    for l in &kiln.languages {
        match (&l.version, &l.reason) {
            (Some(v), _) => info!(lang = %l.name, version = %v, "language available"),
            (None, r) => {
                warn!(lang = %l.name, reason = r.as_deref().unwrap_or("unknown"), "language unavailable")
            }
        }
    }
    info!(report = %kiln.executor.sandbox().report(), "sandbox ready");
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("bind {addr}"))?;
    info!(addr = %listener.local_addr()?, "kiln listening (LibreChat: LIBRECHAT_CODE_BASEURL=http://<host>:<port>/v1)");

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
             Set KILN_API_KEY (LibreChat: LIBRECHAT_CODE_API_KEY) or restrict the network."
        ),
        Auth::None => info!("auth: none (loopback only)"),
        Auth::ApiKey => info!("auth: api-key (X-API-Key or Authorization: Bearer)"),
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
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let _ = match (format, test) {
        ("json", _) => builder.json().try_init(),
        (_, true) => builder.with_test_writer().try_init(),
        _ => builder.try_init(),
    };
}

/// Detect each language's version on the host (the jail sees the same `/usr`).
pub async fn probe_languages() -> Vec<kiln_api::LanguageHealth> {
    let mut out = Vec::new();
    for lang in Language::all() {
        let spec = lang.spec();
        let missing: Vec<&str> = spec
            .requires
            .iter()
            .copied()
            .filter(|p| !Path::new(p).exists())
            .collect();
        out.push(if !missing.is_empty() {
            kiln_api::LanguageHealth::unavailable(
                spec,
                format!("not installed: {}", missing.join(", ")),
            )
        } else {
            match probe_version(spec.version).await {
                Some(v) => kiln_api::LanguageHealth::available(spec, Some(v)),
                None => kiln_api::LanguageHealth::unavailable(spec, "version probe failed"),
            }
        });
    }
    out
}

async fn probe_version(argv: &[&str]) -> Option<String> {
    let (prog, args) = argv.split_first()?;
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::process::Command::new(prog)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .output(),
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

/// `kiln doctor`: print what the host supports. Non-zero when the sandbox
/// cannot be enforced.
pub fn doctor(config: &Config) -> ExitCode {
    let report = kiln_sandbox::probe_host();
    println!("Kiln {} doctor", env!("CARGO_PKG_VERSION"));
    println!("{report}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    if let Ok(rt) = rt {
        println!("languages:");
        for l in rt.block_on(probe_languages()) {
            match (&l.version, &l.reason) {
                (Some(v), _) => println!("  {:<5} ok      {v}", l.name),
                (None, r) => println!("  {:<5} MISSING {}", l.name, r.as_deref().unwrap_or("")),
            }
        }
    }
    match config.auth_mode() {
        Ok(Auth::ApiKey) => println!("auth: api-key"),
        Ok(Auth::None) => println!("auth: none"),
        Err(e) => println!("auth: INVALID ({e})"),
    }
    // the report's last line already says whether the sandbox is enforceable
    if report.enforceable() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `kiln exec`: run one file through the same sandbox, print its output,
/// exit with its exit code.
pub async fn exec_file(
    mut config: Config,
    lang: &str,
    file: &Path,
    args: Vec<String>,
) -> anyhow::Result<ExitCode> {
    init_logging_with("text", "warn", false);
    let lang = Language::resolve(lang).with_context(|| format!("unsupported language {lang:?}"))?;
    let code = std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
    let tmp = std::env::temp_dir().join(format!("kiln-exec-{}", std::process::id()));
    config.data_dir = tmp.clone();
    // one run: a warm pool or fork-server would only add start-up work
    config.warm_jails = 0;
    let kiln = build(config).await?;
    let principal = Principal {
        tenant: "local".into(),
        user_id: "cli".into(),
    };
    let req = ExecRequest {
        lang,
        code,
        args,
        files: Vec::new(),
        timeout_ms: None,
    };
    let result = kiln
        .executor
        .run(&principal, req, CancellationToken::new())
        .await;
    drop(kiln);
    let _ = std::fs::remove_dir_all(&tmp);
    let r = result.map_err(|e| anyhow::anyhow!("execution failed: {e}"))?;
    print!("{}", r.stdout);
    eprint!("{}", r.stderr);
    for f in &r.files {
        eprintln!("[kiln] output file: {}", f.name);
    }
    Ok(match r.exit {
        kiln_core::ExitStatus::Code(c) => ExitCode::from(c.clamp(0, 255) as u8),
        kiln_core::ExitStatus::Signal(s) => ExitCode::from((128 + s).clamp(0, 255) as u8),
    })
}
