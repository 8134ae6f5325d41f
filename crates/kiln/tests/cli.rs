//! The `kiln` binary itself: `doctor`, `exec` (input files, saved outputs),
//! `health` and `doctor` taking `serve`'s flags, `serve` reporting a busy
//! port before it starts anything (and a runtime image that is not built) and stopping
//! cleanly on SIGTERM, and its log on a pipe.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

#[test]
fn doctor_reports_an_enforceable_sandbox_and_the_languages() {
    common::require_root();
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(KILN)
        .arg("doctor")
        // a port of its own: another server on 8000 must not fail this test
        .env("KILN_LISTEN", "127.0.0.1:0")
        .env("KILN_DATA_DIR", data.path())
        .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
        // the disk check weighs free space against max_concurrency full workspaces: a
        // small configuration keeps "ok" a statement about Kiln, not about how full the
        // test machine's disk happens to be (CI's had 4.7 GiB free, under the defaults' 9)
        .env("KILN_MAX_CONCURRENCY", "2")
        .env("KILN_WORKSPACE_MB", "64")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("sandbox: enforceable"), "{text}");
    for check in [
        "data dir",
        "listen",
        "auth",
        "uid range",
        "swap",
        "hugepages",
        "runtimes",
        "disk",
    ] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with("ok") && l.contains(check)),
            "check {check:?} is not ok: {text}"
        );
    }
    assert!(
        text.contains("summary: sandbox enforceable; 0 check(s) failed"),
        "{text}"
    );
    for lang in ["py", "js", "bash"] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(lang) && l.contains("ok")),
            "{lang}: {text}"
        );
    }
}

/// The lines of `kiln doctor`'s output about one check: its own and its `fix:` line.
fn check_lines<'a>(text: &'a str, check: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = text.lines().collect();
    let Some(i) = lines
        .iter()
        .position(|l| l.get(7..).is_some_and(|rest| rest.starts_with(check)))
    else {
        return Vec::new();
    };
    let mut out = vec![lines[i]];
    if let Some(next) = lines
        .get(i + 1)
        .filter(|l| l.trim_start().starts_with("fix:"))
    {
        out.push(next);
    }
    out
}

#[test]
fn doctor_names_what_an_operator_got_wrong_and_how_to_fix_it() {
    // a data dir below a directory others cannot search (as /root is)
    let tmp = tempfile::tempdir().unwrap();
    let closed = tmp.path().join("home");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    // the port held by someone else: this test
    let held = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let out = Command::new(KILN)
        .arg("doctor")
        .env("KILN_DATA_DIR", closed.join("kiln-data"))
        .env("KILN_LISTEN", format!("0.0.0.0:{port}"))
        .env_remove("KILN_API_KEY")
        .env_remove("LIBRECHAT_CODE_API_KEY")
        .env_remove("CI_API_KEY")
        .env_remove("KILN_AUTH")
        // jails would run as root and every system account
        .env("KILN_UID_BASE", "0")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "a failed check must fail doctor: {text}"
    );

    let data = check_lines(&text, "data dir").join("\n");
    assert!(data.contains("WARN"), "{text}");
    assert!(data.contains("has mode 0700"), "{data}");
    assert!(data.contains("/var/lib/kiln/work-"), "{data}");
    assert!(
        data.contains(&format!("chmod o+x {}", closed.display())),
        "{data}"
    );

    let listen = check_lines(&text, "listen").join("\n");
    assert!(listen.contains("FAIL"), "{text}");
    assert!(
        listen.contains(&format!("(pid {})", std::process::id())),
        "doctor names the process holding the port: {listen}"
    );

    let auth = check_lines(&text, "auth").join("\n");
    assert!(auth.contains("WARN"), "{text}");
    assert!(auth.contains("anyone who can reach this port"), "{auth}");
    assert!(auth.contains("fix:"), "{auth}");

    let uids = check_lines(&text, "uid range").join("\n");
    assert!(uids.contains("FAIL"), "{text}");
    assert!(uids.contains("root (0)"), "{uids}");
    assert!(uids.contains("KILN_UID_BASE"), "{uids}");
    assert!(text.contains("check(s) failed"), "{text}");
    drop(held);
}

