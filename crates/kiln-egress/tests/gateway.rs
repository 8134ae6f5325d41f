//! The gateway served on a host listener, as a jail would reach it, against
//! a DeepL-like fake upstream on loopback: the document flow works with
//! the key injected, and every attack the issue lists is refused with a
//! clear error while the gateway keeps serving.

#[path = "support/fake_deepl.rs"]
mod fake_deepl;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fake_deepl::{FakeDeepl, docx_paragraphs, make_docx, to_german};
use kiln_core::Principal;
use kiln_egress::{
    CallRecord, Channel, EgressSettings, Gateway, GrantOwner, MemoryLedger, Registry, ServiceConfig,
};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY: &str = "fake-deepl-key-5f2c9a7e-0b1d:fx";

fn env(n: &str) -> Option<String> {
    (n == "DEEPL_API_KEY").then(|| KEY.to_owned())
}

fn service(upstream: &str, paths: &[&str]) -> ServiceConfig {
    ServiceConfig {
        upstream: upstream.to_owned(),
        description: "test service".to_owned(),
        allowed_methods: vec!["POST".into(), "GET".into()],
        allowed_paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        inject_header: BTreeMap::new(),
        inject_query: BTreeMap::new(),
        max_body_bytes: 1 << 20,
        max_response_bytes: 1 << 20,
        rate: None,
        user_rate: None,
        timeout_secs: 2,
        users: vec![],
        tenants: vec![],
        allow_private_upstream: true,
        forward_headers: vec![],
        response_headers: vec![],
        allow_range: false,
        max_requests_per_grant: 100,
    }
}

fn alice() -> Principal {
    Principal {
        tenant: "default".into(),
        user_id: "alice".into(),
    }
}

struct Setup {
    fake: FakeDeepl,
    ledger: Arc<MemoryLedger>,
    channel: Option<Channel>,
    url: String,
}

