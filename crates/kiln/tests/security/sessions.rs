//! Live kernels (`/v1/sessions`): two users' kernels share no process, no
//! workspace and no uid, and one kernel's code cannot reach the other's.

use std::time::Duration;

use serde_json::{Value, json};

use crate::{client, shared, wait_for_warm_py};

async fn session(user: &str) -> String {
    let r = client()
        .post(format!("{}/sessions", shared().v1))
        .header("User-Id", user)
        .json(&json!({"lang": "py"}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 201);
    let v: Value = r.json().await.unwrap();
    v["session_id"].as_str().unwrap().to_owned()
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
    for (user, id) in [("sec-victim", &victim), ("sec-attacker", &attacker)] {
        let r = client()
            .delete(format!("{}/sessions/{id}", shared().v1))
            .header("User-Id", user)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 204);
    }
    crate::assert_healthy().await;
}
