//! The MCP tools and resources: a tool call's arguments → the same
//! request `/exec` builds (one-shot runs through `Runs::start`) or a live
//! kernel's evaluation (the `/sessions` face's registry), and the outcome →
//! MCP content. Resource links name stored outputs
//! (`kiln://files/{storage_session_id}/{file_id}`) and files of a live
//! kernel's workspace (`kiln://sessions/{session_id}/files/{path}`);
//! `resources/read` serves them to a caller the one access rule allows.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use futures::TryStreamExt as _;
use kiln_core::access::{Action, Caller, Claim};
use kiln_core::outcome::{ExitStatus, signal_name};
use kiln_core::{Language, Nanoid, RelPath};
use kiln_exec::kernels::{EvalResult, Kernel};
use kiln_exec::{ExecError, ExecResult, InputFile, StartOptions};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use serde_json::{Map, Value, json};
use tokio::io::AsyncReadExt as _;

use super::{Call, RpcError, code};
use crate::error::ApiError;
use crate::identity::{authorize, header_user_id, parse_id, resolve_caller};
use crate::sessions::{find, kernels, owner_of};

/// What `initialize` and `server/discover` tell the model about Kiln.
pub const INSTRUCTIONS: &str = "Kiln runs code in isolated sandboxes without network access. Use execute_code for one-off programs (13 languages; print what you want to see). For step-by-step work where variables must survive between calls, create_session (py or js), pass its session_id to execute_code, and close_session when done. Files a program writes under /mnt/data come back: PNG images inline, other files as resource links to read with resources/read.";

/// Largest PNG returned inline as an image; larger ones are links.
const INLINE_IMAGE_MAX: u64 = 4 * 1024 * 1024;

/// The tools, described for a model.
pub fn definitions() -> Value {
    let langs: Vec<&str> = Language::all().map(|l| l.name()).collect();
    let kernel_langs: Vec<&str> = Language::with_kernels().map(|l| l.name()).collect();
    json!([
        {
            "name": "execute_code",
            "title": "Execute code",
            "description": "Run a program in a fresh, isolated sandbox (no network access) and return what it printed. Each call starts in an empty working directory, /mnt/data, and nothing survives the call: print every result you need. Files the program writes under /mnt/data are returned: PNG images (for example a matplotlib figure saved with plt.savefig or shown with plt.show) as images, other files as resource links whose bytes resources/read returns. A program that fails (non-zero exit, exception, timeout) gives its output with isError set; fix the code and call again. With session_id (from create_session) the code runs in that live kernel instead: variables, imports and functions persist between calls, and the value of a final expression is returned.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "lang": {
                        "type": "string",
                        "enum": langs,
                        "description": "The language: py (Python 3 with numpy, pandas, matplotlib, scipy, scikit-learn), js (Node.js), ts (TypeScript), c, cpp, java, php, rs (Rust), go, d, f90 (Fortran), r, bash."
                    },
                    "code": { "type": "string", "description": "The complete program (or, with session_id, the next cell)." },
                    "args": { "type": "array", "items": { "type": "string" }, "description": "Command-line arguments for the program (not with session_id)." },
                    "timeout": { "type": "number", "exclusiveMinimum": 0, "description": "Wall-time limit in seconds (the server's limit when absent or larger)." },
                    "session_id": { "type": "string", "description": "A live session from create_session: run the code there, keeping its state." },
                    "files": {
                        "type": "array",
                        "description": "Input files written to /mnt/data before the code runs.",
                        "items": {
                            "type": "object",
                            "properties": {
                                "name": { "type": "string", "description": "Path below /mnt/data, e.g. data.csv." },
                                "content": { "type": "string", "description": "The file's content." },
                                "encoding": { "type": "string", "enum": ["utf8", "base64", "hex"], "description": "How content is encoded (utf8 when absent)." }
                            },
                            "required": ["name", "content"]
                        }
                    }
                },
                "required": ["lang", "code"]
            },
            "annotations": { "readOnlyHint": false, "destructiveHint": false, "idempotentHint": false, "openWorldHint": false }
        },
        {
            "name": "create_session",
            "title": "Start a live session",
            "description": "Start a live kernel whose state (variables, imports, functions, files in /mnt/data) persists across execute_code calls that pass its session_id, like a notebook. Use it when a task takes several steps that build on each other. Returns the session_id. Close it with close_session when done; an idle session is closed automatically.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "lang": { "type": "string", "enum": kernel_langs, "description": "py (Python 3) or js (Node.js)." }
                },
                "required": ["lang"]
            },
            "annotations": { "readOnlyHint": false, "destructiveHint": false, "idempotentHint": false, "openWorldHint": false }
        },
        {
            "name": "close_session",
            "title": "Close a live session",
            "description": "Close a session from create_session: its kernel stops and its state and files are discarded.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "session_id": { "type": "string", "description": "The session to close." }
                },
                "required": ["session_id"]
            },
            "annotations": { "readOnlyHint": false, "destructiveHint": true, "idempotentHint": true, "openWorldHint": false }
        }
    ])
}