impl Setup {
    /// The ledger's records, once the background writes have landed.
    async fn calls(&self, at_least: usize) -> Vec<CallRecord> {
        for _ in 0..200 {
            let c = self.ledger.calls();
            if c.len() >= at_least {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.ledger.calls()
    }
}

async fn setup(
    tweak: impl FnOnce(&mut BTreeMap<String, ServiceConfig>, &mut EgressSettings),
) -> Setup {
    let fake = FakeDeepl::start(KEY).await;
    let mut services = BTreeMap::new();
    let mut deepl = service(&fake.url, &["/v2/document", "/v2/document/*"]);
    deepl.inject_header = [(
        "Authorization".to_owned(),
        "DeepL-Auth-Key ${DEEPL_API_KEY}".to_owned(),
    )]
    .into();
    deepl.max_body_bytes = 31_457_280;
    deepl.max_response_bytes = 40 << 20;
    deepl.rate = Some("60/min".into());
    services.insert("deepl".to_owned(), deepl);
    let mut tricks = service(
        &fake.url,
        &[
            "/redirect/*",
            "/echo",
            "/reflect",
            "/big/*",
            "/chunked/*",
            "/stream/*",
            "/slow",
            "/sink",
        ],
    );
    tricks.inject_header = [
        ("X-Api-Key".to_owned(), "${DEEPL_API_KEY}".to_owned()),
        (
            "Authorization".to_owned(),
            "DeepL-Auth-Key ${DEEPL_API_KEY}".to_owned(),
        ),
    ]
    .into();
    tricks.inject_query = [("auth_key".to_owned(), "${DEEPL_API_KEY}".to_owned())].into();
    services.insert("tricks".to_owned(), tricks);
    services.insert(
        "blocked".to_owned(),
        ServiceConfig {
            allow_private_upstream: false,
            ..service(&format!("https://localhost:{}", fake.port), &["/v2/usage"])
        },
    );
    services.insert(
        "others".to_owned(),
        ServiceConfig {
            users: vec!["someone-else".into()],
            ..service(&fake.url, &["/v2/usage"])
        },
    );
    let mut settings = EgressSettings::default();
    tweak(&mut services, &mut settings);
    let registry = Registry::build(&services, &env).expect("registry");
    let ledger = Arc::new(MemoryLedger::default());
    let gw = Gateway::new(registry, settings, ledger.clone());
    let grant = gw
        .mint(
            &alice(),
            GrantOwner::Run("run-1".into()),
            Duration::from_secs(60),
        )
        .expect("alice may use services");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let channel = gw.open(grant, listener, &url);
    Setup {
        fake,
        ledger,
        channel: Some(channel),
        url,
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

/// Status, reason header and JSON body of a refused call.
async fn refused(r: reqwest::Response) -> (u16, String, Value) {
    let status = r.status().as_u16();
    let reason = r
        .headers()
        .get("x-kiln-egress-error")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    (status, reason, body)
}

/// Asserts a refusal's status and reason; returns its JSON body.
async fn expect_refused(r: reqwest::Response, status: u16, reason: &str) -> Value {
    let (got, why, body) = refused(r).await;
    assert_eq!((got, why.as_str()), (status, reason), "{body}");
    body
}

fn assert_no_key(what: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    assert!(!text.contains(KEY), "{what} shows the key: {text}");
    assert!(
        !text.contains("5f2c9a7e"),
        "{what} shows part of the key: {text}"
    );
}

async fn get_healthy(s: &Setup) {
    let r = client()
        .get(format!("{}/", s.url))
        .send()
        .await
        .expect("gateway still serving");
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn the_deepl_document_flow_works_with_the_key_injected_and_never_shown() {
    let s = setup(|_, _| {}).await;
    let c = client();
    let docx = make_docx(&[
        "Service Agreement",
        "This contract is signed by both parties.",
    ]);
    let form = reqwest::multipart::Form::new()
        .text("target_lang", "DE")
        .part(
            "file",
            reqwest::multipart::Part::bytes(docx).file_name("contract.docx"),
        );
    let mut shown: Vec<u8> = Vec::new();
    let r = c
        .post(format!("{}/deepl/v2/document", s.url))
        .multipart(form)
        .send()
        .await
        .expect("upload");
    assert_eq!(r.status(), 200);
    shown.extend(format!("{:?}", r.headers()).bytes());
    let up: Value = r.json().await.expect("json");
    let (id, key) = (
        up["document_id"].as_str().expect("id").to_owned(),
        up["document_key"].as_str().expect("key").to_owned(),
    );
    let mut polls = 0;
    loop {
        polls += 1;
        let r = c
            .post(format!("{}/deepl/v2/document/{id}", s.url))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("document_key={key}"))
            .send()
            .await
            .expect("status");
        assert_eq!(r.status(), 200);
        shown.extend(format!("{:?}", r.headers()).bytes());
        let st: Value = r.json().await.expect("json");
        if st["status"] == "done" {
            break;
        }
        assert!(polls < 5, "never done: {st}");
    }
    let r = c
        .post(format!("{}/deepl/v2/document/{id}/result", s.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("document_key={key}"))
        .send()
        .await
        .expect("download");
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["content-type"],
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    );
    shown.extend(format!("{:?}", r.headers()).bytes());
    let translated = r.bytes().await.expect("bytes");
    shown.extend_from_slice(&translated);
    assert_eq!(
        docx_paragraphs(&translated).expect("a docx"),
        vec![
            to_german("Service Agreement"),
            to_german("This contract is signed by both parties.")
        ]
    );
    // the upstream got the key on every call; the caller never saw it
    let seen = s.fake.seen();
    assert!(seen.len() >= 4);
    for call in &seen {
        assert_eq!(
            call.authorization.as_deref(),
            Some(format!("DeepL-Auth-Key {KEY}").as_str()),
            "{call:?}"
        );
    }
    assert_no_key("responses", &shown);
    // every call is in the ledger, under the run and the user
    let calls = s.calls(seen.len()).await;
    assert_eq!(calls.len(), seen.len(), "{calls:?}");
    assert!(calls.iter().all(|c| c.owner == "run:run-1"
        && c.user_id == "alice"
        && c.service == "deepl"
        && c.status == 200
        && c.outcome == "ok"));
    assert_eq!(calls[0].path, "/v2/document");
    assert!(calls[0].bytes_up > 0);
    assert!(calls.last().expect("last").bytes_down as usize == translated.len());
}

#[tokio::test]
async fn the_listing_shows_the_granted_services_only() {
    let s = setup(|_, _| {}).await;
    let r = client()
        .get(format!("{}/", s.url))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    let names: Vec<&str> = v["services"]
        .as_array()
        .expect("services")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, vec!["blocked", "deepl", "tricks"]);
    let deepl = &v["services"][1];
    assert_eq!(deepl["url"], format!("{}/deepl", s.url));
    assert_eq!(deepl["methods"], serde_json::json!(["POST", "GET"]));
    assert_eq!(
        deepl["paths"],
        serde_json::json!(["/v2/document", "/v2/document/*"])
    );
    assert_eq!(deepl["rate"], "60/min");
    assert_eq!(deepl["max_request_bytes"], 31_457_280);
    assert!(v["usage"].as_str().expect("usage").contains(&s.url));
    assert_no_key("listing", v.to_string().as_bytes());
}

#[tokio::test]
async fn a_service_not_granted_is_refused_like_an_unknown_one() {
    let s = setup(|_, _| {}).await;
    for name in ["others", "nosuch", "..", "%2e%2e"] {
        let r = client()
            .get(format!("{}/{name}/v2/usage", s.url))
            .send()
            .await
            .expect("send");
        let (status, reason, body) = refused(r).await;
        assert_eq!(
            (status, reason.as_str()),
            (403, "not_granted"),
            "{name}: {body}"
        );
        assert!(body["error"].as_str().expect("error").contains("deepl"));
    }
    assert!(s.fake.seen().is_empty(), "{:?}", s.fake.seen());
    let calls = s.calls(4).await;
    assert_eq!(calls.len(), 4);
    assert!(calls.iter().all(|c| c.outcome == "not_granted"));
    get_healthy(&s).await;
}

#[tokio::test]
async fn paths_outside_the_allow_list_and_encoding_tricks_never_reach_the_upstream() {
    let s = setup(|_, _| {}).await;
    let cases: &[(&str, u16, &str)] = &[
        ("/deepl/v2/usage", 403, "path_not_allowed"),
        ("/deepl/v2", 403, "path_not_allowed"),
        ("/deepl/v2/documents", 403, "path_not_allowed"),
        ("/deepl/v2/document/../usage", 400, "bad_path"),
        ("/deepl/v2/document/%2e%2e/usage", 400, "bad_path"),
        ("/deepl/v2/document/%2E%2E%2Fusage", 400, "bad_path"),
        ("/deepl/v2/document/%252e%252e/usage", 400, "bad_path"),
        ("/deepl/v2/document/x%5c..%5cusage", 400, "bad_path"),
        ("/deepl/v2/document/..;/usage", 400, "bad_path"),
        ("/deepl/v2//document", 400, "bad_path"),
        ("/deepl/v2/document/%00", 400, "bad_path"),
        ("/deepl/v2/document/a%0d%0aX-Injected:%201", 400, "bad_path"),
    ];
    for (path, status, reason) in cases {
        // a raw request line, so no client library normalises the path first
        let (st, head, body) = raw(
            &s.url,
            &format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
        )
        .await;
        assert_eq!(st, *status, "{path}: {head}{body}");
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("x-kiln-egress-error: {reason}")),
            "{path}: {head}"
        );
    }
    // a Host header or an absolute URL cannot pick another upstream
    let (st, head, _) = raw(
        &s.url,
        "GET http://169.254.169.254/deepl/v2/document HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n",
    )
    .await;
    assert_eq!(st, 400, "{head}");
    let (st, _, body) = raw(
        &s.url,
        "GET /tricks/echo HTTP/1.1\r\nHost: evil.example\r\nX-Forwarded-Host: evil.example\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert_eq!(st, 200, "{body}");
    assert!(
        body.contains(&format!("host=127.0.0.1:{}", s.fake.port)),
        "{body}"
    );
    let echoed = s.fake.seen();
    assert_eq!(
        echoed.len(),
        1,
        "only the echo reached the upstream: {echoed:?}"
    );
    assert!(
        !echoed[0]
            .headers
            .iter()
            .any(|(k, _)| k.starts_with("x-forwarded")),
        "{echoed:?}"
    );
    get_healthy(&s).await;
}

/// Sends `request` on a fresh connection; returns status, head and body.
async fn raw(url: &str, request: &str) -> (u16, String, String) {
    let addr = url.trim_start_matches("http://");
    let mut sock = tokio::net::TcpStream::connect(addr).await.expect("connect");
    sock.write_all(request.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let mut chunk = [0u8; 8192];
        loop {
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf);
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length: ")
                                    .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            break;
                        }
                    }
                }
            }
        }
    })
    .await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

