//! What a program sees inside a jail: output and exit status, identity,
//! environment, filesystem, network, processes.

mod common;

use std::os::unix::fs::MetadataExt;

use common::*;
use kiln_core::ExitStatus;
use kiln_sandbox::{SandboxError, Slot};
use tokio_util::sync::CancellationToken;

const UID_BASE: u32 = 1_500_000_000;

async fn run_argv(slot: &Slot, argv: &[&str]) -> Result<kiln_sandbox::RunResult, SandboxError> {
    let sb = sandbox(UID_BASE).expect("sandbox checked by caller");
    let ws = workspace(slot);
    sb.run(slot, request(&ws, argv, limits()), CancellationToken::new())
        .await
}

#[tokio::test]
async fn echo_output_is_captured() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let r = run_argv(&slot, &["/bin/echo", "hello", "jail"])
        .await
        .expect("run");
    assert_eq!(stdout(&r), "hello jail\n");
    assert_eq!(r.stderr, b"");
    assert_eq!(r.exit, ExitStatus::Code(0));
    assert!(!r.timed_out && !r.oom_killed && !r.stdout_overflow && !r.stderr_overflow);
    assert!(r.cpu_time.is_some(), "cpu time reported");
    assert!(r.memory_peak.is_some_and(|m| m > 0), "memory peak reported");
}

#[tokio::test]
async fn exit_code_propagates() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let r = sh(sb, &slot, "echo out; echo err >&2; exit 42").await;
    assert_eq!(r.exit, ExitStatus::Code(42));
    assert_eq!(stdout(&r), "out\n");
    assert_eq!(stderr(&r), "err\n");
}

#[tokio::test]
async fn signal_death_is_reported() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let r = sh(sb, &slot, "kill -SEGV $$").await;
    assert_eq!(r.exit, ExitStatus::Signal(libc::SIGSEGV));
}

#[tokio::test]
async fn signals_are_reset_for_the_user_program() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    // With SIGPIPE ignored (Rust's default in the helper) `yes` would see
    // EPIPE and complain instead of dying of SIGPIPE.
    let r = run_argv(
        &slot,
        &["/bin/bash", "-c", "yes | head -n1; echo ${PIPESTATUS[0]}"],
    )
    .await
    .expect("run");
    assert_eq!(stdout(&r), "y\n141\n", "stderr: {}", stderr(&r));
    assert_eq!(r.stderr, b"");
}

#[tokio::test]
async fn python_runs_inside() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let r = run_argv(
        &slot,
        &[
            "/usr/bin/python3",
            "-c",
            "import json, sys, threading, multiprocessing as mp\n\
             t = threading.Thread(target=lambda: None); t.start(); t.join()\n\
             with mp.Pool(2) as p: squares = p.map(abs, [-1, -2])\n\
             print(sys.version_info[0], json.dumps(squares))",
        ],
    )
    .await
    .expect("run");
    assert_eq!(stdout(&r), "3 [1, 2]\n", "stderr: {}", stderr(&r));
    assert_eq!(r.exit, ExitStatus::Code(0));
}

#[tokio::test]
async fn environment_is_exactly_the_given_one() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let ws = workspace(&slot);
    let mut req = request(&ws, &["/usr/bin/env"], limits());
    req.env = vec![
        ("ONLY".into(), "this".into()),
        ("AND".into(), "that=1".into()),
    ];
    assert!(
        std::env::var_os("CARGO_MANIFEST_DIR").is_some(),
        "the host test process has variables that must not leak"
    );
    let r = sb
        .run(&slot, req, CancellationToken::new())
        .await
        .expect("run");
    assert_eq!(stdout(&r), "ONLY=this\nAND=that=1\n");
}

#[tokio::test]
async fn user_is_1000_and_etc_is_ours() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let r = sh(
        sb,
        &slot,
        "id -u; id -g; id -G; id -un; hostname; cat /etc/machine-id; \
         cat /etc/passwd; ls /etc/shadow 2>&1; echo ~",
    )
    .await;
    let out = stdout(&r);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        &lines[..6],
        &[
            "1000",
            "1000",
            "1000",
            "sandbox",
            "sandbox",
            "00000000000000000000000000000000"
        ]
    );
    assert_eq!(
        &lines[6..9],
        &[
            "root:x:0:0:root:/root:/bin/sh",
            "sandbox:x:1000:1000:sandbox:/mnt/data:/bin/bash",
            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin",
        ]
    );
    assert!(lines[9].contains("No such file"), "{out}");
    assert_eq!(lines[10], "/mnt/data");
}

#[tokio::test]
async fn capabilities_are_empty_and_no_new_privs_is_set() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let r = sh(
        sb,
        &slot,
        "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status",
    )
    .await;
    let out = stdout(&r);
    for cap in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert!(
            out.contains(&format!("{cap}:\t0000000000000000")),
            "{cap} not empty: {out}"
        );
    }
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    assert!(out.contains("Seccomp:\t2"), "{out}");
}