/// The two forms of resource URI.
pub fn templates() -> Value {
    json!([
        {
            "uriTemplate": "kiln://files/{storage_session_id}/{file_id}",
            "name": "output",
            "description": "A file a one-shot execute_code call wrote (the links in its result)."
        },
        {
            "uriTemplate": "kiln://sessions/{session_id}/files/{path}",
            "name": "session-file",
            "description": "A file in a live session's /mnt/data."
        }
    ])
}

/// A tool's failure: shown to the model as a result with `isError`.
fn failed(e: &ApiError) -> Value {
    tool_error(&message_of(e))
}

fn tool_error(message: &str) -> Value {
    json!({ "content": [{ "type": "text", "text": message }], "isError": true })
}

fn message_of(e: &ApiError) -> String {
    let (_, body) = e.status_and_body();
    ["message", "error"]
        .iter()
        .find_map(|k| body.get(*k).and_then(Value::as_str))
        .unwrap_or("the request failed")
        .to_owned()
}

/// `tools/call`.
pub(super) async fn call(call: &Call<'_>, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let Some(name) = params.get("name").and_then(Value::as_str) else {
        return Err(RpcError::params("params.name must be the tool's name"));
    };
    let empty = Map::new();
    let args = match params.get("arguments") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(a)) => a,
        Some(_) => return Err(RpcError::params("params.arguments must be an object")),
    };
    let outcome = match name {
        "execute_code" => execute(call, args).await,
        "create_session" => create_session(call, args).await,
        "close_session" => close_session(call, args).await,
        other => return Err(RpcError::params(format!("Unknown tool: {other}"))),
    };
    Ok(outcome.unwrap_or_else(|e| failed(&e)))
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

fn string_arg<'a>(args: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, ApiError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(bad(format!("{key} must be a string"))),
    }
}

/// `timeout` in seconds → milliseconds.
fn timeout_ms(args: &Map<String, Value>) -> Result<Option<u64>, ApiError> {
    match args.get("timeout") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            // `as` saturates; the executor clamps to the configured limit
            Some(s) if s > 0.0 => Ok(Some((s * 1000.0).ceil() as u64)),
            _ => Err(bad("timeout must be a positive number of seconds")),
        },
    }
}

async fn execute(call: &Call<'_>, args: &Map<String, Value>) -> Result<Value, ApiError> {
    let state = call.state;
    if state.shutdown.is_cancelled() {
        return Err(ApiError::ShuttingDown);
    }
    let session = string_arg(args, "session_id")?;
    let caller = resolve_caller(
        &state.config,
        call.identity,
        &[header_user_id(call.headers)?],
    )?;
    crate::rate::starts_code(state, &caller, call.peer.0).await?;
    match session {
        Some(id) => evaluate(call, caller, id, args).await,
        None => run_once(call, args).await,
    }
}

/// A one-shot run: the arguments become the `/exec` body they mirror,
/// parsed by `/exec`'s own parser and started in the one registry.
async fn run_once(call: &Call<'_>, args: &Map<String, Value>) -> Result<Value, ApiError> {
    let state = call.state;
    if let Some(retry_after) = state.runs.saturated() {
        return Err(ExecError::Busy { retry_after }.into());
    }
    let mut body = Map::new();
    for k in ["lang", "code", "args", "files"] {
        if let Some(v) = args.get(k) {
            body.insert(k.to_owned(), v.clone());
        }
    }
    if let Some(ms) = timeout_ms(args)? {
        body.insert("timeout".to_owned(), json!(ms));
    }
    let bytes = serde_json::to_vec(&body).map_err(|e| bad(e.to_string()))?;
    let parsed = crate::exec::parse_exec(&state.config, call.identity, call.headers, &bytes)?;
    let watch = state.runs.start(
        parsed.caller,
        parsed.req,
        StartOptions {
            detach: false,
            request_id: crate::middleware::request_id(call.headers),
        },
    )?;
    // a client that goes away drops this future and the watch: the run is
    // cancelled, as for `/exec`
    let outcome = watch.outcome().await;
    match &*outcome {
        Ok(r) => Ok(render_run(call, r).await),
        Err(e) => Err(ApiError::Exec(e.clone())),
    }
}

