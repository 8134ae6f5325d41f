//! LibreChat's stateful profile over HTTP (spec §3, §13.4): the profile
//! header, `runtime_session_hint` → `rt_` id, the modes and their 400s, the
//! runtime session's workspace (its files staged, outputs stored into it),
//! `runtime_status`, and 409 `runtime_session_busy`.

mod common;

use std::time::Duration;

use common::{Reply, TestServer, json, start};
use kiln_api::{ApiConfig, RuntimeSessionMode};
use kiln_core::access::Caller;
use kiln_exec::sessions::FileSessions;
use kiln_exec::{InputFile, Outputs};
use serde_json::{Value, json};

const PROFILE_HDR: &str = "x-codeapi-execution-profile";
/// sha256("local\0alice\0v2:user:abc"), first 40 hex digits.
const ALICE_RT: &str = "rt_e266c61e3ba433332da8266576573e1d38c978fc";
const HINT: &str = "v2:user:abc";

async fn post(s: &TestServer, profile: Option<&str>, body: Value) -> reqwest::Response {
    let mut req = s.client.post(s.url("/v1/exec")).json(&body);
    if let Some(p) = profile {
        req = req.header("X-CodeAPI-Expected-Profile", p);
    }
    req.send().await.unwrap()
}

fn body(user: &str, hint: Option<&str>) -> Value {
    let mut b = json!({"lang": "py", "code": "print(1)", "user_id": user});
    if let Some(h) = hint {
        b["runtime_session_hint"] = json!(h);
    }
    b
}

fn workspace(user: &str, hint: &str) -> kiln_core::Nanoid {
    FileSessions::runtime_storage_id(&Caller::identified("local", user), hint).unwrap()
}

fn config(mode: RuntimeSessionMode) -> ApiConfig {
    ApiConfig {
        runtime_session_mode: mode,
        runtime_session_busy_wait: Duration::from_millis(200),
        ..ApiConfig::default()
    }
}

#[tokio::test]
async fn stateful_profile_is_served_and_named_on_the_response() {
    let s = start(ApiConfig::default()).await;
    let r = post(&s, Some("stateful"), body("alice", None)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[PROFILE_HDR], "stateful");
    let v = json(r).await;
    // affinity without a hint: a stateless one-shot
    assert!(v.get("runtime_session_id").is_none(), "{v}");
    assert!(matches!(s.exec.last().1.outputs, Outputs::NewSession));
    let r = post(&s, Some("default"), body("alice", Some(HINT))).await;
    assert_eq!(r.headers()[PROFILE_HDR], "default");
    // the default profile ignores a hint
    assert!(json(r).await.get("runtime_session_id").is_none());
    assert!(matches!(s.exec.last().1.outputs, Outputs::NewSession));
}

#[tokio::test]
async fn a_hint_names_the_callers_runtime_session_new_then_reused() {
    let s = start(config(RuntimeSessionMode::Affinity)).await;
    let v = json(post(&s, Some("stateful"), body("alice", Some(HINT))).await).await;
    assert_eq!(v["runtime_session_id"], ALICE_RT);
    assert_eq!(v["runtime_status"], "new");
    let ws = workspace("alice", HINT);
    match &s.exec.last().1.outputs {
        Outputs::Workspace(id) => assert_eq!(id, &ws),
        Outputs::NewSession => panic!("outputs must go into the runtime session"),
    }
    let v = json(post(&s, Some("stateful"), body("alice", Some(HINT))).await).await;
    assert_eq!(v["runtime_session_id"], ALICE_RT);
    assert_eq!(v["runtime_status"], "reused");
    // another user's session of the same hint is another session
    let v = json(post(&s, Some("stateful"), body("bob", Some(HINT))).await).await;
    assert_eq!(v["runtime_status"], "new");
    assert_ne!(v["runtime_session_id"], ALICE_RT);
    assert!(
        v["runtime_session_id"]
            .as_str()
            .is_some_and(|id| id.len() == 43 && id.starts_with("rt_"))
    );
    match &s.exec.last().1.outputs {
        Outputs::Workspace(id) => assert_eq!(id, &workspace("bob", HINT)),
        Outputs::NewSession => panic!("outputs must go into the runtime session"),
    }
}

