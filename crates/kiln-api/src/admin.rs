//! The operator's view of a running server, behind the API key:
//! `GET /admin/status` (health, sandbox capabilities, warm pool and
//! fork-server, queue, stored bytes per owner, and the last hour of a few
//! key numbers), `GET /admin/runs` (the run registry's recent runs,
//! filterable), `GET /admin/runs/{run_id}` (one run whole: its code,
//! output, files and usage, whoever started it) and its files'
//! `/files/{file_id}`, `GET /admin/kernels` and
//! `DELETE /admin/kernels/{session_id}` (every live kernel; close any).
//! The web console ([`crate::console`]) draws them.
//!
//! What the sandbox knows comes from the binary through [`Operations`]
//! (this crate does not depend on kiln-sandbox); the history is sampled
//! in-process by [`spawn_sampler`] into a ring buffer ([`History`]).

use std::time::SystemTime;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use utoipa::{IntoParams, ToSchema};

use crate::config::{AppState, AuthMode, Environments, LanguageHealth};
use crate::error::ApiError;
use crate::identity::parse_id;
pub use crate::ops::{ForkServerView, History, Operations, Sample, SandboxView, WarmProfileView};
use crate::runs::{RunFailure, StepUsageView, UsageView};

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Resident set size of this process, from `/proc/self/statm`.
fn process_rss() -> u64 {
    const PAGE: u64 = 4096;
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * PAGE)
}

/// Takes one sample now.
pub fn sample(state: &AppState, since: SystemTime) -> Sample {
    let runs = state.runs.list();
    let finished = runs
        .iter()
        .filter(|r| r.info().finished_at.is_some_and(|t| t > since))
        .count();
    let warm_ready = state
        .operator
        .ops
        .as_ref()
        .map_or(0, |o| o.warm().iter().map(|p| u64::from(p.ready)).sum());
    Sample {
        at_ms: unix_ms(SystemTime::now()),
        runs_active: state.runs.active() as u64,
        queued: state.runs.queue().len() as u64,
        finished: finished as u64,
        warm_ready,
        rss_bytes: process_rss(),
    }
}

/// Samples into the operator's history every `history.every()` until `stop`.
pub fn spawn_sampler(state: AppState, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut since = SystemTime::now();
        loop {
            let now = SystemTime::now();
            state.operator.history.push(sample(&state, since));
            since = now;
            tokio::select! {
                () = tokio::time::sleep(state.operator.history.every()) => {}
                () = stop.cancelled() => return,
            }
        }
    })
}

/// Execution slots in use and waiting.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueueView {
    pub running: u64,
    pub queued: u64,
    pub capacity: u64,
}

/// Stored bytes of one owner (a session key: `<tenant>:user:<id>`, ...).
#[derive(Debug, Serialize, ToSchema)]
pub struct StoredView {
    pub owner: String,
    pub bytes: u64,
    pub files: u64,
}

/// `GET /admin/status`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AdminStatus {
    pub version: String,
    /// `none`, `api-key`, `jwt` or `api-key,jwt`.
    pub auth: String,
    pub languages: Vec<LanguageHealth>,
    /// Absent when the server was built without a sandbox (tests).
    pub sandbox: Option<SandboxView>,
    pub warm_pool: Vec<WarmProfileView>,
    pub fork_servers: Vec<ForkServerView>,
    pub queue: QueueView,
    /// Runs not ended.
    pub runs_active: u64,
    /// Up to 20 owners, largest first; absent when the store could not say.
    pub stored: Option<Vec<StoredView>>,
    /// Seconds between two history samples.
    pub sample_every_secs: u64,
    /// The last hour, oldest first.
    pub history: Vec<Sample>,
}

