//! `POST /upload` and `POST /upload/batch` over real HTTP into a real store.

mod common;

use common::{TestServer, json, start};
use futures::TryStreamExt as _;
use kiln_api::ApiConfig;
use kiln_core::Nanoid;
use reqwest::multipart::{Form, Part};
use serde_json::json;

fn file(name: &str, bytes: &[u8]) -> Part {
    Part::bytes(bytes.to_vec()).file_name(name.to_owned())
}

async fn post_form(
    s: &TestServer,
    path: &str,
    user: Option<&str>,
    form: Form,
) -> reqwest::Response {
    let mut req = s.client.post(s.url(path)).multipart(form);
    if let Some(u) = user {
        req = req.header("User-Id", u);
    }
    req.send().await.unwrap()
}

async fn stored_bytes(s: &TestServer, sid: &Nanoid, fid: &Nanoid) -> Vec<u8> {
    let meta = s
        .store
        .object(sid, fid)
        .await
        .unwrap()
        .expect("object stored");
    let chunks: Vec<bytes::Bytes> = s
        .store
        .read(&meta)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    chunks.concat()
}

async fn session_key(s: &TestServer, sid: &Nanoid) -> String {
    s.store
        .session(sid)
        .await
        .unwrap()
        .expect("session exists")
        .key
        .as_str()
        .to_owned()
}

fn ids(body: &serde_json::Value) -> (Nanoid, Nanoid) {
    let sid = Nanoid::parse(body["storage_session_id"].as_str().unwrap()).unwrap();
    let fid = Nanoid::parse(body["files"][0]["fileId"].as_str().unwrap()).unwrap();
    (sid, fid)
}

#[tokio::test]
async fn g1_upload_with_entity_id_is_agent_scoped_and_returns_both_session_keys() {
    let s = start(ApiConfig::default()).await;
    let form = Form::new()
        .text("entity_id", "agent_9")
        .part("file", file("data.csv", b"a,b\n1,2\n"));
    let r = post_form(&s, "/v1/upload", Some("alice"), form).await;
    assert_eq!(r.status(), 200);
    let body = json(r).await;
    assert_eq!(body["message"], "success");
    assert_eq!(body["storage_session_id"], body["session_id"]);
    assert_eq!(body["files"][0]["filename"], "data.csv");
    let (sid, fid) = ids(&body);
    assert_eq!(session_key(&s, &sid).await, "local:agent:agent_9");
    assert_eq!(stored_bytes(&s, &sid, &fid).await, b"a,b\n1,2\n");
    let meta = s.store.object(&sid, &fid).await.unwrap().unwrap();
    assert_eq!(meta.content_type, "text/csv");
    assert!(!meta.read_only);
}

#[tokio::test]
async fn g1_entity_id_equal_to_the_caller_means_user_scope() {
    let s = start(ApiConfig::default()).await;
    let form = Form::new()
        .text("entity_id", "alice")
        .part("file", file("a.txt", b"x"));
    let body = json(post_form(&s, "/upload", Some("alice"), form).await).await;
    let (sid, _) = ids(&body);
    assert_eq!(session_key(&s, &sid).await, "local:user:alice");
}

#[tokio::test]
async fn g2_skill_upload_with_read_only_and_a_nested_name() {
    let s = start(ApiConfig::default()).await;
    let form = Form::new()
        .text("kind", "skill")
        .text("id", "skill_abc")
        .text("version", "3")
        .text("read_only", "true")
        .part(
            "file",
            file("pptx/editing.md", b"# edit\n")
                .mime_str("text/markdown")
                .unwrap(),
        );
    let r = post_form(&s, "/v1/upload", Some("alice"), form).await;
    assert_eq!(r.status(), 200);
    let body = json(r).await;
    assert_eq!(body["files"][0]["filename"], "pptx/editing.md");
    let (sid, fid) = ids(&body);
    assert_eq!(session_key(&s, &sid).await, "local:skill:skill_abc:v:3");
    let meta = s.store.object(&sid, &fid).await.unwrap().unwrap();
    assert!(meta.read_only);
    assert_eq!(meta.name, "pptx/editing.md");
    assert_eq!(meta.content_type, "text/markdown");
}

