//! Warm jails: [`Sandbox::park`] builds a jail and parks it right before its
//! program runs; [`Sandbox::run_parked`] sends it the go and supervises the
//! run; [`Sandbox::discard`] tears down one that will not run.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kiln_core::Limits;
use tokio_util::sync::CancellationToken;

use super::Sandbox;
use super::outcome::{conclude, cpu_budget};
use super::setup::{Going, Parking, Prepared, run_name};
use crate::cgroup::RunCgroups;
use crate::error::SandboxError;
use crate::run::{RunRequest, RunResult, Started, start_helper};
use crate::seccomp;
use crate::slots::{Slot, SlotLease};
use crate::spec::ParkMode;

use super::kept::KeepKey;

impl Sandbox {
    /// Builds a jail under `slot` and parks it before its program runs: a
    /// warm jail. Everything a run needs is done here (namespaces, mounts,
    /// cgroup attach, uid, rlimits, Landlock, seccomp; for
    /// [`ParkMode::Prestart`] the runtime is started; for
    /// [`ParkMode::Embedded`] the process is a fork of the fork-server's
    /// preloaded interpreter). `limits` are the configured ones: a request
    /// can later only lower the wall and CPU time.
    ///
    /// The workspace is `workspace` (a directory directly below the slot's
    /// workspace parent, e.g. the one a compile step used) or a new empty
    /// one, owned by the slot's uid.
    pub async fn park(
        &self,
        slot: &Slot,
        park: &ParkSpec,
        limits: &Limits,
        workspace: Option<PathBuf>,
    ) -> Result<ParkedJail, SandboxError> {
        self.park_as(slot, park, limits, workspace, false).await
    }

    /// [`Sandbox::park`] for a jail built ahead of any request (the warm
    /// pool's refill): it builds and waits at idle CPU priority until its
    /// go (`RunCgroups::set_ahead`).
    pub async fn park_ahead(
        &self,
        slot: &Slot,
        park: &ParkSpec,
        limits: &Limits,
    ) -> Result<ParkedJail, SandboxError> {
        self.park_as(slot, park, limits, None, true).await
    }

