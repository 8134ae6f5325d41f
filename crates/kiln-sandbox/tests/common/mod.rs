//! Shared harness of the sandbox integration tests: one [`Sandbox`] per test
//! binary (own uid range, so binaries never share uids), workspaces owned by
//! the slot's uid, and host-side checks.
//!
//! These tests need root, user namespaces and cgroups. Without them they skip
//! with a printed reason — unless `CI` is set, where that is a failure.

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use kiln_core::Limits;
use kiln_sandbox::{RunRequest, RunResult, Sandbox, SandboxConfig, Slot};
use tokio_util::sync::CancellationToken;

/// The sandbox for this test binary, or `None` (after printing why) when the
/// host cannot run jails and `CI` is unset.
pub fn sandbox(uid_base: u32) -> Option<&'static Sandbox> {
    static SB: OnceLock<Result<Sandbox, String>> = OnceLock::new();
    available(SB.get_or_init(|| new_sandbox(uid_base, 4)))
}

/// A sandbox of its own with `slots` uid slots (its own uid range and slots
/// dir, so it never shares either with the binary's [`sandbox`]), for tests
/// that need to run out of slots.
pub fn sandbox_with_slots(uid_base: u32, slots: u32) -> Option<Sandbox> {
    available(&new_sandbox(uid_base, slots)).cloned()
}

fn new_sandbox(uid_base: u32, slots: u32) -> Result<Sandbox, String> {
    let root = std::env::temp_dir().join("kiln-sandbox-test-root");
    // One slots dir per sandbox: a sandbox unmounts whatever it finds in its
    // own on start.
    let slots_dir = std::env::temp_dir().join(format!("kiln-sandbox-test-slots-{uid_base}"));
    let cfg = SandboxConfig {
        helper: PathBuf::from(env!("CARGO_BIN_EXE_kiln-jail")),
        root_dir: root,
        slots_dir: Some(slots_dir),
        uid_base,
        slots,
        // these tests look at one jail per run (what is left of a slot
        // after it); kept jails are tested through the server
        // (crates/kiln/tests/security/keptjail.rs, warm.rs)
        keep_jails: false,
        ..SandboxConfig::default()
    };
    Sandbox::new(cfg).map_err(|e| e.to_string())
}

fn available(sb: &Result<Sandbox, String>) -> Option<&Sandbox> {
    match sb {
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

/// A Python program that forks children that sleep until it cannot fork
/// any more, and prints how many it made: how many processes may exist at
/// once.
pub const COUNT_CHILDREN: &str = "import os, time\n\
     n = 0\n\
     while True:\n\
     \x20   try:\n\
     \x20       pid = os.fork()\n\
     \x20   except OSError:\n\
     \x20       break\n\
     \x20   if pid == 0:\n\
     \x20       time.sleep(30); os._exit(0)\n\
     \x20   n += 1\n\
     print(n)";

/// Small limits so tests are fast and abuse is cheap.
pub fn limits() -> Limits {
    Limits {
        wall_time: Duration::from_secs(20),
        cpu_time: Duration::from_secs(20),
        memory_bytes: 256 * 1024 * 1024,
        pids: 64,
        file_size_bytes: 16 * 1024 * 1024,
        open_files: 256,
        stdout_bytes: 64 * 1024,
        stderr_bytes: 64 * 1024,
        tmp_bytes: 16 * 1024 * 1024,
    }
}

/// A fresh workspace owned by the slot's in-jail user, in the slot's
/// workspace area (where the quota applies).
pub struct Workspace {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

pub fn workspace(slot: &Slot) -> Workspace {
    let dir = tempfile::Builder::new()
        .prefix("kiln-ws-")
        .tempdir_in(slot.workspace_parent())
        .expect("create workspace");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod workspace");
    std::os::unix::fs::chown(dir.path(), Some(slot.host_uid()), Some(slot.host_gid()))
        .expect("chown workspace");
    let path = dir.path().to_path_buf();
    Workspace { _dir: dir, path }
}

pub fn request(ws: &Workspace, argv: &[&str], limits: Limits) -> RunRequest {
    RunRequest {
        workspace: ws.path.clone(),
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        env: vec![
            ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
            ("HOME".into(), "/mnt/data".into()),
            ("LANG".into(), "C.UTF-8".into()),
        ],
        limits,
        ..RunRequest::default()
    }
}

/// Runs `sh -c script` in a fresh workspace of `slot`.
pub async fn sh(sb: &Sandbox, slot: &Slot, script: &str) -> RunResult {
    let ws = workspace(slot);
    sb.run(
        slot,
        request(&ws, &["/bin/sh", "-c", script], limits()),
        CancellationToken::new(),
    )
    .await
    .expect("run")
}

pub fn stdout(r: &RunResult) -> String {
    String::from_utf8_lossy(&r.stdout).into_owned()
}

pub fn stderr(r: &RunResult) -> String {
    String::from_utf8_lossy(&r.stderr).into_owned()
}

/// Live (not zombie) host pids whose real uid is `uid`.
pub fn host_pids_with_uid(uid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let real = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|u| u.parse::<u32>().ok());
        let zombie = status
            .lines()
            .find_map(|l| l.strip_prefix("State:"))
            .is_some_and(|s| s.trim_start().starts_with(['Z', 'X']));
        if real == Some(uid) && !zombie {
            found.push(pid);
        }
    }
    found
}

/// Every host pid whose uid lies in the slot's range (the user program, its
/// children, and the jail's init, which is uid 0 inside = the range base).
pub fn host_pids_of_slot(slot: &Slot) -> Vec<u32> {
    let mut v = host_pids_with_uid(slot.host_uid());
    v.extend(host_pids_with_uid(slot.id_base()));
    v
}

/// What a run of this process left under the kiln parents: its own groups
/// (`<pid>-<slot>-<seq>`), and a slot's kept groups (`<pid>-u<slot's first
/// uid>.<n>`) with a process still in them.
pub fn own_run_cgroups(sb: &Sandbox) -> Vec<PathBuf> {
    own_cgroups(sb)
        .into_iter()
        .filter(|d| !is_slot_group(d) || !procs_in(d).is_empty())
        .collect()
}

/// Every group of this process under the kiln parents, the slots' kept
/// ones included.
pub fn own_cgroups(sb: &Sandbox) -> Vec<PathBuf> {
    let prefix = format!("{}-", std::process::id());
    sb.cgroup_parents()
        .iter()
        .flat_map(|p| std::fs::read_dir(p).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// The kept groups of the slot whose first host uid is `id_base` (one per
/// hierarchy).
pub fn slot_groups(sb: &Sandbox, id_base: u32) -> Vec<PathBuf> {
    let prefix = format!("{}-u{id_base}.", std::process::id());
    own_cgroups(sb)
        .into_iter()
        .filter(|d| {
            d.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect()
}

fn is_slot_group(dir: &Path) -> bool {
    let prefix = format!("{}-u", std::process::id());
    dir.file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
}

/// Pids in a group's `cgroup.procs`.
pub fn procs_in(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}