#[tokio::test]
async fn absent_kind_means_the_callers_user_scope_whatever_id_says() {
    let s = start(ApiConfig::default()).await;
    let form = Form::new().part("file", file("a.txt", b"x"));
    let body = json(post_form(&s, "/v1/upload", Some("alice"), form).await).await;
    assert_eq!(session_key(&s, &ids(&body).0).await, "local:user:alice");

    let form = Form::new()
        .text("kind", "user")
        .text("id", "bob")
        .part("file", file("a.txt", b"x"));
    let body = json(post_form(&s, "/v1/upload", Some("alice"), form).await).await;
    assert_eq!(session_key(&s, &ids(&body).0).await, "local:user:alice");

    // Without User-Id, kind=user&id= is the identity.
    let form = Form::new()
        .text("kind", "user")
        .text("id", "bob")
        .part("file", file("a.txt", b"x"));
    let body = json(post_form(&s, "/v1/upload", None, form).await).await;
    assert_eq!(session_key(&s, &ids(&body).0).await, "local:user:bob");

    let form = Form::new().part("file", file("a.txt", b"x"));
    let body = json(post_form(&s, "/v1/upload", None, form).await).await;
    assert_eq!(session_key(&s, &ids(&body).0).await, "local:user:anonymous");
}

#[tokio::test]
async fn zero_byte_files_are_stored() {
    let s = start(ApiConfig::default()).await;
    let form = Form::new().part("file", file("pkg/__init__.py", b""));
    let r = post_form(&s, "/v1/upload", Some("alice"), form).await;
    assert_eq!(r.status(), 200);
    let (sid, fid) = ids(&json(r).await);
    let meta = s.store.object(&sid, &fid).await.unwrap().unwrap();
    assert_eq!(meta.size, 0);
    assert!(stored_bytes(&s, &sid, &fid).await.is_empty());
}

#[tokio::test]
async fn traversal_absolute_and_backslash_names_are_rejected_and_nothing_is_stored() {
    let s = start(ApiConfig::default()).await;
    for name in ["../x", "/etc/passwd", "a\\b", "a/../../x", ""] {
        let form = Form::new().part("file", file(name, b"evil"));
        let r = post_form(&s, "/v1/upload", Some("alice"), form).await;
        assert_eq!(r.status(), 400, "{name:?}");
        let body = json(r).await;
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .starts_with("Invalid filename"),
            "{name:?}: {body}"
        );
    }
    assert_eq!(s.blob_count(), 0);
}

