//! Limits and teardown: wall time, orphans, memory, pids, CPU, file size,
//! output caps and cancellation. After each run no process of the slot's
//! uids may remain on the host.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kiln_core::{ExitStatus, Limits};
use kiln_sandbox::{RunResult, Sandbox, SandboxError, Slot};
use tokio_util::sync::CancellationToken;

const UID_BASE: u32 = 1_600_000_000;

async fn run_with(sb: &Sandbox, slot: &Slot, argv: &[&str], limits: Limits) -> RunResult {
    let ws = workspace(slot);
    sb.run(slot, request(&ws, argv, limits), CancellationToken::new())
        .await
        .expect("run")
}

fn assert_no_leftovers(slot: &Slot) {
    let left = host_pids_of_slot(slot);
    assert!(left.is_empty(), "processes of the slot survived: {left:?}");
}

#[tokio::test]
async fn wall_timeout_kills_the_program_and_its_double_forked_orphans() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let limits = Limits {
        wall_time: Duration::from_millis(1500),
        ..limits()
    };
    let started = Instant::now();
    // The subshell forks `setsid sleep`, then exits: a daemonised orphan in
    // its own session, re-parented to the jail's init.
    let r = run_with(
        sb,
        &slot,
        &[
            "/bin/sh",
            "-c",
            "(setsid sleep 300 &); echo started; sleep 100",
        ],
        limits,
    )
    .await;
    assert!(r.timed_out);
    assert_eq!(r.exit, ExitStatus::Signal(libc::SIGKILL));
    assert_eq!(stdout(&r), "started\n");
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "took {:?}",
        started.elapsed()
    );
    assert!(r.wall_time >= Duration::from_millis(1500));
    assert_no_leftovers(&slot);
}

#[tokio::test]
async fn orphans_die_when_the_program_exits() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let started = Instant::now();
    let r = run_with(
        sb,
        &slot,
        &[
            "/bin/sh",
            "-c",
            "(setsid sh -c 'sleep 300' &); (nohup sleep 300 >/dev/null 2>&1 &); echo done",
        ],
        limits(),
    )
    .await;
    assert_eq!(r.exit, ExitStatus::Code(0));
    assert_eq!(stdout(&r), "done\n");
    assert!(!r.timed_out);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_no_leftovers(&slot);
}

#[tokio::test]
async fn memory_limit_triggers_the_oom_killer() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let limits = Limits {
        memory_bytes: 64 * 1024 * 1024,
        ..limits()
    };
    // Twice the limit, touched (b"x" * n writes every page).
    let r = run_with(
        sb,
        &slot,
        &[
            "/usr/bin/python3",
            "-c",
            "b = b'x' * (128 << 20); print('survived', len(b))",
        ],
        limits,
    )
    .await;
    assert!(r.oom_killed, "{r:?}");
    assert_eq!(r.exit, ExitStatus::Signal(libc::SIGKILL));
    assert_eq!(stdout(&r), "");
    let peak = r.memory_peak.expect("peak");
    assert!(
        peak <= 64 * 1024 * 1024 && peak > 32 * 1024 * 1024,
        "peak {peak}"
    );
    assert_no_leftovers(&slot);
}

#[tokio::test]
async fn pids_limit_contains_a_fork_bomb_and_the_host_stays_fine() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let limits = Limits {
        pids: 16,
        wall_time: Duration::from_secs(10),
        ..limits()
    };
    // Count how many children can exist at once.
    let r = run_with(
        sb,
        &slot,
        &["/usr/bin/python3", "-c", COUNT_CHILDREN],
        limits.clone(),
    )
    .await;
    let n: u32 = stdout(&r).trim().parse().unwrap_or_else(|_| {
        panic!("no count: {} / {}", stdout(&r), stderr(&r));
    });
    assert!((8..16).contains(&n), "children alive at once: {n}");
    assert_no_leftovers(&slot);

    // The classic bomb: it spins against the limit until the wall time.
    let limits = Limits {
        wall_time: Duration::from_secs(2),
        ..limits
    };
    let started = Instant::now();
    let r = run_with(sb, &slot, &["/bin/bash", "-c", ":(){ :|:& };:"], limits).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        r.timed_out || matches!(r.exit, ExitStatus::Code(_)),
        "{r:?}"
    );
    assert_no_leftovers(&slot);
    let host = std::process::Command::new("/bin/true")
        .status()
        .expect("host can still spawn");
    assert!(host.success());
}

