//! The workspace quota is enforced by the kernel: a job that fills its
//! workspace (bytes or files) gets ENOSPC and takes no more of the host's
//! disk than the quota; the next job of the slot starts empty with the whole
//! quota; the tmpfs fallback limits too; no quota at all is refused unless
//! the sandbox may run degraded; shutdown leaves nothing behind, even when
//! the process ends while another thread is tearing the slots down.
//!
//! Every test builds its own small sandbox (own slots dir and uid range).

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use kiln_core::{ExitStatus, Limits};
use kiln_sandbox::{
    QuotaMode, READY_KERNEL_SLOTS, RunResult, Sandbox, SandboxConfig, SandboxError, Slot,
    WorkspaceQuota,
};
use tokio_util::sync::CancellationToken;

const QUOTA_BYTES: u64 = 32 << 20;
const QUOTA_INODES: u64 = 512;

struct Setup {
    sb: Sandbox,
    slots_dir: PathBuf,
}

fn slots_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("kiln-quota-test-{name}"))
}

fn config(name: &str, uid_base: u32, mode: QuotaMode, degraded: bool) -> SandboxConfig {
    SandboxConfig {
        helper: PathBuf::from(env!("CARGO_BIN_EXE_kiln-jail")),
        root_dir: std::env::temp_dir().join("kiln-sandbox-test-root"),
        slots_dir: Some(slots_dir(name)),
        uid_base,
        slots: 1,
        workspace_bytes: QUOTA_BYTES,
        workspace_inodes: QUOTA_INODES,
        workspace_quota: mode,
        allow_degraded: degraded,
        ..SandboxConfig::default()
    }
}

/// A one-slot sandbox with the given backend, or `None` (after printing
/// why; a failure under CI) when the host cannot provide it.
fn setup(
    name: &str,
    uid_base: u32,
    mode: QuotaMode,
    want: fn(&WorkspaceQuota) -> bool,
) -> Option<Setup> {
    let sb = sandbox_or_skip(Sandbox::new(config(name, uid_base, mode, false)))?;
    if !want(&sb.report().workspace_quota) {
        let msg = format!(
            "workspace quota {mode:?} unavailable: {}",
            sb.report().workspace_quota
        );
        assert!(std::env::var_os("CI").is_none(), "CI is set and {msg}");
        eprintln!("SKIPPED: {msg}");
        return None;
    }
    Some(Setup {
        sb,
        slots_dir: slots_dir(name),
    })
}

fn sandbox_or_skip(r: Result<Sandbox, SandboxError>) -> Option<Sandbox> {
    match r {
        Ok(sb) => Some(sb),
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("CI is set and the sandbox is unavailable: {e}")
        }
        Err(e) => {
            eprintln!("SKIPPED: sandbox unavailable on this host: {e}");
            None
        }
    }
}

fn big_files() -> Limits {
    Limits {
        file_size_bytes: 1 << 30,
        ..limits()
    }
}

async fn run_in(sb: &Sandbox, slot: &Slot, ws: &Workspace, script: &str) -> RunResult {
    sb.run(
        slot,
        request(ws, &["/bin/sh", "-c", script], big_files()),
        CancellationToken::new(),
    )
    .await
    .expect("run")
}

/// Bytes the host's disk holds for a slot image.
fn allocated(image: &Path) -> u64 {
    std::fs::metadata(image)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

fn mounts_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .map(str::to_owned)
        .collect()
}

/// Drops the (only) slot and takes it again: it must come back with an
/// empty area (ext4's `lost+found` aside).
async fn released_and_taken_again(sb: &Sandbox, slot: Slot) -> Slot {
    let parent = slot.workspace_parent();
    drop(slot);
    let slot = tokio::time::timeout(Duration::from_secs(20), sb.acquire_slot())
        .await
        .expect("the slot comes back");
    assert_eq!(slot.workspace_parent(), parent);
    let left: Vec<String> = std::fs::read_dir(&parent)
        .expect("read area")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lost+found")
        .collect();
    assert!(left.is_empty(), "left in the slot: {left:?}");
    slot
}

/// Writes 4x the quota; prints dd's complaint.
const FILL: &str = "dd if=/dev/zero of=big bs=1M count=128 2>&1 >/dev/null \
                    | grep -o 'No space left on device'";