const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');

fn file_uri(session: &Nanoid, file: &Nanoid) -> String {
    format!("kiln://files/{}/{}", session.as_str(), file.as_str())
}

fn workspace_uri(session: &str, path: &str) -> String {
    let path: Vec<String> = path
        .split('/')
        .map(|s| utf8_percent_encode(s, PATH_SEGMENT).to_string())
        .collect();
    format!("kiln://sessions/{session}/files/{}", path.join("/"))
}

fn is_png(name: &str) -> bool {
    name.to_ascii_lowercase().ends_with(".png")
}

fn link(uri: String, name: &str) -> Value {
    json!({
        "type": "resource_link",
        "uri": uri,
        "name": name,
        "mimeType": kiln_exec::content_type(name),
    })
}

fn image(bytes: &[u8]) -> Value {
    json!({
        "type": "image",
        "data": base64::engine::general_purpose::STANDARD.encode(bytes),
        "mimeType": "image/png",
    })
}

/// The text blocks every result starts with.
fn output_blocks(stdout: &str, stderr: &str, note: Option<String>) -> Vec<Value> {
    let mut blocks = Vec::new();
    if !stdout.is_empty() {
        blocks.push(stdout.to_owned());
    }
    if !stderr.is_empty() {
        blocks.push(format!("stderr:\n{stderr}"));
    }
    blocks.extend(note);
    if blocks.is_empty() {
        blocks.push("(no output)".to_owned());
    }
    blocks
        .into_iter()
        .map(|text| json!({ "type": "text", "text": text }))
        .collect()
}

async fn render_run(call: &Call<'_>, r: &ExecResult) -> Value {
    let (exit_code, signal) = match r.exit {
        ExitStatus::Code(c) => (Some(c), None),
        ExitStatus::Signal(s) => (None, Some(signal_name(s))),
    };
    let failed = exit_code != Some(0) || r.status.is_some();
    let note = failed.then(|| {
        let why = match (&r.message, exit_code, &signal) {
            (Some(m), _, _) => m.clone(),
            (None, Some(c), _) => format!("exit code {c}"),
            (None, None, Some(s)) => format!("killed by {s}"),
            (None, None, None) => "failed".to_owned(),
        };
        format!("The program failed: {why}")
    });
    let mut content = output_blocks(&r.stdout, &r.stderr, note);
    let mut files = Vec::new();
    // what the program wrote: unchanged inputs echoed back are the caller's own
    for f in r.files.iter().filter(|f| !f.inherited) {
        let uri = file_uri(&f.storage_session_id, &f.id);
        files.push(json!({ "name": f.name, "uri": uri }));
        let inline = if is_png(&f.name) {
            stored_bytes(call, &f.storage_session_id, &f.id, INLINE_IMAGE_MAX)
                .await
                .ok()
        } else {
            None
        };
        content.push(match inline {
            Some((bytes, _)) => image(&bytes),
            None => link(uri, &f.name),
        });
    }
    json!({
        "content": content,
        "structuredContent": {
            "exit_code": exit_code,
            "signal": signal,
            "status": r.status.map(|s| s.code()),
            "wall_time_ms": u64::try_from(r.wall_time.as_millis()).unwrap_or(u64::MAX),
            "files": files,
        },
        "isError": failed,
    })
}