#[tokio::test]
async fn methods_outside_the_allow_list_are_refused() {
    let s = setup(|_, _| {}).await;
    let r = client()
        .delete(format!("{}/deepl/v2/document/ABC", s.url))
        .send()
        .await
        .expect("send");
    let (status, reason, body) = refused(r).await;
    assert_eq!(
        (status, reason.as_str()),
        (405, "method_not_allowed"),
        "{body}"
    );
    assert!(s.fake.seen().is_empty());
}

#[tokio::test]
async fn redirects_to_loopback_or_metadata_are_never_followed() {
    let s = setup(|_, _| {}).await;
    for to in ["local", "metadata"] {
        let r = client()
            .get(format!("{}/tricks/redirect/{to}", s.url))
            .send()
            .await
            .expect("send");
        assert!(r.headers().get("location").is_none());
        let (status, reason, body) = refused(r).await;
        assert_eq!(
            (status, reason.as_str()),
            (502, "upstream_redirect"),
            "{body}"
        );
        assert!(!body.to_string().contains("169.254"), "{body}");
    }
    // the upstream saw exactly the two redirecting calls, nothing followed
    assert_eq!(s.fake.seen().len(), 2);
    get_healthy(&s).await;
}

#[tokio::test]
async fn a_response_echoing_the_key_reaches_the_jail_without_it() {
    let s = setup(|_, _| {}).await;
    let r = client()
        .get(format!("{}/tricks/echo?q=1&auth_key=mine", s.url))
        .header("Authorization", "Bearer from-the-jail")
        .header("Cookie", "a=b")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let headers = format!("{:?}", r.headers());
    assert!(r.headers().get("set-cookie").is_none(), "{headers}");
    assert!(
        r.headers().get("x-echo-authorization").is_none(),
        "{headers}"
    );
    assert!(
        r.headers().get("etag").is_none(),
        "an etag quoting the key: {headers}"
    );
    let body = r.text().await.expect("text");
    assert_no_key("headers", headers.as_bytes());
    assert_no_key("body", body.as_bytes());
    assert!(body.contains("authorization=DeepL-Auth-Key ****"), "{body}");
    // the upstream got the injected credentials, not the jail's, and the
    // jail's own auth_key parameter was replaced
    let seen = &s.fake.seen()[0];
    assert_eq!(
        seen.authorization.as_deref(),
        Some(format!("DeepL-Auth-Key {KEY}").as_str())
    );
    assert!(!seen.headers.iter().any(|(k, _)| k == "cookie"), "{seen:?}");
    assert!(seen.uri.contains("q=1"), "{seen:?}");
    assert!(!seen.uri.contains("auth_key=mine"), "{seen:?}");
    assert!(
        seen.uri
            .contains("auth_key=fake-deepl-key-5f2c9a7e-0b1d%3Afx"),
        "{seen:?}"
    );
    let calls = s.calls(1).await;
    assert_eq!(calls[0].outcome, "ok");
}

