//! A slot's network namespace is reused by its jails one after another
//! (`kiln-sandbox/src/slotnet.rs`): nothing one run leaves in it may reach
//! the next user of the slot. A server with a single slot and no warm jails
//! makes every run land in the same namespace.
//!
//! What stops it here is two things: the kernel's unix garbage collector,
//! which the jail's own teardown sets off (a unix socket is closed) and
//! which frees the cycles, and the slot's check before reuse, for the
//! window before that collector has run. With the check disabled this test
//! still passed (the collector won each time); the check's own tests are
//! `kiln-sandbox`'s `slotnet::tests`, which fail without it.

use serde_json::json;

use crate::{common, out};

const NAME: &str = "kiln-left-by-run-1";

/// Run 1: an abstract datagram socket holding its own descriptor in its
/// receive queue (an `SCM_RIGHTS` self-cycle, alive after every process is
/// gone), a listening stream socket and a connection to it, both sent into
/// the connection's own queue (another cycle); then it tries to bring `lo`
/// up and change a sysctl of the namespace.
fn leave_sockets() -> String {
    format!(
        r#"import socket, array, os
def fds(*socks):
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [s.fileno() for s in socks]))]
d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
d.bind(b"\0{NAME}")
d.sendmsg([b"x"], fds(d), 0, b"\0{NAME}")
l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
l.bind(b"\0{NAME}-listen")
l.listen()
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c.connect(b"\0{NAME}-listen")
a, _ = l.accept()
a.sendmsg([b"x"], fds(l, c, a))
c.sendmsg([b"y"], fds(l, c, a))
for path, value in [("/proc/sys/net/unix/max_dgram_qlen", "7"), ("/proc/sys/net/core/somaxconn", "7")]:
    try:
        open(path, "w").write(value); print("WROTE", path)
    except OSError:
        pass
print("LEFT" if "{NAME}" in open("/proc/net/unix").read() else "NOTHING LEFT")
print(os.readlink("/proc/self/ns/net"))
"#
    )
}

/// Run 2: what it sees of run 1 in `/proc/net/*`, whether it can reach or
/// take run 1's names, and the namespace's sysctls.
fn look_for_them() -> String {
    format!(
        r#"import socket, os
seen = []
for f in ["unix", "netlink", "packet", "tcp", "tcp6", "udp", "udp6", "raw", "raw6"]:
    try:
        rows = open("/proc/net/" + f).read().splitlines()[1:]
    except OSError:
        continue
    if f == "netlink":
        rows = [r for r in rows if r.split()[2] != "0"]  # the kernel's own
    seen += [f + ": " + r for r in rows]
print("SEEN", seen)
for name in [b"\0{NAME}", b"\0{NAME}-listen"]:
    for t in [socket.SOCK_DGRAM, socket.SOCK_STREAM]:
        s = socket.socket(socket.AF_UNIX, t)
        try:
            s.connect(name); print("CONNECTED", name)
        except OSError:
            pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.bind(name)
    except OSError as e:
        print("NAME TAKEN", name, e)
print("SYSCTL", open("/proc/sys/net/unix/max_dgram_qlen").read().strip(), open("/proc/sys/net/core/somaxconn").read().strip())
print(os.readlink("/proc/self/ns/net"))
"#
    )
}

async fn as_user(s: &kiln::testing::TestServer, user: &str, code: &str) -> serde_json::Value {
    common::exec(s, json!({"lang": "py", "code": code, "user_id": user})).await
}

/// One slot, no warm jails, no kernels: every run takes slot 0.
fn one_slot(c: &mut kiln::config::Config) {
    c.max_concurrency = 1;
    c.warm_jails = 0;
    c.max_sessions = 0;
}

#[tokio::test]
async fn sockets_left_in_a_slots_network_namespace_never_reach_its_next_user() {
    let s = common::server_with(one_slot).await;
    // the slot's first run makes its own namespace; its clean-up makes the
    // slot's: from the second run on, every run is in that one
    let warmup = as_user(&s, "warmup", "print('ok')").await;
    assert_eq!(out(&warmup), "ok\n", "{warmup}");
    for round in 0..3 {
        let left = as_user(&s, "attacker", &leave_sockets()).await;
        let lines: Vec<&str> = out(&left).lines().collect();
        assert_eq!(
            lines.first(),
            Some(&"LEFT"),
            "run 1 made no sockets: {left}"
        );
        let ns1 = lines.last().copied().unwrap_or_default().to_owned();
        let seen = as_user(&s, "victim", &look_for_them()).await;
        let text = out(&seen);
        let ns2 = text.lines().last().unwrap_or_default();
        assert!(ns2.starts_with("net:["), "{seen}");
        assert!(
            text.starts_with("SEEN []\n"),
            "round {round}: run 2 ({ns2}) sees what run 1 ({ns1}) left: {text}"
        );
        assert!(
            !text.contains("CONNECTED") && !text.contains("NAME TAKEN"),
            "round {round}: run 2 reached run 1's sockets: {text}"
        );
        assert!(text.contains("SYSCTL 10 4096\n"), "sysctls changed: {text}");
        // the slot's namespace is still reused after a clean run
        let again = as_user(&s, "victim", &look_for_them()).await;
        let ns3 = out(&again).lines().last().unwrap_or_default();
        assert_eq!(ns3, ns2, "a clean namespace was not kept: {again}");
    }
    s.stop().await.expect("stop");
}