    pub(crate) async fn park_as(
        &self,
        slot: &Slot,
        park: &ParkSpec,
        limits: &Limits,
        workspace: Option<PathBuf>,
        ahead: bool,
    ) -> Result<ParkedJail, SandboxError> {
        self.admit(slot)?;
        let t0 = std::time::Instant::now();
        let name = run_name(slot);
        // a one-shot `py` jail of a fixed slot is kept for the slot's next
        // park (`kept.rs`)
        let keep = self.inner.kept.is_some()
            && park.mode == ParkMode::Embedded
            && workspace.is_none()
            && !self.inner.slots.is_on_demand(slot.index());
        let mut kept_workspace = None;
        let workspace = match workspace {
            Some(w) => w,
            None if keep => {
                let (parent, uid, gid) =
                    (slot.workspace_parent(), slot.host_uid(), slot.host_gid());
                let (ws, id) =
                    tokio::task::spawn_blocking(move || super::kept::workspace(&parent, uid, gid))
                        .await
                        .map_err(|e| SandboxError::Helper(format!("create workspace: {e}")))?
                        .map_err(|e| {
                            SandboxError::io("create workspace", slot.workspace_parent(), e)
                        })?;
                kept_workspace = Some(id);
                ws
            }
            None => {
                let ws = slot.workspace_parent().join(format!("w{name}"));
                let (uid, gid) = (slot.host_uid(), slot.host_gid());
                let dir = ws.clone();
                tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                    std::fs::create_dir(&dir)?;
                    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
                    std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                })
                .await
                .map_err(|e| SandboxError::Helper(format!("create workspace: {e}")))?
                .map_err(|e| SandboxError::io("create workspace", &ws, e))?;
                ws
            }
        };
        let req = RunRequest {
            workspace,
            project: None,
            argv: if park.mode == ParkMode::Prestart {
                park.argv.clone()
            } else {
                vec!["/parked".to_owned()]
            },
            env: park.env.clone(),
            limits: limits.clone(),
            seccomp_profile: park.seccomp_profile.clone(),
            output: None,
            network: None,
            pause: None,
            language: park.language,
        };
        let parking = Parking {
            mode: park.mode,
            etc_files: park.etc_files.clone(),
            keep,
        };
        // the slot's kept jail, taken before `prepare` ends it
        let kept = self.inner.kept.as_ref().and_then(|k| k.take(slot.index()));
        let Prepared {
            name,
            mut spec,
            mut cgroups,
            lease,
        } = self.prepare(slot, name, &req, Some(parking))?;
        if ahead && let Some(c) = cgroups.as_mut() {
            c.set_ahead(true);
        }
        spec.keep = keep;
        let mut spec_line = serde_json::to_vec(&spec)
            .map_err(|e| SandboxError::Request(format!("encode spec: {e}")))?;
        spec_line.push(b'\n');
        let key = kept_workspace.map(|workspace| super::kept::KeepKey {
            spec_line: spec_line.clone(),
            template: park.template.clone(),
            workspace,
        });
        // a socket to the template's fork-server, for a new jail's init or
        // handed to the kept one for its next program
        let zygote = || match park.mode {
            ParkMode::Embedded => match self.zygotes().get(&park.template) {
                Some(z) => z.client().map(Some),
                None => Err(SandboxError::Request(format!(
                    "no fork-server for the embedded template {:?}",
                    park.template
                ))),
            },
            _ => Ok(None),
        };
        let parked = async {
            // reused only when built from what this park would build;
            // else it ends here (dropped) before its successor is built
            if let (Some((built, mut started)), Some(key)) = (kept, key.as_ref()) {
                if built != *key {
                    metrics::counter!("kiln_kept_jails_total", "result" => "rebuilt").increment(1);
                    tracing::debug!(
                        slot = slot.index(),
                        same_spec = built.spec_line == key.spec_line,
                        same_template = built.template == key.template,
                        same_workspace = built.workspace == key.workspace,
                        "the slot's kept jail was built from something else; it ends"
                    );
                } else if let Err(e) = match zygote()? {
                    Some(z) => started.again(z).await,
                    None => Err(SandboxError::Request("a kept jail is embedded".to_owned())),
                } {
                    metrics::counter!("kiln_kept_jails_total", "result" => "replaced").increment(1);
                    tracing::info!(
                        slot = slot.index(),
                        error = %e,
                        "the slot's kept jail was not found as new; building a new one"
                    );
                } else {
                    metrics::counter!("kiln_kept_jails_total", "result" => "reused").increment(1);
                    return Ok(started);
                }
            }
            let zygote = zygote()?;
            let launcher = self.launcher_for(slot);
            let mut started =
                start_helper(&self.inner.cfg.helper, launcher, zygote, &spec_line, keep).await?;
            started.wait_parked().await?;
            Ok(started)
        };
        let started = match parked.await {
            Ok(s) => s,
            Err(e) => {
                // the helper (if any) is gone with `parked`; its groups next
                if let Some(c) = cgroups {
                    let _ = c.finish().await;
                }
                return Err(e);
            }
        };
        Ok(ParkedJail {
            name,
            slot_index: slot.index(),
            workspace: req.workspace,
            started,
            cgroups,
            lease,
            mode: park.mode,
            build_time: t0.elapsed(),
            keep: key,
        })
    }

    /// Runs `req` in a parked jail of `slot`: sends the go (argv, env, the
    /// request's wall and CPU time) and supervises the run like
    /// [`Sandbox::run`]. `req.workspace` must be the jail's workspace; for
    /// [`ParkMode::Prestart`] and [`ParkMode::Embedded`] `req.argv` goes to
    /// the waiting runtime rather than to `execve`.
    pub async fn run_parked(
        &self,
        slot: &Slot,
        jail: ParkedJail,
        req: RunRequest,
        cancel: CancellationToken,
    ) -> Result<RunResult, SandboxError> {
        if jail.slot_index != slot.index() || req.workspace != jail.workspace {
            let e = SandboxError::Request(format!(
                "parked jail {} belongs to slot {} and workspace {}",
                jail.name,
                jail.slot_index,
                jail.workspace.display()
            ));
            self.discard(jail).await;
            return Err(e);
        }
        let mut jail = jail;
        let keep = jail.keep.take();
        let Going {
            name,
            started,
            cgroups,
            lease,
            line,
            ..
        } = self.go(jail, &req, false).await?;
        let budget = cpu_budget(cgroups.as_ref(), &req.limits);
        let mut supervised = started
            .drive(
                Some(&line),
                &req.limits,
                &cancel,
                req.output.as_ref(),
                None,
                budget.as_ref(),
            )
            .await;
        // a clean end: the jail waits for its slot's next park
        if let (Ok(s), Some(key), Some(kept)) =
            (supervised.as_mut(), keep, self.inner.kept.as_ref())
            && let Some(started) = s.kept.take()
            && s.killed.is_none()
        {
            kept.put(slot.index(), key, started);
        }
        conclude(&name, supervised, cgroups, lease).await
    }

    /// Tears down a parked jail that will not run: closes its control pipe
    /// (the helper kills and reaps the jail) and removes its cgroups. Its
    /// workspace goes when the slot is released.
    pub async fn discard(&self, jail: ParkedJail) {
        let ParkedJail {
            started,
            cgroups,
            lease,
            ..
        } = jail;
        let never = CancellationToken::new();
        never.cancel();
        let limits = Limits::default();
        // Cancelled at once: the same path as a cancelled run, so the
        // helper gets its grace to reap before it is killed.
        let _ = started.drive(None, &limits, &never, None, None, None).await;
        if let Some(c) = cgroups {
            let _ = c.finish().await;
        }
        drop(lease);
    }
}

