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
