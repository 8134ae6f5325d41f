//! The sandbox bridge face (`/v1/sandbox`, Cloudflare's protocol) over
//! HTTP: its answers to bad input, auth, caps, and commands (streams,
//! exit codes, timeouts, files that persist). The real client
//! (`@librechat/agents`' bridge runtime and coding tools) is driven by
//! `e2e_bridge.rs`; attacks on paths are in the security suite.

mod common;

use common::*;
use kiln::testing::TestServer;
use reqwest::Method;
use serde_json::{Value, json};

const KEY: &str = "bridge-key";

async fn bridge_server() -> TestServer {
    server_with(|c| {
        c.api_key = Some(KEY.into());
        c.bridge_sandboxes_per_user = 2;
        c.timeout_secs = 10;
    })
    .await
}

/// A request of `user` with the shared key.
fn call(s: &TestServer, method: Method, path: &str, user: &str) -> reqwest::RequestBuilder {
    client()
        .request(method, format!("{}/sandbox{path}", s.v1()))
        .bearer_auth(KEY)
        .header("User-Id", user)
}

async fn status_and_json(req: reqwest::RequestBuilder) -> (u16, Value) {
    let r = req.send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn create(s: &TestServer, user: &str) -> String {
    let (st, v) = status_and_json(call(s, Method::POST, "", user)).await;
    assert_eq!(st, 200, "{v}");
    v["id"].as_str().expect("id").to_owned()
}

/// What an exec answered: the decoded output and the terminal event.
#[derive(Debug)]
struct Exec {
    stdout: String,
    stderr: String,
    last: String,
    data: Value,
}

async fn exec(s: &TestServer, user: &str, id: &str, body: Value) -> Exec {
    use base64::Engine as _;
    let r = call(s, Method::POST, &format!("/{id}/exec"), user)
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers().contains_key("x-kiln-run-id"));
    let text = r.text().await.expect("body");
    let mut out = Exec {
        stdout: String::new(),
        stderr: String::new(),
        last: String::new(),
        data: Value::Null,
    };
    for frame in text.split("\n\n").filter(|f| !f.trim().is_empty()) {
        let ev = parse_frame(frame, std::time::Instant::now());
        let Some(name) = ev.event else { continue };
        let raw: String = frame
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .collect();
        match name.as_str() {
            "stdout" | "stderr" => {
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(raw)
                    .expect("base64 data");
                let t = String::from_utf8(bytes).expect("utf-8");
                if name == "stdout" {
                    out.stdout.push_str(&t);
                } else {
                    out.stderr.push_str(&t);
                }
            }
            _ => {
                out.last = name;
                out.data = ev.data;
            }
        }
    }
    out
}

/// `PUT`s `body` as the file `path` (below the root, e.g.
/// `workspace/a.txt`) of sandbox `id`; the status.
async fn put_file(s: &TestServer, user: &str, id: &str, path: &str, body: &'static str) -> u16 {
    call(s, Method::PUT, &format!("/{id}/file/{path}"), user)
        .body(body)
        .send()
        .await
        .expect("send")
        .status()
        .as_u16()
}

fn argv(cmd: &str) -> Value {
    json!({ "argv": ["bash", "-c", cmd] })
}