#[tokio::test]
async fn filling_the_workspace_gives_enospc_and_takes_no_more_of_the_host_than_the_quota() {
    let Some(s) = setup("fill", 1_200_000_000, QuotaMode::Loop, |q| {
        *q == WorkspaceQuota::LoopExt4
    }) else {
        return;
    };
    let slot = s.sb.acquire_slot().await;
    let ws = workspace(&slot);
    let r = run_in(&s.sb, &slot, &ws, FILL).await;
    assert!(
        stdout(&r).contains("No space left on device"),
        "{}",
        stdout(&r)
    );
    let image = s.slots_dir.join("0.img");
    let host = allocated(&image);
    assert!(
        host <= QUOTA_BYTES + (1 << 20),
        "the image takes {host} bytes of the host for a {QUOTA_BYTES}-byte quota"
    );
    s.sb.shutdown();
}

#[tokio::test]
async fn too_many_files_give_enospc() {
    let Some(s) = setup("inodes", 1_200_000_000 + 2 * 65_536, QuotaMode::Loop, |q| {
        *q == WorkspaceQuota::LoopExt4
    }) else {
        return;
    };
    let slot = s.sb.acquire_slot().await;
    let ws = workspace(&slot);
    let r = run_in(
        &s.sb,
        &slot,
        &ws,
        "i=0; while [ $i -lt 2000 ]; do true > f$i || { echo stopped at $i; exit 3; }; i=$((i+1)); done",
    )
    .await;
    assert_eq!(r.exit, ExitStatus::Code(3), "{}", stdout(&r));
    assert!(
        stderr(&r).contains("No space left on device"),
        "{}",
        stderr(&r)
    );
    let created: u64 = stdout(&r)
        .trim()
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("count");
    assert!(created < QUOTA_INODES, "created {created} files");
    s.sb.shutdown();
}

#[tokio::test]
async fn the_next_job_in_a_slot_starts_empty_with_the_whole_quota() {
    let Some(s) = setup("reuse", 1_200_000_000 + 4 * 65_536, QuotaMode::Loop, |q| {
        *q == WorkspaceQuota::LoopExt4
    }) else {
        return;
    };
    let slot = s.sb.acquire_slot().await;
    let ws = workspace(&slot);
    let r = run_in(
        &s.sb,
        &slot,
        &ws,
        &format!("mkdir keep && : > keep/secret; {FILL}"),
    )
    .await;
    assert!(stdout(&r).contains("No space left"), "{}", stdout(&r));
    // The job's workspace is left behind on purpose (as after a crash of
    // the executor): releasing the slot must clear it anyway.
    std::mem::forget(ws);
    let slot = released_and_taken_again(&s.sb, slot).await;
    // the trim after emptying gave the blocks back to the host.
    let host = allocated(&s.slots_dir.join("0.img"));
    assert!(host < QUOTA_BYTES / 2, "image still holds {host} bytes");
    let ws = workspace(&slot);
    let r = run_in(
        &s.sb,
        &slot,
        &ws,
        "dd if=/dev/zero of=again bs=1M count=24 2>/dev/null && echo wrote",
    )
    .await;
    assert_eq!(stdout(&r), "wrote\n", "{}", stderr(&r));
    s.sb.shutdown();
}

