//! Kiln's executor: runs as objects, and the pipeline that executes one.
//!
//! - [`Runs`] (`runs/`): the registry every face starts executions through
//!   (`start(caller, request) -> Watch`): ids, event logs any number of
//!   watchers read, cancel, disconnect policy, the execution queue, retention
//!   of finished runs, a per-caller rate limit.
//! - [`Executor`] (`pipeline/`): one execution as named steps — authorize
//!   (plan inputs, the one access rule) → workspace (a jail from
//!   `kiln_sandbox::Jails`, the output session, staging) → run (compile,
//!   run) → harvest (walk, store outputs) → outcome (status, message,
//!   usage).
//! - [`caps`]: caps per principal (and per node), one mechanism for every
//!   face: live kernels, programmatic runs alive.
//! - [`workspace`]: the one place the host touches files a jail controls.
//! - [`ptc`]: programmatic tool calling — a run whose program calls the
//!   host's tools and stays alive, paused, while the host runs them.
//! - [`kernels`]: live kernels (Kiln's sessions API): idle TTL, caps, one
//!   evaluation at a time, slots of their own.
//! - [`projects`]: persistent project directories (a `/workspace` of a
//!   principal's that survives runs and restarts, with a storage budget).
//! - [`eval`]: a kernel's evaluation as a run ([`Work::Eval`]).
//! - [`kernel_host`]: what [`kernels`] needs from the sandbox, as a seam
//!   (the sandbox's kernels, or a fake in the registry's unit tests).
//! - [`expiring`]: the one expiry rule (idle TTL, maximum age) of every
//!   registry (kernels, file sessions).
//! - [`turns`]: one at a time, the busy rule of every registry (kernels,
//!   runtime sessions).
//! - [`sessions`]: named file workspaces with an idle TTL (seed 000's
//!   sessions).
//! - [`workers`]: kernels by name, started on first use (seed 004's
//!   per-user workers, seed 003's default runtime session).

pub mod caps;
mod egress;
pub mod eval;
pub mod expiring;
pub mod kernel_host;
pub mod kernel_pool;
pub mod kernels;
pub mod pipeline;
pub mod plan;
pub mod projects;
pub mod ptc;
pub mod runs;
pub mod sandboxes;
pub mod sessions;
pub mod staging;
pub mod turns;
pub mod types;
pub mod walker;
pub mod workers;
pub mod workspace;

pub use egress::{SERVICES_PORT, SERVICES_URL};
pub use kiln_egress::{FetchError, FetchPolicy, Fetcher, install_crypto_provider};
pub use pipeline::{CANCELLED, ExecConfig, Executor, classify, content_type};
pub use runs::{
    AUDIT_TARGET, AuditFile, AuditRecord, AuditSink, AuditUsage, CancelReason, KEPT_CODE_BYTES,
    KeptCode, Phase, RunContext, RunEvent, RunHandle, RunInfo, Runs, RunsConfig, StartOptions,
    Step, Stream, Subscriber, TracingAudit, Watch,
};
pub use types::*;
pub use walker::WalkLimits;
