//! Step 3, run: the compile step (compiled languages) and the run step, in
//! the execution's jail. The run step's output streams to the run's log as
//! it is read; a compile step's output is kept for the result (it becomes
//! the result only when compilation fails).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_core::lang::WORKSPACE;
use kiln_core::outcome::ExitStatus;
use kiln_core::{Language, Limits, StepUsage};
use kiln_sandbox::{
    Jail, KilledUsage, OutputSink, OutputStream, RunRequest, RunResult, SandboxError,
};
use tracing::warn;

use crate::egress::RunChannel;
use crate::ptc::{Bridge, ToolChannel};
use crate::runs::{CancelReason, RunContext, Step, Stream};
use crate::types::ExecError;

/// One step's result.
#[derive(Debug)]
pub(crate) struct StepRun {
    pub result: RunResult,
    /// Cancelled on request: `result` holds what it wrote until then.
    pub cancelled: bool,
}

impl StepRun {
    pub fn usage(&self) -> StepUsage {
        StepUsage {
            wall: self.result.wall_time,
            cpu: self.result.cpu_time,
            memory_peak: self.result.memory_peak,
        }
    }

    /// Whether the next step may run after this one.
    fn succeeded(&self) -> bool {
        !self.cancelled
            && matches!(self.result.exit, ExitStatus::Code(0))
            && !self.result.timed_out
            && !self.result.oom_killed
    }
}

/// The steps an execution ran.
#[derive(Debug, Default)]
pub(crate) struct Steps {
    pub compile: Option<StepRun>,
    /// `None` when the compile step failed (or was cancelled).
    pub run: Option<StepRun>,
}

/// Compiles (if the language does) and runs `args` in `jail`. With
/// `services` (a gateway and the run's grant), the run step, and only it,
/// gets the services channel; the grant is revoked when the step ends,
/// however it ends. With `tools` (a programmatic run), the run step gets
/// the tool channel instead and a wall clock that stops while the run
/// waits for tool results. With `project` (a project's working copy and the
/// environment the face adds), the run step, and only it, gets the copy at
/// `/workspace` as its working directory; the entry file is then named by
/// its path in `/mnt/data`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run_steps(
    jail: &mut dyn Jail,
    run: &RunContext,
    lang: Language,
    args: &[String],
    limits: &Limits,
    services: Option<(&kiln_egress::Gateway, kiln_egress::Grant)>,
    tools: Option<&Arc<Bridge>>,
    project: Option<(&Path, &[(String, String)])>,
) -> Result<Steps, ExecError> {
    // env and argv may depend on the limits (e.g. the JVM heap)
    let env = lang.environment(limits);
    let mut steps = Steps::default();
    if let Some(argv) = lang.compile_argv(limits) {
        let mut cl = limits.clone();
        cl.wall_time = lang.spec().compile_timeout;
        let c = one_step(jail, run, Step::Compile, argv, &env, cl, None, None, None).await?;
        let ok = c.succeeded();
        steps.compile = Some(c);
        if !ok {
            return Ok(steps);
        }
    }
    let mut argv = lang.run_argv(args, limits);
    let mut env = env;
    if let Some((_, extra)) = project {
        let entry = lang.spec().entry_file;
        let own = argv.len() - args.len();
        for a in argv.iter_mut().take(own) {
            if a == entry {
                *a = format!("{WORKSPACE}/{entry}");
            }
        }
        env.extend(extra.iter().cloned());
    }
    let channel = match services {
        Some((gateway, grant)) => Some(RunChannel::open(gateway, grant)?),
        None => None,
    };
    if let Some(c) = &channel {
        env.extend(c.env());
    }
    let tool_channel = match tools {
        Some(bridge) => {
            bridge.attach(run);
            Some(ToolChannel::open(bridge)?)
        }
        None => None,
    };
    let network = match (&channel, &tool_channel) {
        (Some(c), _) => Some(c.network()),
        (None, Some(t)) => Some(t.network()),
        (None, None) => None,
    };
    let pause = tools.map(|b| b.clock().clone());
    let r = one_step(
        jail,
        run,
        Step::Run,
        argv,
        &env,
        limits.clone(),
        network,
        pause,
        project.map(|(work, _)| work.to_path_buf()),
    )
    .await;
    if let Some(c) = channel {
        c.close().await;
    }
    if let Some(t) = tool_channel {
        t.close().await;
    }
    steps.run = Some(r?);
    Ok(steps)
}

/// What a step wrote, kept in case it is cancelled (the sandbox returns no
/// result then).
#[derive(Debug, Default)]
struct Written {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

#[allow(clippy::too_many_arguments)]
async fn one_step(
    jail: &mut dyn Jail,
    run: &RunContext,
    step: Step,
    argv: Vec<String>,
    env: &[(String, String)],
    limits: Limits,
    network: Option<kiln_sandbox::JailNetwork>,
    pause: Option<kiln_sandbox::PauseClock>,
    project: Option<PathBuf>,
) -> Result<StepRun, ExecError> {
    run.started(step);
    let written = Arc::new(Mutex::new(Written::default()));
    let sink = {
        let written = Arc::clone(&written);
        let live = (step == Step::Run).then(|| run.clone());
        OutputSink::new(move |stream, bytes| {
            if let Some(run) = &live {
                let s = match stream {
                    OutputStream::Stdout => Stream::Stdout,
                    OutputStream::Stderr => Stream::Stderr,
                };
                run.output(s, bytes);
            }
            let mut w = written.lock().unwrap_or_else(|p| p.into_inner());
            match stream {
                OutputStream::Stdout => w.stdout.extend_from_slice(bytes),
                OutputStream::Stderr => w.stderr.extend_from_slice(bytes),
            }
        })
    };
    let req = RunRequest {
        argv,
        env: env.to_vec(),
        limits,
        output: Some(sink),
        network,
        pause,
        project,
        ..RunRequest::default()
    };
    let t0 = Instant::now();
    match jail.run(req, run.token().clone()).await {
        Ok(result) => Ok(StepRun {
            result,
            cancelled: false,
        }),
        Err(SandboxError::Cancelled(used))
            if run.cancel_reason() == Some(CancelReason::Requested) =>
        {
            let mut w = written.lock().unwrap_or_else(|p| p.into_inner());
            Ok(StepRun {
                result: killed(std::mem::take(&mut *w), t0.elapsed(), used),
                cancelled: true,
            })
        }
        Err(e) => Err(sandbox_error(e)),
    }
}

/// The result of a step killed on request: what it wrote, and what it used
/// where the sandbox measured it (else the wall time seen here).
fn killed(w: Written, wall: Duration, used: Option<KilledUsage>) -> RunResult {
    RunResult {
        exit: ExitStatus::Signal(libc::SIGKILL),
        stdout: w.stdout,
        stderr: w.stderr,
        wall_time: used.map_or(wall, |u| u.wall_time),
        cpu_time: used.and_then(|u| u.cpu_time),
        memory_peak: used.and_then(|u| u.memory_peak),
        ..RunResult::default()
    }
}

pub(crate) fn sandbox_error(e: SandboxError) -> ExecError {
    match e {
        SandboxError::Cancelled(_) => ExecError::Cancelled,
        e @ SandboxError::Setup(_) => {
            warn!(error = %e, "sandbox setup failed");
            ExecError::SandboxSetup(e.to_string())
        }
        e => {
            warn!(error = %e, "sandbox run failed");
            ExecError::SandboxFailed(e.to_string())
        }
    }
}