/// `GET /tricks/reflect?as=<how>` with an optional `Range`: status and body.
async fn reflect(s: &Setup, how: &str, range: Option<String>) -> (u16, Vec<u8>) {
    let mut req = client().get(format!("{}/tricks/reflect?as={how}", s.url));
    if let Some(r) = range {
        req = req.header("Range", r);
    }
    let r = req.send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.bytes().await.expect("body").to_vec())
}

/// Whether `bytes` holds 8 consecutive bytes of the key (ASCII case aside).
fn has_key_piece(bytes: &[u8]) -> bool {
    let hay = bytes.to_ascii_lowercase();
    KEY.as_bytes()
        .windows(8)
        .any(|w| hay.windows(8).any(|h| h == w.to_ascii_lowercase()))
}

/// The slices of 12 bytes of `/reflect` a jail would ask for, put together.
async fn rebuilt_from_slices(s: &Setup) -> Vec<u8> {
    let (_, whole) = reflect(s, "plain", None).await;
    let mut rebuilt = Vec::new();
    for a in (0..whole.len()).step_by(12) {
        let (status, part) = reflect(s, "plain", Some(format!("bytes={a}-{}", a + 11))).await;
        assert!(status == 200 || status == 206, "{status}");
        if status == 200 {
            return part; // the range was not honoured: the whole body
        }
        rebuilt.extend_from_slice(&part);
    }
    rebuilt
}

