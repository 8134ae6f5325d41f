//! A DeepL-like document translation API on loopback, for tests (here and
//! in `crates/kiln/tests`): multipart upload → document id and key →
//! status polling → download of the translated document. "Translation"
//! rewrites the text of a .docx's paragraphs from a small English→German
//! table, so the result is a real .docx that python-docx can read.
//!
//! Besides DeepL's routes it has the misbehaving ones the attack tests
//! need: redirects, an echo of the credentials (and a reflection of the
//! key that serves byte ranges and encodes it on request), large and slow
//! bodies and a sink that counts what it receives. Every request is logged.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Multipart, Path, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use bytes::Bytes;
use serde_json::json;
use tokio::sync::Notify;

/// What the fake saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub uri: String,
    pub authorization: Option<String>,
    pub headers: Vec<(String, String)>,
}

#[derive(Default)]
pub struct FakeState {
    pub key: String,
    pub seen: Mutex<Vec<Seen>>,
    docs: Mutex<HashMap<String, Doc>>,
    /// Bytes received by `/sink`.
    pub sunk: Mutex<u64>,
    /// Signalled when `/sink` got its first bytes.
    pub sink_started: Notify,
    /// `/stream/*` waits for this after its first chunk.
    pub stream_go: Notify,
}

struct Doc {
    key: String,
    translated: Vec<u8>,
    polls: u32,
}

pub struct FakeDeepl {
    /// `http://127.0.0.1:PORT`
    pub url: String,
    pub port: u16,
    pub state: Arc<FakeState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeDeepl {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeDeepl {
    pub async fn start(key: &str) -> FakeDeepl {
        let state = Arc::new(FakeState {
            key: key.to_owned(),
            ..FakeState::default()
        });
        let app = Router::new()
            .route("/v2/document", post(upload))
            .route("/v2/document/{id}", post(status))
            .route("/v2/document/{id}/result", post(result))
            .route("/v2/usage", get(|| async { "{}" }))
            .route("/redirect/{to}", any(redirect))
            .route("/echo", any(echo))
            .route("/reflect", get(reflect))
            .route("/big/{n}", get(big))
            .route("/chunked/{n}", get(chunked))
            .route("/stream/{n}", get(stream))
            .route("/slow", get(slow))
            .route("/sink", post(sink))
            .fallback(any(|| async { (StatusCode::NOT_FOUND, "no such route") }))
            .layer(axum::middleware::from_fn_with_state(state.clone(), log))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake upstream");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeDeepl {
            url: format!("http://127.0.0.1:{port}"),
            port,
            state,
            task,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().expect("lock").clone()
    }
}

async fn log(
    State(st): State<Arc<FakeState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let h = req.headers();
    st.seen.lock().expect("lock").push(Seen {
        method: req.method().to_string(),
        uri: req.uri().to_string(),
        authorization: h
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        headers: h
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
    });
    next.run(req).await
}

fn authorized(st: &FakeState, h: &HeaderMap) -> bool {
    h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
        == Some(format!("DeepL-Auth-Key {}", st.key).as_str())
}

fn forbidden() -> Response {
    (
        StatusCode::FORBIDDEN,
        axum::Json(json!({"message": "Wrong endpoint or invalid authentication key"})),
    )
        .into_response()
}

fn random_hex(n: usize) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    for _ in 0..n {
        let _ = write!(s, "{:X}", rand_nibble());
    }
    s
}

fn rand_nibble() -> u8 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
    let mut x = SEED.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (x >> 60) as u8
}

async fn upload(
    State(st): State<Arc<FakeState>>,
    headers: HeaderMap,
    mut form: Multipart,
) -> Response {
    if !authorized(&st, &headers) {
        return forbidden();
    }
    let (mut file, mut target) = (None, None);
    while let Ok(Some(field)) = form.next_field().await {
        match field.name() {
            Some("file") => file = field.bytes().await.ok(),
            Some("target_lang") => target = field.text().await.ok(),
            _ => {}
        }
    }
    let (Some(file), Some(target)) = (file, target) else {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"message": "file and target_lang are required"})),
        )
            .into_response();
    };
    if !target.eq_ignore_ascii_case("DE") {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"message": "this fake translates to DE only"})),
        )
            .into_response();
    }
    let Some(translated) = translate_docx(&file) else {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"message": "not a .docx document"})),
        )
            .into_response();
    };
    let (id, key) = (random_hex(32), random_hex(64));
    st.docs.lock().expect("lock").insert(
        id.clone(),
        Doc {
            key: key.clone(),
            translated,
            polls: 0,
        },
    );
    axum::Json(json!({"document_id": id, "document_key": key})).into_response()
}

/// `document_key` from a form-encoded or JSON body.
fn document_key(body: &[u8]) -> Option<String> {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        return v["document_key"].as_str().map(str::to_owned);
    }
    String::from_utf8_lossy(body)
        .split('&')
        .find_map(|p| p.strip_prefix("document_key="))
        .map(str::to_owned)
}

