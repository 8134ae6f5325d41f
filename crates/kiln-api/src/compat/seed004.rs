//! Seed 004's stateful Python gateway as a face: one live `py` kernel per
//! `(principal, user_uuid)` (`kiln_exec::workers`), started on first use.
//! Parsing and rendering only; errors are FastAPI's `{"detail": "..."}`.
//!
//! | Route (`/api/v1`) | What |
//! |---|---|
//! | `POST /execute?user_uuid=` `{code}` | evaluate → `{worker_id, result_text, result_base64}` |
//! | `POST /release?user_uuid=` | close the user's kernel → 204 |
//! | `GET /status` | `{total_workers, busy_workers, is_initializing}` |
//! | `POST /files?user_uuid=` `{files: [{download_url, path, name}]}` | import from URLs → 201 |
//! | `POST /files/export?user_uuid=` `{files: [{path, name, upload_url}]}` | upload to URLs → 200 |
//! | `DELETE /files?user_uuid=` `{files: [{path, name}]}` | delete → 204 |
//!
//! The seed's semantics kept: a timeout (504) or a dead kernel (503)
//! destroys the environment, and the next call starts a fresh one. Paths
//! are the seed's `/sandbox/...` (Kiln's `/mnt/data/...` is accepted too).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures::{StreamExt, TryStreamExt};
use kiln_core::{Language, Owner, RelPath};
use kiln_exec::kernels::{EvalResult, Kernel, KernelsError};
use kiln_exec::workers::{WorkerName, Workers};
use kiln_exec::{FetchError, Fetcher};
use serde::{Deserialize, Serialize};

use super::workers;
use crate::config::AppState;
use crate::error::ApiError;
use crate::identity::Identity;
use crate::kit::{Admitted, JsonBody, Open, Unresolved};

/// Most files one import, export or delete names (the seed's limit).
pub const MAX_FILES: usize = 100;
/// Transfers of one request that run at once.
const PARALLEL_TRANSFERS: usize = 4;
/// Largest figure returned inline as `result_base64`.
const MAX_INLINE_PNG: u64 = 10 * 1024 * 1024;

pub use crate::kit::envelope::Detail;

type Fail = super::Fail<Detail>;

fn bad(message: impl Into<String>) -> Fail {
    Fail::new(StatusCode::UNPROCESSABLE_ENTITY, message)
}

fn fetch_fail(file: &str, e: &FetchError) -> Fail {
    let status = match e {
        FetchError::BadUrl(_) | FetchError::Refused(_) => StatusCode::BAD_REQUEST,
        FetchError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        FetchError::Timeout => StatusCode::GATEWAY_TIMEOUT,
        FetchError::Redirect(_) | FetchError::Status(_) | FetchError::Network(_) => {
            StatusCode::BAD_GATEWAY
        }
    };
    Fail::new(status, format!("{file}: {e}"))
}

#[derive(Debug, Deserialize)]
pub struct UserQuery {
    user_uuid: Option<String>,
}

/// The worker the `user_uuid` query parameter names (1–128 of `A-Z a-z
/// 0-9 - _ .`), in this face's own name space.
fn user_uuid(q: &UserQuery) -> Result<WorkerName, Fail> {
    let u = q
        .user_uuid
        .as_deref()
        .ok_or_else(|| bad("user_uuid is required"))?;
    let ok = !u.is_empty()
        && u.len() <= 128
        && u.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !ok {
        return Err(bad(
            "user_uuid must be 1-128 characters of A-Z, a-z, 0-9, '-', '_', '.'",
        ));
    }
    Ok(WorkerName::Seed004(u.to_owned()))
}

fn fetcher(state: &AppState) -> Result<&Fetcher, Fail> {
    state.envs.fetcher.as_ref().ok_or_else(|| {
        Fail::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "file transfers are unavailable",
        )
    })
}

/// The owner of the caller's workers.
fn owner(state: &AppState, identity: &Identity, headers: &HeaderMap) -> Result<Owner, Fail> {
    let (_, owner) = crate::sessions::owner_of(state, identity, headers)?;
    Ok(owner)
}

/// A refusal of the shared layer in FastAPI's words (a bad body is
/// [`bad`]'s).
fn detail(e: ApiError) -> Fail {
    match e {
        ApiError::BadRequest(m) => bad(m),
        other => other.into(),
    }
}

