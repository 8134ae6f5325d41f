//! A live kernel's evaluation as a run ([`crate::Work::Eval`]).
//!
//! Every face that evaluates code in a kernel (Kiln's sessions, seed 003's
//! runtime, seed 004's workers, MCP) starts it through [`crate::Runs::start`]
//! like any run: it gets a run id, its output goes to the run's event log
//! as the kernel writes it, a cancel of the run (`POST /v1/runs/{id}/cancel`,
//! the session's interrupt, shutdown) interrupts the kernel, its usage (wall,
//! CPU, peak memory) is the run's, and it is audited, kept, rate limited and
//! found by `GET /v1/runs/{id}` under the one rule of the registry.
//!
//! An evaluation does not wait in the run queue: a kernel has a uid slot
//! of its own, and one evaluation at a time ([`crate::kernels`]).

use std::sync::Arc;
use std::time::Duration;

use kiln_core::{ExitStatus, Nanoid, RunStatus, StepUsage, Usage};
use kiln_sandbox::EvalResult;

use crate::kernels::{Kernel, Kernels};
use crate::runs::{RunContext, Step};
use crate::types::{ExecError, ExecResult};

/// Code to evaluate in a live kernel.
pub struct Eval {
    kernels: Kernels,
    session: Arc<Kernel>,
    code: String,
    timeout: Option<Duration>,
}

impl std::fmt::Debug for Eval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Eval")
            .field("session", self.session.id())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Eval {
    /// `code` for `session`'s kernel (of `kernels`), with a timeout of
    /// `timeout` (at most the registry's).
    pub fn new(
        kernels: &Kernels,
        session: Arc<Kernel>,
        code: String,
        timeout: Option<Duration>,
    ) -> Eval {
        Eval {
            kernels: kernels.clone(),
            session,
            code,
            timeout,
        }
    }

    pub fn lang(&self) -> &'static str {
        self.session.lang()
    }

    pub fn code(&self) -> &str {
        &self.code
    }

    /// The kernel's session id.
    pub fn session_id(&self) -> &Nanoid {
        self.session.id()
    }

    /// Evaluates, reporting through `run`: its output as written, the
    /// files the evaluation wrote (for the audit). A kernel that cannot
    /// evaluate (busy, lost) ends the run with [`ExecError::Kernel`].
    pub(crate) async fn run(self, run: &RunContext) -> Result<ExecResult, ExecError> {
        run.started(Step::Run);
        let id = self.session.id().clone();
        let r = self
            .kernels
            .evaluate(
                self.session,
                self.code,
                self.timeout,
                Some(run.output_sink()),
                Some(run.cancel_side()),
            )
            .await
            .map_err(ExecError::Kernel)?;
        run.outputs_written(r.files.iter().map(|f| (f.path.clone(), f.size)));
        Ok(result_of(r, id, run.cancel_reason().is_some()))
    }
}

/// The run's result of an evaluation: its output and usage, a status as a
/// program's run would have (an exception is a runtime error, exit code 1;
/// a timeout kills, as it would a program), and the kernel's own answer.
pub(crate) fn result_of(r: EvalResult, session: Nanoid, cancelled: bool) -> ExecResult {
    let (exit, status) = match &r.error {
        _ if r.timed_out => (ExitStatus::Signal(9), Some(RunStatus::Timeout)),
        Some(_) => (ExitStatus::Code(1), Some(RunStatus::RuntimeError)),
        None => (ExitStatus::Code(0), None),
    };
    ExecResult {
        session_id: session,
        stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
        files: Vec::new(),
        deleted_files: Vec::new(),
        truncation: None,
        delivery: None,
        exit,
        status,
        message: r
            .error
            .as_ref()
            .map(|e| format!("{}: {}", e.ename, e.evalue)),
        wall_time: r.wall_time,
        usage: Usage {
            compile: None,
            run: Some(StepUsage {
                wall: r.wall_time,
                cpu: r.cpu_time,
                memory_peak: r.memory_peak,
            }),
        },
        cancelled,
        evaluation: Some(Arc::new(r)),
    }
}