async fn status(
    State(st): State<Arc<FakeState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !authorized(&st, &headers) {
        return forbidden();
    }
    let mut docs = st.docs.lock().expect("lock");
    let Some(doc) = docs.get_mut(&id) else {
        return (StatusCode::NOT_FOUND, "no such document").into_response();
    };
    if document_key(&body).as_deref() != Some(doc.key.as_str()) {
        return forbidden();
    }
    doc.polls += 1;
    let body = if doc.polls < 2 {
        json!({"document_id": id, "status": "translating", "seconds_remaining": 1})
    } else {
        json!({"document_id": id, "status": "done", "billed_characters": 42})
    };
    axum::Json(body).into_response()
}

async fn result(
    State(st): State<Arc<FakeState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !authorized(&st, &headers) {
        return forbidden();
    }
    let docs = st.docs.lock().expect("lock");
    let Some(doc) = docs.get(&id) else {
        return (StatusCode::NOT_FOUND, "no such document").into_response();
    };
    if document_key(&body).as_deref() != Some(doc.key.as_str()) || doc.polls < 2 {
        return forbidden();
    }
    (
        [
            (
                header::CONTENT_TYPE,
                "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            ),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"document.docx\"",
            ),
        ],
        doc.translated.clone(),
    )
        .into_response()
}

async fn redirect(Path(to): Path<String>) -> Response {
    let target = match to.as_str() {
        "local" => "http://127.0.0.1:1/internal",
        "metadata" => "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        _ => "https://example.com/",
    };
    (StatusCode::FOUND, [(header::LOCATION, target)], "moved").into_response()
}

/// Echoes every credential it got, in headers and the body.
async fn echo(headers: HeaderMap, uri: Uri) -> Response {
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let api_key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = format!(
        "you sent authorization={auth} x-api-key={api_key} uri={uri} host={}",
        headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    );
    (
        [
            ("x-echo-authorization", auth.clone()),
            ("x-echo-key", api_key.clone()),
            (
                header::SET_COOKIE.as_str(),
                "session=abc; HttpOnly".to_owned(),
            ),
            (header::CONTENT_TYPE.as_str(), "text/plain".to_owned()),
            (header::ETAG.as_str(), format!("\"{auth}\"")),
        ],
        body,
    )
        .into_response()
}

/// `key=<the Authorization value>\n`, encoded as `?as=` says (`upper`,
/// `hex`, `base64`, `base64url`, `url`, or `gzip`: sent compressed with
/// `Content-Encoding: gzip`), and a `Range: bytes=A-B` of it as a 206.
async fn reflect(headers: HeaderMap, uri: Uri) -> Response {
    use base64::Engine as _;
    let auth = headers
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes().to_vec())
        .unwrap_or_default();
    let how = uri
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("as=")))
        .unwrap_or("plain");
    let key: Vec<u8> = match how {
        "upper" => auth.to_ascii_uppercase(),
        "hex" => auth
            .iter()
            .flat_map(|b| format!("{b:02x}").into_bytes())
            .collect(),
        "base64" => base64::engine::general_purpose::STANDARD
            .encode(&auth)
            .into_bytes(),
        "base64url" => base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(&auth)
            .into_bytes(),
        // as encodeURIComponent or urllib's quote(safe='') would
        "url" => auth
            .iter()
            .flat_map(|&b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    vec![b]
                } else {
                    format!("%{b:02X}").into_bytes()
                }
            })
            .collect(),
        _ => auth,
    };
    let mut body = b"key=".to_vec();
    body.extend_from_slice(&key);
    body.push(b'\n');
    if how == "gzip" {
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&body).expect("gzip");
        let body = z.finish().expect("gzip");
        return ([(header::CONTENT_ENCODING, "gzip")], body).into_response();
    }
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
    match range {
        Some((a, b)) if a <= b && a < body.len() => {
            let b = b.min(body.len() - 1);
            (
                StatusCode::PARTIAL_CONTENT,
                [
                    (header::ACCEPT_RANGES, "bytes".to_owned()),
                    (
                        header::CONTENT_RANGE,
                        format!("bytes {a}-{b}/{}", body.len()),
                    ),
                ],
                body[a..=b].to_vec(),
            )
                .into_response()
        }
        _ => ([(header::ACCEPT_RANGES, "bytes")], body).into_response(),
    }
}

async fn big(Path(n): Path<usize>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        vec![b'x'; n],
    )
        .into_response()
}

