//! A one-shot `py` jail kept for its uid slot's next run (`keep_jails`,
//! `kiln-sandbox/src/sandbox/kept.rs`): its init and namespaces take the
//! slot's next program only once found as new (`jail/keep.rs`). Nothing a
//! program leaves in the jail may reach the next program run in it.
//!
//! Each case: a run leaves something behind and prints its jail's
//! identity; the runs that follow must see nothing of it. What the kept
//! jail's init clears or renews (processes, `/tmp`, `/dev/shm`) must find
//! the jail reused by one of them — if not, the case proves nothing and
//! fails; what it only checks for (SysV IPC objects) must find it replaced.

use serde_json::json;

use crate::{common, out};

/// Prints the jail's identity as its last line: its IPC and mount
/// namespaces and when its init started (a namespace's inode number alone
/// is reused once it is freed).
const WHERE: &str = r#"
import os
init = open("/proc/1/stat").read().rsplit(")", 1)[1].split()[19]
print("JAIL", os.readlink("/proc/self/ns/ipc"), os.readlink("/proc/self/ns/mnt"), init)
"#;

async fn run(s: &kiln::testing::TestServer, code: &str) -> String {
    let r = common::exec(s, json!({"lang": "py", "code": format!("{code}\n{WHERE}")})).await;
    assert_eq!(r["stderr"].as_str(), Some(""), "{r}");
    out(&r).to_owned()
}

fn jail_of(text: &str) -> String {
    text.lines()
        .rfind(|l| l.starts_with("JAIL "))
        .unwrap_or_default()
        .to_owned()
}

/// How the kept jail deals with what a program left.
#[derive(PartialEq)]
enum Expect {
    /// Cleared or renewed: the jail is reused.
    Reused,
    /// Found: the jail ends and a new one takes its place.
    Replaced,
}

/// Runs `leave` (which must print `LEFT`) in a kept jail, then `look` a
/// number of times: no run may print `SEEN`. With [`Expect::Reused`] one
/// of them must have landed in the leaving run's jail; with
/// [`Expect::Replaced`] none may have, while other jails were reused (so
/// keeping was on).
async fn the_next_program_sees_nothing(leave: &str, look: &str, expect: Expect) {
    let s = common::server_with(common::keeping).await;
    // a slot's first jail has groups and a network namespace of its own
    // (the slot's are made by its first clean-up): it is not kept
    for _ in 0..4 {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        run(&s, "").await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let left = run(&s, leave).await;
    assert!(left.contains("LEFT"), "the program left nothing: {left}");
    let jail = jail_of(&left);
    let mut jails: Vec<String> = Vec::new();
    for _ in 0..12 {
        // time for the slot's clean-up and the pool's refill to run first
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let seen = run(&s, look).await;
        assert!(
            !seen.contains("SEEN"),
            "a later program saw what the last one left: {seen}"
        );
        jails.push(jail_of(&seen));
    }
    let reused = jails.contains(&jail);
    let any_reused = jails
        .iter()
        .any(|j| jails.iter().filter(|k| *k == j).count() > 1);
    match expect {
        Expect::Reused => assert!(reused, "the kept jail ({jail}) was never reused: {jails:?}"),
        Expect::Replaced => assert!(
            !reused && any_reused,
            "the kept jail ({jail}) was reused, or none was: {jails:?}"
        ),
    }
    s.stop().await.expect("stop");
}

#[tokio::test]
async fn a_background_process_is_gone_before_the_kept_jails_next_program() {
    let leave = r#"
import subprocess
subprocess.Popen(["sleep", "1000"], start_new_session=True)
print("LEFT")
"#;
    let look = r#"
import os
me = os.getpid()
others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]
if others:
    print("SEEN", [open(f"/proc/{p}/cmdline").read() for p in others])
"#;
    the_next_program_sees_nothing(leave, look, Expect::Reused).await;
}

#[tokio::test]
async fn files_in_tmp_and_dev_shm_are_gone_before_the_kept_jails_next_program() {
    let leave = r#"
for d in ["/tmp", "/dev/shm"]:
    open(d + "/kiln-left", "w").write("x")
print("LEFT")
"#;
    let look = r#"
import os
for d in ["/tmp", "/dev/shm"]:
    if os.listdir(d):
        print("SEEN", d, os.listdir(d))
"#;
    the_next_program_sees_nothing(leave, look, Expect::Reused).await;
}

/// ctypes access to SysV IPC: `libc`, and the key both runs use.
const SYSV: &str = r#"
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
KEY = 0x4B494C4E
IPC_CREAT = 0o1000
"#;

