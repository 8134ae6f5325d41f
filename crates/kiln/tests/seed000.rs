//! Seed 000's API under `/v1/librechat`, end to end against a real server:
//! upload → run reading it → output listed, downloaded, deleted; files that
//! persist across a session's runs; timeouts as 408 with stats; every error
//! the seed lists.

mod common;

use std::time::Duration;

use common::*;
use kiln::testing::TestServer;
use reqwest::multipart::{Form, Part};
use serde_json::{Value, json};

const KEY: &str = "seed-000-key";

async fn keyed() -> TestServer {
    server_with(|c| c.api_key = Some(KEY.into())).await
}

fn url(s: &TestServer, path: &str) -> String {
    format!("{}/librechat{path}", s.v1())
}

async fn upload(s: &TestServer, session: &str, name: &str, bytes: &[u8]) -> (u16, Value) {
    let form = Form::new().text("session_id", session.to_owned()).part(
        "file",
        Part::bytes(bytes.to_vec())
            .file_name(name.to_owned())
            .mime_str("text/csv")
            .unwrap(),
    );
    let r = client()
        .post(url(s, "/files"))
        .header("x-api-key", KEY)
        .multipart(form)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn run(s: &TestServer, body: Value) -> (u16, Value) {
    let r = client()
        .post(url(s, "/runs"))
        .header("x-api-key", KEY)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn list(s: &TestServer, session: &str) -> Value {
    let r = client()
        .get(url(s, &format!("/files?session_id={session}")))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

fn names(list: &Value) -> Vec<String> {
    let mut v: Vec<String> = list["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_owned())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn the_seed_flow_upload_run_list_download_delete() {
    let s = keyed().await;
    let health: Value = client()
        .get(url(&s, "/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["backend"], "kiln");
    let langs: Vec<&str> = health["languages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    for l in ["python", "javascript", "java", "cpp", "go", "r"] {
        assert!(langs.contains(&l), "{l} missing from {langs:?}");
    }

    // upload
    let (status, up) = upload(&s, "sess_abc", "input.csv", b"a,b\n1,2\n3,4\n").await;
    assert_eq!(status, 200, "{up}");
    let f = &up["file"];
    assert_eq!(f["session_id"], "sess_abc");
    assert_eq!(f["name"], "input.csv");
    assert_eq!(f["size_bytes"], 12);
    assert_eq!(f["mime_type"], "text/csv");
    assert!(f["created_at"].as_str().unwrap().ends_with('Z'));
    let input_id = f["id"].as_str().unwrap().to_owned();
    assert_eq!(names(&list(&s, "sess_abc").await), ["input.csv"]);

    // a run reading it and writing an output
    let code = "import csv\nrows = list(csv.reader(open('input.csv')))\nprint(len(rows))\n\
                open('output.csv', 'w').write('sum\\n' + str(sum(int(r[0]) for r in rows[1:])) + '\\n')";
    let (status, r) = run(
        &s,
        json!({"session_id": "sess_abc", "language": "python", "code": code}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stdout"], "3\n");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["session_id"], "sess_abc");
    assert_eq!(r["language"], "python");
    assert!(r["run_id"].as_str().is_some_and(|id| id.len() == 21));
    let stats = &r["stats"];
    assert!(stats["wall_time_seconds"].as_f64().unwrap() > 0.0, "{r}");
    assert!(stats["cpu_time_seconds"].as_f64().unwrap() > 0.0, "{r}");
    assert!(stats["memory_bytes"].as_u64().unwrap() > 0, "{r}");
    let files = r["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "only new or changed files: {r}");
    assert_eq!(files[0]["name"], "output.csv");
    assert_eq!(files[0]["size_bytes"], 6);
    assert_eq!(files[0]["mime_type"], "text/csv");
    let output_id = files[0]["id"].as_str().unwrap().to_owned();

    // listed, downloadable
    assert_eq!(
        names(&list(&s, "sess_abc").await),
        ["input.csv", "output.csv"]
    );
    let d = client()
        .get(url(&s, &format!("/files/{output_id}")))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(d.status(), 200);
    assert_eq!(d.headers()["content-type"], "text/csv");
    assert!(
        d.headers()["content-disposition"]
            .to_str()
            .unwrap()
            .contains("output.csv")
    );
    assert_eq!(d.bytes().await.unwrap().as_ref(), b"sum\n4\n");

    // a later run of the session sees the output of the earlier one
    let (_, r2) = run(
        &s,
        json!({"session_id": "sess_abc", "language": "py", "code": "print(open('output.csv').read().split()[1])"}),
    )
    .await;
    assert_eq!(r2["stdout"], "4\n", "{r2}");
    // naming files: only those are in the workspace
    let (_, r3) = run(
        &s,
        json!({"session_id": "sess_abc", "language": "bash", "code": "ls", "files": [input_id]}),
    )
    .await;
    assert_eq!(r3["stdout"], "input.csv\nscript.sh\n", "{r3}");
    // another session does not see them
    let (_, other) = run(
        &s,
        json!({"session_id": "sess_other", "language": "bash", "code": "ls"}),
    )
    .await;
    assert_eq!(other["stdout"], "script.sh\n", "{other}");

    // delete
    let del = client()
        .delete(url(&s, &format!("/files/{output_id}")))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 200);
    assert_eq!(
        del.json::<Value>().await.unwrap(),
        json!({"id": output_id, "deleted": true})
    );
    assert_eq!(names(&list(&s, "sess_abc").await), ["input.csv"]);
    let gone = client()
        .get(url(&s, &format!("/files/{output_id}")))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);
}

#[tokio::test]
async fn a_changed_file_replaces_the_old_one_in_the_session() {
    let s = keyed().await;
    upload(&s, "edit", "notes.txt", b"v1\n").await;
    let (_, r) = run(
        &s,
        json!({"session_id": "edit", "language": "bash", "code": "echo v2 >> notes.txt; rm -f nothing"}),
    )
    .await;
    assert_eq!(r["files"][0]["name"], "notes.txt", "{r}");
    let l = list(&s, "edit").await;
    assert_eq!(names(&l), ["notes.txt"], "one file per name: {l}");
    assert_eq!(l["files"][0]["size_bytes"], 6);
    // a file the program deletes leaves the session
    run(
        &s,
        json!({"session_id": "edit", "language": "bash", "code": "rm notes.txt"}),
    )
    .await;
    assert!(names(&list(&s, "edit").await).is_empty());
}

#[tokio::test]
async fn a_timeout_is_a_408_with_the_partial_output_and_stats() {
    let s = keyed().await;
    let (status, r) = run(
        &s,
        json!({"session_id": "slow", "language": "python", "timeout_seconds": 1.5,
               "code": "import time\nprint('before', flush=True)\ntime.sleep(30)"}),
    )
    .await;
    assert_eq!(status, 408, "{r}");
    assert_eq!(r["error"], "timeout");
    assert_eq!(r["stdout"], "before\n");
    assert_eq!(r["status"], "TO");
    let wall = r["stats"]["wall_time_seconds"].as_f64().unwrap();
    assert!((1.4..10.0).contains(&wall), "{r}");
    assert!(r["detail"].as_str().unwrap().contains("timed out"), "{r}");
}

#[tokio::test]
async fn a_run_streams_on_request_and_its_result_is_the_json_answer() {
    let s = keyed().await;
    let resp = client()
        .post(url(&s, "/runs"))
        .header("x-api-key", KEY)
        .header("accept", "text/event-stream")
        .json(&json!({"session_id": "stream", "language": "javascript",
                      "code": "console.log('one'); require('fs').writeFileSync('o.txt', 'x')"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let events = sse_events(resp, Duration::from_secs(60)).await;
    assert_eq!(sse_text(&events, "stdout"), "one\n");
    let files: Vec<&Value> = events
        .iter()
        .filter(|e| e.event.as_deref() == Some("file"))
        .map(|e| &e.data)
        .collect();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0]["name"], "o.txt");
    assert_eq!(files[0]["size_bytes"], 1);
    let result = sse_result(&events);
    assert_eq!(result["stdout"], "one\n");
    assert_eq!(result["language"], "javascript");
    assert_eq!(result["files"][0]["id"], files[0]["id"]);
}

#[tokio::test]
async fn a_wrong_or_missing_key_is_401() {
    let s = keyed().await;
    for key in [None, Some("wrong")] {
        let mut r = client()
            .post(url(&s, "/runs"))
            .json(&json!({"session_id": "x", "language": "py", "code": "1"}));
        if let Some(k) = key {
            r = r.header("x-api-key", k);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 401);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"], "unauthorized");
        assert!(v["detail"].as_str().unwrap().contains("API key"), "{v}");
        for path in [
            "/files?session_id=x",
            "/files/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        ] {
            let mut g = client().get(url(&s, path));
            if let Some(k) = key {
                g = g.header("x-api-key", k);
            }
            assert_eq!(g.send().await.unwrap().status(), 401, "{path}");
        }
    }
    // health is open
    assert_eq!(
        client()
            .get(url(&s, "/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn an_invalid_body_is_400_naming_the_field() {
    let s = keyed().await;
    let cases = [
        (json!({"language": "py", "code": "1"}), "session_id"),
        (json!({"session_id": "x", "code": "1"}), "language"),
        (json!({"session_id": "x", "language": "py"}), "code"),
        (
            json!({"session_id": "x", "language": "cobol", "code": "1"}),
            "language",
        ),
        (
            json!({"session_id": "x", "language": "py", "code": 5}),
            "code",
        ),
        (
            json!({"session_id": "x", "language": "py", "code": "1", "timeout_seconds": 0}),
            "timeout_seconds",
        ),
        (
            json!({"session_id": "x", "language": "py", "code": "1", "timeout_seconds": "10"}),
            "timeout_seconds",
        ),
        (
            json!({"session_id": "x", "language": "py", "code": "1", "args": "--flag"}),
            "args",
        ),
        (
            json!({"session_id": "a/b", "language": "py", "code": "1"}),
            "session_id",
        ),
        (
            json!({"session_id": "x", "language": "py", "code": "1", "files": ["file_123"]}),
            "files[0]",
        ),
        (
            json!({"session_id": "x", "language": "py", "code": "1",
                   "files": (0..11).map(|i| format!("f{i}")).collect::<Vec<_>>()}),
            "files",
        ),
    ];
    for (body, field) in cases {
        let (status, v) = run(&s, body.clone()).await;
        assert_eq!(status, 400, "{body} → {v}");
        assert_eq!(v["error"], "bad_request");
        assert!(
            v["detail"].as_str().unwrap().contains(field),
            "{body}: {v} does not name {field}"
        );
    }
    let r = client()
        .post(url(&s, "/runs"))
        .header("x-api-key", KEY)
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // uploads and listings name theirs too
    let r = client()
        .get(url(&s, "/files"))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("session_id"));
    let form = Form::new().part("file", Part::bytes(b"x".to_vec()).file_name("a.txt"));
    let r = client()
        .post(url(&s, "/files"))
        .header("x-api-key", KEY)
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("session_id"));
    let r = client()
        .post(url(&s, "/files"))
        .header("x-api-key", KEY)
        .multipart(Form::new().text("session_id", "x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("file"));
}

#[tokio::test]
async fn too_many_runs_are_429_with_a_retry_hint() {
    let s = server_with(|c| {
        c.api_key = Some(KEY.into());
        c.rate_limit_runs = 2;
        c.rate_limit_window_secs = 60;
    })
    .await;
    for _ in 0..2 {
        let (status, _) = run(
            &s,
            json!({"session_id": "r", "language": "bash", "code": "true"}),
        )
        .await;
        assert_eq!(status, 200);
    }
    let r = client()
        .post(url(&s, "/runs"))
        .header("x-api-key", KEY)
        .json(&json!({"session_id": "r", "language": "bash", "code": "true"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "rate_limited");
    assert_eq!(v["retry_after_seconds"], retry);
}

#[tokio::test]
async fn librechat_exec_answers_the_rate_limit_in_its_own_envelope() {
    let s = server_with(|c| c.rate_limit_runs = 1).await;
    let (status, _) = exec_raw(&s, json!({"lang": "bash", "code": "true"})).await;
    assert_eq!(status, 200);
    let (status, v) = exec_raw(&s, json!({"lang": "bash", "code": "true"})).await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"], "rate_limited");
    let secs = v["retry_after_seconds"].as_u64().unwrap();
    assert!((1..=60).contains(&secs), "{v}");
    assert_eq!(
        v["message"],
        format!("Too many CodeAPI execution requests. Please retry in {secs} seconds.")
    );
}

#[tokio::test]
async fn unknown_files_are_404_and_a_broken_store_is_a_500() {
    let s = keyed().await;
    for id in ["file_123", "aaaaaaaaaaaaaaaaaaaaabbbbbbbbbbbbbbbbbbbbb"] {
        for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
            let r = client()
                .request(method.clone(), url(&s, &format!("/files/{id}")))
                .header("x-api-key", KEY)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 404, "{method} {id}");
            assert_eq!(r.json::<Value>().await.unwrap()["error"], "not_found");
        }
    }
    // someone else's file is not found either
    let (_, up) = upload(&s, "mine", "a.txt", b"x").await;
    let id = up["file"]["id"].as_str().unwrap().to_owned();
    let r = client()
        .get(url(&s, &format!("/files/{id}")))
        .header("x-api-key", KEY)
        .header("user-id", "mallory")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // a real internal fault: the database is gone
    s.store.close().await;
    let (status, v) = upload(&s, "mine", "b.txt", b"y").await;
    assert_eq!(status, 500, "{v}");
    assert_eq!(
        v,
        json!({"detail": "Internal server error", "error": "internal_error"})
    );
}

#[tokio::test]
async fn an_idle_session_is_emptied_after_its_ttl() {
    let s = server_with(|c| {
        c.api_key = Some(KEY.into());
        c.session_ttl_secs = 2;
    })
    .await;
    upload(&s, "short", "a.txt", b"x").await;
    upload(&s, "busy", "b.txt", b"y").await;
    for _ in 0..8 {
        // "busy" is used every half second
        list(&s, "busy").await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        names(&list(&s, "short").await).is_empty(),
        "idle 4 s with a 2 s TTL"
    );
    assert_eq!(names(&list(&s, "busy").await), ["b.txt"]);
}
