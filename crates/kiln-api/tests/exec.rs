//! `POST /exec`: request parsing for every client generation (checked on
//! what the executor double received), validation envelopes, error
//! mapping, the response shape, shutdown and client-disconnect cancellation.

mod common;

use std::time::Duration;

use common::{Reply, TestServer, json, start};
use kiln_api::ApiConfig;
use kiln_core::Kind;
use kiln_exec::{ExecError, InputFile, InputRef};
use serde_json::{Value, json};

const ID1: &str = "V1StGXR8_Z5jdHi6B-myT";
const ID2: &str = "abcdefghijklmnopqrstu";
const ID3: &str = "ABCDEFGHIJKLMNOPQRSTU";
const ID4: &str = "0123456789_-abcdefghi";

async fn post(s: &TestServer, body: &Value) -> reqwest::Response {
    s.client
        .post(s.url("/v1/exec"))
        .json(body)
        .send()
        .await
        .unwrap()
}

fn as_ref(f: &InputFile) -> &InputRef {
    match f {
        InputFile::Ref(r) => r,
        InputFile::Inline { .. } => panic!("expected a reference, got {f:?}"),
    }
}

#[tokio::test]
async fn g2_and_g3_references_reach_the_executor_intact() {
    let s = start(ApiConfig::default()).await;
    let body = json!({
        "lang": "python",
        "code": "print('hi')",
        "args": ["--x", "y z"],
        "timeout": 5000,
        "user_id": "alice",
        "files": [
            {"id": ID1, "resource_id": "alice", "storage_session_id": ID2, "name": "data/in.csv", "kind": "user"},
            {"id": ID3, "resource_id": "agent_abc", "storage_session_id": ID4, "name": "kb.md", "kind": "agent"},
            {"id": ID2, "resource_id": "507f1f77bcf86cd799439011", "storage_session_id": ID1,
             "name": "pptx/SKILL.md", "kind": "skill", "version": 3},
        ],
    });
    let r = post(&s, &body).await;
    assert_eq!(r.status(), 200);
    let (principal, req) = s.exec.last();
    assert_eq!(principal.tenant, "local");
    assert_eq!(principal.user_id, "alice");
    assert_eq!(req.lang.name(), "py");
    assert_eq!(req.code, "print('hi')");
    assert_eq!(req.args, ["--x", "y z"]);
    assert_eq!(req.timeout_ms, Some(5000));
    assert_eq!(req.files.len(), 3);

    let user = as_ref(&req.files[0]);
    assert_eq!(
        (user.id.as_str(), user.storage_session_id.as_str()),
        (ID1, ID2)
    );
    assert_eq!(user.name.as_str(), "data/in.csv");
    assert_eq!(user.kind, Some(Kind::User));
    assert_eq!(user.resource_id.as_deref(), Some("alice"));
    assert_eq!(user.version, None);

    let agent = as_ref(&req.files[1]);
    assert_eq!(agent.kind, Some(Kind::Agent));
    assert_eq!(agent.resource_id.as_deref(), Some("agent_abc"));

    let skill = as_ref(&req.files[2]);
    assert_eq!(skill.kind, Some(Kind::Skill));
    assert_eq!(skill.version.as_deref(), Some("3"));
    assert_eq!(skill.name.as_str(), "pptx/SKILL.md");
}

#[tokio::test]
async fn g1_references_map_session_id_and_claim_only_their_entity() {
    let s = start(ApiConfig::default()).await;
    let body = json!({
        "lang": "py",
        "code": "",
        "user_id": "alice",
        "files": [
            {"id": ID1, "session_id": ID2, "name": "a.txt"},
            {"id": ID3, "session_id": ID4, "name": "b.txt", "entity_id": "agent_9"},
            {"id": ID2, "session_id": ID1, "name": "c.txt", "entity_id": "alice"},
        ],
    });
    assert_eq!(post(&s, &body).await.status(), 200);
    let (_, req) = s.exec.last();
    let plain = as_ref(&req.files[0]);
    assert_eq!(plain.storage_session_id.as_str(), ID2);
    assert_eq!(plain.kind, None);
    assert!(plain.claim().is_none(), "a bare G1 ref claims nothing");

    let agent = as_ref(&req.files[1]);
    assert_eq!(agent.storage_session_id.as_str(), ID4);
    assert_eq!(agent.kind, None);
    assert_eq!(agent.entity_id.as_deref(), Some("agent_9"));

    let own = as_ref(&req.files[2]);
    assert_eq!(own.entity_id.as_deref(), Some("alice"));
}

