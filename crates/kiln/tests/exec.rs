//! `POST /v1/exec` against a real server and real jails: languages,
//! execution semantics, limits and the one-line stop notes.

mod common;

use common::*;
use serde_json::json;

#[tokio::test]
async fn python_hello_world_returns_stdout_and_a_fresh_session() {
    let s = server().await;
    let r = run(&s, "py", "print(6 * 7)").await;
    assert_eq!(r["stdout"], "42\n");
    assert_eq!(r["stderr"], "");
    assert!(is_nanoid(&r["session_id"]), "{r}");
    assert_eq!(r["files"], json!([]));
    assert_eq!(r["code"], 0);
    assert!(r["status"].is_null());
    assert!(r["wall_time"].is_number());
    let again = run(&s, "python", "print(1)").await;
    assert_ne!(again["session_id"], r["session_id"]);
}

#[tokio::test]
async fn javascript_and_bash_run_with_their_aliases() {
    let s = server().await;
    let r = run(&s, "js", "console.log([1,2,3].map(x => x * 2).join(','))").await;
    assert_eq!(r["stdout"], "2,4,6\n", "{r}");
    let r = run(&s, "node", "console.log(process.version.startsWith('v'))").await;
    assert_eq!(r["stdout"], "true\n", "{r}");
    let r = run(
        &s,
        "bash",
        "echo hi from $0; echo '{\"a\":1}' | jq .a; python3 -c 'print(2**10)'; cat /etc/hostname",
    )
    .await;
    assert_eq!(r["stdout"], "hi from script.sh\n1\n1024\nsandbox\n", "{r}");
    let r = run(&s, "sh", "echo ok").await;
    assert_eq!(r["stdout"], "ok\n");
}

#[tokio::test]
async fn python_data_stack_is_available() {
    let s = server().await;
    let r = run(
        &s,
        "py",
        "import numpy as np, pandas as pd, matplotlib\nimport matplotlib.pyplot as plt\n\
         df = pd.DataFrame({'x': np.arange(3)})\nprint(df['x'].sum(), matplotlib.get_backend().lower())",
    )
    .await;
    assert_eq!(r["stdout"], "3 agg\n", "{r}");
}

#[tokio::test]
async fn args_are_passed_through() {
    let s = server().await;
    let r = exec(
        &s,
        json!({"lang":"py","code":"import sys; print(sys.argv[1:])","args":["--flag","a b"]}),
    )
    .await;
    assert_eq!(r["stdout"], "['--flag', 'a b']\n");
    let r = exec(
        &s,
        json!({"lang":"bash","code":"echo \"$#:$1:$2\"","args":["x","y z"]}),
    )
    .await;
    assert_eq!(r["stdout"], "2:x:y z\n");
}

#[tokio::test]
async fn workspace_is_mnt_data_as_cwd_and_home() {
    let s = server().await;
    let r = run(&s, "bash", "pwd; echo $HOME; id -u; ls -a /mnt/data").await;
    assert_eq!(
        r["stdout"], "/mnt/data\n/mnt/data\n1000\n.\n..\nscript.sh\n",
        "{r}"
    );
}

#[tokio::test]
async fn non_zero_exit_is_a_completed_run_with_status_re() {
    let s = server().await;
    let r = run(
        &s,
        "py",
        "import sys\nprint('before')\nraise ValueError('boom')",
    )
    .await;
    assert_eq!(r["stdout"], "before\n");
    assert!(
        r["stderr"].as_str().unwrap().contains("ValueError: boom"),
        "{r}"
    );
    assert_eq!(r["code"], 1);
    assert_eq!(r["status"], "RE");
    let r = run(&s, "bash", "exit 7").await;
    assert_eq!(r["code"], 7);
}

#[tokio::test]
async fn wall_timeout_kills_the_run_and_says_why() {
    let s = server().await;
    let started = std::time::Instant::now();
    let r = exec(&s, json!({"lang":"py","code":"import time\nprint('start', flush=True)\ntime.sleep(60)","timeout":1500})).await;
    assert!(
        started.elapsed().as_secs() < 20,
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(r["status"], "TO", "{r}");
    assert_eq!(r["message"], "Time limit exceeded");
    assert_eq!(r["stdout"], "start\n");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("[kiln] execution stopped"),
        "{r}"
    );
}

#[tokio::test]
async fn timeout_cannot_be_raised_past_the_configured_maximum() {
    let s = server_with(|c| c.timeout_secs = 2).await;
    let started = std::time::Instant::now();
    let r = exec(
        &s,
        json!({"lang":"bash","code":"sleep 30","timeout":300000}),
    )
    .await;
    assert_eq!(r["status"], "TO");
    assert!(started.elapsed().as_secs() < 15);
}

