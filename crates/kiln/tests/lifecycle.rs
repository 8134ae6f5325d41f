//! Server lifecycle over HTTP: a client that disconnects cancels its run,
//! shutdown lets running executions finish within the grace period and
//! kills the rest, and nothing (processes, workspaces) is left behind.
//! These tests look at host-wide state, so they run one at a time.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

async fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    f()
}

fn workspaces(s: &kiln::testing::TestServer) -> usize {
    workspaces_in(s.data_dir.path())
}

/// Workspaces left in the slots' areas (`<data>/slots/<i>/`; ext4's
/// `lost+found` is not one).
fn workspaces_in(data: &std::path::Path) -> usize {
    let slots = std::fs::read_dir(data.join("slots")).expect("slots dir exists");
    slots
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|area| {
            std::fs::read_dir(area.path())
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.file_name() != "lost+found")
                        .count()
                })
                .unwrap_or(0)
        })
        .sum()
}

/// Parked warm jails keep processes and workspaces by design: tear them
/// down, so what is left can only be the run's.
async fn drain_warm_pool(s: &kiln::testing::TestServer) {
    if let Some(pool) = &s.warm {
        pool.shutdown().await;
    }
}

#[tokio::test]
async fn a_client_that_disconnects_cancels_its_run() {
    let _g = SERIAL.lock().await;
    let s = server().await;
    let c = reqwest::Client::builder()
        .timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let r = c
        .post(format!("{}/exec", s.v1()))
        .json(&json!({"lang":"bash","code":"sleep 25 & sleep 25; echo done"}))
        .send()
        .await;
    assert!(r.is_err(), "request should time out client-side");
    drain_warm_pool(&s).await;
    assert!(
        wait_until(Duration::from_secs(10), || jail_processes_of(&s).is_empty()).await,
        "jail processes survive the disconnect: {:?}",
        jail_processes_of(&s)
    );
    assert!(
        wait_until(Duration::from_secs(5), || workspaces(&s) == 0).await,
        "workspace left behind"
    );
    // the server is still healthy
    let r = run(&s, "py", "print('still here')").await;
    assert_eq!(r["stdout"], "still here\n");
}

#[tokio::test]
async fn double_forked_daemons_die_with_the_run() {
    let _g = SERIAL.lock().await;
    let s = server().await;
    let r = run(
        &s,
        "bash",
        "(setsid sleep 300 &) ; nohup sleep 300 >/dev/null 2>&1 & disown; echo parent-done",
    )
    .await;
    assert_eq!(r["stdout"], "parent-done\n");
    drain_warm_pool(&s).await;
    assert!(
        wait_until(Duration::from_secs(5), || jail_processes_of(&s).is_empty()).await,
        "daemonised children survived: {:?}",
        jail_processes_of(&s)
    );
}

#[tokio::test]
async fn shutdown_finishes_short_runs_and_kills_long_ones() {
    let _g = SERIAL.lock().await;
    let s = server_with(|c| c.shutdown_grace_secs = 2).await;
    let url = s.v1();
    let short = tokio::spawn({
        let url = url.clone();
        async move {
            client()
                .post(format!("{url}/exec"))
                .json(&json!({"lang":"bash","code":"sleep 1; echo short-done"}))
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    });
    let long = tokio::spawn({
        let url = url.clone();
        async move {
            client()
                .post(format!("{url}/exec"))
                .json(&json!({"lang":"bash","code":"sleep 60; echo long-done"}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let t = Instant::now();
    let data_dir = s.data_dir.path().to_owned();
    let uids = s.uid_range.clone();
    let stop = tokio::spawn(s.stop());
    let short = short.await.unwrap();
    assert_eq!(short["stdout"], "short-done\n", "{short}");
    let long = long.await.unwrap();
    assert!(
        long.as_ref().map(|st| *st >= 500).unwrap_or(true),
        "long run was not stopped: {long:?}"
    );
    stop.await.unwrap().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "shutdown took {:?}",
        t.elapsed()
    );
    assert!(
        processes_in(uids.clone()).is_empty(),
        "{:?}",
        processes_in(uids)
    );
    // shutdown unmounts and removes the slots' areas altogether
    let areas = std::fs::read_dir(data_dir.join("slots"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(areas, 0, "slot areas left after shutdown");
}

#[tokio::test]
async fn new_executions_are_refused_during_shutdown() {
    let _g = SERIAL.lock().await;
    let s = server_with(|c| c.shutdown_grace_secs = 3).await;
    let url = s.v1();
    let long = tokio::spawn({
        let url = url.clone();
        async move {
            let _ = client()
                .post(format!("{url}/exec"))
                .json(&json!({"lang":"bash","code":"sleep 2"}))
                .send()
                .await;
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    s.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // the listener may already be closed; if it still answers, it must refuse
    if let Ok(r) = client()
        .post(format!("{url}/exec"))
        .json(&json!({"lang":"bash","code":"echo x"}))
        .send()
        .await
    {
        assert_eq!(r.status().as_u16(), 503);
    }
    long.await.unwrap();
    s.stop().await.unwrap();
}