#[test]
fn health_fails_when_nothing_answers() {
    // a port that was free a moment ago: nothing listens there
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(KILN)
        .args(["health", "--timeout", "2"])
        .env("KILN_LISTEN", format!("0.0.0.0:{port}"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // a wildcard listen address is asked on loopback
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    // and how to ask another one
    assert!(
        err.contains("--listen") && err.contains("KILN_LISTEN"),
        "{err}"
    );
}

#[test]
fn exec_runs_a_file_and_exits_with_its_code() {
    common::require_root();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("prog.py");
    std::fs::write(&f, "import sys\nprint('args', sys.argv[1:])\nsys.exit(3)\n").unwrap();
    let out = Command::new(KILN)
        .args(["exec", "--lang", "py"])
        .arg(&f)
        .args(["a", "--b"])
        .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "args ['a', '--b']\n");
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn exec_prints_output_as_the_program_writes_it() {
    use std::io::BufRead as _;
    common::require_root();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("slow.py");
    std::fs::write(
        &f,
        "import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')\n",
    )
    .unwrap();
    let started = std::time::Instant::now();
    let mut child = Command::new(KILN)
        .args(["exec", "--lang", "py"])
        .arg(&f)
        .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "first");
    let first_at = started.elapsed();
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first line came while the program still ran ({first_at:?})"
    );
    assert_eq!(lines.next().unwrap().unwrap(), "second");
    assert!(lines.next().is_none(), "nothing printed twice");
    assert!(child.wait().unwrap().success());
    assert!(
        started.elapsed() >= first_at + std::time::Duration::from_secs(2),
        "the second line waited for the sleep"
    );
}

#[test]
fn exec_still_prints_what_a_failed_compile_step_said() {
    common::require_root();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("broken.c");
    std::fs::write(&f, "int main(void) { return undefined_name; }\n").unwrap();
    let out = Command::new(KILN)
        .args(["exec", "--lang", "c"])
        .arg(&f)
        .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("undefined_name"), "{err}");
    assert!(!out.status.success());
}

/// A `kiln serve` child on a free port with a fresh data dir, its JSON log
/// read on a thread.
struct Served {
    child: std::process::Child,
    addr: String,
    log: std::sync::mpsc::Receiver<String>,
    reader: std::thread::JoinHandle<()>,
    /// The log lines up to `kiln listening`.
    early: Vec<String>,
    _data: tempfile::TempDir,
}

fn serve() -> Served {
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(KILN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path())
        .env("KILN_LOG_FORMAT", "json")
        .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // read the log on a thread so a server that never listens fails the test
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut early = Vec::new();
    let addr = loop {
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => l,
            Err(e) => {
                let _ = child.kill();
                panic!("no 'kiln listening' log line: {e}");
            }
        };
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("kiln listening"))
        {
            break v["fields"]["addr"].as_str().unwrap().to_owned();
        }
        early.push(line);
    };
    Served {
        child,
        addr,
        log: rx,
        reader,
        early,
        _data: data,
    }
}

/// `(mount point, source)` of every mount in `/proc/<pid>/mountinfo`.
fn mounts_of(pid: &str) -> Vec<(String, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let point = l.split(' ').nth(4)?;
            let source = l.split(" - ").nth(1)?.split(' ').nth(1)?;
            Some((point.to_owned(), source.to_owned()))
        })
        .collect()
}

/// Each process's parent, from `/proc/*/stat`.
fn parents() -> std::collections::HashMap<u32, u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // after the command name in parentheses: state, then the parent
            let ppid = stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// The slot index of the run whose cgroup holds `pid` (`<server>-<slot>-<seq>`).
fn run_slot_of(pid: u32, server: u32) -> Option<u32> {
    let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    groups.lines().find_map(|l| {
        let name = l.rsplit('/').next()?;
        let mut parts = name.split('-');
        (parts.next()? == server.to_string()).then_some(())?;
        parts.next()?.parse().ok()
    })
}

/// The slot indices of `slots` (the slots directory) whose filesystems or
/// mount points the mount namespace of `pid` holds.
fn slot_mounts_of(pid: u32, slots: &std::path::Path) -> Vec<u32> {
    mounts_of(&pid.to_string())
        .into_iter()
        .filter_map(|(point, _)| {
            let (dir, index) = point.rsplit_once('/')?;
            (std::path::Path::new(dir) == slots).then_some(())?;
            index.parse().ok()
        })
        .collect()
}

