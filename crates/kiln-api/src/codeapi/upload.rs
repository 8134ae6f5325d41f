//! `POST /upload` and `POST /upload/batch` (spec §8): multipart forms whose
//! scope fields (`kind`, `id`, `version`, `read_only`, `entity_id`) precede
//! the file parts. One new storage session per request, created when the
//! first valid file part starts; every part is streamed into the store with
//! a per-file limit, never buffered whole.
//!
//! Single uploads are all-or-nothing: any failure answers an error and
//! removes what this request stored. Batch uploads report per-file results;
//! only request-level failures (broken multipart, bad scope fields) remove
//! what was stored.

use axum::Json;
use axum::extract::multipart::{Field, MultipartError, MultipartRejection};
use axum::extract::{Multipart, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt as _;
use kiln_core::{Nanoid, RelPath, SessionKey};
use kiln_store::{NewObject, StoreError};
use serde_json::{Value, json};

use crate::config::{ApiConfig, AppState};
use crate::error::ApiError;
use crate::identity::{Caller, Identity, derive_key, entity_keys, header_user_id, resolve_caller};

/// Longest accepted value of a non-file form field.
const MAX_FIELD_BYTES: usize = 4096;
/// Most non-file form fields per request.
const MAX_FIELDS: usize = 64;
/// Scope fields that only take effect before the first file part.
const SCOPE_FIELDS: &[&str] = &["kind", "id", "version", "read_only", "entity_id"];

/// The largest whole multipart body accepted on the upload routes: every
/// allowed file at the per-file limit plus generous framing.
pub fn upload_body_limit(config: &ApiConfig) -> usize {
    let per_file = config.max_upload_bytes.saturating_add(64 * 1024);
    let total = per_file
        .saturating_mul(config.max_batch_files.max(1) as u64)
        .saturating_add(1024 * 1024);
    usize::try_from(total).unwrap_or(usize::MAX)
}

/// The multipart form of `/upload` and `/upload/batch`: scope fields first,
/// then the file parts (`file`, or `files` for a batch).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)] // a schema: the form is parsed part by part
pub struct UploadForm {
    /// `user`, `agent` or `skill`.
    kind: Option<String>,
    /// The scope's id (for `user`: the caller, an identity hint).
    id: Option<String>,
    /// Skill version (required for `skill`).
    version: Option<String>,
    /// `true`: inputs made from it are read-only in the jail.
    read_only: Option<bool>,
    /// G1: the agent (or user) the files belong to.
    entity_id: Option<String>,
    /// The file(s); each part's filename is the stored name.
    #[schema(format = Binary, content_media_type = "application/octet-stream")]
    file: Vec<String>,
}

/// One stored file.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct UploadedFile {
    #[serde(rename = "fileId")]
    pub file_id: String,
    pub filename: String,
}

/// `/upload`'s answer.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct UploadResponse {
    /// `success`.
    pub message: String,
    pub storage_session_id: String,
    /// The same as `storage_session_id` (older clients read this).
    pub session_id: String,
    pub files: Vec<UploadedFile>,
}

