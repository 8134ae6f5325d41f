//! A slot's kept cgroups (`cgroup/slot.rs`) are reset between its runs:
//! whatever one run did to them (filled its memory, was OOM-killed, used
//! CPU, forked to its pids limit), the slot's next run reports only its own
//! usage and gets its whole limits. Each test has a sandbox of one slot, so
//! consecutive runs share the slot, and checks the set was kept (the same
//! groups), not replaced.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use kiln_core::{ExitStatus, Limits};
use kiln_sandbox::{RunResult, Sandbox};
use tokio_util::sync::CancellationToken;

const UID_BASE: u32 = 1_900_000_000;
const MIB: u64 = 1024 * 1024;

/// Runs `argv` under the sandbox's only slot, in a fresh workspace, and
/// releases the slot (its clean-up resets the groups before the next run).
async fn run_once(sb: &Sandbox, argv: &[&str], limits: Limits) -> RunResult {
    let slot = tokio::time::timeout(Duration::from_secs(20), sb.acquire_slot())
        .await
        .expect("the slot comes back");
    let ws = workspace(&slot);
    let r = sb
        .run(&slot, request(&ws, argv, limits), CancellationToken::new())
        .await
        .expect("run");
    drop(ws);
    drop(slot);
    r
}

/// The slot's kept groups, once its clean-up has made or reset them.
async fn kept_groups(sb: &Sandbox) -> Vec<PathBuf> {
    // the clean-up runs when the slot is released: a take waits for it
    drop(
        tokio::time::timeout(Duration::from_secs(20), sb.acquire_slot())
            .await
            .expect("the slot comes back"),
    );
    let slot = sb.acquire_slot().await;
    let groups = slot_groups(sb, slot.id_base());
    drop(slot);
    assert!(!groups.is_empty(), "the slot keeps no groups");
    groups
}

/// A sandbox of one slot whose kept groups exist (its first run made
/// them), or `None` where jails cannot run.
async fn one_slot(offset: u32) -> Option<(Sandbox, Vec<PathBuf>)> {
    let sb = sandbox_with_slots(UID_BASE + offset * 1_000_000, 1)?;
    let r = run_once(&sb, &["/bin/true"], limits()).await;
    assert_eq!(r.exit, ExitStatus::Code(0), "{r:?}");
    let groups = kept_groups(&sb).await;
    Some((sb, groups))
}

fn py(code: &str) -> Vec<&str> {
    vec!["/usr/bin/python3", "-c", code]
}

#[tokio::test]
async fn a_run_after_one_that_filled_its_memory_reports_its_own_peak_and_gets_its_whole_limit() {
    let Some((sb, groups)) = one_slot(0).await else {
        return;
    };
    let limits = Limits {
        memory_bytes: 160 * MIB,
        file_size_bytes: 128 * MIB,
        ..limits()
    };
    // 100 MiB written to a file (page cache), then 120 MiB of anonymous
    // memory touched: the group's charge near its limit
    let fill = run_once(
        &sb,
        &py("open('/mnt/data/big', 'wb').write(b'y' * (100 << 20))\n\
             b = b'x' * (120 << 20)\n\
             print('filled')"),
        limits.clone(),
    )
    .await;
    assert_eq!(stdout(&fill), "filled\n", "{fill:?}");
    let filled = fill.memory_peak.expect("peak");
    assert!(filled > 120 * MIB, "the filling run's peak: {filled}");
    assert_eq!(kept_groups(&sb).await, groups, "the set was replaced");

    let small = run_once(&sb, &["/bin/true"], limits.clone()).await;
    let peak = small.memory_peak.expect("peak");
    assert!(
        peak < 16 * MIB,
        "the next run reports the previous run's peak: {peak} (the filling run's {filled})"
    );
    assert!(!small.oom_killed);
    assert_eq!(kept_groups(&sb).await, groups, "the set was replaced");

    // and it may use its whole limit: 140 of 160 MiB
    let big = run_once(
        &sb,
        &py("b = b'x' * (140 << 20)\nprint('allocated', len(b) >> 20)"),
        limits,
    )
    .await;
    assert!(!big.oom_killed, "{big:?}");
    assert_eq!(stdout(&big), "allocated 140\n", "{big:?}");
    sb.shutdown();
}

#[tokio::test]
async fn a_run_after_an_oom_killed_one_is_not_reported_oom() {
    let Some((sb, groups)) = one_slot(1).await else {
        return;
    };
    let limits = Limits {
        memory_bytes: 64 * MIB,
        ..limits()
    };
    let bomb = run_once(&sb, &py("b = b'x' * (128 << 20)"), limits.clone()).await;
    assert!(bomb.oom_killed, "{bomb:?}");
    assert_eq!(kept_groups(&sb).await, groups, "the set was replaced");

    let next = run_once(&sb, &py("print('fine')"), limits).await;
    assert_eq!(stdout(&next), "fine\n", "{next:?}");
    assert!(!next.oom_killed, "the previous run's OOM kill is reported");
    assert_eq!(next.exit, ExitStatus::Code(0));
    sb.shutdown();
}

