//! LibreChat's attached workspace as a request names it (the header
//! `X-LibreChat-Code-Workspace-ID` and the body's `workspace_instance_id`):
//! parsed and checked here, in the kit, because both the programmatic face
//! (`codeapi/workspace.rs`, which runs the call in the project) and the
//! cluster layer (which routes a call to the node holding the project) read
//! it.

use axum::http::HeaderMap;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::error::ApiError;

/// The header naming the attached workspace.
pub const WORKSPACE_HEADER: &str = "x-librechat-code-workspace-id";
/// The body field naming the workspace's instance.
pub const INSTANCE_FIELD: &str = "workspace_instance_id";
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
pub fn project_name(workspace: &str, instance: Option<&str>) -> String {
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
