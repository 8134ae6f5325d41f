//! Per-principal rate limits over HTTP (spec §4): each route class counts
//! on its own, per principal, with draft-6 headers on every answer and
//! §4's 429 bodies with `Retry-After`.

mod common;

use common::{TestServer, json, start};
use kiln_api::ApiConfig;
use kiln_api::rate::{RateRules, Rule};
use serde_json::json;

async fn server(rules: RateRules) -> TestServer {
    start(ApiConfig {
        rate_limits: rules,
        ..ApiConfig::default()
    })
    .await
}

fn only(f: impl FnOnce(&mut RateRules)) -> RateRules {
    let mut r = RateRules::off();
    f(&mut r);
    r
}

async fn exec_as(s: &TestServer, user: Option<&str>) -> reqwest::Response {
    let mut body = json!({"lang": "py", "code": "print(1)"});
    if let Some(u) = user {
        body["user_id"] = json!(u);
    }
    s.client
        .post(s.url("/v1/exec"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

fn header(r: &reqwest::Response, name: &str) -> Option<u64> {
    r.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn exec_allows_its_burst_per_user_then_answers_the_coded_429() {
    let s = server(only(|r| r.exec = Some(Rule::new(2, 60)))).await;
    for remaining in [1, 0] {
        let r = exec_as(&s, Some("alice")).await;
        assert_eq!(r.status(), 200);
        assert_eq!(header(&r, "ratelimit-limit"), Some(2));
        assert_eq!(header(&r, "ratelimit-remaining"), Some(remaining));
        assert!(header(&r, "ratelimit-reset").is_some_and(|s| (1..=60).contains(&s)));
    }
    let r = exec_as(&s, Some("alice")).await;
    assert_eq!(r.status(), 429);
    let retry = header(&r, "retry-after").unwrap();
    assert!((29..=30).contains(&retry), "{retry}");
    assert_eq!(header(&r, "ratelimit-remaining"), Some(0));
    assert_eq!(header(&r, "ratelimit-reset"), Some(retry));
    assert_eq!(
        json(r).await,
        json!({
            "error": "rate_limited",
            "message": format!("Too many CodeAPI execution requests. Please retry in {retry} seconds."),
            "retry_after_seconds": retry,
        })
    );
    assert_eq!(s.exec.call_count(), 2, "the refused run never started");
    // bob has his own bucket; identity-less callers share their address's
    assert_eq!(exec_as(&s, Some("bob")).await.status(), 200);
    assert_eq!(exec_as(&s, None).await.status(), 200);
    assert_eq!(exec_as(&s, None).await.status(), 200);
    assert_eq!(exec_as(&s, None).await.status(), 429);
}

#[tokio::test]
async fn each_file_route_class_has_its_own_limit_and_body() {
    let s = server(only(|r| {
        r.upload = Some(Rule::new(1, 300));
        r.download = Some(Rule::new(1, 60));
        r.fetch = Some(Rule::new(1, 60));
        r.delete = Some(Rule::new(1, 60));
        r.cancel = Some(Rule::new(1, 60));
    }))
    .await;
    let (sid, fid) = s
        .seed("local:user:alice", "a.txt", b"a", "text/plain")
        .await;
    let fid2 = s.seed_into(&sid, "b.txt", b"b", "text/plain").await;
    let get = |path: String| s.client.get(s.url(&path)).header("User-Id", "alice").send();
    let upload = || {
        let form = reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(b"x".to_vec()).file_name("x.txt"),
        );
        s.client
            .post(s.url("/v1/upload"))
            .header("User-Id", "alice")
            .multipart(form)
            .send()
    };
    let delete = |f: &kiln_core::Nanoid| {
        s.client
            .delete(s.url(&format!("/v1/files/{sid}/{f}")))
            .header("User-Id", "alice")
            .send()
    };

    let first = upload().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(header(&first, "ratelimit-limit"), Some(1));
    let r = upload().await.unwrap();
    assert_eq!(r.status(), 429);
    let n = header(&r, "retry-after").unwrap();
    assert_eq!(
        json(r).await,
        json!({"error": format!("Too many file uploads. Please retry in {n} seconds.")})
    );

    assert_eq!(
        get(format!("/v1/download/{sid}/{fid}"))
            .await
            .unwrap()
            .status(),
        200
    );
    let r = get(format!("/v1/download/{sid}/{fid}")).await.unwrap();
    assert_eq!(r.status(), 429);
    let n = header(&r, "retry-after").unwrap();
    assert_eq!(
        json(r).await,
        json!({"error": format!("Too many file downloads. Please retry in {n} seconds.")})
    );

    // listing and metadata share the list class
    assert_eq!(get(format!("/v1/files/{sid}")).await.unwrap().status(), 200);
    let r = get(format!("/v1/sessions/{sid}/objects/{fid}"))
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let n = header(&r, "retry-after").unwrap();
    assert_eq!(
        json(r).await,
        json!({"error": format!("Too many file list requests. Please retry in {n} seconds.")})
    );

    assert_eq!(delete(&fid).await.unwrap().status(), 200);
    let r = delete(&fid2).await.unwrap();
    assert_eq!(r.status(), 429);
    let n = header(&r, "retry-after").unwrap();
    assert_eq!(
        json(r).await,
        json!({"error": format!("Too many file delete requests. Please retry in {n} seconds.")})
    );

    let cancel = || {
        s.client
            .post(s.url(&format!("/v1/runs/{}/cancel", kiln_core::Nanoid::random())))
            .header("User-Id", "alice")
            .send()
    };
    assert_eq!(cancel().await.unwrap().status(), 404);
    let r = cancel().await.unwrap();
    assert_eq!(r.status(), 429);
    let n = header(&r, "retry-after").unwrap();
    assert_eq!(
        json(r).await,
        json!({"error": format!("Too many cancellation requests. Please retry in {n} seconds.")})
    );

    // another user is counted apart; health is never limited
    let r = s
        .client
        .get(s.url(&format!("/v1/download/{sid}/{fid2}")))
        .header("User-Id", "bob")
        .send()
        .await
        .unwrap();
    assert_ne!(r.status(), 429);
    for _ in 0..3 {
        assert_eq!(
            s.client
                .get(s.url("/v1/health"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
}

#[tokio::test]
async fn defaults_are_generous_enough_for_skill_priming() {
    // one skill: a batch upload, then a metadata probe per file before
    // every run, and downloads of every output
    let s = server(RateRules::default()).await;
    let (sid, fid) = s
        .seed("local:user:alice", "a.txt", b"a", "text/plain")
        .await;
    for _ in 0..200 {
        let r = s
            .client
            .get(s.url(&format!("/v1/sessions/{sid}/objects/{fid}")))
            .header("User-Id", "alice")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let r = exec_as(&s, Some("alice")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "ratelimit-limit"), Some(600));
}