/// Spins until the process has used `secs` of CPU.
fn spin(secs: f64) -> String {
    format!("import time\nwhile time.process_time() < {secs}: pass\nprint('spun')")
}

#[tokio::test]
async fn a_cpu_budget_counts_only_the_runs_own_cpu() {
    let Some((sb, groups)) = one_slot(2).await else {
        return;
    };
    if kiln_sandbox::cpu_budget_warning(&sb.report().cgroup, sb.report().cgroup_limits).is_some() {
        eprintln!("SKIPPED: no CPU time per group on this host");
        return;
    }
    let code = spin(1.5);
    let busy = run_once(
        &sb,
        &py(&code),
        Limits {
            cpu_time: Duration::from_secs(5),
            ..limits()
        },
    )
    .await;
    assert_eq!(stdout(&busy), "spun\n", "{busy:?}");
    assert_eq!(kept_groups(&sb).await, groups, "the set was replaced");

    // 1.2 s of its own under a budget of 2 s: with the previous run's
    // 1.5 s counted it would be stopped
    let code = spin(1.2);
    let next = run_once(
        &sb,
        &py(&code),
        Limits {
            cpu_time: Duration::from_secs(2),
            ..limits()
        },
    )
    .await;
    assert_eq!(next.exit, ExitStatus::Code(0), "{next:?}");
    assert_eq!(stdout(&next), "spun\n");
    let cpu = next.cpu_time.expect("cpu time");
    assert!(
        cpu >= Duration::from_millis(1200) && cpu < Duration::from_millis(1900),
        "the run's own CPU time: {cpu:?}"
    );
    sb.shutdown();
}

#[tokio::test]
async fn a_run_after_a_fork_bomb_gets_its_whole_pids_limit() {
    let Some((sb, groups)) = one_slot(3).await else {
        return;
    };
    let limits = Limits {
        pids: 16,
        wall_time: Duration::from_secs(2),
        ..limits()
    };
    let bomb = run_once(&sb, &["/bin/bash", "-c", ":(){ :|:& };:"], limits.clone()).await;
    assert!(
        bomb.timed_out || matches!(bomb.exit, ExitStatus::Code(_)),
        "{bomb:?}"
    );
    assert_eq!(kept_groups(&sb).await, groups, "the set was replaced");

    // as many children at once as a fresh group allows (the limit less the
    // program; the init has its own share)
    let count = run_once(
        &sb,
        &py(COUNT_CHILDREN),
        Limits {
            wall_time: Duration::from_secs(10),
            ..limits
        },
    )
    .await;
    let n: u32 = stdout(&count)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no count: {count:?}"));
    // 17 tasks allowed (+1 for the jail's init): the program and 15 children
    assert!(n == 15, "children alive at once after a fork bomb: {n}");
    sb.shutdown();
}

/// Whether the slot's groups have a `cpu.idle` (Linux 5.15+); only
/// outside CI may they lack one.
fn has_cpu_idle(groups: &[PathBuf]) -> bool {
    let has = !idle_of(groups).is_empty();
    assert!(
        has || std::env::var_os("CI").is_none(),
        "no cpu.idle in the slot's groups: {groups:?}"
    );
    has
}

/// The `cpu.idle` of the slot's CPU groups (`None` for groups without one).
fn idle_of(groups: &[PathBuf]) -> Vec<String> {
    groups
        .iter()
        .filter_map(|g| std::fs::read_to_string(g.join("cpu.idle")).ok())
        .map(|s| s.trim().to_owned())
        .collect()
}

