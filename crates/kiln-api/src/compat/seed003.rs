//! Seed 003's runtime daemon API (LiteBoxd's code interpreter) as a face,
//! under a configurable prefix (`runtime_api_prefix`, default `/runtime`).
//! Parsing and rendering only; errors are `{"error": "<message>"}`.
//!
//! | Route | What |
//! |---|---|
//! | `POST /code` `{language?, code, session_id?, timeout?}` | evaluate; Server-Sent Events `stdout`, `stderr`, `result`, `error`, `end` |
//! | `POST /sessions` `{language?}` | start a kernel → 201 `{session_id, language, created_at}` |
//! | `DELETE /sessions/{session_id}` | close it → 204 |
//! | `GET /files?path=&session_id=` | the regular files under `path` |
//! | `POST /files/upload?path=&session_id=` (multipart `file` parts) | write them into the directory `path` |
//! | `GET /files/download?path=&session_id=` | one file's bytes |
//! | `GET /metrics` | kernels and host figures |
//! | `GET /metrics/watch?interval_ms=` | the same as Server-Sent Events `metrics`, every interval |
//!
//! A "sandbox" of the seed is the caller's default runtime session (a
//! named kernel, started on first use); `session_id` picks a session made
//! with `POST /sessions` instead. Paths are the seed's `/workspace/...`,
//! confined to the kernel's `/mnt/data`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Multipart, Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use kiln_core::access::Action::{self, Control, Read};
use kiln_core::{Language, Owner, RelPath};
use kiln_exec::kernels::Kernel;
use kiln_exec::workers::WorkerName;
use serde::Deserialize;

use super::{Envelope, workers};
use crate::config::AppState;
use crate::identity::{Identity, authorize_owned, parse_id};
use crate::kit::{Admitted, JsonBody, Open, Unresolved};

/// The seed's workspace directory.
const WORKSPACE: &str = "/workspace";

/// This face's envelope: `{"error": "..."}`.
#[derive(Debug)]
pub enum Error {}

impl Envelope for Error {
    const FIELD: &'static str = "error";
}

type Fail = super::Fail<Error>;

fn bad(message: impl Into<String>) -> Fail {
    Fail::new(StatusCode::BAD_REQUEST, message)
}

/// Runtime sessions run the default kernel language (Python): any name the
/// table resolves to it is accepted.
fn check_language(language: Option<&str>) -> Result<(), Fail> {
    let kernel = Language::default_kernel();
    match language {
        None => Ok(()),
        Some(l) if Language::resolve(l) == Some(kernel) => Ok(()),
        Some(l) => Err(bad(format!(
            "unsupported language {:?}: runtime sessions run {}",
            l.trim().to_ascii_lowercase(),
            kernel.spec().common_name
        ))),
    }
}

/// The caller and the owner of what it starts.
fn caller(
    state: &AppState,
    identity: &Identity,
    headers: &HeaderMap,
) -> Result<(kiln_core::access::Caller, Owner), Fail> {
    Ok(crate::sessions::owner_of(state, identity, headers)?)
}

/// The session `session_id` names (the caller's default runtime session, or
/// one of its own by the one access rule), or the caller's default runtime
/// session, started on first use.
async fn session(
    state: &AppState,
    identity: &Identity,
    headers: &HeaderMap,
    session_id: &Option<String>,
    action: Action,
) -> Result<(Arc<Kernel>, String), Fail> {
    let workers = workers(state)?;
    let (caller, owner) = caller(state, identity, headers)?;
    match session_id.as_deref() {
        Some(id) => {
            let id = parse_id(id)?;
            let session = workers.kernels().get(&id)?;
            // the id its events report: the caller's own default session,
            // whose kernel owner is the name's, not the caller's key
            let default = workers.find(&owner, &WorkerName::Seed003Default);
            if default.is_some_and(|d| workers.kernels().info(&d).id == id) {
                return Ok((session, id.as_str().to_owned()));
            }
            authorize_owned(&state.config, &caller, action, &id, session.owner())?;
            Ok((session, id.as_str().to_owned()))
        }
        None => {
            let (session, _) = workers
                .get_or_start(
                    &owner,
                    &WorkerName::Seed003Default,
                    Language::default_kernel(),
                )
                .await?;
            let id = workers.kernels().info(&session).id.as_str().to_owned();
            Ok((session, id))
        }
    }
}