#[tokio::test]
async fn sysv_ipc_objects_do_not_reach_the_kept_jails_next_program() {
    let leave = format!(
        r#"{SYSV}
shm = libc.shmget(KEY, 4096, IPC_CREAT | 0o666)
msg = libc.msgget(KEY, IPC_CREAT | 0o666)
sem = libc.semget(KEY, 1, IPC_CREAT | 0o666)
if min(shm, msg, sem) >= 0:
    print("LEFT", shm, msg, sem)
"#
    );
    let look = format!(
        r#"{SYSV}
for f in ["shm", "msg", "sem"]:
    rows = open("/proc/sysvipc/" + f).read().splitlines()[1:]
    if rows:
        print("SEEN", f, rows)
if libc.shmget(KEY, 0, 0) >= 0 or libc.msgget(KEY, 0) >= 0 or libc.semget(KEY, 0, 0) >= 0:
    print("SEEN by key")
"#
    );
    the_next_program_sees_nothing(&leave, &look, Expect::Replaced).await;
}

/// Pids would count what ran before: a kept jail's program is pid 2 and
/// its first child pid 3, as in a new jail, after a program that forked
/// fifty processes in the same jail.
#[tokio::test]
async fn a_kept_jails_next_program_cannot_count_the_processes_before_it() {
    let leave = r#"
import os
for _ in range(50):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
print("LEFT", pid)
"#;
    let look = r#"
import os
child = os.fork()
if child == 0:
    os._exit(0)
os.waitpid(child, 0)
if (os.getpid(), child) != (2, 3):
    print("SEEN", os.getpid(), child)
"#;
    the_next_program_sees_nothing(leave, look, Expect::Reused).await;
}

/// Names itself [`PIDS_MARK`] and waits a moment (the test looks at its
/// cgroup), then forks processes that wait until it ends, until the
/// kernel refuses one; prints how many processes it had then (itself
/// included).
const FORK_UNTIL_REFUSED: &str = r#"
import ctypes, os, time
ctypes.CDLL(None).prctl(15, b"kiln-keptpids", 0, 0, 0)
time.sleep(1)
r, w = os.pipe()
n = 1
while n < 1000:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    n += 1
print("PROCESSES", n)
"#;
const PIDS_MARK: &str = "kiln-keptpids";

/// How many processes the run's `pids` group admits for the program of
/// the running process `pid`: its `pids.max`, less one when its jail's
/// init is in the group too.
fn pids_for_the_program(pid: &str) -> Option<u64> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let dir = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        match controllers {
            "" => Some(format!("/sys/fs/cgroup{path}")),
            c if c.split(',').any(|c| c == "pids") => Some(format!("/sys/fs/cgroup/pids{path}")),
            _ => None,
        }
    })?;
    let max: u64 = std::fs::read_to_string(format!("{dir}/pids.max"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let procs = std::fs::read_to_string(format!("{dir}/cgroup.procs")).ok()?;
    let init = init_of(pid)?;
    Some(max - u64::from(procs.lines().any(|p| p == init)))
}

/// What each of `runs` runs of [`FORK_UNTIL_REFUSED`] printed, and how
/// many processes its run's group admitted for it, on a server with a
/// `pids` limit of 12, jails kept or not.
async fn processes_started(keep: bool, runs: usize) -> Vec<(String, Option<u64>)> {
    let s = common::server_with(|c| {
        common::keeping(c);
        c.keep_jails = keep;
        c.pids = 12;
    })
    .await;
    let mut seen = Vec::new();
    for _ in 0..runs {
        // time for the slot's clean-up, so that kept jails are reused
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let look = async {
            for _ in 0..90 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                if let Some(pid) = processes_named(PIDS_MARK).first() {
                    return pids_for_the_program(pid);
                }
            }
            None
        };
        let (r, admitted) = tokio::join!(
            common::exec(&s, json!({"lang": "py", "code": FORK_UNTIL_REFUSED})),
            look
        );
        assert_eq!(r["stderr"].as_str(), Some(""), "{r}");
        seen.push((out(&r).trim().to_owned(), admitted));
    }
    s.stop().await.expect("stop");
    seen
}

