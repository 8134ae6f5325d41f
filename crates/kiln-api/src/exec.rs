//! `POST /exec`: LibreChat's request JSON → [`ExecRequest`], the executor
//! call (cancelled when the client disconnects), and [`ExecResult`] → the
//! response JSON (spec §5).
//!
//! The body is parsed by hand from a `serde_json::Value` so that every
//! validation failure carries the message clients expect and unknown fields
//! are ignored. Bodies are never logged: old clients put the API key in them.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use kiln_core::id::is_resource_id;
use kiln_core::outcome::{ExitStatus, signal_name};
use kiln_core::scope::parse_version;
use kiln_core::{Kind, Language, Nanoid, RelPath};
use kiln_exec::{ExecRequest, ExecResult, InputFile, InputRef};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::body::{read_limited, require_json};
use crate::config::{ApiConfig, AppState};
use crate::error::ApiError;
use crate::identity::{Caller, header_user_id};

/// The handler.
pub async fn exec(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    if state.shutdown.is_cancelled() {
        return Err(ApiError::ShuttingDown);
    }
    require_json(&headers)?;
    let bytes = read_limited(&headers, body, state.config.max_json_bytes).await?;
    let (caller, req) = parse_exec_body(&state.config, &headers, &bytes)?;
    tracing::info!(
        lang = req.lang.name(),
        files = req.files.len(),
        user = %caller.principal.user_id,
        identified = caller.identified,
        "exec"
    );

    // Dropping this future (client disconnect) cancels the run.
    let cancel = CancellationToken::new();
    let guard = cancel.clone().drop_guard();
    let result = state.exec.execute(&caller.principal, req, cancel).await;
    guard.disarm();
    let result = result?;
    Ok(Json(exec_response(&result)).into_response())
}

/// Fuzz entry point (and the handler's parser): an `/exec` body's bytes →
/// the caller and the request the executor receives. `headers` supply the
/// `User-Id` identity source; never panics, whatever the bytes.
pub fn parse_exec_body(
    config: &ApiConfig,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<(Caller, ExecRequest), ApiError> {
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|_| ApiError::BadRequest("Invalid JSON body".to_owned()))?;
    let Value::Object(obj) = value else {
        return Err(ApiError::BadRequest(
            "Request body must be a JSON object".to_owned(),
        ));
    };
    let top = parse_top(&obj)?;
    let caller = Caller::resolve(config, &[header_user_id(headers)?, top.user_id.as_deref()])?;
    let files = parse_files(obj.get("files"), &caller)?;
    let req = ExecRequest {
        lang: top.lang,
        code: top.code,
        args: top.args,
        files,
        timeout_ms: top.timeout_ms,
    };
    Ok((caller, req))
}

/// The fields of the body other than `files`.
struct Top {
    lang: Language,
    code: String,
    args: Vec<String>,
    timeout_ms: Option<u64>,
    user_id: Option<String>,
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

/// `null` counts as absent.
fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn parse_top(obj: &Map<String, Value>) -> Result<Top, ApiError> {
    let lang = match field(obj, "lang") {
        Some(Value::String(s)) => {
            Language::resolve(s).ok_or_else(|| bad(format!("Unsupported language: {s}")))?
        }
        Some(other) => return Err(bad(format!("Unsupported language: {other}"))),
        None => return Err(bad("lang is required")),
    };
    let code = match field(obj, "code") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(bad("code is required and must be a string")),
    };
    let args = match field(obj, "args") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|a| a.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("args must be an array of strings"))?,
        Some(_) => return Err(bad("args must be an array of strings")),
    };
    let timeout_ms = match field(obj, "timeout") {
        None => None,
        Some(v) => match v.as_f64() {
            // `as` saturates: absurdly large timeouts become u64::MAX and are
            // clamped to the configured limit by the executor.
            Some(ms) if ms > 0.0 => Some(ms.ceil() as u64),
            _ => return Err(bad("timeout must be a positive number of milliseconds")),
        },
    };
    let user_id = match field(obj, "user_id") {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_owned()),
        _ => None,
    };
    Ok(Top {
        lang,
        code,
        args,
        timeout_ms,
        user_id,
    })
}

