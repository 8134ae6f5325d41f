//! Process-tree attacks on the host's side of a jail: a warm `py` program
//! is a child of the host's fork-server, so `clone(CLONE_PARENT)` would make
//! the fork-server the parent of a new process inside the jail. Refused by
//! seccomp; and should one appear anyway, the fork-server reaps it (an
//! unreaped zombie in the jail's pid namespace keeps the jail's init from
//! finishing: against 7c2b7a6 every such run hit its wall time and left
//! its zombies).

use std::time::{Duration, Instant};

use crate::*;

#[tokio::test]
async fn clone_parent_from_a_warm_py_program_is_refused_and_leaves_nothing() {
    wait_for_warm_py().await;
    let zygote = fork_server_pid();
    let before = children_of(zygote).len();
    let code = format!(
        "{PY_SYSCALL}\nimport os\nmade, refused = 0, 0\nfor _ in range(250):\n    \
         r, e = sc(56, 0x8000 | 17, 0, 0, 0, 0)\n    if r == 0:\n        os._exit(0)\n    \
         if r > 0:\n        made += 1\n    elif e == errno.EPERM:\n        refused += 1\n\
         print('ppid', os.getppid(), 'made', made, 'refused', refused)"
    );
    let t = Instant::now();
    let r = attack("py", &code).await;
    assert_eq!(
        out(&r),
        "ppid 0 made 0 refused 250\n",
        "(ppid 0: a fork-server child) {r}"
    );
    assert!(r["status"].is_null(), "the run did not end normally: {r}");
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "the jail's init took {:?} to finish",
        t.elapsed()
    );
    assert!(
        eventually(Duration::from_secs(5), || {
            let kids = children_of(zygote);
            kids.iter().all(|(_, s)| *s != 'Z') && kids.len() <= before
        })
        .await,
        "fork-server children: {:?} (before: {before})",
        children_of(zygote)
    );
    assert_healthy().await;
}
