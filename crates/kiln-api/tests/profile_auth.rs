//! The layers every request crosses: the execution-profile check and
//! response header, API-key auth, health, JSON fallbacks, request ids and
//! panics.

mod common;

use common::{json, start};
use kiln_api::{ApiConfig, AuthMode};
use serde_json::json;

const PROFILE_HDR: &str = "x-codeapi-execution-profile";

fn exec_body() -> serde_json::Value {
    json!({"lang": "py", "code": "print(1)"})
}

#[tokio::test]
async fn absent_or_default_expected_profile_is_accepted() {
    let s = start(ApiConfig::default()).await;
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .json(&exec_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[PROFILE_HDR], "default");
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .header("X-CodeAPI-Expected-Profile", "default")
        .json(&exec_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(s.exec.call_count(), 2);
}

#[tokio::test]
async fn unknown_expected_profile_is_400_with_the_coded_body() {
    let s = start(ApiConfig::default()).await;
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .header("X-CodeAPI-Expected-Profile", "turbo")
        .json(&exec_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.headers()[PROFILE_HDR], "default");
    assert_eq!(
        json(r).await,
        json!({
            "error": "invalid_execution_profile",
            "message": "Invalid execution profile: turbo",
            "expected_profile": "turbo",
            "actual_profile": "default",
        })
    );
    assert_eq!(s.exec.call_count(), 0);
}

#[tokio::test]
async fn duplicated_expected_profile_header_is_invalid() {
    let s = start(ApiConfig::default()).await;
    let r = s
        .client
        .get(s.url("/v1/health"))
        .header("X-CodeAPI-Expected-Profile", "default")
        .header("X-CodeAPI-Expected-Profile", "default")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(json(r).await["error"], "invalid_execution_profile");
}

#[tokio::test]
async fn stateful_expected_profile_is_served_and_still_needs_the_key() {
    let s = start(ApiConfig {
        auth: AuthMode::ApiKey,
        api_key: Some("k".into()),
        ..ApiConfig::default()
    })
    .await;
    // Kiln serves the stateful profile too (runtime sessions: tests/stateful.rs)
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .header("X-CodeAPI-Expected-Profile", "stateful")
        .json(&exec_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()[PROFILE_HDR], "stateful");
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .header("X-CodeAPI-Expected-Profile", "stateful")
        .header("X-API-Key", "k")
        .json(&exec_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[PROFILE_HDR], "stateful");
}

#[tokio::test]
async fn every_response_carries_the_profile_header_including_404_405_and_health() {
    let s = start(ApiConfig::default()).await;
    for (method, path, status) in [
        ("GET", "/v1/health", 200),
        ("GET", "/health", 200),
        ("GET", "/v1/nope", 404),
        ("POST", "/v1/exec/nope", 404),
        ("POST", "/v1/exec/programmatic", 400),
        ("GET", "/v1/exec", 405),
        ("GET", "/v1/download/bad/ids", 400),
    ] {
        let r = s
            .client
            .request(method.parse().unwrap(), s.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{method} {path}");
        assert_eq!(r.headers()[PROFILE_HDR], "default", "{method} {path}");
        assert!(
            r.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/json"),
            "{method} {path}"
        );
        let body = json(r).await;
        if status != 200 {
            assert!(body["error"].is_string(), "{method} {path}: {body}");
        }
    }
}

#[tokio::test]
async fn health_lists_languages_with_versions_and_reasons() {
    let s = start(ApiConfig::default()).await;
    let body = json(s.client.get(s.url("/v1/health")).send().await.unwrap()).await;
    assert_eq!(body["status"], "ok");
    assert_eq!(body["profile"], "default");
    assert_eq!(body["version"], "9.9.9-test");
    let langs = body["languages"].as_array().unwrap();
    assert_eq!(langs[0]["name"], "py");
    assert_eq!(langs[0]["version"], "Python 3.11.2");
    assert_eq!(langs[0]["available"], true);
    assert!(langs[0].get("reason").is_none());
    assert!(
        langs[0]["aliases"]
            .as_array()
            .unwrap()
            .contains(&json!("python"))
    );
    assert_eq!(langs[1]["name"], "js");
    assert_eq!(langs[1]["version"], serde_json::Value::Null);
    assert_eq!(langs[1]["available"], false);
    assert_eq!(langs[1]["reason"], "/usr/bin/node not found");
}

fn keyed() -> ApiConfig {
    ApiConfig {
        auth: AuthMode::ApiKey,
        api_key: Some("s3cret-key".into()),
        ..ApiConfig::default()
    }
}

#[tokio::test]
async fn api_key_is_accepted_from_x_api_key_and_bearer() {
    let s = start(keyed()).await;
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .header("X-API-Key", "s3cret-key")
        .json(&exec_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = s
        .client
        .post(s.url("/exec"))
        .header("Authorization", "Bearer s3cret-key")
        .json(&exec_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(s.exec.call_count(), 2);
}

#[tokio::test]
async fn wrong_or_missing_api_key_is_401_that_says_which_and_nothing_runs() {
    let s = start(keyed()).await;
    let wrong = s
        .client
        .post(s.url("/v1/exec"))
        .header("X-API-Key", "s3cret-kez")
        .json(&exec_body())
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let wrong_key = json!({"error": "Unauthorized: the API key sent does not match the server's"});
    assert_eq!(json(wrong).await, wrong_key);
    let bearer = s
        .client
        .get(s.url("/v1/files/V1StGXR8_Z5jdHi6B-myT"))
        .header("Authorization", "Bearer nope")
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), 401);
    assert_eq!(json(bearer).await, wrong_key);
    let missing = s.client.post(s.url("/v1/upload")).send().await.unwrap();
    assert_eq!(missing.status(), 401);
    assert_eq!(missing.headers()[PROFILE_HDR], "default");
    assert_eq!(
        json(missing).await,
        json!({"error": "Unauthorized: no API key was sent (X-API-Key or Authorization: Bearer)"})
    );
    assert_eq!(s.exec.call_count(), 0);
}

#[tokio::test]
async fn health_and_metrics_stay_open_with_api_key_auth() {
    let s = start(keyed()).await;
    assert_eq!(
        s.client
            .get(s.url("/v1/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        s.client
            .get(s.url("/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // No recorder configured: /metrics is a JSON 404, not a 401.
    let r = s.client.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn api_key_mode_without_a_key_refuses_everything() {
    let s = start(ApiConfig {
        auth: AuthMode::ApiKey,
        api_key: None,
        ..ApiConfig::default()
    })
    .await;
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .header("X-API-Key", "")
        .json(&exec_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn auth_none_leaves_every_route_open() {
    let s = start(ApiConfig::default()).await;
    let r = s
        .client
        .post(s.url("/exec"))
        .json(&exec_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn request_id_is_generated_or_echoed() {
    let s = start(ApiConfig::default()).await;
    let r = s.client.get(s.url("/v1/health")).send().await.unwrap();
    let generated = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert!(kiln_core::id::is_nanoid(&generated), "{generated}");
    let r = s
        .client
        .get(s.url("/v1/nothing-here"))
        .header("x-request-id", "client-chosen-42")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "client-chosen-42");
}

#[tokio::test]
async fn a_panicking_handler_answers_json_500() {
    let s = start(ApiConfig::default()).await;
    s.exec.set_reply(common::Reply::Panic);
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .json(&exec_body())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    assert_eq!(r.headers()[PROFILE_HDR], "default");
    assert_eq!(json(r).await, json!({"error": "Internal server error"}));
    // The server keeps serving.
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
