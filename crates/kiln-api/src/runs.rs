//! Kiln's own runs API: `GET /runs/{run_id}` (status and, when done, the
//! result and what it used), `GET /runs/{run_id}/events` (Server-Sent
//! Events from the run's first event on: a late watcher gets everything so
//! far), `POST /runs/{run_id}/cancel`. Any run a face started is here, for
//! as long as the registry keeps it.
//!
//! A run is readable by whoever may read its owner's files (the one access
//! rule, with no claim): its owner, and — ids being 126-bit capabilities —
//! identity-less callers unless the deployment requires identity.

use std::sync::Arc;
use std::time::SystemTime;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use kiln_core::access::Action;
use kiln_core::{Owner, StepUsage, Usage};
use kiln_exec::RunHandle;
use serde::Serialize;
use utoipa::ToSchema;

use crate::codeapi::exec::{CodeApi, ExecResponse};
use crate::config::AppState;
use crate::error::ApiError;
use crate::identity::{Identity, authorize_owned, header_user_id, parse_id, resolve_caller};
use crate::sse::{self, Early};
pub use crate::sse::{RunLinks, RunStarted, started_response};

/// What one step used.
#[derive(Debug, Serialize, ToSchema)]
pub struct StepUsageView {
    /// Wall time, milliseconds.
    pub wall_time_ms: u64,
    /// User + system CPU time of every process of the step, milliseconds
    /// (null where the host cannot account it).
    pub cpu_time_ms: Option<u64>,
    /// Peak memory of the step's cgroup, bytes.
    pub memory_peak_bytes: Option<u64>,
}

impl From<&StepUsage> for StepUsageView {
    fn from(s: &StepUsage) -> Self {
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        StepUsageView {
            wall_time_ms: ms(s.wall),
            cpu_time_ms: s.cpu.map(ms),
            memory_peak_bytes: s.memory_peak,
        }
    }
}

/// What each step of a run used.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageView {
    /// The compile step (compiled languages).
    pub compile: Option<StepUsageView>,
    /// The run step (absent when compilation failed).
    pub run: Option<StepUsageView>,
}

impl From<&Usage> for UsageView {
    fn from(u: &Usage) -> Self {
        UsageView {
            compile: u.compile.as_ref().map(StepUsageView::from),
            run: u.run.as_ref().map(StepUsageView::from),
        }
    }
}

/// Why a run ended without a result: the status and body its starting
/// request answered (or would have).
#[derive(Debug, Serialize, ToSchema)]
pub struct RunFailure {
    pub status: u16,
    #[schema(value_type = Object)]
    pub body: serde_json::Value,
}

/// A run.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunView {
    pub run_id: String,
    /// `queued`, `running`, `finished`, `failed` or `cancelled`.
    pub status: String,
    /// The language's canonical name.
    pub lang: String,
    /// Started with `detach`: it outlives its client.
    pub detached: bool,
    /// RFC 3339 UTC.
    pub created_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// When it ended with a result: `/exec`'s response for it.
    pub result: Option<ExecResponse>,
    pub usage: Option<UsageView>,
    pub error: Option<RunFailure>,
    pub links: RunLinks,
}

/// RFC 3339 UTC with milliseconds.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let ms = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    crate::codeapi::files::iso8601(ms)
}

impl RunView {
    pub fn of(run: &RunHandle) -> RunView {
        let info = run.info();
        let (result, usage, error) = match info.outcome.as_deref() {
            Some(Ok(r)) => (
                Some(ExecResponse::from(r)),
                Some(UsageView::from(&r.usage)),
                None,
            ),
            Some(Err(e)) => {
                let (status, body) = ApiError::Exec(e.clone()).status_and_body();
                (
                    None,
                    None,
                    Some(RunFailure {
                        status: status.as_u16(),
                        body,
                    }),
                )
            }
            None => (None, None, None),
        };
        RunView {
            run_id: info.id.as_str().to_owned(),
            status: info.phase.as_str().to_owned(),
            lang: info.lang.to_owned(),
            detached: info.detached,
            created_at: rfc3339(info.created_at),
            started_at: info.started_at.map(rfc3339),
            finished_at: info.finished_at.map(rfc3339),
            result,
            usage,
            error,
            links: RunLinks::of(run),
        }
    }
}