#[tokio::test]
async fn a_jail_built_ahead_waits_at_idle_cpu_priority_and_runs_at_normal_priority() {
    let Some((sb, groups)) = one_slot(4).await else {
        return;
    };
    if !has_cpu_idle(&groups) {
        return;
    }
    let spec = kiln_sandbox::ParkSpec::exec();
    // built ahead: idle until its go, normal while the program runs
    let slot = sb.acquire_slot().await;
    let jail = sb.park_ahead(&slot, &spec, &limits()).await.expect("park");
    assert_eq!(idle_of(&groups), ["1"], "a parked jail built ahead");
    let req = kiln_sandbox::RunRequest {
        workspace: jail.workspace().to_path_buf(),
        argv: ["/bin/sh", "-c", "sleep 1; echo done"]
            .map(str::to_owned)
            .to_vec(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        limits: limits(),
        ..kiln_sandbox::RunRequest::default()
    };
    let run = {
        let sb = sb.clone();
        tokio::spawn(async move {
            let r = sb
                .run_parked(&slot, jail, req, CancellationToken::new())
                .await;
            drop(slot);
            r
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(idle_of(&groups), ["0"], "a jail built ahead, running");
    let r = run.await.expect("task").expect("run");
    assert_eq!(stdout(&r), "done\n", "{r:?}");
    assert_eq!(kept_groups(&sb).await, groups, "the set was replaced");

    // built ahead and discarded without a run: the slot's next run is not idle
    let slot = sb.acquire_slot().await;
    let jail = sb.park_ahead(&slot, &spec, &limits()).await.expect("park");
    assert_eq!(idle_of(&groups), ["1"], "a parked jail built ahead");
    sb.discard(jail).await;
    drop(slot);
    assert_eq!(kept_groups(&sb).await, groups, "the set was replaced");
    assert_eq!(
        idle_of(&groups),
        ["0"],
        "after a discarded jail built ahead"
    );

    // a jail built for a request is never idle
    let slot = sb.acquire_slot().await;
    let jail = sb.park(&slot, &spec, &limits(), None).await.expect("park");
    assert_eq!(idle_of(&groups), ["0"], "a parked jail built for a request");
    sb.discard(jail).await;
    drop(slot);
    sb.shutdown();
}

/// A `py` kernel under `slot` running Kiln's kernel program, started ahead
/// of any create or for one.
async fn kernel(sb: &Sandbox, slot: &kiln_sandbox::Slot, ahead: bool) -> kiln_sandbox::Kernel {
    let name = kiln_core::lang::warm::PYTHON_KERNEL_NAME;
    let start = kiln_sandbox::KernelStart {
        park: kiln_sandbox::ParkSpec {
            etc_files: vec![(
                name.to_owned(),
                kiln_core::lang::warm::PYTHON_KERNEL.to_owned(),
            )],
            ..kiln_sandbox::ParkSpec::exec()
        },
        argv: vec![
            "/usr/bin/python3".to_owned(),
            "-u".to_owned(),
            format!("/etc/kiln/{name}"),
        ],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        limits: limits(),
    };
    let started = if ahead {
        sb.start_kernel_ahead(slot, start).await
    } else {
        sb.start_kernel(slot, start).await
    };
    started.expect("kernel starts")
}

fn eval_limits() -> kiln_sandbox::EvalLimits {
    kiln_sandbox::EvalLimits {
        timeout: Duration::from_secs(10),
        grace: Duration::from_secs(2),
        stdout_bytes: 1 << 16,
        stderr_bytes: 1 << 16,
    }
}

#[tokio::test]
async fn a_kernel_started_ahead_waits_idle_and_runs_at_normal_priority_once_taken_or_evaluating() {
    let Some((sb, groups)) = one_slot(5).await else {
        return;
    };
    if !has_cpu_idle(&groups) {
        return;
    }
    // started ahead: ready and waiting at idle priority; taken: normal
    let slot = sb.acquire_slot().await;
    let k = kernel(&sb, &slot, true).await;
    assert_eq!(idle_of(&groups), ["1"], "a kernel started ahead, ready");
    assert_eq!(k.at_idle_priority(), Some(true));
    k.run_at_normal_priority();
    assert_eq!(idle_of(&groups), ["0"], "a kernel started ahead, taken");
    let r = k
        .eval("print(6 * 7)", eval_limits(), None)
        .await
        .expect("eval");
    assert_eq!(String::from_utf8_lossy(&r.stdout), "42\n", "{r:?}");
    k.close().await;
    drop(slot);
    assert_eq!(kept_groups(&sb).await, groups, "the set was replaced");

    // never taken: its first evaluation runs at normal priority
    let slot = sb.acquire_slot().await;
    let k = kernel(&sb, &slot, true).await;
    assert_eq!(idle_of(&groups), ["1"], "a kernel started ahead, ready");
    let r = k
        .eval("import time; time.sleep(0.01); 'done'", eval_limits(), None)
        .await
        .expect("eval");
    assert_eq!(r.value.as_deref(), Some("'done'"), "{r:?}");
    assert_eq!(idle_of(&groups), ["0"], "an evaluation at idle priority");
    k.close().await;
    drop(slot);

    // closed while still idle: the slot's next jail is not
    let slot = sb.acquire_slot().await;
    let k = kernel(&sb, &slot, true).await;
    assert_eq!(idle_of(&groups), ["1"], "a kernel started ahead, ready");
    k.close().await;
    drop(slot);
    assert_eq!(kept_groups(&sb).await, groups, "the set was replaced");
    assert_eq!(
        idle_of(&groups),
        ["0"],
        "the slot's groups after a kernel closed at idle priority"
    );

    // a kernel started for a create never waits idle
    let slot = sb.acquire_slot().await;
    let k = kernel(&sb, &slot, false).await;
    assert_eq!(idle_of(&groups), ["0"], "a kernel started for a create");
    assert_eq!(k.at_idle_priority(), Some(false));
    k.close().await;
    drop(slot);
    sb.shutdown();
}