#[tokio::test]
async fn a_slot_whose_tree_cannot_be_removed_gets_a_fresh_filesystem() {
    let Some(s) = setup("fresh", 1_200_000_000 + 12 * 65_536, QuotaMode::Loop, |q| {
        *q == WorkspaceQuota::LoopExt4
    }) else {
        return;
    };
    let slot = s.sb.acquire_slot().await;
    let parent = slot.workspace_parent();
    let ws = workspace(&slot);
    let r = run_in(
        &s.sb,
        &slot,
        &ws,
        "mkdir -p stuck/inner && : > stuck/inner/f",
    )
    .await;
    assert_eq!(r.exit, ExitStatus::Code(0), "{}", stderr(&r));
    // A mount inside the tree: no walk can remove its mount point (EBUSY).
    let stuck = ws.path.join("stuck/inner");
    nix::mount::mount(
        Some("tmpfs"),
        &stuck,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .expect("mount inside the workspace");
    std::mem::forget(ws);
    let slot = released_and_taken_again(&s.sb, slot).await;
    assert_eq!(
        mounts_under(&s.slots_dir),
        vec![parent.display().to_string()],
        "one fresh mount, the stuck one gone"
    );
    let ws = workspace(&slot);
    let r = run_in(&s.sb, &slot, &ws, "echo fresh > f && cat f").await;
    assert_eq!(stdout(&r), "fresh\n", "{}", stderr(&r));
    s.sb.shutdown();
}

#[tokio::test]
async fn the_tmpfs_fallback_enforces_the_quota_too() {
    let Some(s) = setup("tmpfs", 1_200_000_000 + 6 * 65_536, QuotaMode::Tmpfs, |q| {
        matches!(q, WorkspaceQuota::Tmpfs { .. })
    }) else {
        return;
    };
    assert!(
        s.sb.report().warnings.iter().any(|w| w.contains("RAM")),
        "{}",
        s.sb.report()
    );
    let slot = s.sb.acquire_slot().await;
    let ws = workspace(&slot);
    let r = run_in(&s.sb, &slot, &ws, FILL).await;
    assert!(stdout(&r).contains("No space left"), "{}", stdout(&r));
    s.sb.shutdown();
}

#[tokio::test]
async fn no_quota_refuses_to_start_unless_degraded_and_then_says_so() {
    let uid_base = 1_200_000_000 + 8 * 65_536;
    let refused = Sandbox::new(config("off", uid_base, QuotaMode::Off, false));
    let Err(SandboxError::Unsupported(problems)) = refused else {
        panic!(
            "a sandbox without quota started: {:?}",
            refused.map(|s| s.report().clone())
        );
    };
    assert!(
        problems.iter().any(|p| p.contains("no workspace quota")),
        "{problems:?}"
    );
    assert!(mounts_under(&slots_dir("off")).is_empty());
    let Some(sb) = sandbox_or_skip(Sandbox::new(config("off", uid_base, QuotaMode::Off, true)))
    else {
        return;
    };
    assert_eq!(sb.report().degraded, vec!["workspace quota".to_owned()]);
    assert!(
        sb.report().to_string().contains("DEGRADED"),
        "{}",
        sb.report()
    );
    let slot = sb.acquire_slot().await;
    let ws = workspace(&slot);
    let r = run_in(&sb, &slot, &ws, "echo still jailed; id -u").await;
    assert_eq!(stdout(&r), "still jailed\n1000\n");
    sb.shutdown();
}

#[tokio::test]
async fn shutdown_unmounts_frees_the_loop_device_and_removes_everything() {
    let Some(s) = setup(
        "shutdown",
        1_200_000_000 + 10 * 65_536,
        QuotaMode::Auto,
        |q| *q == WorkspaceQuota::LoopExt4,
    ) else {
        return;
    };
    let image = s.slots_dir.join("0.img");
    assert_eq!(mounts_under(&s.slots_dir).len(), 1);
    let slot = s.sb.acquire_slot().await;
    s.sb.shutdown();
    assert!(mounts_under(&s.slots_dir).is_empty());
    assert!(!s.slots_dir.exists(), "slots dir left behind");
    let backing: Vec<String> = std::fs::read_dir("/sys/block")
        .expect("sysfs")
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .filter(|b| b.trim().starts_with(image.to_string_lossy().as_ref()))
        .collect();
    assert!(
        backing.is_empty(),
        "loop device still attached: {backing:?}"
    );
    let ws = tempfile::tempdir().expect("tempdir");
    let req = kiln_sandbox::RunRequest {
        workspace: slot.workspace_parent().join("x"),
        argv: vec!["/bin/true".into()],
        ..Default::default()
    };
    drop(ws);
    assert!(matches!(
        s.sb.run(&slot, req, CancellationToken::new()).await,
        Err(SandboxError::ShutDown)
    ));
}

/// In the child: a 16-slot sandbox whose last reference is dropped on
/// another thread while the main thread ends the process.
const EXIT_CHILD: &str = "KILN_QUOTA_TEST_EXIT_CHILD";

#[test]
fn a_process_ending_while_another_thread_tears_its_slots_down_leaves_no_mount() {
    let uid_base = 1_200_000_000 + 12 * 65_536;
    let dir = slots_dir("exit-race");
    if std::env::var_os(EXIT_CHILD).is_some() {
        let Some(sb) = sandbox_or_skip(Sandbox::new(SandboxConfig {
            slots: 16,
            ..config("exit-race", uid_base, QuotaMode::Auto, false)
        })) else {
            std::process::exit(0);
        };
        let all = mounts_under(&dir).len();
        std::thread::spawn(move || drop(sb));
        // exit as soon as the other thread is part-way through
        let t = std::time::Instant::now();
        while mounts_under(&dir).len() == all && t.elapsed() < Duration::from_secs(10) {
            std::hint::spin_loop();
        }
        std::process::exit(0);
    }
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "a_process_ending_while_another_thread_tears_its_slots_down_leaves_no_mount",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(EXIT_CHILD, "1")
        .output()
        .expect("run the child");
    assert!(
        out.status.success(),
        "child: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let skipped = String::from_utf8_lossy(&out.stderr).contains("SKIPPED");
    assert!(
        !skipped || std::env::var_os("CI").is_none(),
        "skipped under CI"
    );
    assert!(
        mounts_under(&dir).is_empty(),
        "mounts left after the process ended: {:?}",
        mounts_under(&dir)
    );
}

/// Slot images (`<i>.img`) in a slots dir: one loop device each while
/// mounted (the template the images are copied from is not one).
fn images_in(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.strip_suffix(".img")
                        .is_some_and(|n| n.parse::<u32>().is_ok())
                })
                .count()
        })
        .unwrap_or(0)
}

