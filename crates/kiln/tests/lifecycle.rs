//! Server lifecycle over HTTP: a client that disconnects cancels its run,
//! shutdown lets running executions finish within the grace period and
//! kills the rest, and nothing (processes, workspaces) is left behind.
//! These tests look at host-wide state, so they run one at a time.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

async fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    f()
}

fn workspaces(s: &kiln::testing::TestServer) -> usize {
    workspaces_in(s.data_dir.path())
}

/// Workspaces left in the slots' areas (`<data>/slots/<i>/`; ext4's
/// `lost+found` is not one, nor a slot's kept-jail workspace `wk` while
/// it is empty: it stays, emptied, for the slot's next kept jail).
fn workspaces_in(data: &std::path::Path) -> usize {
    let slots = std::fs::read_dir(data.join("slots")).expect("slots dir exists");
    let empty = |p: &std::path::Path| std::fs::read_dir(p).is_ok_and(|mut d| d.next().is_none());
    slots
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|area| {
            std::fs::read_dir(area.path())
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.file_name() != "lost+found")
                        .filter(|e| !(e.file_name() == "wk" && empty(&e.path())))
                        .count()
                })
                .unwrap_or(0)
        })
        .sum()
}

/// Parked warm jails keep processes and workspaces by design: tear them
/// down, so what is left can only be the run's.
async fn drain_warm_pool(s: &kiln::testing::TestServer) {
    if let Some(pool) = &s.warm {
        pool.shutdown().await;
    }
}

#[tokio::test]
async fn a_client_that_disconnects_cancels_its_run() {
    let _g = SERIAL.lock().await;
    let s = server().await;
    kiln_egress::install_crypto_provider();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let r = c
        .post(format!("{}/exec", s.v1()))
        .json(&json!({"lang":"bash","code":"sleep 25 & sleep 25; echo done"}))
        .send()
        .await;
    assert!(r.is_err(), "request should time out client-side");
    drain_warm_pool(&s).await;
    assert!(
        wait_until(Duration::from_secs(10), || jail_processes_of(&s).is_empty()).await,
        "jail processes survive the disconnect: {:?}",
        jail_processes_of(&s)
    );
    assert!(
        wait_until(Duration::from_secs(5), || workspaces(&s) == 0).await,
        "workspace left behind"
    );
    // the server is still healthy
    let r = run(&s, "py", "print('still here')").await;
    assert_eq!(r["stdout"], "still here\n");
}

#[tokio::test]
async fn double_forked_daemons_die_with_the_run() {
    let _g = SERIAL.lock().await;
    let s = server().await;
    let r = run(
        &s,
        "bash",
        "(setsid sleep 300 &) ; nohup sleep 300 >/dev/null 2>&1 & disown; echo parent-done",
    )
    .await;
    assert_eq!(r["stdout"], "parent-done\n");
    drain_warm_pool(&s).await;
    assert!(
        wait_until(Duration::from_secs(5), || jail_processes_of(&s).is_empty()).await,
        "daemonised children survived: {:?}",
        jail_processes_of(&s)
    );
}