/// One-shot jails are made from a namespace without the kernel slots, and a
/// kernel's jail from one holding only its own slot (handed over as a
/// copy of its mount): no jail's `CLONE_NEWNS` copies a mount per kernel.
#[test]
fn jails_are_made_from_mount_namespaces_without_other_kernels_slots() {
    common::require_root();
    let Served {
        mut child,
        addr,
        reader,
        early,
        _data,
        ..
    } = serve();
    let server = child.id();
    // the server's slots directory: where its own filesystems are mounted
    let host = mounts_of("self");
    let slots_dir = mounts_of(&server.to_string())
        .into_iter()
        .filter(|m| !host.contains(m))
        .find_map(|(point, _)| {
            let (dir, index) = point.rsplit_once('/')?;
            index.parse::<u32>().ok()?;
            dir.ends_with("/slots")
                .then(|| std::path::PathBuf::from(dir))
        })
        .expect("the server mounts its slots' filesystems");
    let ready: serde_json::Value = early
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["fields"]["message"] == "sandbox ready")
        .expect("the sandbox's start-up line");
    let slots = ready["fields"]["slots"].as_u64().unwrap() as u32;
    let kernel_slots = ready["fields"]["kernel_slots_on_demand"].as_u64().unwrap() as u32;
    assert!(kernel_slots > 0, "{ready}");
    let first_kernel_slot = slots - kernel_slots;
    // a live kernel
    let rt = tokio::runtime::Runtime::new().unwrap();
    kiln_egress::install_crypto_provider();
    let created = rt.block_on(async {
        let r = reqwest::Client::new()
            .post(format!("http://{addr}/v1/sessions"))
            .json(&serde_json::json!({"lang": "py"}))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    });
    assert_eq!(created.0, 201, "create a kernel: {}", created.1);
    // Jails' helpers (whose CLONE_NEWNS copies their mount table) are the
    // parents of the outermost process of each run's cgroup: one-shot ones
    // (the warm pool's parked jails) and the kernel's.
    let t = Instant::now();
    let (one_shot, kernels) = loop {
        let parents = parents();
        let (mut one_shot, mut kernels) = (Vec::new(), Vec::new());
        for (&pid, &ppid) in &parents {
            let Some(slot) = run_slot_of(pid, server) else {
                continue;
            };
            let helper = std::fs::read(format!("/proc/{ppid}/cmdline")).unwrap_or_default();
            let helper = String::from_utf8_lossy(&helper);
            if run_slot_of(ppid, server).is_some()
                || !(helper.contains("__launcher") || helper.contains("__jail"))
            {
                continue;
            }
            if slot >= first_kernel_slot {
                kernels.push((pid, ppid, slot));
            } else {
                one_shot.push((ppid, slot));
            }
        }
        if !one_shot.is_empty() && !kernels.is_empty() {
            break (one_shot, kernels);
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no parked one-shot jail and kernel found: {one_shot:?} {kernels:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let server_slots = slot_mounts_of(server, &slots_dir);
    let server_mounts = mounts_of(&server.to_string());
    for (kernel, helper, slot) in &kernels {
        assert!(
            server_slots.contains(slot),
            "the server holds kernel slot {slot}'s filesystem: {server_slots:?}"
        );
        // (a launcher holds a kernel's slot while it clones that kernel's
        // jail: the pool may be starting one ahead right now, so a held slot
        // must be let go within moments, not be seen never)
        let t = Instant::now();
        loop {
            let kernel_mounts: Vec<u32> = slot_mounts_of(*helper, &slots_dir)
                .into_iter()
                .filter(|&s| s >= first_kernel_slot)
                .collect();
            if kernel_mounts.is_empty() {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the kernel's helper {helper} holds kernel slots {kernel_mounts:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // the kernel's workspaces are on its slot's filesystem all the same
        let point = slots_dir.join(slot.to_string());
        let (_, device) = server_mounts
            .iter()
            .find(|(p, _)| std::path::Path::new(p) == point)
            .expect("the slot's mount");
        let jail_mounts = mounts_of(&kernel.to_string());
        assert!(
            jail_mounts.iter().any(|(_, source)| source == device),
            "kernel {kernel} has its slot's filesystem {device}: {jail_mounts:?}"
        );
    }
    for (helper, slot) in &one_shot {
        let seen = slot_mounts_of(*helper, &slots_dir);
        assert!(
            seen.contains(slot),
            "helper {helper} sees its own slot {slot}"
        );
        let kernel_mounts: Vec<&u32> = seen.iter().filter(|&&s| s >= first_kernel_slot).collect();
        assert!(
            kernel_mounts.is_empty(),
            "the one-shot jail of slot {slot} is made from a namespace holding kernel slots {kernel_mounts:?}"
        );
    }
    // the fork-servers (templates) of a runtime image need no workspace
    let zygotes: Vec<u32> = parents()
        .into_iter()
        .filter(|&(pid, ppid)| {
            ppid == server
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("__zygote"))
        })
        .map(|(pid, _)| pid)
        .collect();
    for z in zygotes {
        let own_ns = std::fs::read_link(format!("/proc/{z}/ns/mnt")).ok()
            != std::fs::read_link(format!("/proc/{server}/ns/mnt")).ok();
        let seen = slot_mounts_of(z, &slots_dir);
        assert!(
            !own_ns || seen.is_empty(),
            "the fork-server {z} holds slots {seen:?}"
        );
    }
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
}

/// The peer groups (`shared:N`) of the mounts on the slots of `slots` in
/// the mount namespace of `pid`, by slot index.
fn slot_peer_groups_of(
    pid: u32,
    slots: &std::path::Path,
) -> std::collections::BTreeMap<u32, Vec<String>> {
    let mut groups = std::collections::BTreeMap::<u32, Vec<String>>::new();
    for l in std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap_or_default()
        .lines()
    {
        let fields: Vec<&str> = l.split(' ').collect();
        let Some((dir, index)) = fields.get(4).and_then(|p| p.rsplit_once('/')) else {
            continue;
        };
        let Ok(index) = index.parse::<u32>() else {
            continue;
        };
        if std::path::Path::new(dir) != slots {
            continue;
        }
        let shared = fields
            .iter()
            .skip(6)
            .take_while(|f| **f != "-")
            .find(|f| f.starts_with("shared:"))
            .map_or_else(|| "private".to_owned(), |f| (*f).to_owned());
        groups.entry(index).or_default().push(shared);
    }
    groups
}

#[test]
fn the_one_shot_jails_namespace_receives_every_slot_filesystem_the_server_mounts_later() {
    common::require_root();
    let Served {
        mut child,
        reader,
        _data,
        ..
    } = serve();
    let server = child.id();
    // `kiln __launcher <slots dir>`: the one-shot jails' launcher
    let (launcher, slots_dir) = parents()
        .into_iter()
        .filter(|&(_, ppid)| ppid == server)
        .find_map(|(pid, _)| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            (args.get(1) == Some(&&b"__launcher"[..])).then_some(())?;
            let dir = args.get(2).filter(|a| !a.is_empty())?;
            Some((
                pid,
                std::path::PathBuf::from(String::from_utf8_lossy(dir).into_owned()),
            ))
        })
        .expect("the one-shot jails' launcher");
    // A slot's filesystem made afresh (a workspace too large to walk) is
    // unmounted and mounted again in the server's namespace; the
    // launcher's copy gets both only where the slot's mount point is in
    // the same peer group in both namespaces.
    let theirs = slot_peer_groups_of(launcher, &slots_dir);
    let ours = slot_peer_groups_of(server, &slots_dir);
    assert!(!theirs.is_empty(), "the launcher sees no slot");
    for (slot, groups) in &theirs {
        assert!(
            groups.iter().all(|g| g.starts_with("shared:")),
            "slot {slot}'s mounts in the launcher's namespace: {groups:?}"
        );
        assert_eq!(
            Some(groups),
            ours.get(slot),
            "slot {slot}: the launcher's peer groups differ from the server's"
        );
    }
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
}

#[test]
fn serve_stops_cleanly_on_sigterm() {
    common::require_root();
    let Served {
        child,
        addr,
        log: rx,
        reader,
        _data,
        ..
    } = serve();
    // it serves
    let rt = tokio::runtime::Runtime::new().unwrap();
    kiln_egress::install_crypto_provider();
    let health = rt.block_on(async {
        reqwest::get(format!("http://{addr}/v1/health"))
            .await
            .map(|r| r.status().as_u16())
    });
    assert_eq!(health.unwrap(), 200);
    // `kiln health` (the container health check) says the same, through KILN_LISTEN
    let probe = Command::new(KILN)
        .arg("health")
        .env("KILN_LISTEN", &addr)
        .output()
        .unwrap();
    assert!(
        probe.status.success(),
        "kiln health against {addr}: {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    assert!(String::from_utf8_lossy(&probe.stdout).contains(" 200 "));
    // SIGTERM: exits 0, promptly
    stop_with_sigterm(child, reader, &rx, Duration::from_secs(15));
}

/// Sends SIGTERM and checks that `kiln serve` exits 0 within `limit`,
/// saying that it stopped.
fn stop_with_sigterm(
    mut child: std::process::Child,
    reader: std::thread::JoinHandle<()>,
    log: &std::sync::mpsc::Receiver<String>,
    limit: Duration,
) {
    let t = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t.elapsed() < limit, "kiln did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status:?}");
    // it logged that it stopped
    reader.join().unwrap();
    let rest: Vec<String> = log.try_iter().collect();
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:?}");
}

#[test]
fn sigterm_with_live_kernels_closes_every_one_and_leaves_no_jail_process() {
    common::require_root();
    let served = serve();
    let addr = &served.addr;
    let rt = tokio::runtime::Runtime::new().unwrap();
    kiln_egress::install_crypto_provider();
    let http = reqwest::Client::new();
    const KERNELS: usize = 12;
    for n in 0..KERNELS {
        let created = rt.block_on(async {
            let r = http
                .post(format!("http://{addr}/v1/sessions"))
                .header("User-Id", format!("user-{n}"))
                .json(&serde_json::json!({"lang": "py"}))
                .send()
                .await?;
            let status = r.status();
            Ok::<_, reqwest::Error>((status, r.text().await?))
        });
        let (status, body) = created.unwrap();
        assert!(status.is_success(), "create {n}: {status} {body}");
    }
    // what the server started: launchers, fork-servers, and each kernel's
    // helper, init and interpreter (pid and start time, so a reused pid is
    // not mistaken for a survivor)
    let started = descendants(served.child.id());
    assert!(
        started.len() >= 3 * KERNELS,
        "each kernel is three processes: {started:?}"
    );
    stop_with_sigterm(
        served.child,
        served.reader,
        &served.log,
        Duration::from_secs(30),
    );
    let left: Vec<_> = started
        .iter()
        .filter(|(pid, since)| start_time(*pid).as_ref() == Some(since))
        .collect();
    assert!(left.is_empty(), "processes outlived the server: {left:?}");
}

/// `(pid, start time)` of every process below `root`.
fn descendants(root: u32) -> Vec<(u32, String)> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let after = stat.rsplit_once(')')?.1;
            Some((pid, after.split_whitespace().nth(1)?.parse().ok()?))
        })
        .collect();
    let mut below = vec![root];
    let mut i = 0;
    while i < below.len() {
        let p = below[i];
        below.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    below[1..]
        .iter()
        .filter_map(|pid| Some((*pid, start_time(*pid)?)))
        .collect()
}