/// `/workspace[/...]` → the path below `/mnt/data` (`None`: the root).
/// Outside `/workspace`: 403; not an acceptable path: 400.
fn workspace_path(path: &str) -> Result<Option<RelPath>, Fail> {
    let rest = path
        .strip_prefix(WORKSPACE)
        .filter(|r| r.is_empty() || r.starts_with('/'))
        .ok_or_else(|| {
            Fail::new(
                StatusCode::FORBIDDEN,
                format!("path {path:?} is outside {WORKSPACE}"),
            )
        })?;
    let rel = rest.trim_matches('/');
    if rel.is_empty() {
        return Ok(None);
    }
    RelPath::parse(rel)
        .map(Some)
        .map_err(|e| bad(format!("path {path:?}: {e}")))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeBody {
    language: Option<String>,
    code: String,
    session_id: Option<String>,
    /// Seconds.
    timeout: Option<f64>,
}

fn event(name: &str, data: serde_json::Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

/// `POST /code`: Server-Sent Events — `stdout`/`stderr` `{type,
/// session_id, data}` as the code writes, `result` `{type, session_id,
/// data}` with a final expression's value, `error` `{type, session_id,
/// ename, evalue, traceback}` when it raised, then `end` `{type,
/// session_id, status: ok|error|timeout, duration_ms}`; a failure of the
/// session itself is one `error` event `{type, session_id, status, message}`.
pub async fn code(
    State(state): State<AppState>,
    identity: Identity,
    peer: crate::rate::Peer,
    headers: HeaderMap,
    admitted: Admitted<Fail>,
) -> Result<Response, Fail> {
    let body: CodeBody = admitted.json()?;
    check_language(body.language.as_deref())?;
    let timeout = match body.timeout {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 && t <= 86_400.0 => Some(Duration::from_secs_f64(t)),
        Some(_) => return Err(bad("timeout must be a positive number of seconds")),
    };
    let (caller, _) = caller(&state, &identity, &headers)?;
    crate::rate::starts_code(&state, &caller, peer.0).await?;
    let (session, id) = session(&state, &identity, &headers, &body.session_id, Control).await?;
    let kernels = workers(&state)?.kernels();
    let watch = crate::evals::start(
        &state, &headers, caller, kernels, session, body.code, timeout,
    )?;
    let run = watch.handle().clone();
    let sid = id.clone();
    let events = crate::evals::events(
        watch,
        move |stream, text| {
            let name = stream.as_str();
            event(
                name,
                serde_json::json!({ "type": name, "session_id": sid, "data": text }),
            )
        },
        move |_, answer| {
            let r = match answer {
                Ok(r) => r,
                Err(e) => {
                    let fail: Fail = Fail::from(e);
                    return vec![event(
                        "error",
                        serde_json::json!({
                            "type": "error", "session_id": id,
                            "status": fail.status.as_u16(), "message": fail.message,
                        }),
                    )];
                }
            };
            let mut events = Vec::new();
            if let Some(v) = &r.value {
                events.push(event(
                    "result",
                    serde_json::json!({ "type": "result", "session_id": id, "data": v }),
                ));
            }
            if let Some(e) = &r.error {
                events.push(event(
                    "error",
                    serde_json::json!({
                        "type": "error", "session_id": id,
                        "ename": e.ename, "evalue": e.evalue, "traceback": e.traceback,
                    }),
                ));
            }
            let status = crate::evals::status(&r);
            let ms = u64::try_from(r.wall_time.as_millis()).unwrap_or(u64::MAX);
            events.push(event(
                "end",
                serde_json::json!({ "type": "end", "session_id": id, "status": status, "duration_ms": ms }),
            ));
            events
        },
    );
    let mut resp = crate::sse::response(events);
    crate::sse::insert_run_id(resp.headers_mut(), &run);
    Ok(resp)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSession {
    language: Option<String>,
}

/// `POST /sessions`: a kernel of its own (Kiln's sessions API's, with its
/// per-user cap), beside the caller's default one.
pub async fn create_session(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    admitted: Admitted<Fail, Unresolved, JsonBody, Open>,
) -> Result<Response, Fail> {
    let body: NewSession = if headers.contains_key(CONTENT_TYPE) {
        admitted.json()?
    } else {
        NewSession::default()
    };
    check_language(body.language.as_deref())?;
    let (_, owner) = caller(&state, &identity, &headers)?;
    let info = workers(&state)?
        .kernels()
        .create(&owner, Language::default_kernel().name(), None)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({
            "session_id": info.id.as_str(),
            "language": Language::default_kernel().spec().common_name,
            "created_at": crate::runs::rfc3339(info.created_at),
        })),
    )
        .into_response())
}