type RunPath = Result<Path<String>, PathRejection>;

/// The run named in the path, if the caller may do `action` to it.
fn find(
    state: &AppState,
    identity: &Identity,
    headers: &HeaderMap,
    path: RunPath,
    action: Action,
) -> Result<RunHandle, ApiError> {
    let Path(id) = path.map_err(|_| ApiError::MalformedId)?;
    let id = parse_id(&id)?;
    let caller = resolve_caller(&state.config, identity, &[header_user_id(headers)?])?;
    let run = state
        .runs
        .get(&id)
        .ok_or_else(|| ApiError::RunNotFound(id.clone()))?;
    authorize_owned(
        &state.config,
        &caller,
        action,
        &id,
        &Owner::of(run.caller()),
    )?;
    Ok(run)
}

/// `GET /runs/{run_id}`.
#[utoipa::path(
    get,
    path = "/runs/{run_id}",
    operation_id = "getRun",
    tag = "Runs",
    summary = "A run's status, and its result once done",
    params(("run_id" = String, Path, description = "The run's id (`X-Kiln-Run-Id`)")),
    responses(
        (status = 200, description = "OK", body = RunView),
        (status = 400, description = "Not a run id", body = crate::error::ErrorBody),
        (status = 403, description = "Someone else's run", body = crate::error::ErrorBody),
        (status = 404, description = "No such run (or no longer kept)", body = crate::error::ErrorBody),
    )
)]
pub async fn get_run(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: RunPath,
) -> Result<Response, ApiError> {
    let run = find(&state, &identity, &headers, path, Action::Read)?;
    Ok(Json(RunView::of(&run)).into_response())
}

/// `GET /runs/{run_id}/events`.
#[utoipa::path(
    get,
    path = "/runs/{run_id}/events",
    operation_id = "runEvents",
    tag = "Runs",
    summary = "A run's events as Server-Sent Events, from its first on",
    description = "`queued`, `started`, `stdout`, `stderr`, `file`, then `result` (the `/exec` response JSON) or `error` (`{status, error}`). A watcher that arrives late gets everything from the start; keep-alive comments at least every 2 s. Watching never cancels the run.",
    params(("run_id" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The event stream", content_type = "text/event-stream", body = String),
        (status = 403, description = "Not readable by the caller", body = crate::error::ErrorBody),
        (status = 404, description = "Not found", body = crate::error::ErrorBody),
    )
)]
pub async fn run_events(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: RunPath,
) -> Result<Response, ApiError> {
    let run = find(&state, &identity, &headers, path, Action::Read)?;
    Ok(sse::respond(run.clone(), Arc::new(CodeApi::default()), Early::Event, ()).await)
}

/// `POST /runs/{run_id}/cancel`.
#[utoipa::path(
    post,
    path = "/runs/{run_id}/cancel",
    operation_id = "cancelRun",
    tag = "Runs",
    summary = "Cancel a run",
    description = "Kills every process of the run. The run ends with a result (`status` `SG`, `message` `Cancelled`, the output so far) that its watchers and its starting request receive. Cancelling a run that has ended changes nothing.",
    params(("run_id" = String, Path, description = "The run's id")),
    responses(
        (status = 202, description = "Cancelling; watch the run for its end", body = RunView),
        (status = 200, description = "The run had already ended", body = RunView),
        (status = 403, description = "Not readable by the caller", body = crate::error::ErrorBody),
        (status = 404, description = "Not found", body = crate::error::ErrorBody),
        (status = 429, description = "Rate limited (`Retry-After`, `RateLimit-*`)", body = crate::error::ErrorBody),
    )
)]
pub async fn cancel_run(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: RunPath,
) -> Result<Response, ApiError> {
    let run = find(&state, &identity, &headers, path, Action::Control)?;
    let over = run.info().phase.is_over();
    if !over {
        tracing::info!(run = %run.id(), "run cancelled on request");
        run.cancel();
    }
    let status = if over {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(RunView::of(&run))).into_response())
}
