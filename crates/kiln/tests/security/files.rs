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

/// Upload `bytes` as `user`; (storage session, file id).
async fn upload_as(user: &str, name: &str, bytes: &[u8]) -> (String, String) {
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(bytes.to_vec()).file_name(name.to_owned()),
    );
    let r: serde_json::Value = client()
        .post(format!("{}/upload", shared().v1))
        .header("User-Id", user)
        .multipart(form)
        .send()
        .await
        .expect("upload")
        .json()
        .await
        .expect("upload answer");
    (
        r["storage_session_id"].as_str().unwrap().to_owned(),
        r["files"][0]["fileId"].as_str().unwrap().to_owned(),
    )
}

/// Issue 11 item 9: `deleted_files` was an existence oracle for host paths.
/// The walker looked the inputs up by path as root, following a directory
/// link the program planted in place of an input's directory: an input
/// `a/passwd` with `a -> /etc` looked present (so not deleted) because the
/// host has /etc/passwd. Now every input is looked up below the workspace
/// without following any link: a host file and a missing path read alike.
#[tokio::test]
async fn deleted_files_reveals_nothing_about_host_paths() {
    let s = shared();
    let (sid, fid) = upload_as("attacker", "x.txt", b"input\n").await;
    let probes = [
        "a/passwd",                // exists on the host (/etc/passwd)
        "b/kiln-no-such-file.txt", // does not
        "c/hostname",              // exists on the host
    ];
    let files: Vec<serde_json::Value> = probes
        .iter()
        .map(|name| json!({"id": fid, "storage_session_id": sid, "name": name}))
        .collect();
    let code = "for d in a b c; do rm -rf \"$d\" && ln -s /etc \"$d\"; done; echo planted";
    let r = client()
        .post(format!("{}/exec", s.v1))
        .json(&json!({"lang": "bash", "code": code, "user_id": "attacker", "files": files}))
        .send()
        .await
        .expect("exec");
    assert_eq!(r.status(), 200);
    let r: serde_json::Value = r.json().await.unwrap();
    assert_eq!(out(&r), "planted\n", "{r}");
    let mut deleted: Vec<&str> = r["deleted_files"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    deleted.sort();
    assert_eq!(
        deleted,
        ["a/passwd", "b/kiln-no-such-file.txt", "c/hostname"],
        "host paths that exist must read like ones that do not: {r}"
    );
    // and nothing of the host comes back as a file
    assert!(names(&r).is_empty(), "{r}");
    assert_healthy().await;
}

/// A program's output is served with the type its name suggests and
/// `nosniff`, so HTML hidden in a `.txt` (or `.png`) is never rendered as a
/// page on the download's origin by a browser that would sniff it.
#[tokio::test]
async fn downloads_are_never_sniffed_into_html() {
    let r = attack(
        "py",
        "open('notes.txt','w').write('<html><script>alert(document.cookie)</script></html>')\n\
         open('chart.png','w').write('<!DOCTYPE html><script>alert(1)</script>')",
    )
    .await;
    let session = r["session_id"].as_str().unwrap().to_owned();
    let files = r["files"].as_array().expect("files").clone();
    assert_eq!(files.len(), 2, "{r}");
    for f in files {
        let id = f["id"].as_str().unwrap();
        let d = client()
            .get(format!("{}/download/{session}/{id}", shared().v1))
            .send()
            .await
            .unwrap();
        assert_eq!(d.status(), 200);
        let ct = d.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(!ct.contains("html"), "{} served as {ct}", f["name"]);
        assert_eq!(d.headers()["x-content-type-options"], "nosniff");
        assert!(
            d.headers()["content-disposition"]
                .to_str()
                .unwrap()
                .starts_with("attachment"),
        );
    }
    assert_healthy().await;
}

/// One call of the attacker's attached workspace (LibreChat's `bash_tool`
/// with a project): its `stdout`, after `status: "completed"`.
async fn in_project(code: &str) -> String {
    let r = client()
        .post(format!("{}/exec/programmatic", shared().v1))
        .header("User-Id", "attacker")
        .header("X-LibreChat-Code-Workspace-ID", "links")
        .json(&serde_json::json!({"lang": "bash", "code": code, "tools": []}))
        .send()
        .await
        .expect("server unreachable during attack");
    let v: serde_json::Value = r.json().await.unwrap_or_default();
    assert_eq!(v["status"], "completed", "{v}");
    out(&v).to_owned()
}

#[tokio::test]
async fn links_planted_in_a_project_are_kept_as_links_never_followed_by_the_host() {
    // a secret on the host, at a path the jail cannot see
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("secret.txt"), "HOST-SECRET-7d1e").unwrap();
    let secret = host.path().join("secret.txt");
    let planted = format!(
        "ln -sfn {} leak; ln -sfn {} hostdir; echo planted",
        secret.display(),
        host.path().display()
    );
    assert_eq!(in_project(&planted).await, "planted\n");
    // after the commit (the host copied the project) and a fresh check-out
    let seen = in_project(
        "cat leak hostdir/secret.txt 2>/dev/null; test -L leak && test -L hostdir && echo links",
    )
    .await;
    assert!(!seen.contains("HOST-SECRET"), "host file leaked: {seen}");
    assert_eq!(seen, "links\n");
    // nothing was written through the links either
    assert_eq!(
        std::fs::read_dir(host.path()).unwrap().count(),
        1,
        "the host dir gained files"
    );
    assert_healthy().await;
}