#[utoipa::path(
    post,
    path = "/upload",
    operation_id = "upload",
    tag = "LibreChat",
    summary = "Upload a file",
    params(("User-Id" = Option<String>, Header, description = "The caller (identity hint)")),
    request_body(content = UploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "OK", body = UploadResponse),
        (status = 400, description = "Bad request", body = crate::error::ErrorBody),
        (status = 413, description = "Too large", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or invalid credentials", body = crate::error::ErrorBody),
        (status = 429, description = "Rate limited (`Retry-After`, `RateLimit-*`)", body = crate::error::ErrorBody),
        (status = 507, description = "The caller's storage quota is used up, or the server's disk is at its floor", body = crate::error::ErrorBody),
    )
)]
pub async fn upload(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Response, ApiError> {
    let multipart = multipart.map_err(|_| invalid_content_type())?;
    let outcome = receive(&state, &identity, &headers, multipart, Mode::Single).await?;
    let files: Vec<UploadedFile> = outcome
        .results
        .iter()
        .filter_map(|r| match r {
            FileResult::Stored { file_id, filename } => Some(UploadedFile {
                file_id: file_id.as_str().to_owned(),
                filename: filename.clone(),
            }),
            FileResult::Failed { .. } => None,
        })
        .collect();
    Ok(Json(UploadResponse {
        message: "success".to_owned(),
        storage_session_id: outcome.session.as_str().to_owned(),
        session_id: outcome.session.as_str().to_owned(),
        files,
    })
    .into_response())
}

#[utoipa::path(
    post,
    path = "/upload/batch",
    operation_id = "uploadBatch",
    tag = "LibreChat",
    summary = "Upload several files",
    description = "Per-file results: `{message: success|partial_success|error, storage_session_id, session_id, files: [{status, fileId?, filename, error?}], succeeded, failed, filesLimitReached?, maxFiles?}`.",
    request_body(content = UploadForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "Some or all files stored", body = Object),
        (status = 400, description = "No file stored", body = Object),
        (status = 413, description = "Too large", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or invalid credentials", body = crate::error::ErrorBody),
        (status = 429, description = "Rate limited (`Retry-After`, `RateLimit-*`)", body = crate::error::ErrorBody),
    )
)]
pub async fn upload_batch(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Response, ApiError> {
    let multipart = multipart.map_err(|_| invalid_content_type())?;
    let outcome = receive(&state, &identity, &headers, multipart, Mode::Batch).await?;
    let succeeded = outcome
        .results
        .iter()
        .filter(|r| matches!(r, FileResult::Stored { .. }))
        .count();
    let failed = outcome.results.len() - succeeded;
    let files: Vec<Value> = outcome
        .results
        .iter()
        .map(|r| match r {
            FileResult::Stored { file_id, filename } => {
                json!({ "status": "success", "fileId": file_id.as_str(), "filename": filename })
            }
            FileResult::Failed { filename, error } => {
                json!({ "status": "error", "filename": filename, "error": error })
            }
        })
        .collect();
    let (message, status) = match (succeeded, failed) {
        (_, 0) => ("success", StatusCode::OK),
        (0, _) => ("error", StatusCode::BAD_REQUEST),
        _ => ("partial_success", StatusCode::OK),
    };
    let mut body = json!({
        "message": message,
        "storage_session_id": outcome.session.as_str(),
        "session_id": outcome.session.as_str(),
        "files": files,
        "succeeded": succeeded,
        "failed": failed,
    });
    if outcome.limit_reached {
        body["filesLimitReached"] = json!(true);
        body["maxFiles"] = json!(state.config.max_batch_files);
    }
    Ok((status, Json(body)).into_response())
}

fn invalid_content_type() -> ApiError {
    ApiError::BadRequest("Invalid content type. Must be multipart/form-data.".to_owned())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Single,
    Batch,
}

#[derive(Debug)]
enum FileResult {
    Stored { file_id: Nanoid, filename: String },
    Failed { filename: String, error: String },
}

struct Outcome {
    session: Nanoid,
    results: Vec<FileResult>,
    limit_reached: bool,
}

/// The scope fields seen before the first file part.
#[derive(Debug, Default)]
struct Form {
    kind: Option<String>,
    id: Option<String>,
    version: Option<String>,
    read_only: Option<String>,
    entity_id: Option<String>,
}

impl Form {
    fn set(&mut self, name: &str, value: String) {
        let value = value.trim().to_owned();
        let slot = match name {
            "kind" => &mut self.kind,
            "id" => &mut self.id,
            "version" => &mut self.version,
            "read_only" => &mut self.read_only,
            "entity_id" => &mut self.entity_id,
            _ => return,
        };
        *slot = (!value.is_empty()).then_some(value);
    }

    /// `id` when `kind=user`: an identity source, like the query's.
    fn user_hint(&self) -> Option<&str> {
        match (self.kind.as_deref(), self.id.as_deref()) {
            (Some("user"), Some(id)) => Some(id),
            _ => None,
        }
    }

    fn read_only(&self) -> Result<bool, ApiError> {
        match self
            .read_only
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") => Ok(true),
            Some(_) => Err(ApiError::BadRequest(
                "read_only must be true or false".to_owned(),
            )),
        }
    }

    /// The session key: `kind`/`id`/`version`, else G1 `entity_id` (agent
    /// scope unless it names the caller), else the caller's user scope.
    fn session_key(&self, caller: &Caller) -> Result<SessionKey, ApiError> {
        if let Some(kind) = &self.kind {
            return derive_key(
                &caller.principal,
                kind,
                self.id.as_deref(),
                self.version.as_deref(),
            );
        }
        if let Some(entity) = &self.entity_id {
            let keys = entity_keys(caller, entity)?;
            if let Some(first) = keys.into_iter().next() {
                return Ok(first);
            }
        }
        derive_key(&caller.principal, "user", None, self.version.as_deref())
    }
}

