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
//! node that holds the project ([`routing_key`], see `cluster.rs`).

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use kiln_core::access::Caller;
use kiln_exec::projects::{ProjectBinding, Projects};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::programmatic::plain;
use crate::config::AppState;
use crate::error::ApiError;

/// The header naming the attached workspace.
pub const WORKSPACE_HEADER: &str = "x-librechat-code-workspace-id";
/// The body field naming the workspace's instance.
pub const INSTANCE_FIELD: &str = "workspace_instance_id";
/// What the program finds in `LIBRECHAT_CODE_DATA_DIR`.
const DATA_DIR_ENV: &str = "LIBRECHAT_CODE_DATA_DIR";

/// `^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$` (the package's own check).
fn is_workspace_id(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b':' | b'-'))
}

/// `^[a-f0-9]{64}$`.
fn is_instance_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// The attached workspace a request names: `(workspace id, instance id)`,
/// `None` without the header; 400 for a malformed id, or an instance
/// without a workspace.
pub fn requested(
    headers: &HeaderMap,
    obj: &Map<String, Value>,
) -> Result<Option<(String, Option<String>)>, ApiError> {
    let bad = |m: &str| ApiError::BadRequest(m.to_owned());
    let workspace = match headers.get(WORKSPACE_HEADER) {
        None => None,
        Some(v) => match v.to_str().map(str::trim) {
            Ok(s) if is_workspace_id(s) => Some(s.to_owned()),
            _ => {
                return Err(bad(
                    "X-LibreChat-Code-Workspace-ID must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$",
                ));
            }
        },
    };
    let instance = match obj.get(INSTANCE_FIELD) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if is_instance_id(s.trim()) => Some(s.trim().to_owned()),
        Some(_) => return Err(bad("workspace_instance_id must be 64 lowercase hex digits")),
    };
    match (workspace, instance) {
        (Some(w), i) => Ok(Some((w, i))),
        (None, None) => Ok(None),
        (None, Some(_)) => Err(bad(
            "workspace_instance_id needs the X-LibreChat-Code-Workspace-ID header",
        )),
    }
}

/// The project's name among the caller's projects: the workspace and its
/// instance, hashed (a name of its own namespace, `librechat:`).
fn project_name(workspace: &str, instance: Option<&str>) -> String {
    let digest = Sha256::new()
        .chain_update(workspace.as_bytes())
        .chain_update(b"\0")
        .chain_update(instance.unwrap_or_default().as_bytes())
        .finalize();
    format!("librechat:{}", hex::encode(digest))
}

/// Where a new call of an attached workspace is served when there are
/// several nodes: the workspace and instance (a continuation goes where
/// its run is instead). `None`: not such a call, or a malformed one (the
/// handler answers it).
pub fn routing_key(headers: &HeaderMap, body: &[u8]) -> Option<String> {
    let obj: Map<String, Value> = serde_json::from_slice(body).ok()?;
    if obj.contains_key("continuation_token") {
        return None;
    }
    let (w, i) = requested(headers, &obj).ok()??;
    Some(project_name(&w, i.as_deref()))
}

/// The caller's project of the workspace `(workspace, instance)`, opened
/// (created on first use) and with its turn taken: bound to the request,
/// it keeps the turn until the run is done with it. A refusal is the
/// response to send.
pub async fn bind(
    state: &AppState,
    caller: &Caller,
    (workspace, instance): (String, Option<String>),
) -> Result<ProjectBinding, Response> {
    let Some(projects) = state.projects.clone() else {
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
    let turn = state
        .sessions
        .take_turn(
            Projects::turn_key(&project),
            state.config.runtime_session_busy_wait,
        )
        .await
        .map_err(|_| {
            plain(
                StatusCode::CONFLICT,
                "The workspace is busy with another execution; retry when it has finished",
            )
        })?;
    Ok(ProjectBinding {
        projects,
        project,
        turn: Some(Arc::new(turn)),
        env: vec![(
            DATA_DIR_ENV.to_owned(),
            kiln_core::lang::WORKSPACE.to_owned(),
        )],
    })
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use serde_json::json;

    use super::*;

    fn req(header: Option<&str>, body: Value) -> Result<Option<(String, Option<String>)>, String> {
        let mut h = HeaderMap::new();
        if let Some(v) = header {
            h.insert(WORKSPACE_HEADER, HeaderValue::from_str(v).unwrap());
        }
        let Value::Object(obj) = body else { panic!() };
        requested(&h, &obj).map_err(|e| e.to_string())
    }

    #[test]
    fn workspace_ids_are_checked_like_the_package_checks_them() {
        let hex = "a".repeat(64);
        assert_eq!(req(None, json!({})), Ok(None));
        assert_eq!(
            req(Some("proj-1:main"), json!({"workspace_instance_id": hex})),
            Ok(Some(("proj-1:main".into(), Some(hex.clone()))))
        );
        assert_eq!(req(Some("w"), json!({})), Ok(Some(("w".into(), None))));
        for bad in ["-w", "w/x", "w x", &"w".repeat(129)] {
            assert!(req(Some(bad), json!({})).is_err(), "{bad:?}");
        }
        for bad in [
            json!("A".repeat(64)),
            json!("a".repeat(63)),
            json!(7),
            json!("../x"),
        ] {
            assert!(
                req(Some("w"), json!({"workspace_instance_id": bad})).is_err(),
                "{bad}"
            );
        }
        // an instance without its workspace
        assert!(req(None, json!({"workspace_instance_id": hex})).is_err());
    }

    #[test]
    fn a_project_name_is_the_workspace_and_instance() {
        let a = project_name("w", Some(&"a".repeat(64)));
        assert_ne!(a, project_name("w", Some(&"b".repeat(64))));
        assert_ne!(a, project_name("v", Some(&"a".repeat(64))));
        assert_ne!(project_name("w", None), a);
        assert!(kiln_core::id::is_resource_id(&a));
    }
}
