//! One execution as a short pipeline of named steps, each in its own
//! module:
//!
//! ```text
//! authorize ─► (queue) ─► acquire a jail ─► stage ─► run: compile? then run ─► harvest ─► outcome
//!                                    └─► open the output session (meanwhile) ─┘
//! ```
//!
//! The [`Executor`] runs it for the run registry ([`crate::Runs`]),
//! reporting progress through the run's [`RunContext`]. Jails come through
//! the [`Jails`] trait, so the pipeline is tested against a fake sandbox.

mod authorize;
mod harvest;
mod outcome;
mod project;
mod stage;
mod step;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use kiln_core::{Limits, Nanoid};
use kiln_sandbox::Jails;
use kiln_store::Store;

pub use outcome::{CANCELLED, classify, content_type};

use crate::egress;
use crate::runs::RunContext;
use crate::types::{ExecError, ExecRequest, ExecResult, Execute, JailOverride, Outputs, Work};
use crate::walker::{WalkLimits, hash_bytes};
use crate::workspace::Workspace;

/// Executor settings.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// Limits of one run; a request's `timeout` may lower the wall time.
    pub limits: Limits,
    /// Walker caps.
    pub walk: WalkLimits,
    /// The egress gateway, when the operator configured services: a run
    /// whose principal may use one gets a grant and a channel to it.
    pub egress: Option<kiln_egress::Gateway>,
    /// The deployment's access policy, for by-reference inputs that claim
    /// no scope (the same rule a download without a claim follows).
    pub access: kiln_core::access::Policy,
}

impl Default for ExecConfig {
    fn default() -> Self {
        ExecConfig {
            limits: Limits::default(),
            walk: WalkLimits {
                max_output_files: 50,
                max_file_bytes: 10 * 1024 * 1024,
                max_total_bytes: 100 * 1024 * 1024,
            },
            egress: None,
            access: kiln_core::access::Policy::default(),
        }
    }
}

/// Runs executions. Cheap to clone.
#[derive(Clone)]
pub struct Executor {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    jails: Arc<dyn Jails>,
    cfg: ExecConfig,
}

/// Records how long a phase took (`kiln_exec_phase_seconds{phase}`, and a
/// debug event in the run's span: what made one run slow, where the
/// histogram only has the mean).
async fn phase<T>(name: &'static str, f: impl Future<Output = T>) -> T {
    let t = Instant::now();
    let out = f.await;
    let took = t.elapsed();
    metrics::histogram!("kiln_exec_phase_seconds", "phase" => name).record(took.as_secs_f64());
    tracing::debug!(phase = name, us = took.as_micros() as u64, "phase done");
    out
}

impl Executor {
    pub fn new(store: Store, jails: Arc<dyn Jails>, cfg: ExecConfig) -> Self {
        Executor {
            inner: Arc::new(Inner { store, jails, cfg }),
        }
    }

    pub fn config(&self) -> &ExecConfig {
        &self.inner.cfg
    }