#[tokio::test]
async fn non_multipart_bodies_are_refused() {
    let s = start(ApiConfig::default()).await;
    for path in ["/v1/upload", "/v1/upload/batch"] {
        let r = s
            .client
            .post(s.url(path))
            .json(&json!({"file": "x"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        assert_eq!(
            json(r).await,
            json!({"error": "Invalid content type. Must be multipart/form-data."})
        );
    }
}

#[tokio::test]
async fn a_broken_multipart_body_is_400_and_leaves_nothing_stored() {
    let s = start(ApiConfig::default()).await;
    // One complete file part, then the body ends without a closing boundary.
    let body = "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\r\nhello\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"b.txt\"\r\n\r\nhal";
    for path in ["/v1/upload", "/v1/upload/batch"] {
        let r = s
            .client
            .post(s.url(path))
            .header("content-type", "multipart/form-data; boundary=XyZ")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{path}");
        assert!(json(r).await["error"].is_string());
    }
    let garbage = s
        .client
        .post(s.url("/v1/upload"))
        .header("content-type", "multipart/form-data; boundary=XyZ")
        .body("not multipart at all")
        .send()
        .await
        .unwrap();
    assert_eq!(garbage.status(), 400);
    assert_eq!(s.blob_count(), 0);
}

#[tokio::test]
async fn an_oversize_single_upload_is_413_and_nothing_is_stored() {
    let s = start(ApiConfig {
        max_upload_bytes: 1024,
        ..ApiConfig::default()
    })
    .await;
    let form = Form::new()
        .part("file", file("small.txt", b"fine"))
        .part("file", file("big.bin", &vec![7u8; 64 * 1024]));
    let r = post_form(&s, "/v1/upload", Some("alice"), form).await;
    assert_eq!(r.status(), 413);
    assert_eq!(json(r).await, json!({"error": "File size limit exceeded"}));
    assert_eq!(
        s.blob_count(),
        0,
        "the first file of the failed request was removed too"
    );
}

#[tokio::test]
async fn a_file_exactly_at_the_limit_is_accepted() {
    let s = start(ApiConfig {
        max_upload_bytes: 1024,
        ..ApiConfig::default()
    })
    .await;
    let form = Form::new().part("file", file("edge.bin", &[1u8; 1024]));
    let r = post_form(&s, "/v1/upload", Some("alice"), form).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn malformed_scope_fields_are_400() {
    let s = start(ApiConfig::default()).await;
    let cases = [
        (
            vec![("kind", "robot")],
            "kind must be one of: skill, agent, user",
        ),
        (
            vec![("kind", "skill"), ("id", "sk")],
            "version is required for kind skill",
        ),
        (
            vec![("kind", "agent"), ("id", "a/b")],
            "id must match ^[A-Za-z0-9_.:-]{1,128}$",
        ),
        (
            vec![("kind", "agent"), ("id", "a"), ("version", "1")],
            "version is only allowed for kind skill",
        ),
        (
            vec![("read_only", "perhaps")],
            "read_only must be true or false",
        ),
    ];
    for (fields, msg) in cases {
        let mut form = Form::new();
        for (k, v) in &fields {
            form = form.text(k.to_string(), v.to_string());
        }
        let form = form.part("file", file("a.txt", b"x"));
        let r = post_form(&s, "/v1/upload", Some("alice"), form).await;
        assert_eq!(r.status(), 400, "{fields:?}");
        assert_eq!(json(r).await["error"], msg, "{fields:?}");
    }
    assert_eq!(s.blob_count(), 0);
}

#[tokio::test]
async fn scope_fields_after_a_file_part_are_refused() {
    let s = start(ApiConfig::default()).await;
    let form = Form::new()
        .part("file", file("a.txt", b"x"))
        .text("kind", "agent");
    let r = post_form(&s, "/v1/upload", Some("alice"), form).await;
    assert_eq!(r.status(), 400);
    assert_eq!(s.blob_count(), 0);
}

#[tokio::test]
async fn require_identity_refuses_identity_less_uploads() {
    let s = start(ApiConfig {
        require_identity: true,
        ..ApiConfig::default()
    })
    .await;
    let r = post_form(
        &s,
        "/v1/upload",
        None,
        Form::new().part("file", file("a.txt", b"x")),
    )
    .await;
    assert_eq!(r.status(), 401);
    let r = post_form(
        &s,
        "/v1/upload",
        Some("alice"),
        Form::new().part("file", file("a.txt", b"x")),
    )
    .await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn batch_reports_partial_success_per_file() {
    let s = start(ApiConfig {
        max_upload_bytes: 16,
        ..ApiConfig::default()
    })
    .await;
    let form = Form::new()
        .text("kind", "agent")
        .text("id", "agent_7")
        .part("files", file("ok.txt", b"one"))
        .part("files", file("../bad.txt", b"two"))
        .part("files", file("big.txt", &[0u8; 100]))
        .part("files", file("dir/ok2.json", b"{}"));
    let r = post_form(&s, "/v1/upload/batch", Some("alice"), form).await;
    assert_eq!(r.status(), 200);
    let body = json(r).await;
    assert_eq!(body["message"], "partial_success");
    assert_eq!(body["succeeded"], 2);
    assert_eq!(body["failed"], 2);
    assert_eq!(body["storage_session_id"], body["session_id"]);
    assert!(body.get("filesLimitReached").is_none());
    let files = body["files"].as_array().unwrap();
    assert_eq!(files[0]["status"], "success");
    assert_eq!(files[0]["filename"], "ok.txt");
    assert_eq!(files[1]["status"], "error");
    assert_eq!(files[1]["filename"], "../bad.txt");
    assert_eq!(files[2]["error"], "File size limit exceeded");
    assert_eq!(files[3]["filename"], "dir/ok2.json");
    let sid = Nanoid::parse(body["storage_session_id"].as_str().unwrap()).unwrap();
    assert_eq!(session_key(&s, &sid).await, "local:agent:agent_7");
    let listed = s.store.list(&sid).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["dir/ok2.json", "ok.txt"]);
    let fid = Nanoid::parse(files[3]["fileId"].as_str().unwrap()).unwrap();
    assert_eq!(stored_bytes(&s, &sid, &fid).await, b"{}");
}

#[tokio::test]
async fn batch_where_every_file_fails_is_400_with_the_batch_shape() {
    let s = start(ApiConfig::default()).await;
    let form = Form::new()
        .part("files", file("/abs", b"x"))
        .part("files", file("..", b"y"));
    let r = post_form(&s, "/v1/upload/batch", Some("alice"), form).await;
    assert_eq!(r.status(), 400);
    let body = json(r).await;
    assert_eq!(body["message"], "error");
    assert_eq!(body["succeeded"], 0);
    assert_eq!(body["failed"], 2);
    assert_eq!(s.blob_count(), 0);
}

/// A session is made with its first stored file (one round-trip): a batch
/// whose first file is refused makes it with the next, under the scope the
/// fields gave.
#[tokio::test]
async fn a_batch_whose_first_file_is_refused_makes_its_session_with_the_next() {
    let s = start(ApiConfig {
        max_upload_bytes: 4,
        ..ApiConfig::default()
    })
    .await;
    let form = Form::new()
        .text("entity_id", "agent_3")
        .part("files", file("big.txt", b"too large"))
        .part("files", file("ok.txt", b"ok"));
    let body = json(post_form(&s, "/v1/upload/batch", Some("alice"), form).await).await;
    assert_eq!(body["message"], "partial_success", "{body}");
    let sid = Nanoid::parse(body["storage_session_id"].as_str().unwrap()).unwrap();
    assert_eq!(session_key(&s, &sid).await, "local:agent:agent_3");
    let listed = s.store.list(&sid).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "ok.txt");
    assert_eq!(s.blob_count(), 1);
}

/// A batch whose every file reached the store and was refused answers a
/// session id; that session exists, empty (it did when sessions were made
/// before their first file): listing it is `[]`, not a 404.
#[tokio::test]
async fn a_batch_whose_every_file_is_too_large_answers_a_session_that_lists_empty() {
    let s = start(ApiConfig {
        max_upload_bytes: 4,
        ..ApiConfig::default()
    })
    .await;
    let form = Form::new()
        .part("files", file("a.txt", b"too large"))
        .part("files", file("b.txt", b"also too large"));
    let body = json(post_form(&s, "/v1/upload/batch", Some("alice"), form).await).await;
    assert_eq!(body["failed"], 2, "{body}");
    let sid = body["storage_session_id"].as_str().unwrap();
    let r = s
        .client
        .get(s.url(&format!("/v1/files/{sid}")))
        .header("User-Id", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(json(r).await, json!([]));
    assert_eq!(s.blob_count(), 0);
}

#[tokio::test]
async fn batch_without_file_parts_is_400() {
    let s = start(ApiConfig::default()).await;
    let form = Form::new().text("kind", "user");
    let r = post_form(&s, "/v1/upload/batch", Some("alice"), form).await;
    assert_eq!(r.status(), 400);
    assert_eq!(json(r).await, json!({"error": "No files provided"}));
    let r = post_form(
        &s,
        "/v1/upload",
        Some("alice"),
        Form::new().text("kind", "user"),
    )
    .await;
    assert_eq!(r.status(), 400);
    assert_eq!(json(r).await, json!({"error": "No files provided"}));
}

#[tokio::test]
async fn batch_stops_at_the_file_limit_and_says_so() {
    let s = start(ApiConfig {
        max_batch_files: 2,
        ..ApiConfig::default()
    })
    .await;
    let form = Form::new()
        .part("files", file("a.txt", b"a"))
        .part("files", file("b.txt", b"b"))
        .part("files", file("c.txt", b"c"));
    let r = post_form(&s, "/v1/upload/batch", Some("alice"), form).await;
    assert_eq!(r.status(), 200);
    let body = json(r).await;
    assert_eq!(body["message"], "success");
    assert_eq!(body["succeeded"], 2);
    assert_eq!(body["filesLimitReached"], true);
    assert_eq!(body["maxFiles"], 2);
    assert_eq!(s.blob_count(), 2);
}

#[tokio::test]
async fn every_part_gets_its_own_id_in_one_session() {
    let s = start(ApiConfig::default()).await;
    let form = Form::new()
        .part("file", file("a.txt", b"a"))
        .part("file", file("a.txt", b"b"));
    let body = json(post_form(&s, "/v1/upload", Some("alice"), form).await).await;
    let files = body["files"].as_array().unwrap();
    assert_eq!(files.len(), 2);
    assert_ne!(files[0]["fileId"], files[1]["fileId"]);
    let sid = Nanoid::parse(body["storage_session_id"].as_str().unwrap()).unwrap();
    assert_eq!(s.store.list(&sid).await.unwrap().len(), 2);
}

/// A client that writes its whole body before reading (Node's `fetch` with a
/// `FormData` does) gets the 413, not a reset connection: the server reads
/// the rest of the refused body away before it answers.
#[tokio::test]
async fn an_oversize_upload_written_whole_before_reading_gets_the_413() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let s = start(ApiConfig {
        max_upload_bytes: 1024,
        ..ApiConfig::default()
    })
    .await;
    let boundary = "kilnboundary7";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big.bin\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    )
    .into_bytes();
    // larger than what loopback sockets buffer, so an unread rest resets
    body.extend(std::iter::repeat_n(b'x', 12 * 1024 * 1024));
    body.extend(format!("\r\n--{boundary}--\r\n").into_bytes());
    let addr = s.base.trim_start_matches("http://").to_owned();
    for _ in 0..3 {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST /v1/upload HTTP/1.1\r\nHost: {addr}\r\nUser-Id: alice\r\n\
             Content-Type: multipart/form-data; boundary={boundary}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        conn.write_all(&body)
            .await
            .expect("the server reads the whole body");
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer)
            .await
            .expect("the answer arrives");
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 413"), "{text}");
        assert!(
            text.ends_with("{\"error\":\"File size limit exceeded\"}"),
            "{text}"
        );
    }
    assert_eq!(s.blob_count(), 0);
}