#[utoipa::path(
    get,
    path = "/admin/status",
    operation_id = "adminStatus",
    tag = "Operations",
    summary = "Health, sandbox capabilities, pool state, queue, storage and the last hour",
    responses(
        (status = 200, description = "OK", body = AdminStatus),
        (status = 401, description = "Missing or wrong API key", body = crate::error::ErrorBody),
        (status = 403, description = "A user's token: the admin view needs the operator's API key", body = crate::error::CodedError),
    )
)]
pub async fn status(State(state): State<AppState>) -> Json<AdminStatus> {
    let stored = match state.store.stored_by_owner(20).await {
        Ok(rows) => Some(
            rows.into_iter()
                .map(|r| StoredView {
                    owner: r.owner,
                    bytes: r.bytes,
                    files: r.files,
                })
                .collect(),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "stored bytes per owner: query failed");
            None
        }
    };
    let q = state.runs.queue();
    Json(AdminStatus {
        version: state.operator.health.version.clone(),
        auth: match state.config.auth {
            AuthMode::None => "none",
            AuthMode::ApiKey => "api-key",
            AuthMode::Jwt => "jwt",
            AuthMode::ApiKeyOrJwt => "api-key,jwt",
        }
        .to_owned(),
        languages: state.operator.health.languages.clone(),
        sandbox: state.operator.ops.as_ref().map(|o| o.sandbox()),
        warm_pool: state
            .operator
            .ops
            .as_ref()
            .map(|o| o.warm())
            .unwrap_or_default(),
        fork_servers: state
            .operator
            .ops
            .as_ref()
            .map(|o| o.fork_servers())
            .unwrap_or_default(),
        queue: QueueView {
            running: q.running() as u64,
            queued: q.len() as u64,
            capacity: q.capacity() as u64,
        },
        runs_active: state.runs.active() as u64,
        stored,
        sample_every_secs: state.operator.history.every().as_secs(),
        history: state.operator.history.samples(),
    })
}

/// Filters of `GET /admin/runs`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RunFilter {
    /// A language's canonical name (`py`, `js`, ...).
    pub lang: Option<String>,
    /// `queued`, `running`, `finished`, `failed` or `cancelled`.
    pub status: Option<String>,
    /// Why Kiln stopped the program, LibreChat's codes: `RE` (runtime
    /// error: a non-zero exit), `SG` (killed by a signal, the memory limit
    /// or a cancel), `TO` (timeout), `OL`/`EL` (stdout/stderr over its cap),
    /// `XX` (internal); `ok` for runs that ended with none of them.
    pub run_status: Option<String>,
    /// Most runs returned (default 100, at most 1000).
    pub limit: Option<usize>,
}

/// One run in the list.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunSummary {
    pub run_id: String,
    pub status: String,
    pub lang: String,
    /// Who started it (`<tenant>:user:<id>`).
    pub principal: String,
    pub detached: bool,
    /// Unix milliseconds.
    pub created_at_ms: u64,
    pub finished_at_ms: Option<u64>,
    /// Exit code, when it ended with a result.
    pub exit_code: Option<i32>,
    /// The signal that killed it, when it ended with a result.
    pub signal: Option<i32>,
    /// LibreChat's status of its result: `RE`, `SG`, `TO`, `OL`, `EL` or
    /// `XX` when Kiln stopped the program or it failed; null otherwise.
    pub run_status: Option<String>,
    /// What the run step used (the compile step when that failed).
    pub usage: Option<StepUsageView>,
}

const STATUSES: [&str; 5] = ["queued", "running", "finished", "failed", "cancelled"];

/// Every value of the `run_status` filter: LibreChat's codes, and `ok`.
const RUN_STATUSES: [&str; 7] = ["RE", "SG", "TO", "OL", "EL", "XX", "ok"];

