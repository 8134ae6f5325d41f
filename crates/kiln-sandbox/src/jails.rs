//! Where an execution's jail comes from, behind one small trait: [`Jails`]
//! hands out a [`Jail`] for a runtime's warm profile. [`JailSource`] is the
//! real one: a parked jail from the [`WarmPool`] when there is a pool (the
//! runtime's own profile when it has one, else the generic `exec` one, which
//! is also the fallback when the runtime's own fails), or a bare slot whose
//! jails are built per step. The executor does not know which; its tests
//! use a fake.
//!
//! The warm profiles come from the language table (kiln-core): the generic
//! one, every runtime with a `Prestart` recipe, and — once the fork-server
//! has finished its preload — every runtime with an `Embedded` one.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use kiln_core::lang::pyimports::PyTemplate;
use kiln_core::lang::{EmbeddedTemplate, WARM_EXEC, WarmRecipe};
use kiln_core::{Language, Limits, Nanoid};
use tokio_util::sync::CancellationToken;

use crate::config::SandboxConfig;
use crate::error::SandboxError;
use crate::run::{RunRequest, RunResult};
use crate::sandbox::{ParkSpec, ParkedJail, Sandbox};
use crate::slots::Slot;
use crate::spec::ParkMode;
use crate::warm::{WarmConfig, WarmPool};
use crate::zygote::{ZygoteConfig, ZygoteInfo, find_image_libpython, find_libpython};

/// A boxed future, as the trait objects below return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Hands out jails.
pub trait Jails: Send + Sync + 'static {
    /// A jail for one execution of `lang`, whose warm profile is `profile`
    /// (see `Language::warm_profile`); [`COLD_PROFILE`]: no parked jail,
    /// each step builds its own (a run whose program joins a services
    /// channel, which a parked jail cannot). Every step of it runs on
    /// `lang`'s system (its runtime image). Waits while every slot is busy;
    /// the jail's workspace exists, empty, owned by the jail's user.
    fn acquire<'a>(
        &'a self,
        lang: Language,
        profile: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn Jail>, SandboxError>>;
}

/// One execution's jail: a uid slot and its workspace, for one or more
/// steps (compile, then run). Dropping it releases the slot, which empties
/// the workspace.
pub trait Jail: Send {
    /// Host directory bound at `/mnt/data`.
    fn workspace(&self) -> &Path;
    /// Host uid and gid of the jail's user (who owns its files).
    fn owner(&self) -> (u32, u32);
    /// Runs one program in the workspace (`req.workspace` is set here):
    /// the first step in the parked jail when there is one, later steps in
    /// jails built for them. Non-zero exits, signals, timeouts, OOM and
    /// output caps are results; `cancel` firing yields
    /// [`SandboxError::Cancelled`].
    fn run(
        &mut self,
        req: RunRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<RunResult, SandboxError>>;
}

/// The profile of a jail that is never a parked one.
pub const COLD_PROFILE: &str = "cold";

/// The real [`Jails`]: warm when there is a pool, else cold. Cheap to clone.
#[derive(Debug, Clone)]
pub struct JailSource {
    sandbox: Sandbox,
    pool: Option<WarmPool>,
}

impl JailSource {
    /// Every step builds its jail.
    pub fn cold(sandbox: Sandbox) -> JailSource {
        JailSource {
            sandbox,
            pool: None,
        }
    }

    /// Starts a warm pool with a profile per warm recipe of the language
    /// table (and the generic one). With `zygote`, the fork-server starts in
    /// the background; until its preload is done (or if it cannot start),
    /// embedded runtimes take generic warm jails.
    pub fn warm(sandbox: Sandbox, cfg: WarmConfig, zygote: Option<ZygoteStart>) -> JailSource {
        let limits = cfg.limits.clone();
        // a generic profile per system jails run from: the default one's
        // `exec`, and one for each other language image
        let mut profiles: Vec<(String, ParkSpec)> = sandbox
            .config()
            .systems()
            .into_iter()
            .map(|(lang, _)| {
                let spec = ParkSpec {
                    language: lang,
                    ..ParkSpec::exec()
                };
                (exec_profile_name(lang), spec)
            })
            .collect();
        for lang in Language::all() {
            if let Some(spec) = prestart_spec(sandbox.config(), lang, &limits) {
                profiles.push((lang.name().to_owned(), spec));
            }
        }
        let pool = WarmPool::start(sandbox.clone(), cfg, profiles);
        if let Some(z) = zygote {
            let (sandbox, pool) = (sandbox.clone(), pool.clone());
            tokio::spawn(async move { start_embedded(&sandbox, &pool, &limits, z).await });
        }
        JailSource {
            sandbox,
            pool: Some(pool),
        }
    }