#[tokio::test]
async fn range_requests_never_reach_the_upstream_so_slices_cannot_rebuild_the_key() {
    let s = setup(|_, _| {}).await;
    let rebuilt = rebuilt_from_slices(&s).await;
    assert_no_key("the slices put together", &rebuilt);
    assert!(
        rebuilt.starts_with(b"key=DeepL-Auth-Key ****"),
        "{rebuilt:?}"
    );
    assert!(
        s.fake.seen().iter().all(|r| !r
            .headers
            .iter()
            .any(|(k, _)| k == "range" || k == "if-range")),
        "a Range header reached the upstream"
    );
}

#[tokio::test]
async fn a_service_that_allows_ranges_still_never_passes_eight_bytes_of_the_key() {
    let s = setup(|services, _| {
        services.get_mut("tricks").expect("tricks").allow_range = true;
    })
    .await;
    let rebuilt = rebuilt_from_slices(&s).await;
    assert!(
        s.fake
            .seen()
            .iter()
            .any(|r| r.headers.iter().any(|(k, _)| k == "range")),
        "the service allows ranges: they reach the upstream"
    );
    assert!(
        !has_key_piece(&rebuilt),
        "{}",
        String::from_utf8_lossy(&rebuilt)
    );
    assert_no_key("the slices put together", &rebuilt);
}

#[tokio::test]
async fn a_reflected_key_in_another_case_or_encoding_is_scrubbed() {
    use base64::Engine as _;
    use base64::engine::general_purpose::{GeneralPurpose, STANDARD, URL_SAFE_NO_PAD};
    let s = setup(|_, _| {}).await;
    let b64 = |e: &GeneralPurpose, text: &[u8]| -> Vec<u8> {
        // what the jail could decode: scrubbed characters taken for 'A'
        let t: Vec<u8> = text
            .iter()
            .map(|&c| if c == b'*' { b'A' } else { c })
            .collect();
        let t = &t[..t.len() - t.len() % 4];
        e.decode(t).unwrap_or_default()
    };
    for how in ["upper", "hex", "base64", "base64url", "url"] {
        let (status, body) = reflect(&s, how, None).await;
        assert_eq!(status, 200, "{how}");
        let text = body
            .strip_prefix(b"key=")
            .and_then(|b| b.strip_suffix(b"\n"))
            .expect("key=...");
        let decoded: Vec<u8> = match how {
            "hex" => text
                .chunks(2)
                .filter_map(|c| u8::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok())
                .collect(),
            "base64" => [0, 1, 2, 3]
                .iter()
                .flat_map(|&skip| b64(&STANDARD, &text[skip..]))
                .collect(),
            "base64url" => [0, 1, 2, 3]
                .iter()
                .flat_map(|&skip| b64(&URL_SAFE_NO_PAD, &text[skip..]))
                .collect(),
            "url" => percent_encoding::percent_decode(text).collect(),
            _ => text.to_vec(),
        };
        assert!(
            !has_key_piece(&decoded),
            "{how}: {} decodes to {}",
            String::from_utf8_lossy(text),
            String::from_utf8_lossy(&decoded)
        );
    }
    assert_eq!(s.calls(5).await.len(), 5);
}

#[tokio::test]
async fn a_compressed_answer_is_refused_because_it_could_not_be_scrubbed() {
    let s = setup(|_, _| {}).await;
    let r = client()
        .get(format!("{}/tricks/reflect?as=gzip", s.url))
        .header("Accept-Encoding", "gzip")
        .send()
        .await
        .expect("send");
    expect_refused(r, 502, "upstream_encoded").await;
    let seen = &s.fake.seen()[0];
    assert!(
        seen.headers
            .iter()
            .any(|(k, v)| k == "accept-encoding" && v == "identity"),
        "{seen:?}"
    );
    get_healthy(&s).await;
}