#[tokio::test]
async fn cpu_limit_stops_a_busy_loop() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let limits = Limits {
        cpu_time: Duration::from_millis(500),
        wall_time: Duration::from_secs(15),
        ..limits()
    };
    let r = run_with(sb, &slot, &["/bin/sh", "-c", "while :; do :; done"], limits).await;
    assert!(!r.timed_out, "RLIMIT_CPU must stop it first: {r:?}");
    assert!(
        matches!(r.exit, ExitStatus::Signal(s) if s == libc::SIGXCPU || s == libc::SIGKILL),
        "{r:?}"
    );
    // RLIMIT_CPU (1 s after rounding up) counts tick-sampled time, while
    // rusage reports precise runtime, which is lower on a loaded VM.
    let cpu = r.cpu_time.expect("cpu time");
    assert!(cpu >= Duration::from_millis(500), "cpu {cpu:?}");
}

#[tokio::test]
async fn file_size_and_open_files_limits_apply() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let limits = Limits {
        file_size_bytes: 1024 * 1024,
        open_files: 100,
        ..limits()
    };
    let r = run_with(
        sb,
        &slot,
        &[
            "/bin/sh",
            "-c",
            "ulimit -n; head -c 3000000 /dev/zero > /mnt/data/big; echo rc=$?; wc -c < /mnt/data/big",
        ],
        limits,
    )
    .await;
    // head dies of SIGXFSZ (128 + 25) after writing exactly the limit.
    assert_eq!(
        stdout(&r),
        "100\nrc=153\n1048576\n",
        "stderr: {}",
        stderr(&r)
    );
}

#[tokio::test]
async fn stdout_overflow_stops_the_run_with_the_captured_prefix() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let limits = Limits {
        stdout_bytes: 10_000,
        ..limits()
    };
    let started = Instant::now();
    let r = run_with(sb, &slot, &["/usr/bin/yes"], limits).await;
    assert!(r.stdout_overflow);
    assert!(!r.stderr_overflow && !r.timed_out);
    assert_eq!(r.stdout.len(), 10_000);
    assert!(r.stdout.chunks(2).all(|c| c == b"y\n"));
    assert_eq!(r.exit, ExitStatus::Signal(libc::SIGKILL));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_no_leftovers(&slot);
}

#[tokio::test]
async fn stderr_overflow_is_reported_separately() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let limits = Limits {
        stderr_bytes: 100,
        ..limits()
    };
    let r = run_with(
        sb,
        &slot,
        &["/bin/sh", "-c", "echo out; yes err >&2"],
        limits,
    )
    .await;
    assert!(r.stderr_overflow && !r.stdout_overflow);
    assert_eq!(r.stderr.len(), 100);
    assert_eq!(stdout(&r), "out\n");
    assert_no_leftovers(&slot);
}

#[tokio::test]
async fn cancel_kills_the_jail_and_reports_what_it_had_used() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let ws = workspace(&slot);
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let started = Instant::now();
    let r = sb
        .run(
            &slot,
            request(
                &ws,
                &["/bin/sh", "-c", "(setsid sleep 300 &); sleep 100"],
                limits(),
            ),
            cancel,
        )
        .await;
    let Err(SandboxError::Cancelled(Some(used))) = r else {
        panic!("cancelled, with usage: {r:?}");
    };
    assert!(started.elapsed() < Duration::from_secs(5));
    // measured as for any run: wall time up to the kill (from when the
    // jail's init was started, a few ms after the request), the cgroup's peak
    assert!(used.wall_time >= Duration::from_millis(200), "{used:?}");
    assert!(used.memory_peak.is_some_and(|m| m > 0), "{used:?}");
    assert_no_leftovers(&slot);
}
