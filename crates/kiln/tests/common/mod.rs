//! Shared helpers for integration tests: a real Kiln server on 127.0.0.1:0
//! and small HTTP helpers speaking LibreChat's shapes.
#![allow(dead_code)]

pub mod node;

use std::path::Path;

use kiln::testing::TestServer;
use serde_json::{Value, json};

/// Start a server with default settings.
pub async fn server() -> TestServer {
    server_with(|_| {}).await
}

/// Start a server after adjusting its configuration.
pub async fn server_with(tweak: impl FnOnce(&mut kiln::config::Config)) -> TestServer {
    require_root();
    TestServer::start(Path::new(env!("CARGO_BIN_EXE_kiln")), |c| {
        c.uid_base = fresh_uid_base();
        tweak(c)
    })
    .await
    .expect("start kiln test server")
}

/// A server for the compatibility faces' live kernels: the `py-data`
/// fork-server up (kernels fork it), four kernels, API key `key`, then
/// `tweak`.
pub async fn kernel_server(key: &str, tweak: impl FnOnce(&mut kiln::config::Config)) -> TestServer {
    let s = server_with(|c| {
        c.python_template = "data".into();
        c.warm_jails = 2;
        c.warm_per_runtime = 1;
        c.max_sessions = 4;
        c.api_key = Some(key.into());
        tweak(c);
    })
    .await;
    let pool = s.warm.as_ref().expect("warm pool");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(180);
    while !pool.has_profile("py-data") {
        assert!(
            std::time::Instant::now() < until,
            "the py-data fork-server did not start"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    s
}

/// These tests build real jails: they need root. Under CI a missing
/// capability is a failure, never a skip.
pub fn require_root() {
    let uid = unsafe_free_uid();
    assert_eq!(
        uid, 0,
        "integration tests need root (namespaces, cgroups); run as root"
    );
}

fn unsafe_free_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .and_then(|u| u.parse().ok())
        .unwrap_or(u32::MAX)
}

pub fn client() -> reqwest::Client {
    kiln_egress::install_crypto_provider();
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(120))
        .build()
        .expect("client")
}

/// The value of one Prometheus series on `s`'s `/metrics` (`series` with
/// its labels, as exposed), 0 when absent.
#[allow(dead_code)]
pub async fn metric(s: &kiln::testing::TestServer, series: &str) -> f64 {
    let text = client()
        .get(format!("{}/metrics", s.base_url))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{series} ")))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// `keep_jails` on two slots (one run at a time, one parked jail), no
/// kernels, the lean template only: runs alternate between the two slots,
/// each slot's jail kept in turn.
#[allow(dead_code)]
pub fn keeping(c: &mut kiln::config::Config) {
    c.keep_jails = true;
    c.max_concurrency = 1;
    c.warm_jails = 1;
    c.warm_per_runtime = 1;
    c.max_sessions = 0;
    c.python_template = "lean".into();
}

/// Sends `req` and returns the answer's JSON body.
pub async fn json_of(req: reqwest::RequestBuilder) -> Value {
    req.send().await.expect("send").json().await.expect("json")
}

/// Sends `req`: the answer's status and JSON body (`null` when not JSON).
pub async fn status_json(req: reqwest::RequestBuilder) -> (u16, Value) {
    let r = req.send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// POST /v1/exec and return (status, json).
pub async fn exec_raw(s: &TestServer, body: Value) -> (u16, Value) {
    let r = client()
        .post(format!("{}/exec", s.v1()))
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    let v = r.json::<Value>().await.unwrap_or(Value::Null);
    (status, v)
}

/// POST /v1/exec expecting 200.
pub async fn exec(s: &TestServer, body: Value) -> Value {
    let (status, v) = exec_raw(s, body).await;
    assert_eq!(status, 200, "exec failed: {v}");
    v
}

/// Run `code` in `lang` with no inputs.
pub async fn run(s: &TestServer, lang: &str, code: &str) -> Value {
    exec(s, json!({"lang": lang, "code": code})).await
}

/// Upload one file (G2/G3 shape: kind/id/version fields first).
pub async fn upload(
    s: &TestServer,
    user: &str,
    fields: &[(&str, &str)],
    name: &str,
    bytes: Vec<u8>,
) -> (u16, Value) {
    let mut form = reqwest::multipart::Form::new();
    for (k, v) in fields {
        form = form.text(k.to_string(), v.to_string());
    }
    form = form.part(
        "file",
        reqwest::multipart::Part::bytes(bytes).file_name(name.to_owned()),
    );
    let r = client()
        .post(format!("{}/upload", s.v1()))
        .header("User-Id", user)
        .multipart(form)
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Download `session/file` with a query string; (status, bytes).
pub async fn download(s: &TestServer, session: &str, file: &str, query: &str) -> (u16, Vec<u8>) {
    let r = client()
        .get(format!("{}/download/{session}/{file}{query}", s.v1()))
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    (
        status,
        r.bytes().await.map(|b| b.to_vec()).unwrap_or_default(),
    )
}

/// The bytes of the output file `name` of result `r`, downloaded as LibreChat does.
pub async fn output_bytes(s: &TestServer, r: &Value, name: &str) -> Vec<u8> {
    let f = file(r, name);
    let (st, bytes) = download(
        s,
        f["storage_session_id"].as_str().unwrap(),
        f["id"].as_str().unwrap(),
        "",
    )
    .await;
    assert_eq!(st, 200, "download {name}");
    bytes
}

/// The entry of `files` named `name`.
pub fn file<'a>(res: &'a Value, name: &str) -> &'a Value {
    res["files"]
        .as_array()
        .and_then(|a| a.iter().find(|f| f["name"] == name))
        .unwrap_or_else(|| panic!("no file {name} in {res}"))
}

pub fn is_nanoid(v: &Value) -> bool {
    v.as_str().is_some_and(kiln_core::id::is_nanoid)
}

/// A uid base no other test server (in this or a parallel test process)
/// is likely to use: 2 Mi uids (32 slots; the test default takes 17) per
/// server, below 3.15 G as before.
pub fn fresh_uid_base() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let index = (std::process::id().wrapping_mul(8).wrapping_add(n)) % 1500;
    200_000 + index * 32 * 65_536
}