/// How a warm jail's program process is prepared (see [`Sandbox::park`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkSpec {
    pub mode: ParkMode,
    /// [`ParkMode::Prestart`]: the runtime started at park time.
    pub argv: Vec<String>,
    /// [`ParkMode::Prestart`]: its environment.
    pub env: Vec<(String, String)>,
    /// Files under `/etc/kiln/` in the jail (a runtime's bootstrap).
    pub etc_files: Vec<(String, String)>,
    pub seccomp_profile: String,
    /// [`ParkMode::Embedded`]: the name of the template (fork-server) the
    /// program is forked from.
    pub template: String,
    /// The language whose system (runtime image) the jail is built on;
    /// `None`: the default one. A run given this jail must be of a
    /// language of the same system.
    pub language: Option<kiln_core::Language>,
}

impl ParkSpec {
    /// A jail that waits to `execve` whatever the go names.
    pub fn exec() -> ParkSpec {
        ParkSpec {
            mode: ParkMode::Exec,
            argv: Vec::new(),
            env: Vec::new(),
            etc_files: Vec::new(),
            seccomp_profile: seccomp::DEFAULT_PROFILE.to_owned(),
            template: String::new(),
            language: None,
        }
    }
}

/// A jail built ahead and parked before its program runs. Use it once with
/// [`Sandbox::run_parked`] or tear it down with [`Sandbox::discard`];
/// dropping it kills the helper (and with it the jail) and leaves the
/// cgroups to a background thread.
#[derive(Debug)]
pub struct ParkedJail {
    pub(crate) name: String,
    pub(crate) slot_index: u32,
    pub(crate) workspace: PathBuf,
    pub(crate) started: Started,
    pub(crate) cgroups: Option<RunCgroups>,
    pub(crate) lease: Option<SlotLease>,
    mode: ParkMode,
    build_time: Duration,
    /// A jail kept for its slot's next park after a clean run (`kept.rs`).
    pub(crate) keep: Option<KeepKey>,
}

impl ParkedJail {
    /// Host path of the directory bound at `/mnt/data`.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    pub fn mode(&self) -> ParkMode {
        self.mode
    }

    /// How long building and parking took.
    pub fn build_time(&self) -> Duration {
        self.build_time
    }
}