/// `DELETE /sessions/{session_id}`.
pub async fn delete_session(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, Fail> {
    let Path(id) = path.map_err(|_| bad("malformed session id"))?;
    let (session, id) = session(&state, &identity, &headers, &Some(id), Control).await?;
    drop(session);
    workers(&state)?.kernels().delete(&parse_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesQuery {
    path: Option<String>,
    session_id: Option<String>,
}

fn files_query(q: Result<Query<FilesQuery>, QueryRejection>) -> Result<FilesQuery, Fail> {
    q.map(|Query(q)| q)
        .map_err(|e| bad(format!("invalid query: {}", e.body_text())))
}

/// `GET /files?path=`: every regular file below `path` (default
/// `/workspace`), recursively; links and special files are neither listed
/// nor followed.
pub async fn list_files(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    q: Result<Query<FilesQuery>, QueryRejection>,
) -> Result<Response, Fail> {
    let q = files_query(q)?;
    let dir = q.path.unwrap_or_else(|| WORKSPACE.to_owned());
    let prefix = workspace_path(&dir)?.map(|p| format!("{}/", p.as_str()));
    let (session, _) = session(&state, &identity, &headers, &q.session_id, Read).await?;
    let files = workers(&state)?.kernels().list_files(session).await?;
    let files: Vec<serde_json::Value> = files
        .into_iter()
        .filter(|(p, _)| prefix.as_deref().is_none_or(|pre| p.starts_with(pre)))
        .map(|(p, size)| {
            let name = p.rsplit('/').next().unwrap_or(&p).to_owned();
            serde_json::json!({ "path": format!("{WORKSPACE}/{p}"), "name": name, "size": size, "type": "file" })
        })
        .collect();
    Ok(Json(serde_json::json!({ "path": dir, "files": files })).into_response())
}

/// `POST /files/upload?path=` (multipart): each `file` part is written as
/// `path/<its file name>` (`path` defaults to `/workspace`; a `path` form
/// field before the parts works too).
pub async fn upload(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    q: Result<Query<FilesQuery>, QueryRejection>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Response, Fail> {
    let q = files_query(q)?;
    let mut multipart = multipart.map_err(|_| bad("the body must be multipart/form-data"))?;
    let (session, _) = session(&state, &identity, &headers, &q.session_id, Control).await?;
    let kernels = workers(&state)?.kernels();
    let mut dir = q.path.unwrap_or_else(|| WORKSPACE.to_owned());
    let mut written = Vec::new();
    let bad_form = |e: axum::extract::multipart::MultipartError| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Fail::new(StatusCode::PAYLOAD_TOO_LARGE, "request body too large")
        } else {
            bad("invalid multipart body")
        }
    };
    while let Some(field) = multipart.next_field().await.map_err(bad_form)? {
        if field.name() == Some("path") && field.file_name().is_none() {
            dir = field.text().await.map_err(bad_form)?.trim().to_owned();
            continue;
        }
        let Some(name) = field.file_name().map(str::to_owned) else {
            continue;
        };
        if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
            return Err(bad(format!("file name {name:?} must not contain '/'")));
        }
        let target = format!("{}/{name}", dir.trim_end_matches('/'));
        let rel = workspace_path(&target)?.ok_or_else(|| bad("no file name"))?;
        let bytes = field.bytes().await.map_err(bad_form)?;
        let size = bytes.len();
        kernels.write_file(Arc::clone(&session), rel, bytes).await?;
        written.push(serde_json::json!({ "path": target, "size": size }));
    }
    if written.is_empty() {
        return Err(bad("no file part in the form"));
    }
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "files": written })),
    )
        .into_response())
}