fn summary(i: &kiln_exec::RunInfo) -> RunSummary {
    let result = i.outcome.as_deref().and_then(|o| o.as_ref().ok());
    RunSummary {
        run_id: i.id.as_str().to_owned(),
        status: i.phase.as_str().to_owned(),
        lang: i.lang.to_owned(),
        principal: i.owner.key().to_string(),
        detached: i.detached,
        created_at_ms: unix_ms(i.created_at),
        finished_at_ms: i.finished_at.map(unix_ms),
        exit_code: result.and_then(|r| match r.exit {
            kiln_core::ExitStatus::Code(c) => Some(c),
            kiln_core::ExitStatus::Signal(_) => None,
        }),
        signal: result.and_then(|r| match r.exit {
            kiln_core::ExitStatus::Signal(n) => Some(n),
            kiln_core::ExitStatus::Code(_) => None,
        }),
        run_status: result.and_then(|r| r.status).map(|s| s.code().to_owned()),
        usage: result
            .and_then(|r| r.usage.run.as_ref().or(r.usage.compile.as_ref()))
            .map(StepUsageView::from),
    }
}

/// Whether `s` passes the `run_status` filter `want`.
fn run_status_matches(want: &str, s: &RunSummary) -> bool {
    match (want, s.run_status.as_deref()) {
        ("ok", None) => s.status == "finished",
        (w, Some(code)) => w == code,
        _ => false,
    }
}

#[utoipa::path(
    get,
    path = "/admin/runs",
    operation_id = "adminRuns",
    tag = "Operations",
    summary = "Recent runs, newest first",
    description = "Every run the registry still keeps (running ones, and ended ones for `run_retention_secs` within `run_retention_mb`), any owner's.",
    params(RunFilter),
    responses(
        (status = 200, description = "OK", body = Vec<RunSummary>),
        (status = 400, description = "Unknown status or run_status filter", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = crate::error::ErrorBody),
        (status = 403, description = "A user's token: the admin view needs the operator's API key", body = crate::error::CodedError),
    )
)]
pub async fn runs(
    State(state): State<AppState>,
    Query(filter): Query<RunFilter>,
) -> Result<Json<Vec<RunSummary>>, ApiError> {
    if let Some(s) = &filter.status
        && !STATUSES.contains(&s.as_str())
    {
        return Err(ApiError::BadRequest(format!(
            "unknown status {s:?} (one of {})",
            STATUSES.join(", ")
        )));
    }
    if let Some(s) = &filter.run_status
        && !RUN_STATUSES.contains(&s.as_str())
    {
        return Err(ApiError::BadRequest(format!(
            "unknown run_status {s:?} (one of {})",
            RUN_STATUSES.join(", ")
        )));
    }
    let limit = filter.limit.unwrap_or(100).clamp(1, 1000);
    let out = state
        .runs
        .list()
        .iter()
        .map(|r| r.info())
        .filter(|i| filter.lang.as_deref().is_none_or(|l| l == i.lang))
        .filter(|i| {
            filter
                .status
                .as_deref()
                .is_none_or(|s| s == i.phase.as_str())
        })
        .map(|i| summary(&i))
        .filter(|s| {
            filter
                .run_status
                .as_deref()
                .is_none_or(|w| run_status_matches(w, s))
        })
        .take(limit)
        .collect();
    Ok(Json(out))
}

/// A file that went into a run's workspace.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunInputView {
    /// Path below `/mnt/data`.
    pub name: String,
    pub bytes: u64,
}

/// A file a run produced, as its result reports it.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunFileView {
    /// Path below `/mnt/data`.
    pub name: String,
    /// `GET /download/{storage_session_id}/{id}` fetches it (as its owner).
    pub id: String,
    pub storage_session_id: String,
    /// Size when stored (absent for an unchanged input echoed back).
    pub bytes: Option<u64>,
    /// An unchanged input echoed with its original ids.
    pub inherited: bool,
}