    /// A source over an existing pool (tests).
    pub fn with_pool(sandbox: Sandbox, pool: WarmPool) -> JailSource {
        JailSource {
            sandbox,
            pool: Some(pool),
        }
    }

    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// The warm pool, if runs use one.
    pub fn warm_pool(&self) -> Option<&WarmPool> {
        self.pool.as_ref()
    }

    /// The generic warm profile of `lang`'s system: `exec` for the
    /// default one, else the one of the first language of its image.
    fn exec_profile(&self, lang: Language) -> String {
        let cfg = self.sandbox.config();
        let own = cfg.system_of(Some(lang));
        let first = cfg
            .systems()
            .into_iter()
            .find(|(_, s)| *s == own)
            .and_then(|(l, _)| l);
        exec_profile_name(first)
    }

    async fn acquire_jail(
        &self,
        lang: Language,
        profile: &str,
    ) -> Result<SandboxJail, SandboxError> {
        let pool = self.pool.as_ref().filter(|_| profile != COLD_PROFILE);
        let Some(pool) = pool else {
            let slot = self.sandbox.acquire_slot().await;
            let workspace = new_workspace(&slot).await?;
            return Ok(SandboxJail {
                sandbox: self.sandbox.clone(),
                slot,
                workspace,
                parked: None,
                language: lang,
            });
        };
        // a runtime's other template runs the same program (only its speed
        // differs), a generic jail of its system runs it the cold way
        let exec = self.exec_profile(lang);
        let profile = std::iter::once(profile)
            .filter(|p| *p != WARM_EXEC)
            .chain(Language::sibling_profiles(profile))
            .find(|p| pool.has_profile(p))
            .unwrap_or(&exec);
        let got = match pool.get(profile).await {
            // a runtime's own warm jail failed (the fork-server died, say):
            // a generic one runs the same program the cold way
            Err(e) if profile != exec => {
                tracing::warn!(profile, error = %e, "warm jail unavailable; using a generic one");
                pool.get(&exec).await?
            }
            other => other?,
        };
        Ok(SandboxJail {
            sandbox: self.sandbox.clone(),
            workspace: got.jail.workspace().to_path_buf(),
            slot: got.slot,
            parked: Some(got.jail),
            language: lang,
        })
    }
}

impl Jails for JailSource {
    fn acquire<'a>(
        &'a self,
        lang: Language,
        profile: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn Jail>, SandboxError>> {
        Box::pin(async move {
            let jail = self.acquire_jail(lang, profile).await?;
            Ok(Box::new(jail) as Box<dyn Jail>)
        })
    }
}

impl<T: Jails> Jails for Arc<T> {
    fn acquire<'a>(
        &'a self,
        lang: Language,
        profile: &'a str,
    ) -> BoxFuture<'a, Result<Box<dyn Jail>, SandboxError>> {
        (**self).acquire(lang, profile)
    }
}

/// The generic warm profile of the system `first` (the first language of
/// its image) runs from; `None`: the default system's, [`WARM_EXEC`].
fn exec_profile_name(first: Option<Language>) -> String {
    match first {
        None => WARM_EXEC.to_owned(),
        Some(l) => format!("{WARM_EXEC}@{}", l.name()),
    }
}

