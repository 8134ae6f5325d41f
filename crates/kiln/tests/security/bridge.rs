//! The sandbox bridge (`/v1/sandbox`): a path or `cwd` that resolves
//! outside `/workspace` is refused before anything is touched, and a link a
//! command planted in `/workspace` is never followed by the file routes
//! (the server runs as root: following one would read or write the host).

use base64::Engine as _;
use serde_json::{Value, json};

use crate::*;

const USER: &str = "sec-bridge";

async fn sandbox() -> String {
    let r = client()
        .post(format!("{}/sandbox", shared().v1))
        .header("User-Id", USER)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    v["id"].as_str().unwrap().to_owned()
}

/// Runs `cmd` with bash in the sandbox; its stdout and exit event.
async fn run(id: &str, cmd: &str) -> (String, String) {
    let r = client()
        .post(format!("{}/sandbox/{id}/exec", shared().v1))
        .header("User-Id", USER)
        .json(&json!({"argv": ["bash", "-c", cmd]}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.unwrap();
    let mut stdout = String::new();
    let mut last = String::new();
    for frame in text.split("\n\n") {
        let data: String = frame
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect();
        if frame.starts_with("event: stdout") {
            let b = base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap();
            stdout.push_str(&String::from_utf8_lossy(&b));
        } else if frame.starts_with("event: ") {
            last = frame.to_owned();
        }
    }
    (stdout, last)
}

async fn file(method: reqwest::Method, id: &str, path: &str, body: &str) -> (u16, String) {
    let r = client()
        .request(method, format!("{}/sandbox/{id}/file/{path}", shared().v1))
        .header("User-Id", USER)
        .body(body.to_owned())
        .send()
        .await
        .expect("send");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

async fn close(id: &str) {
    let r = client()
        .delete(format!("{}/sandbox/{id}", shared().v1))
        .header("User-Id", USER)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
}

#[tokio::test]
async fn links_a_command_planted_in_the_workspace_are_never_followed() {
    use reqwest::Method;
    let id = sandbox().await;
    // a host file the server (root) could read and write, and a host
    // directory it could create files in
    let host_dir = tempfile::tempdir().expect("tempdir");
    let target = host_dir.path().join("target.txt");
    std::fs::write(&target, "host secret\n").unwrap();
    let (out, last) = run(
        &id,
        &format!(
            "ln -s {t} host.txt; ln -s {d} hostdir; ln -s / root; ln -s /etc/passwd pw; echo planted",
            t = target.display(),
            d = host_dir.path().display()
        ),
    )
    .await;
    assert_eq!(out, "planted\n", "{last}");
    for path in [
        "workspace/host.txt",
        "workspace/pw",
        "workspace/root/etc/passwd",
    ] {
        let (st, body) = file(Method::GET, &id, path, "").await;
        assert_eq!(st, 404, "GET {path} answered {st}: {body}");
        assert!(
            !body.contains("host secret") && !body.contains("root:"),
            "{body}"
        );
    }
    // writing through a link replaces the link in the workspace, nothing else
    let (st, body) = file(Method::PUT, &id, "workspace/host.txt", "overwritten").await;
    assert!(
        st == 200 || st == 404 || st == 400,
        "PUT host.txt: {st} {body}"
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "host secret\n");
    let (st, body) = file(Method::PUT, &id, "workspace/hostdir/planted.txt", "x").await;
    assert!(st >= 400, "PUT through a directory link: {st} {body}");
    assert!(!host_dir.path().join("planted.txt").exists());
    let (st, body) = file(
        Method::PUT,
        &id,
        "workspace/root/tmp/kiln-bridge-escape",
        "x",
    )
    .await;
    assert!(st >= 400, "PUT through a link to /: {st} {body}");
    assert!(!std::path::Path::new("/tmp/kiln-bridge-escape").exists());
    close(&id).await;
    assert_healthy().await;
}

#[tokio::test]
async fn dot_dot_in_a_file_path_or_cwd_never_leaves_the_workspace() {
    use reqwest::Method;
    let id = sandbox().await;
    for path in [
        "workspace%2F..%2Fetc%2Fpasswd",
        "workspace%2F..%2F..%2F..%2Fetc%2Fpasswd",
        "etc/passwd",
        "workspace/..%2F..%2Fproc%2Fself%2Fenviron",
    ] {
        let (st, body) = file(Method::GET, &id, path, "").await;
        assert_eq!(st, 403, "GET {path}: {body}");
        assert!(!body.contains("root:"), "{body}");
    }
    let (st, body) = file(
        Method::PUT,
        &id,
        "workspace%2F..%2F..%2Ftmp%2Fkiln-bridge-dotdot",
        "x",
    )
    .await;
    assert_eq!(st, 403, "{body}");
    assert!(!std::path::Path::new("/tmp/kiln-bridge-dotdot").exists());
    for cwd in ["/", "/workspace/../etc", "../..", "/mnt/data"] {
        let r = client()
            .post(format!("{}/sandbox/{id}/exec", shared().v1))
            .header("User-Id", USER)
            .json(&json!({"argv": ["pwd"], "cwd": cwd}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 403, "cwd {cwd}");
    }
    close(&id).await;
    assert_healthy().await;
}
