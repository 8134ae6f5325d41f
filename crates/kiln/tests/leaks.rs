//! No-leak soak: thousands of executions through the real server, most of
//! them trivial and a few hundred stopped the hard way (wall-time kills,
//! memory bombs, stdout floods, clients that hang up mid-run), 16 in flight
//! at once. Afterwards nothing may be left: no process under the server's
//! jail uids, no child process of ours (helpers, zombies), no run cgroup of
//! this process under the sandbox's `kiln/` parents, no workspace in the
//! slot areas, no extra open file descriptors beyond a small pool slack, no
//! new mount; the server still answers; and once it is stopped, none of its
//! mounts or loop devices remain.
//!
//! `KILN_SOAK_RUNS` overrides the number of executions (default
//! [`DEFAULT_RUNS`]). Needs root like every server test; under CI a missing
//! capability fails it (see `common::require_root`).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt as _;
use kiln_sandbox::CgroupSupport;
use serde_json::{Value, json};

/// Executions in the default soak.
const DEFAULT_RUNS: usize = 2000;
/// Requests in flight at once.
const IN_FLIGHT: usize = 16;
/// Open descriptors the process may hold beyond its level before the soak:
/// the SQLite pool (up to 8 connections, 2 files each) may have grown, and
/// the tokio runtime may keep an extra handle or two.
const FD_SLACK: usize = 24;
/// How long asynchronous cleanup may take after the last response.
const SETTLE: Duration = Duration::from_secs(15);

/// One kind of execution in the mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Job {
    BashTrue,
    PyPrint,
    /// `sleep 30` with a 300 ms timeout: killed at the wall-time limit.
    Timeout,
    /// Allocates until the memory cgroup kills it.
    MemoryBomb,
    /// Floods stdout past the cap.
    OutputFlood,
    /// `sleep 30` whose client hangs up after 400 ms.
    Disconnect,
}

/// Every 20 runs: 4 stopped the hard way, the rest split bash / python.
fn job(i: usize) -> Job {
    match i % 20 {
        0 => Job::Timeout,
        5 => Job::MemoryBomb,
        10 => Job::OutputFlood,
        15 => Job::Disconnect,
        n if n % 2 == 1 => Job::BashTrue,
        _ => Job::PyPrint,
    }
}

/// Send job `i` and check its answer; `Err` describes an unexpected one.
async fn run_job(client: &reqwest::Client, url: &str, i: usize) -> Result<(), String> {
    let job = job(i);
    let body = match job {
        Job::BashTrue => json!({"lang": "bash", "code": "true"}),
        Job::PyPrint => json!({"lang": "py", "code": format!("print('ok', {i})")}),
        Job::Timeout => json!({"lang": "bash", "code": "sleep 30", "timeout": 300}),
        Job::MemoryBomb => json!({"lang": "py",
            "code": "chunks = []\nwhile True:\n    chunks.append(bytearray(8 * 1024 * 1024))"}),
        Job::OutputFlood => json!({"lang": "bash", "code": "yes kiln-soak"}),
        Job::Disconnect => json!({"lang": "bash", "code": "sleep 30; echo late"}),
    };
    let mut req = client.post(url).json(&body);
    if job == Job::Disconnect {
        req = req.timeout(Duration::from_millis(400));
    }
    let resp = match req.send().await {
        Err(e) if job == Job::Disconnect && e.is_timeout() => return Ok(()),
        Err(e) => return Err(format!("{job:?} #{i}: request failed: {e}")),
        Ok(r) => r,
    };
    let status = resp.status().as_u16();
    let v: Value = match resp.json().await {
        Err(e) if job == Job::Disconnect && e.is_timeout() => return Ok(()),
        Err(e) => {
            return Err(format!(
                "{job:?} #{i}: {status} with an unreadable body: {e}"
            ));
        }
        Ok(v) => v,
    };
    let ok = status == 200
        && match job {
            Job::BashTrue => v["code"] == 0 && v["status"].is_null(),
            Job::PyPrint => v["stdout"] == format!("ok {i}\n"),
            Job::Timeout => v["status"] == "TO",
            Job::MemoryBomb => v["status"] == "SG" && v["message"] == "Out of memory",
            Job::OutputFlood => v["status"] == "OL",
            Job::Disconnect => false,
        };
    if ok {
        Ok(())
    } else {
        Err(format!("{job:?} #{i}: {status} {v}"))
    }
}