/// A new, empty workspace directly below the slot's workspace parent (where
/// the quota applies and which is emptied when the slot is released), owned
/// by the jail's user, mode 0700.
async fn new_workspace(slot: &Slot) -> Result<PathBuf, SandboxError> {
    let ws = slot
        .workspace_parent()
        .join(format!("ws-{}", Nanoid::random()));
    let (uid, gid) = (slot.host_uid(), slot.host_gid());
    let path = ws.clone();
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        std::os::unix::fs::chown(&path, Some(uid), Some(gid))
    })
    .await
    .map_err(|e| SandboxError::io("create workspace", &ws, std::io::Error::other(e)))?
    .map_err(|e| SandboxError::io("create workspace", &ws, e))?;
    Ok(ws)
}

/// A jail of [`JailSource`].
#[derive(Debug)]
struct SandboxJail {
    sandbox: Sandbox,
    slot: Slot,
    workspace: PathBuf,
    parked: Option<ParkedJail>,
    /// Whose system every step runs on.
    language: Language,
}

impl Jail for SandboxJail {
    fn workspace(&self) -> &Path {
        &self.workspace
    }

    fn owner(&self) -> (u32, u32) {
        (self.slot.host_uid(), self.slot.host_gid())
    }

    fn run(
        &mut self,
        mut req: RunRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<RunResult, SandboxError>> {
        req.workspace = self.workspace.clone();
        req.language = Some(self.language);
        Box::pin(async move {
            if (req.network.is_some() || req.pause.is_some()) && self.parked.is_some() {
                return Err(SandboxError::Setup(
                    "a services or tool channel needs a jail built for it (acquire COLD_PROFILE)"
                        .into(),
                ));
            }
            match self.parked.take() {
                Some(jail) => self.sandbox.run_parked(&self.slot, jail, req, cancel).await,
                None => self.sandbox.run(&self.slot, req, cancel).await,
            }
        })
    }
}

/// How a runtime's pre-started warm jails are parked, if it has that recipe.
fn prestart_spec(cfg: &SandboxConfig, lang: Language, limits: &Limits) -> Option<ParkSpec> {
    let Some(WarmRecipe::Prestart { etc_files, .. }) = &lang.spec().warm else {
        return None;
    };
    let argv = lang.prestart_argv(limits)?;
    // the runtime must be on the system its jails run from
    if !cfg
        .system_of(Some(lang))
        .source_of(Path::new(&argv[0]))
        .is_file()
    {
        return None;
    }
    Some(ParkSpec {
        mode: ParkMode::Prestart,
        argv,
        // the runtime reads some variables only at start-up: the run's own
        env: lang.environment(limits),
        etc_files: etc_files
            .iter()
            .map(|(name, text)| ((*name).to_owned(), (*text).to_owned()))
            .collect(),
        language: Some(lang),
        ..ParkSpec::exec()
    })
}

/// Where the fork-servers may write while their preload runs, and which
/// templates to start.
#[derive(Debug, Clone)]
pub struct ZygoteStart {
    /// A host directory for the interpreter's configuration caches
    /// (matplotlib's), one subdirectory per template; the forks get the
    /// jail's own.
    pub config_dir: PathBuf,
    /// Only this template (every run takes it, whatever it imports);
    /// `None`: all of them, each run taking the one its imports need.
    pub only: Option<PyTemplate>,
}

/// Starts a fork-server for each template of the (first) runtime with an
/// `Embedded` recipe, the smallest first, and adds each one's warm profile
/// to `pool` once it is up.
async fn start_embedded(sandbox: &Sandbox, pool: &WarmPool, limits: &Limits, z: ZygoteStart) {
    let Some((lang, interpreter, templates)) = Language::all().find_map(|l| match &l.spec().warm {
        Some(WarmRecipe::Embedded {
            interpreter,
            templates,
        }) => Some((l, *interpreter, *templates)),
        _ => None,
    }) else {
        return;
    };
    let mut templates: Vec<&EmbeddedTemplate> = templates
        .iter()
        .filter(|t| z.only.is_none_or(|only| t.kind == only))
        .collect();
    templates.sort_by_key(|t| t.modules.len());
    for template in templates {
        let name = template.profile;
        match start_zygote(sandbox, lang, interpreter, template, limits, &z).await {
            Ok(info) => {
                metrics::gauge!("kiln_zygote_rss_bytes", "template" => name)
                    .set(info.rss_bytes as f64);
                // (kiln-bench reads each template's memory and CPU through it)
                metrics::gauge!("kiln_zygote_pid", "template" => name).set(f64::from(info.pid));
                tracing::info!(
                    pid = info.pid,
                    preload_ms = info.preload_ms,
                    rss_mib = info.rss_bytes / (1024 * 1024),
                    "{name} fork-server ready: {} runs it suits fork a preloaded interpreter",
                    lang.name()
                );
                pool.add_profile(
                    name,
                    ParkSpec {
                        mode: ParkMode::Embedded,
                        template: name.to_owned(),
                        language: Some(lang),
                        ..ParkSpec::exec()
                    },
                );
            }
            Err(e) => tracing::warn!(error = %e,
                "{name} fork-server unavailable: its {} runs take another template or a fresh interpreter",
                lang.name()),
        }
    }
}

async fn start_zygote(
    sandbox: &Sandbox,
    lang: Language,
    interpreter: &str,
    template: &EmbeddedTemplate,
    limits: &Limits,
    z: &ZygoteStart,
) -> Result<ZygoteInfo, SandboxError> {
    // on a runtime image the fork-server runs the image of its language's
    // interpreter (it re-executes itself inside the image's system:
    // ZygoteConfig::image_root)
    let image_root = sandbox
        .config()
        .system_of(Some(lang))
        .image_root
        .map(Path::to_path_buf);
    let libpython = match &image_root {
        Some(root) => find_image_libpython(root)?,
        None => find_libpython(Path::new(interpreter))?,
    };
    // matplotlib wants a writable config dir while the template imports it
    // (one per template: two preloads never write the same files)
    let config_dir = z.config_dir.join(template.profile);
    std::fs::create_dir_all(&config_dir).map_err(|e| SandboxError::io("create", &config_dir, e))?;
    let cfg = ZygoteConfig {
        libpython,
        image_root,
        preload: template.preload(),
        env: zygote_env(lang, limits, &config_dir),
    };
    sandbox.start_zygote(template.profile, &cfg).await
}

/// The variables of a run's environment in the same order, so a fork only
/// changes the values that differ (see `run` in python_template.py):
/// PYTHONPATH empty (CPython ignores an empty one; the jail's directory is
/// no host path to import from), MPLCONFIGDIR on the host.
fn zygote_env(lang: Language, limits: &Limits, config_dir: &Path) -> Vec<(String, String)> {
    lang.environment(limits)
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "PYTHONPATH" => (k, String::new()),
            "MPLCONFIGDIR" => (k, config_dir.display().to_string()),
            _ => (k, v),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_profiles_come_from_the_language_table() {
        let limits = Limits::default();
        let js = Language::resolve("js").unwrap();
        if Path::new("/usr/bin/node").is_file() {
            let spec =
                prestart_spec(&SandboxConfig::default(), js, &limits).expect("node is installed");
            assert_eq!(spec.mode, ParkMode::Prestart);
            assert_eq!(spec.argv.last().map(String::as_str), Some("index.js"));
            assert_eq!(spec.etc_files[0].0, "node_warm.js");
            assert_eq!(spec.env, js.environment(&limits));
        }
        for name in ["py", "bash", "c"] {
            assert!(
                prestart_spec(
                    &SandboxConfig::default(),
                    Language::resolve(name).unwrap(),
                    &limits
                )
                .is_none()
            );
        }
    }

    #[test]
    fn the_fork_server_gets_the_jail_environment_with_host_paths_where_it_writes() {
        let py = Language::resolve("py").unwrap();
        let limits = Limits::default();
        let env = zygote_env(py, &limits, Path::new("/data/zygote/mpl"));
        let jail = py.environment(&limits);
        let keys = |e: &[(String, String)]| e.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&env), keys(&jail), "same variables, same order");
        let get = |k: &str| env.iter().find(|(ek, _)| ek == k).map(|(_, v)| v.as_str());
        assert_eq!(get("PYTHONPATH"), Some(""));
        assert_eq!(get("MPLCONFIGDIR"), Some("/data/zygote/mpl"));
    }
}
