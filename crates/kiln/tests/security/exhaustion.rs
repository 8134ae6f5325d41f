//! Resource exhaustion: each attack is stopped within its limit, reported
//! with the right status, and the server keeps serving at normal latency.

use std::time::{Duration, Instant};

use crate::*;

#[tokio::test]
async fn memory_bomb_is_killed_as_out_of_memory() {
    let r = attack(
        "py",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 1024 * 1024))",
    )
    .await;
    assert_eq!(r["status"], "SG", "{r}");
    assert_eq!(r["message"], "Out of memory");
    assert_healthy().await;
}

#[tokio::test]
async fn fork_bomb_is_contained() {
    let t = Instant::now();
    let r = attack(
        "bash",
        "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived-parent",
    )
    .await;
    assert!(t.elapsed() < Duration::from_secs(30), "{r}");
    assert_healthy().await;
}

#[tokio::test]
async fn python_fork_bomb_hits_the_pids_limit() {
    let r = attack(
        "py",
        "import os, sys\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            import time; time.sleep(30); os._exit(0)\n        n += 1\nexcept OSError:\n    print('limited', n < 100)",
    )
    .await;
    assert_eq!(out(&r), "limited True\n", "{r}");
    assert_healthy().await;
}

#[tokio::test]
async fn thread_bomb_hits_the_pids_limit() {
    let r = attack(
        "py",
        "import threading, time\nn = 0\ntry:\n    while True:\n        threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); n += 1\nexcept RuntimeError:\n    print('limited', n < 100)",
    )
    .await;
    assert_eq!(out(&r), "limited True\n", "{r}");
}

#[tokio::test]
async fn cpu_spin_times_out() {
    let t = Instant::now();
    let r = attack("py", "while True:\n    pass").await;
    assert_eq!(r["status"], "TO", "{r}");
    assert!(t.elapsed() < Duration::from_secs(15));
    assert_healthy().await;
}

#[tokio::test]
async fn sleeping_past_the_timeout_is_stopped() {
    let r = attack("bash", "sleep 600").await;
    assert_eq!(r["status"], "TO", "{r}");
    assert_eq!(r["message"], "Time limit exceeded");
}

#[tokio::test]
async fn a_setsid_daemon_does_not_outlive_its_run() {
    let r = attack(
        "bash",
        "setsid sleep 7777 </dev/null >/dev/null 2>&1 & (setsid sleep 7778 &); echo started",
    )
    .await;
    assert_eq!(out(&r), "started\n");
    let survivors = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                std::fs::read(e.path().join("cmdline"))
                    .map(|c| c.starts_with(b"sleep\x00777"))
                    .unwrap_or(false)
            })
            .count()
    };
    let t = Instant::now();
    while survivors() > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "daemon survived its run"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn zombies_are_reaped() {
    let r = attack(
        "py",
        "import os\nfor _ in range(20):\n    if os.fork() == 0:\n        os._exit(0)\nimport time; time.sleep(0.5)\nprint('made zombies')",
    )
    .await;
    assert_eq!(out(&r), "made zombies\n", "{r}");
    assert_healthy().await;
}

#[tokio::test]
async fn gigabytes_on_stdout_are_cut_off_quickly() {
    let t = Instant::now();
    let r = attack("bash", "head -c 4000000000 /dev/zero | tr '\\0' x").await;
    assert_eq!(r["status"], "OL", "{r}");
    assert_eq!(out(&r).len(), 64 * 1024);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert_healthy().await;
}

#[tokio::test]
async fn filling_tmp_gets_enospc() {
    let r = attack("bash", "dd if=/dev/zero of=/tmp/fill bs=1M count=100 2>&1 | grep -o 'No space left on device' | head -1").await;
    assert_eq!(out(&r), "No space left on device\n", "{r}");
    assert_healthy().await;
}

#[tokio::test]
async fn file_descriptor_exhaustion_is_contained() {
    let r = attack("py", "import os\nfds = []\ntry:\n    while True:\n        fds.append(os.open('/dev/null', os.O_RDONLY))\nexcept OSError as e:\n    print('limited', len(fds) < 5000)").await;
    assert_eq!(out(&r), "limited True\n", "{r}");
}

#[tokio::test]
async fn other_clients_keep_normal_latency_during_a_cpu_attack() {
    let spin = tokio::spawn(attack("py", "while True:\n    pass"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let r = attack("py", "print(1)").await;
    assert_eq!(out(&r), "1\n");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "slow under attack: {:?}",
        t.elapsed()
    );
    let _ = spin.await;
}
