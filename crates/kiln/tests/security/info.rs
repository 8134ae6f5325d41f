//! Information leaks: the jail sees nothing of the host.

use crate::*;

#[tokio::test]
async fn host_processes_are_invisible() {
    // the jail's init, bash and the pipeline (ls, grep, wc) are all there is
    let r = attack(
        "bash",
        "ls /proc | grep -E '^[0-9]+$' | wc -l; cat /proc/1/cmdline | tr '\\0' ' '",
    )
    .await;
    let o = out(&r);
    let count: usize = o.lines().next().unwrap().trim().parse().unwrap();
    assert!(count <= 6, "too many processes visible: {r}");
    assert!(!o.contains("systemd") && !o.contains("serve"), "{r}");
    // not even the host path of the kiln binary
    assert!(
        !o.contains("/target/") && !o.contains("/usr/local/bin/kiln"),
        "host path visible: {r}"
    );
}

#[tokio::test]
async fn host_files_are_not_there() {
    let r = attack(
        "bash",
        "for p in /etc/shadow /root /home /var /work /srv /run /boot /sys; do [ -e $p ] && echo PRESENT $p; done; wc -l < /etc/passwd; echo done",
    )
    .await;
    let o = out(&r);
    assert!(!o.contains("PRESENT"), "{r}");
    let passwd_lines: usize = o.lines().next().unwrap().trim().parse().unwrap();
    assert!(passwd_lines <= 4, "host passwd visible: {r}");
}

#[tokio::test]
async fn sensitive_proc_entries_are_masked() {
    let r = attack(
        "bash",
        "for p in /proc/kcore /proc/kallsyms /proc/keys /proc/sysrq-trigger /proc/timer_list; do if [ -e $p ]; then s=$(head -c 64 $p 2>/dev/null | wc -c); echo \"$p $s\"; fi; done; echo end",
    )
    .await;
    for line in out(&r).lines().filter(|l| *l != "end") {
        assert!(line.ends_with(" 0"), "readable: {line} ({r})");
    }
}

#[tokio::test]
async fn hostname_and_machine_id_reveal_nothing() {
    let r = attack(
        "bash",
        "hostname; cat /etc/hostname; cat /etc/machine-id 2>/dev/null || echo none",
    )
    .await;
    let o = out(&r);
    let host_name = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let host_id = std::fs::read_to_string("/etc/machine-id").unwrap_or_default();
    assert!(o.starts_with("sandbox\nsandbox\n"), "{r}");
    if !host_id.trim().is_empty() {
        assert!(!o.contains(host_id.trim()), "host machine-id leaked: {r}");
    }
    if !host_name.trim().is_empty() && host_name.trim() != "sandbox" {
        assert!(!o.contains(host_name.trim()), "host name leaked: {r}");
    }
}

#[tokio::test]
async fn dev_holds_only_the_harmless_devices() {
    let r = attack("bash", "ls /dev | sort | tr '\\n' ' '").await;
    let o = out(&r);
    for d in o.split_whitespace() {
        assert!(
            [
                "null", "zero", "full", "random", "urandom", "shm", "fd", "stdin", "stdout",
                "stderr", "pts", "ptmx", "tty"
            ]
            .contains(&d),
            "unexpected device {d}: {r}"
        );
    }
    let r = attack(
        "bash",
        "ls /dev/sda /dev/vda /dev/mem /dev/kmsg /dev/vsock 2>/dev/null | wc -l",
    )
    .await;
    assert_eq!(out(&r), "0\n", "{r}");
}

#[tokio::test]
async fn the_environment_holds_no_secrets() {
    let r = attack("py", "import os\nprint(sorted(k for k in os.environ if 'KEY' in k or 'TOKEN' in k or 'SECRET' in k or k.startswith('KILN')))").await;
    assert_eq!(out(&r), "[]\n", "{r}");
}

/// What a program reads about where it runs: its cgroups, PID 1's name, and
/// (warm `py`) anything left in the fork-server's memory it inherited.
const LAYOUT_PROBE: &str = r#"
import ctypes, sys
# each needle comes in two halves and is never built whole here, so the
# program's own memory does not hold it
halves = [(bytes.fromhex(a), bytes.fromhex(b)) for a, b in zip(sys.argv[1::2], sys.argv[2::2])]
print("CGROUP", "|".join(l.split(":", 2)[2] for l in open("/proc/self/cgroup").read().split()))
print("INIT", open("/proc/1/cmdline", "rb").read().rstrip(b"\0").decode(), open("/proc/1/comm").read().strip())
found = set()
for line in open("/proc/self/maps"):
    f = line.split()
    name = f[5] if len(f) > 5 else ""
    if not f[1].startswith("rw") or name.startswith("[v"):
        continue
    a, b = (int(x, 16) for x in f[0].split("-"))
    try:
        data = ctypes.string_at(a, b - a)
    except Exception:
        continue
    for h1, h2 in halves:
        i = data.find(h1)
        while i >= 0:
            if data.startswith(h2, i + len(h1)):
                found.add(h1.hex())
                break
            i = data.find(h1, i + 1)
print("FOUND", sorted(found))
"#;

#[tokio::test]
async fn the_jail_sees_no_host_layout() {
    crate::wait_for_warm_py().await;
    let data = shared().data_dir.to_string_lossy().into_owned();
    // the data dir, the slots below it, the server's pid: spelled in hex so
    // the program's own text (in its memory) does not hold them
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    let needles = [
        data.clone(),
        format!("{data}/slots"),
        "kiln serve".to_string(),
    ];
    let args: Vec<String> = needles
        .iter()
        .flat_map(|n| {
            let (a, b) = n.split_at(n.len() / 2);
            [hex(a), hex(b)]
        })
        .collect();
    let code = format!("import sys\nsys.argv = ['main.py'] + {args:?}\n{LAYOUT_PROBE}");
    for round in 0..2 {
        // py runs warm (fork-server); bash shows a cold jail's view
        let r = attack("py", &code).await;
        let o = out(&r);
        let cg = o
            .lines()
            .find_map(|l| l.strip_prefix("CGROUP "))
            .unwrap_or_else(|| panic!("{r}"));
        assert!(
            cg.split('|').all(|p| p == "/"),
            "host cgroup path visible (round {round}): {r}"
        );
        let init = o.lines().find_map(|l| l.strip_prefix("INIT ")).unwrap();
        assert_eq!(
            init, "sandbox-init sandbox-init",
            "PID 1 shows a host command line: {r}"
        );
        assert!(
            o.contains("FOUND []"),
            "host layout in a warm program's memory: {r}"
        );
    }
    let r = attack(
        "bash",
        "cat /proc/self/cgroup; tr '\\0' ' ' < /proc/1/cmdline; echo; env",
    )
    .await;
    let o = out(&r);
    assert!(
        o.lines()
            .filter(|l| l.contains("::") || l.contains(':'))
            .take(10)
            .all(|l| !l.contains("kiln")),
        "{r}"
    );
    assert!(
        !o.contains(&data) && !o.contains("/kiln/"),
        "host layout visible in a cold jail: {r}"
    );
    assert!(o.contains("sandbox-init"), "{r}");
    crate::assert_healthy().await;
}
