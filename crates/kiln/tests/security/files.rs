//! File-handling attacks: special files and links in `/mnt/data` never make
//! the server read, block on or expose anything outside the workspace.

use crate::*;

fn names(r: &serde_json::Value) -> Vec<String> {
    r["files"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| f["name"].as_str().unwrap_or("").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn fifos_named_like_outputs_do_not_block_harvesting() {
    let r = attack("bash", "mkfifo out.csv report.txt; echo done").await;
    assert_eq!(out(&r), "done\n");
    assert!(names(&r).is_empty(), "{r}");
    assert_healthy().await;
}

#[tokio::test]
async fn unix_sockets_in_the_workspace_are_ignored() {
    let r = attack(
        "py",
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.bind('sock.txt')\nprint('bound')",
    )
    .await;
    assert_eq!(out(&r), "bound\n");
    assert!(names(&r).is_empty(), "{r}");
}

#[tokio::test]
async fn symlinked_directories_are_not_walked() {
    let r = attack(
        "bash",
        "ln -s / hostroot; ln -s /etc etc; mkdir real; ln -s /etc/passwd real/passwd.txt; echo ok",
    )
    .await;
    assert!(
        names(&r)
            .iter()
            .all(|n| !n.starts_with("hostroot") && !n.starts_with("etc/")),
        "{r}"
    );
    assert!(!names(&r).contains(&"real/passwd.txt".to_owned()), "{r}");
}

#[tokio::test]
async fn device_nodes_cannot_be_created() {
    let r = attack(
        "bash",
        "mknod disk b 8 0 2>/dev/null && echo MADE || echo denied",
    )
    .await;
    assert_eq!(out(&r), "denied\n", "{r}");
}

#[tokio::test]
async fn huge_files_are_limited_and_not_harvested() {
    let r = attack("py", "import os\nwith open('big.txt', 'wb') as f:\n    f.truncate(20 * 1024 * 1024)\nprint(os.path.getsize('big.txt'))").await;
    // sparse is fine; it is over the output size cap and must not be reported
    assert!(!names(&r).contains(&"big.txt".to_owned()), "{r}");
    assert_eq!(r["artifact_truncation"]["reasons"]["size"], 1, "{r}");
}

#[tokio::test]
async fn many_files_are_capped() {
    let r = attack(
        "bash",
        "for i in $(seq 1 300); do echo $i > f$i.txt; done; echo made",
    )
    .await;
    assert_eq!(names(&r).len(), 50, "{r}");
    assert_eq!(r["artifact_truncation"]["reasons"]["max_files"], 250, "{r}");
    assert_healthy().await;
}

#[tokio::test]
async fn hard_links_to_system_files_are_impossible() {
    let r = attack(
        "bash",
        "ln /usr/bin/bash bash.txt 2>/dev/null && echo LINKED || echo denied",
    )
    .await;
    assert_eq!(out(&r), "denied\n", "{r}");
}