/// Open descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(usize::MAX)
}

/// The targets of this process's open descriptors (for failure messages).
fn fd_targets() -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
    {
        let target = std::fs::read_link(e.path())
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "?".into());
        // `socket:[123]` → `socket`, so the summary groups them.
        let kind = target.split(":[").next().unwrap_or(&target).to_owned();
        *out.entry(kind).or_insert(0) += 1;
    }
    out
}

/// `(mount point, full line without the mount ids)` of every mount we see.
fn mounts() -> BTreeSet<(String, String)> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let point = fields.get(4)?;
            Some(((*point).to_owned(), fields[2..].join(" ")))
        })
        .collect()
}

/// Mounts that appeared since `before`, except those inside another test
/// server's data directory (other test processes may run beside this one).
fn new_mounts(before: &BTreeSet<(String, String)>, own_dir: &Path) -> Vec<String> {
    let own = own_dir.display().to_string();
    let tmp = std::env::temp_dir()
        .join("kiln-test-")
        .display()
        .to_string();
    mounts()
        .difference(before)
        .filter(|(point, _)| point.starts_with(&own) || !point.starts_with(&tmp))
        .map(|(_, line)| line.clone())
        .collect()
}

/// The `kiln/` parent cgroups the server's sandbox creates run groups in
/// (the same detection the sandbox does).
fn cgroup_parents() -> Vec<PathBuf> {
    match kiln_sandbox::probe_host().cgroup {
        CgroupSupport::V1 {
            memory,
            pids,
            cpu,
            cpuacct,
        } => {
            let mut p: Vec<PathBuf> = [Some(memory), Some(pids), cpu, cpuacct]
                .into_iter()
                .flatten()
                .map(|p| p.join("kiln"))
                .collect();
            // cpu and cpuacct mounted together are one hierarchy
            p.dedup();
            p
        }
        CgroupSupport::V2 { group, .. } => vec![group.join("kiln")],
        CgroupSupport::None => panic!("no usable cgroups: the server could not have started"),
    }
}

/// What runs of this process left in the cgroups: a run's own groups
/// (`<pid>-<slot>-<seq>`), and a slot's kept groups (`<pid>-u<slot's first
/// uid>.<n>`, kept while the server lives) with a process still in them.
fn run_cgroups(parents: &[PathBuf]) -> Vec<PathBuf> {
    let slot_group = format!("{}-u", std::process::id());
    own_cgroups(parents)
        .into_iter()
        .filter(|d| {
            let kept = d
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&slot_group));
            !kept
                || !std::fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .trim()
                    .is_empty()
        })
        .collect()
}