#[tokio::test]
async fn usr_and_root_are_read_only_and_the_workspace_is_writable() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let ws = workspace(&slot);
    let script = "touch /usr/x; touch /x; touch /etc/x; touch /etc/ssl/x; \
                  mkdir /newdir; echo hi > /mnt/data/f && cat /mnt/data/f";
    let r = sb
        .run(
            &slot,
            request(&ws, &["/bin/sh", "-c", script], limits()),
            CancellationToken::new(),
        )
        .await
        .expect("run");
    assert_eq!(stdout(&r), "hi\n");
    let err = stderr(&r);
    assert_eq!(
        err.matches("Read-only file system").count(),
        5,
        "every write outside /mnt/data must fail: {err}"
    );
    let meta = std::fs::metadata(ws.path.join("f")).expect("file written through the bind");
    assert_eq!(
        meta.uid(),
        slot.host_uid(),
        "owned by the slot's uid on the host"
    );
    assert_eq!(meta.gid(), slot.host_gid());
}

/// The root is built with the umask cleared and each entry made with its
/// final mode (no `chmod` after it): pins the modes and owner (the jail's
/// root, uid 0; procfs is the host's root's, unmapped) that entries had
/// when each was `chmod`ed, and that the program still starts with umask
/// 022.
#[tokio::test]
async fn the_roots_entries_have_their_planned_modes_and_the_program_umask_022() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let r = sh(
        sb,
        &slot,
        "stat -c '%n %a %u' / /etc /etc/passwd /etc/hosts /etc/resolv.conf /mnt /tmp /dev \
         /dev/shm /proc; touch /tmp/f; mkdir /tmp/d; stat -c '%n %a' /tmp/f /tmp/d; umask",
    )
    .await;
    assert_eq!(
        stdout(&r),
        "/ 755 0\n/etc 755 0\n/etc/passwd 644 0\n/etc/hosts 644 0\n/etc/resolv.conf 644 0\n\
         /mnt 755 0\n/tmp 1777 0\n/dev 755 0\n/dev/shm 1777 0\n/proc 555 65534\n\
         /tmp/f 644\n/tmp/d 755\n0022\n",
        "stderr: {}",
        stderr(&r)
    );
}

#[tokio::test]
async fn tmp_and_shm_are_writable_but_not_executable() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let r = sh(
        sb,
        &slot,
        "echo ok > /tmp/a && cat /tmp/a; cp /bin/true /tmp/t && /tmp/t; echo tmp=$?; \
         echo ok > /dev/shm/a && cat /dev/shm/a; cp /bin/true /dev/shm/t && /dev/shm/t; echo shm=$?; \
         touch /dev/newnode; echo dev=$?",
    )
    .await;
    assert_eq!(
        stdout(&r),
        "ok\ntmp=126\nok\nshm=126\ndev=1\n",
        "stderr: {}",
        stderr(&r)
    );
}

#[tokio::test]
async fn network_is_loopback_only_and_down() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let script = r#"
import fcntl, socket, struct
for fam in (socket.AF_INET, socket.AF_INET6):
    try:
        socket.socket(fam, socket.SOCK_STREAM)
        print("socket allowed")
    except PermissionError:
        print("socket denied")
devs = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
print("devices", devs)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, struct.pack("16sH14x", b"lo", 0)))[1]
print("lo up", bool(flags & 1))
"#;
    let r = run_argv(&slot, &["/usr/bin/python3", "-c", script])
        .await
        .expect("run");
    assert_eq!(
        stdout(&r),
        "socket denied\nsocket denied\ndevices ['lo']\nlo up False\n",
        "stderr: {}",
        stderr(&r)
    );
}

#[tokio::test]
async fn proc_shows_only_the_jail_and_hides_sensitive_entries() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let masked = [
        "kcore",
        "kallsyms",
        "sched_debug",
        "timer_list",
        "keys",
        "sysrq-trigger",
        "latency_stats",
    ];
    let r = sh(
        sb,
        &slot,
        &format!(
            "echo pid=$$; ls /proc | grep -c '^[0-9]'; \
             echo x > /proc/sys/kernel/hostname; echo sys=$?; ls /sys 2>&1 | head -1; \
             for f in {}; do [ -e /proc/$f ] && echo $f=$(wc -c < /proc/$f); done; true",
            masked.join(" ")
        ),
    )
    .await;
    let out = stdout(&r);
    let lines: Vec<&str> = out.lines().collect();
    // Init is pid 1, the shell pid 2; the host's processes are invisible.
    assert_eq!(lines[0], "pid=2", "{out}");
    let visible: u32 = lines[1].parse().expect("count");
    assert!(visible <= 4, "only the jail's processes: {visible}");
    assert_eq!(lines[2], "sys=2", "/proc/sys is read-only: {}", stderr(&r));
    assert!(lines[3].contains("No such file"), "no /sys: {out}");
    let mut checked = 0;
    for m in masked {
        if std::path::Path::new("/proc").join(m).exists() {
            assert!(
                lines.contains(&format!("{m}=0").as_str()),
                "{m} not masked: {out}"
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "the host has none of the masked entries");
}

#[tokio::test]
async fn missing_program_is_an_exec_error() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let err = run_argv(&slot, &["/usr/bin/no-such-program"])
        .await
        .expect_err("exec must fail");
    match err {
        SandboxError::Exec(m) => assert!(
            m.contains("/usr/bin/no-such-program") && m.contains("ENOENT"),
            "{m}"
        ),
        other => panic!("expected Exec, got {other:?}"),
    }
}

