//! The attack suite: real programs sent through the public HTTP API, each
//! asserting that the attack fails *and* that the service stays healthy.
//!
//! All attacks hit one shared server (started once, on its own runtime), so
//! a successful denial of service by one case shows up in every other case
//! and in the health check each case ends with.

#[path = "../common/mod.rs"]
mod common;
#[path = "../../../kiln-egress/tests/support/fake_deepl.rs"]
mod fake_deepl;

mod bridge;
mod budgets;
mod cleanup;
mod cpu;
mod egress;
mod exhaustion;
mod files;
mod hardening;
mod http;
mod info;
mod isolation;
mod keptjail;
mod mcp;
mod network;
mod privilege;
mod processes;
mod sessions;
mod slotnet;
mod storage;
mod syscalls;

use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Base URL (`http://127.0.0.1:PORT/v1`) and port of the shared server.
pub struct Shared {
    pub v1: String,
    pub port: u16,
    pub uids: std::ops::Range<u32>,
    pub data_dir: std::path::PathBuf,
    pub warm: Option<kiln_sandbox::WarmPool>,
}

pub fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        common::require_root();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let s =
                    kiln::testing::TestServer::start(Path::new(env!("CARGO_BIN_EXE_kiln")), |c| {
                        c.uid_base = common::fresh_uid_base();
                        c.memory_mb = 128;
                        c.pids = 64;
                        c.timeout_secs = 5;
                        c.stdout_bytes = 64 * 1024;
                        c.tmp_mb = 16;
                        c.max_concurrency = 4;
                        // the kernel attacks (sessions, mcp) run side by side, two
                        // kernels each; 4 + 5 warm + 6 stays within the 16 uid slots
                        c.max_sessions = 6;
                        // short, so that the HTTP attacks see them fire
                        c.http_header_timeout_secs = 3;
                        c.http_body_idle_timeout_secs = 3;
                        c.max_run_output_mb = 20;
                    })
                    .await
                    .expect("start shared server");
                let port = s.base_url.rsplit(':').next().unwrap().parse().unwrap();
                tx.send(Shared {
                    v1: s.v1(),
                    port,
                    uids: s.uid_range.clone(),
                    data_dir: s.data_dir.path().to_owned(),
                    warm: s.warm.clone(),
                })
                .unwrap();
                // keep serving until the test process exits
                std::future::pending::<()>().await;
                drop(s);
            });
        });
        rx.recv().expect("shared server started")
    })
}

/// Waits until `py` runs in fork-server jails on the shared server (the
/// fork-server finished its preload), so an attack aimed at the fork-server
/// cannot pass by running cold.
pub async fn wait_for_warm_py() {
    let pool = shared()
        .warm
        .as_ref()
        .expect("the shared server has a warm pool");
    let t = Instant::now();
    while !pool.has_profile("py") {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "the fork-server never became ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The shared server's fork-server (a child of this process).
pub fn fork_server_pid() -> u32 {
    children_of(std::process::id())
        .into_iter()
        .map(|(pid, _)| pid)
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == b"kiln\0__zygote\0")
        })
        .expect("the shared server's fork-server")
}

/// The parent pid and state of a process.
pub fn stat_of(pid: u32) -> Option<(u32, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut f = rest.split_whitespace();
    let state = f.next()?.chars().next()?;
    Some((f.next()?.parse().ok()?, state))
}

/// Children of `pid` with their states (`Z`: zombie).
pub fn children_of(pid: u32) -> Vec<(u32, char)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| {
            let (ppid, state) = stat_of(p)?;
            (ppid == pid).then_some((p, state))
        })
        .collect()
}

/// Polls `f` until it holds or `limit` passes; whether it held.
pub async fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    f()
}

pub fn client() -> reqwest::Client {
    common::client()
}

/// Run code on the shared server; the run must complete (HTTP 200).
pub async fn attack(lang: &str, code: &str) -> Value {
    let s = shared();
    let r = client()
        .post(format!("{}/exec", s.v1))
        .json(&json!({"lang": lang, "code": code, "user_id": "attacker"}))
        .send()
        .await
        .expect("server unreachable during attack");
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "attack did not complete as a normal run: {v}");
    v
}

/// After an attack: the server still answers a trivial run quickly.
pub async fn assert_healthy() {
    let t = Instant::now();
    let r = attack("py", "print('alive')").await;
    assert_eq!(
        r["stdout"], "alive\n",
        "service unhealthy after attack: {r}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "service slow after attack: {:?}",
        t.elapsed()
    );
}

/// stdout of the run, as text.
pub fn out(r: &Value) -> &str {
    r["stdout"].as_str().unwrap_or("")
}

/// Python prelude: `denied(nr, *args)` prints DENIED when the syscall fails
/// with EPERM/EACCES/ENOSYS, else ALLOWED with the result and errno.
pub const PY_SYSCALL: &str = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *a):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in a])
    return r, ctypes.get_errno()
def denied(nr, *a):
    r, e = sc(nr, *a)
    print('DENIED' if r == -1 and e in (errno.EPERM, errno.EACCES, errno.ENOSYS) else 'ALLOWED r=%d errno=%d' % (r, e))
"#;
