//! LibreChat's attached workspaces (`@librechat/agents` 3.9's `bash_tool`
//! with `workspaceId`): a `/exec/programmatic` call with the header
//! `X-LibreChat-Code-Workspace-ID` (and usually `workspace_instance_id`,
//! 64 hex digits, in the body) runs in the caller's persistent project of
//! that workspace (`kiln_exec::projects`): the program starts in
//! `/workspace`, project changes persist between calls, and
//! `LIBRECHAT_CODE_DATA_DIR=/mnt/data` is the per-call directory of
//! injected files and artifacts.
//!
//! A project is the caller's principal's and the workspace's (id and
//! instance id): another principal, or another id, gets another project.
//! Calls of one project take turns (409 when the turn does not come within
//! the runtime sessions' wait). With several nodes, such a call goes to the
//! node that holds the project (`kit::attached::routing_key`, see `cluster.rs`).

use axum::http::StatusCode;
use axum::response::Response;
use kiln_core::access::Caller;
use kiln_exec::projects::ProjectBinding;

pub use crate::kit::attached::{INSTANCE_FIELD, WORKSPACE_HEADER, project_name, requested};

use crate::config::AppState;
use crate::kit::envelope::plain;

/// What the program finds in `LIBRECHAT_CODE_DATA_DIR`.
const DATA_DIR_ENV: &str = "LIBRECHAT_CODE_DATA_DIR";

/// The caller's project of the workspace `(workspace, instance)`, opened
/// (created on first use) and with its turn taken: bound to the request,
/// it keeps the turn until the run is done with it. A refusal is the
/// response to send.
pub async fn bind(
    state: &AppState,
    caller: &Caller,
    (workspace, instance): (String, Option<String>),
) -> Result<ProjectBinding, Response> {
    let Some(projects) = state.envs.projects.clone() else {
        return Err(plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "Attached workspaces are not enabled on this server",
        ));
    };
    let name = project_name(&workspace, instance.as_deref());
    let project = projects.open(caller, &name).await.map_err(|e| {
        tracing::warn!(error = %e, "opening a workspace project failed");
        plain(StatusCode::INTERNAL_SERVER_ERROR, "Internal server error")
    })?;
    ProjectBinding::take(
        projects,
        project,
        &state.sessions,
        state.config.runtime_session_busy_wait,
        vec![(
            DATA_DIR_ENV.to_owned(),
            kiln_core::lang::WORKSPACE.to_owned(),
        )],
    )
    .await
    .map_err(|_| {
        plain(
            StatusCode::CONFLICT,
            "The workspace is busy with another execution; retry when it has finished",
        )
    })
}
