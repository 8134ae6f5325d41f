//! Host-wide and per-user kernel budgets: what one jail takes must never
//! be missing from the host or from other jails.

use crate::*;

#[tokio::test]
async fn native_aio_cannot_reserve_the_host_wide_budget() {
    // io_setup(65536, &ctx): one jail used to take all of fs.aio-max-nr.
    let code = format!(
        "{PY_SYSCALL}\nctx = ctypes.c_ulong(0)\ndenied(206, 65536, ctypes.addressof(ctx))\n\
         denied(209, 0, 1, 0)"
    );
    let r = attack("py", &code).await;
    assert_eq!(out(&r), "DENIED\nDENIED\n", "{r}");
    assert_healthy().await;
}

/// Takes as many inotify instances, queued signals and message-queue bytes
/// as it can, says how many, and holds them for a while.
const HOG: &str = r#"
import ctypes, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
class sigval(ctypes.Union):
    _fields_ = [("sival_int", ctypes.c_int), ("sival_ptr", ctypes.c_void_p)]
inotify = 0
while libc.inotify_init1(0) >= 0:
    inotify += 1
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
queued = 0
while libc.sigqueue(os.getpid(), signal.SIGRTMIN, sigval(1)) == 0:
    queued += 1
queues = 0
while libc.mq_open(b"/kiln-hog-%d" % queues, os.O_CREAT | os.O_RDWR, 0o600, None) >= 0:
    queues += 1
print("inotify", inotify, "queued", queued, "queues", queues, flush=True)
time.sleep(6)
"#;

/// The same three, once each, from wherever it runs.
const ONE_OF_EACH: &str = r#"
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
class sigval(ctypes.Union):
    _fields_ = [("sival_int", ctypes.c_int), ("sival_ptr", ctypes.c_void_p)]
def errno_of(ok):
    return "ok" if ok else os.strerror(ctypes.get_errno())
print("inotify", errno_of(libc.inotify_init1(0) >= 0))
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
print("sigqueue", errno_of(libc.sigqueue(os.getpid(), signal.SIGRTMIN, sigval(1)) == 0))
name = b"/kiln-budget-%d" % os.getpid()
print("mq_open", errno_of(libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None) >= 0))
libc.mq_unlink(name)
"#;

/// Prints the owner uid of the user namespace of process `argv[1]`
/// (NS_GET_OWNER_UID) and the host uid its uid 0 maps to.
const NS_OWNER: &str = r#"
import array, fcntl, os, sys
pid = sys.argv[1]
fd = os.open("/proc/%s/ns/user" % pid, os.O_RDONLY)
owner = array.array("I", [0])
fcntl.ioctl(fd, 0xB704, owner)
base = open("/proc/%s/uid_map" % pid).read().split()[1]
print(owner[0], base)
"#;

const ALL_OK: &str = "inotify ok\nsigqueue ok\nmq_open ok\n";

#[tokio::test]
async fn a_jail_holding_its_per_user_budgets_takes_nothing_from_root_or_other_jails() {
    // Seen against 7c2b7a6: the jail's user namespace was owned by host
    // root, so its 128 inotify instances and 96,364 queued signals were
    // host root's: root and every other jail then got EMFILE / EAGAIN.
    let hog = tokio::spawn(attack("py", HOG));
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let host = tokio::task::spawn_blocking(|| {
        std::process::Command::new("python3")
            .args(["-c", ONE_OF_EACH])
            .output()
            .expect("python3 on the host")
    })
    .await
    .expect("host probe");
    // The jail's user namespace is owned by its root's host uid (the slot's
    // base), not by host root.
    let jail_pid: u32 = common::processes_in(shared().uids.clone())
        .first()
        .and_then(|p| p.split(':').next()?.parse().ok())
        .expect("a jail process of the hog");
    let owner = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["-c", NS_OWNER, &jail_pid.to_string()])
            .output()
            .expect("python3 on the host")
    })
    .await
    .expect("owner probe");
    let owner = String::from_utf8_lossy(&owner.stdout).into_owned();
    let ids: Vec<&str> = owner.split_whitespace().collect();
    assert!(
        ids.len() == 2 && ids[0] == ids[1] && ids[0] != "0",
        "owner and mapped root of the jail's user namespace: {owner:?}"
    );
    let other = attack("py", ONE_OF_EACH).await;
    let hog = hog.await.expect("hog");
    let held: Vec<u64> = out(&hog)
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(held.len(), 3, "{hog}");
    // Its own, smaller budgets: 64 inotify instances (root's: 128), 1024
    // queued signals, at most three default-sized message queues.
    assert!(
        (1..=64).contains(&held[0]) && (1..=1024).contains(&held[1]) && held[2] <= 3,
        "{hog}"
    );
    assert_eq!(
        String::from_utf8_lossy(&host.stdout),
        ALL_OK,
        "host root: {host:?}"
    );
    // POSIX message queues cannot be created in a jail at all (EACCES, as
    // at 7c2b7a6); whatever the answer, it is not the exhausted budget.
    let other_out = out(&other);
    assert!(
        other_out.starts_with("inotify ok\nsigqueue ok\nmq_open ")
            && !other_out.contains("Too many open files"),
        "another jail: {other}"
    );
    assert_healthy().await;
}