#[tokio::test]
async fn the_sessions_files_are_staged_unless_the_request_sends_that_name() {
    let s = start(config(RuntimeSessionMode::Affinity)).await;
    let r = post(&s, Some("stateful"), body("alice", Some(HINT))).await;
    assert_eq!(r.status(), 200);
    let ws = workspace("alice", HINT);
    let kept = s
        .seed_into(&ws, "state.json", b"{}", "application/json")
        .await;
    s.seed_into(&ws, "notes.txt", b"old", "text/plain").await;
    let mut b = body("alice", Some(HINT));
    b["files"] = json!([{"name": "notes.txt", "content": "new"}]);
    assert_eq!(post(&s, Some("stateful"), b).await.status(), 200);
    let files = s.exec.last().1.files;
    let names: Vec<(&str, bool)> = files
        .iter()
        .map(|f| (f.name().as_str(), matches!(f, InputFile::Ref(_))))
        .collect();
    assert_eq!(names, [("state.json", true), ("notes.txt", false)]);
    match &files[0] {
        InputFile::Ref(r) => assert_eq!((&r.storage_session_id, &r.id), (&ws, &kept)),
        InputFile::Inline { .. } => unreachable!(),
    }
    // a reference to a replaced version of a session file stands for the
    // current one (LibreChat may still hold an older output's id)
    let mut b = body("alice", Some(HINT));
    b["files"] = json!([{"id": kiln_core::Nanoid::random().as_str(), "storage_session_id": ws.as_str(),
                         "name": "state.json", "kind": "user"}]);
    assert_eq!(post(&s, Some("stateful"), b).await.status(), 200);
    let files = s.exec.last().1.files;
    let refs: Vec<(&str, &kiln_core::Nanoid)> = files
        .iter()
        .filter_map(|f| match f {
            InputFile::Ref(r) => Some((r.name.as_str(), &r.id)),
            InputFile::Inline { .. } => None,
        })
        .collect();
    assert_eq!(refs.len(), 2, "{refs:?}");
    assert!(refs.contains(&("state.json", &kept)));
    // bob's session of the same hint sees none of alice's files
    post(&s, Some("stateful"), body("bob", Some(HINT))).await;
    assert!(s.exec.last().1.files.is_empty());
}

#[tokio::test]
async fn bad_hints_are_400_with_the_contracts_messages() {
    let s = start(config(RuntimeSessionMode::Affinity)).await;
    let long = "a".repeat(129);
    let cases = [
        (json!(5), "runtime_session_hint must be a string"),
        (
            json!(long),
            "runtime_session_hint must be at most 128 characters",
        ),
        (
            json!("a/b"),
            "runtime_session_hint may only contain letters, digits, \".\", \"_\", \":\", and \"-\"",
        ),
    ];
    for (hint, msg) in cases {
        let mut b = body("alice", None);
        b["runtime_session_hint"] = hint;
        let r = post(&s, Some("stateful"), b).await;
        assert_eq!(r.status(), 400);
        assert_eq!(json(r).await, json!({"error": msg}));
    }
    assert_eq!(s.exec.call_count(), 0);
}

#[tokio::test]
async fn strict_mode_requires_a_hint_and_stateless_mode_ignores_it() {
    let s = start(config(RuntimeSessionMode::Strict)).await;
    let r = post(&s, Some("stateful"), body("alice", None)).await;
    assert_eq!(r.status(), 400);
    assert_eq!(
        json(r).await,
        json!({"error": "runtime_session_hint is required in strict mode"})
    );
    let v = json(post(&s, Some("stateful"), body("alice", Some(HINT))).await).await;
    assert_eq!(v["runtime_session_id"], ALICE_RT);

    let s = start(config(RuntimeSessionMode::Stateless)).await;
    let mut b = body("alice", None);
    b["runtime_session_hint"] = json!("not/valid");
    let r = post(&s, Some("stateful"), b).await;
    assert_eq!(r.status(), 200);
    assert!(json(r).await.get("runtime_session_id").is_none());
    assert!(matches!(s.exec.last().1.outputs, Outputs::NewSession));
}

#[tokio::test]
async fn a_call_while_the_sessions_run_is_going_is_409_runtime_session_busy() {
    let s = start(config(RuntimeSessionMode::Affinity)).await;
    s.exec.set_reply(Reply::HangUntilCancelled);
    let mut b = body("alice", Some(HINT));
    b["detach"] = json!(true);
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .header("X-CodeAPI-Expected-Profile", "stateful")
        .header("Prefer", "respond-async")
        .json(&b)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let run_id = json(r).await["run_id"].as_str().unwrap().to_owned();
    tokio::time::timeout(Duration::from_secs(5), s.exec.started.notified())
        .await
        .expect("the run started");

    s.exec.set_reply(Reply::Canned);
    let r = post(&s, Some("stateful"), body("alice", Some(HINT))).await;
    assert_eq!(r.status(), 409);
    assert_eq!(
        json(r).await,
        json!({"error": "runtime_session_busy", "message": "Runtime session is busy"})
    );
    // another session is not held up
    let r = post(&s, Some("stateful"), body("alice", Some("other"))).await;
    assert_eq!(r.status(), 200);

    // the run's end gives the session its next turn
    let r = s
        .client
        .post(s.url(&format!("/v1/runs/{run_id}/cancel")))
        .header("User-Id", "alice")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let r = post(&s, Some("stateful"), body("alice", Some(HINT))).await;
        if r.status() == 200 {
            assert_eq!(json(r).await["runtime_status"], "reused");
            break;
        }
        assert_eq!(r.status(), 409);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the turn was never released"
        );
    }
}
