//! Reading stored sessions: `GET /download/{sid}/{fid}`, `GET /files/{sid}`,
//! `GET /sessions/{sid}/objects/{fid}` and the two `DELETE` aliases
//! (spec §9–§11). Every route checks both ids, then the session's scope
//! (see [`crate::identity`]) before touching an object.

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::header::{CONTENT_DISPOSITION, CONTENT_LENGTH, CONTENT_TYPE, ETAG, LAST_MODIFIED};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt as _;
use kiln_core::Nanoid;
use kiln_store::{ObjectMeta, StoreError};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc2822;
use time::macros::format_description;

use crate::config::AppState;
use crate::error::ApiError;
use crate::identity::{Identity, ScopeQuery, authorize_session, parse_id};

type PathIds = Result<Path<(String, String)>, PathRejection>;
type PathSession = Result<Path<String>, PathRejection>;
type ScopeParams = Result<Query<ScopeQuery>, QueryRejection>;

fn query(q: ScopeParams) -> Result<ScopeQuery, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|_| ApiError::BadRequest("Bad request".to_owned()))
}

fn ids(p: PathIds) -> Result<(Nanoid, Nanoid), ApiError> {
    let Path((sid, fid)) = p.map_err(|_| ApiError::MalformedId)?;
    Ok((parse_id(&sid)?, parse_id(&fid)?))
}

/// Look the session up and check the caller may read it.
async fn authorized(
    state: &AppState,
    identity: &Identity,
    headers: &HeaderMap,
    q: &ScopeQuery,
    session: &Nanoid,
    file: Option<&Nanoid>,
) -> Result<(), ApiError> {
    let caller = q.caller(&state.config, identity, headers)?;
    let info = state
        .store
        .session(session)
        .await
        .map_err(|source| ApiError::SessionLookup {
            session: session.clone(),
            source,
        })?
        .ok_or_else(|| ApiError::FileNotFound {
            session: session.clone(),
            file: file.cloned(),
        })?;
    authorize_session(&state.config, &caller, q, session, &info.key)
}

#[utoipa::path(
    get,
    path = "/download/{session_id}/{file_id}",
    operation_id = "download",
    tag = "LibreChat",
    summary = "Download a stored file",
    description = "Waits up to 7 s for an object that is not visible yet (read-after-write after /exec).",
    params(
        ("session_id" = String, Path, description = "Storage session (21-char nanoid)"),
        ("file_id" = String, Path, description = "File id (21-char nanoid)"),
        ScopeQuery,
    ),
    responses(
        (status = 200, description = "The bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "Bad request", body = crate::error::ErrorBody),
        (status = 403, description = "Not readable by the caller", body = crate::error::ErrorBody),
        (status = 404, description = "Not found", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or invalid credentials", body = crate::error::ErrorBody),
        (status = 429, description = "Rate limited (`Retry-After`, `RateLimit-*`)", body = crate::error::ErrorBody),
    )
)]
pub async fn download(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: PathIds,
    q: ScopeParams,
) -> Result<Response, ApiError> {
    let (sid, fid) = ids(path)?;
    let q = query(q)?;
    authorized(&state, &identity, &headers, &q, &sid, Some(&fid)).await?;
    stored_file(&state, sid, fid).await
}

/// The stored file `fid` of session `sid` as a download, for a caller
/// already authorized (the download route, the operator's run view).
pub(crate) async fn stored_file(
    state: &AppState,
    sid: Nanoid,
    fid: Nanoid,
) -> Result<Response, ApiError> {
    let meta = find_object(state, &sid, &fid).await?;
    let stream = match state.store.read(&meta).await {
        Ok(s) => s,
        Err(StoreError::NotFound) => {
            return Err(ApiError::DownloadNotFound {
                session: sid,
                file: fid,
            });
        }
        Err(source) => {
            return Err(ApiError::Download {
                session: sid,
                file: fid,
                source,
            });
        }
    };
    let (s2, f2) = (sid.clone(), fid.clone());
    let stream = stream.inspect_err(move |e| {
        tracing::error!(session = %s2, file = %f2, error = %e, "download stream failed");
    });

    let mut resp = file_response(&meta, Body::from_stream(stream));
    let h = resp.headers_mut();
    if let Ok(etag) = HeaderValue::from_str(&meta.etag()) {
        h.insert(ETAG, etag);
    }
    if let Some(lm) = http_date(meta.created_at_ms).and_then(|d| HeaderValue::from_str(&d).ok()) {
        h.insert(LAST_MODIFIED, lm);
    }
    Ok(resp)
}