/// `GET /files/download?path=`.
pub async fn download(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    q: Result<Query<FilesQuery>, QueryRejection>,
) -> Result<Response, Fail> {
    let q = files_query(q)?;
    let path = q.path.ok_or_else(|| bad("path is required"))?;
    let rel = workspace_path(&path)?.ok_or_else(|| bad("path names a directory"))?;
    let (session, _) = session(&state, &identity, &headers, &q.session_id, Read).await?;
    let content_type = kiln_exec::content_type(rel.as_str());
    let name = rel.as_str().to_owned();
    let (file, size) = workers(&state)?.kernels().read_file(session, rel).await?;
    Ok(crate::sessions::file_response(
        file,
        size,
        &content_type,
        &name,
    ))
}

/// Kernels of this node and the host's load and memory.
fn metrics_now(state: &AppState) -> serde_json::Value {
    let (live, busy) = state
        .envs
        .kernels
        .as_ref()
        .map_or((0, 0), |k| (k.live(), k.busy()));
    let load: Vec<f64> = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|v| v.parse().ok())
        .collect();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|k| k * 1024)
    };
    serde_json::json!({
        "timestamp": crate::runs::rfc3339(std::time::SystemTime::now()),
        "sessions": { "live": live, "busy": busy },
        "cpu": {
            "count": std::thread::available_parallelism().map_or(1, usize::from),
            "load_average": load,
        },
        "memory": {
            "total_bytes": kib("MemTotal:"),
            "available_bytes": kib("MemAvailable:"),
        },
    })
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<AppState>) -> Response {
    Json(metrics_now(&state)).into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    interval_ms: Option<u64>,
}

/// `GET /metrics/watch?interval_ms=` (100–60000, default 1000): a
/// `metrics` event at once and then every interval, until the client goes.
pub async fn watch(
    State(state): State<AppState>,
    q: Result<Query<WatchQuery>, QueryRejection>,
) -> Result<Response, Fail> {
    let Query(q) = q.map_err(|e| bad(format!("invalid query: {}", e.body_text())))?;
    let every = q.interval_ms.unwrap_or(1000);
    if !(100..=60_000).contains(&every) {
        return Err(bad("interval_ms must be between 100 and 60000"));
    }
    let mut ticks = tokio::time::interval(Duration::from_millis(every));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let events = futures::stream::unfold((ticks, state), |(mut ticks, state)| async move {
        ticks.tick().await;
        let ev = event("metrics", metrics_now(&state));
        Some((Ok::<_, Infallible>(ev), (ticks, state)))
    });
    Ok(crate::sse::response(events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_paths_are_confined() {
        assert_eq!(workspace_path("/workspace").unwrap(), None);
        assert_eq!(workspace_path("/workspace/").unwrap(), None);
        assert_eq!(
            workspace_path("/workspace/a/b.txt")
                .unwrap()
                .unwrap()
                .as_str(),
            "a/b.txt"
        );
        for p in ["/etc/passwd", "/workspaces/x", "workspace/x", "/"] {
            assert_eq!(
                workspace_path(p).unwrap_err().status,
                StatusCode::FORBIDDEN,
                "{p}"
            );
        }
        for p in ["/workspace/../etc/passwd", "/workspace/a/../../x"] {
            assert_eq!(
                workspace_path(p).unwrap_err().status,
                StatusCode::BAD_REQUEST,
                "{p}"
            );
        }
    }
}