/// Every cgroup of this process under the kiln parents, the slots' kept
/// ones included.
fn own_cgroups(parents: &[PathBuf]) -> Vec<PathBuf> {
    let prefix = format!("{}-", std::process::id());
    parents
        .iter()
        .flat_map(|p| std::fs::read_dir(p).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// Jail helpers left: children of this process, of its jail launcher and
/// of its fork-server (zombies included), but not the launcher and the
/// fork-server themselves, which live as long as the server.
fn children() -> Vec<String> {
    // (pid, "pid (comm) state", ppid, cmdline) of every process
    let mut procs = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may hold spaces, so split after ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let (state, ppid) = (f.next(), f.next());
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        procs.push((
            e.file_name().to_string_lossy().into_owned(),
            format!("{head}) {}", state.unwrap_or("?")),
            ppid.unwrap_or("").to_owned(),
            cmdline,
        ));
    }
    let long_lived =
        |cmdline: &[u8]| cmdline == b"kiln\0__zygote\0" || cmdline == b"kiln\0__launcher\0";
    let me = std::process::id().to_string();
    // ours, and those of our launcher and fork-server (whose forks are the
    // warm py jails: drained, none may be left)
    let mut parents = vec![me.clone()];
    parents.extend(
        procs
            .iter()
            .filter(|(_, _, ppid, cmdline)| *ppid == me && long_lived(cmdline))
            .map(|(pid, ..)| pid.clone()),
    );
    procs
        .into_iter()
        .filter(|(_, _, ppid, cmdline)| parents.contains(ppid) && !long_lived(cmdline))
        .map(|(_, desc, ..)| desc)
        .collect()
}

/// Workspaces left in the slots' areas (`<data>/slots/<i>/`; ext4's
/// `lost+found` is not one, nor a slot's kept-jail workspace `wk` while
/// it is empty: it stays, emptied, for the slot's next kept jail).
fn workspaces(data: &Path) -> Vec<PathBuf> {
    let empty = |p: &Path| std::fs::read_dir(p).is_ok_and(|mut d| d.next().is_none());
    std::fs::read_dir(data.join("slots"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|area| area.path().is_dir())
        .flat_map(|area| {
            std::fs::read_dir(area.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter(|e| e.file_name() != "lost+found")
        .filter(|e| !(e.file_name() == "wk" && empty(&e.path())))
        .map(|e| e.path())
        .collect()
}

/// Mount points at or below `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    mounts()
        .into_iter()
        .filter(|(point, _)| point.starts_with(&dir))
        .map(|(point, _)| point)
        .collect()
}

/// Loop devices whose backing file lies below `dir`.
fn loop_devices_under(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            backing
                .trim()
                .starts_with(&dir)
                .then(|| format!("{}: {}", e.file_name().to_string_lossy(), backing.trim()))
        })
        .collect()
}

/// Poll `f` until it returns an empty list or `limit` passes; the last list.
async fn settle<T>(limit: Duration, mut f: impl FnMut() -> Vec<T>) -> Vec<T> {
    let t = Instant::now();
    loop {
        let left = f();
        if left.is_empty() || t.elapsed() >= limit {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Drive `runs` jobs starting at `first`, `IN_FLIGHT` at a time, with a
/// fresh client dropped at the end; unexpected answers, first ones first.
async fn drive(url: &str, first: usize, runs: usize) -> Vec<String> {
    kiln_egress::install_crypto_provider();
    let client = Arc::new(
        reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("client"),
    );
    let mut errors: Vec<String> = futures::stream::iter(first..first + runs)
        .map(|i| {
            let client = client.clone();
            let url = url.to_owned();
            async move { run_job(&client, &url, i).await }
        })
        .buffer_unordered(IN_FLIGHT)
        .filter_map(|r| async move { r.err() })
        .collect()
        .await;
    errors.sort();
    errors
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_runs_including_killed_ones_leave_nothing_behind() {
    let _one = ONE_SOAK.lock().await;
    let runs: usize = std::env::var("KILN_SOAK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_RUNS);
    let s = server_with(|c| {
        c.max_concurrency = 8;
        c.memory_mb = 64;
        // thousands of runs from one address: the per-principal limit
        // would answer most of them 429
        c.rate_exec = "off".into();
    })
    .await;
    let url = format!("{}/exec", s.v1());
    let uids = s.uid_range.clone();
    let parents = cgroup_parents();

    // Warm up every path (the fork-server, pool connections, lazily opened
    // files), then take the baseline once the warm-up client's connections
    // are closed.
    assert!(
        s.wait_warm("py", Duration::from_secs(90)).await,
        "warm pool with py"
    );
    let warm = drive(&url, 0, 40).await;
    assert!(warm.is_empty(), "warm-up failed: {warm:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let baseline = Baseline::now();

    // While the soak runs, sample what the checks below look at: each must
    // be seen non-empty at some point, or the checks would look in the
    // wrong place and pass vacuously.
    let sampling = tokio_util::sync::CancellationToken::new();
    let sampler = tokio::spawn({
        let (stop, parents, data, uids) = (
            sampling.clone(),
            parents.clone(),
            s.data_dir.path().to_owned(),
            uids.clone(),
        );
        async move {
            let mut peak = [0usize; 3];
            while !stop.is_cancelled() {
                let now = [
                    run_cgroups(&parents).len(),
                    workspaces(&data).len(),
                    processes_in(uids.clone()).len(),
                ];
                for (p, n) in peak.iter_mut().zip(now) {
                    *p = (*p).max(n);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            peak
        }
    });

    let t = Instant::now();
    let errors = drive(&url, 40, runs).await;
    let elapsed = t.elapsed();
    sampling.cancel();
    let [peak_cgroups, peak_workspaces, peak_procs] = sampler.await.expect("sampler");
    println!(
        "soak: at peak {peak_cgroups} run cgroups, {peak_workspaces} workspaces, \
         {peak_procs} jail processes"
    );
    assert!(
        peak_cgroups > 0 && peak_workspaces > 0 && peak_procs > 0,
        "the leak checks never saw a run's cgroups ({peak_cgroups}), workspace \
         ({peak_workspaces}) or processes ({peak_procs}): they look in the wrong place"
    );
    let killed = (40..40 + runs)
        .filter(|&i| !matches!(job(i), Job::BashTrue | Job::PyPrint))
        .count();
    println!(
        "soak: {runs} executions ({killed} stopped: timeouts, memory bombs, floods, disconnects) \
         in {:.1} s = {:.1} executions/s, {IN_FLIGHT} in flight",
        elapsed.as_secs_f64(),
        runs as f64 / elapsed.as_secs_f64()
    );
    assert!(
        errors.is_empty(),
        "{} unexpected answers, first: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );

    assert_nothing_left(s, &parents, &baseline).await;
}

/// What the process holds before a soak.
struct Baseline {
    fds: usize,
    fd_kinds: BTreeMap<String, usize>,
    mounts: BTreeSet<(String, String)>,
}

impl Baseline {
    fn now() -> Baseline {
        Baseline {
            fds: open_fds(),
            fd_kinds: fd_targets(),
            mounts: mounts(),
        }
    }
}

/// After a soak: nothing of any run is left, the server still serves, and
/// a graceful stop takes down everything it set up.
async fn assert_nothing_left(s: kiln::testing::TestServer, parents: &[PathBuf], before: &Baseline) {
    let uids = s.uid_range.clone();
    let (fds_before, fd_kinds_before, mounts_before) =
        (before.fds, &before.fd_kinds, &before.mounts);
    // Parked warm jails stay by design; drained, nothing may be left.
    let pool = s
        .warm
        .clone()
        .expect("the default configuration has a warm pool");
    pool.shutdown().await;
    let procs = settle(SETTLE, || jail_processes_of(&s)).await;
    assert!(procs.is_empty(), "jail processes left: {procs:?}");
    let kids = settle(SETTLE, children).await;
    assert!(kids.is_empty(), "child processes left: {kids:?}");
    let groups = settle(SETTLE, || run_cgroups(parents)).await;
    assert!(groups.is_empty(), "run cgroups left: {groups:?}");
    let data = s.data_dir.path().to_owned();
    let ws = settle(SETTLE, || workspaces(&data)).await;
    assert!(ws.is_empty(), "workspaces left: {ws:?}");
    let extra_fds = settle(SETTLE, || {
        let n = open_fds();
        if n > fds_before + FD_SLACK {
            vec![n]
        } else {
            Vec::new()
        }
    })
    .await;
    assert!(
        extra_fds.is_empty(),
        "open descriptors grew from {fds_before} to {:?}: before {fd_kinds_before:?}, after {:?}",
        extra_fds,
        fd_targets()
    );
    let mounted = new_mounts(mounts_before, s.data_dir.path());
    assert!(mounted.is_empty(), "new mounts: {mounted:?}");
    println!(
        "soak: after the soak {} fds (before {fds_before}), no process, cgroup, workspace or mount left",
        open_fds()
    );

    // still serving
    let r = run(&s, "py", "print('still here')").await;
    assert_eq!(r["stdout"], "still here\n", "{r}");
    let health = client()
        .get(format!("{}/health", s.v1()))
        .send()
        .await
        .expect("health");
    assert_eq!(health.status(), 200);

    // and a graceful stop takes down what the server set up (slot areas)
    s.stop().await.expect("graceful stop");
    let left = settle(SETTLE, || mounts_under(&data)).await;
    assert!(left.is_empty(), "mounts left after stop: {left:?}");
    let loops = settle(SETTLE, || loop_devices_under(&data)).await;
    assert!(loops.is_empty(), "loop devices left after stop: {loops:?}");
    let procs = settle(SETTLE, || processes_in(uids.clone())).await;
    assert!(
        procs.is_empty(),
        "jail processes left after stop: {procs:?}"
    );
    let groups = settle(SETTLE, || own_cgroups(parents)).await;
    assert!(groups.is_empty(), "cgroups left after stop: {groups:?}");
}

/// The soaks share this process's view (its children, its run cgroups):
/// one at a time.
static ONE_SOAK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Half-sent connections the server did not close within 10 s.
static HALF_SENT_LEFT_OPEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Runs in the soak under attack.
const DEFAULT_ATTACK_RUNS: usize = 1000;

/// One kind of request in the soak under attack: attacks from one user,
/// checked work from the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mixed {
    /// A 1,000-level directory chain for the host's cleanup to remove (deeper
    /// chains cost the program O(depth²) in renames; `security::cleanup` builds 40,000).
    DeepTree,
    /// 50 `clone(CLONE_PARENT)`: refused, none may appear anywhere.
    CloneParent,
    /// Every inotify instance the jail can get, held for half a second.
    InotifyHog,
    /// 64 spinning processes, each in its own session, until the wall time.
    CpuSpin,
    /// Sparse outputs far past the run's output total.
    SparseFlood,
    /// Double-forked sleepers in their own sessions, left running at exit.
    Orphans,
    /// Links to host paths in the workspace, for the walker to follow.
    LinkFarm,
    /// Connections that send half a request head, then a run.
    HalfSent,
    /// A 4 MiB field of small values the server does not read.
    JunkBody,
    /// Another user's upload, read back by a run.
    UploadRead,
    /// Another user's ordinary run.
    Normal,
}

fn mixed(i: usize) -> Mixed {
    match i % 20 {
        0 => Mixed::DeepTree,
        1 => Mixed::CloneParent,
        2 => Mixed::InotifyHog,
        3 => Mixed::CpuSpin,
        4 => Mixed::SparseFlood,
        5 => Mixed::Orphans,
        6 => Mixed::LinkFarm,
        7 => Mixed::HalfSent,
        8 => Mixed::JunkBody,
        9 | 14 => Mixed::UploadRead,
        _ => Mixed::Normal,
    }
}

const CLONE_PARENT: &str = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
made = refused = 0
for _ in range(50):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(56), ctypes.c_long(0x8000 | 17), *[ctypes.c_long(0)] * 4)
    if r == 0:
        os._exit(0)
    if r > 0:
        made += 1
    elif ctypes.get_errno() == errno.EPERM:
        refused += 1
print('made', made, 'refused', refused)
"#;

const INOTIFY_HOG: &str = r#"
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while n < 100000 and libc.inotify_init1(0) >= 0:
    n += 1
print('held', n > 0)
time.sleep(0.5)
"#;

const ORPHANS: &str = r#"
import os, time
for _ in range(8):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(60)
        os._exit(0)
    os.wait()
print('spawned')
"#;

const LINK_FARM: &str = r#"
import os
for i, target in enumerate(['/etc/shadow', '/proc/1/root', '/', '/root', '/var/lib', '/proc/self/cwd']):
    os.symlink(target, 'link%d' % i)
    os.makedirs('d%d' % i, exist_ok=True)
    os.symlink(target, 'd%d/inner' % i)
print('linked')
"#;

/// Send request `i` of the mixed soak; `Err` describes an unexpected answer.
async fn run_mixed(
    client: &reqwest::Client,
    base: &str,
    port: u16,
    i: usize,
) -> Result<(), String> {
    let kind = mixed(i);
    let url = format!("{base}/exec");
    let attacker = json!("attacker");
    let (body, user): (Value, Value) = match kind {
        Mixed::DeepTree => (
            json!({"lang": "py", "code": "import os\nos.mkdir('a')\nfor _ in range(1000):\n    \
                   os.mkdir('b')\n    os.rename('a', 'b/a')\n    os.rename('b', 'a')\nprint('built')"}),
            attacker,
        ),
        Mixed::CloneParent => (json!({"lang": "py", "code": CLONE_PARENT}), attacker),
        Mixed::InotifyHog => (json!({"lang": "py", "code": INOTIFY_HOG}), attacker),
        Mixed::CpuSpin => (
            json!({"lang": "bash", "timeout": 500,
                   "code": "for i in $(seq 64); do setsid sh -c 'while :; do :; done' & done; wait"}),
            attacker,
        ),
        Mixed::SparseFlood => (
            json!({"lang": "py", "code": "for i in range(8):\n    \
                   open('/mnt/data/s%d.csv' % i, 'wb').truncate(1 << 20)\nprint('flooded')"}),
            attacker,
        ),
        Mixed::Orphans => (json!({"lang": "py", "code": ORPHANS}), attacker),
        Mixed::LinkFarm => (json!({"lang": "py", "code": LINK_FARM}), attacker),
        Mixed::HalfSent => {
            // left open: the server must close them itself
            for _ in 0..5 {
                if let Ok(mut c) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                    use tokio::io::AsyncWriteExt as _;
                    let _ = c
                        .write_all(b"POST /v1/exec HTTP/1.1\r\nHost: soak\r\n")
                        .await;
                    // wait for the server to close it; count those it never does
                    tokio::spawn(async move {
                        use tokio::io::AsyncReadExt as _;
                        let mut buf = [0u8; 512];
                        let closed = tokio::time::timeout(Duration::from_secs(10), async {
                            while c.read(&mut buf).await.is_ok_and(|n| n > 0) {}
                        })
                        .await;
                        if closed.is_err() {
                            HALF_SENT_LEFT_OPEN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    });
                }
            }
            (
                json!({"lang": "py", "code": format!("print('ok', {i})")}),
                json!(format!("user-{}", i % 7)),
            )
        }
        Mixed::JunkBody => (
            json!({"lang": "py", "code": format!("print('ok', {i})"),
                   "padding": vec![0u8; 2 * 1024 * 1024]}),
            json!(format!("user-{}", i % 7)),
        ),
        Mixed::UploadRead => {
            let user = format!("reader-{}", i % 5);
            let content = format!("line {i}\n").repeat(100);
            let form = reqwest::multipart::Form::new()
                .text("kind", "user")
                .text("id", user.clone())
                .part(
                    "file",
                    reqwest::multipart::Part::bytes(content.clone().into_bytes())
                        .file_name("data.txt"),
                );
            let up: Value = client
                .post(format!("{base}/upload"))
                .header("User-Id", &user)
                .multipart(form)
                .send()
                .await
                .map_err(|e| format!("{kind:?} #{i}: upload: {e}"))?
                .json()
                .await
                .map_err(|e| format!("{kind:?} #{i}: upload body: {e}"))?;
            let file = json!({"id": up["files"][0]["fileId"], "name": "data.txt",
                "storage_session_id": up["storage_session_id"], "kind": "user",
                "resource_id": user});
            (
                json!({"lang": "py", "files": [file],
                       "code": "import hashlib\nprint(hashlib.sha256(open('/mnt/data/data.txt','rb').read()).hexdigest())"}),
                json!(user),
            )
        }
        Mixed::Normal => (
            json!({"lang": if i.is_multiple_of(2) { "py" } else { "bash" },
                   "code": if i.is_multiple_of(2) { format!("print('ok', {i})") } else { format!("echo ok {i}") }}),
            json!(format!("user-{}", i % 7)),
        ),
    };
    let mut body = body;
    body["user_id"] = user;
    let resp = client
        .post(&url)
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("{kind:?} #{i}: request failed: {e}"))?;
    let status = resp.status().as_u16();
    let v: Value = resp
        .json()
        .await
        .map_err(|e| format!("{kind:?} #{i}: {status} with an unreadable body: {e}"))?;
    let new_files: Vec<&Value> = v["files"]
        .as_array()
        .map(|a| a.iter().filter(|f| f["inherited"] != true).collect())
        .unwrap_or_default();
    let ok = status == 200
        && match kind {
            Mixed::DeepTree => v["stdout"] == "built\n",
            Mixed::CloneParent => v["stdout"] == "made 0 refused 50\n" && v["status"].is_null(),
            Mixed::InotifyHog => v["stdout"] == "held True\n",
            Mixed::CpuSpin => v["status"] == "TO",
            Mixed::SparseFlood => {
                v["stdout"] == "flooded\n"
                    && v["artifact_truncation"]["reasons"]["storage"] == 6
                    && new_files.len() == 2
            }
            Mixed::Orphans => v["stdout"] == "spawned\n" && v["status"].is_null(),
            // links are never outputs, nor followed
            Mixed::LinkFarm => {
                v["stdout"] == "linked\n"
                    && new_files.iter().all(|f| {
                        let name = f["name"].as_str().unwrap_or_default();
                        !name.contains("link") && !name.ends_with("inner")
                    })
            }
            Mixed::HalfSent | Mixed::JunkBody => v["stdout"] == format!("ok {i}\n"),
            Mixed::UploadRead => {
                use sha2::Digest as _;
                let content = format!("line {i}\n").repeat(100);
                v["stdout"] == format!("{}\n", hex::encode(sha2::Sha256::digest(content)))
            }
            Mixed::Normal => v["stdout"] == format!("ok {i}\n"),
        };
    if ok {
        Ok(())
    } else {
        Err(format!("{kind:?} #{i}: {status} {v}"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_runs_mixing_attacks_with_other_users_leave_nothing_behind() {
    let _one = ONE_SOAK.lock().await;
    let runs: usize = std::env::var("KILN_ATTACK_SOAK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_ATTACK_RUNS);
    let s = server_with(|c| {
        c.max_concurrency = 6;
        c.memory_mb = 128;
        c.max_run_output_mb = 2;
        c.http_header_timeout_secs = 2;
        // the attacker sends ~450 runs in a minute or two: this soak
        // measures leaks, not limits
        c.rate_exec = "off".into();
        c.rate_upload = "off".into();
    })
    .await;
    let base = s.v1();
    let port: u16 = s.base_url.rsplit(':').next().unwrap().parse().unwrap();
    let parents = cgroup_parents();
    assert!(
        s.wait_warm("py", Duration::from_secs(90)).await,
        "warm pool with py"
    );
    kiln_egress::install_crypto_provider();
    // the server drops a connection idle for its 2 s header timeout: a
    // client keeping one idle longer races that close and can send into a
    // closed socket ("error sending request"), as any client would; keep
    // pooled connections for less than the server does
    let soak_client = || {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .pool_idle_timeout(Duration::from_secs(1))
            .build()
            .expect("client")
    };
    let client = soak_client();
    // warm every path once, then take the baseline
    for i in 0..20 {
        if let Err(e) = run_mixed(&client, &base, port, i).await {
            panic!("warm-up: {e}");
        }
    }
    drop(client);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let baseline = Baseline::now();

    let t = Instant::now();
    let client = Arc::new(soak_client());
    let mut errors: Vec<String> = futures::stream::iter(20..20 + runs)
        .map(|i| {
            let (client, base) = (client.clone(), base.clone());
            async move { run_mixed(&client, &base, port, i).await }
        })
        .buffer_unordered(IN_FLIGHT)
        .filter_map(|r| async move { r.err() })
        .collect()
        .await;
    drop(client);
    errors.sort();
    let elapsed = t.elapsed();
    let attacks = (20..20 + runs)
        .filter(|&i| !matches!(mixed(i), Mixed::Normal | Mixed::UploadRead))
        .count();
    println!(
        "attack soak: {runs} requests ({attacks} attacks, the rest other users' checked work) \
         in {:.1} s, {IN_FLIGHT} in flight",
        elapsed.as_secs_f64()
    );
    assert!(
        errors.is_empty(),
        "{} unexpected answers, first: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    // the half-sent connections are the server's to close (2 s head timeout)
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        HALF_SENT_LEFT_OPEN.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "half-sent connections the server kept open"
    );
    assert_nothing_left(s, &parents, &baseline).await;
}