/// A stored file's bytes with its `Content-Type`, `Content-Length` and an
/// attachment `Content-Disposition` (every face's download).
pub fn file_response(meta: &ObjectMeta, body: Body) -> Response {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_str(&meta.content_type)
            .unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    h.insert(CONTENT_LENGTH, HeaderValue::from(meta.size));
    download_headers(h, &meta.name);
    resp
}

/// What every file a program wrote is served with, whatever its type
/// (`text/html`, `image/svg+xml`): an attachment named `name`, never
/// rendered inline on the server's origin (the console's); the type is
/// what the file's name suggests and a browser must not guess another (a
/// `.txt` holding HTML stays text); and, should it be opened anyway, a
/// sandbox with no script and no fetch.
pub fn download_headers(h: &mut axum::http::HeaderMap, name: &str) {
    h.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        CONTENT_DISPOSITION,
        HeaderValue::from_str(&content_disposition(name))
            .unwrap_or(HeaderValue::from_static("attachment")),
    );
    h.insert(
        axum::http::header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; sandbox"),
    );
}

/// The object, or 404 at once: Kiln stores a run's outputs before its
/// `/exec` answers (and an upload's before its reply), so there is no
/// read-after-write window to wait out, unlike the official server's
/// 14 × 500 ms poll that only delays every 404.
async fn find_object(state: &AppState, sid: &Nanoid, fid: &Nanoid) -> Result<ObjectMeta, ApiError> {
    state
        .store
        .object(sid, fid)
        .await
        .map_err(|source| ApiError::Download {
            session: sid.clone(),
            file: fid.clone(),
            source,
        })?
        .ok_or_else(|| ApiError::DownloadNotFound {
            session: sid.clone(),
            file: fid.clone(),
        })
}

/// Listing shapes of `GET /files/{sid}?detail=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Detail {
    Simple,
    Summary,
    Full,
    Normalized,
}

impl Detail {
    fn parse(s: Option<&str>) -> Result<Detail, ApiError> {
        match s.unwrap_or("simple") {
            "simple" => Ok(Detail::Simple),
            "summary" => Ok(Detail::Summary),
            "full" => Ok(Detail::Full),
            "normalized" => Ok(Detail::Normalized),
            _ => Err(ApiError::BadRequest(
                "detail must be one of: simple, summary, full, normalized".to_owned(),
            )),
        }
    }
}

#[utoipa::path(
    get,
    path = "/files/{session_id}",
    operation_id = "listSession",
    tag = "LibreChat",
    summary = "List a storage session",
    params(
        ("session_id" = String, Path, description = "Storage session"),
        ScopeQuery,
    ),
    responses(
        (status = 200, description = "One item per object; its shape follows `detail`: a string with `simple` (the default), an object with the others", body = Vec<ListItem>),
        (status = 400, description = "Bad request", body = crate::error::ErrorBody),
        (status = 403, description = "Not readable by the caller", body = crate::error::ErrorBody),
        (status = 404, description = "Not found", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or invalid credentials", body = crate::error::ErrorBody),
        (status = 429, description = "Rate limited (`Retry-After`, `RateLimit-*`)", body = crate::error::ErrorBody),
    )
)]
pub async fn list(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: PathSession,
    q: ScopeParams,
) -> Result<Response, ApiError> {
    let Path(sid) = path.map_err(|_| ApiError::MalformedId)?;
    let sid = parse_id(&sid)?;
    let q = query(q)?;
    let detail = Detail::parse(q.detail.as_deref())?;
    authorized(&state, &identity, &headers, &q, &sid, None).await?;
    let objects = state
        .store
        .list(&sid)
        .await
        .map_err(|source| ApiError::ListSession {
            session: sid.clone(),
            source,
        })?;
    let items: Vec<Value> = objects.iter().map(|m| list_item(m, detail)).collect();
    Ok(Json(Value::Array(items)).into_response())
}