/// An evaluation in the caller's live kernel `id` (a run of `caller`'s).
async fn evaluate(
    call: &Call<'_>,
    caller: Caller,
    id: &str,
    args: &Map<String, Value>,
) -> Result<Value, ApiError> {
    let state = call.state;
    let session = find(state, call.identity, call.headers, id, Action::Control)?;
    let kernels = kernels(state)?.clone();
    let info = kernels.info(&session);
    let lang = string_arg(args, "lang")?.ok_or_else(|| bad("lang is required"))?;
    if Language::resolve(lang).map(|l| l.name()) != Some(info.lang) {
        return Err(bad(format!("session {id} runs {}, not {lang}", info.lang)));
    }
    let code =
        string_arg(args, "code")?.ok_or_else(|| bad("code is required and must be a string"))?;
    if args.get("args").is_some_and(|a| !a.is_null()) {
        return Err(bad("args cannot be given with session_id"));
    }
    let timeout = timeout_ms(args)?.map(Duration::from_millis);
    for f in crate::exec::parse_files(args.get("files"), None)? {
        let InputFile::Inline { name, content } = f else {
            return Err(bad(
                "a session's files must be given inline (name, content)",
            ));
        };
        kernels
            .write_file(session.clone(), name, content.into())
            .await?;
    }
    let watch = crate::evals::start(
        state,
        call.headers,
        caller,
        &kernels,
        session.clone(),
        code.to_owned(),
        timeout,
    )?;
    let r = crate::evals::finish(&watch).await?;
    Ok(render_eval(&kernels, &session, id, &r).await)
}

async fn render_eval(
    kernels: &kiln_exec::kernels::Kernels,
    session: &Arc<Kernel>,
    id: &str,
    r: &EvalResult,
) -> Value {
    let mut notes = Vec::new();
    if let Some(e) = &r.error {
        notes.push(format!(
            "{}: {}\n{}",
            e.ename,
            e.evalue,
            e.traceback.join("\n")
        ));
    }
    if r.timed_out {
        notes.push(
            "Interrupted: the evaluation passed its timeout (the session keeps its state)."
                .to_owned(),
        );
    }
    if let Some(v) = &r.value {
        notes.push(format!("Value: {v}"));
    }
    let note = (!notes.is_empty()).then(|| notes.join("\n"));
    let stdout = String::from_utf8_lossy(&r.stdout);
    let stderr = String::from_utf8_lossy(&r.stderr);
    let mut content = output_blocks(&stdout, &stderr, note);
    if let Some(png) = &r.value_png {
        content.push(json!({ "type": "image", "data": png, "mimeType": "image/png" }));
    }
    let mut files = Vec::new();
    for f in &r.files {
        let uri = workspace_uri(id, &f.path);
        files.push(json!({ "name": f.path, "uri": uri }));
        let inline = match RelPath::parse(&f.path) {
            Ok(rel) if is_png(&f.path) && f.size <= INLINE_IMAGE_MAX => {
                workspace_bytes(kernels, session.clone(), rel, INLINE_IMAGE_MAX)
                    .await
                    .ok()
            }
            _ => None,
        };
        content.push(match inline {
            Some(bytes) => image(&bytes),
            None => link(uri, &f.path),
        });
    }
    json!({
        "content": content,
        "structuredContent": {
            "session_id": id,
            "status": if r.timed_out { "timeout" } else if r.error.is_some() { "error" } else { "ok" },
            "value": r.value,
            "files": files,
        },
        "isError": r.error.is_some() || r.timed_out,
    })
}

async fn create_session(call: &Call<'_>, args: &Map<String, Value>) -> Result<Value, ApiError> {
    let state = call.state;
    if state.shutdown.is_cancelled() {
        return Err(ApiError::ShuttingDown);
    }
    let lang = string_arg(args, "lang")?.ok_or_else(|| bad("lang is required"))?;
    let (caller, _) = owner_of(state, call.identity, call.headers)?;
    let info = kernels(state)?.create_as(&caller, lang, None).await?;
    let id = info.id.as_str();
    let expires_at = crate::runs::rfc3339(info.expires_at);
    Ok(json!({
        "content": [{
            "type": "text",
            "text": format!("Started a {} session: session_id {id}. Pass it to execute_code; close it with close_session when done (it closes by itself when idle, at {expires_at} if unused).", info.lang),
        }],
        "structuredContent": { "session_id": id, "lang": info.lang, "expires_at": expires_at },
        "isError": false,
    }))
}

