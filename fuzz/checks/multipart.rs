//! The multipart upload property, shared by the `multipart` fuzz target and
//! the stable property test in `crates/kiln-api/tests/fuzz_props.rs` (both
//! include it with `#[path]`, next to `relpath.rs` as `crate::relpath`).
//!
//! [`Harness`] drives the real router ([`kiln_api::router`]) over a real
//! [`Store`] in a temporary directory with an executor double that runs
//! nothing, one request at a time through `tower::ServiceExt::oneshot` on a
//! current-thread runtime. For every input it asserts:
//! - the answer is never a 5xx (a panic in a handler would be a 500) and is
//!   a JSON object;
//! - every filename the answer reports as stored is a safe relative name;
//! - the objects in the store are exactly the ones the answer reports: the
//!   answer's session holds the reported files, every other session the
//!   request created holds nothing (failed requests leave no objects);
//! - every stored object's name re-validates with `RelPath::parse` and is
//!   safe, and every file on disk is named by the store (`<file_id>.<hex>`),
//!   never by the client.
//!
//! Input encoding ([`encode`]/[`decode`]): byte 0 holds flags
//! ([`BATCH`], [`USER_ID`], [`STRICT`]), then the multipart boundary up to
//! the first `\n`, then the body.
#![allow(dead_code)] // each including crate uses a different part

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Method, Request, header};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use http_body_util::BodyExt as _;
use kiln_api::{ApiConfig, AppState, HealthInfo};
use kiln_core::{Nanoid, RelPath};
use kiln_exec::{ExecError, ExecResult, Execute, RunContext, Work};
use kiln_store::{Store, StoreConfig};
use serde_json::Value;
use tower::ServiceExt as _;

use crate::relpath::assert_accepted_name_is_safe;

/// Flag: post to `/v1/upload/batch` instead of `/v1/upload`.
pub const BATCH: u8 = 1;
/// Flag: send `User-Id: fuzz-user`.
pub const USER_ID: u8 = 2;
/// Flag: use the router whose config requires an identity.
pub const STRICT: u8 = 4;

/// Per-file limit of the harness's servers (small, so fuzz inputs reach it).
pub const MAX_UPLOAD_BYTES: u64 = 512;
/// Most file parts per request (small, so fuzz inputs reach it).
pub const MAX_BATCH_FILES: usize = 3;

/// One decoded fuzz input.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub flags: u8,
    pub boundary: &'a [u8],
    pub body: &'a [u8],
}

/// Split raw fuzz bytes into flags, boundary and body.
pub fn decode(data: &[u8]) -> Input<'_> {
    let (flags, rest) = match data.split_first() {
        Some((f, rest)) => (*f, rest),
        None => (0, data),
    };
    let (boundary, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &rest[rest.len()..]),
    };
    Input {
        flags,
        boundary,
        body,
    }
}

/// The inverse of [`decode`] (for seeds and generated inputs).
pub fn encode(flags: u8, boundary: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + boundary.len() + 2);
    out.push(flags);
    out.extend_from_slice(boundary.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(body);
    out
}

/// One part of a generated multipart body.
#[derive(Debug, Clone)]
pub enum Part {
    /// A plain form field (`kind`, `id`, `entity_id`, …).
    Field { name: String, value: Vec<u8> },
    /// A file part; `filename: None` leaves the attribute out.
    File {
        field: String,
        filename: Option<String>,
        content_type: Option<String>,
        content: Vec<u8>,
    },
}