/// Host processes running as one of `s`'s jail uids.
pub fn jail_processes_of(s: &TestServer) -> Vec<String> {
    processes_in(s.uid_range.clone())
}

/// Host processes running under any jail uid (>= 200 000).
pub fn jail_processes() -> Vec<String> {
    processes_in(200_000..u32::MAX)
}

pub fn processes_in(range: std::ops::Range<u32>) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let uid: u32 = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|u| u.parse().ok())
            .unwrap_or(0);
        if range.contains(&uid) {
            out.push(format!("{pid}: {}", status.lines().next().unwrap_or("")));
        }
    }
    out
}

/// One Server-Sent Event as received, with when it arrived.
#[derive(Debug, Clone)]
pub struct Sse {
    pub at: std::time::Instant,
    /// The `event:` name; `None` for a comment (keep-alive).
    pub event: Option<String>,
    pub data: Value,
}

/// Reads a `text/event-stream` response to its end (or `limit`), parsing
/// frames as they arrive.
pub async fn sse_events(resp: reqwest::Response, limit: std::time::Duration) -> Vec<Sse> {
    use futures::StreamExt as _;
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream"),
        "not an event stream"
    );
    let mut body = resp.bytes_stream();
    // bytes, not text: a network chunk may end inside a character
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let until = tokio::time::Instant::now() + limit;
    loop {
        let chunk = match tokio::time::timeout_at(until, body.next()).await {
            Ok(Some(Ok(c))) => c,
            Ok(Some(Err(e))) => panic!("event stream broke: {e}"),
            Ok(None) | Err(_) => break,
        };
        let at = std::time::Instant::now();
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let frame: Vec<u8> = buf.drain(..end + 2).collect();
            let frame = String::from_utf8(frame).expect("an event is UTF-8");
            out.push(parse_frame(&frame, at));
        }
        if out
            .last()
            .is_some_and(|e| matches!(e.event.as_deref(), Some("result" | "error")))
        {
            break;
        }
    }
    out
}

/// One event-stream frame (its lines, without the blank line ending it).
pub fn parse_frame(frame: &str, at: std::time::Instant) -> Sse {
    let mut event = None;
    let mut data = String::new();
    for line in frame.lines() {
        if let Some(v) = line.strip_prefix("event:") {
            event = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(v.strip_prefix(' ').unwrap_or(v));
        }
    }
    Sse {
        at,
        event,
        data: serde_json::from_str(&data).unwrap_or(Value::Null),
    }
}

/// The concatenated `text` of the events named `name`.
pub fn sse_text(events: &[Sse], name: &str) -> String {
    events
        .iter()
        .filter(|e| e.event.as_deref() == Some(name))
        .map(|e| e.data["text"].as_str().unwrap_or_default())
        .collect()
}

/// The last event, which must be `result`; its data.
pub fn sse_result(events: &[Sse]) -> &Value {
    let last = events.last().expect("events");
    assert_eq!(last.event.as_deref(), Some("result"), "{events:?}");
    &last.data
}

/// Waits (up to 3 min) until the server's warm pool has `profile` (a
/// fork-server that is up).
pub async fn wait_for_profile(s: &TestServer, profile: &str) {
    let pool = s.warm.as_ref().expect("warm pool");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(180);
    while !pool.has_profile(profile) {
        assert!(
            std::time::Instant::now() < until,
            "the {profile} fork-server did not start"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The content blocks of an MCP tool result of type `kind` (`text`,
/// `image`, `resource_link`).
pub fn mcp_blocks<'a>(result: &'a Value, kind: &str) -> Vec<&'a Value> {
    result["content"]
        .as_array()
        .map(|a| a.iter().filter(|b| b["type"] == kind).collect())
        .unwrap_or_default()
}

/// An HS256 CodeAPI token for `sub`, with LibreChat's claims, signed with
/// [`JWT_SECRET`].
pub fn codeapi_token(sub: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({"iss": "librechat", "aud": "codeapi", "sub": sub, "iat": t, "nbf": t,
        "exp": t + 300, "jti": format!("jti-{sub}-{t}"), "tenant_id": "legacy", "role": "USER",
        "principal_source": "librechat_jwt", "auth_context_hash": "0".repeat(64)});
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some("hs256-dev".into());
    jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes()),
    )
    .unwrap()
}

/// The HS256 secret of [`codeapi_token`]'s tokens (`jwt_hs256_secret`).
pub const JWT_SECRET: &str = "integration-test-secret";
