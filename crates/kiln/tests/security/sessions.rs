//! Live kernels (`/v1/sessions`): two users' kernels share no process, no
//! workspace and no uid, and one kernel's code (`py` or `js`) cannot reach
//! the other's.

use std::time::Duration;

use serde_json::{Value, json};

use crate::{client, shared, wait_for_warm_py};

async fn session(user: &str) -> String {
    session_of(user, "py").await
}

async fn session_of(user: &str, lang: &str) -> String {
    let r = client()
        .post(format!("{}/sessions", shared().v1))
        .header("User-Id", user)
        .json(&json!({"lang": lang}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 201);
    let v: Value = r.json().await.unwrap();
    v["session_id"].as_str().unwrap().to_owned()
}

/// Deletes `user`'s session `id`.
async fn close(user: &str, id: &str) {
    let r = client()
        .delete(format!("{}/sessions/{id}", shared().v1))
        .header("User-Id", user)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
}

async fn eval(user: &str, id: &str, code: &str) -> Value {
    let r = client()
        .post(format!("{}/sessions/{id}/exec", shared().v1))
        .header("User-Id", user)
        .json(&json!({"code": code, "timeout": 20_000}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "ok", "{v}");
    v
}

#[tokio::test]
async fn a_kernel_cannot_reach_another_sessions_files_processes_or_uid() {
    wait_for_warm_py().await;
    let victim = session("sec-victim").await;
    let attacker = session("sec-attacker").await;
    eval(
        "sec-victim",
        &victim,
        "import subprocess\nopen('secret.txt', 'w').write('victim-secret-7f3a')\n\
         keeper = subprocess.Popen(['sleep', '300'])\nsecret = 'victim-secret-7f3a'",
    )
    .await;
    let uid_map = |v: &Value| v["result"]["text"].as_str().unwrap_or_default().to_owned();
    let victim_ids =
        uid_map(&eval("sec-victim", &victim, "open('/proc/self/uid_map').read()").await);

    let probe = r#"
import os, signal
seen = []
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            seen.append(open('/proc/%s/cmdline' % pid, 'rb').read().replace(b'\0', b' ').decode())
        except OSError:
            pass
found = []
for top in ('/mnt', '/tmp', '/var', '/run', '/home', '/root', '/dev/shm', '/etc'):
    for d, dirs, files in os.walk(top):
        for f in files:
            try:
                if b'victim-secret-7f3a' in open(os.path.join(d, f), 'rb').read(1 << 20):
                    found.append(os.path.join(d, f))
            except OSError:
                pass
try:
    os.kill(-1, signal.SIGKILL)   # every process this kernel may signal
except OSError:
    pass
(sorted(os.listdir('/mnt/data')), [c for c in seen if 'sleep' in c], found)
"#;
    let v = eval("sec-attacker", &attacker, probe).await;
    assert_eq!(
        v["result"]["text"], "([], [], [])",
        "the attacker's kernel saw the victim's files or processes: {v}"
    );
    let attacker_ids = uid_map(
        &eval(
            "sec-attacker",
            &attacker,
            "open('/proc/self/uid_map').read()",
        )
        .await,
    );
    assert!(!victim_ids.trim().is_empty(), "{victim_ids:?}");
    assert_ne!(
        victim_ids, attacker_ids,
        "two users' kernels run under the same host uids"
    );

    // the same probe from a js kernel (the node's cap: three kernels)
    let js = session_of("sec-attacker-js", "js").await;
    let probe = r#"
const fs = require('fs');
const path = require('path');
const seen = fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p)).map((p) => {
  try { return fs.readFileSync(`/proc/${p}/cmdline`, 'latin1').replace(/\0/g, ' '); } catch { return ''; }
});
const found = [];
function walk(d) {
  let entries;
  try { entries = fs.readdirSync(d, { withFileTypes: true }); } catch { return; }
  for (const e of entries) {
    const p = path.join(d, e.name);
    if (e.isDirectory()) walk(p);
    else if (e.isFile()) {
      try {
        const fd = fs.openSync(p, 'r');
        const buf = Buffer.alloc(1 << 20);
        const n = fs.readSync(fd, buf, 0, buf.length, 0);
        fs.closeSync(fd);
        if (buf.subarray(0, n).includes('victim-secret-7f3a')) found.push(p);
      } catch {}
    }
  }
}
for (const top of ['/mnt', '/tmp', '/var', '/run', '/home', '/root', '/dev/shm', '/etc']) walk(top);
try { process.kill(-1, 'SIGKILL'); } catch {}
[fs.readdirSync('/mnt/data'), seen.filter((c) => c.includes('sleep')), found]
"#;
    let v = eval("sec-attacker-js", &js, probe).await;
    assert_eq!(
        v["result"]["text"], "[ [], [], [] ]",
        "the attacker's js kernel saw the victim's files or processes: {v}"
    );
    let js_ids = uid_map(
        &eval(
            "sec-attacker-js",
            &js,
            "require('fs').readFileSync('/proc/self/uid_map', 'utf8')",
        )
        .await,
    );
    // uid_map: "0 <host uid> <count>", shown as repr() or util.inspect
    let host_uid = |ids: &str| {
        ids.split_whitespace()
            .filter(|t| t.chars().all(|c| c.is_ascii_digit()))
            .nth(1)
            .map(str::to_owned)
    };
    assert!(host_uid(&js_ids).is_some(), "{js_ids:?}");
    assert_ne!(
        host_uid(&js_ids),
        host_uid(&victim_ids),
        "the js kernel runs under the victim's host uid"
    );

    // the victim's kernel, its child and its file are untouched
    tokio::time::sleep(Duration::from_millis(200)).await;
    let v = eval(
        "sec-victim",
        &victim,
        "(secret, open('secret.txt').read(), keeper.poll())",
    )
    .await;
    assert_eq!(
        v["result"]["text"], "('victim-secret-7f3a', 'victim-secret-7f3a', None)",
        "{v}"
    );
    for (user, id) in [
        ("sec-victim", &victim),
        ("sec-attacker", &attacker),
        ("sec-attacker-js", &js),
    ] {
        close(user, id).await;
    }
    crate::assert_healthy().await;
}