/// `GET /admin/runs/{run_id}`: one run whole.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: RunSummary,
    /// The program as submitted (its first 64 KiB).
    pub code: String,
    /// Bytes of the whole program.
    pub code_bytes: u64,
    /// `code` is only the start of the program.
    pub code_truncated: bool,
    /// What the program wrote so far (all of it once the run has ended),
    /// within the output caps.
    pub stdout: String,
    pub stderr: String,
    /// Why Kiln stopped it, in words (with `run_status`).
    pub message: Option<String>,
    /// What each step used, once it ended with a result.
    pub usage: Option<UsageView>,
    /// The files placed in `/mnt/data` before it ran.
    pub inputs: Vec<RunInputView>,
    /// The files it produced.
    pub files: Vec<RunFileView>,
    /// Why it ended without a result.
    pub error: Option<RunFailure>,
}

#[utoipa::path(
    get,
    path = "/admin/runs/{run_id}",
    operation_id = "adminRun",
    tag = "Operations",
    summary = "One run whole: code, output, files and usage, any owner's",
    params(("run_id" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "OK", body = RunDetail),
        (status = 400, description = "Not a run id", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = crate::error::ErrorBody),
        (status = 404, description = "No such run (or no longer kept)", body = crate::error::ErrorBody),
    )
)]
pub async fn run(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<RunDetail>, ApiError> {
    let Path(id) = path.map_err(|_| ApiError::MalformedId)?;
    let id = parse_id(&id)?;
    let handle = state
        .runs
        .get(&id)
        .ok_or_else(|| ApiError::RunNotFound(id.clone()))?;
    let info = handle.info();
    let (inputs, outputs) = handle.files();
    let (message, usage, files, error) = match info.outcome.as_deref() {
        Some(Ok(r)) => (
            r.message.clone(),
            Some(UsageView::from(&r.usage)),
            r.files
                .iter()
                .map(|f| RunFileView {
                    name: f.name.clone(),
                    id: f.id.as_str().to_owned(),
                    storage_session_id: f.storage_session_id.as_str().to_owned(),
                    bytes: outputs.iter().find(|o| o.name == f.name).map(|o| o.bytes),
                    inherited: f.inherited,
                })
                .collect(),
            None,
        ),
        Some(Err(e)) => {
            let (status, body) = ApiError::Exec(e.clone()).status_and_body();
            (
                None,
                None,
                Vec::new(),
                Some(RunFailure {
                    status: status.as_u16(),
                    body,
                }),
            )
        }
        None => (None, None, Vec::new(), None),
    };
    let code = handle.code();
    Ok(Json(RunDetail {
        run: summary(&info),
        code: code.text.clone(),
        code_bytes: code.bytes as u64,
        code_truncated: code.truncated(),
        stdout: handle.text(kiln_exec::Stream::Stdout),
        stderr: handle.text(kiln_exec::Stream::Stderr),
        message,
        usage,
        inputs: inputs
            .into_iter()
            .map(|f| RunInputView {
                name: f.name,
                bytes: f.bytes,
            })
            .collect(),
        files,
        error,
    }))
}

#[utoipa::path(
    get,
    path = "/admin/runs/{run_id}/files/{file_id}",
    operation_id = "adminRunFile",
    tag = "Operations",
    summary = "A file a run produced, any owner's",
    description = "The bytes of one of the files the run's result lists (`GET /admin/runs/{run_id}`'s `files`), whoever owns them: the operator's view of a run includes its outputs.",
    params(
        ("run_id" = String, Path, description = "The run's id"),
        ("file_id" = String, Path, description = "The file's id, from the run's files"),
    ),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "Not an id", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = crate::error::ErrorBody),
        (status = 404, description = "No such run, or no such file among its outputs", body = crate::error::ErrorBody),
    )
)]
pub async fn run_file(
    State(state): State<AppState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<axum::response::Response, ApiError> {
    let Path((run_id, file_id)) = path.map_err(|_| ApiError::MalformedId)?;
    let (run_id, file_id) = (parse_id(&run_id)?, parse_id(&file_id)?);
    let handle = state
        .runs
        .get(&run_id)
        .ok_or_else(|| ApiError::RunNotFound(run_id.clone()))?;
    let outcome = handle.info().outcome;
    // only what this run's result lists: the route reads no other file
    let sid = outcome
        .as_deref()
        .and_then(|o| o.as_ref().ok())
        .and_then(|r| r.files.iter().find(|f| f.id == file_id))
        .map(|f| f.storage_session_id.clone())
        .ok_or_else(|| ApiError::RunFileNotFound(file_id.clone()))?;
    crate::codeapi::files::stored_file(&state, sid, file_id).await
}

/// One live kernel (a session of `/v1/sessions`, a compatibility face's
/// worker, or a LibreChat runtime session's live state), any owner's.
#[derive(Debug, Serialize, ToSchema)]
pub struct KernelView {
    pub session_id: String,
    /// Its owner's user key (`<tenant>:user:<id>`).
    pub owner: String,
    /// `py` or `js`.
    pub lang: String,
    /// Unix milliseconds.
    pub created_at_ms: u64,
    /// Seconds since it started.
    pub age_secs: u64,
    /// Unix milliseconds.
    pub last_used_at_ms: u64,
    /// Unix milliseconds: when it closes if left idle (or at its maximum age).
    pub expires_at_ms: u64,
    pub evaluations: u64,
    /// An evaluation runs now.
    pub busy: bool,
    /// Memory its cgroup holds now, bytes (null once lost, or where the host
    /// cannot say).
    pub memory_bytes: Option<u64>,
    /// Why it is gone, if it is (it stays listed until closed or expired).
    pub lost: Option<String>,
}

#[utoipa::path(
    get,
    path = "/admin/kernels",
    operation_id = "adminKernels",
    tag = "Operations",
    summary = "Every live kernel of this node, oldest first, any owner's",
    responses(
        (status = 200, description = "OK", body = Vec<KernelView>),
        (status = 401, description = "Missing or wrong API key", body = crate::error::ErrorBody),
        (status = 503, description = "Sessions are off", body = crate::error::CodedError),
    )
)]
pub async fn kernels(State(envs): State<Environments>) -> Result<Json<Vec<KernelView>>, ApiError> {
    let kernels = envs.kernels()?;
    let now = SystemTime::now();
    Ok(Json(
        kernels
            .list()
            .iter()
            .map(|s| {
                let info = kernels.info(s);
                KernelView {
                    session_id: info.id.as_str().to_owned(),
                    owner: s.owner().key().to_string(),
                    lang: info.lang.to_owned(),
                    created_at_ms: unix_ms(info.created_at),
                    age_secs: now
                        .duration_since(info.created_at)
                        .map_or(0, |d| d.as_secs()),
                    last_used_at_ms: unix_ms(info.last_used_at),
                    expires_at_ms: unix_ms(info.expires_at),
                    evaluations: info.evaluations,
                    busy: info.busy,
                    memory_bytes: if info.lost.is_some() {
                        None
                    } else {
                        s.memory_now()
                    },
                    lost: info.lost.map(|l| l.to_string()),
                }
            })
            .collect(),
    ))
}