/// Waits up to 20 s for `f` to hold.
async fn eventually(f: impl Fn() -> bool) {
    let t = std::time::Instant::now();
    while !f() && t.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Kernel slots have a filesystem only while held, but for the few kept
/// ready ahead (`READY_KERNEL_SLOTS`): a sandbox with 64 of them mounts no
/// more at start than the run slots and the ready ones; taking two takes
/// ready ones (each its own filesystem, working as a quota area) and two
/// more are made ready behind them; dropping them removes exactly those
/// two again.
#[tokio::test]
async fn kernel_slots_are_mounted_only_while_a_kernel_holds_them_or_ready_ahead() {
    const RUN_SLOTS: u32 = 2;
    let uid_base = 2_100_000_000;
    let with_kernel_slots = |name: &str, kernel_slots: u32| {
        let sb = sandbox_or_skip(Sandbox::new(SandboxConfig {
            slots: RUN_SLOTS + kernel_slots,
            kernel_slots,
            ..config(name, uid_base, QuotaMode::Loop, false)
        }))?;
        if sb.report().workspace_quota != WorkspaceQuota::LoopExt4 {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set and no loop quota"
            );
            eprintln!("SKIPPED: no loop-device quota here");
            return None;
        }
        Some(sb)
    };
    let Some(few) = with_kernel_slots("kernels-3", 3) else {
        return;
    };
    let few_mounts = mounts_under(&slots_dir("kernels-3")).len();
    assert_eq!(few_mounts, RUN_SLOTS as usize + 3);
    drop(few);
    let Some(sb) = with_kernel_slots("kernels-64", 64) else {
        return;
    };
    let dir = slots_dir("kernels-64");
    let start_mounts = mounts_under(&dir);
    let at_start = start_mounts.len();
    let ahead = RUN_SLOTS as usize + READY_KERNEL_SLOTS;
    assert_eq!(at_start, ahead, "{start_mounts:?}");
    assert_eq!(images_in(&dir), ahead);

    let a = sb.acquire_kernel_slot().await.expect("kernel slot");
    let b = sb.acquire_kernel_slot().await.expect("kernel slot");
    assert!(a.index() >= RUN_SLOTS && b.index() >= RUN_SLOTS);
    for slot in [&a, &b] {
        assert!(
            start_mounts
                .iter()
                .any(|m| Path::new(m) == slot.workspace_parent()),
            "kernel slot {} was not one made ready at start",
            slot.index()
        );
    }
    eventually(|| mounts_under(&dir).len() == at_start + 2).await;
    assert_eq!(mounts_under(&dir).len(), at_start + 2);
    assert_eq!(images_in(&dir), ahead + 2);
    let ws = workspace(&a);
    let r = run_in(&sb, &a, &ws, FILL).await;
    assert_eq!(stdout(&r).trim(), "No space left on device", "{r:?}");
    drop(ws);

    drop(a);
    drop(b);
    eventually(|| mounts_under(&dir).len() == at_start).await;
    assert_eq!(mounts_under(&dir).len(), at_start);
    eventually(|| images_in(&dir) == ahead).await;
    assert_eq!(images_in(&dir), ahead);
    sb.shutdown();
    assert!(mounts_under(&dir).is_empty());
    assert!(!dir.exists(), "the template is removed with the slots");
}