/// The session of this request, once its first valid file part arrived.
struct Scope {
    key: SessionKey,
    /// The uploader, whose quota the files count against.
    owner: SessionKey,
    read_only: bool,
    /// Whether the session's row exists (made with its first file).
    created: bool,
    /// Whether a file reached the store (today's session is then made).
    attempted: bool,
}

async fn receive(
    state: &AppState,
    identity: &Identity,
    headers: &HeaderMap,
    mut multipart: Multipart,
    mode: Mode,
) -> Result<Outcome, ApiError> {
    let session = Nanoid::random();
    let mut stored: Vec<Nanoid> = Vec::new();
    let result = receive_parts(
        state,
        identity,
        headers,
        &mut multipart,
        mode,
        &session,
        &mut stored,
    )
    .await;
    // whatever the answer, the client may still be writing the body
    crate::body::drain_multipart(&mut multipart).await;
    match result {
        Ok((results, limit_reached)) => {
            tracing::info!(session = %session, files = results.len(), stored = stored.len(),
                limit_reached, "upload");
            Ok(Outcome {
                session,
                results,
                limit_reached,
            })
        }
        Err(e) => {
            discard(state, &session, &stored).await;
            Err(e)
        }
    }
}

/// Remove what a failed request stored (best effort; gc covers the rest).
async fn discard(state: &AppState, session: &Nanoid, stored: &[Nanoid]) {
    for file in stored {
        if let Err(e) = state.store.delete(session, file).await {
            tracing::warn!(session = %session, file = %file, error = %e,
                "removing an object of a failed upload");
        }
    }
}