#[tokio::test]
async fn memory_limit_kills_with_out_of_memory() {
    let s = server_with(|c| c.memory_mb = 64).await;
    let r = run(
        &s,
        "py",
        "x = bytearray(512 * 1024 * 1024)\nprint('survived')",
    )
    .await;
    assert_eq!(r["status"], "SG", "{r}");
    assert_eq!(r["message"], "Out of memory");
    assert_eq!(r["signal"], "SIGKILL");
    assert_eq!(r["stdout"], "");
    assert!(r["stderr"].as_str().unwrap().contains("Out of memory"));
}

#[tokio::test]
async fn stdout_overflow_stops_the_run_with_the_prefix() {
    let s = server_with(|c| c.stdout_bytes = 1000).await;
    let r = run(
        &s,
        "py",
        "import sys\nwhile True:\n    sys.stdout.write('x' * 100)",
    )
    .await;
    assert_eq!(r["status"], "OL", "{r}");
    assert_eq!(r["message"], "stdout length exceeded");
    let out = r["stdout"].as_str().unwrap();
    assert_eq!(out.len(), 1000);
    assert!(out.bytes().all(|b| b == b'x'));
}

#[tokio::test]
async fn stderr_overflow_is_el() {
    let s = server_with(|c| c.stderr_bytes = 500).await;
    let r = run(&s, "bash", "yes err >&2").await;
    assert_eq!(r["status"], "EL", "{r}");
    assert_eq!(r["message"], "stderr length exceeded");
}

#[tokio::test]
async fn no_host_environment_reaches_the_jail() {
    let s = server().await;
    let r = run(&s, "bash", "env | sort").await;
    let env = r["stdout"].as_str().unwrap();
    assert!(env.contains("HOME=/mnt/data"));
    assert!(env.contains("PATH=/usr/local/bin:/usr/bin:/bin\n"));
    let allowed = [
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LC_ALL",
        "TMPDIR",
        "TERM",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OMP_NUM_THREADS",
        "SANDBOX_LANGUAGE",
        "PWD",
        "SHLVL",
        "_",
        "OLDPWD",
    ];
    for line in env.lines() {
        let key = line.split('=').next().unwrap();
        assert!(
            allowed.contains(&key),
            "unexpected variable in the jail: {line}"
        );
    }
    // the test process runs with cargo's variables (CARGO_*, RUST_*...): none may appear
    let host: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| !allowed.contains(&k.as_str()))
        .collect();
    assert!(!host.is_empty());
    for k in host {
        assert!(
            !env.contains(&format!("{k}=")),
            "host variable {k} leaked into the jail"
        );
    }
}

#[tokio::test]
async fn the_jail_has_no_network() {
    let s = server().await;
    let r = run(
        &s,
        "py",
        "import socket\nfor fam, addr in [(socket.AF_INET, ('1.1.1.1', 80)), (socket.AF_INET, ('127.0.0.1', 8000))]:\n    try:\n        c = socket.socket(fam, socket.SOCK_STREAM); c.settimeout(2); c.connect(addr); print('CONNECTED', addr)\n    except OSError as e:\n        print('blocked')",
    )
    .await;
    assert_eq!(r["stdout"], "blocked\nblocked\n", "{r}");
}

#[tokio::test]
async fn unsupported_language_is_a_400() {
    let s = server().await;
    let (status, v) = exec_raw(&s, json!({"lang":"cobol","code":"x"})).await;
    assert_eq!(status, 400);
    assert_eq!(v["error"], "Unsupported language: cobol");
}

#[tokio::test]
async fn parallel_runs_do_not_interfere() {
    let s = server().await;
    let futs = (0..12).map(|i| {
        let s = &s;
        async move {
            let code = format!(
                "import os, time\nopen('mine.txt','w').write('{i}')\ntime.sleep(0.3)\nprint(open('mine.txt').read(), sorted(os.listdir('.')))"
            );
            let r = run(s, "py", &code).await;
            assert_eq!(r["stdout"], format!("{i} ['main.py', 'mine.txt']\n"), "{r}");
        }
    });
    futures::future::join_all(futs).await;
}

#[tokio::test]
async fn routes_are_served_at_the_root_too_and_health_lists_languages() {
    let s = server().await;
    let r: serde_json::Value = client()
        .post(format!("{}/exec", s.base_url))
        .json(&json!({"lang":"py","code":"print('root')"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["stdout"], "root\n");
    let h = client()
        .get(format!("{}/health", s.v1()))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status().as_u16(), 200);
    assert_eq!(h.headers()["x-codeapi-execution-profile"], "default");
    let h: serde_json::Value = h.json().await.unwrap();
    for lang in ["py", "js", "bash"] {
        let l = h["languages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == lang)
            .unwrap();
        assert_eq!(l["available"], true, "{l}");
        assert!(l["version"].is_string(), "{l}");
    }
}