/// One item of `GET /files/{session_id}` (documentation of the JSON
/// [`list_item`] writes).
#[derive(utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum ListItem {
    /// `detail=simple` (the default): the object's key,
    /// `<session_id>/<file_id><extension>`.
    Simple(String),
    /// `detail=normalized`.
    Normalized(NormalizedItem),
    /// `detail=full`.
    Full(FullItem),
    /// `detail=summary`.
    Summary(SummaryItem),
}

/// `detail=summary`: the key, size, time and SHA-256.
#[derive(utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct SummaryItem {
    /// `<session_id>/<file_id><extension>`.
    name: String,
    size: u64,
    /// ISO 8601.
    last_modified: String,
    /// The bytes' SHA-256, lower-case hex.
    etag: String,
}

/// `detail=full`: the summary plus ids, metadata and type.
#[derive(utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)]
pub struct FullItem {
    id: String,
    name: String,
    size: u64,
    last_modified: String,
    etag: String,
    /// `original-filename`, `original-filename-encoded`, `content-type`,
    /// `read-only` (`"true"`/`"false"`).
    metadata: std::collections::BTreeMap<String, String>,
    version_id: String,
    content_type: String,
}

/// `detail=normalized`: the shape of an `/exec` input reference.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
pub struct NormalizedItem {
    id: String,
    /// The path below `/mnt/data`.
    name: String,
    storage_session_id: String,
    size: u64,
    #[serde(rename = "contentType")]
    content_type: String,
    #[serde(rename = "lastModified")]
    last_modified: String,
    /// Present (`true`) only for a read-only object.
    read_only: Option<bool>,
}

fn list_item(m: &ObjectMeta, detail: Detail) -> Value {
    let key = object_key(m);
    let last_modified = iso8601(m.created_at_ms);
    match detail {
        Detail::Simple => json!(key),
        Detail::Summary => json!({
            "name": key,
            "size": m.size,
            "lastModified": last_modified,
            "etag": m.sha256,
        }),
        Detail::Full => json!({
            "id": m.file_id.as_str(),
            "name": key,
            "size": m.size,
            "lastModified": last_modified,
            "etag": m.sha256,
            "metadata": {
                "original-filename": m.name,
                "original-filename-encoded": "none",
                "content-type": m.content_type,
                "read-only": if m.read_only { "true" } else { "false" },
            },
            "versionId": m.version,
            "contentType": m.content_type,
        }),
        Detail::Normalized => {
            let mut v = json!({
                "id": m.file_id.as_str(),
                "name": m.name,
                "storage_session_id": m.session_id.as_str(),
                "size": m.size,
                "contentType": m.content_type,
                "lastModified": last_modified,
            });
            if m.read_only {
                v["read_only"] = json!(true);
            }
            v
        }
    }
}