/// `/sandbox/<dir>` + `name` → the path below `/mnt/data`.
fn sandbox_path(path: &str, name: &str) -> Result<RelPath, Fail> {
    if name.is_empty() || name.contains(['/', '\\']) || name == "." || name == ".." {
        return Err(bad(format!(
            "name {name:?} must be a file name without '/' or '\\'"
        )));
    }
    let dir = ["/sandbox", "/mnt/data"]
        .iter()
        .find_map(|root| {
            let rest = path.strip_prefix(root)?;
            (rest.is_empty() || rest.starts_with('/')).then_some(rest)
        })
        .ok_or_else(|| bad(format!("path {path:?} must be inside /sandbox")))?;
    let dir = dir.trim_matches('/');
    let rel = if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    };
    RelPath::parse(&rel).map_err(|e| bad(format!("path {path:?}: {e}")))
}

fn full_path(path: &str, name: &str) -> String {
    format!("{}/{name}", path.trim_end_matches('/'))
}

/// The workspace paths of a request's `files` (each a `(path, name)`):
/// one at least, [`MAX_FILES`] at most, each checked by [`sandbox_path`].
fn file_paths<'a>(
    files: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<RelPath>, Fail> {
    let n = files.len();
    if n == 0 {
        return Err(bad("files must name at least one file"));
    }
    if n > MAX_FILES {
        return Err(bad(format!("files names {n} files; at most {MAX_FILES}")));
    }
    files.map(|(path, name)| sandbox_path(path, name)).collect()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecuteBody {
    code: String,
}

#[derive(Debug, Serialize)]
pub struct ExecuteAnswer {
    worker_id: String,
    result_text: Option<String>,
    result_base64: Option<String>,
}

/// What the code printed, the value of its last expression and its error,
/// as one text (the seed's `result_text`); `None` when all are empty.
pub fn result_text(r: &EvalResult) -> Option<String> {
    let mut text = String::from_utf8_lossy(&r.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&r.stderr));
    let mut line = |s: &str| {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(s);
    };
    if let Some(v) = &r.value {
        line(v);
    }
    if let Some(e) = &r.error {
        let tb = e.traceback.concat();
        if tb.is_empty() {
            line(&format!("{}: {}", e.ename, e.evalue));
        } else {
            line(tb.trim_end_matches('\n'));
        }
    }
    (!text.is_empty()).then_some(text)
}