/// Field 22 of `/proc/<pid>/stat`: when the process started.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(19)?
            .to_owned(),
    )
}

#[tokio::test]
async fn exec_on_a_server_streams_the_output_and_exits_with_the_programs_code() {
    use tokio::io::AsyncBufReadExt as _;
    let s = common::server_with(|c| c.api_key = Some("cli-remote-key".into())).await;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("slow.py");
    std::fs::write(
        &f,
        "import sys, time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second', sys.argv[1:])\nsys.exit(4)\n",
    )
    .unwrap();
    let run = |key: &str| {
        let mut cmd = tokio::process::Command::new(KILN);
        cmd.args(["exec", "--lang", "py", "--server", &s.base_url])
            .arg(&f)
            .arg("x")
            .env("KILN_API_KEY", key)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        cmd
    };
    let started = std::time::Instant::now();
    let mut child = run("cli-remote-key").spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next_line().await.unwrap().unwrap(), "first");
    let first_at = started.elapsed();
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first line came while the program still ran ({first_at:?})"
    );
    assert_eq!(lines.next_line().await.unwrap().unwrap(), "second ['x']");
    assert_eq!(child.wait().await.unwrap().code(), Some(4));
    assert!(started.elapsed() >= first_at + std::time::Duration::from_secs(2));

    // a wrong key is refused with the server's answer
    let out = run("wrong").output().await.unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("401"), "{err}");
    s.stop().await.unwrap();
}

