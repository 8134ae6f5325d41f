//! Landlock is in force in every jail on a kernel that has it: paths the
//! mount layout leaves readable but no rule covers (`/`, `/mnt`) are denied,
//! while the runtimes, `/etc`, `/proc`, the devices and the writable mounts
//! keep working.

mod common;

use common::*;
use kiln_core::ExitStatus;

const UID_BASE: u32 = 1_300_000_000;

/// Landlock is best effort: without it on the host this test has nothing to
/// check (and fails under CI, where the host is known to have it).
fn landlock_expected(sb: &kiln_sandbox::Sandbox) -> bool {
    if sb.report().landlock_abi.is_some() {
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
async fn paths_outside_the_rules_are_denied_even_where_the_mounts_allow_them() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    if !landlock_expected(sb) {
        return;
    }
    let slot = sb.acquire_slot().await;
    // Without Landlock, `/` and `/mnt` are ordinary 0755 directories of the
    // jail's root tmpfs and list fine.
    let r = sh(
        sb,
        &slot,
        "ls / >/dev/null 2>&1 && echo root-listed || echo root-denied; \
         ls /mnt >/dev/null 2>&1 && echo mnt-listed || echo mnt-denied; \
         head -c 5 /etc/passwd; echo; \
         grep -c '^Name:' /proc/self/status; \
         echo hi > /mnt/data/f && cat /mnt/data/f; \
         echo tmp > /tmp/t && cat /tmp/t; \
         echo shm > /dev/shm/s && cat /dev/shm/s; \
         echo gone > /dev/null && head -c 4 /dev/urandom | wc -c; \
         ls /usr/bin/env",
    )
    .await;
    assert_eq!(r.exit, ExitStatus::Code(0), "stderr: {}", stderr(&r));
    assert_eq!(
        stdout(&r),
        "root-denied\nmnt-denied\nroot:\n1\nhi\ntmp\nshm\n4\n/usr/bin/env\n",
        "stderr: {}",
        stderr(&r)
    );
}

#[tokio::test]
async fn programs_built_in_the_workspace_may_run_but_nothing_may_leave_it() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    if !landlock_expected(sb) {
        return;
    }
    let slot = sb.acquire_slot().await;
    // A hard link or rename out of the workspace would need a writable
    // target; /proc/self/cwd/.. is /mnt, which no rule covers.
    let r = sh(
        sb,
        &slot,
        "cp /usr/bin/true ./mytrue && ./mytrue && echo ran; \
         ls /proc/self/cwd/.. >/dev/null 2>&1 && echo parent-listed || echo parent-denied",
    )
    .await;
    assert_eq!(r.exit, ExitStatus::Code(0), "stderr: {}", stderr(&r));
    assert_eq!(stdout(&r), "ran\nparent-denied\n", "stderr: {}", stderr(&r));
}
