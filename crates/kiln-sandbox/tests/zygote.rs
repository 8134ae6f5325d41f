//! The fork-server's duties towards its children: it reaps every child it
//! gets, not only the programs it forked (a zombie left in a jail's pid
//! namespace would keep that jail's init from ever finishing), and its death
//! takes its programs with it (the parent-death signal is armed after the
//! last credential change). One test: it kills this binary's fork-server.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kiln_sandbox::{ParkMode, ParkSpec, RunRequest, ZygoteConfig};
use tokio_util::sync::CancellationToken;

const UID_BASE: u32 = 1_880_000_000;

/// A template that leaves the fork-server a child of its own, which exits
/// half a second later: nobody but the fork-server can reap it.
const PRELOAD: &str = r#"
import os, sys, time, types
if os.fork() == 0:
    time.sleep(0.5)
    os._exit(0)
m = types.ModuleType("_kiln_zygote")
def run(go):
    print("ran", flush=True)
    time.sleep(float(os.environ.get("SLEEP", "0")))
    os._exit(0)
m.run = run
sys.modules["_kiln_zygote"] = m
"#;

/// Children of `pid` and their states (`Z` for a zombie).
fn children_of(pid: u32) -> Vec<(u32, char)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let state = f.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let ppid: u32 = f.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        let me: u32 = head
            .split(' ')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        if ppid == pid {
            out.push((me, state));
        }
    }
    out
}

async fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f()
}

#[tokio::test]
async fn the_fork_server_reaps_any_child_and_its_death_takes_its_programs() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let libpython = match kiln_sandbox::find_libpython(std::path::Path::new("/usr/bin/python3")) {
        Ok(p) => p,
        Err(e) if std::env::var_os("CI").is_some() => panic!("CI is set: {e}"),
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            return;
        }
    };
    let info = sb
        .start_zygote(
            "py",
            &ZygoteConfig {
                libpython,
                image_root: None,
                preload: PRELOAD.into(),
                env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            },
        )
        .await
        .expect("fork-server starts");
    let spec = ParkSpec {
        mode: ParkMode::Embedded,
        template: "py".into(),
        ..ParkSpec::exec()
    };
    let slot = sb.acquire_slot().await;
    let go = |jail: &kiln_sandbox::ParkedJail, sleep: &str| RunRequest {
        workspace: jail.workspace().to_path_buf(),
        argv: vec!["/usr/bin/python3".into(), "main.py".into()],
        env: vec![("SLEEP".into(), sleep.into())],
        limits: limits(),
        ..RunRequest::default()
    };

    // A run once the template's own child has exited: the fork-server wakes
    // up for it and reaps the stray child too.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let jail = sb.park(&slot, &spec, &limits(), None).await.expect("park");
    let req = go(&jail, "0");
    let r = sb
        .run_parked(&slot, jail, req, CancellationToken::new())
        .await
        .expect("run");
    assert_eq!(stdout(&r), "ran\n", "{}", stderr(&r));
    assert!(
        wait_until(Duration::from_secs(5), || children_of(info.pid)
            .iter()
            .all(|(_, state)| *state != 'Z'))
        .await,
        "zombie children of the fork-server: {:?}",
        children_of(info.pid)
    );

    // A parked program whose fork-server dies dies too, at once.
    let jail = sb.park(&slot, &spec, &limits(), None).await.expect("park");
    let program = host_pids_with_uid(slot.host_uid());
    assert_eq!(program.len(), 1, "one parked program: {program:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(info.pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the fork-server");
    assert!(
        wait_until(Duration::from_secs(2), || host_pids_with_uid(
            slot.host_uid()
        )
        .is_empty())
        .await,
        "the parked program outlived its fork-server: {:?}",
        host_pids_with_uid(slot.host_uid())
    );
    sb.discard(jail).await;
    assert!(
        wait_until(Duration::from_secs(5), || host_pids_of_slot(&slot)
            .is_empty())
        .await,
        "{:?}",
        host_pids_of_slot(&slot)
    );
}
