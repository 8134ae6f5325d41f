//! The hardening layers behind the namespaces, attacked over HTTP: Landlock
//! (paths the mount layout leaves readable), the seccomp allow-list (calls
//! nobody listed, calls newer than the policy) and the workspace's inode
//! quota. Each attack fails and the server stays healthy.

use crate::*;

fn host_has_landlock() -> bool {
    if kiln_sandbox::probe_host().landlock_abi.is_some() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set and the host has no Landlock"
    );
    eprintln!("SKIPPED: no Landlock on this host");
    false
}

#[tokio::test]
async fn landlock_denies_listing_the_jail_root_and_the_workspace_parent() {
    if !host_has_landlock() {
        return;
    }
    let r = attack(
        "py",
        "import os\nfor p in ('/', '/mnt', '/mnt/data/..'):\n    try:\n        os.listdir(p); print('listed', p)\n    except PermissionError:\n        print('denied', p)\nprint(len(os.listdir('/mnt/data')) >= 0)",
    )
    .await;
    assert_eq!(
        out(&r),
        "denied /\ndenied /mnt\ndenied /mnt/data/..\nTrue\n",
        "{r}"
    );
    assert_healthy().await;
}

#[tokio::test]
async fn calls_off_the_allow_list_are_refused() {
    // seccomp(SECCOMP_GET_ACTION_AVAIL), modify_ldt (read), personality
    // (ADDR_NO_RANDOMIZE), pidfd_getfd: none is needed by any runtime.
    let code = format!(
        "{PY_SYSCALL}\ndenied(317, 2, 0, 1)\ndenied(154, 0, 1, 0)\ndenied(135, 0x0040000)\ndenied(438, -1, 0, 0)"
    );
    let r = attack("py", &code).await;
    assert_eq!(out(&r), "DENIED\nDENIED\nDENIED\nDENIED\n", "{r}");
    assert_healthy().await;
}

#[tokio::test]
async fn calls_newer_than_the_policy_answer_enosys() {
    // setxattrat (463), listxattrat (465): libc falls back on ENOSYS.
    let code = format!(
        "{PY_SYSCALL}\nfor nr in (463, 465):\n    r, e = sc(nr, -1, 1, 0, 1, 1, 0)\n    print(r, errno.errorcode.get(e))"
    );
    let r = attack("py", &code).await;
    assert_eq!(out(&r), "-1 ENOSYS\n-1 ENOSYS\n", "{r}");
    assert_healthy().await;
}

#[tokio::test]
async fn creating_files_without_end_hits_the_inode_quota() {
    let r = attack(
        "py",
        // the host empties the workspace; unlinking here too only doubled
        // the run's time (it once ran past the 5 s limit on a loaded machine)
        "import errno, os\nn = 0\ntry:\n    while True:\n        os.close(os.open('f%d' % n, os.O_CREAT | os.O_WRONLY)); n += 1\nexcept OSError as e:\n    print(errno.errorcode[e.errno], n < 70000, flush=True)",
    )
    .await;
    assert_eq!(out(&r), "ENOSPC True\n", "{r}");
    assert_healthy().await;
}
