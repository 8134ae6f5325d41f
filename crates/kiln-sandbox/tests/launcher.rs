//! The jail launcher clones every jail's init itself, the kernel reaps
//! them, and when the launcher is gone the sandbox spawns helpers instead.
//! One test: it kills this binary's launcher halfway.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kiln_core::ExitStatus;
use tokio_util::sync::CancellationToken;

const UID_BASE: u32 = 1_870_000_000;

/// The `NSpid:` line of a process's status (its pid in each pid namespace
/// it is in, the outermost first).
fn nspid(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .unwrap_or_default()
        .to_owned()
}

/// (pid, cmdline) of the processes whose parent is `ppid`, zombies included.
fn children_of(ppid: u32) -> Vec<(u32, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may hold spaces, so split after ')'.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if parent == Some(ppid) {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            out.push((pid, cmdline));
        }
    }
    out
}

#[tokio::test]
async fn jail_inits_are_cloned_by_the_launcher_and_helpers_spawned_once_it_is_gone() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let launcher = sb.launcher_pid().expect("the jail launcher runs");
    let slot = sb.acquire_slot().await;
    let ws = workspace(&slot);

    // While a jail runs, its init is the launcher's child, with no helper
    // process in between: PID 1 of the jail's pid namespace, named
    // `sandbox-init`.
    let run = sb.run(
        &slot,
        request(&ws, &["/bin/sh", "-c", "sleep 1; echo done"], limits()),
        CancellationToken::new(),
    );
    let watch = async {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            // A fresh fork still carries the launcher's argv for a moment
            // before it renames itself; wait for the rename, not the fork.
            let kids = children_of(launcher);
            let renamed = kids.iter().find(|k| k.1.starts_with(b"sandbox-init\0"));
            if let Some(init) = renamed {
                return (kids.clone(), nspid(init.0));
            }
            if Instant::now() > until {
                return (kids, String::new());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let (r, (kids, ns)) = tokio::join!(run, watch);
    let r = r.expect("run");
    assert_eq!(stdout(&r), "done\n");
    assert_eq!(kids.len(), 1, "one jail init: {kids:?}");
    assert!(
        ns.ends_with("\t1"),
        "the launcher's child is PID 1 of the jail: {ns:?}"
    );
    assert!(
        kids[0].1.starts_with(b"sandbox-init\0"),
        "{:?}",
        String::from_utf8_lossy(&kids[0].1)
    );
    // The kernel reaped it: no zombie is left under the launcher.
    assert!(
        children_of(launcher).is_empty(),
        "{:?}",
        children_of(launcher)
    );

    // Once the launcher is gone, runs still work: helpers are spawned.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(launcher as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the launcher");
    let until = Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(format!("/proc/{launcher}/stat"))
        .is_ok_and(|s| !s.contains(") Z "))
        && Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for _ in 0..2 {
        let r = sh(sb, &slot, "echo still").await;
        assert_eq!(stdout(&r), "still\n");
        assert_eq!(r.exit, ExitStatus::Code(0));
    }
    assert_eq!(sb.launcher_pid(), None, "the dead launcher is noticed");
}