    /// The whole pipeline, for a program of its own (`tools`: a
    /// programmatic run's bridge), in a jail of `jail` when given (a
    /// kernel's seat), else of the executor's source.
    async fn run(
        &self,
        run: &RunContext,
        req: ExecRequest,
        tools: Option<Arc<crate::ptc::Bridge>>,
        jail: Option<JailOverride>,
    ) -> Result<ExecResult, ExecError> {
        let inner = &*self.inner;
        let started = Instant::now();
        let lang = req.lang;
        let limits = inner
            .cfg
            .limits
            .clone()
            .with_requested_timeout(req.timeout_ms);
        let cancelled = run.token();

        // authorize: inputs are checked before any resource is taken
        let inputs =
            authorize::inputs(&inner.store, inner.cfg.access, run.caller(), req.files).await?;
        authorize::outputs(&inner.store, run.caller(), &req.outputs).await?;
        let _turn = phase("queue", run.queue_turn()).await?;

        // egress, deny by default: a grant only when the principal may use
        // a service, minted once the run has its turn (its life is the
        // run's wall time, not the queue's); such a run's program joins its
        // own network namespace, so its jail is built for it, never parked
        // a programmatic run gets a tool channel instead (one port per jail)
        // (a live kernel's seat has no channel either)
        let services = inner
            .cfg
            .egress
            .as_ref()
            .filter(|_| tools.is_none() && jail.is_none() && req.project.is_none())
            .and_then(|gateway| {
                let grant = egress::mint(
                    Some(gateway),
                    run.principal(),
                    run.id().as_str(),
                    limits.wall_time,
                )?;
                Some((gateway, grant))
            });
        let profile = match services {
            // a parked jail has its mounts already: none for a project
            _ if tools.is_some() || req.project.is_some() => kiln_sandbox::COLD_PROFILE,
            Some(_) => kiln_sandbox::COLD_PROFILE,
            // py: the template its imports need
            None => lang.warm_profile_for(&req.code),
        };

        // the program: with tools, their surface in front of the code
        let code = match &tools {
            Some(bridge) => bridge.program(&req.code),
            None => req.code,
        };

        // workspace: a jail (parked, or built per step), the output
        // session, the staged files
        let source = jail.as_ref().map_or(&*inner.jails, |o| &*o.0);
        let mut jail = phase("acquire", async {
            tokio::select! {
                j = source.acquire(lang, profile) => j.map_err(step::sandbox_error),
                () = cancelled.cancelled() => Err(ExecError::Cancelled),
            }
        })
        .await?;
        // the output session is opened while the files are staged and the
        // program runs: nothing before the harvest needs it, and its row's
        // commit stays off the latency of the run (a failure to open it
        // still fails the run, after its program ended)
        let opening = phase("store", open_session(&inner.store, run, &req.outputs));
        let working = async {
            let ws = Arc::new(
                Workspace::open(jail.workspace(), jail.owner())
                    .map_err(|e| ExecError::SandboxSetup(format!("open workspace: {e}")))?,
            );
            let staged = phase(
                "stage",
                stage::stage(&inner.store, &ws, inputs, lang, &code),
            )
            .await?;
            run.inputs_staged(staged.iter().map(|(name, s)| (name.clone(), s.size)));
            let project = match &req.project {
                Some(binding) => Some(
                    phase(
                        "stage",
                        project::check_out(binding, jail.workspace(), jail.owner()),
                    )
                    .await?,
                ),
                None => None,
            };

            // run
            let steps = phase(
                "run",
                step::run_steps(
                    jail.as_mut(),
                    run,
                    lang,
                    &req.args,
                    &limits,
                    services,
                    tools.as_ref(),
                    project.as_ref().map(|w| {
                        (
                            w.as_path(),
                            req.project.as_ref().map_or(&[][..], |b| &b.env[..]),
                        )
                    }),
                ),
            )
            .await?;
            Ok::<_, ExecError>((ws, staged, project, steps))
        };
        let (session, worked) = tokio::join!(opening, working);
        let (ws, staged, project, steps) = worked?;
        let session = session?;

        // harvest: the jail is gone (unless compilation failed: nothing ran)
        let harvest = if steps.run.is_some() {
            let entry = (lang.spec().entry_file, hash_bytes(code.as_bytes()));
            phase(
                "harvest",
                harvest::harvest(
                    &inner.store,
                    run,
                    &ws,
                    staged,
                    entry,
                    &inner.cfg.walk,
                    &session,
                    &req.outputs,
                ),
            )
            .await?
        } else {
            harvest::Harvest::default()
        };
        // the project's working copy goes back before the slot is emptied
        let committed = match (&req.project, &project) {
            (Some(binding), Some(work)) if steps.run.is_some() => {
                Some(phase("harvest", project::commit(binding, work)).await?)
            }
            _ => None,
        };
        // releasing the slot empties the workspace
        drop(ws);
        drop(jail);

        let mut result = outcome::finish(run, session, lang, steps, harvest, started);
        if let Some(Err(refusal)) = committed {
            project::refused(&mut result, &refusal);
        }
        Ok(result)
    }
}

/// The storage session the outputs go to: a new one of the caller's, or
/// the workspace session the request names (checked when authorizing).
async fn open_session(
    store: &Store,
    run: &RunContext,
    outputs: &Outputs,
) -> Result<Nanoid, ExecError> {
    match outputs {
        Outputs::Workspace(id) => Ok(id.clone()),
        Outputs::NewSession => {
            let id = Nanoid::random();
            store
                .create_session(&id, &run.principal().user_key())
                .await
                .map_err(|e| ExecError::Storage(e.to_string()))?;
            Ok(id)
        }
    }
}

impl Execute for Executor {
    fn execute<'a>(
        &'a self,
        run: &'a RunContext,
        work: Work,
    ) -> BoxFuture<'a, Result<ExecResult, ExecError>> {
        match work {
            Work::Fresh(req) => Box::pin(self.run(run, req, None, None)),
            Work::Programmatic(req, bridge) => Box::pin(self.run(run, req, Some(bridge), None)),
            Work::Seated(req, seat) => Box::pin(self.run(run, req, None, Some(seat))),
            Work::Eval(e) => Box::pin(e.run(run)),
        }
    }
}

#[cfg(test)]
mod tests;
