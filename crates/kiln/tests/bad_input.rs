//! Bad input gets a clear 4xx JSON error, never a 500, and stores nothing.

mod common;

use common::*;
use serde_json::{Value, json};

fn stored_blobs(s: &kiln::testing::TestServer) -> usize {
    fn count(d: &std::path::Path) -> usize {
        std::fs::read_dir(d)
            .map(|rd| {
                rd.flatten()
                    .map(|e| {
                        if e.path().is_dir() {
                            count(&e.path())
                        } else {
                            1
                        }
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
    count(&s.data_dir.path().join("store/blobs"))
}

async fn assert_json_4xx(r: reqwest::Response) -> Value {
    let st = r.status().as_u16();
    let body = r.text().await.unwrap();
    assert!((400..500).contains(&st), "status {st}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    assert!(v["error"].is_string(), "{v}");
    v
}

#[tokio::test]
async fn broken_and_wrongly_typed_json_is_a_400() {
    let s = server().await;
    let url = format!("{}/exec", s.v1());
    for body in [
        "{",
        "[]",
        "{\"lang\":\"py\"}",
        "{\"lang\":\"py\",\"code\":5}",
        "{\"lang\":\"py\",\"code\":\"x\",\"args\":[1]}",
    ] {
        let r = client()
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_json_4xx(r).await;
    }
    for t in [json!(-1), json!(0), json!("soon")] {
        let (st, v) = exec_raw(&s, json!({"lang":"py","code":"print(1)","timeout":t})).await;
        assert_eq!(st, 400);
        assert_eq!(
            v["error"],
            "timeout must be a positive number of milliseconds"
        );
    }
}

#[tokio::test]
async fn unknown_fields_are_ignored() {
    let s = server().await;
    let r = exec(&s, json!({"lang":"py","code":"print(1)","LIBRECHAT_CODE_API_KEY":"leak","codeSessionKey":"x","session_id":"whatever"})).await;
    assert_eq!(r["stdout"], "1\n");
}

#[tokio::test]
async fn traversal_and_odd_upload_names_are_refused_and_nothing_is_stored() {
    let s = server().await;
    for name in [
        "../x.txt",
        "/etc/passwd",
        "a\\b.txt",
        "a/../../b.txt",
        "a//b.txt",
        "x\u{202E}txt",
    ] {
        let (st, v) = upload(&s, "u", &[("kind", "user")], name, b"x".to_vec()).await;
        assert_eq!(st, 400, "{name}: {v}");
    }
    assert_eq!(stored_blobs(&s), 0);
}

#[tokio::test]
async fn non_multipart_and_broken_multipart_uploads_are_400() {
    let s = server().await;
    let url = format!("{}/upload", s.v1());
    let r = client()
        .post(&url)
        .json(&json!({"file":"x"}))
        .send()
        .await
        .unwrap();
    assert_json_4xx(r).await;
    let r = client()
        .post(&url)
        .header("content-type", "multipart/form-data; boundary=XYZ")
        .body("--XYZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\n\r\nunterminated")
        .send()
        .await
        .unwrap();
    assert_json_4xx(r).await;
    assert_eq!(stored_blobs(&s), 0);
}

#[tokio::test]
async fn oversized_uploads_are_413_and_leave_nothing() {
    let s = server_with(|c| c.max_upload_mb = 1).await;
    let (st, v) = upload(
        &s,
        "u",
        &[("kind", "user")],
        "big.bin.txt",
        vec![b'x'; 2 * 1024 * 1024],
    )
    .await;
    assert_eq!(st, 413, "{v}");
    assert_eq!(stored_blobs(&s), 0);
}

#[tokio::test]
async fn huge_json_bodies_are_rejected() {
    let s = server().await;
    let code = "#".repeat(60 * 1024 * 1024);
    let r = client()
        .post(format!("{}/exec", s.v1()))
        .json(&json!({"lang":"py","code":code}))
        .send()
        .await;
    match r {
        Ok(r) => assert_eq!(r.status().as_u16(), 413),
        Err(e) => panic!("server should answer 413, got {e}"),
    }
}

#[tokio::test]
async fn malformed_ids_in_paths_are_400() {
    let s = server().await;
    for path in [
        "download/short/V1StGXR8_Z5jdHi6B-myT",
        "download/V1StGXR8_Z5jdHi6B-myT/..%2f..%2fetc",
        "files/not-an-id",
        "sessions/V1StGXR8_Z5jdHi6B-myT/objects/x.y",
    ] {
        let r = client()
            .get(format!("{}/{path}", s.v1()))
            .send()
            .await
            .unwrap();
        let v = assert_json_4xx(r).await;
        assert_eq!(v["error"], "Bad request", "{path}");
    }
}