/// The last PNG the evaluation wrote (a saved or shown figure), base64.
async fn figure(
    workers: &Workers,
    session: &Arc<Kernel>,
    r: &EvalResult,
) -> Result<Option<String>, Fail> {
    let Some(png) = r
        .files
        .iter()
        .rev()
        .find(|f| f.path.to_ascii_lowercase().ends_with(".png") && f.size <= MAX_INLINE_PNG)
    else {
        return Ok(None);
    };
    let Ok(rel) = RelPath::parse(&png.path) else {
        return Ok(None);
    };
    let (file, _) = match workers.kernels().read_file(Arc::clone(session), rel).await {
        Ok(f) => f,
        Err(KernelsError::FileNotFound) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let bytes = tokio::task::spawn_blocking(move || {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(&file, MAX_INLINE_PNG), &mut buf)
            .map(|_| buf)
    })
    .await
    .map_err(|e| Fail::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(|e| Fail::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(Some(
        base64::engine::general_purpose::STANDARD.encode(bytes),
    ))
}

/// `POST /api/v1/execute?user_uuid=`.
pub async fn execute(
    State(state): State<AppState>,
    identity: Identity,
    peer: crate::rate::Peer,
    Query(q): Query<UserQuery>,
    headers: HeaderMap,
    admitted: Admitted<Fail>,
) -> Result<Response, Fail> {
    let user = user_uuid(&q)?;
    let workers = workers(&state)?;
    let (caller, owner) = crate::sessions::owner_of(&state, &identity, &headers)?;
    let body: ExecuteBody = admitted.json().map_err(detail)?;
    crate::rate::starts_code(&state, &caller, peer.0).await?;
    let (session, _) = workers
        .get_or_start(&owner, &user, Language::default_kernel())
        .await?;
    let worker_id = session_id(workers, &session);
    let watch = crate::evals::start(
        &state,
        &headers,
        caller,
        workers.kernels(),
        Arc::clone(&session),
        body.code,
        None,
    )?;
    let r = match crate::evals::finish(&watch).await {
        Ok(r) if r.timed_out => {
            workers.release(&owner, &user).await;
            return Err(Fail::new(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "execution timed out after {} s; the environment was destroyed",
                    r.wall_time.as_secs()
                ),
            ));
        }
        Ok(r) => r,
        Err(ApiError::Kernel(KernelsError::Lost(why))) => {
            workers.release(&owner, &user).await;
            return Err(Fail::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("session lost: {why}; the environment was destroyed"),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    let answer = ExecuteAnswer {
        worker_id,
        result_text: result_text(&r),
        result_base64: figure(workers, &session, &r).await?,
    };
    let mut resp = Json(answer).into_response();
    crate::sse::insert_run_id(resp.headers_mut(), &watch);
    Ok(resp)
}

fn session_id(workers: &Workers, session: &Kernel) -> String {
    workers.kernels().info(session).id.as_str().to_owned()
}

/// `POST /api/v1/release?user_uuid=`.
pub async fn release(
    State(state): State<AppState>,
    identity: Identity,
    Query(q): Query<UserQuery>,
    headers: HeaderMap,
) -> Result<Response, Fail> {
    let user = user_uuid(&q)?;
    let owner = owner(&state, &identity, &headers)?;
    workers(&state)?.release(&owner, &user).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Serialize)]
pub struct StatusAnswer {
    total_workers: usize,
    busy_workers: usize,
    is_initializing: bool,
}

/// `GET /api/v1/status`: this node's live kernels (every face's).
pub async fn status(State(state): State<AppState>) -> Result<Response, Fail> {
    let kernels = workers(&state)?.kernels();
    Ok(Json(StatusAnswer {
        total_workers: kernels.live(),
        busy_workers: kernels.busy(),
        is_initializing: !kernels.ready(),
    })
    .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportFile {
    download_url: String,
    path: String,
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportBody {
    files: Vec<ImportFile>,
}

/// `POST /api/v1/files?user_uuid=`: downloads each URL (no redirects, the
/// SSRF guard, the size cap) and writes it atomically into the user's
/// workspace. The first failure answers for the request; files written
/// before it stay.
pub async fn import(
    State(state): State<AppState>,
    identity: Identity,
    Query(q): Query<UserQuery>,
    headers: HeaderMap,
    admitted: Admitted<Fail, Unresolved, JsonBody, Open>,
) -> Result<Response, Fail> {
    let user = user_uuid(&q)?;
    let owner = owner(&state, &identity, &headers)?;
    let (workers, fetcher) = (workers(&state)?, fetcher(&state)?);
    let body: ImportBody = admitted.json().map_err(detail)?;
    let targets = file_paths(
        body.files
            .iter()
            .map(|f| (f.path.as_str(), f.name.as_str())),
    )?;
    let (session, _) = workers
        .get_or_start(&owner, &user, Language::default_kernel())
        .await?;
    let transfers: Vec<_> = body
        .files
        .into_iter()
        .zip(targets)
        .map(|(f, rel)| {
            let session = Arc::clone(&session);
            let (workers, fetcher) = (workers.clone(), fetcher.clone());
            async move {
                let shown = full_path(&f.path, &f.name);
                let bytes = fetcher
                    .download(&f.download_url)
                    .await
                    .map_err(|e| fetch_fail(&shown, &e))?;
                let size = bytes.len();
                workers.kernels().write_file(session, rel, bytes).await?;
                Ok::<_, Fail>(serde_json::json!({ "full_path": shown, "size": size }))
            }
        })
        .collect();
    let results: Vec<serde_json::Value> = futures::stream::iter(transfers)
        .buffered(PARALLEL_TRANSFERS)
        .try_collect()
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "success": true, "results": results })),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportFile {
    path: String,
    name: String,
    upload_url: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportBody {
    files: Vec<ExportFile>,
}

fn no_worker() -> Fail {
    Fail::new(
        StatusCode::NOT_FOUND,
        "no session for this user_uuid: execute code or import files first",
    )
}

/// `POST /api/v1/files/export?user_uuid=`: PUTs each workspace file to its
/// upload URL (the same guard as imports).
pub async fn export(
    State(state): State<AppState>,
    identity: Identity,
    Query(q): Query<UserQuery>,
    headers: HeaderMap,
    admitted: Admitted<Fail, Unresolved, JsonBody, Open>,
) -> Result<Response, Fail> {
    let user = user_uuid(&q)?;
    let owner = owner(&state, &identity, &headers)?;
    let (workers, fetcher) = (workers(&state)?, fetcher(&state)?);
    let body: ExportBody = admitted.json().map_err(detail)?;
    let sources = file_paths(
        body.files
            .iter()
            .map(|f| (f.path.as_str(), f.name.as_str())),
    )?;
    let session = workers.find(&owner, &user).ok_or_else(no_worker)?;
    let max = fetcher.policy().max_bytes;
    let transfers: Vec<_> = body
        .files
        .into_iter()
        .zip(sources)
        .map(|(f, rel)| {
            let session = Arc::clone(&session);
            let (workers, fetcher) = (workers.clone(), fetcher.clone());
            async move {
                let shown = full_path(&f.path, &f.name);
                let (file, size) = match workers.kernels().read_file(session, rel).await {
                    Err(KernelsError::FileNotFound) => {
                        return Err(Fail::new(
                            StatusCode::NOT_FOUND,
                            format!("{shown}: no such file"),
                        ));
                    }
                    other => other?,
                };
                if size > max {
                    return Err(fetch_fail(&shown, &FetchError::TooLarge(max)));
                }
                let bytes = tokio::task::spawn_blocking(move || {
                    let mut buf = Vec::new();
                    std::io::Read::read_to_end(&mut std::io::Read::take(&file, max), &mut buf)
                        .map(|_| bytes::Bytes::from(buf))
                })
                .await
                .map_err(|e| Fail::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
                .map_err(|e| Fail::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
                let sent = bytes.len();
                fetcher
                    .upload(&f.upload_url, bytes)
                    .await
                    .map_err(|e| fetch_fail(&shown, &e))?;
                Ok::<_, Fail>(serde_json::json!({ "path": f.path, "name": f.name, "size": sent }))
            }
        })
        .collect();
    let results: Vec<serde_json::Value> = futures::stream::iter(transfers)
        .buffered(PARALLEL_TRANSFERS)
        .try_collect()
        .await?;
    Ok(Json(serde_json::json!({ "success": true, "results": results })).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteFile {
    path: String,
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteBody {
    files: Vec<DeleteFile>,
}

/// `DELETE /api/v1/files?user_uuid=`: removes the files (a file already
/// absent is not an error).
pub async fn delete(
    State(state): State<AppState>,
    identity: Identity,
    Query(q): Query<UserQuery>,
    headers: HeaderMap,
    admitted: Admitted<Fail, Unresolved, JsonBody, Open>,
) -> Result<Response, Fail> {
    let user = user_uuid(&q)?;
    let owner = owner(&state, &identity, &headers)?;
    let workers = workers(&state)?;
    let body: DeleteBody = admitted.json().map_err(detail)?;
    let targets = file_paths(
        body.files
            .iter()
            .map(|f| (f.path.as_str(), f.name.as_str())),
    )?;
    let session = workers.find(&owner, &user).ok_or_else(no_worker)?;
    for rel in targets {
        match workers
            .kernels()
            .delete_file(Arc::clone(&session), rel)
            .await
        {
            Ok(()) | Err(KernelsError::FileNotFound) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_paths_stay_in_the_workspace() {
        assert_eq!(
            sandbox_path("/sandbox/", "a.csv").unwrap().as_str(),
            "a.csv"
        );
        assert_eq!(sandbox_path("/sandbox", "a.csv").unwrap().as_str(), "a.csv");
        assert_eq!(
            sandbox_path("/sandbox/in/", "a.csv").unwrap().as_str(),
            "in/a.csv"
        );
        assert_eq!(
            sandbox_path("/mnt/data", "a.csv").unwrap().as_str(),
            "a.csv"
        );
        for (path, name) in [
            ("/sandbox/", "../etc/passwd"),
            ("/sandbox/", "a/b"),
            ("/sandbox/", "a\\b"),
            ("/sandbox/", ".."),
            ("/sandbox/", ""),
            ("/sandbox/../etc", "passwd"),
            ("/etc", "passwd"),
            ("/sandboxes", "x"),
            ("sandbox", "x"),
        ] {
            let e = sandbox_path(path, name).expect_err(&format!("{path} {name}"));
            assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        }
    }

    #[test]
    fn result_text_joins_output_value_and_error() {
        let r = EvalResult {
            stdout: b"a\n".to_vec(),
            value: Some("3".into()),
            ..EvalResult::default()
        };
        assert_eq!(result_text(&r).as_deref(), Some("a\n3"));
        assert_eq!(result_text(&EvalResult::default()), None);
        let r = EvalResult {
            stdout: b"x".to_vec(),
            error: Some(kiln_exec::kernels::EvalError {
                ename: "NameError".into(),
                evalue: "name 'b' is not defined".into(),
                traceback: vec![],
            }),
            ..EvalResult::default()
        };
        assert_eq!(
            result_text(&r).as_deref(),
            Some("x\nNameError: name 'b' is not defined")
        );
    }
}
