//! The executor's request and result types: the boundary between the HTTP
//! layer (which maps LibreChat's JSON onto these) and the executor.

use std::time::Duration;

use kiln_core::access::Claim;
use kiln_core::outcome::{ExitStatus, RunStatus};
use kiln_core::{Kind, Language, Nanoid, RelPath, Usage};

/// One execution, already validated by the face that received it.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub lang: Language,
    pub code: String,
    pub args: Vec<String>,
    pub files: Vec<InputFile>,
    /// Requested wall time in milliseconds (lowers, never raises, the limit).
    pub timeout_ms: Option<u64>,
    /// Where the outputs are stored.
    pub outputs: Outputs,
    /// A persistent project bound at `/workspace`, the program's working
    /// directory (see [`crate::projects`]): checked out into the run's
    /// jail, committed back after the run. Such a run gets a jail built for
    /// it.
    pub project: Option<crate::projects::ProjectBinding>,
}

/// What a run does: the value [`crate::Runs::start`] takes.
#[derive(Debug)]
pub enum Work {
    /// A program in a fresh jail of the executor's own source (the one-shot
    /// pipeline).
    Fresh(ExecRequest),
    /// Programmatic tool calling: the program gets the bridge's tools and
    /// pauses while the host runs them (see [`crate::ptc`]). Such a run
    /// gets a jail built for it with a tool channel, and no services.
    Programmatic(ExecRequest, std::sync::Arc<crate::ptc::Bridge>),
    /// The one-shot pipeline in a jail of another source: a live kernel's
    /// seat (`Kernels::seat`) for LibreChat's stateful
    /// profile with live state. Such a run gets no services.
    Seated(ExecRequest, JailOverride),
    /// Code evaluated in a live kernel (its state persists between
    /// evaluations); see [`crate::eval`].
    Eval(crate::eval::Eval),
}

impl Work {
    /// The language it runs.
    pub fn lang(&self) -> &'static str {
        match self {
            Work::Fresh(r) | Work::Programmatic(r, _) | Work::Seated(r, _) => r.lang.name(),
            Work::Eval(e) => e.lang(),
        }
    }

    /// Its source.
    pub fn code(&self) -> &str {
        match self {
            Work::Fresh(r) | Work::Programmatic(r, _) | Work::Seated(r, _) => &r.code,
            Work::Eval(e) => e.code(),
        }
    }
}

impl From<ExecRequest> for Work {
    fn from(req: ExecRequest) -> Work {
        Work::Fresh(req)
    }
}

/// A jail source for one request (see [`Work::Seated`]).
#[derive(Clone)]
pub struct JailOverride(pub std::sync::Arc<dyn kiln_sandbox::Jails>);

impl std::fmt::Debug for JailOverride {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JailOverride")
    }
}

/// Where an execution's outputs go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Outputs {
    /// A new storage session of the caller's (LibreChat's model: each
    /// execution's outputs are a session of their own).
    #[default]
    NewSession,
    /// An existing storage session of the caller's that works as a
    /// persistent workspace (seed 000's sessions): outputs are added to it,
    /// an output that modified an input of this session replaces it, and an
    /// input of this session the program deleted is deleted.
    Workspace(Nanoid),
}

/// An input file to place at `/mnt/data/<name>`.
#[derive(Debug, Clone)]
pub enum InputFile {
    /// A stored object, referenced by `(storage_session_id, id)`.
    Ref(InputRef),
    /// Inline content (not sent by LibreChat, harmless to support).
    Inline { name: RelPath, content: Vec<u8> },
}

impl InputFile {
    /// Where it goes below `/mnt/data`.
    pub fn name(&self) -> &RelPath {
        match self {
            InputFile::Ref(r) => &r.name,
            InputFile::Inline { name, .. } => name,
        }
    }
}

/// A by-reference input, in any client generation's shape.
#[derive(Debug, Clone)]
pub struct InputRef {
    pub id: Nanoid,
    pub storage_session_id: Nanoid,
    pub name: RelPath,
    /// Ownership kind the ref claims; `None` when it names no scope (G1
    /// `{id, session_id, name}`, community `{id, storage_session_id, name}`):
    /// then only `entity_id` claims anything, and without it the ref is read
    /// under the access rule's no-claim branch, like a download without one.
    pub kind: Option<Kind>,
    pub resource_id: Option<String>,
    pub version: Option<String>,
    /// Echoed on inherited outputs when the ref carried one (G1).
    pub entity_id: Option<String>,
}

