//! Privilege escalation: no capabilities, no setuid, no new namespaces.

use crate::*;

#[tokio::test]
async fn runs_as_uid_1000_with_no_capabilities() {
    let r = attack("bash", "id -u; id -g; grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status | awk '{print $2}' | sort -u").await;
    let o = out(&r);
    let mut lines = o.lines();
    assert_eq!(lines.next(), Some("1000"), "{r}");
    assert_eq!(lines.next(), Some("1000"), "{r}");
    for cap in lines {
        assert_eq!(cap, "0000000000000000", "capabilities left: {r}");
    }
}

#[tokio::test]
async fn python_runs_as_uid_1000_with_no_capabilities() {
    // py runs in a fork of the fork-server that joined the jail: its own path to uid 1000
    let r = attack(
        "py",
        "import os\nprint(os.getuid(), os.geteuid(), os.getgid())\n\
         for l in open('/proc/self/status'):\n    \
         if l.startswith(('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')): print(l.split()[1])",
    )
    .await;
    let o = out(&r);
    let mut lines = o.lines();
    assert_eq!(lines.next(), Some("1000 1000 1000"), "{r}");
    let caps: Vec<_> = lines.collect();
    assert_eq!(caps.len(), 5, "{r}");
    for cap in caps {
        assert_eq!(cap, "0000000000000000", "capabilities left: {r}");
    }
}

#[tokio::test]
async fn setuid_to_root_fails() {
    let r = attack("py", "import os\ntry:\n    os.setuid(0); print('ROOT')\nexcept PermissionError:\n    print('denied')").await;
    assert_eq!(out(&r), "denied\n", "{r}");
}

#[tokio::test]
async fn setuid_binaries_do_not_grant_privileges() {
    // a setuid-root copy made by the attacker, and the system's own su
    let r = attack(
        "bash",
        "cp /usr/bin/id ./myid && chmod u+s ./myid && ./myid -u; (su -c id root </dev/null 2>/dev/null && echo SU) || echo su-failed",
    )
    .await;
    assert_eq!(out(&r), "1000\nsu-failed\n", "{r}");
}

#[tokio::test]
async fn user_namespace_tricks_fail() {
    let r = attack("bash", "unshare -U -r id -u 2>/dev/null || echo unshare-failed; unshare -n true 2>/dev/null || echo unshare-n-failed").await;
    assert_eq!(out(&r), "unshare-failed\nunshare-n-failed\n", "{r}");
}

#[tokio::test]
async fn kernel_tunables_cannot_be_written() {
    let r = attack("bash", "echo 1 > /proc/sys/kernel/sysrq 2>/dev/null && echo WROTE || echo denied; echo b > /proc/sysrq-trigger 2>/dev/null && echo TRIGGERED || echo denied").await;
    assert_eq!(out(&r), "denied\ndenied\n", "{r}");
    assert_healthy().await;
}

#[tokio::test]
async fn the_root_filesystem_and_usr_are_read_only() {
    let r = attack(
        "bash",
        "for p in /usr/bin/evil /etc/evil /evil /bin/evil; do touch $p 2>/dev/null && echo WROTE $p || echo ro; done",
    )
    .await;
    assert_eq!(out(&r), "ro\nro\nro\nro\n", "{r}");
}

#[tokio::test]
async fn tmp_is_noexec() {
    let r = attack("bash", "cp /usr/bin/true /tmp/t && chmod +x /tmp/t && (/tmp/t 2>/dev/null && echo EXECUTED || echo noexec)").await;
    assert_eq!(out(&r), "noexec\n", "{r}");
}