/// `n` bytes without a Content-Length.
async fn chunked(Path(n): Path<usize>) -> Response {
    let chunk = Bytes::from(vec![b'y'; 64 * 1024]);
    let chunks = n.div_ceil(chunk.len());
    let last = n - (chunks.saturating_sub(1)) * chunk.len();
    let s = futures::stream::iter((0..chunks).map(move |i| {
        let c = if i + 1 == chunks {
            chunk.slice(..last)
        } else {
            chunk.clone()
        };
        Ok::<_, std::io::Error>(c)
    }));
    Response::new(Body::from_stream(s))
}

/// `n` bytes with a Content-Length: the first 64 KiB at once, the rest only
/// after `stream_go` (so a test can see the first bytes arrive before the
/// upstream has sent the whole body).
async fn stream(State(st): State<Arc<FakeState>>, Path(n): Path<usize>) -> Response {
    let first = (64 * 1024).min(n);
    let s = async_stream_body(st, n, first);
    let mut r = Response::new(Body::from_stream(s));
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, n.to_string().parse().expect("len"));
    r
}

fn async_stream_body(
    st: Arc<FakeState>,
    n: usize,
    first: usize,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::unfold(0usize, move |sent| {
        let st = st.clone();
        async move {
            if sent >= n {
                return None;
            }
            if sent == first {
                st.stream_go.notified().await;
            }
            let take = if sent == 0 {
                first
            } else {
                (n - sent).min(256 * 1024)
            };
            Some((Ok(Bytes::from(vec![b'z'; take])), sent + take))
        }
    })
}

async fn slow() -> &'static str {
    tokio::time::sleep(Duration::from_secs(30)).await;
    "late"
}

/// Counts the body's bytes as they arrive.
async fn sink(State(st): State<Arc<FakeState>>, body: Body) -> Response {
    use futures::StreamExt;
    let mut s = body.into_data_stream();
    let mut first = true;
    while let Some(Ok(chunk)) = s.next().await {
        *st.sunk.lock().expect("lock") += chunk.len() as u64;
        if first {
            first = false;
            st.sink_started.notify_one();
        }
    }
    let n = *st.sunk.lock().expect("lock");
    axum::Json(json!({"received": n})).into_response()
}

const EN_DE: &[(&str, &str)] = &[
    ("Service Agreement", "Dienstleistungsvertrag"),
    (
        "This contract is signed by both parties.",
        "Dieser Vertrag wird von beiden Parteien unterzeichnet.",
    ),
    (
        "Payment is due within thirty days.",
        "Die Zahlung ist innerhalb von dreißig Tagen fällig.",
    ),
];

/// The German of one paragraph (unknown text is marked, not dropped).
pub fn to_german(en: &str) -> String {
    EN_DE
        .iter()
        .find(|(e, _)| *e == en)
        .map(|(_, d)| (*d).to_owned())
        .unwrap_or_else(|| format!("[DE] {en}"))
}

/// A minimal .docx with one paragraph per entry.
pub fn make_docx(paragraphs: &[&str]) -> Vec<u8> {
    let body: String = paragraphs
        .iter()
        .map(|p| format!("<w:p><w:r><w:t>{}</w:t></w:r></w:p>", xml_escape(p)))
        .collect();
    let document = format!(
        r#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>{body}</w:body></w:document>"#
    );
    let files: Vec<(&str, String)> = vec![
        (
            "[Content_Types].xml",
            r#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/><Default Extension="xml" ContentType="application/xml"/><Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>"#
                .to_owned(),
        ),
        (
            "_rels/.rels",
            r#"<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="word/document.xml"/></Relationships>"#
                .to_owned(),
        ),
        ("word/document.xml", document),
    ];
    let mut out = std::io::Cursor::new(Vec::new());
    {
        let mut z = zip::ZipWriter::new(&mut out);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, text) in files {
            z.start_file(name, opts).expect("zip entry");
            z.write_all(text.as_bytes()).expect("zip write");
        }
        z.finish().expect("zip finish");
    }
    out.into_inner()
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn xml_unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// The paragraphs' text of a .docx made by [`make_docx`] (or translated).
pub fn docx_paragraphs(bytes: &[u8]) -> Option<Vec<String>> {
    let mut z = zip::ZipArchive::new(std::io::Cursor::new(bytes)).ok()?;
    let mut xml = String::new();
    z.by_name("word/document.xml")
        .ok()?
        .read_to_string(&mut xml)
        .ok()?;
    Some(
        xml.split("<w:t>")
            .skip(1)
            .filter_map(|p| p.split_once("</w:t>").map(|(t, _)| xml_unescape(t)))
            .collect(),
    )
}

/// The fake's translation: every paragraph to German, the rest unchanged.
fn translate_docx(bytes: &[u8]) -> Option<Vec<u8>> {
    let paragraphs = docx_paragraphs(bytes)?;
    let german: Vec<String> = paragraphs.iter().map(|p| to_german(p)).collect();
    let refs: Vec<&str> = german.iter().map(String::as_str).collect();
    Some(make_docx(&refs))
}