impl InputRef {
    /// A `user` ref, or one that claims no scope (G1's default kind): for
    /// these the last ref per name wins.
    pub fn is_user_scoped(&self) -> bool {
        matches!(self.kind, None | Some(Kind::User))
    }

    /// The claim this ref makes for the access rule: its scope, its G1
    /// entity, both, or — neither given — none.
    pub fn claim(&self) -> Claim {
        Claim {
            scope: self
                .kind
                .map(|k| (k, self.resource_id.clone(), self.version.clone())),
            entity_id: self.entity_id.clone(),
        }
    }
}

/// A completed run (whatever the exit code).
#[derive(Debug, Clone)]
pub struct ExecResult {
    pub session_id: Nanoid,
    pub stdout: String,
    pub stderr: String,
    pub files: Vec<OutputFile>,
    pub deleted_files: Vec<String>,
    pub truncation: Option<Truncation>,
    pub delivery: Option<DeliveryFailure>,
    pub exit: ExitStatus,
    pub status: Option<RunStatus>,
    pub message: Option<String>,
    /// Wall time of the step whose result this is (the run step, or the
    /// compile step that failed).
    pub wall_time: Duration,
    /// What each step used.
    pub usage: Usage,
    /// The run was cancelled on request (its processes were killed; a
    /// kernel's evaluation was interrupted).
    pub cancelled: bool,
    /// A kernel's evaluation ([`Work::Eval`]): the kernel's own answer
    /// (a final expression's value, the exception, the files it wrote),
    /// which the faces of live kernels render.
    pub evaluation: Option<std::sync::Arc<kiln_sandbox::EvalResult>>,
}

/// One entry of `files` in the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputFile {
    pub id: Nanoid,
    pub name: String,
    pub storage_session_id: Nanoid,
    /// An unchanged (or read-only) input echoed with its original ids.
    pub inherited: bool,
    /// `(id, storage_session_id)` of the input this output replaced.
    pub modified_from: Option<(Nanoid, Nanoid)>,
    pub entity_id: Option<String>,
}

/// Why some outputs were not reported (`artifact_truncation`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Truncation {
    pub max_files: u32,
    pub depth: u32,
    pub size: u32,
    pub path: u32,
    pub unreadable: u32,
    /// Past a storage budget: the run's output total, the owner's quota or
    /// the disk's free-space floor.
    pub storage: u32,
    /// Up to 20 skipped relative paths.
    pub skipped: Vec<String>,
    pub skipped_count: u32,
}

/// Outputs that could not be stored (`artifact_delivery`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryFailure {
    pub attempted: u32,
    pub delivered: u32,
    pub failed: u32,
}

/// Why an execution could not produce a result. Each variant maps to one
/// status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// A `files[]` entry is malformed or collides with another (400).
    #[error("{0}")]
    BadRequest(String),
    /// A `files[]` reference points at an object the caller may not read (403).
    #[error("Unauthorized file reference")]
    Unauthorized,
    /// The sandbox could not be set up (503 `sandbox_setup_failed`).
    #[error("sandbox setup failed: {0}")]
    SandboxSetup(String),
    /// The sandbox failed during the run (502 `sandbox_execution_failed`).
    #[error("sandbox execution failed: {0}")]
    SandboxFailed(String),
    /// The server is shutting down (503).
    #[error("service is shutting down")]
    ShuttingDown,
    /// The client went away; nothing to answer.
    #[error("cancelled")]
    Cancelled,
    /// Storage failed (500).
    #[error("storage: {0}")]
    Storage(String),
    /// Something inside Kiln failed unexpectedly (500).
    #[error("internal error: {0}")]
    Internal(String),
    /// The caller started too many runs recently (429).
    #[error("rate limited: retry in {}s", retry_after.as_secs())]
    RateLimited { retry_after: Duration },
    /// Too many runs are waiting for their turn already (503).
    #[error("busy: retry in {}s", retry_after.as_secs())]
    Busy { retry_after: Duration },
    /// A kernel's evaluation could not be made (busy kernel, lost kernel,
    /// ...): the faces of live kernels answer as for their own errors.
    #[error("{0}")]
    Kernel(crate::kernel_host::KernelsError),
}

/// What the run registry needs from an executor: run one execution to its
/// result, reporting progress through `run`. The real implementation is
/// [`crate::Executor`]; tests of the faces may use a double.
pub trait Execute: Send + Sync + 'static {
    fn execute<'a>(
        &'a self,
        run: &'a crate::runs::RunContext,
        work: Work,
    ) -> futures::future::BoxFuture<'a, Result<ExecResult, ExecError>>;
}
