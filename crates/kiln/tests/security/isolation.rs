//! Concurrent jobs attacking each other: separate pid, mount and uid
//! spaces mean one job can neither see, signal nor read another.

use std::time::Duration;

use crate::*;

#[tokio::test]
async fn a_job_cannot_see_or_kill_another_job() {
    let victim = tokio::spawn(attack(
        "py",
        "import time\nopen('victim-secret.txt','w').write('s3cret')\ntime.sleep(2)\nprint('victim ok')",
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = attack(
        "bash",
        "kill -9 -1 2>/dev/null; pkill -9 python3 2>/dev/null; ls /proc | grep -cE '^[0-9]+$'; grep -rl s3cret / 2>/dev/null | head -3; echo end",
    )
    .await;
    assert!(!out(&r).contains("victim-secret"), "{r}");
    let v = victim.await.unwrap();
    assert_eq!(out(&v), "victim ok\n", "victim was disturbed: {v}");
}

#[tokio::test]
async fn workspaces_do_not_persist_between_runs() {
    let a = attack(
        "bash",
        "echo leftover > /mnt/data/x.txt; echo tmp > /tmp/y; echo ok",
    )
    .await;
    assert_eq!(out(&a), "ok\n");
    let b = attack("bash", "ls /mnt/data /tmp").await;
    assert!(!out(&b).contains("x.txt") && !out(&b).contains(" y"), "{b}");
}

#[tokio::test]
async fn the_api_key_never_reaches_the_jail_or_errors() {
    // run a private server in api-key mode
    let s = common::server_with(|c| c.api_key = Some("super-secret-key-123".into())).await;
    let bad = client()
        .post(format!("{}/exec", s.v1()))
        .header("X-API-Key", "wrong")
        .json(&serde_json::json!({"lang":"bash","code":"env"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 401);
    let body = bad.text().await.unwrap();
    assert!(
        !body.contains("super-secret") && !body.contains("wrong"),
        "{body}"
    );
    let r: serde_json::Value = client()
        .post(format!("{}/exec", s.v1()))
        .header("X-API-Key", "super-secret-key-123")
        .json(&serde_json::json!({"lang":"bash","code":"env; cat /proc/1/environ | tr '\\0' '\\n'","LIBRECHAT_CODE_API_KEY":"super-secret-key-123"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(!r.to_string().contains("super-secret"), "{r}");
}