/// Parse `files[]`, accepting the G2/G3 reference shape, the G1 shape and
/// inline content.
fn parse_files(files: Option<&Value>, caller: &Caller) -> Result<Vec<InputFile>, ApiError> {
    let items = match files {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(bad("files must be an array")),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let Value::Object(obj) = item else {
                return Err(bad(format!("files[{i}] must be an object")));
            };
            parse_file(i, obj, caller)
        })
        .collect()
}

fn parse_file(i: usize, obj: &Map<String, Value>, caller: &Caller) -> Result<InputFile, ApiError> {
    let name = match field(obj, "name") {
        Some(Value::String(s)) => {
            RelPath::parse(s).map_err(|e| bad(format!("files[{i}].name is invalid: {e}")))?
        }
        _ => return Err(bad(format!("files[{i}].name is required"))),
    };
    if let Some(content) = field(obj, "content") {
        return parse_inline(i, obj, name, content);
    }
    let id = ref_id(field(obj, "id"))?;
    if let Some(sid) = field(obj, "storage_session_id") {
        parse_g2(i, obj, id, ref_id(Some(sid))?, name)
    } else if let Some(sid) = field(obj, "session_id") {
        parse_g1(i, obj, caller, id, ref_id(Some(sid))?, name)
    } else {
        Err(bad(format!("files[{i}].storage_session_id is required")))
    }
}

fn ref_id(v: Option<&Value>) -> Result<Nanoid, ApiError> {
    v.and_then(Value::as_str)
        .and_then(|s| Nanoid::parse(s).ok())
        .ok_or(ApiError::MalformedId)
}

fn optional_string(
    i: usize,
    obj: &Map<String, Value>,
    key: &str,
) -> Result<Option<String>, ApiError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad(format!("files[{i}].{key} must be a string"))),
    }
}

fn parse_g2(
    i: usize,
    obj: &Map<String, Value>,
    id: Nanoid,
    storage_session_id: Nanoid,
    name: RelPath,
) -> Result<InputFile, ApiError> {
    // An absent kind is read as `user`, like a G1 reference.
    let kind = match field(obj, "kind") {
        None => Kind::User,
        Some(v) => v.as_str().and_then(Kind::parse).ok_or_else(|| {
            bad(format!(
                "files[{i}].kind must be one of: skill, agent, user"
            ))
        })?,
    };
    let resource_id = optional_string(i, obj, "resource_id")?;
    if let Some(r) = &resource_id
        && !is_resource_id(r)
    {
        return Err(bad(format!(
            "files[{i}].resource_id must match ^[A-Za-z0-9_.:-]{{1,128}}$"
        )));
    }
    if kind != Kind::User && resource_id.is_none() {
        return Err(bad(format!(
            "files[{i}].resource_id is required for kind {}",
            kind.as_str()
        )));
    }
    let version = match (kind, field(obj, "version")) {
        (Kind::Skill, None) => {
            return Err(bad(format!(
                "files[{i}].version is required for kind skill"
            )));
        }
        (Kind::Skill, Some(v)) => {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => return Err(bad(format!("files[{i}].version must be a number"))),
            };
            let n = parse_version(&text)
                .map_err(|_| bad(format!("files[{i}].version must be a non-negative integer")))?;
            Some(n.to_string())
        }
        (_, Some(_)) => {
            return Err(bad(format!(
                "files[{i}].version is only allowed for kind skill"
            )));
        }
        (_, None) => None,
    };
    let entity_id = optional_string(i, obj, "entity_id")?;
    Ok(InputFile::Ref(InputRef {
        id,
        storage_session_id,
        name,
        kind,
        resource_id,
        version,
        entity_id,
    }))
}

/// G1 `{id, session_id, name, entity_id?}`: user scope, or the agent scope
/// of `entity_id` unless it names the caller.
fn parse_g1(
    i: usize,
    obj: &Map<String, Value>,
    caller: &Caller,
    id: Nanoid,
    storage_session_id: Nanoid,
    name: RelPath,
) -> Result<InputFile, ApiError> {
    let entity_id = optional_string(i, obj, "entity_id")?.filter(|e| !e.is_empty());
    let (kind, resource_id) = match &entity_id {
        None => (Kind::User, None),
        Some(e) if !is_resource_id(e) => {
            return Err(bad(format!(
                "files[{i}].entity_id must match ^[A-Za-z0-9_.:-]{{1,128}}$"
            )));
        }
        Some(e) if caller.identified && *e == caller.principal.user_id => (Kind::User, None),
        Some(e) => (Kind::Agent, Some(e.clone())),
    };
    Ok(InputFile::Ref(InputRef {
        id,
        storage_session_id,
        name,
        kind,
        resource_id,
        version: None,
        entity_id,
    }))
}

