//! Warm jails: built and parked ahead, each used once. The go decides what
//! runs and when the wall time starts; a parked jail that is discarded
//! leaves nothing; a pre-started program reads the go on stdin; an embedded
//! (fork-server) jail runs in a fork of a preloaded interpreter, confined
//! like any other; the pool refills and follows demand.

mod common;

use std::time::Duration;

use common::*;
use kiln_core::Limits;
use kiln_sandbox::{ParkMode, ParkSpec, RunRequest, WarmConfig, WarmPool, ZygoteConfig};
use tokio_util::sync::CancellationToken;

const UID_BASE: u32 = 1_860_000_000;

fn go(jail: &kiln_sandbox::ParkedJail, argv: &[&str], limits: Limits) -> RunRequest {
    RunRequest {
        workspace: jail.workspace().to_path_buf(),
        argv: argv.iter().map(|s| (*s).to_owned()).collect(),
        env: vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("GREETING".into(), "hello from the go".into()),
        ],
        limits,
        ..RunRequest::default()
    }
}

#[tokio::test]
async fn a_parked_jail_runs_what_the_go_names_as_the_jailed_user() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let jail = sb
        .park(&slot, &ParkSpec::exec(), &limits(), None)
        .await
        .expect("park");
    assert_eq!(jail.mode(), ParkMode::Exec);
    assert!(jail.workspace().starts_with(slot.workspace_parent()));
    std::fs::write(jail.workspace().join("in.txt"), "staged after parking\n").expect("stage");
    let req = go(
        &jail,
        &[
            "/bin/sh",
            "-c",
            "echo $GREETING; id -u; cat in.txt; echo $$",
        ],
        limits(),
    );
    let r = sb
        .run_parked(&slot, jail, req, CancellationToken::new())
        .await
        .expect("run");
    assert_eq!(
        stdout(&r),
        "hello from the go\n1000\nstaged after parking\n2\n",
        "stderr: {}",
        stderr(&r)
    );
    assert_eq!(r.exit, kiln_core::ExitStatus::Code(0));
}

#[tokio::test]
async fn the_wall_time_starts_at_the_go_not_at_parking() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let jail = sb
        .park(&slot, &ParkSpec::exec(), &limits(), None)
        .await
        .expect("park");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let short = Limits {
        wall_time: Duration::from_millis(1000),
        ..limits()
    };
    let req = go(
        &jail,
        &["/bin/sh", "-c", "sleep 0.3; echo done"],
        short.clone(),
    );
    let r = sb
        .run_parked(&slot, jail, req, CancellationToken::new())
        .await
        .expect("run");
    assert!(!r.timed_out);
    assert_eq!(stdout(&r), "done\n");

    // ... and is enforced from there.
    let jail = sb
        .park(&slot, &ParkSpec::exec(), &limits(), None)
        .await
        .expect("park");
    let req = go(&jail, &["/bin/sh", "-c", "sleep 30"], short);
    let r = sb
        .run_parked(&slot, jail, req, CancellationToken::new())
        .await
        .expect("run");
    assert!(r.timed_out);
}

#[tokio::test]
async fn a_discarded_parked_jail_leaves_no_process() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let jail = sb
        .park(&slot, &ParkSpec::exec(), &limits(), None)
        .await
        .expect("park");
    assert!(
        !host_pids_of_slot(&slot).is_empty(),
        "a parked jail has processes"
    );
    sb.discard(jail).await;
    assert!(host_pids_of_slot(&slot).is_empty());
}

#[tokio::test]
async fn an_unknown_go_program_is_an_exec_failure_not_a_hang() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let jail = sb
        .park(&slot, &ParkSpec::exec(), &limits(), None)
        .await
        .expect("park");
    let req = go(&jail, &["/nope"], limits());
    let r = sb
        .run_parked(&slot, jail, req, CancellationToken::new())
        .await;
    assert!(
        matches!(r, Err(kiln_sandbox::SandboxError::Exec(_))),
        "{r:?}"
    );
}

#[tokio::test]
async fn a_prestarted_program_reads_the_go_on_stdin_and_sees_its_etc_files() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let spec = ParkSpec {
        mode: ParkMode::Prestart,
        argv: vec!["/bin/sh".into(), "/etc/kiln/boot.sh".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        etc_files: vec![
            (
                "boot.sh".into(),
                "read -r go; echo \"started before: $go\" | cut -c1-40; id -u\n".into(),
            ),
            ("../escape".into(), "refused".into()),
        ],
        seccomp_profile: "default".into(),
        ..ParkSpec::exec()
    };
    let jail = sb.park(&slot, &spec, &limits(), None).await.expect("park");
    let req = go(&jail, &["/bin/ignored"], limits());
    let r = sb
        .run_parked(&slot, jail, req, CancellationToken::new())
        .await
        .expect("run");
    assert_eq!(
        stdout(&r),
        "started before: {\"argv\":[\"/bin/ignored\"]\n1000\n",
        "stderr: {}",
        stderr(&r)
    );
    assert!(!std::path::Path::new("/etc/escape").exists());
}

