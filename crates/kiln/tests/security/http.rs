//! Attacks on the HTTP layer itself, before any code runs: connections
//! that never finish their request, more connections than the server
//! should hold, and JSON bodies shaped to cost the server far more memory
//! than their size.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use crate::*;

/// Reads from `conn` until the server closes it (EOF or reset); what it
/// said first, if anything.
fn read_until_closed(mut conn: TcpStream, limit: Duration) -> Option<String> {
    conn.set_read_timeout(Some(limit)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => return Some(String::from_utf8_lossy(&got).into_owned()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return None;
            }
            // reset by the server: closed too
            Err(_) => return Some(String::from_utf8_lossy(&got).into_owned()),
        }
    }
}

#[tokio::test]
async fn half_sent_requests_are_closed_in_bounded_time_while_normal_requests_succeed() {
    let s = shared();
    let port = s.port;
    // 100 connections that stop in the middle of the head, before any
    // authentication could look at them
    let slow: Vec<TcpStream> = (0..100)
        .map(|i| {
            let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let part = if i % 2 == 0 {
                "POST /v1/exec HTTP/1.1\r\nHost: 127.0.0.1\r\n".to_owned()
            } else {
                "GET /v1/heal".to_owned()
            };
            c.write_all(part.as_bytes()).unwrap();
            c
        })
        .collect();
    // meanwhile the service answers everyone else
    let t = Instant::now();
    assert_healthy().await;
    let health = client()
        .get(format!("{}/health", s.v1))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // and every slow connection is closed within the head timeout (3 s on
    // the shared server) plus slack, none of them answered with a page
    let closed = tokio::task::spawn_blocking(move || {
        slow.into_iter()
            .map(|c| read_until_closed(c, Duration::from_secs(20)))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let open = closed.iter().filter(|c| c.is_none()).count();
    assert_eq!(open, 0, "{open} of 100 half-sent connections still open");
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "closing the half-sent connections took {:?}",
        t.elapsed()
    );
    for said in closed.into_iter().flatten() {
        assert!(
            said.is_empty() || said.starts_with("HTTP/1.1 408"),
            "a half-sent request got an answer: {said:?}"
        );
    }
    assert_healthy().await;
}

#[tokio::test]
async fn a_stalled_body_is_answered_408_and_closed() {
    let s = shared();
    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    // promises 1000 bytes, sends 20, then nothing
    c.write_all(
        b"POST /v1/exec HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
          Content-Length: 1000\r\n\r\n{\"lang\":\"py\",\"code\"",
    )
    .unwrap();
    let t = Instant::now();
    let said = tokio::task::spawn_blocking(move || read_until_closed(c, Duration::from_secs(20)))
        .await
        .unwrap()
        .expect("the stalled request's connection is closed");
    assert!(said.starts_with("HTTP/1.1 408"), "{said:?}");
    assert!(said.contains("Request body timed out"), "{said:?}");
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert_healthy().await;
}

/// A `kiln serve` of its own (a child process, so that its memory can be
/// read apart from the tests'), with `env` on top of a light setup.
struct Server {
    child: Child,
    addr: String,
    _data: tempfile::TempDir,
}

impl Server {
    fn start(env: &[(&str, &str)]) -> Server {
        let data = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data.path())
            .env("KILN_LOG_FORMAT", "json")
            .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
            .env("KILN_WARM_JAILS", "0")
            .env("KILN_PYTHON_ZYGOTE", "false")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line).unwrap_or_default();
                if v["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("kiln listening"))
                {
                    let _ = tx.send(v["fields"]["addr"].as_str().unwrap_or_default().to_owned());
                }
            }
        });
        let Ok(addr) = rx.recv_timeout(Duration::from_secs(60)) else {
            let _ = child.kill();
            panic!("the server never said it listens");
        };
        Server {
            child,
            addr,
            _data: data,
        }
    }

    /// Peak resident memory so far (`VmHWM`), bytes.
    fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kb * 1024
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(15) {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn connections_past_the_cap_are_shed_with_503_and_the_cap_frees_up() {
    common::require_root();
    let server = tokio::task::spawn_blocking(|| {
        Server::start(&[
            ("KILN_MAX_CONNECTIONS", "8"),
            ("KILN_HTTP_HEADER_TIMEOUT_SECS", "2"),
        ])
    })
    .await
    .unwrap();
    let addr = server.addr.clone();
    // eight connections that say nothing fill the cap
    let idle: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // the ninth is told to come back, at once, in the contract's envelope
    let addr2 = addr.clone();
    let shed = tokio::task::spawn_blocking(move || {
        let mut c = TcpStream::connect(&addr2).unwrap();
        c.write_all(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .unwrap();
        read_until_closed(c, Duration::from_secs(5))
    })
    .await
    .unwrap()
    .expect("the shed connection is closed");
    assert!(shed.starts_with("HTTP/1.1 503"), "{shed:?}");
    assert!(
        shed.to_ascii_lowercase().contains("retry-after: 1"),
        "{shed:?}"
    );
    assert!(shed.contains("\"retry_after_seconds\":1"), "{shed:?}");
    // the idle ones time out, and the server serves again
    let closed = tokio::task::spawn_blocking(move || {
        idle.into_iter()
            .map(|c| read_until_closed(c, Duration::from_secs(10)))
            .filter(Option::is_some)
            .count()
    })
    .await
    .unwrap();
    assert_eq!(
        closed, 8,
        "idle connections past the head timeout are closed"
    );
    let health = client()
        .get(format!("http://{addr}/v1/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

#[tokio::test]
async fn a_large_json_body_costs_a_small_multiple_of_its_size() {
    common::require_root();
    let server = tokio::task::spawn_blocking(|| Server::start(&[]))
        .await
        .unwrap();
    let url = format!("http://{}/v1/exec", server.addr);
    // warm the server's allocator and code paths with a normal run
    let r = client()
        .post(&url)
        .json(&json!({"lang": "py", "code": "print(6*7)", "user_id": "mem"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["stdout"], "42\n");
    let before = server.peak_rss();

    const MIB8: usize = 8 * 1024 * 1024;
    let zeros = |n: usize| "0,".repeat(n / 2 - 1) + "0";
    // small values in a field Kiln does not read: skipped unbuilt, the run goes on
    let unknown = format!(
        r#"{{"lang":"py","code":"print(1)","user_id":"mem","padding":[{}]}}"#,
        zeros(MIB8)
    );
    // small values where Kiln reads: refused once past the value budget
    let known = format!(
        r#"{{"lang":"py","code":"print(1)","user_id":"mem","args":[{}]}}"#,
        zeros(MIB8)
    );
    // one big string: the code itself
    let big_code = format!(
        r#"{{"lang":"py","code":"x = 1 # {}\nprint(x)","user_id":"mem"}}"#,
        "y".repeat(MIB8)
    );
    for (what, body, status) in [
        ("unknown field", unknown, 200),
        ("known field", known, 400),
        ("big code", big_code, 200),
    ] {
        assert!(body.len() >= MIB8, "{what}: {}", body.len());
        let r = client()
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{what}");
        let v: Value = r.json().await.unwrap();
        if status == 200 {
            assert_eq!(v["stdout"], "1\n", "{what}: {v}");
        } else {
            assert!(
                v["error"].as_str().unwrap().contains("values"),
                "{what}: {v}"
            );
        }
        let grew = server.peak_rss().saturating_sub(before);
        assert!(
            grew < 5 * MIB8 as u64,
            "{what}: an 8 MiB body raised the server's peak memory by {} MiB",
            grew / (1024 * 1024)
        );
    }
    // past the JSON limit (10 MiB by default): 413, refused from the length
    let r = client()
        .post(&url)
        .header("content-type", "application/json")
        .body(vec![b' '; 11 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
}

#[tokio::test]
async fn a_full_queue_refuses_new_runs_with_503_instead_of_holding_them() {
    common::require_root();
    let server = tokio::task::spawn_blocking(|| {
        Server::start(&[("KILN_MAX_CONCURRENCY", "1"), ("KILN_MAX_QUEUED_RUNS", "2")])
    })
    .await
    .unwrap();
    let url = format!("http://{}/v1/exec", server.addr);
    let sleeper = json!({"lang": "py", "code": "import time; time.sleep(3); print('slept')",
        "user_id": "queue"});
    // one runs, two wait: the queue is full
    let mut held = Vec::new();
    for _ in 0..3 {
        let req = client().post(&url).json(&sleeper).send();
        held.push(tokio::spawn(req));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let r = client()
        .post(&url)
        .json(&json!({"lang": "py", "code": "print(1)", "user_id": "other"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry), "{retry}");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "server_busy", "{v}");
    // the ones it took all finish
    for h in held {
        let r = h.await.unwrap().unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.json::<Value>().await.unwrap()["stdout"], "slept\n");
    }
    // and the queue takes runs again
    let r = client()
        .post(&url)
        .json(&json!({"lang": "py", "code": "print(2)", "user_id": "other"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.json::<Value>().await.unwrap()["stdout"], "2\n");
}

/// `POST /v1/exec` of `code` with `headers`.
async fn exec_with(headers: &[(&str, String)], code: &str) -> reqwest::Response {
    let mut req = client()
        .post(format!("{}/exec", shared().v1))
        .json(&json!({"lang": "py", "code": code}));
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    req.send().await.unwrap()
}

/// What a page on another site makes the operator's browser send: its
/// `Origin`, and a body a browser sends without a preflight (no
/// `Content-Type`, or a form's).
#[tokio::test]
async fn a_cross_site_page_cannot_run_code_store_files_or_start_kernels() {
    let s = shared();
    let evil = "http://evil.example";
    let refused = |r: reqwest::Response, what: &str| {
        let what = what.to_owned();
        async move {
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            assert_eq!(status, 403, "{what}: {body}");
            assert_eq!(body["error"], "cross_origin_refused", "{what}: {body}");
        }
    };
    // fetch(url, {method: "POST", mode: "no-cors", body: new Blob([json])})
    let blob = |path: &str, origin: &str, body: &'static str| {
        client()
            .post(format!("{}{path}", s.v1))
            .header("origin", origin)
            .body(body)
            .send()
    };
    let code = r#"{"lang":"py","code":"open('/mnt/data/pwned','w').write('x')"}"#;
    refused(blob("/exec", evil, code).await.unwrap(), "exec").await;
    // a form posting a file
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(b"x".to_vec()).file_name("a.txt"),
    );
    let r = client()
        .post(format!("{}/upload", s.v1))
        .header("origin", evil)
        .multipart(form)
        .send()
        .await
        .unwrap();
    refused(r, "upload").await;
    let r = blob("/sessions", evil, r#"{"lang":"py"}"#).await.unwrap();
    refused(r, "sessions").await;
    // a sandboxed frame or a no-referrer page sends Origin: null
    let r = blob("/exec", "null", code).await.unwrap();
    refused(r, "null origin").await;

    // the console's own requests are same-origin and run
    let own = format!("http://127.0.0.1:{}", s.port);
    let r = exec_with(&[("origin", own)], "print(6*7)").await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["stdout"], "42\n", "{v}");
    assert_healthy().await;
}

/// DNS rebinding: the attacker's name resolves to the keyless server, so
/// its page is same-origin with it; the `Host` it sends is the
/// attacker's name.
#[tokio::test]
async fn a_keyless_server_refuses_a_rebound_host_name_and_says_which_setting_allows_it() {
    let s = shared();
    for path in ["/admin/status", "/admin/runs"] {
        let r = client()
            .get(format!("{}{path}", s.v1))
            .header("host", format!("rebind.evil.example:{}", s.port))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 421, "{path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "unknown_host", "{body}");
        let msg = body["message"].as_str().unwrap();
        assert!(
            msg.contains("allowed_hosts") && msg.contains("KILN_ALLOWED_HOSTS"),
            "{msg}"
        );
    }
    let rebound = format!("rebind.evil.example:{}", s.port);
    let headers = [
        ("host", rebound.clone()),
        ("origin", format!("http://{rebound}")),
    ];
    assert_eq!(exec_with(&headers, "print(1)").await.status(), 421);
    // the names the server is reached under on this machine still work
    for host in [
        format!("localhost:{}", s.port),
        format!("127.0.0.1:{}", s.port),
    ] {
        let r = client()
            .get(format!("{}/admin/status", s.v1))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{host}");
    }
    assert_healthy().await;
}
