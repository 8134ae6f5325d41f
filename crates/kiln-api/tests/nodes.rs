//! Two nodes over one store (the executor a double): a run started on one
//! is watched, streamed and cancelled through the other (forwarded to its
//! owner); a forged node header changes nothing; a forwarded request is
//! never forwarded again; an owner that is gone is `410 session_lost` at
//! once; rate limits counted in the store are one budget for both nodes.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{RecordingExec, Reply, health_info};
use kiln_api::cluster::{Cluster, FORWARDED_BY, NODE_SECRET};
use kiln_api::rate::{RateLimits, RateRules, Rule};
use kiln_api::{ApiConfig, AppState};
use kiln_store::{Store, StoreConfig};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

const SECRET: &str = "node-secret-for-tests-0123";

struct Node {
    base: String,
    exec: Arc<RecordingExec>,
    task: JoinHandle<()>,
}

async fn store() -> (Store, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(StoreConfig {
        dir: dir.path().to_path_buf(),
        retention: Duration::from_secs(3600),
        budget: Default::default(),
    })
    .await
    .unwrap();
    (store, dir)
}

/// A node named `id` on `store`, recorded alive, with `rates`.
async fn node(store: &Store, id: &str, rates: Option<RateRules>) -> Node {
    let config = ApiConfig {
        rate_limits: RateRules::off(),
        ..ApiConfig::default()
    };
    node_with(store, id, rates, config).await
}

/// [`node`] with its HTTP configuration.
async fn node_with(store: &Store, id: &str, rates: Option<RateRules>, config: ApiConfig) -> Node {
    node_built(store, id, rates, config, |_| {}).await
}

/// [`node_with`], its state finished by `finish`.
async fn node_built(
    store: &Store,
    id: &str,
    rates: Option<RateRules>,
    config: ApiConfig,
    finish: impl FnOnce(&mut AppState),
) -> Node {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let exec = Arc::new(RecordingExec::new());
    let cluster = Cluster::new(
        id.to_owned(),
        base.clone(),
        SECRET.to_owned(),
        Duration::from_secs(15),
    )
    .unwrap();
    let mut state = AppState {
        cluster: Some(Arc::new(cluster)),
        ..AppState::new(store.clone(), exec.clone(), config, health_info())
    };
    if let Some(rules) = rates {
        state.rates = Arc::new(RateLimits::shared(rules, store.clone()));
    }
    finish(&mut state);
    store
        .node_heartbeat(id, &base, false, kiln_api::cluster::now_ms())
        .await
        .unwrap();
    let app = kiln_api::router(state);
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    Node { base, exec, task }
}

fn client() -> reqwest::Client {
    kiln_exec::install_crypto_provider();
    reqwest::Client::new()
}