#[tokio::test]
async fn a_top_level_entity_id_claims_for_refs_that_claim_nothing() {
    let s = start(ApiConfig::default()).await;
    let body = json!({
        "lang": "py",
        "code": "",
        "entity_id": "agent_7",
        "files": [
            {"id": ID1, "session_id": ID2, "name": "a.txt"},
            {"id": ID3, "storage_session_id": ID4, "name": "b.txt"},
            {"id": ID2, "session_id": ID1, "name": "c.txt", "entity_id": "agent_8"},
            {"id": ID4, "storage_session_id": ID3, "name": "d.txt", "kind": "user"},
        ],
    });
    assert_eq!(post(&s, &body).await.status(), 200);
    let (_, req) = s.exec.last();
    let entities: Vec<Option<&str>> = req
        .files
        .iter()
        .map(|f| as_ref(f).entity_id.as_deref())
        .collect();
    assert_eq!(
        entities,
        [Some("agent_7"), Some("agent_7"), Some("agent_8"), None]
    );
    // with the caller's own user scope beside the entity
    let kinds: Vec<Option<Kind>> = req.files.iter().map(|f| as_ref(f).kind).collect();
    assert_eq!(
        kinds,
        [Some(Kind::User), Some(Kind::User), None, Some(Kind::User)]
    );
    let bad = json!({"lang": "py", "code": "", "entity_id": "a b"});
    let r = post(&s, &bad).await;
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn inline_files_are_decoded() {
    let s = start(ApiConfig::default()).await;
    let body = json!({
        "lang": "bash", "code": "cat a b c",
        "files": [
            {"name": "a", "content": "plain ü"},
            {"name": "dir/b", "content": "aGVsbG8=", "encoding": "base64"},
            {"name": "c", "content": "00ff", "encoding": "hex"},
        ],
    });
    assert_eq!(post(&s, &body).await.status(), 200);
    let (_, req) = s.exec.last();
    let contents: Vec<(String, Vec<u8>)> = req
        .files
        .iter()
        .map(|f| match f {
            InputFile::Inline { name, content } => (name.as_str().to_owned(), content.clone()),
            InputFile::Ref(_) => panic!("expected inline"),
        })
        .collect();
    assert_eq!(
        contents,
        [
            ("a".to_owned(), "plain ü".as_bytes().to_vec()),
            ("dir/b".to_owned(), b"hello".to_vec()),
            ("c".to_owned(), vec![0x00, 0xff]),
        ]
    );
    let bad = json!({"lang": "bash", "code": "", "files": [{"name": "a", "content": "!!", "encoding": "base64"}]});
    assert_eq!(post(&s, &bad).await.status(), 400);
}

#[tokio::test]
async fn identity_comes_from_user_id_header_then_body_then_anonymous() {
    let s = start(ApiConfig::default()).await;
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .header("User-Id", "hdr-user")
        .json(&json!({"lang": "py", "code": "", "user_id": "body-user"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(s.exec.last().0.user_id, "hdr-user");
    post(
        &s,
        &json!({"lang": "py", "code": "", "user_id": "body-user"}),
    )
    .await;
    assert_eq!(s.exec.last().0.user_id, "body-user");
    post(&s, &json!({"lang": "py", "code": ""})).await;
    assert_eq!(s.exec.last().0.user_id, "anonymous");
}

#[tokio::test]
async fn require_identity_refuses_identity_less_exec() {
    let s = start(ApiConfig {
        require_identity: true,
        ..ApiConfig::default()
    })
    .await;
    let r = post(&s, &json!({"lang": "py", "code": ""})).await;
    assert_eq!(r.status(), 401);
    assert_eq!(s.exec.call_count(), 0);
    let r = post(&s, &json!({"lang": "py", "code": "", "user_id": "u1"})).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn unsupported_language_is_400() {
    let s = start(ApiConfig::default()).await;
    let r = post(&s, &json!({"lang": "cobol", "code": "x"})).await;
    assert_eq!(r.status(), 400);
    assert_eq!(
        json(r).await,
        json!({"error": "Unsupported language: cobol"})
    );
    assert_eq!(s.exec.call_count(), 0);
}

#[tokio::test]
async fn timeout_must_be_a_positive_number() {
    let s = start(ApiConfig::default()).await;
    for t in [json!(0), json!(-1), json!("5000"), json!([1]), json!(false)] {
        let r = post(&s, &json!({"lang": "py", "code": "", "timeout": t})).await;
        assert_eq!(r.status(), 400, "{t}");
        assert_eq!(
            json(r).await,
            json!({"error": "timeout must be a positive number of milliseconds"}),
            "{t}"
        );
    }
    post(&s, &json!({"lang": "py", "code": "", "timeout": null})).await;
    assert_eq!(s.exec.last().1.timeout_ms, None);
}

#[tokio::test]
async fn code_and_args_are_type_checked() {
    let s = start(ApiConfig::default()).await;
    let r = post(&s, &json!({"lang": "py"})).await;
    assert_eq!(r.status(), 400);
    let r = post(&s, &json!({"lang": "py", "code": 42})).await;
    assert_eq!(r.status(), 400);
    let r = post(&s, &json!({"lang": "py", "code": "", "args": ["ok", 1]})).await;
    assert_eq!(
        json(r).await,
        json!({"error": "args must be an array of strings"})
    );
    assert_eq!(s.exec.call_count(), 0);
}

#[tokio::test]
async fn malformed_reference_ids_are_400_bad_request() {
    let s = start(ApiConfig::default()).await;
    for file in [
        json!({"id": "short", "storage_session_id": ID2, "name": "a", "kind": "user"}),
        json!({"id": ID1, "storage_session_id": "not/a/nanoid/at/all!!", "name": "a", "kind": "user"}),
        json!({"id": ID1, "session_id": "x", "name": "a"}),
        json!({"id": 12, "storage_session_id": ID2, "name": "a"}),
    ] {
        let r = post(&s, &json!({"lang": "py", "code": "", "files": [file]})).await;
        assert_eq!(r.status(), 400, "{file}");
        assert_eq!(json(r).await, json!({"error": "Bad request"}), "{file}");
    }
    assert_eq!(s.exec.call_count(), 0);
}

#[tokio::test]
async fn reference_fields_are_validated_with_indexed_messages() {
    let s = start(ApiConfig::default()).await;
    let ok = json!({"id": ID1, "storage_session_id": ID2, "name": "a.txt", "kind": "user"});
    let cases = [
        (
            json!({"kind": "robot"}),
            "files[1].kind must be one of: skill, agent, user",
        ),
        (
            json!({"kind": "agent"}),
            "files[1].resource_id is required for kind agent",
        ),
        (
            json!({"kind": "agent", "resource_id": "a b"}),
            "files[1].resource_id must match ^[A-Za-z0-9_.:-]{1,128}$",
        ),
        (
            json!({"kind": "skill", "resource_id": "s"}),
            "files[1].version is required for kind skill",
        ),
        (
            json!({"kind": "user", "version": 1}),
            "files[1].version is only allowed for kind skill",
        ),
        (
            json!({"kind": "skill", "resource_id": "s", "version": -1}),
            "files[1].version must be a non-negative integer",
        ),
    ];
    for (patch, msg) in cases {
        let mut f = json!({"id": ID3, "storage_session_id": ID4, "name": "b.txt"});
        for (k, v) in patch.as_object().unwrap() {
            f[k] = v.clone();
        }
        let r = post(&s, &json!({"lang": "py", "code": "", "files": [ok, f]})).await;
        assert_eq!(r.status(), 400, "{msg}");
        assert_eq!(json(r).await["error"], msg);
    }
    for name in ["../x", "/etc/passwd", "a\\b", "a//b", ""] {
        let f = json!({"id": ID3, "storage_session_id": ID4, "name": name, "kind": "user"});
        let r = post(&s, &json!({"lang": "py", "code": "", "files": [f]})).await;
        assert_eq!(r.status(), 400, "{name:?}");
    }
    let r = post(&s, &json!({"lang": "py", "code": "", "files": {"a": 1}})).await;
    assert_eq!(json(r).await, json!({"error": "files must be an array"}));
    assert_eq!(s.exec.call_count(), 0);
}

#[tokio::test]
async fn unknown_fields_are_ignored() {
    let s = start(ApiConfig::default()).await;
    let body = json!({
        "lang": "js", "code": "1",
        "LIBRECHAT_CODE_API_KEY": "sk-should-never-matter",
        "session_id": "whatever-the-client-threads",
        "runtime_session_hint": "v2:user:abc",
        "codeSessionKey": {"nested": [1, 2]},
        "shell_output_filter": "rtk",
        "files": [{"id": ID1, "storage_session_id": ID2, "name": "a", "kind": "user", "extra": true}],
    });
    let r = post(&s, &body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(s.exec.last().1.lang.name(), "js");
}

#[tokio::test]
async fn broken_json_wrong_type_and_non_objects_are_4xx_json() {
    let s = start(ApiConfig::default()).await;
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .header("content-type", "application/json")
        .body("{\"lang\": \"py\", \"code\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(json(r).await, json!({"error": "Invalid JSON body"}));
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    assert!(json(r).await["error"].is_string());
    let r = post(&s, &json!(["lang", "py"])).await;
    assert_eq!(r.status(), 400);
    // No content type at all is tolerated.
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .body(r#"{"lang":"py","code":"1"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn bodies_over_the_json_limit_are_413() {
    let s = start(ApiConfig {
        max_json_bytes: 1024,
        ..ApiConfig::default()
    })
    .await;
    let r = post(&s, &json!({"lang": "py", "code": "x".repeat(4096)})).await;
    assert_eq!(r.status(), 413);
    assert_eq!(json(r).await, json!({"error": "Request body too large"}));
    // Streamed without Content-Length: stopped at the limit while reading.
    let chunks: Vec<Result<String, std::io::Error>> =
        (0..64).map(|_| Ok("x".repeat(100))).collect();
    let r = s
        .client
        .post(s.url("/v1/exec"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(s.exec.call_count(), 0);
}

#[tokio::test]
async fn exec_errors_map_to_their_envelopes() {
    let s = start(ApiConfig::default()).await;
    type Case = (fn() -> ExecError, u16, Value);
    let cases: [Case; 6] = [
        (
            || ExecError::BadRequest("files collide at a.txt".into()),
            400,
            json!({"error": "files collide at a.txt"}),
        ),
        (
            || ExecError::Unauthorized,
            403,
            json!({"error": "Unauthorized file reference"}),
        ),
        (
            || ExecError::SandboxSetup("cgroup gone".into()),
            503,
            json!({"error": "sandbox_setup_failed", "message": "Sandbox setup failed"}),
        ),
        (
            || ExecError::SandboxFailed("reaper died".into()),
            502,
            json!({"error": "sandbox_execution_failed", "message": "Sandbox execution failed"}),
        ),
        (
            || ExecError::ShuttingDown,
            503,
            json!({"error": "Service is shutting down"}),
        ),
        (
            || ExecError::Storage("disk on fire".into()),
            500,
            json!({"error": "Internal server error"}),
        ),
    ];
    for (make, status, body) in cases {
        s.exec.set_reply(Reply::Fail(make));
        let r = post(&s, &json!({"lang": "py", "code": ""})).await;
        assert_eq!(r.status(), status, "{body}");
        assert_eq!(r.headers()["x-codeapi-execution-profile"], "default");
        assert_eq!(json(r).await, body);
    }
}

#[tokio::test]
async fn a_completed_run_has_the_contract_response_shape() {
    let s = start(ApiConfig::default()).await;
    let r = post(&s, &json!({"lang": "py", "code": ""})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        json(r).await,
        json!({
            "session_id": "EXECsessionAAAAAAAAAA",
            "stdout": "hello\n",
            "stderr": "warn\n",
            "files": [
                {"id": "newFILEaaaaaaaaaaaaaa", "name": "out/chart.png", "storage_session_id": "EXECsessionAAAAAAAAAA"},
                {"id": "inhFILEbbbbbbbbbbbbbb", "name": "data.csv", "storage_session_id": "OLDsessionBBBBBBBBBBB",
                 "inherited": true, "entity_id": "agent_42"},
                {"id": "modFILEcccccccccccccc", "name": "notes.md", "storage_session_id": "EXECsessionAAAAAAAAAA",
                 "modified_from": {"id": "orgFILEdddddddddddddd", "storage_session_id": "OLDsessionBBBBBBBBBBB"}},
            ],
            "deleted_files": ["gone.txt"],
            "code": 0,
            "signal": null,
            "status": null,
            "message": null,
            "wall_time": 42,
        })
    );
}

#[tokio::test]
async fn new_runs_are_refused_once_shutdown_begins() {
    let s = start(ApiConfig::default()).await;
    s.shutdown.cancel();
    let r = post(&s, &json!({"lang": "py", "code": ""})).await;
    assert_eq!(r.status(), 503);
    assert_eq!(json(r).await, json!({"error": "Service is shutting down"}));
    assert_eq!(s.exec.call_count(), 0);
    // Health says draining, so that a balancer moves on.
    let r = s.client.get(s.url("/v1/health")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(json(r).await["status"], "draining");
    // Other routes keep answering.
    assert_eq!(
        s.client
            .get(s.url("/openapi.json"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn client_disconnect_cancels_the_run() {
    use tokio::io::AsyncWriteExt as _;

    let s = start(ApiConfig::default()).await;
    s.exec.set_reply(Reply::HangUntilCancelled);
    let body = r#"{"lang":"py","code":"while True: pass"}"#;
    let addr = s.base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /v1/exec HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), s.exec.started.notified())
        .await
        .expect("the run started");
    assert!(!s.exec.was_cancelled());
    drop(conn);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !s.exec.was_cancelled() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run was not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