#[tokio::test]
async fn shutdown_finishes_short_runs_and_kills_long_ones() {
    let _g = SERIAL.lock().await;
    let s = server_with(|c| c.shutdown_grace_secs = 2).await;
    let url = s.v1();
    let short = tokio::spawn({
        let url = url.clone();
        async move {
            client()
                .post(format!("{url}/exec"))
                .json(&json!({"lang":"bash","code":"sleep 1; echo short-done"}))
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    });
    let long = tokio::spawn({
        let url = url.clone();
        async move {
            client()
                .post(format!("{url}/exec"))
                .json(&json!({"lang":"bash","code":"sleep 60; echo long-done"}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let t = Instant::now();
    let data_dir = s.data_dir.path().to_owned();
    let uids = s.uid_range.clone();
    let stop = tokio::spawn(s.stop());
    let short = short.await.unwrap();
    assert_eq!(short["stdout"], "short-done\n", "{short}");
    let long = long.await.unwrap();
    assert!(
        long.as_ref().map(|st| *st >= 500).unwrap_or(true),
        "long run was not stopped: {long:?}"
    );
    stop.await.unwrap().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "shutdown took {:?}",
        t.elapsed()
    );
    assert!(
        processes_in(uids.clone()).is_empty(),
        "{:?}",
        processes_in(uids)
    );
    // shutdown unmounts and removes the slots' areas altogether
    let areas = std::fs::read_dir(data_dir.join("slots"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(areas, 0, "slot areas left after shutdown");
}

#[tokio::test]
async fn new_executions_are_refused_during_shutdown() {
    let _g = SERIAL.lock().await;
    let s = server_with(|c| c.shutdown_grace_secs = 3).await;
    let url = s.v1();
    let long = tokio::spawn({
        let url = url.clone();
        async move {
            let _ = client()
                .post(format!("{url}/exec"))
                .json(&json!({"lang":"bash","code":"sleep 2"}))
                .send()
                .await;
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // the listener may already be closed; if it still answers, it must refuse
    if let Ok(r) = client()
        .post(format!("{url}/exec"))
        .json(&json!({"lang":"bash","code":"echo x"}))
        .send()
        .await
    {
        assert_eq!(r.status().as_u16(), 503);
    }
    long.await.unwrap();
    s.stop().await.unwrap();
}

/// `kiln serve` started as PID 1 of a new pid (and mount) namespace, as in
/// a container without an init.
struct Pid1Server {
    unshare: std::process::Child,
    url: String,
    log: std::path::PathBuf,
    _data: tempfile::TempDir,
}

impl Pid1Server {
    async fn start(pid1_init: bool) -> Pid1Server {
        require_root();
        let data = tempfile::Builder::new()
            .prefix("kiln-test-")
            .tempdir()
            .expect("data dir");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let log = data.path().join("server.log");
        let unshare = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc"])
            .arg(env!("CARGO_BIN_EXE_kiln"))
            .arg("serve")
            .env("KILN_LISTEN", format!("127.0.0.1:{port}"))
            .env("KILN_DATA_DIR", data.path().join("data"))
            .env("KILN_UID_BASE", fresh_uid_base().to_string())
            .env("KILN_MAX_CONCURRENCY", "4")
            .env("KILN_SHUTDOWN_GRACE_SECS", "2")
            .env("KILN_PID1_INIT", pid1_init.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&log).expect("log"))
            .stderr(std::process::Stdio::from(
                std::fs::File::options()
                    .append(true)
                    .open(&log)
                    .expect("log"),
            ))
            .spawn()
            .expect("unshare (util-linux)");
        let s = Pid1Server {
            unshare,
            url: format!("http://127.0.0.1:{port}/v1"),
            log,
            _data: data,
        };
        let up = wait_until(Duration::from_secs(90), || {
            std::process::Command::new("python3")
                .args([
                    "-c",
                    "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)",
                ])
                .arg(format!("{}/health", s.url))
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|st| st.success())
        })
        .await;
        assert!(up, "the PID-1 server did not come up: {}", s.log_text());
        s
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// (pid, state, cmdline) of every process below `unshare`.
    fn descendants(&self) -> Vec<(u32, char, String)> {
        let mut procs = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            let Some((_, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let mut f = rest.split_whitespace();
            let state = f.next().and_then(|s| s.chars().next()).unwrap_or('?');
            let ppid: u32 = f.next().and_then(|p| p.parse().ok()).unwrap_or(0);
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            procs.push((pid, ppid, state, cmd));
        }
        let mut below = vec![self.unshare.id()];
        let mut out = Vec::new();
        let mut grew = true;
        while grew {
            grew = false;
            for (pid, ppid, state, cmd) in &procs {
                if below.contains(ppid) && !below.contains(pid) {
                    below.push(*pid);
                    out.push((*pid, *state, cmd.clone()));
                    grew = true;
                }
            }
        }
        out
    }

    fn zombies(&self) -> Vec<(u32, char, String)> {
        self.descendants()
            .into_iter()
            .filter(|(_, state, _)| *state == 'Z')
            .collect()
    }
}

/// Requests whose client hangs up mid-run (bash and warm py), and runs
/// stopped at their wall time.
async fn dropped_and_killed_runs(url: &str) {
    kiln_egress::install_crypto_provider();
    let hang_up = reqwest::Client::builder()
        .timeout(Duration::from_millis(1200))
        .build()
        .unwrap();
    for i in 0..12 {
        let code = if i % 2 == 0 {
            json!({"lang": "bash", "code": "sleep 30 & sleep 30"})
        } else {
            json!({"lang": "py", "code": "import os, time\nos.fork()\ntime.sleep(30)"})
        };
        let r = hang_up.post(format!("{url}/exec")).json(&code).send().await;
        assert!(r.is_err(), "request {i} should have been cut short");
    }
    for _ in 0..2 {
        let r = client()
            .post(format!("{url}/exec"))
            .json(&json!({"lang": "bash", "code": "sleep 30", "timeout": 500}))
            .send()
            .await
            .expect("timeout run")
            .json::<serde_json::Value>()
            .await
            .expect("json");
        assert_eq!(r["status"], "TO", "{r}");
    }
}

#[tokio::test]
async fn as_pid_1_of_a_namespace_dropped_runs_end_gracefully_and_leave_no_zombie() {
    let _g = SERIAL.lock().await;
    // With the built-in init (the default) and with the server itself as
    // PID 1: at 7c2b7a6 every dropped request left its jail's init as a
    // zombie of a PID-1 server.
    for pid1_init in [false, true] {
        let mut s = Pid1Server::start(pid1_init).await;
        let pid1 = s
            .descendants()
            .first()
            .map(|(_, _, cmd)| cmd.clone())
            .unwrap_or_default();
        assert!(pid1.contains("serve"), "PID 1: {pid1:?}");
        dropped_and_killed_runs(&s.url).await;
        let clean = wait_until(Duration::from_secs(15), || s.zombies().is_empty()).await;
        assert!(
            clean,
            "pid1_init={pid1_init}: zombies {:?}\n{}",
            s.zombies(),
            s.log_text()
        );
        let r = client()
            .post(format!("{}/exec", s.url))
            .json(&json!({"lang": "py", "code": "print('still here')"}))
            .send()
            .await
            .expect("run")
            .json::<serde_json::Value>()
            .await
            .expect("json");
        assert_eq!(r["stdout"], "still here\n", "{r}");
        let log = s.log_text();
        assert!(
            !log.contains("did not stop within"),
            "pid1_init={pid1_init}: a helper had to be killed:\n{log}"
        );
        // SIGTERM to the namespace's PID 1: a graceful stop, nothing left.
        let first = s
            .descendants()
            .first()
            .map(|(pid, _, _)| *pid)
            .expect("pid 1");
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &first.to_string()])
            .status()
            .expect("kill");
        assert!(sent.success());
        let t = Instant::now();
        let status = loop {
            if let Some(st) = s.unshare.try_wait().expect("wait") {
                break st;
            }
            assert!(
                t.elapsed() < Duration::from_secs(40),
                "the server did not stop: {}",
                s.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            status.success(),
            "pid1_init={pid1_init}: {status}\n{}",
            s.log_text()
        );
    }
}