fn parse_inline(
    i: usize,
    obj: &Map<String, Value>,
    name: RelPath,
    content: &Value,
) -> Result<InputFile, ApiError> {
    let Value::String(text) = content else {
        return Err(bad(format!("files[{i}].content must be a string")));
    };
    let encoding = optional_string(i, obj, "encoding")?;
    let content = match encoding.as_deref().unwrap_or("utf8") {
        "utf8" | "utf-8" => text.as_bytes().to_vec(),
        "base64" => base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|_| bad(format!("files[{i}].content is not valid base64")))?,
        "hex" => hex::decode(text.trim())
            .map_err(|_| bad(format!("files[{i}].content is not valid hex")))?,
        _ => {
            return Err(bad(format!(
                "files[{i}].encoding must be one of: base64, hex, utf8"
            )));
        }
    };
    Ok(InputFile::Inline { name, content })
}

/// The response JSON for a completed run (spec §5.2). `code`, `signal`,
/// `status`, `message` and `wall_time` are always present (null allowed);
/// optional objects are omitted when absent.
pub fn exec_response(r: &ExecResult) -> Value {
    let files: Vec<Value> = r
        .files
        .iter()
        .map(|f| {
            let mut o = Map::new();
            o.insert("id".into(), json!(f.id.as_str()));
            o.insert("name".into(), json!(f.name));
            o.insert(
                "storage_session_id".into(),
                json!(f.storage_session_id.as_str()),
            );
            if f.inherited {
                o.insert("inherited".into(), json!(true));
            }
            if let Some((id, sid)) = &f.modified_from {
                o.insert(
                    "modified_from".into(),
                    json!({ "id": id.as_str(), "storage_session_id": sid.as_str() }),
                );
            }
            if let Some(e) = &f.entity_id {
                o.insert("entity_id".into(), json!(e));
            }
            Value::Object(o)
        })
        .collect();

    let mut out = Map::new();
    out.insert("session_id".into(), json!(r.session_id.as_str()));
    out.insert("stdout".into(), json!(r.stdout));
    out.insert("stderr".into(), json!(r.stderr));
    out.insert("files".into(), Value::Array(files));
    if !r.deleted_files.is_empty() {
        out.insert("deleted_files".into(), json!(r.deleted_files));
    }
    if let Some(t) = &r.truncation {
        let mut reasons = Map::new();
        for (key, n) in [
            ("max_files", t.max_files),
            ("depth", t.depth),
            ("size", t.size),
            ("path", t.path),
            ("unreadable", t.unreadable),
        ] {
            if n > 0 {
                reasons.insert(key.into(), json!(n));
            }
        }
        out.insert(
            "artifact_truncation".into(),
            json!({
                "code": "artifact_truncated",
                "reasons": reasons,
                "skipped": t.skipped,
                "skipped_count": t.skipped_count,
            }),
        );
    }
    if let Some(d) = &r.delivery {
        let status = if d.delivered == 0 {
            "failed"
        } else {
            "partial"
        };
        out.insert(
            "artifact_delivery".into(),
            json!({
                "code": "artifact_delivery_failed",
                "status": status,
                "attempted": d.attempted,
                "delivered": d.delivered,
                "failed": d.failed,
            }),
        );
    }
    let (code, signal) = match r.exit {
        ExitStatus::Code(c) => (json!(c), Value::Null),
        ExitStatus::Signal(s) => (Value::Null, json!(signal_name(s))),
    };
    out.insert("code".into(), code);
    out.insert("signal".into(), signal);
    out.insert("status".into(), json!(r.status.map(|s| s.code())));
    out.insert("message".into(), json!(r.message));
    out.insert(
        "wall_time".into(),
        json!(u64::try_from(r.wall_time.as_millis()).unwrap_or(u64::MAX)),
    );
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use kiln_core::RunStatus;
    use kiln_exec::{DeliveryFailure, OutputFile, Truncation};

    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(o) => o,
            _ => unreachable!("test input is an object"),
        }
    }

    fn err_msg(e: ApiError) -> String {
        e.status_and_body().1["error"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    #[test]
    fn top_level_validation_messages() {
        let e = parse_top(&obj(json!({"lang": "cobol", "code": ""})))
            .err()
            .unwrap();
        assert_eq!(err_msg(e), "Unsupported language: cobol");
        for t in [json!(0), json!(-5), json!("100"), json!(true)] {
            let e = parse_top(&obj(json!({"lang": "py", "code": "", "timeout": t})))
                .err()
                .unwrap();
            assert_eq!(
                err_msg(e),
                "timeout must be a positive number of milliseconds"
            );
        }
        let e = parse_top(&obj(json!({"lang": "py", "code": "", "args": [1]})))
            .err()
            .unwrap();
        assert_eq!(err_msg(e), "args must be an array of strings");
        assert!(parse_top(&obj(json!({"lang": "py"}))).is_err());
        let ok = parse_top(&obj(
            json!({"lang": "Python", "code": "x", "timeout": 1500.5}),
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok.lang.name(), "py");
        assert_eq!(ok.timeout_ms, Some(1501));
    }

    #[test]
    fn skill_refs_need_a_version_and_others_must_not_have_one() {
        let caller = Caller::identified("local", "alice");
        let id = Nanoid::random();
        let sid = Nanoid::random();
        let base = json!({"id": id.as_str(), "storage_session_id": sid.as_str(), "name": "a.txt",
                          "resource_id": "sk1", "kind": "skill"});
        let e = parse_files(Some(&json!([base])), &caller).err().unwrap();
        assert_eq!(err_msg(e), "files[0].version is required for kind skill");
        let mut agent = base.clone();
        agent["kind"] = json!("agent");
        agent["version"] = json!(2);
        let e = parse_files(Some(&json!([agent])), &caller).err().unwrap();
        assert_eq!(
            err_msg(e),
            "files[0].version is only allowed for kind skill"
        );
        let mut skill = base.clone();
        skill["version"] = json!(2.0);
        let files = parse_files(Some(&json!([skill])), &caller).unwrap_or_else(|e| panic!("{e}"));
        match &files[0] {
            InputFile::Ref(r) => assert_eq!(r.version.as_deref(), Some("2")),
            InputFile::Inline { .. } => panic!("expected a reference"),
        }
    }

    #[test]
    fn response_shape_keeps_null_fields_and_omits_absent_objects() {
        let sid = Nanoid::random();
        let r = ExecResult {
            session_id: sid.clone(),
            stdout: "hi\n".into(),
            stderr: String::new(),
            files: vec![OutputFile {
                id: Nanoid::random(),
                name: "a/b.csv".into(),
                storage_session_id: sid.clone(),
                inherited: false,
                modified_from: None,
                entity_id: None,
            }],
            deleted_files: vec![],
            truncation: None,
            delivery: None,
            exit: ExitStatus::Signal(9),
            status: Some(RunStatus::Timeout),
            message: None,
            wall_time: Duration::from_millis(1234),
        };
        let v = exec_response(&r);
        assert_eq!(v["code"], Value::Null);
        assert_eq!(v["signal"], "SIGKILL");
        assert_eq!(v["status"], "TO");
        assert_eq!(v["message"], Value::Null);
        assert_eq!(v["wall_time"], 1234);
        let o = v.as_object().unwrap();
        for absent in ["deleted_files", "artifact_truncation", "artifact_delivery"] {
            assert!(!o.contains_key(absent), "{absent}");
        }
        let f = v["files"][0].as_object().unwrap();
        assert!(!f.contains_key("inherited") && !f.contains_key("modified_from"));

        let r2 = ExecResult {
            truncation: Some(Truncation {
                depth: 2,
                skipped: vec!["x".into()],
                skipped_count: 2,
                ..Default::default()
            }),
            delivery: Some(DeliveryFailure {
                attempted: 2,
                delivered: 0,
                failed: 2,
            }),
            exit: ExitStatus::Code(0),
            status: None,
            ..r
        };
        let v = exec_response(&r2);
        assert_eq!(v["code"], 0);
        assert_eq!(v["artifact_truncation"]["reasons"], json!({"depth": 2}));
        assert_eq!(v["artifact_delivery"]["status"], "failed");
    }
}