/// Render `parts` as a `multipart/form-data` body (names are written raw:
/// quotes or line breaks in them make deliberately malformed bodies).
pub fn render(boundary: &str, parts: &[Part]) -> Vec<u8> {
    let mut out = Vec::new();
    for part in parts {
        out.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        match part {
            Part::Field { name, value } => {
                out.extend_from_slice(
                    format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes(),
                );
                out.extend_from_slice(value);
            }
            Part::File {
                field,
                filename,
                content_type,
                content,
            } => {
                let mut disposition = format!("Content-Disposition: form-data; name=\"{field}\"");
                if let Some(f) = filename {
                    disposition.push_str(&format!("; filename=\"{f}\""));
                }
                out.extend_from_slice(disposition.as_bytes());
                out.extend_from_slice(b"\r\n");
                if let Some(ct) = content_type {
                    out.extend_from_slice(format!("Content-Type: {ct}\r\n").as_bytes());
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(content);
            }
        }
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    out
}

/// Prefix of the harness's store directories: `kiln-fuzz-<pid>-<random>`.
const STORE_PREFIX: &str = "kiln-fuzz-";

/// Remove store directories in `parent` whose process no longer exists.
fn remove_stale_stores(parent: &Path) {
    for e in std::fs::read_dir(parent).into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(STORE_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The executor double: upload routes never execute; `/exec` is refused.
struct NoExec;

impl Execute for NoExec {
    fn execute<'a>(
        &'a self,
        _run: &'a RunContext,
        _work: Work,
    ) -> BoxFuture<'a, Result<ExecResult, ExecError>> {
        async {
            Err(ExecError::BadRequest(
                "the fuzz harness runs nothing".to_owned(),
            ))
        }
        .boxed()
    }
}

/// The router over a real store, and what the checks need to look inside.
pub struct Harness {
    rt: tokio::runtime::Runtime,
    open: axum::Router,
    strict: axum::Router,
    store: Store,
    blobs: PathBuf,
    /// Session directories already checked and emptied.
    seen: HashSet<OsString>,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// A fresh store (in `/dev/shm` when it exists: no disk syncs) and the
    /// two routers over it. Panics if the store cannot be opened: a harness
    /// that cannot start must not pass.
    ///
    /// The store lives in `kiln-fuzz-<pid>-*`; a fuzzer exits without
    /// running destructors, so directories of processes that are gone are
    /// removed here.
    pub fn new() -> Harness {
        let shm = Path::new("/dev/shm");
        let parent = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        remove_stale_stores(&parent);
        let dir = tempfile::Builder::new()
            .prefix(&format!("{STORE_PREFIX}{}-", std::process::id()))
            .tempdir_in(&parent)
            .expect("create the harness's store directory");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("build the harness's runtime");
        let store = rt
            .block_on(Store::open(StoreConfig {
                dir: dir.path().to_path_buf(),
                retention: Duration::from_secs(3600),
                budget: Default::default(),
            }))
            .expect("open the harness's store");
        let state = |require_identity: bool| {
            AppState::new(
                store.clone(),
                Arc::new(NoExec),
                ApiConfig {
                    max_upload_bytes: MAX_UPLOAD_BYTES,
                    max_batch_files: MAX_BATCH_FILES,
                    require_identity,
                    // thousands of requests from one address: the limits
                    // are not what is checked here
                    rate_limits: kiln_api::rate::RateRules::off(),
                    ..ApiConfig::default()
                },
                HealthInfo {
                    version: "fuzz".to_owned(),
                    languages: Vec::new(),
                    runtime_image: None,
                },
            )
        };
        Harness {
            open: kiln_api::router(state(false)),
            strict: kiln_api::router(state(true)),
            blobs: dir.path().join("blobs"),
            rt,
            store,
            seen: HashSet::new(),
            _dir: dir,
        }
    }

    /// Send one decoded input and assert the property. Returns how many
    /// stored objects the checks found (and then removed).
    pub fn check(&mut self, data: &[u8]) -> usize {
        // Sessions left unchecked by an earlier input that failed its check
        // (a property test goes on shrinking after a failure) are not this
        // input's: set them aside first.
        self.sweep_unchecked();
        let input = decode(data);
        let path = if input.flags & BATCH != 0 {
            "/v1/upload/batch"
        } else {
            "/v1/upload"
        };
        let mut req = Request::builder().method(Method::POST).uri(path);
        let mut ct = b"multipart/form-data; boundary=".to_vec();
        ct.extend_from_slice(input.boundary);
        // A boundary that cannot be a header value: send no content type.
        if let Ok(v) = HeaderValue::from_bytes(&ct) {
            req = req.header(header::CONTENT_TYPE, v);
        }
        if input.flags & USER_ID != 0 {
            req = req.header("user-id", "fuzz-user");
        }
        let req = req
            .body(Body::from(input.body.to_vec()))
            .expect("a request from valid parts");
        let app = if input.flags & STRICT != 0 {
            self.strict.clone()
        } else {
            self.open.clone()
        };

        let (status, bytes) = self.rt.block_on(async move {
            let resp = match app.oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            let status = resp.status();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .expect("read the response body")
                .to_bytes();
            (status, bytes)
        });
        let text = String::from_utf8_lossy(&bytes);
        assert!(!status.is_server_error(), "{status} for {input:?}: {text}");
        let body: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{status} answered non-JSON ({e}): {text}"));
        assert!(body.is_object(), "{status} answered {text}");

        // The files the answer says were stored, by session.
        let mut reported: Vec<String> = Vec::new();
        for f in body["files"].as_array().into_iter().flatten() {
            let stored = f.get("fileId").is_some();
            if stored {
                let name = f["filename"]
                    .as_str()
                    .unwrap_or_else(|| panic!("stored file without a filename: {text}"));
                assert_accepted_name_is_safe(name);
                reported.push(name.to_owned());
            }
        }
        let answer_session = body["storage_session_id"].as_str().map(str::to_owned);
        if !status.is_success() {
            assert!(
                reported.is_empty() || input.flags & BATCH != 0,
                "{status} reports stored files: {text}"
            );
        }
        if status.is_success() && input.flags & BATCH == 0 {
            assert!(!reported.is_empty(), "single upload stored nothing: {text}");
        }
        self.check_store(answer_session.as_deref(), reported, &text)
    }

    /// Compare the store with the answer, check names, then empty the new
    /// sessions so the next input starts from a small store.
    fn check_store(
        &mut self,
        answer_session: Option<&str>,
        mut reported: Vec<String>,
        text: &str,
    ) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.blobs) else {
            assert!(
                reported.is_empty(),
                "files reported but no blob dir: {text}"
            );
            return 0;
        };
        let mut answer_seen = false;
        let mut found = 0;
        for entry in entries {
            let entry = entry.expect("read the blob directory");
            let dir_name = entry.file_name();
            if self.seen.contains(&dir_name) || !entry.path().is_dir() {
                continue;
            }
            let Some(session) = dir_name.to_str().and_then(|n| Nanoid::parse(n).ok()) else {
                continue;
            };
            self.check_blob_names(&entry.path());
            let objects = self
                .rt
                .block_on(self.store.list(&session))
                .expect("list a session");
            let mut names: Vec<String> = Vec::new();
            found += objects.len();
            for meta in &objects {
                let parsed = RelPath::parse(&meta.name);
                assert!(
                    parsed.is_ok(),
                    "stored name {:?} does not re-validate",
                    meta.name
                );
                assert_accepted_name_is_safe(&meta.name);
                names.push(meta.name.clone());
            }
            if answer_session == Some(session.as_str()) {
                answer_seen = true;
                names.sort();
                reported.sort();
                assert_eq!(names, reported, "store and answer disagree: {text}");
            } else {
                assert!(
                    names.is_empty(),
                    "session {session} of a request answered without it holds {names:?}: {text}"
                );
            }
            for meta in &objects {
                self.rt
                    .block_on(self.store.delete(&session, &meta.file_id))
                    .expect("delete a checked object");
            }
            // Best effort: a non-empty directory (a staging file) stays and is
            // checked again next time.
            if std::fs::remove_dir(entry.path()).is_ok() {
                self.seen.insert(dir_name);
            }
        }
        if !answer_seen {
            assert!(
                reported.is_empty(),
                "reported files were not stored: {text}"
            );
        }
        found
    }

    /// Empty and forget every session directory not checked yet.
    fn sweep_unchecked(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.blobs) else {
            return;
        };
        for entry in entries.flatten() {
            let dir_name = entry.file_name();
            if self.seen.contains(&dir_name) {
                continue;
            }
            if let Some(session) = dir_name.to_str().and_then(|n| Nanoid::parse(n).ok()) {
                let objects = self
                    .rt
                    .block_on(self.store.list(&session))
                    .unwrap_or_default();
                for meta in objects {
                    let _ = self.rt.block_on(self.store.delete(&session, &meta.file_id));
                }
            }
            if std::fs::remove_dir(entry.path()).is_ok() {
                self.seen.insert(dir_name);
            }
        }
    }

    /// Files on disk are named by the store: `<file_id>.<32 hex>`, or that
    /// plus `#<digits>` while staging.
    fn check_blob_names(&self, session_dir: &Path) {
        for e in std::fs::read_dir(session_dir)
            .expect("read a session directory")
            .flatten()
        {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let published = name.split('#').next().unwrap_or_default();
            let ok = published.split_once('.').is_some_and(|(id, version)| {
                kiln_core::id::is_nanoid(id)
                    && version.len() == 32
                    && version.bytes().all(|b| b.is_ascii_hexdigit())
            }) && name[published.len()..]
                .strip_prefix('#')
                .is_none_or(|digits| {
                    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
                });
            assert!(
                ok,
                "a blob file named {name:?} in {}",
                session_dir.display()
            );
        }
    }
}

impl Default for Harness {
    fn default() -> Self {
        Harness::new()
    }
}
