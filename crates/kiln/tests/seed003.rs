//! Seed 003's runtime daemon face over HTTP (default prefix `/runtime`):
//! code as Server-Sent Events, sessions, workspace files, metrics.

mod common;

use std::time::{Duration, Instant};

use common::{client, kernel_server, parse_frame};
use kiln::testing::TestServer;
use reqwest::Method;
use serde_json::{Value, json};

const KEY: &str = "seed003-test-key";

async fn runtime(tweak: impl FnOnce(&mut kiln::config::Config)) -> TestServer {
    kernel_server(KEY, tweak).await
}

/// A request to `path` of the face, with Kiln's key.
fn api(s: &TestServer, method: Method, path: &str) -> reqwest::RequestBuilder {
    client()
        .request(method, url(s, path))
        .header("X-Access-Token", KEY)
}

fn url(s: &TestServer, path: &str) -> String {
    format!("{}/runtime{path}", s.base_url)
}

/// `(event, data)` of every event of a finished stream.
async fn events(resp: reqwest::Response) -> Vec<(String, Value)> {
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    let text = tokio::time::timeout(Duration::from_secs(60), resp.text())
        .await
        .expect("the stream ends")
        .expect("body");
    let at = Instant::now();
    text.split("\n\n")
        .map(|frame| parse_frame(frame, at))
        .filter_map(|e| Some((e.event?, e.data)))
        .collect()
}

async fn code(s: &TestServer, body: Value) -> Vec<(String, Value)> {
    code_as(s, None, body).await
}

/// `POST /code` as the user `user` (its `User-Id`), or as nobody in
/// particular.
async fn code_as(s: &TestServer, user: Option<&str>, body: Value) -> Vec<(String, Value)> {
    let mut req = api(s, Method::POST, "/code");
    if let Some(u) = user {
        req = req.header("User-Id", u);
    }
    let r = req.json(&body).send().await.expect("send");
    assert_eq!(r.status(), 200);
    events(r).await
}