#[tokio::test]
async fn oversized_request_bodies_are_refused_declared_or_streamed() {
    let s = setup(|_, _| {}).await;
    // declared: refused before anything is sent upstream
    let r = client()
        .post(format!("{}/tricks/sink", s.url))
        .body(vec![0u8; (1 << 20) + 1])
        .send()
        .await
        .expect("send");
    let (status, reason, _) = refused(r).await;
    assert_eq!((status, reason.as_str()), (413, "request_too_large"));
    assert!(s.fake.seen().is_empty());
    // streamed without a length: cut at the cap
    let chunks = futures::stream::iter(
        (0..40).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![1u8; 64 * 1024]))),
    );
    let r = client()
        .post(format!("{}/tricks/sink", s.url))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .expect("send");
    let (status, reason, body) = refused(r).await;
    assert_eq!(
        (status, reason.as_str()),
        (413, "request_too_large"),
        "{body}"
    );
    assert!(*s.fake.state.sunk.lock().expect("lock") <= 1 << 20);
    get_healthy(&s).await;
}

#[tokio::test]
async fn oversized_responses_are_refused_or_cut() {
    let s = setup(|_, _| {}).await;
    let r = client()
        .get(format!("{}/tricks/big/{}", s.url, (1 << 20) + 1))
        .send()
        .await
        .expect("send");
    let (status, reason, _) = refused(r).await;
    assert_eq!((status, reason.as_str()), (502, "response_too_large"));
    // without a Content-Length the body is cut off at the cap
    let r = client()
        .get(format!("{}/tricks/chunked/{}", s.url, 3 << 20))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    assert!(
        r.bytes().await.is_err(),
        "a cut body must not look complete"
    );
    let calls = s.calls(2).await;
    assert_eq!(calls[1].outcome, "response_too_large", "{calls:?}");
    assert!(calls[1].bytes_down <= 1 << 20);
    // exactly at the cap is fine
    let r = client()
        .get(format!("{}/tricks/chunked/{}", s.url, 1 << 20))
        .send()
        .await
        .expect("send");
    assert_eq!(r.bytes().await.expect("complete").len(), 1 << 20);
}

#[tokio::test]
async fn thirty_megabytes_stream_both_ways_without_being_buffered_whole() {
    let s = setup(|services, _| {
        let t = services.get_mut("tricks").expect("tricks");
        t.max_body_bytes = 31_457_280;
        t.max_response_bytes = 31_457_280;
        t.timeout_secs = 60;
    })
    .await;
    const N: usize = 30 * 1024 * 1024;
    // up: the upstream gets the first bytes while the client still holds
    // back the rest
    let state = s.fake.state.clone();
    let first = bytes::Bytes::from(vec![7u8; 256 * 1024]);
    let rest_len = N - first.len();
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(first) }).chain(
        futures::stream::once(async move {
            tokio::time::timeout(Duration::from_secs(10), state.sink_started.notified())
                .await
                .expect("the upstream saw no byte before the whole body was sent");
            Ok(bytes::Bytes::from(vec![7u8; rest_len]))
        }),
    );
    use futures::StreamExt;
    let r = client()
        .post(format!("{}/tricks/sink", s.url))
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["received"], N as u64);
    // down: the first bytes arrive while the upstream holds back the rest
    let mut r = client()
        .get(format!("{}/tricks/stream/{N}", s.url))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    assert_eq!(r.content_length(), Some(N as u64));
    let mut got = r.chunk().await.expect("first chunk").expect("some").len();
    s.fake.state.stream_go.notify_one();
    while let Some(c) = r.chunk().await.expect("chunk") {
        got += c.len();
    }
    assert_eq!(got, N);
}

#[tokio::test]
async fn a_burst_over_the_rate_gets_a_clear_429_and_the_service_recovers() {
    let s = setup(|services, _| {
        services.get_mut("tricks").expect("tricks").rate = Some("3/min".into());
    })
    .await;
    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..5 {
        let r = client()
            .get(format!("{}/tricks/big/10", s.url))
            .send()
            .await
            .expect("send");
        statuses.push(r.status().as_u16());
        if r.status() == 429 {
            let retry: u64 = r.headers()["retry-after"]
                .to_str()
                .expect("str")
                .parse()
                .expect("secs");
            assert!((1..=20).contains(&retry), "{retry}");
            last = Some(refused(r).await);
        }
    }
    assert_eq!(statuses, vec![200, 200, 200, 429, 429]);
    let (_, reason, body) = last.expect("a 429");
    assert_eq!(reason, "rate_limited");
    assert!(
        body["error"].as_str().expect("error").contains("3/min"),
        "{body}"
    );
    assert_eq!(s.fake.seen().len(), 3);
    // other services are not affected
    let r = client()
        .post(format!("{}/deepl/v2/document", s.url))
        .send()
        .await
        .expect("send");
    assert_ne!(r.status(), 429);
}

