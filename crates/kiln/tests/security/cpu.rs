//! CPU isolation: a run is held to its CPU quota (`cpus_per_run`, one core
//! by default) however many processes it starts, and all runs together to
//! every core but half a core, so other users' runs and the server keep
//! going.
//!
//! The bound: while one run spins 200 processes, sequential `print('hi')`
//! runs of another user keep a p95 latency under 750 ms. On this 2-core VM
//! they take ~100 ms without the attack (p95, warm py) and ~140 ms with it;
//! at 7c2b7a6, without a quota, the same attack pushed them to a p95 of
//! 1.8 s (p50 1.3 s).

use std::time::{Duration, Instant};

use crate::*;

/// 200 processes, each in its own session, spinning until the wall time.
const SPINNER: &str = "import os\nfor _ in range(200):\n    if os.fork() == 0:\n        \
                       os.setsid()\n        while True:\n            pass\nprint('spinning', \
                       flush=True)\nimport time\ntime.sleep(60)";

const BOUND: Duration = Duration::from_millis(750);

/// The CPU quotas (in thousandths of a core) of the run groups below
/// `parent` that hold more than `min_procs` processes, and the periods in
/// which they ran out of it.
fn busy_groups(parent: &std::path::Path, min_procs: usize) -> Vec<(u64, u64)> {
    let read =
        |d: &std::path::Path, f: &str| std::fs::read_to_string(d.join(f)).unwrap_or_default();
    std::fs::read_dir(parent)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|d| d.is_dir() && read(d, "cgroup.procs").lines().count() > min_procs)
        .map(|d| {
            // v1: cpu.cfs_quota_us; v2: cpu.max "quota period"
            let quota = read(&d, "cpu.cfs_quota_us")
                .trim()
                .parse::<u64>()
                .ok()
                .or_else(|| read(&d, "cpu.max").split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
            let throttled = read(&d, "cpu.stat")
                .lines()
                .find_map(|l| l.strip_prefix("nr_throttled "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            (quota / 100, throttled)
        })
        .collect()
}

#[tokio::test]
async fn a_run_spinning_200_processes_leaves_other_users_runs_fast() {
    let s = common::server_with(|c| {
        c.timeout_secs = 10;
        c.max_concurrency = 4;
    })
    .await;
    assert!(
        s.wait_warm("py", Duration::from_secs(120)).await,
        "warm pool with py"
    );
    let cpu_parent = match kiln_sandbox::probe_host().cgroup {
        kiln_sandbox::CgroupSupport::V1 { cpu: Some(cpu), .. } => Some(cpu.join("kiln")),
        kiln_sandbox::CgroupSupport::V2 { group, .. } => Some(group.join("kiln")),
        _ => None,
    };
    if std::env::var_os("CI").is_some() {
        assert!(
            cpu_parent.is_some(),
            "CI is set and the host has no cpu controller"
        );
    }
    let spin = {
        let url = s.v1();
        tokio::spawn(async move {
            common::client()
                .post(format!("{url}/exec"))
                .json(&serde_json::json!({"lang": "py", "code": SPINNER, "user_id": "attacker"}))
                .send()
                .await
                .expect("spinner request")
                .json::<serde_json::Value>()
                .await
                .expect("spinner answer")
        })
    };
    // Let the processes start and take what they can: the run's group
    // (the only one with more than a handful of processes) has a quota of
    // one core.
    tokio::time::sleep(Duration::from_secs(3)).await;
    if let Some(parent) = &cpu_parent {
        let groups = busy_groups(parent, 8);
        assert_eq!(groups.len(), 1, "the spinner's group: {groups:?}");
        assert_eq!(groups[0].0, 1000, "its quota: {groups:?}");
    }
    let mut times = Vec::new();
    for i in 0..20 {
        let t = Instant::now();
        let r = common::exec(
            &s,
            serde_json::json!({"lang": "py", "code": "print('hi')", "user_id": "other"}),
        )
        .await;
        times.push(t.elapsed());
        assert_eq!(r["stdout"], "hi\n", "run {i}: {r}");
    }
    let throttled = cpu_parent.as_deref().map(|p| busy_groups(p, 8));
    times.sort();
    let p95 = times[times.len() * 95 / 100 - 1];
    println!(
        "print('hi') beside 200 spinners: p50 {:?}, p95 {p95:?}, max {:?}; \
         spinner (quota, periods throttled): {throttled:?}",
        times[times.len() / 2],
        times[times.len() - 1]
    );
    // (Held to one core, its parent rarely gets to print before the end:
    // the 200 processes share the quota.)
    let spin = spin.await.expect("spinner");
    assert_eq!(spin["status"], "TO", "{spin}");
    assert!(p95 < BOUND, "p95 {p95:?} over {BOUND:?}: {times:?}");
    s.stop().await.expect("graceful stop");
}

/// A chain of processes, each spinning 1.5 s of CPU (under its own 2 s
/// RLIMIT_CPU) and then handing over to a fresh fork of itself: no process
/// ever meets its limit, the jail as a whole spins without end (while the
/// program itself waits, using none).
const FORK_CHAIN: &str = "import os, time\n\
def chain():\n    while True:\n        t = time.process_time()\n        \
while time.process_time() - t < 1.5:\n            pass\n        \
if os.fork() > 0:\n            os._exit(0)\n";

/// `POST /v1/exec/programmatic` as the attacker: the run's id and the body.
async fn programmatic(
    s: &kiln::testing::TestServer,
    body: serde_json::Value,
) -> (String, serde_json::Value) {
    let r = common::client()
        .post(format!("{}/exec/programmatic", s.v1()))
        .header("User-Id", "attacker")
        .json(&body)
        .send()
        .await
        .expect("send");
    let run = r
        .headers()
        .get("x-kiln-run-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (run, r.json().await.expect("json"))
}

/// The phase of run `id` (`running`, `finished`, ...).
async fn phase(s: &kiln::testing::TestServer, id: &str) -> String {
    let req = common::client()
        .get(format!("{}/runs/{id}", s.v1()))
        .header("User-Id", "attacker");
    common::json_of(req).await["status"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Finding 8 of issue 24: a fork chain evaded the per-process RLIMIT_CPU,
/// and a programmatic run paused for its tools kept computing with its
/// clock stopped (21 s of CPU under `cpu_secs = 2`). The CPU budget is the
/// whole jail's, read from its cgroup, paused or not.
#[tokio::test]
async fn a_fork_chain_and_a_paused_run_stay_within_the_jails_cpu_budget() {
    // a wall time far beyond the CPU budget: however slowly a loaded host
    // lets the chain compute, the budget ends it first
    let s = common::server_with(|c| {
        c.cpu_secs = 2;
        c.timeout_secs = 60;
    })
    .await;
    let host = kiln_sandbox::probe_host();
    if let Some(w) = kiln_sandbox::cpu_budget_warning(&host.cgroup, host.cgroup_limits) {
        // the host cannot enforce it, and says so (kiln doctor, start-up log)
        assert!(std::env::var_os("CI").is_none(), "CI host: {w}");
        println!("skipped: {w}");
        return;
    }
    // a one-shot run: stopped at its CPU budget, long before its wall time
    let code = format!("{FORK_CHAIN}if os.fork() == 0:\n    chain()\ntime.sleep(60)");
    let r = common::exec(
        &s,
        serde_json::json!({"lang": "py", "code": code, "user_id": "attacker"}),
    )
    .await;
    assert_eq!(r["status"], "TO", "{r}");
    assert_eq!(r["message"], "CPU time limit exceeded", "{r}");
    assert!(r["wall_time"].as_u64().unwrap_or(u64::MAX) < 50_000, "{r}");

    // a programmatic run: the chain computes while the run waits for its
    // tool; its CPU still counts, and the run ends
    let code = format!("{FORK_CHAIN}if os.fork() == 0:\n    chain()\nawait t(a=1)\nprint('done')");
    let tools = serde_json::json!([{"name": "t", "parameters": {"type": "object"}}]);
    let (run, paused) = programmatic(&s, serde_json::json!({"code": code, "tools": tools})).await;
    assert_eq!(paused["status"], "tool_call_required", "{paused}");
    // the wall clock is stopped: only the CPU budget can end the run now
    let t = Instant::now();
    while phase(&s, &run).await == "running" && t.elapsed() < Duration::from_secs(45) {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (_, done) = programmatic(
        &s,
        serde_json::json!({
            "continuation_token": paused["continuation_token"],
            "tool_results": [{"call_id": "call_001", "result": 1}],
        }),
    )
    .await;
    assert_eq!(
        done["status"], "error",
        "the run computed while paused: {done}"
    );
    assert_eq!(done["error"], "Time limit exceeded", "{done}");
    // the service is fine
    let r = common::run(&s, "py", "print('alive')").await;
    assert_eq!(r["stdout"], "alive\n", "{r}");
    s.stop().await.expect("graceful stop");
}