/// Starts a detached run on `node` that lasts until cancelled; its id.
async fn start_run(node: &Node) -> (String, reqwest::Response) {
    node.exec.set_reply(Reply::HangUntilCancelled);
    let resp = client()
        .post(format!("{}/v1/exec", node.base))
        .header("prefer", "respond-async")
        .json(&json!({"lang": "py", "code": "x", "user_id": "alice", "detach": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let id = resp.headers()["x-kiln-run-id"].to_str().unwrap().to_owned();
    (id, resp)
}

async fn get_run(base: &str, id: &str) -> (u16, Value) {
    let r = client()
        .get(format!("{base}/v1/runs/{id}?kind=user&id=alice"))
        .header("user-id", "alice")
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_run_started_on_one_node_is_watched_streamed_and_cancelled_through_another() {
    let (store, _dir) = store().await;
    let a = node(&store, "node-a", None).await;
    let b = node(&store, "node-b", None).await;
    let (id, _stream) = start_run(&a).await;
    assert_eq!(
        store.owner("run", &id).await.unwrap().map(|o| o.node_id),
        Some("node-a".to_owned())
    );

    // the run's state through b
    let (st, run) = get_run(&b.base, &id).await;
    assert_eq!(st, 200, "{run}");
    assert_eq!(run["run_id"], id.as_str(), "{run}");

    // someone else's run stays someone else's through the forward
    let r = client()
        .get(format!("{}/v1/runs/{id}", b.base))
        .header("user-id", "mallory")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // cancelled through b: the run on a ends
    let r = client()
        .post(format!("{}/v1/runs/{id}/cancel", b.base))
        .header("user-id", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while !a.exec.was_cancelled() {
        assert!(
            tokio::time::Instant::now() < until,
            "the run on a was not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(b.exec.call_count(), 0, "b ran nothing itself");

    // its events through b: the owner's event stream, to its end
    let events = client()
        .get(format!("{}/v1/runs/{id}/events", b.base))
        .header("user-id", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    assert_eq!(events.headers()["x-kiln-node"], "node-a");
    assert_eq!(events.headers()["x-kiln-via"], "node-b");
    assert!(
        events.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = tokio::time::timeout(Duration::from_secs(10), events.text())
        .await
        .expect("the stream ends with the run")
        .unwrap();
    assert!(text.contains("event: "), "{text}");
}

#[tokio::test]
async fn forwarding_needs_the_secret_and_never_loops() {
    let (store, _dir) = store().await;
    let a = node(&store, "node-a", None).await;
    let b = node(&store, "node-b", None).await;
    let (id, _stream) = start_run(&a).await;

    // a client forging the node headers with a wrong secret: stripped,
    // and the request is forwarded as any other
    let r = client()
        .get(format!("{}/v1/runs/{id}", b.base))
        .header("user-id", "alice")
        .header(FORWARDED_BY, "node-a")
        .header(NODE_SECRET, "not-the-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // a request that says (truthfully) it was forwarded is answered where
    // it lands: b does not hold the run, so not found, and no second hop
    let r = client()
        .get(format!("{}/v1/runs/{id}", b.base))
        .header("user-id", "alice")
        .header(FORWARDED_BY, "node-a")
        .header(NODE_SECRET, SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn a_gone_owner_is_session_lost_at_once_not_a_hang() {
    let (store, _dir) = store().await;
    let a = node(&store, "node-a", None).await;
    let b = node(&store, "node-b", None).await;
    let (id, stream) = start_run(&a).await;

    // a stops answering (its port closed): connection refused
    drop(stream);
    a.task.abort();
    let _ = a.task.await;
    let t = std::time::Instant::now();
    let (st, body) = get_run(&b.base, &id).await;
    assert_eq!(st, 410, "{body}");
    assert_eq!(body["error"], "session_lost", "{body}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

    // a node whose heartbeat stopped: lost without a connection attempt
    let c = node(&store, "node-c", None).await;
    let (id, _stream) = start_run(&c).await;
    let old = kiln_api::cluster::now_ms() - 60_000;
    store
        .node_heartbeat("node-c", &c.base, false, old)
        .await
        .unwrap();
    let (st, body) = get_run(&b.base, &id).await;
    assert_eq!(st, 410, "{body}");

    // something no node owns is not found, as on one node
    let (st, _) = get_run(&b.base, "V1StGXR8_Z5jdHi6B-myT").await;
    assert_eq!(st, 404);
}

#[tokio::test]
async fn two_nodes_counting_in_the_store_share_one_budget() {
    let (store, _dir) = store().await;
    let rules = RateRules {
        download: Some(Rule::new(3, 60)),
        ..RateRules::off()
    };
    let a = node(&store, "node-a", Some(rules)).await;
    let b = node(&store, "node-b", Some(rules)).await;
    let mut statuses = Vec::new();
    for base in [&a.base, &b.base, &a.base, &b.base, &a.base] {
        let r = client()
            .get(format!(
                "{base}/v1/download/V1StGXR8_Z5jdHi6B-myT/V1StGXR8_Z5jdHi6B-myT"
            ))
            .header("user-id", "alice")
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
        if r.status() == 429 {
            let retry: u64 = r.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((1..=20).contains(&retry), "retry-after {retry}");
        }
    }
    // three allowed between them (answered: no such file), then refused on both
    assert!(statuses[..3].iter().all(|s| *s != 429), "{statuses:?}");
    assert_eq!(statuses[3..], [429, 429], "{statuses:?}");
    // another caller has a budget of its own
    let r = client()
        .get(format!(
            "{}/v1/download/V1StGXR8_Z5jdHi6B-myT/V1StGXR8_Z5jdHi6B-myT",
            b.base
        ))
        .header("user-id", "bob")
        .send()
        .await
        .unwrap();
    assert_ne!(r.status(), 429);
}

/// The status line a request head (no body follows) is answered with
/// within `limit`, read from a raw connection; `None` when nothing came.
async fn answer_to_head(base: &str, head: &str, limit: Duration) -> Option<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        while !got.windows(2).any(|w| w == b"\r\n") {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    (read.is_ok() && !got.is_empty()).then(|| {
        String::from_utf8_lossy(&got)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned()
    })
}

const STATEFUL: (&str, &str) = ("x-codeapi-expected-profile", "stateful");

/// `POST url` with `headers` and a JSON `body`.
async fn post(url: &str, headers: &[(&str, &str)], body: Value) -> reqwest::Response {
    let mut req = client().post(url).json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

fn keyed() -> ApiConfig {
    ApiConfig {
        auth: kiln_api::AuthMode::ApiKey,
        api_key: Some("the-key".into()),
        rate_limits: RateRules::off(),
        ..ApiConfig::default()
    }
}

#[tokio::test]
async fn an_unauthenticated_body_is_refused_before_a_byte_of_it_is_read_or_reserved() {
    let (store, _dir) = store().await;
    let a = node_with(&store, "node-a", None, keyed()).await;
    // 200 MiB announced, nothing sent: a node that waited to buffer the
    // body before the credential check would never answer
    for path in [
        "/api/v1/execute?user_uuid=u-1",
        "/v1/exec/programmatic",
        "/v1/exec",
    ] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             X-CodeAPI-Expected-Profile: stateful\r\nContent-Length: 209715200\r\n\r\n"
        );
        let status = answer_to_head(&a.base, &head, Duration::from_secs(5)).await;
        assert_eq!(
            status.as_deref(),
            Some("HTTP/1.1 401 Unauthorized"),
            "{path}"
        );
    }
    // the node still serves
    let r = client()
        .get(format!("{}/v1/health", a.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn unauthenticated_requests_leave_no_owner_rows() {
    let (store, _dir) = store().await;
    let a = node_with(&store, "node-a", None, keyed()).await;
    for i in 0..5 {
        let user = format!("u-{i}");
        let url = format!("{}/api/v1/execute?user_uuid={user}", a.base);
        let r = post(&url, &[], json!({"code": "1"})).await;
        assert_eq!(r.status(), 401);
        assert!(
            store.owner("worker", &user).await.unwrap().is_none(),
            "{user}"
        );

        let hint = format!("v2:user:{i}");
        let body = json!({"lang": "py", "code": "1", "runtime_session_hint": hint});
        let r = post(&format!("{}/v1/exec", a.base), &[STATEFUL], body).await;
        assert_eq!(r.status(), 401);
        assert!(
            store.owner("runtime", &hint).await.unwrap().is_none(),
            "{hint}"
        );
    }
    // the caller with the key is served, and its session gets its owner
    let body = json!({"lang": "py", "code": "1", "runtime_session_hint": "v2:user:ok"});
    let key = ("x-api-key", "the-key");
    let r = post(&format!("{}/v1/exec", a.base), &[key, STATEFUL], body).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        store
            .owner("runtime", "v2:user:ok")
            .await
            .unwrap()
            .map(|o| o.node_id),
        Some("node-a".to_owned())
    );
}

#[tokio::test]
async fn a_seed004_body_is_bounded_by_the_json_limit_not_the_upload_limit() {
    let (store, _dir) = store().await;
    let a = node_with(&store, "node-a", None, keyed()).await;
    // authenticated, 200 MiB announced (above max_json_bytes, below the
    // upload bound), nothing sent: 413 from the length alone
    let head = "POST /api/v1/execute?user_uuid=u-1 HTTP/1.1\r\nHost: x\r\n\
                X-Auth-Token: the-key\r\nContent-Type: application/json\r\n\
                Content-Length: 209715200\r\n\r\n";
    let status = answer_to_head(&a.base, head, Duration::from_secs(5)).await;
    assert_eq!(status.as_deref(), Some("HTTP/1.1 413 Payload Too Large"));
    let url = format!("{}/api/v1/execute?user_uuid=u-2", a.base);
    let big = json!({"code": "x".repeat(11 * 1024 * 1024)});
    let r = post(&url, &[("x-auth-token", "the-key")], big).await;
    assert_eq!(r.status(), 413);
    let body: Value = r.json().await.unwrap();
    assert!(body["detail"].is_string(), "seed 004's envelope: {body}");
}

/// `(x-kiln-node, x-kiln-via)` of a `bash_tool` call of workspace `ws`
/// sent to `base`.
async fn workspace_call(base: &str, ws: &str) -> (String, Option<String>) {
    let body = json!({"lang": "bash", "code": "ls", "tools": [],
                      "workspace_instance_id": "ab".repeat(32)});
    let url = format!("{base}/v1/exec/programmatic");
    let r = post(&url, &[("x-librechat-code-workspace-id", ws)], body).await;
    let header = |h: &str| Some(r.headers().get(h)?.to_str().ok()?.to_owned());
    (
        header("x-kiln-node").unwrap_or_default(),
        header("x-kiln-via"),
    )
}

#[tokio::test]
async fn an_attached_workspace_call_goes_to_the_node_that_holds_its_project() {
    let (store, _dir) = store().await;
    let a = node(&store, "node-a", None).await;
    let b = node(&store, "node-b", None).await;
    // the first call makes node A the project's owner
    assert_eq!(
        workspace_call(&a.base, "proj-1").await,
        ("node-a".into(), None)
    );
    // a later call reaching B is served by A (the project's files are there)
    assert_eq!(
        workspace_call(&b.base, "proj-1").await,
        ("node-a".into(), Some("node-b".into()))
    );
    // another workspace is not tied to A
    assert_eq!(workspace_call(&b.base, "proj-2").await.0, "node-b");
}

/// A node that keeps bridge sandboxes, their projects under `dir`.
async fn bridge_node(store: &Store, id: &str, dir: &std::path::Path) -> Node {
    let config = ApiConfig {
        rate_limits: RateRules::off(),
        ..ApiConfig::default()
    };
    let dir = dir.join(id);
    node_built(store, id, None, config, |state| {
        state.envs.projects = Some(
            kiln_exec::projects::Projects::new(kiln_exec::projects::ProjectsConfig {
                dir,
                budget_bytes: 1 << 20,
            })
            .unwrap(),
        );
        state.envs.sandboxes = Some(kiln_exec::sandboxes::Sandboxes::new(
            kiln_exec::sandboxes::SandboxesConfig {
                per_principal: 4,
                total: 8,
                idle_ttl: Duration::from_secs(600),
            },
        ));
    })
    .await
}

/// `(status, x-kiln-node, x-kiln-via, body)` of a bridge request.
async fn sandbox_call(
    method: reqwest::Method,
    url: String,
    body: Option<&'static str>,
) -> (u16, String, Option<String>, String) {
    let mut req = client().request(method, url).header("user-id", "alice");
    if let Some(b) = body {
        req = req.body(b);
    }
    let r = req.send().await.unwrap();
    let header = |h: &str| Some(r.headers().get(h)?.to_str().ok()?.to_owned());
    let (node, via) = (
        header("x-kiln-node").unwrap_or_default(),
        header("x-kiln-via"),
    );
    (
        r.status().as_u16(),
        node,
        via,
        r.text().await.unwrap_or_default(),
    )
}

#[tokio::test]
async fn a_sandbox_made_on_one_node_is_used_and_deleted_through_another() {
    use reqwest::Method;
    let (store, dir) = store().await;
    let a = bridge_node(&store, "node-a", dir.path()).await;
    let b = bridge_node(&store, "node-b", dir.path()).await;
    let (st, node, _, body) =
        sandbox_call(Method::POST, format!("{}/v1/sandbox", a.base), None).await;
    assert_eq!((st, node.as_str()), (200, "node-a"), "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // written through B, read through A: one sandbox, on A
    let file = |base: &str| format!("{base}/v1/sandbox/{id}/file/workspace/notes.txt");
    let (st, node, via, body) = sandbox_call(Method::PUT, file(&b.base), Some("kept")).await;
    assert_eq!(
        (st, node.as_str(), via.as_deref()),
        (200, "node-a", Some("node-b")),
        "{body}"
    );
    let (st, node, via, body) = sandbox_call(Method::GET, file(&a.base), None).await;
    assert_eq!(
        (st, node.as_str(), via, body.as_str()),
        (200, "node-a", None, "kept")
    );
    let running = format!("{}/v1/sandbox/{id}/running", b.base);
    let (st, node, _, body) = sandbox_call(Method::GET, running.clone(), None).await;
    assert_eq!((st, node.as_str()), (200, "node-a"), "{body}");
    // deleted through B: gone on A, and no node records it any more
    let (st, node, _, _) =
        sandbox_call(Method::DELETE, format!("{}/v1/sandbox/{id}", b.base), None).await;
    assert_eq!((st, node.as_str()), (204, "node-a"));
    let (st, node, _, _) = sandbox_call(Method::GET, running, None).await;
    assert_eq!((st, node.as_str()), (404, "node-b"));
    assert!(store.owner("sandbox", &id).await.unwrap().is_none());
}