#[test]
fn a_server_killed_with_sigkill_leaves_no_mount_or_loop_device_on_the_host() {
    common::require_root();
    let Served {
        mut child,
        reader,
        log,
        _data,
        ..
    } = serve();
    let pid = child.id().to_string();
    let host: Vec<(String, String)> = mounts_of("self");
    // the server's own mounts (its slot filesystems, made while it starts
    // serving) exist only in its namespace
    let t = Instant::now();
    let own: Vec<(String, String)> = loop {
        let own: Vec<(String, String)> = mounts_of(&pid)
            .into_iter()
            .filter(|m| !host.contains(m))
            .collect();
        if own
            .iter()
            .filter(|(point, _)| point.contains("/slots/"))
            .count()
            >= 2
        {
            break own;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the server mounts a filesystem per slot: {own:?}; log: {:?}",
            log.try_iter().collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let images: Vec<String> = own
        .iter()
        .filter(|(_, source)| source.starts_with("/dev/loop"))
        .filter_map(|(point, source)| {
            let dev = source.trim_start_matches("/dev/");
            let backing =
                std::fs::read_to_string(format!("/sys/block/{dev}/loop/backing_file")).ok()?;
            assert!(
                backing.trim().starts_with(point.rsplit_once('/')?.0),
                "{dev} holds {backing} for {point}"
            );
            Some(backing.trim().to_owned())
        })
        .collect();
    let host_now = mounts_of("self");
    for (point, _) in &own {
        assert!(
            !host_now.iter().any(|(p, _)| p == point),
            "{point} is mounted on the host too"
        );
    }
    // SIGKILL: no clean-up code runs; the kernel must drop it all
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    let t = Instant::now();
    loop {
        let attached: Vec<String> = std::fs::read_dir("/sys/block")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
            .map(|b| b.trim().trim_end_matches(" (deleted)").to_owned())
            .filter(|b| images.contains(b))
            .collect();
        if attached.is_empty() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "loop devices still attached 10 s after the server died: {attached:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let host_after = mounts_of("self");
    for (point, _) in &own {
        assert!(
            !host_after.iter().any(|(p, _)| p == point),
            "{point} left mounted"
        );
    }
}

#[tokio::test]
async fn health_takes_serves_listen_flag_and_resolves_host_names() {
    let s = common::server_with(|c| c.warm_jails = 0).await;
    let port = s.base_url.rsplit(':').next().unwrap().to_owned();
    let health = |listen: String| {
        let mut cmd = tokio::process::Command::new(KILN);
        cmd.args(["health", "--timeout", "5", "--listen", &listen])
            // the flag wins over the environment, as with `serve`
            .env("KILN_LISTEN", "127.0.0.1:1");
        cmd
    };
    let out = health(format!("127.0.0.1:{port}")).output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // a host name is resolved, not refused as "not host:port"
    let out = health(format!("localhost:{port}")).output().await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = health("no-such-host.invalid:8000".into())
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not resolve") && err.contains("IP address"),
        "{err}"
    );
    s.stop().await.unwrap();
}

/// `kiln serve` on a port this test holds, with a text log on a pipe:
/// (how long it took to give up, exit code, stdout, stderr).
fn serve_on_a_busy_port() -> (Duration, Option<i32>, String, String, u32) {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let data = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let out = Command::new(KILN)
        .args(["serve", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(data.path())
        .env("KILN_LOG_FORMAT", "text")
        .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    drop(holder);
    (
        started.elapsed(),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        port.into(),
    )
}

#[test]
fn serve_reports_a_busy_port_before_starting_anything_and_names_its_holder() {
    common::require_root();
    let (took, code, log, err, port) = serve_on_a_busy_port();
    assert_eq!(code, Some(1), "{log}{err}");
    assert!(
        err.contains(&format!("127.0.0.1:{port} is already in use")),
        "{err}"
    );
    // the holder is this test process
    assert!(
        err.contains(&format!("(pid {})", std::process::id())),
        "{err}"
    );
    assert!(err.contains("--listen"), "{err}");
    // nothing of the sandbox or the languages started
    assert!(!log.contains("sandbox ready"), "{log}");
    assert!(!log.contains("language"), "{log}");
    assert!(
        !log.contains("fork-server") && !err.contains("fork-server"),
        "{log}{err}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn serve_without_its_runtime_image_refuses_in_one_line_naming_the_build_command() {
    common::require_root();
    let data = tempfile::tempdir().unwrap();
    let no_images = tempfile::tempdir().unwrap();
    // `kiln <command>` at the default configuration, with a runtime dir holding no image
    let kiln = |command: &str| {
        Command::new(KILN)
            .args([command, "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data.path())
            .env("KILN_RUNTIME_DIR", no_images.path())
            .env_remove("KILN_RUNTIME_IMAGE")
            .env_remove("KILN_CONFIG")
            .env("KILN_LOG_FORMAT", "text")
            .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
            .output()
            .unwrap()
    };
    let started = Instant::now();
    let out = kiln("serve");
    let (log, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{log}{err}");
    let refusal: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("kiln runtime build"))
        .collect();
    assert_eq!(refusal.len(), 1, "{err}");
    assert!(
        refusal[0].starts_with("kiln: the default runtime image recipe-"),
        "{err}"
    );
    assert!(refusal[0].contains("runtime_image = \"host\""), "{err}");
    // nothing served, no jail started
    assert!(!log.contains("sandbox ready"), "{log}");
    assert!(started.elapsed() < Duration::from_secs(20));
    // and `kiln doctor` fails the same check, rather than passing "all 0 languages"
    let out = kiln("doctor");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{report}");
    let failed = check_lines(&report, "image");
    assert!(
        failed
            .iter()
            .any(|l| l.contains("FAIL") && l.contains("kiln runtime build")),
        "{report}"
    );
    assert!(check_lines(&report, "runtimes").is_empty(), "{report}");
}

#[test]
fn a_log_on_a_pipe_carries_no_colour_codes() {
    common::require_root();
    let (_, _, log, _, _) = serve_on_a_busy_port();
    assert!(log.contains("auth: none"), "{log}");
    assert!(!log.contains('\x1b'), "{log:?}");
}

#[test]
fn exec_refuses_an_unknown_language_and_lists_the_valid_ones() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("prog.cob");
    std::fs::write(&f, "DISPLAY 'HI'.").unwrap();
    let out = Command::new(KILN)
        .args(["exec", "--lang", "cobol"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unsupported language \"cobol\""), "{err}");
    for name in ["py", "js", "bash", "rs", "go"] {
        assert!(err.contains(name), "{name} not listed: {err}");
    }
}

/// A program that reads `data.csv` and writes `result.csv` and `sub/n.txt`.
const WRITES_OUTPUTS: &str = "import os\n\
rows = open('data.csv').read().split()\n\
open('result.csv', 'w').write('total\\n%d\\n' % sum(int(r) for r in rows))\n\
os.makedirs('sub', exist_ok=True)\n\
open('sub/n.txt', 'w').write(str(len(rows)))\n\
print('done')\n";

/// The input file and an output dir, for [`WRITES_OUTPUTS`].
fn outputs_job() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("sum.py");
    std::fs::write(&prog, WRITES_OUTPUTS).unwrap();
    let data = dir.path().join("data.csv");
    std::fs::write(&data, "1\n2\n39\n").unwrap();
    let out = dir.path().join("out");
    (dir, prog, data, out)
}

/// The outputs [`WRITES_OUTPUTS`] leaves in `out`, and the report.
fn assert_outputs_saved(out: &std::path::Path, stdout: &[u8], stderr: &[u8]) {
    let err = String::from_utf8_lossy(stderr);
    assert_eq!(String::from_utf8_lossy(stdout), "done\n", "{err}");
    assert_eq!(
        std::fs::read_to_string(out.join("result.csv")).unwrap(),
        "total\n42\n"
    );
    assert_eq!(std::fs::read_to_string(out.join("sub/n.txt")).unwrap(), "3");
    assert!(err.contains("output file: result.csv (saved to "), "{err}");
}

#[test]
fn exec_places_input_files_and_saves_outputs_in_the_out_dir() {
    common::require_root();
    let (_dir, prog, data, out) = outputs_job();
    let run = Command::new(KILN)
        .args(["exec", "--lang", "py", "--file"])
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .arg(&prog)
        .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
        .output()
        .unwrap();
    assert!(run.status.success());
    assert_outputs_saved(&out, &run.stdout, &run.stderr);
    // without --out the outputs are only named, and it says so
    let run = Command::new(KILN)
        .args(["exec", "--lang", "py", "--file"])
        .arg(&data)
        .arg(&prog)
        .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("output file: result.csv (not saved; use --out DIR)"),
        "{err}"
    );
}

#[tokio::test]
async fn exec_on_a_server_uploads_input_files_and_downloads_outputs_to_the_out_dir() {
    let s = common::server_with(|c| {
        c.warm_jails = 0;
        c.api_key = Some("cli-files-key".into());
    })
    .await;
    let (_dir, prog, data, out) = outputs_job();
    let run = tokio::process::Command::new(KILN)
        .args(["exec", "--lang", "py", "--server", &s.base_url, "--file"])
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .arg(&prog)
        .env("KILN_API_KEY", "cli-files-key")
        .output()
        .await
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_outputs_saved(&out, &run.stdout, &run.stderr);
    s.stop().await.unwrap();
}

/// Stops a served child with SIGTERM and returns every log line left.
fn stop_and_drain(served: Served) -> Vec<String> {
    let Served {
        mut child,
        log,
        reader,
        ..
    } = served;
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(child.wait().unwrap().success());
    reader.join().unwrap();
    log.try_iter().collect()
}

#[test]
fn the_log_keeps_records_on_one_line_polling_at_debug_and_streams_without_latency() {
    use serde_json::Value;
    common::require_root();
    let served = serve();
    let ready = served
        .early
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["fields"]["message"] == "sandbox ready" && v["fields"]["report"].is_string())
        .expect("the sandbox ready line with the host's report");
    let report = ready["fields"]["report"].as_str().unwrap();
    assert!(
        report.contains("kernel: ") && report.contains("; "),
        "{report}"
    );
    assert!(!report.contains('\n'), "{report:?}");

    let addr = served.addr.clone();
    let rt = tokio::runtime::Runtime::new().unwrap();
    kiln_egress::install_crypto_provider();
    rt.block_on(async {
        let http = reqwest::Client::new();
        // what an open console tab polls
        for _ in 0..3 {
            let r = http.get(format!("http://{addr}/v1/admin/status")).send().await.unwrap();
            assert_ne!(r.status(), 404);
        }
        // a streamed run that takes a while
        let body = http
            .post(format!("http://{addr}/v1/exec"))
            .header("Accept", "text/event-stream")
            .json(&serde_json::json!({"lang": "py", "code": "import time\ntime.sleep(1)\nprint('x')"}))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(body.contains("event: result"), "{body}");
        let r = http.get(format!("http://{addr}/v1/health")).send().await.unwrap();
        assert_eq!(r.status(), 200);
    });
    let lines: Vec<Value> = stop_and_drain(served)
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let route = |v: &Value| v["span"]["route"].as_str().unwrap_or_default().to_owned();
    let responses: Vec<&Value> = lines
        .iter()
        .filter(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("response"))
        })
        .collect();
    // polling is not at info
    assert!(
        !responses.iter().any(|v| route(v) == "/admin/status"),
        "{responses:?}"
    );
    // a plain request has its latency
    let health = responses
        .iter()
        .find(|v| route(v) == "/health")
        .expect("the health request's line");
    assert!(health["span"]["latency_ms"].is_u64(), "{health}");
    // a stream says so, and neither it nor its run's audit line carries a latency
    let stream = responses
        .iter()
        .find(|v| route(v) == "/exec")
        .expect("the stream's line");
    assert_eq!(stream["fields"]["message"], "response streams", "{stream}");
    assert!(stream["span"].get("latency_ms").is_none(), "{stream}");
    let audit = lines
        .iter()
        .find(|v| v["fields"]["message"] == "run audited")
        .expect("an audit line");
    assert!(!audit.to_string().contains("latency_ms"), "{audit}");
}

#[test]
fn runtime_import_and_list_print_plain_lines_on_a_pipe() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(t.path().join("root/usr/bin")).unwrap();
    std::fs::write(t.path().join("root/usr/bin/tool"), "x").unwrap();
    let archive = t.path().join("root.tar.gz");
    let st = Command::new("tar")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(t.path().join("root"))
        .arg(".")
        .status()
        .unwrap();
    assert!(st.success());
    let dir = t.path().join("runtimes");
    let kiln = |args: &[&str]| {
        Command::new(KILN)
            .args(args)
            .arg("--runtime-dir")
            .arg(&dir)
            .env_remove("KILN_CONFIG")
            .output()
            .unwrap()
    };

    let out = kiln(&["runtime", "import", archive.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(id.starts_with("import-") && id.len() == 23, "{id}");
    // the progress is plain on a pipe: its steps, no escape sequence or carriage return
    assert!(stderr.contains("[1/1] unpack"), "{stderr}");
    assert!(
        !stderr.contains('\x1b') && !stderr.contains('\r'),
        "{stderr:?}"
    );

    let out = kiln(&["runtime", "list"]);
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    let line = listed.lines().next().unwrap_or_default();
    assert!(
        line.starts_with(&id) && line.contains("\ttar\t"),
        "{listed}"
    );
    assert!(line.ends_with("/rootfs"), "{listed}");

    // a recipe with an option where a package name goes is refused before anything runs
    let recipe = t.path().join("bad.toml");
    std::fs::write(
        &recipe,
        "suite = \"trixie\"\nmirror = \"http://deb.debian.org/debian\"\npackages = [\"-oAPT::x=1\"]\n",
    )
    .unwrap();
    let out = kiln(&["runtime", "build", "--recipe", recipe.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not a package name"), "{stderr}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        1,
        "only the imported image"
    );
}

#[test]
fn serve_and_doctor_name_each_languages_image_and_refuse_a_missing_one_in_one_line() {
    common::require_root();
    let runtime_dir = std::env::var_os("KILN_RUNTIME_DIR")
        .map_or(kiln::config::Config::default().runtime_dir, Into::into);
    if let Err(e) = kiln::runtime::Store::new(&runtime_dir).resolve("default") {
        assert!(std::env::var_os("CI").is_none(), "{e:#}");
        eprintln!("SKIP: {e:#}");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    // `kiln <command>` on the default image, with `runtime_images`
    let kiln = |command: &str, images: &str| {
        Command::new(KILN)
            .args([command, "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data.path())
            .env("KILN_RUNTIME_DIR", &runtime_dir)
            .env("KILN_RUNTIME_IMAGE", "default")
            .env("KILN_RUNTIME_IMAGES", images)
            .env_remove("KILN_CONFIG")
            .env("KILN_LOG_FORMAT", "text")
            .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
            .env("KILN_MAX_CONCURRENCY", "2")
            .env("KILN_WORKSPACE_MB", "64")
            .output()
            .unwrap()
    };
    // doctor: py on the host's /usr, every other language on the default image, each with
    // the version probed where its jails run
    let out = kiln("doctor", "py=host");
    let report = String::from_utf8_lossy(&out.stdout);
    let line = |lang: &str| {
        report
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{lang} ")) && l.contains(" ok "))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        report.contains("  py    runs from its own: none (the host's /usr)"),
        "{report}"
    );
    assert!(
        line("py").contains("Python 3.11") && line("py").ends_with("[host]"),
        "{report}"
    );
    assert!(
        line("r").contains("version 4.5") && line("r").contains("[recipe-"),
        "{report}"
    );
    assert!(
        check_lines(&report, "image")
            .iter()
            .any(|l| l.contains("except the jails of py")),
        "{report}"
    );
    // serve: a language image that is not there refuses the start in one line naming it
    let out = kiln("serve", "r=import-0123456789abcdef");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let refusal: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("import-0123456789abcdef"))
        .collect();
    assert_eq!(refusal.len(), 1, "{err}");
    assert!(
        refusal[0]
            .starts_with("kiln: runtime_images.r: runtime image import-0123456789abcdef is not in"),
        "{err}"
    );
    // and an unknown language, a configuration error (exit 2), before anything starts
    let out = kiln("serve", "cobol=default");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("runtime_images: no language is called \"cobol\""),
        "{err}"
    );
}

/// Where `/proc/sys` is read-only a kept jail's program could not reset
/// its next pid: `doctor` says that jails cannot be kept, and why.
#[test]
fn doctor_on_a_host_whose_proc_sys_is_read_only_says_jails_cannot_be_kept() {
    common::require_root();
    let data = tempfile::tempdir().unwrap();
    let out = Command::new("unshare")
        .args([
            "--mount",
            "sh",
            "-c",
            "mount --bind -o ro /proc/sys /proc/sys && exec \"$0\" doctor",
            KILN,
        ])
        .env("KILN_LISTEN", "127.0.0.1:0")
        .env("KILN_DATA_DIR", data.path())
        .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(
            "warning: cannot keep jails: /proc/sys/kernel/ns_last_pid is not writable \
             (Read-only file system"
        ),
        "{text}"
    );
}