#[tokio::test]
async fn bad_ids_bodies_and_paths_get_4xx_in_the_protocols_shape() {
    let s = bridge_server().await;
    let id = create(&s, "alice").await;
    let unknown = "V1StGXR8_Z5jdHi6B-myT";
    let cases: Vec<(Method, String, Option<Value>, u16)> = vec![
        (Method::GET, "/not-an-id/running".into(), None, 400),
        (Method::GET, format!("/{unknown}/running"), None, 404),
        (Method::DELETE, format!("/{unknown}"), None, 404),
        (
            Method::POST,
            format!("/{unknown}/exec"),
            Some(argv("true")),
            404,
        ),
        (
            Method::GET,
            format!("/{unknown}/file/workspace/a"),
            None,
            404,
        ),
        (
            Method::POST,
            format!("/{id}/exec"),
            Some(json!({"argv": []})),
            400,
        ),
        (
            Method::POST,
            format!("/{id}/exec"),
            Some(json!({"argv": [""]})),
            400,
        ),
        (
            Method::POST,
            format!("/{id}/exec"),
            Some(json!({"cmd": "ls"})),
            400,
        ),
        (
            Method::POST,
            format!("/{id}/exec"),
            Some(json!({"argv": ["ls"], "timeout_ms": 0})),
            400,
        ),
        (
            Method::POST,
            format!("/{id}/exec"),
            Some(json!({"argv": ["ls"], "cwd": "/etc"})),
            403,
        ),
        (
            Method::POST,
            format!("/{id}/exec"),
            Some(json!({"argv": ["ls"], "cwd": "/workspace/../etc"})),
            403,
        ),
        (
            Method::POST,
            format!("/{id}/exec"),
            Some(json!({"argv": ["ls"], "cwd": ".."})),
            403,
        ),
        (Method::GET, format!("/{id}/file/etc/passwd"), None, 403),
        (
            Method::GET,
            format!("/{id}/file/workspace%2F..%2Fetc%2Fpasswd"),
            None,
            403,
        ),
        (Method::PUT, format!("/{id}/file/tmp/x"), None, 403),
        (Method::GET, format!("/{id}/file/workspace"), None, 400),
        (
            Method::GET,
            format!("/{id}/file/workspace/missing.txt"),
            None,
            404,
        ),
    ];
    for (method, path, body, want) in cases {
        let mut req = call(&s, method.clone(), &path, "alice");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let (st, v) = status_and_json(req).await;
        assert_eq!(st, want, "{method} {path}: {v}");
        assert!(
            v["error"].is_string() && v["code"].is_string(),
            "{method} {path}: {v}"
        );
    }
    // a body that is not JSON, and a malformed Session-Id
    let (st, v) = status_and_json(
        call(&s, Method::POST, &format!("/{id}/exec"), "alice")
            .header("content-type", "application/json")
            .body("{"),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = status_and_json(
        call(&s, Method::GET, &format!("/{id}/running"), "alice").header("Session-Id", "a b"),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    s.stop().await.expect("stop");
}

#[tokio::test]
async fn a_wrong_key_is_refused_and_another_principals_sandbox_is_not_found() {
    let s = bridge_server().await;
    let id = create(&s, "alice").await;
    let url = format!("{}/sandbox/{id}/running", s.v1());
    let (st, _) = status_and_json(client().get(&url).header("User-Id", "alice")).await;
    assert_eq!(st, 401);
    let (st, _) = status_and_json(
        client()
            .get(&url)
            .bearer_auth("wrong")
            .header("User-Id", "alice"),
    )
    .await;
    assert_eq!(st, 401);
    let (st, v) = status_and_json(
        client()
            .post(format!("{}/sandbox", s.v1()))
            .bearer_auth("wrong")
            .header("User-Id", "alice"),
    )
    .await;
    assert_eq!(st, 401, "{v}");
    for (method, path) in [
        (Method::GET, format!("/{id}/running")),
        (Method::POST, format!("/{id}/exec")),
        (Method::GET, format!("/{id}/file/workspace/a.txt")),
        (Method::PUT, format!("/{id}/file/workspace/a.txt")),
        (Method::DELETE, format!("/{id}")),
    ] {
        let mut req = call(&s, method.clone(), &path, "bob");
        if method == Method::POST {
            req = req.json(&argv("true"));
        }
        let (st, v) = status_and_json(req).await;
        assert_eq!(st, 404, "bob {method} {path}: {v}");
    }
    let (st, v) = status_and_json(call(&s, Method::GET, &format!("/{id}/running"), "alice")).await;
    assert_eq!((st, &v["running"]), (200, &json!(true)), "{v}");
    s.stop().await.expect("stop");
}

#[tokio::test]
async fn a_principal_holds_at_most_its_cap_and_a_deleted_sandbox_is_gone() {
    let s = bridge_server().await;
    let a = create(&s, "alice").await;
    create(&s, "alice").await;
    let (st, v) = status_and_json(call(&s, Method::POST, "", "alice")).await;
    assert_eq!(
        (st, v["code"].as_str()),
        (429, Some("sandbox_limit")),
        "{v}"
    );
    // another principal has its own cap
    create(&s, "bob").await;
    let r = call(&s, Method::DELETE, &format!("/{a}"), "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let (st, _) = status_and_json(call(&s, Method::GET, &format!("/{a}/running"), "alice")).await;
    assert_eq!(st, 404);
    create(&s, "alice").await;
    s.stop().await.expect("stop");
}

#[tokio::test]
async fn commands_stream_their_output_and_end_with_the_protocols_event() {
    let s = bridge_server().await;
    let id = create(&s, "alice").await;
    // a file put over HTTP is in /workspace; what a command writes persists
    assert_eq!(
        put_file(&s, "alice", &id, "workspace/src/in.txt", "from the host\n").await,
        200
    );
    let e = exec(
        &s,
        "alice",
        &id,
        json!({"argv": ["cat", "in.txt"], "cwd": "/workspace/src"}),
    )
    .await;
    assert_eq!(
        (e.stdout.as_str(), e.last.as_str()),
        ("from the host\n", "exit"),
        "{e:?}"
    );
    assert_eq!(e.data["exit_code"], 0);
    let e = exec(
        &s,
        "alice",
        &id,
        argv("pwd; echo out > made.txt; echo err >&2; exit 7"),
    )
    .await;
    assert_eq!(e.stdout, "/workspace\n");
    assert_eq!(e.stderr, "err\n");
    assert_eq!(
        (e.last.as_str(), &e.data["exit_code"]),
        ("exit", &json!(7)),
        "{e:?}"
    );
    let r = call(
        &s,
        Method::GET,
        &format!("/{id}/file/workspace/made.txt"),
        "alice",
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.text().await.unwrap(), "out\n");
    // argv runs as given: no shell expands it
    let e = exec(
        &s,
        "alice",
        &id,
        json!({"argv": ["echo", "$HOME", "*", "a;b"]}),
    )
    .await;
    assert_eq!(e.stdout, "$HOME * a;b\n");
    // a missing program, a signal, Kiln's timeout
    let e = exec(&s, "alice", &id, json!({"argv": ["no-such-program"]})).await;
    assert_eq!(e.data["exit_code"], 127, "{e:?}");
    let e = exec(&s, "alice", &id, argv("kill -9 $$")).await;
    assert_eq!(e.data["exit_code"], 137, "{e:?}");
    let e = exec(
        &s,
        "alice",
        &id,
        json!({"argv": ["bash", "-c", "echo started; sleep 30"], "timeout_ms": 1500}),
    )
    .await;
    assert_eq!(e.stdout, "started\n");
    assert_eq!(
        (e.last.as_str(), e.data["code"].as_str()),
        ("error", Some("exec_timeout")),
        "{e:?}"
    );
    s.stop().await.expect("stop");
}

#[tokio::test]
async fn a_sandbox_holds_at_most_its_storage_budget() {
    let s = server_with(|c| {
        c.api_key = Some(KEY.into());
        c.project_budget_bytes = 1024 * 1024;
    })
    .await;
    let id = create(&s, "alice").await;
    let big = vec![b'x'; 2 * 1024 * 1024];
    let (st, v) = status_and_json(
        call(
            &s,
            Method::PUT,
            &format!("/{id}/file/workspace/big.bin"),
            "alice",
        )
        .body(big),
    )
    .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (507, Some("storage_exceeded")),
        "{v}"
    );
    // a command past the budget: its changes are discarded, and it says so
    let e = exec(
        &s,
        "alice",
        &id,
        argv("echo kept > small.txt; head -c 2000000 /dev/zero > big.bin"),
    )
    .await;
    assert_eq!(e.last, "error", "{e:?}");
    assert!(
        e.data["error"]
            .as_str()
            .is_some_and(|m| m.contains("budget")),
        "{e:?}"
    );
    let e = exec(&s, "alice", &id, argv("ls -A")).await;
    assert_eq!(
        (e.stdout.as_str(), &e.data["exit_code"]),
        ("", &json!(0)),
        "{e:?}"
    );
    // within the budget, it is kept
    let e = exec(
        &s,
        "alice",
        &id,
        argv("head -c 100000 /dev/zero > ok.bin; ls"),
    )
    .await;
    assert_eq!(e.data["exit_code"], 0, "{e:?}");
    let r = call(
        &s,
        Method::GET,
        &format!("/{id}/file/workspace/ok.bin"),
        "alice",
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.bytes().await.unwrap().len(), 100_000);
    s.stop().await.expect("stop");
}

#[tokio::test]
async fn an_idle_sandbox_is_removed_with_its_workspace() {
    let s = server_with(|c| {
        c.api_key = Some(KEY.into());
        c.bridge_idle_ttl_secs = 1;
    })
    .await;
    let id = create(&s, "alice").await;
    assert_eq!(
        put_file(&s, "alice", &id, "workspace/a.txt", "kept until idle").await,
        200
    );
    let projects = s.data_dir.path().join("projects");
    let count = || std::fs::read_dir(&projects).map_or(0, Iterator::count);
    assert_eq!(count(), 1, "the sandbox's project exists");
    // the sweep runs every few seconds; the sandbox expired after 1 s
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while count() > 0 {
        assert!(
            std::time::Instant::now() < until,
            "the idle sandbox's project is still there"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (st, _) = status_and_json(call(&s, Method::GET, &format!("/{id}/running"), "alice")).await;
    assert_eq!(st, 404);
    // its place is free again: a principal at its cap can create anew
    create(&s, "alice").await;
    s.stop().await.expect("stop");
}

/// A bridge server keeping its data in `dir` (so a second one is the first
/// restarted).
async fn bridge_server_in(dir: &std::path::Path, idle_ttl_secs: u64) -> TestServer {
    server_with(|c| {
        c.api_key = Some(KEY.into());
        c.bridge_sandboxes_per_user = 2;
        c.bridge_idle_ttl_secs = idle_ttl_secs;
        c.data_dir = dir.to_owned();
    })
    .await
}

#[tokio::test]
async fn a_restart_forgets_no_sandbox_its_creator_uses_again() {
    let data = tempfile::tempdir().unwrap();
    let s = bridge_server_in(data.path(), 3600).await;
    let id = create(&s, "alice").await;
    let made = exec(&s, "alice", &id, argv("echo durable > state.txt")).await;
    assert_eq!(made.last, "exit", "{made:?}");
    s.stop().await.unwrap();

    let s = bridge_server_in(data.path(), 3600).await;
    // another principal naming it finds nothing, as before the restart
    let (st, _) = status_and_json(call(&s, Method::GET, &format!("/{id}/running"), "bob")).await;
    assert_eq!(st, 404);
    let again = exec(&s, "alice", &id, argv("cat state.txt")).await;
    assert_eq!(
        (again.last.as_str(), again.stdout.as_str()),
        ("exit", "durable\n"),
        "{again:?}"
    );
    let (st, v) = status_and_json(call(&s, Method::GET, &format!("/{id}/running"), "alice")).await;
    assert_eq!((st, &v), (200, &json!({"running": true})));
    // the sandbox taken back holds one of alice's two places
    create(&s, "alice").await;
    let (st, v) = status_and_json(call(&s, Method::POST, "", "alice")).await;
    assert_eq!(st, 429, "{v}");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn a_sandbox_idle_past_its_ttl_across_a_restart_is_gone_with_its_workspace() {
    let data = tempfile::tempdir().unwrap();
    let s = bridge_server_in(data.path(), 2).await;
    let id = create(&s, "alice").await;
    assert_eq!(
        put_file(&s, "alice", &id, "workspace/a.txt", "left behind").await,
        200
    );
    s.stop().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;

    let s = bridge_server_in(data.path(), 2).await;
    let projects = data.path().join("projects");
    let count = || std::fs::read_dir(&projects).map_or(0, Iterator::count);
    let (st, _) = status_and_json(call(&s, Method::GET, &format!("/{id}/running"), "alice")).await;
    assert_eq!(st, 404);
    assert_eq!(count(), 0, "its project is removed");
    s.stop().await.unwrap();
}
