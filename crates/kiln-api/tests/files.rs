//! Reading stored sessions over HTTP: download, listing, object metadata,
//! delete, and the session authorization rules they share.

mod common;

use std::time::{Duration, Instant};

use common::{TestServer, json, start};
use kiln_api::ApiConfig;
use kiln_core::Nanoid;
use serde_json::json;

async fn get(s: &TestServer, path: &str, user: Option<&str>) -> reqwest::Response {
    let mut req = s.client.get(s.url(path));
    if let Some(u) = user {
        req = req.header("User-Id", u);
    }
    req.send().await.unwrap()
}

fn is_iso_utc(s: &str) -> bool {
    // 2026-01-02T03:04:05.678Z
    s.len() == 24 && s.ends_with('Z') && s.as_bytes()[10] == b'T'
}

#[tokio::test]
async fn download_streams_the_bytes_with_type_length_and_disposition() {
    let s = start(ApiConfig::default()).await;
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let (sid, fid) = s
        .seed(
            "local:user:alice",
            "reports/résumé 2024.pdf",
            &payload,
            "application/pdf",
        )
        .await;
    let r = get(
        &s,
        &format!("/v1/download/{sid}/{fid}?kind=user&id=alice"),
        None,
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/pdf");
    assert_eq!(
        r.headers()["content-length"],
        payload.len().to_string().as_str()
    );
    assert_eq!(
        r.headers()["content-disposition"],
        "attachment; filename=\"r_sum_ 2024.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9%202024.pdf"
    );
    assert!(r.headers()["etag"].to_str().unwrap().starts_with('"'));
    assert_eq!(r.headers()["x-codeapi-execution-profile"], "default");
    // a browser must not second-guess the stored type of a program's file
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    let body = r.bytes().await.unwrap();
    assert_eq!(body.as_ref(), payload.as_slice());
}

#[tokio::test]
async fn download_of_an_unknown_session_is_404_at_once() {
    let s = start(ApiConfig::default()).await;
    let started = Instant::now();
    let r = get(
        &s,
        &format!("/v1/download/{}/{}", Nanoid::random(), Nanoid::random()),
        None,
    )
    .await;
    assert_eq!(r.status(), 404);
    assert_eq!(json(r).await, json!({"error": "File not found"}));
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn download_with_malformed_ids_is_400() {
    let s = start(ApiConfig::default()).await;
    let good = Nanoid::random();
    for path in [
        format!("/v1/download/short/{good}"),
        format!("/v1/download/{good}/has.dot.in.it.aaaaaaaa"),
        format!("/v1/download/{good}/{good}x"),
        format!("/download/%2E%2E%2Fetc%2Fpasswd%2Faaaa/{good}"),
    ] {
        let r = get(&s, &path, None).await;
        assert_eq!(r.status(), 400, "{path}");
        assert_eq!(json(r).await, json!({"error": "Bad request"}), "{path}");
    }
}

#[tokio::test]
async fn download_of_a_missing_object_in_a_known_session_is_404_at_once_with_details() {
    // outputs are stored before /exec answers: nothing to wait for
    let s = start(ApiConfig::default()).await;
    let (sid, _) = s
        .seed("local:user:alice", "first.txt", b"1", "text/plain")
        .await;
    let started = Instant::now();
    let r = get(
        &s,
        &format!("/v1/download/{sid}/{}", Nanoid::random()),
        None,
    )
    .await;
    let waited = started.elapsed();
    assert_eq!(r.status(), 404);
    assert_eq!(
        json(r).await,
        json!({"error": "File not found", "details": "The file may have expired or does not exist"})
    );
    assert!(waited < Duration::from_millis(400), "{waited:?}");
}

#[tokio::test]
async fn user_files_are_not_readable_by_another_user() {
    let s = start(ApiConfig::default()).await;
    let (sid, fid) = s
        .seed("local:user:alice", "a.txt", b"secret", "text/plain")
        .await;
    let path = format!("/v1/download/{sid}/{fid}");

    let r = get(&s, &format!("{path}?kind=user&id=bob"), None).await;
    assert_eq!(r.status(), 403);
    assert_eq!(json(r).await, json!({"error": "Unauthorized"}));
    // User-Id wins over the query id.
    assert_eq!(
        get(&s, &format!("{path}?kind=user&id=alice"), Some("bob"))
            .await
            .status(),
        403
    );
    // Identified caller, no claim: only its own user sessions.
    assert_eq!(get(&s, &path, Some("bob")).await.status(), 403);

    assert_eq!(
        get(&s, &format!("{path}?kind=user&id=alice"), None)
            .await
            .status(),
        200
    );
    assert_eq!(get(&s, &path, Some("alice")).await.status(), 200);
    // Identity-less, no claim: the ids are the capability (G1 downloads).
    assert_eq!(get(&s, &path, None).await.status(), 200);
}

#[tokio::test]
async fn agent_files_are_readable_by_every_user_of_the_tenant() {
    let s = start(ApiConfig::default()).await;
    let (sid, fid) = s
        .seed("local:agent:agent_1", "kb.md", b"# kb", "text/markdown")
        .await;
    let path = format!("/v1/download/{sid}/{fid}");
    assert_eq!(
        get(&s, &format!("{path}?kind=agent&id=agent_1"), Some("bob"))
            .await
            .status(),
        200
    );
    assert_eq!(
        get(&s, &format!("{path}?kind=agent&id=agent_1"), Some("carol"))
            .await
            .status(),
        200
    );
    assert_eq!(get(&s, &path, Some("bob")).await.status(), 200);
    assert_eq!(
        get(&s, &format!("{path}?entity_id=agent_1"), Some("bob"))
            .await
            .status(),
        200
    );
    assert_eq!(
        get(&s, &format!("{path}?kind=agent&id=agent_2"), Some("bob"))
            .await
            .status(),
        403
    );
    assert_eq!(
        get(&s, &format!("{path}?kind=user&id=bob"), None)
            .await
            .status(),
        403
    );
}

#[tokio::test]
async fn skill_files_need_the_matching_version() {
    let s = start(ApiConfig::default()).await;
    let (sid, fid) = s
        .seed("local:skill:sk:v:3", "SKILL.md", b"s", "text/markdown")
        .await;
    let path = format!("/v1/download/{sid}/{fid}");
    assert_eq!(
        get(
            &s,
            &format!("{path}?kind=skill&id=sk&version=3"),
            Some("bob")
        )
        .await
        .status(),
        200
    );
    assert_eq!(
        get(
            &s,
            &format!("{path}?kind=skill&id=sk&version=4"),
            Some("bob")
        )
        .await
        .status(),
        403
    );
    let r = get(&s, &format!("{path}?kind=skill&id=sk"), Some("bob")).await;
    assert_eq!(r.status(), 400);
    assert_eq!(json(r).await["error"], "version is required for kind skill");
    let r = get(&s, &format!("{path}?kind=robot&id=x"), Some("bob")).await;
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn require_identity_turns_unclaimed_identity_less_reads_into_401() {
    let s = start(ApiConfig {
        require_identity: true,
        ..ApiConfig::default()
    })
    .await;
    let (sid, fid) = s
        .seed("local:user:alice", "a.txt", b"x", "text/plain")
        .await;
    let path = format!("/v1/download/{sid}/{fid}");
    let r = get(&s, &path, None).await;
    assert_eq!(r.status(), 401);
    assert_eq!(get(&s, &path, Some("alice")).await.status(), 200);
}

#[tokio::test]
async fn files_listing_has_every_detail_shape() {
    let s = start(ApiConfig::default()).await;
    let (sid, fid) = s
        .seed(
            "local:user:alice",
            "out/data.tar.gz",
            b"12345",
            "application/gzip",
        )
        .await;
    let base = format!("/v1/files/{sid}?kind=user&id=alice");

    let simple = json(get(&s, &base, None).await).await;
    assert_eq!(simple, json!([format!("{sid}/{fid}.gz")]));
    let explicit = json(get(&s, &format!("{base}&detail=simple"), None).await).await;
    assert_eq!(explicit, simple);

    let summary = json(get(&s, &format!("{base}&detail=summary"), None).await).await;
    let e = &summary[0];
    assert_eq!(e["name"], format!("{sid}/{fid}.gz"));
    assert_eq!(e["size"], 5);
    assert!(is_iso_utc(e["lastModified"].as_str().unwrap()), "{e}");
    assert_eq!(e["etag"].as_str().unwrap().len(), 64);
    assert_eq!(e.as_object().unwrap().len(), 4);

    let full = json(get(&s, &format!("{base}&detail=full"), None).await).await;
    let e = &full[0];
    assert_eq!(e["id"], fid.as_str(), "community clients read the id");
    assert_eq!(e["name"], format!("{sid}/{fid}.gz"));
    assert_eq!(e["metadata"]["original-filename"], "out/data.tar.gz");
    assert_eq!(e["metadata"]["original-filename-encoded"], "none");
    assert_eq!(e["metadata"]["content-type"], "application/gzip");
    assert_eq!(e["metadata"]["read-only"], "false");
    assert_eq!(e["contentType"], "application/gzip");
    assert!(e["versionId"].is_string());
    assert!(is_iso_utc(e["lastModified"].as_str().unwrap()));

    let normalized = json(get(&s, &format!("{base}&detail=normalized"), None).await).await;
    let e = &normalized[0];
    assert_eq!(
        *e,
        json!({
            "id": fid.as_str(),
            "name": "out/data.tar.gz",
            "storage_session_id": sid.as_str(),
            "size": 5,
            "contentType": "application/gzip",
            "lastModified": e["lastModified"],
        })
    );

    let r = get(&s, &format!("{base}&detail=everything"), None).await;
    assert_eq!(r.status(), 400);
    let r = get(&s, &format!("/v1/files/{}", Nanoid::random()), None).await;
    assert_eq!(r.status(), 404);
    let r = get(&s, "/v1/files/not-an-id", None).await;
    assert_eq!(r.status(), 400);
    let r = get(&s, &format!("/v1/files/{sid}?kind=user&id=bob"), None).await;
    assert_eq!(r.status(), 403);
}

#[tokio::test]
async fn object_metadata_shape_and_404() {
    let s = start(ApiConfig::default()).await;
    let (sid, fid) = s
        .seed("local:agent:ag", "docs/Guide.MD", b"hello", "text/markdown")
        .await;
    let r = get(
        &s,
        &format!("/v1/sessions/{sid}/objects/{fid}?kind=agent&id=ag"),
        Some("bob"),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v = json(r).await;
    assert_eq!(v["name"], format!("{sid}/{fid}.MD"));
    assert_eq!(v["originalFilename"], "docs/Guide.MD");
    assert_eq!(v["size"], 5);
    assert_eq!(v["contentType"], "text/markdown");
    assert_eq!(v["readOnly"], false);
    assert!(v["version"].is_string());
    assert_eq!(v["etag"].as_str().unwrap().len(), 64);
    assert!(is_iso_utc(v["lastModified"].as_str().unwrap()));

    // Pre-Phase-C LibreChat probes without query parameters.
    assert_eq!(
        get(&s, &format!("/sessions/{sid}/objects/{fid}"), None)
            .await
            .status(),
        200
    );

    let r = get(
        &s,
        &format!("/v1/sessions/{sid}/objects/{}", Nanoid::random()),
        None,
    )
    .await;
    assert_eq!(r.status(), 404);
    assert_eq!(json(r).await, json!({"error": "File not found"}));
}

#[tokio::test]
async fn delete_works_on_both_routes_then_404s() {
    let s = start(ApiConfig::default()).await;
    let (sid, f1) = s
        .seed("local:user:alice", "a.txt", b"a", "text/plain")
        .await;
    let f2 = s.seed_into(&sid, "b.txt", b"b", "text/plain").await;

    let r = s
        .client
        .delete(s.url(&format!("/v1/files/{sid}/{f1}?kind=user&id=alice")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        json(r).await,
        json!({"message": "File deleted successfully", "session_id": sid.as_str(), "fileId": f1.as_str()})
    );
    let r = s
        .client
        .delete(s.url(&format!("/v1/sessions/{sid}/objects/{f2}")))
        .header("User-Id", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(s.store.object(&sid, &f1).await.unwrap().is_none());
    assert!(s.store.object(&sid, &f2).await.unwrap().is_none());

    for path in [
        format!("/v1/files/{sid}/{f1}"),
        format!("/v1/sessions/{sid}/objects/{f2}"),
    ] {
        let r = s
            .client
            .delete(s.url(&path))
            .header("User-Id", "alice")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
        assert_eq!(json(r).await, json!({"error": "File not found"}));
    }
    assert_eq!(s.blob_count(), 0);
}

#[tokio::test]
async fn delete_of_another_users_file_is_403_and_keeps_it() {
    let s = start(ApiConfig::default()).await;
    let (sid, fid) = s
        .seed("local:user:alice", "a.txt", b"a", "text/plain")
        .await;
    let r = s
        .client
        .delete(s.url(&format!("/v1/files/{sid}/{fid}")))
        .header("User-Id", "bob")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(s.store.object(&sid, &fid).await.unwrap().is_some());
}

#[tokio::test]
async fn upload_then_download_round_trip_with_g1_shapes() {
    let s = start(ApiConfig::default()).await;
    let form = reqwest::multipart::Form::new()
        .text("entity_id", "agent_x")
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"col\n1\n".to_vec()).file_name("t.csv"),
        );
    let body = json(
        s.client
            .post(s.url("/v1/upload"))
            .header("User-Id", "alice")
            .multipart(form)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let sid = body["session_id"].as_str().unwrap();
    let fid = body["files"][0]["fileId"].as_str().unwrap();
    let r = get(
        &s,
        &format!("/v1/download/{sid}/{fid}?entity_id=agent_x"),
        None,
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/csv");
    assert_eq!(r.bytes().await.unwrap().as_ref(), b"col\n1\n");
    // G1 freshness probe.
    let listing = json(get(&s, &format!("/v1/files/{sid}?detail=summary"), None).await).await;
    assert!(
        listing[0]["name"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{sid}/{fid}"))
    );
}