#[utoipa::path(
    get,
    path = "/sessions/{session_id}/objects/{file_id}",
    operation_id = "getObject",
    tag = "LibreChat",
    summary = "A stored object's metadata",
    params(
        ("session_id" = String, Path, description = "Storage session"),
        ("file_id" = String, Path, description = "File id"),
        ScopeQuery,
    ),
    responses(
        (status = 200, description = "OK", body = ObjectInfo),
        (status = 400, description = "Bad request", body = crate::error::ErrorBody),
        (status = 403, description = "Not readable by the caller", body = crate::error::ErrorBody),
        (status = 404, description = "Not found", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or invalid credentials", body = crate::error::ErrorBody),
        (status = 429, description = "Rate limited (`Retry-After`, `RateLimit-*`)", body = crate::error::ErrorBody),
    )
)]
pub async fn object(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: PathIds,
    q: ScopeParams,
) -> Result<Response, ApiError> {
    let (sid, fid) = ids(path)?;
    let q = query(q)?;
    authorized(&state, &identity, &headers, &q, &sid, Some(&fid)).await?;
    let meta = state
        .store
        .object(&sid, &fid)
        .await
        .map_err(|source| ApiError::ObjectMetadata {
            session: sid.clone(),
            file: fid.clone(),
            source,
        })?
        .ok_or_else(|| ApiError::FileNotFound {
            session: sid.clone(),
            file: Some(fid.clone()),
        })?;
    Ok(Json(ObjectInfo {
        name: object_key(&meta),
        version: meta.version.clone(),
        original_filename: meta.name.clone(),
        size: meta.size,
        last_modified: iso8601(meta.created_at_ms),
        etag: meta.sha256.clone(),
        content_type: meta.content_type.clone(),
        read_only: meta.read_only,
    })
    .into_response())
}

#[utoipa::path(
    delete,
    path = "/files/{session_id}/{file_id}",
    operation_id = "deleteFile",
    tag = "LibreChat",
    summary = "Delete a stored file",
    params(
        ("session_id" = String, Path, description = "Storage session"),
        ("file_id" = String, Path, description = "File id"),
        ScopeQuery,
    ),
    responses(
        (status = 200, description = "OK", body = DeleteResponse),
        (status = 400, description = "Bad request", body = crate::error::ErrorBody),
        (status = 403, description = "Not readable by the caller", body = crate::error::ErrorBody),
        (status = 404, description = "Not found", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or invalid credentials", body = crate::error::ErrorBody),
        (status = 429, description = "Rate limited (`Retry-After`, `RateLimit-*`)", body = crate::error::ErrorBody),
    )
)]
pub async fn delete(
    State(state): State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: PathIds,
    q: ScopeParams,
) -> Result<Response, ApiError> {
    let (sid, fid) = ids(path)?;
    let q = query(q)?;
    authorized(&state, &identity, &headers, &q, &sid, Some(&fid)).await?;
    let deleted =
        state
            .store
            .delete(&sid, &fid)
            .await
            .map_err(|source| ApiError::DeleteObject {
                session: sid.clone(),
                file: fid.clone(),
                source,
            })?;
    if !deleted {
        return Err(ApiError::FileNotFound {
            session: sid,
            file: Some(fid),
        });
    }
    tracing::info!(session = %sid, file = %fid, "object deleted");
    Ok((
        StatusCode::OK,
        Json(DeleteResponse {
            message: "File deleted successfully".to_owned(),
            session_id: sid.as_str().to_owned(),
            file_id: fid.as_str().to_owned(),
        }),
    )
        .into_response())
}

/// `DELETE /sessions/{session_id}/objects/{file_id}`: the same as
/// `DELETE /files/{session_id}/{file_id}`.
#[utoipa::path(
    delete,
    path = "/sessions/{session_id}/objects/{file_id}",
    operation_id = "deleteObject",
    tag = "LibreChat",
    summary = "Delete a stored file (object route)",
    params(
        ("session_id" = String, Path, description = "Storage session"),
        ("file_id" = String, Path, description = "File id"),
        ScopeQuery,
    ),
    responses(
        (status = 200, description = "OK", body = DeleteResponse),
        (status = 400, description = "Bad request", body = crate::error::ErrorBody),
        (status = 403, description = "Not readable by the caller", body = crate::error::ErrorBody),
        (status = 404, description = "Not found", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or invalid credentials", body = crate::error::ErrorBody),
        (status = 429, description = "Rate limited (`Retry-After`, `RateLimit-*`)", body = crate::error::ErrorBody),
    )
)]
pub async fn delete_object(
    state: State<AppState>,
    identity: Identity,
    headers: HeaderMap,
    path: PathIds,
    q: ScopeParams,
) -> Result<Response, ApiError> {
    delete(state, identity, headers, path, q).await
}