/// A program writes HTML and SVG that run script when rendered; served
/// from the server's (the console's) origin, they must never render: an
/// attachment, `nosniff`, and a CSP sandbox, on both faces that serve a
/// kernel's workspace.
#[tokio::test]
async fn a_kernels_html_and_svg_are_served_as_attachments_never_rendered() {
    wait_for_warm_py().await;
    let user = "sec-html";
    let id = session(user).await;
    eval(
        user,
        &id,
        "open('page.html','w').write('<script>fetch(\"/v1/admin/status\")</script>')\n\
         open('pic.svg','w').write('<svg xmlns=\"http://www.w3.org/2000/svg\"><script>alert(1)</script></svg>')",
    )
    .await;
    let base = shared().v1.trim_end_matches("/v1").to_owned();
    for (url, name) in [
        (
            format!("{}/sessions/{id}/files/page.html", shared().v1),
            "page.html",
        ),
        (
            format!("{}/sessions/{id}/files/pic.svg", shared().v1),
            "pic.svg",
        ),
        (
            format!("{base}/runtime/files/download?session_id={id}&path=/workspace/page.html"),
            "page.html",
        ),
    ] {
        let r = client()
            .get(&url)
            .header("User-Id", user)
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 200, "{url}");
        let h = r.headers();
        let header = |n: &str| {
            h.get(n)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert!(
            header("content-disposition").starts_with(&format!("attachment; filename=\"{name}\"")),
            "{url}: {:?}",
            header("content-disposition")
        );
        assert_eq!(header("x-content-type-options"), "nosniff", "{url}");
        assert!(
            header("content-security-policy").contains("sandbox"),
            "{url}"
        );
        let body = r.text().await.unwrap();
        assert!(
            body.contains("<script>"),
            "the bytes are the program's: {body}"
        );
    }
    close(user, &id).await;
    crate::assert_healthy().await;
}