#[tokio::test]
async fn a_user_rate_limits_each_user_and_a_grant_has_a_call_quota() {
    let s = setup(|services, _| {
        let t = services.get_mut("tricks").expect("tricks");
        t.user_rate = Some("2/hour".into());
        let d = services.get_mut("deepl").expect("deepl");
        d.max_requests_per_grant = 1;
    })
    .await;
    let c = client();
    for expect in [200, 200, 429] {
        let r = c
            .get(format!("{}/tricks/big/1", s.url))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), expect);
    }
    let r = c
        .post(format!("{}/deepl/v2/document/X", s.url))
        .send()
        .await
        .expect("send");
    assert_ne!(r.status(), 429);
    let r = c
        .post(format!("{}/deepl/v2/document/X", s.url))
        .send()
        .await
        .expect("send");
    let (status, reason, _) = refused(r).await;
    assert_eq!((status, reason.as_str()), (429, "grant_exhausted"));
}

#[tokio::test]
async fn an_upstream_resolving_to_loopback_is_refused_by_the_guard() {
    let s = setup(|_, _| {}).await;
    let r = client()
        .get(format!("{}/blocked/v2/usage", s.url))
        .send()
        .await
        .expect("send");
    let (status, reason, body) = refused(r).await;
    assert_eq!(
        (status, reason.as_str()),
        (502, "upstream_blocked"),
        "{body}"
    );
    assert!(
        body["error"].as_str().expect("error").contains("loopback"),
        "{body}"
    );
    assert!(s.fake.seen().is_empty());
}

#[tokio::test]
async fn a_slow_upstream_times_out_and_concurrency_is_bounded() {
    let s = setup(|_, settings| {
        settings.max_concurrent_calls = 1;
        settings.queue_timeout = Duration::from_millis(300);
    })
    .await;
    let slow = tokio::spawn({
        let url = s.url.clone();
        async move { client().get(format!("{url}/tricks/slow")).send().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = client()
        .get(format!("{}/tricks/big/1", s.url))
        .send()
        .await
        .expect("send");
    let (status, reason, _) = refused(r).await;
    assert_eq!((status, reason.as_str()), (503, "busy"));
    let r = slow.await.expect("join").expect("send");
    let (status, reason, body) = refused(r).await;
    assert_eq!(
        (status, reason.as_str()),
        (504, "upstream_timeout"),
        "{body}"
    );
    // the slot is free again
    let r = client()
        .get(format!("{}/tricks/big/1", s.url))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn closing_the_channel_revokes_the_grant_and_ends_its_connections() {
    let mut s = setup(|_, _| {}).await;
    let c = client();
    let r = c.get(format!("{}/", s.url)).send().await.expect("get");
    assert_eq!(r.status(), 200);
    let grant = s.channel.as_ref().expect("channel").grant().clone();
    s.channel.take().expect("channel").close().await;
    assert_eq!(
        grant.state(std::time::Instant::now()),
        kiln_egress::GrantState::Revoked
    );
    let r = c.get(format!("{}/", s.url)).send().await;
    assert!(r.is_err(), "still served after close: {r:?}");
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_dropped() {
    let s = setup(|_, settings| settings.header_timeout = Duration::from_millis(300)).await;
    let addr = s.url.trim_start_matches("http://").to_owned();
    let mut sock = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    sock.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf))
        .await
        .expect("the gateway kept a stalled connection open");
    // closed (EOF or reset), or answered with 408 and closed
    match n {
        Ok(0) | Err(_) => {}
        Ok(n) => assert!(
            buf[..n].starts_with(b"HTTP/1.1 408"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        ),
    }
    get_healthy(&s).await;
}