async fn receive_parts(
    state: &AppState,
    identity: &Identity,
    headers: &HeaderMap,
    multipart: &mut Multipart,
    mode: Mode,
    session: &Nanoid,
    stored: &mut Vec<Nanoid>,
) -> Result<(Vec<FileResult>, bool), ApiError> {
    let config = &state.config;
    let mut form = Form::default();
    let mut scope: Option<Scope> = None;
    let mut results = Vec::new();
    let mut fields = 0usize;
    let mut file_parts = 0usize;
    let mut limit_reached = false;

    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|e| multipart_error(e, config))?
    {
        let is_file = field.file_name().is_some() || matches!(field.name(), Some("file" | "files"));
        if !is_file {
            fields += 1;
            if fields > MAX_FIELDS {
                return Err(ApiError::BadRequest("Too many form fields".to_owned()));
            }
            let name = field.name().unwrap_or_default().to_owned();
            let value = small_text(field, config).await?;
            if SCOPE_FIELDS.contains(&name.as_str()) {
                if file_parts > 0 {
                    return Err(ApiError::BadRequest(format!(
                        "Form field {name} must precede the file parts"
                    )));
                }
                form.set(&name, value);
            }
            continue;
        }

        file_parts += 1;
        if file_parts > config.max_batch_files {
            limit_reached = true;
            break;
        }
        // Identity and scope are fixed by the fields before the first file part.
        let scope = match scope {
            Some(ref mut s) => s,
            None => {
                let caller = resolve_caller(
                    config,
                    identity,
                    &[header_user_id(headers)?, form.user_hint()],
                )?;
                scope.insert(Scope {
                    key: form.session_key(&caller)?,
                    owner: kiln_core::Owner::of(&caller).key(),
                    read_only: form.read_only()?,
                    created: false,
                    attempted: false,
                })
            }
        };
        let raw_name = field.file_name().unwrap_or_default().to_owned();
        let name = match RelPath::parse(&raw_name) {
            Ok(n) => n,
            Err(e) => {
                let error = format!("Invalid filename: {e}");
                match mode {
                    Mode::Single => return Err(ApiError::BadRequest(error)),
                    Mode::Batch => {
                        results.push(FileResult::Failed {
                            filename: raw_name,
                            error,
                        });
                        continue;
                    }
                }
            }
        };
        let file_id = Nanoid::random();
        let content_type = content_type(field.content_type(), &name);
        let obj = NewObject {
            session_id: session.clone(),
            file_id: file_id.clone(),
            name: name.clone(),
            content_type,
            read_only: scope.read_only,
        };
        let body = field.map_err(std::io::Error::other);
        let put = if scope.created {
            // the session was created with this owner: the store need not
            // read it back
            state
                .store
                .put_stream_owned(obj, &scope.owner, body, config.max_upload_bytes)
                .await
        } else {
            // the session's row and its first object's in one round-trip
            let put = state
                .store
                .create_session_with(&scope.key, &scope.owner, obj, body, config.max_upload_bytes)
                .await;
            match put {
                // the session could not be made: the whole request fails,
                // in a batch too
                Err(source @ (StoreError::Conflict(_) | StoreError::Database(_))) => {
                    return Err(ApiError::CreateSession {
                        session: session.clone(),
                        source,
                    });
                }
                // a refusal by the quota leaves the session made
                Ok(_) | Err(StoreError::QuotaExceeded { .. }) => scope.created = true,
                Err(_) => {}
            }
            put
        };
        scope.attempted = true;
        match put {
            Ok(_) => {
                stored.push(file_id.clone());
                results.push(FileResult::Stored {
                    file_id,
                    filename: name.as_str().to_owned(),
                });
            }
            Err(StoreError::TooLarge { limit }) => match mode {
                Mode::Single => {
                    return Err(ApiError::UploadTooLarge {
                        name: name.as_str().to_owned(),
                        limit,
                    });
                }
                Mode::Batch => results.push(FileResult::Failed {
                    filename: name.as_str().to_owned(),
                    error: "File size limit exceeded".to_owned(),
                }),
            },
            Err(e @ (StoreError::QuotaExceeded { .. } | StoreError::DiskFull { .. })) => match mode
            {
                Mode::Single => return Err(ApiError::InsufficientStorage(e)),
                Mode::Batch => results.push(FileResult::Failed {
                    filename: name.as_str().to_owned(),
                    error: crate::error::storage_refusal(&e),
                }),
            },
            // The multipart body itself broke: the whole request is bad.
            Err(StoreError::BodyRead(io)) => return Err(body_read_error(io, config)),
            Err(source) => match mode {
                Mode::Single => {
                    return Err(ApiError::StoreUpload {
                        session: session.clone(),
                        file: file_id,
                        source,
                    });
                }
                Mode::Batch => {
                    tracing::error!(session = %session, file = %file_id, error = %source,
                        "storing an uploaded file failed");
                    results.push(FileResult::Failed {
                        filename: name.as_str().to_owned(),
                        error: "Error uploading file".to_owned(),
                    });
                }
            },
        }
    }

    if file_parts == 0 {
        return Err(ApiError::BadRequest("No files provided".to_owned()));
    }
    // a batch whose every file was refused still answers a session that
    // exists (empty), as when the session was made before its first file
    if let Some(scope) = scope.as_ref().filter(|s| s.attempted && !s.created) {
        state
            .store
            .create_session_owned(session, &scope.key, &scope.owner)
            .await
            .map_err(|source| ApiError::CreateSession {
                session: session.clone(),
                source,
            })?;
    }
    Ok((results, limit_reached))
}