/// The run's `pids` limit holds exactly in a kept jail, whose init is
/// outside the run's cgroups: its program starts as many processes as a
/// cold jail's, and its group admits no more for it.
#[tokio::test]
async fn a_kept_jails_program_starts_exactly_as_many_processes_as_a_cold_jails() {
    let cold = processes_started(false, 1).await;
    assert_eq!(
        cold,
        [("PROCESSES 12".to_owned(), Some(12))],
        "a cold jail's program"
    );
    let kept = processes_started(true, 6).await;
    assert!(
        kept.iter().all(|k| *k == cold[0]),
        "kept jails' programs: {kept:?}, a cold jail's: {cold:?}"
    );
}

/// Host pids of the processes whose name is `comm`.
fn processes_named(comm: &str) -> Vec<String> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm) {
            pids.push(pid);
        }
    }
    pids
}

/// The host pid of the init (pid 1) of `pid`'s pid namespace.
fn init_of(pid: &str) -> Option<String> {
    let ns = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let p = e.file_name().to_string_lossy().into_owned();
        let same = std::fs::read_link(format!("/proc/{p}/ns/pid")).is_ok_and(|n| n == ns);
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
        let nspid = status.lines().find(|l| l.starts_with("NSpid:"))?;
        (same && nspid.split_whitespace().last() == Some("1")).then_some(p)
    })
}

/// The sockets (`socket:[inode]`) process `pid` holds.
fn sockets_of(pid: &str) -> std::collections::HashSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|l| l.to_string_lossy().into_owned())
        .filter(|l| l.starts_with("socket:"))
        .collect()
}

/// While a program runs in a kept jail, its init holds no socket to the
/// fork-server (whose every client socket is a copy of the one this
/// process, the server's, holds): each program's came for it alone and
/// went once it was forked.
#[tokio::test]
async fn a_kept_jails_init_holds_no_fork_server_socket_while_its_program_runs() {
    const MARK: &str = "kiln-keptsock";
    let s = common::server_with(common::keeping).await;
    let code = format!(
        "import ctypes, time\nctypes.CDLL(None).prctl(15, b'{MARK}', 0, 0, 0)\ntime.sleep(2)\nprint('done')"
    );
    let mut inits = Vec::new();
    for _ in 0..5 {
        // time for the slot's clean-up, so that kept jails are reused
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let look = async {
            for _ in 0..150 {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                if let Some(init) = processes_named(MARK).first().and_then(|p| init_of(p)) {
                    let ours = sockets_of("self");
                    let shared: Vec<String> =
                        sockets_of(&init).intersection(&ours).cloned().collect();
                    return Some((init, shared));
                }
            }
            None
        };
        let (r, seen) = tokio::join!(common::exec(&s, json!({"lang": "py", "code": code})), look);
        assert_eq!(out(&r).trim(), "done", "{r}");
        let (init, shared) = seen.expect("the program's jail was not found");
        assert!(
            shared.is_empty(),
            "the kept jail's init holds the fork-server's socket {shared:?}"
        );
        inits.push(init);
    }
    let mut distinct = inits.clone();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() < inits.len(), "no jail was kept: {inits:?}");
    s.stop().await.expect("stop");
}

/// A host that refuses a kept jail's program its next pid (a read-only
/// `/proc/sys`; here a stand-in file that never opens for writing) keeps
/// no jail: every `py` program runs in a new one, none fails, and the
/// server's report says why.
#[tokio::test]
async fn a_host_that_cannot_keep_jails_runs_every_py_program_in_a_new_jail_and_says_so() {
    const KEY: &str = "keptjail-key";
    let refused = tempfile::tempdir().unwrap();
    let s = common::server_with(|c| {
        common::keeping(c);
        c.api_key = Some(KEY.into());
        // a directory never opens for writing
        c.test_ns_last_pid = Some(refused.path().to_owned());
    })
    .await;
    let http = common::client();
    let status = common::json_of(
        http.get(format!("{}/v1/admin/status", s.base_url))
            .header("X-API-Key", KEY),
    )
    .await;
    let warnings = status["sandbox"]["warnings"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        warnings.iter().any(|w| w
            .as_str()
            .is_some_and(|w| w.starts_with("cannot keep jails: "))),
        "{status}"
    );
    let mut jails = Vec::new();
    for _ in 0..6 {
        // time for the slot's clean-up, after which a kept jail is reused
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let r = common::json_of(
            http.post(format!("{}/exec", s.v1()))
                .header("X-API-Key", KEY)
                .json(&json!({"lang": "py", "code": WHERE})),
        )
        .await;
        assert_eq!(r["stderr"].as_str(), Some(""), "{r}");
        jails.push(jail_of(out(&r)));
    }
    let mut distinct = jails.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), jails.len(), "a jail was kept: {jails:?}");
    s.stop().await.expect("stop");
}
