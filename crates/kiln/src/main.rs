//! The `kiln` binary: a thin CLI over the `kiln` library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "A self-hosted, LibreChat-compatible Code Interpreter API"
)]
struct Cli {
    /// Optional TOML configuration file.
    #[arg(long, global = true, env = "KILN_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// The flags `serve` takes that say where a server is; `doctor` and
/// `health` take them too, so that they look where `serve` was told to.
#[derive(Args, Clone, Default)]
struct Where {
    /// Address to listen on (default 127.0.0.1:8000; `listen`, `KILN_LISTEN`).
    #[arg(long)]
    listen: Option<String>,
    /// Data directory (default ./kiln-data; `data_dir`, `KILN_DATA_DIR`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

impl Where {
    /// The flags over the configuration.
    fn apply(self, cfg: &mut kiln::config::Config) {
        if let Some(l) = self.listen {
            cfg.listen = l;
        }
        if let Some(d) = self.data_dir {
            cfg.data_dir = d;
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Start the HTTP service.
    Serve {
        #[command(flatten)]
        place: Where,
    },
    /// Run one file through the sandbox and print its output.
    Exec {
        /// Language: py, js, ts, c, cpp, java, php, rs, go, d, f90, r, bash, or an alias.
        #[arg(long)]
        lang: String,
        /// Source file.
        file: PathBuf,
        /// Run it on this Kiln server (`http://host:port`) instead of a local sandbox; the
        /// output streams as it is written. The key comes from `KILN_API_KEY` (or the config).
        #[arg(long, env = "KILN_SERVER")]
        server: Option<String>,
        /// An input file, placed at `/mnt/data/<its name>` (repeat for several).
        #[arg(long = "file", value_name = "PATH")]
        inputs: Vec<PathBuf>,
        /// Save the run's output files in this directory (created if missing); without it
        /// they are only named.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Arguments passed to the program.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Report what the host supports and what the configuration gets wrong; exits non-zero
    /// if the sandbox cannot be enforced or a check fails.
    Doctor {
        #[command(flatten)]
        place: Where,
    },
    /// Build, import or list runtime images (docs/runtimes.md).
    Runtime {
        #[command(subcommand)]
        action: RuntimeAction,
        /// Directory of the images (`runtime_dir`, `KILN_RUNTIME_DIR`).
        #[arg(long, global = true)]
        runtime_dir: Option<PathBuf>,
    },
    /// Ask the local server's `GET /health` (at the configured listen address); exits 0 when it
    /// answers 200. For container health checks.
    Health {
        /// Seconds to wait for the answer.
        #[arg(long, default_value_t = 5)]
        timeout: u64,
        #[command(flatten)]
        place: Where,
    },
}

#[derive(Subcommand)]
enum RuntimeAction {
    /// Build the image of a recipe (default: the compiled-in one) unless it is built; prints
    /// its root filesystem's path.
    Build {
        /// A recipe file (TOML; see resources/runtime/recipe.toml).
        #[arg(long)]
        recipe: Option<PathBuf>,
    },
    /// Import a root filesystem tarball, or an image exported by `docker save`/`podman save`
    /// (docker or OCI archive); prints its id.
    Import {
        /// The archive (tar, optionally compressed).
        archive: PathBuf,
    },
    /// List the complete images.
    List,
}

fn runtime_command(
    cfg: &kiln::config::Config,
    action: RuntimeAction,
    dir: Option<PathBuf>,
) -> anyhow::Result<ExitCode> {
    use kiln::runtime::{Recipe, Store};
    let store = Store::new(dir.unwrap_or_else(|| cfg.runtime_dir.clone()));
    match action {
        RuntimeAction::Build { recipe } => {
            let text = match recipe {
                Some(path) => std::fs::read_to_string(&path)
                    .map_err(|e| anyhow::anyhow!("read {}: {e}", path.display()))?,
                None => kiln::runtime::DEFAULT_RECIPE.to_owned(),
            };
            let img = kiln::runtime::build(&store, &Recipe::parse(&text)?)?;
            println!("{}", img.root.display());
        }
        RuntimeAction::Import { archive } => {
            let img = kiln::runtime::import(&store, &archive)?;
            println!("{}", img.info.id);
        }
        RuntimeAction::List => {
            let default_id = Recipe::parse(kiln::runtime::DEFAULT_RECIPE)?.image_id();
            for img in store.list()? {
                let i = &img.info;
                let mark = if i.id == default_id { " (default)" } else { "" };
                println!(
                    "{}{mark}\t{}\t{}\t{}\t{}",
                    i.id,
                    i.source,
                    if i.suite.is_empty() { "-" } else { &i.suite },
                    kiln::runtime::human_bytes(i.bytes),
                    img.root.display()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    // The jail helper must start before anything else: no threads, no runtime.
    match std::env::args_os().nth(1) {
        Some(a) if a == "__jail" => kiln_sandbox::helper_main(),
        Some(a) if a == "__zygote" => kiln_sandbox::zygote_main(),
        Some(a) if a == "__launcher" => kiln_sandbox::launcher_main(),
        _ => {}
    }
    let cli = Cli::parse();
    let mut cfg = match kiln::config::Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kiln: {e:#}");
            return ExitCode::from(2);
        }
    };
    // As PID 1, split off a minimal init first: forking needs a single thread.
    if matches!(cli.command, Command::Serve { .. })
        && cfg.pid1_init
        && let Err(e) = kiln_sandbox::init_if_pid1()
    {
        eprintln!("kiln: cannot run as PID 1 with an init: {e}");
        return ExitCode::FAILURE;
    }
    // The server's mounts (slot filesystems) live in a namespace of its own,
    // so they vanish with it even after SIGKILL. A namespace belongs to a
    // thread: enter it before the runtime starts any. Failing is not fatal
    // (`serve` logs it); `kiln exec` makes the same mounts.
    if matches!(
        cli.command,
        Command::Serve { .. } | Command::Exec { server: None, .. }
    ) {
        let _ = kiln_sandbox::enter_own_mount_namespace();
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kiln: start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Command::Serve { place } | Command::Doctor { place } | Command::Health { place, .. } =
        &cli.command
    {
        place.clone().apply(&mut cfg);
        if let Err(e) = cfg.validate() {
            eprintln!("kiln: {e:#}");
            return ExitCode::from(2);
        }
    }
    let result = match cli.command {
        // The server runs as a task on the runtime's workers, not in
        // `block_on` on this thread: there its accept loop took every new
        // connection on a thread of its own, woken by the workers' I/O
        // driver and waking a worker for the connection's task, about four
        // cross-thread wake-ups per scenario-D pair (BENCHMARKS.md).
        Command::Serve { .. } => rt
            .block_on(async {
                match tokio::spawn(kiln::serve_until_signal(cfg)).await {
                    Ok(served) => served,
                    Err(e) => Err(anyhow::anyhow!("the server's task ended: {e}")),
                }
            })
            .map(|()| ExitCode::SUCCESS),
        Command::Exec {
            lang,
            file,
            server,
            inputs,
            out,
            args,
        } => {
            let job = kiln::ExecFiles {
                lang: &lang,
                file: &file,
                inputs: &inputs,
                out: out.as_deref(),
            };
            match server {
                Some(server) => rt.block_on(kiln::remote::exec_remote(
                    &server,
                    cfg.api_key.as_deref(),
                    job,
                    args,
                )),
                None => rt.block_on(kiln::exec_file(cfg, job, args)),
            }
        }
        Command::Doctor { .. } => Ok(kiln::doctor(&cfg)),
        Command::Runtime {
            action,
            runtime_dir,
        } => runtime_command(&cfg, action, runtime_dir),
        Command::Health { timeout, .. } => Ok(kiln::health_check(
            &cfg,
            std::time::Duration::from_secs(timeout.max(1)),
        )),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kiln: {e:#}");
            ExitCode::FAILURE
        }
    }
}