#[tokio::test]
async fn unreachable_workspace_is_refused_before_spawning() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let ws = workspace(&slot);
    let mut req = request(&ws, &["/bin/true"], limits());
    req.workspace = slot.workspace_parent().join("missing");
    assert!(matches!(
        sb.run(&slot, req, CancellationToken::new()).await,
        Err(SandboxError::Io { .. })
    ));
}

#[tokio::test]
async fn a_workspace_outside_the_slots_quota_area_is_refused() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let other = sb.acquire_slot().await;
    let ws = workspace(&slot);
    let elsewhere = tempfile::tempdir().expect("tempdir");
    for path in [
        elsewhere.path().to_path_buf(),
        ws.path.join("nested"),
        workspace(&other).path.clone(),
    ] {
        let mut req = request(&ws, &["/bin/true"], limits());
        req.workspace = path.clone();
        assert!(
            matches!(
                sb.run(&slot, req, CancellationToken::new()).await,
                Err(SandboxError::Request(_))
            ),
            "{} accepted",
            path.display()
        );
    }
}

#[tokio::test]
async fn concurrent_runs_in_different_slots_are_isolated() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let a = sb.acquire_slot().await;
    let b = sb.acquire_slot().await;
    assert_ne!(a.host_uid(), b.host_uid());
    // Each jail leaves a marker in /tmp and in its workspace, waits for the
    // other to do the same, then looks for the other's traces.
    let script = |me: &str| {
        format!(
            "touch /tmp/marker-{me} /mnt/data/marker-{me}; sleep 1 & sleep 0.5; \
             ls /tmp /mnt/data | tr '\\n' ' '; echo; ls /proc | grep -c '^[0-9]'; wait"
        )
    };
    let (sa, sb_script) = (script("a"), script("b"));
    let (ra, rb) = tokio::join!(sh(sb, &a, &sa), sh(sb, &b, &sb_script));
    for (r, me, other) in [(&ra, "a", "b"), (&rb, "b", "a")] {
        let out = stdout(r);
        let mut lines = out.lines();
        let listing = lines.next().unwrap_or_default();
        assert_eq!(
            listing.matches(&format!("marker-{me}")).count(),
            2,
            "{me} sees its own files: {out}"
        );
        assert!(
            !listing.contains(&format!("marker-{other}")),
            "{me} sees {other}'s files: {out}"
        );
        let procs: u32 = lines.next().unwrap_or("99").parse().unwrap_or(99);
        assert!(procs <= 5, "{me} sees foreign processes: {out}");
    }
    // Both overlapped in time.
    assert!(ra.wall_time.as_millis() >= 900 && rb.wall_time.as_millis() >= 900);
}

#[tokio::test]
async fn a_project_is_the_working_directory_and_keeps_what_the_run_writes() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let ws = workspace(&slot);
    let project = workspace(&slot);
    std::fs::write(project.path.join("before.txt"), "from the host").unwrap();
    let mut req = request(
        &ws,
        &[
            "/bin/sh",
            "-c",
            "pwd; cat before.txt; echo; echo made > made.txt; echo data > /mnt/data/out.txt",
        ],
        limits(),
    );
    req.project = Some(project.path.clone());
    let r = sb.run(&slot, req, CancellationToken::new()).await.unwrap();
    assert_eq!(r.exit, ExitStatus::Code(0), "{}", stderr(&r));
    assert_eq!(stdout(&r), "/workspace\nfrom the host\n");
    assert_eq!(
        std::fs::read_to_string(project.path.join("made.txt")).unwrap(),
        "made\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path.join("out.txt")).unwrap(),
        "data\n"
    );

    // a project outside the slot's area (no quota there) is refused
    let outside = tempfile::tempdir().unwrap();
    let mut req = request(&ws, &["/bin/true"], limits());
    req.project = Some(outside.path().to_path_buf());
    assert!(matches!(
        sb.run(&slot, req, CancellationToken::new()).await,
        Err(SandboxError::Request(_))
    ));
    // without a project the program starts in /mnt/data, with no /workspace
    let r = sh(sb, &slot, "pwd; test -e /workspace && echo there").await;
    assert_eq!(stdout(&r), "/mnt/data\n");
}
