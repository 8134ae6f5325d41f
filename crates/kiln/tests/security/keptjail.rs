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
