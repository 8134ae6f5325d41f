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
        ..AppState::new(
            store.clone(),
            exec.clone(),
            ApiConfig {
                rate_limits: RateRules::off(),
                ..ApiConfig::default()
            },
            health_info(),
        )
    };
    if let Some(rules) = rates {
        state.rates = Arc::new(RateLimits::shared(rules, store.clone()));
    }
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