fn text_of(events: &[(String, Value)], name: &str) -> String {
    events
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, d)| d["data"].as_str().unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn code_streams_named_events_and_sessions_keep_their_own_state() {
    let s = runtime(|_| {}).await;
    let ev = code(
        &s,
        json!({"language": "python", "code": "import sys\nx = 41\nprint('hello')\nprint('oops', file=sys.stderr)\nx + 1"}),
    )
    .await;
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"stdout"), "{ev:?}");
    assert_eq!(names.last(), Some(&"end"), "{ev:?}");
    assert_eq!(text_of(&ev, "stdout"), "hello\n");
    assert_eq!(text_of(&ev, "stderr"), "oops\n");
    assert_eq!(text_of(&ev, "result"), "42");
    let (_, end) = ev.last().expect("end");
    assert_eq!(end["status"], "ok");
    let default_id = end["session_id"].as_str().expect("session_id").to_owned();
    assert_eq!(ev[0].1["type"], "stdout");
    assert_eq!(ev[0].1["session_id"], default_id.as_str());

    // the default session keeps its state; an error is an event
    let ev = code(&s, json!({"code": "x"})).await;
    assert_eq!(text_of(&ev, "result"), "41");
    let ev = code(&s, json!({"code": "1 / 0"})).await;
    let err = ev.iter().find(|(n, _)| n == "error").expect("error event");
    assert_eq!(err.1["ename"], "ZeroDivisionError");
    assert_eq!(ev.last().expect("end").1["status"], "error");

    // a session of its own: separate state, then deleted
    let r = api(&s, Method::POST, "/sessions")
        .json(&json!({"language": "python"}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.expect("json");
    let id = v["session_id"].as_str().expect("id").to_owned();
    assert_ne!(id, default_id);
    let ev = code(&s, json!({"code": "'x' in globals()", "session_id": id})).await;
    assert_eq!(text_of(&ev, "result"), "False");
    let r = api(&s, Method::DELETE, &format!("/sessions/{id}"))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 204);
    let r = api(&s, Method::POST, "/code")
        .json(&json!({"code": "1", "session_id": id}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 404);

    // another user cannot use the session id of someone else
    let r = api(&s, Method::POST, "/sessions")
        .header("User-Id", "alice")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 201);
    let alice: Value = r.json().await.expect("json");
    let r = api(&s, Method::POST, "/code")
        .header("User-Id", "mallory")
        .json(&json!({"code": "1", "session_id": alice["session_id"]}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 403);

    // bad input: clear 4xx
    for body in [
        json!({"language": "cobol", "code": "1"}),
        json!({"code": "1", "timeout": -1}),
        json!({"code": "1", "session_id": "not-an-id"}),
        json!({"source": "1"}),
    ] {
        let r = api(&s, Method::POST, "/code")
            .json(&body)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 400, "{body}");
    }
    let r = client()
        .post(url(&s, "/code"))
        .json(&json!({"code": "1"}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 401, "no token");
}

#[tokio::test]
async fn the_default_session_answers_to_its_own_id_and_shares_no_kernel_with_seed004_workers() {
    // carol holds four kernels at once (the default session and three
    // workers), all counted against her one cap
    let s = runtime(|c| {
        c.max_sessions = 5;
        c.max_sessions_per_user = 4;
    })
    .await;
    let carol = Some("carol");
    let ev = code_as(
        &s,
        carol,
        json!({"code": "secret = 'seed003-state'\nsecret"}),
    )
    .await;
    assert_eq!(text_of(&ev, "result"), "'seed003-state'");
    let id = ev.last().expect("end").1["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned();

    // the id its events report addresses it: same kernel, same state
    let ev = code_as(&s, carol, json!({"code": "secret", "session_id": id})).await;
    assert_eq!(text_of(&ev, "result"), "'seed003-state'", "{ev:?}");
    assert_eq!(ev.last().expect("end").1["session_id"], id.as_str());

    // seed 004's workers of the same user are other kernels, whatever
    // their user_uuid says
    for uuid in ["seed003-default", "default", "seed003"] {
        let r = client()
            .post(format!("{}/api/v1/execute?user_uuid={uuid}", s.base_url))
            .header("X-Auth-Token", KEY)
            .header("User-Id", "carol")
            .json(&json!({"code": "'secret' in globals()"}))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 200, "{uuid}");
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["result_text"], "False", "{uuid}: {v}");
        assert_ne!(v["worker_id"], id.as_str(), "{uuid}: {v}");
    }

    // nobody else addresses it
    let r = api(&s, Method::POST, "/code")
        .header("User-Id", "mallory")
        .json(&json!({"code": "secret", "session_id": id}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 403);
}

#[tokio::test]
async fn files_upload_list_download_stay_in_the_workspace_and_metrics_report_kernels() {
    let s = runtime(|_| {}).await;
    let form = reqwest::multipart::Form::new()
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"a,b\n1,2\n".to_vec()).file_name("data.csv"),
        )
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"notes".to_vec()).file_name("notes.txt"),
        );
    let r = api(&s, Method::POST, "/files/upload?path=/workspace/in")
        .multipart(form)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["files"][0]["path"], "/workspace/in/data.csv", "{v}");

    // the code sees them; what it writes is listed and downloadable
    let ev = code(
        &s,
        json!({"code": "open('/mnt/data/out.txt', 'w').write(open('/mnt/data/in/data.csv').read().upper())"}),
    )
    .await;
    assert_eq!(ev.last().expect("end").1["status"], "ok", "{ev:?}");
    let r = api(&s, Method::GET, "/files?path=/workspace")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    let paths: Vec<&str> = v["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    assert_eq!(
        paths,
        [
            "/workspace/in/data.csv",
            "/workspace/in/notes.txt",
            "/workspace/out.txt"
        ]
    );
    let v: Value = api(&s, Method::GET, "/files?path=/workspace/in")
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(v["files"].as_array().map(Vec::len), Some(2), "{v}");
    let r = api(&s, Method::GET, "/files/download?path=/workspace/out.txt")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.expect("bytes").as_ref(), b"A,B\n1,2\n");

    // traversal and paths outside the workspace are refused; links not followed
    for (path, status) in [
        ("/files/download?path=/etc/passwd", 403),
        ("/files/download?path=/workspace/../etc/passwd", 400),
        (
            "/files/download?path=/workspace/%2e%2e/%2e%2e/etc/passwd",
            400,
        ),
        ("/files?path=/proc", 403),
        ("/files/download?path=/workspace/missing.txt", 404),
        ("/files/download", 400),
    ] {
        let r = api(&s, Method::GET, path).send().await.expect("send");
        assert_eq!(r.status().as_u16(), status, "{path}");
    }
    code(
        &s,
        json!({"code": "import os\nos.symlink('/etc/passwd', '/mnt/data/link')"}),
    )
    .await;
    let r = api(&s, Method::GET, "/files/download?path=/workspace/link")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 404, "a link is not followed");
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(b"x".to_vec()).file_name("x.txt"),
    );
    let r = api(&s, Method::POST, "/files/upload?path=/workspace/../../etc")
        .multipart(form)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 400);

    // metrics: one live kernel (the default session), and a stream of them
    let r = api(&s, Method::GET, "/metrics").send().await.expect("send");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["sessions"]["live"], 1, "{v}");
    assert!(
        v["memory"]["total_bytes"].as_u64().is_some_and(|b| b > 0),
        "{v}"
    );
    let r = api(&s, Method::GET, "/metrics/watch?interval_ms=100")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    let mut text = String::new();
    let until = Instant::now() + Duration::from_secs(10);
    while text.matches("event: metrics").count() < 2 {
        use futures::StreamExt as _;
        let chunk = tokio::time::timeout_at(until.into(), body.next())
            .await
            .expect("two events in time")
            .expect("more")
            .expect("chunk");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.contains("\"live\":1"), "{text}");
    let r = api(&s, Method::GET, "/metrics/watch?interval_ms=1")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 400);
}