/// A minimal template: counts runs in a module global (a fresh fork always
/// sees 0), reports the process it runs in, and ends it.
const PRELOAD: &str = r#"
import json, os, sys, types
m = types.ModuleType("_kiln_zygote")
m.runs = 0
def run(go):
    m.runs += 1
    go = json.loads(go)
    env = dict(go["env"])
    print(json.dumps({"argv": go["argv"], "greeting": env.get("GREETING"),
                      "runs": m.runs, "uid": os.getuid(), "pid": os.getpid(),
                      "cwd": os.getcwd(), "json_preloaded": "json" in sys.modules}))
    sys.stdout.flush()
    os._exit(7)
m.run = run
sys.modules["_kiln_zygote"] = m
"#;

/// The host's libpython (for a fork-server of the host's python3), or
/// `None` (skipped) where there is none, except in CI.
fn host_libpython() -> Option<std::path::PathBuf> {
    match kiln_sandbox::find_libpython(std::path::Path::new("/usr/bin/python3")) {
        Ok(p) => Some(p),
        Err(e) if std::env::var_os("CI").is_some() => panic!("CI is set: {e}"),
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            None
        }
    }
}

#[tokio::test]
async fn an_embedded_jail_is_a_fresh_fork_of_the_template_confined_like_any_other() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let Some(libpython) = host_libpython() else {
        return;
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
    assert!(info.rss_bytes > 0);
    assert!(sb.has_zygote("py"));
    let spec = ParkSpec {
        mode: ParkMode::Embedded,
        template: "py".into(),
        ..ParkSpec::exec()
    };
    let slot = sb.acquire_slot().await;
    for _ in 0..2 {
        let jail = sb.park(&slot, &spec, &limits(), None).await.expect("park");
        let req = go(&jail, &["/usr/bin/python3", "main.py", "a b"], limits());
        let r = sb
            .run_parked(&slot, jail, req, CancellationToken::new())
            .await
            .expect("run");
        assert_eq!(r.exit, kiln_core::ExitStatus::Code(7), "{}", stderr(&r));
        let seen: serde_json::Value =
            serde_json::from_str(stdout(&r).trim()).expect("one JSON line");
        assert_eq!(seen["argv"][2], "a b");
        assert_eq!(seen["greeting"], "hello from the go");
        assert_eq!(seen["runs"], 1, "every run is a fresh fork of the template");
        assert_eq!(seen["uid"], 1000);
        assert_eq!(
            seen["pid"], 2,
            "own pid namespace, forked by the jail's init"
        );
        assert_eq!(seen["cwd"], "/mnt/data");
        assert_eq!(seen["json_preloaded"], true);
    }
    assert!(host_pids_of_slot(&slot).is_empty());
}

/// Runs `echo word` in a jail from the pool and checks what it printed.
async fn run_echo(sb: &kiln_sandbox::Sandbox, w: kiln_sandbox::WarmJail, word: &str) {
    let req = go(&w.jail, &["/bin/echo", word], limits());
    let r = sb
        .run_parked(&w.slot, w.jail, req, CancellationToken::new())
        .await
        .expect("run");
    assert_eq!(stdout(&r), format!("{word}\n"));
}

/// A filled pool of generic `exec` jails: one parked, at most `max` in all.
async fn exec_pool(sb: &kiln_sandbox::Sandbox, max: u32) -> WarmPool {
    let pool = WarmPool::start(
        sb.clone(),
        WarmConfig {
            max_total: max,
            max_per_profile: max,
            min_per_profile: 1,
            decay_after: Duration::from_secs(60),
            limits: limits(),
        },
        vec![("exec".into(), ParkSpec::exec())],
    );
    assert!(pool.wait_filled(Duration::from_secs(10)).await);
    pool
}

#[tokio::test]
async fn the_pool_hands_out_ready_jails_and_builds_on_a_miss() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let pool = exec_pool(sb, 2).await;
    assert_eq!(pool.stats()["exec"].ready, 1);
    let first = pool.get("exec").await.expect("hit");
    assert!(first.was_ready);
    // The refill has not caught up yet: the next one may be built now.
    let second = pool.get("exec").await.expect("hit or built");
    let stats = pool.stats();
    assert_eq!(stats["exec"].hits + stats["exec"].misses, 2);
    for w in [first, second] {
        run_echo(sb, w, "once").await;
    }
    assert!(pool.get("nope").await.is_err());
    pool.shutdown().await;
}