/// A stored object's metadata (`GET /sessions/{session_id}/objects/{file_id}`).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectInfo {
    /// `<session_id>/<file_id><ext>`.
    pub name: String,
    pub version: String,
    pub original_filename: String,
    pub size: u64,
    pub last_modified: String,
    pub etag: String,
    pub content_type: String,
    pub read_only: bool,
}

/// A deletion's answer.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct DeleteResponse {
    /// `File deleted successfully`.
    pub message: String,
    pub session_id: String,
    #[serde(rename = "fileId")]
    pub file_id: String,
}

/// The object key clients parse: `<sid>/<fid><ext>`, where `ext` is the
/// original basename's extension as Node's `path.extname` sees it
/// (`.tar.gz` → `.gz`, `.gitignore` → none).
pub fn object_key(m: &ObjectMeta) -> String {
    format!("{}/{}{}", m.session_id, m.file_id, extname(&m.name))
}

fn extname(name: &str) -> &str {
    let base = name.rsplit('/').next().unwrap_or(name);
    match base.rfind('.') {
        Some(0) | None => "",
        Some(i) if i == base.len() - 1 => "",
        Some(i) => &base[i..],
    }
}

/// ISO-8601 UTC with milliseconds and `Z` (`2026-01-02T03:04:05.678Z`).
pub fn iso8601(ms: i64) -> String {
    let fmt =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&fmt).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00.000Z".to_owned())
}

fn http_date(ms: i64) -> Option<String> {
    let t = OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000)).ok()?;
    // RFC 2822 with a +0000 offset; HTTP wants "GMT".
    let s = t.format(&Rfc2822).ok()?;
    Some(s.replace("+0000", "GMT"))
}

/// Characters left unescaped in an RFC 5987 `filename*` value (attr-char).
const ATTR_CHAR: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'!')
    .remove(b'#')
    .remove(b'$')
    .remove(b'&')
    .remove(b'+')
    .remove(b'-')
    .remove(b'.')
    .remove(b'^')
    .remove(b'_')
    .remove(b'`')
    .remove(b'|')
    .remove(b'~');

/// `attachment; filename="<ascii fallback>"; filename*=UTF-8''<encoded>`
/// for the basename of `name`.
pub fn content_disposition(name: &str) -> String {
    let base = name.rsplit('/').next().unwrap_or(name);
    let fallback: String = base
        .chars()
        .map(|c| {
            if (c.is_ascii_graphic() || c == ' ') && c != '"' && c != '\\' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!(
        "attachment; filename=\"{fallback}\"; filename*=UTF-8''{}",
        utf8_percent_encode(base, ATTR_CHAR)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extname_matches_node() {
        assert_eq!(extname("a/b.tar.gz"), ".gz");
        assert_eq!(extname("report.CSV"), ".CSV");
        assert_eq!(extname(".gitignore"), "");
        assert_eq!(extname("Dockerfile"), "");
        assert_eq!(extname("x."), "");
    }

    #[test]
    fn iso8601_is_utc_with_millis_and_z() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(1_767_323_045_678), "2026-01-02T03:04:05.678Z");
    }

    #[test]
    fn http_date_uses_gmt() {
        assert_eq!(
            http_date(0).as_deref(),
            Some("Thu, 01 Jan 1970 00:00:00 GMT")
        );
    }

    #[test]
    fn disposition_has_ascii_fallback_and_utf8_name() {
        assert_eq!(
            content_disposition("dir/résumé \"v2\".pdf"),
            "attachment; filename=\"r_sum_ _v2_.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20%22v2%22.pdf"
        );
    }
}