async fn close_session(call: &Call<'_>, args: &Map<String, Value>) -> Result<Value, ApiError> {
    let id = string_arg(args, "session_id")?.ok_or_else(|| bad("session_id is required"))?;
    find(call.state, call.identity, call.headers, id, Action::Control)?;
    kernels(call.state)?.delete(&parse_id(id)?).await?;
    Ok(json!({
        "content": [{ "type": "text", "text": format!("Closed session {id}.") }],
        "structuredContent": { "session_id": id, "closed": true },
        "isError": false,
    }))
}

/// A resource URI, parsed.
#[derive(Debug, PartialEq)]
enum Resource {
    Stored { session: Nanoid, file: Nanoid },
    Workspace { session: String, path: RelPath },
}

fn parse_uri(uri: &str) -> Result<Resource, RpcError> {
    let unknown = || {
        RpcError::new(
            code::RESOURCE_NOT_FOUND,
            format!("Resource not found: {uri}"),
        )
    };
    if let Some(rest) = uri.strip_prefix("kiln://files/") {
        let (sid, fid) = rest.split_once('/').ok_or_else(unknown)?;
        let session = Nanoid::parse(sid).map_err(|_| unknown())?;
        let file = Nanoid::parse(fid).map_err(|_| unknown())?;
        return Ok(Resource::Stored { session, file });
    }
    if let Some(rest) = uri.strip_prefix("kiln://sessions/") {
        let (sid, path) = rest.split_once("/files/").ok_or_else(unknown)?;
        let path = percent_decode_str(path)
            .decode_utf8()
            .map_err(|_| unknown())?;
        let path = RelPath::parse(&path).map_err(|e| RpcError::params(format!("uri: {e}")))?;
        return Ok(Resource::Workspace {
            session: sid.to_owned(),
            path,
        });
    }
    Err(unknown())
}

/// An API refusal as a JSON-RPC error: not found (404, 410) as MCP's
/// resource-not-found, a server fault as an internal error, any other
/// refusal as invalid params, each with the API's message.
fn rpc_error(e: &ApiError) -> RpcError {
    let (status, _) = e.status_and_body();
    let code = match status.as_u16() {
        404 | 410 => code::RESOURCE_NOT_FOUND,
        s if s >= 500 => code::INTERNAL_ERROR,
        _ => code::INVALID_PARAMS,
    };
    RpcError::new(code, message_of(e))
}

/// `resources/read`.
pub(super) async fn read(call: &Call<'_>, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let Some(uri) = params.get("uri").and_then(Value::as_str) else {
        return Err(RpcError::params("params.uri must be a string"));
    };
    let limit = call.state.config.max_upload_bytes;
    let (bytes, mime) = match parse_uri(uri)? {
        Resource::Stored { session, file } => {
            let caller = resolve_caller(
                &call.state.config,
                call.identity,
                &[header_user_id(call.headers).map_err(|e| rpc_error(&e))?],
            )
            .map_err(|e| rpc_error(&e))?;
            let info = call
                .state
                .store
                .session(&session)
                .await
                .map_err(|source| {
                    rpc_error(&ApiError::SessionLookup {
                        session: session.clone(),
                        source,
                    })
                })?
                .ok_or_else(|| {
                    RpcError::new(
                        code::RESOURCE_NOT_FOUND,
                        format!("Resource not found: {uri}"),
                    )
                })?;
            authorize(
                &call.state.config,
                &caller,
                &Claim::none(),
                &session,
                &info.key,
            )
            .map_err(|e| rpc_error(&e))?;
            stored_bytes(call, &session, &file, limit)
                .await
                .map_err(|e| rpc_error(&e))?
        }
        Resource::Workspace { session, path } => {
            let s = find(
                call.state,
                call.identity,
                call.headers,
                &session,
                Action::Read,
            )
            .map_err(|e| rpc_error(&e))?;
            let k = kernels(call.state).map_err(|e| rpc_error(&e))?;
            let mime = kiln_exec::content_type(path.as_str());
            let bytes = workspace_bytes(k, s, path, limit)
                .await
                .map_err(|e| rpc_error(&e))?;
            (bytes, mime)
        }
    };
    let mut contents = json!({ "uri": uri, "mimeType": mime });
    let text = (mime.starts_with("text/") || mime.contains("json") || mime.contains("csv"))
        .then(|| String::from_utf8(bytes.clone()).ok())
        .flatten();
    match text {
        Some(t) => contents["text"] = json!(t),
        None => contents["blob"] = json!(base64::engine::general_purpose::STANDARD.encode(&bytes)),
    }
    Ok(json!({ "contents": [contents] }))
}