#[tokio::test]
async fn a_miss_is_served_by_the_refill_in_flight() {
    // Two slots, the second held by the test: the refill woken by the first
    // take queues for a slot, then the miss's own build queues behind it.
    // When the slot comes free the refill gets it (slots are handed out in
    // order) and its jail must serve the miss: a miss that waited for its own
    // build alone would wait here until the first jail is given back.
    let Some(sb) = sandbox_with_slots(UID_BASE + 1_000_000, 2) else {
        return;
    };
    let pool = exec_pool(&sb, 1).await;
    let held = sb.acquire_slot().await;
    let first = pool.get("exec").await.expect("hit");
    assert!(first.was_ready);
    // Let the refill loop wake and queue for a slot before the miss does.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let miss = tokio::spawn({
        let pool = pool.clone();
        async move { pool.get("exec").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(held);
    let second = tokio::time::timeout(Duration::from_secs(20), miss)
        .await
        .expect("the miss is served by the refill while the first jail is still held")
        .expect("join")
        .expect("a jail");
    assert!(!second.was_ready);
    assert_eq!(pool.stats()["exec"].served_early, 1);
    for w in [first, second] {
        run_echo(&sb, w, "once").await;
    }
    // With the slots free again, the miss's own build (and the refill) go on
    // and the pool is whole again for the next request.
    let mut refilled = false;
    for _ in 0..200 {
        if pool.stats()["exec"].ready == 1 {
            refilled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refilled, "the pool refills: {:?}", pool.stats());
    let third = pool.get("exec").await.expect("hit");
    assert!(third.was_ready);
    run_echo(&sb, third, "again").await;
    pool.shutdown().await;
}

/// What a cell of Kiln's `py` kernel prints: whether the kernel's module
/// code (the frame of `/etc/kiln/kiln_kernel.py` below the cell) is the code
/// object the template compiled before the fork (held by the template's
/// `program_code`, a free variable of its `execute` frame, further down).
const KERNEL_CODE_PROBE: &str = r#"
import sys
frame, module_code, known = sys._getframe(), None, None
while frame is not None:
    if frame.f_code.co_filename == "/etc/kiln/kiln_kernel.py" and frame.f_code.co_name == "<module>":
        module_code = frame.f_code
    if frame.f_code.co_name == "execute" and "program_code" in frame.f_locals:
        lookup = frame.f_locals["program_code"]
        cells = dict(zip(lookup.__code__.co_freevars, lookup.__closure__))
        known = cells["compiled"].cell_contents.get("/etc/kiln/kiln_kernel.py")
    frame = frame.f_back
print(module_code is not None, known is not None and known[1] is module_code)
"#;

#[tokio::test]
async fn a_kernel_runs_the_code_its_template_compiled_and_another_program_at_its_path_its_own() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let Some(libpython) = host_libpython() else {
        return;
    };
    // the real lean template (the stdlib set, no data stack): it compiles the kernel
    sb.start_zygote(
        "py-lean",
        &ZygoteConfig {
            libpython,
            image_root: None,
            preload: kiln_core::lang::warm::python_preload(true, &[]),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        },
    )
    .await
    .expect("fork-server starts");
    let kernel_path = kiln_core::lang::warm::PYTHON_KERNEL_PATH;
    let park = |program: &str| ParkSpec {
        mode: ParkMode::Embedded,
        template: "py-lean".into(),
        etc_files: vec![(
            kiln_core::lang::warm::PYTHON_KERNEL_NAME.to_owned(),
            program.to_owned(),
        )],
        ..ParkSpec::exec()
    };
    let slot = sb.acquire_slot().await;
    let kernel = sb
        .start_kernel(
            &slot,
            kiln_sandbox::KernelStart {
                park: park(kiln_core::lang::warm::PYTHON_KERNEL),
                argv: vec!["/usr/bin/python3".into(), "-u".into(), kernel_path.into()],
                env: vec![("PATH".into(), "/usr/bin:/bin".into())],
                limits: limits(),
            },
        )
        .await
        .expect("kernel starts");
    let limits_of_eval = kiln_sandbox::EvalLimits {
        timeout: Duration::from_secs(10),
        grace: Duration::from_secs(2),
        stdout_bytes: 1 << 16,
        stderr_bytes: 1 << 16,
    };
    let r = kernel
        .eval(KERNEL_CODE_PROBE, limits_of_eval, None)
        .await
        .expect("eval");
    assert!(r.error.is_none(), "{r:?}");
    assert_eq!(String::from_utf8_lossy(&r.stdout), "True True\n", "{r:?}");
    kernel.close().await;
    drop(slot); // its clean-up runs before the next take of it

    // other bytes at the kernel's path: that file's program runs, not the template's code
    let slot = sb.acquire_slot().await;
    let jail = sb
        .park(&slot, &park("print('its own program')\n"), &limits(), None)
        .await
        .expect("park");
    let req = go(&jail, &["/usr/bin/python3", "-u", kernel_path], limits());
    let r = sb
        .run_parked(&slot, jail, req, CancellationToken::new())
        .await
        .expect("run");
    assert_eq!(stdout(&r), "its own program\n", "stderr: {}", stderr(&r));
    assert_eq!(r.exit, kiln_core::ExitStatus::Code(0));
    drop(slot);
}