/// Read a non-file field, refusing values over [`MAX_FIELD_BYTES`].
async fn small_text(mut field: Field<'_>, config: &ApiConfig) -> Result<String, ApiError> {
    let mut buf = Vec::new();
    while let Some(chunk) = field
        .chunk()
        .await
        .map_err(|e| multipart_error(e, config))?
    {
        buf.extend_from_slice(&chunk);
        if buf.len() > MAX_FIELD_BYTES {
            return Err(ApiError::BadRequest(
                "Form field value too large".to_owned(),
            ));
        }
    }
    String::from_utf8(buf).map_err(|_| ApiError::BadRequest("Form fields must be UTF-8".to_owned()))
}

fn multipart_error(e: MultipartError, config: &ApiConfig) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::BodyTooLarge {
            limit: upload_body_limit(config) as u64,
        }
    } else {
        tracing::debug!(error = %e.body_text(), "malformed multipart body");
        ApiError::BadRequest("Invalid multipart body".to_owned())
    }
}

fn body_read_error(io: std::io::Error, config: &ApiConfig) -> ApiError {
    match io
        .into_inner()
        .map(|inner| inner.downcast::<MultipartError>())
    {
        Some(Ok(mp)) => multipart_error(*mp, config),
        _ => ApiError::BadRequest("Invalid multipart body".to_owned()),
    }
}

/// The part's declared type, unless absent or generic; then a guess from
/// the name; then `application/octet-stream`.
pub fn content_type(declared: Option<&str>, name: &RelPath) -> String {
    match declared.map(str::trim) {
        Some(ct) if !ct.is_empty() && !ct.eq_ignore_ascii_case("application/octet-stream") => {
            ct.to_owned()
        }
        _ => kiln_exec::content_type(name.file_name()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_type_prefers_the_declared_type_then_guesses() {
        let csv = RelPath::parse("data/a.csv").unwrap();
        assert_eq!(content_type(Some("text/x-custom"), &csv), "text/x-custom");
        assert_eq!(
            content_type(Some("application/octet-stream"), &csv),
            "text/csv"
        );
        assert_eq!(content_type(None, &csv), "text/csv");
        let blob = RelPath::parse("blob").unwrap();
        assert_eq!(content_type(None, &blob), "application/octet-stream");
    }

    #[test]
    fn form_scope_rules() {
        let alice = Caller::identified("local", "alice");
        let mut f = Form::default();
        assert_eq!(f.session_key(&alice).unwrap().as_str(), "local:user:alice");
        f.set("entity_id", "agent_1".into());
        assert_eq!(
            f.session_key(&alice).unwrap().as_str(),
            "local:agent:agent_1"
        );
        f.set("entity_id", "alice".into());
        assert_eq!(f.session_key(&alice).unwrap().as_str(), "local:user:alice");
        f.set("kind", "skill".into());
        f.set("id", "sk".into());
        assert!(f.session_key(&alice).is_err());
        f.set("version", "3".into());
        assert_eq!(
            f.session_key(&alice).unwrap().as_str(),
            "local:skill:sk:v:3"
        );
        f.set("read_only", "TRUE".into());
        assert!(f.read_only().unwrap());
        f.set("read_only", "maybe".into());
        assert!(f.read_only().is_err());
    }

    #[test]
    fn body_limit_covers_a_full_batch() {
        let c = ApiConfig::default();
        assert!(upload_body_limit(&c) as u64 > c.max_upload_bytes * c.max_batch_files as u64);
        let huge = ApiConfig {
            max_upload_bytes: u64::MAX,
            ..ApiConfig::default()
        };
        assert_eq!(upload_body_limit(&huge), usize::MAX);
    }
}