#[utoipa::path(
    delete,
    path = "/admin/kernels/{session_id}",
    operation_id = "adminCloseKernel",
    tag = "Operations",
    summary = "Close any live kernel",
    description = "Kills the kernel and removes its workspace, whoever owns it (its owner's next call answers 404; a compatibility face or runtime session starts a new one).",
    params(("session_id" = String, Path, description = "The kernel's session id")),
    responses(
        (status = 204, description = "Closed"),
        (status = 400, description = "Not a session id", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = crate::error::ErrorBody),
        (status = 404, description = "No such kernel", body = crate::error::CodedError),
        (status = 503, description = "Sessions are off", body = crate::error::CodedError),
    )
)]
pub async fn close_kernel(
    State(envs): State<Environments>,
    path: Result<Path<String>, PathRejection>,
) -> Result<axum::http::StatusCode, ApiError> {
    let Path(id) = path.map_err(|_| ApiError::MalformedId)?;
    let id = parse_id(&id)?;
    let kernels = envs.kernels()?;
    tracing::info!(session = %id, "kernel closed by the operator");
    kernels.delete(&id).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// `GET /admin/egress`'s query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EgressFilter {
    /// Most calls returned (default 100, at most 1000).
    pub limit: Option<u32>,
}

/// One call a jail made through the services gateway.
#[derive(Debug, Serialize, ToSchema)]
pub struct EgressCallView {
    /// Unix milliseconds.
    pub started_at_ms: i64,
    pub duration_ms: u64,
    /// Who held the grant (`run:<run id>`).
    pub owner: String,
    pub tenant: String,
    pub user_id: String,
    pub service: String,
    pub method: String,
    pub path: String,
    /// The upstream's status, or the gateway's when it refused.
    pub status: u16,
    /// `ok`, or why the gateway refused or cut the call.
    pub outcome: String,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

#[utoipa::path(
    get,
    path = "/admin/egress",
    operation_id = "adminEgress",
    tag = "Operations",
    summary = "The egress ledger: recent calls through the services gateway, newest first",
    params(EgressFilter),
    responses(
        (status = 200, description = "OK", body = Vec<EgressCallView>),
        (status = 401, description = "Missing or wrong API key", body = crate::error::ErrorBody),
        (status = 403, description = "A user's token: the admin view needs the operator's API key", body = crate::error::CodedError),
        (status = 500, description = "The store could not be read", body = crate::error::ErrorBody),
    )
)]
pub async fn egress(
    State(state): State<AppState>,
    Query(filter): Query<EgressFilter>,
) -> Result<Json<Vec<EgressCallView>>, ApiError> {
    let limit = filter.limit.unwrap_or(100).clamp(1, 1000);
    let calls = state
        .store
        .recent_egress_calls(limit)
        .await
        .map_err(ApiError::EgressLedger)?;
    Ok(Json(
        calls
            .into_iter()
            .map(|c| EgressCallView {
                started_at_ms: c.started_at_ms,
                duration_ms: c.duration_ms,
                owner: c.owner,
                tenant: c.tenant,
                user_id: c.user_id,
                service: c.service,
                method: c.method,
                path: c.path,
                status: c.status,
                outcome: c.outcome,
                bytes_up: c.bytes_up,
                bytes_down: c.bytes_down,
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use kiln_exec::Phase;

    use super::*;

    #[test]
    fn the_run_status_filter_accepts_every_code_a_result_can_carry_and_ok() {
        use kiln_core::RunStatus;
        let codes = [
            RunStatus::RuntimeError,
            RunStatus::Signal,
            RunStatus::Timeout,
            RunStatus::StdoutOverflow,
            RunStatus::StderrOverflow,
            RunStatus::Internal,
        ];
        assert!(
            codes
                .iter()
                .map(RunStatus::code)
                .eq(RUN_STATUSES[..6].iter().copied())
        );
        let mut s = RunSummary {
            run_id: String::new(),
            status: "finished".into(),
            lang: "py".into(),
            principal: String::new(),
            detached: false,
            created_at_ms: 0,
            finished_at_ms: None,
            exit_code: None,
            signal: Some(9),
            run_status: Some("TO".into()),
            usage: None,
        };
        assert!(run_status_matches("TO", &s));
        assert!(!run_status_matches("ok", &s) && !run_status_matches("OL", &s));
        s.run_status = None;
        assert!(run_status_matches("ok", &s) && !run_status_matches("TO", &s));
        s.status = "failed".into();
        assert!(!run_status_matches("ok", &s), "a failed run had no result");
    }

    #[test]
    fn the_status_filter_accepts_exactly_the_phases_a_run_has() {
        let phases = [
            Phase::Queued,
            Phase::Running,
            Phase::Finished,
            Phase::Failed,
            Phase::Cancelled,
        ];
        assert!(phases.iter().map(Phase::as_str).eq(STATUSES));
    }
}