fn too_large(size: u64, limit: u64) -> ApiError {
    bad(format!(
        "the file is {size} bytes, more than the {limit} this server returns through MCP"
    ))
}

/// A stored object's bytes (at most `limit`) and content type.
async fn stored_bytes(
    call: &Call<'_>,
    session: &Nanoid,
    file: &Nanoid,
    limit: u64,
) -> Result<(Vec<u8>, String), ApiError> {
    let store = &call.state.store;
    let not_found = || ApiError::DownloadNotFound {
        session: session.clone(),
        file: file.clone(),
    };
    let download = |source| ApiError::Download {
        session: session.clone(),
        file: file.clone(),
        source,
    };
    let meta = store
        .object(session, file)
        .await
        .map_err(download)?
        .ok_or_else(not_found)?;
    if meta.size > limit {
        return Err(too_large(meta.size, limit));
    }
    let stream = store.read(&meta).await.map_err(|e| match e {
        kiln_store::StoreError::NotFound => not_found(),
        other => download(other),
    })?;
    let chunks: Vec<bytes::Bytes> = stream.try_collect().await.map_err(download)?;
    Ok((chunks.concat(), meta.content_type))
}

/// A workspace file's bytes (at most `limit`).
async fn workspace_bytes(
    kernels: &kiln_exec::kernels::Kernels,
    session: Arc<Kernel>,
    path: RelPath,
    limit: u64,
) -> Result<Vec<u8>, ApiError> {
    let (file, size) = kernels.read_file(session, path).await?;
    if size > limit {
        return Err(too_large(size, limit));
    }
    let mut bytes = Vec::new();
    tokio::fs::File::from_std(file)
        .take(limit)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| ApiError::Exec(ExecError::Storage(e.to_string())))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_uris_round_trip() {
        let (s, f) = (Nanoid::random(), Nanoid::random());
        assert_eq!(
            parse_uri(&file_uri(&s, &f)),
            Ok(Resource::Stored {
                session: s,
                file: f
            })
        );
        let uri = workspace_uri("abc", "out dir/r\u{e9}sum\u{e9}.csv");
        assert_eq!(
            uri,
            "kiln://sessions/abc/files/out%20dir/r%C3%A9sum%C3%A9.csv"
        );
        assert_eq!(
            parse_uri(&uri),
            Ok(Resource::Workspace {
                session: "abc".into(),
                path: RelPath::parse("out dir/r\u{e9}sum\u{e9}.csv").unwrap(),
            })
        );
    }

    #[test]
    fn foreign_or_escaping_uris_are_refused() {
        for uri in [
            "file:///etc/passwd",
            "kiln://files/x/y",
            "kiln://sessions/abc",
        ] {
            assert_eq!(
                parse_uri(uri).unwrap_err().code,
                code::RESOURCE_NOT_FOUND,
                "{uri}"
            );
        }
        let e = parse_uri("kiln://sessions/abc/files/..%2Fetc%2Fpasswd").unwrap_err();
        assert_eq!(e.code, code::INVALID_PARAMS);
    }

    #[test]
    fn every_language_is_offered_and_arguments_are_described() {
        let tools = definitions();
        let exec = &tools[0];
        assert_eq!(exec["name"], "execute_code");
        let langs = exec["inputSchema"]["properties"]["lang"]["enum"]
            .as_array()
            .unwrap();
        assert_eq!(langs.len(), 13);
        for t in tools.as_array().unwrap() {
            assert!(
                t["description"].as_str().unwrap().len() > 80,
                "{}",
                t["name"]
            );
        }
    }

    #[test]
    fn timeout_is_seconds_and_must_be_positive() {
        let args = |v: Value| v.as_object().cloned().unwrap();
        assert_eq!(
            timeout_ms(&args(json!({"timeout": 2.5}))).unwrap(),
            Some(2500)
        );
        assert_eq!(timeout_ms(&args(json!({}))).unwrap(), None);
        assert!(timeout_ms(&args(json!({"timeout": 0}))).is_err());
        assert!(timeout_ms(&args(json!({"timeout": "5"}))).is_err());
    }
}
