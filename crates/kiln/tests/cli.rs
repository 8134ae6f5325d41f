//! The `kiln` binary itself: `doctor`, `exec`, and `serve` stopping cleanly
//! on SIGTERM.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

#[test]
fn doctor_reports_an_enforceable_sandbox_and_the_languages() {
    common::require_root();
    let out = Command::new(KILN).arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("sandbox: enforceable"), "{text}");
    for lang in ["py", "js", "bash"] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(lang) && l.contains("ok")),
            "{lang}: {text}"
        );
    }
}

#[test]
fn exec_runs_a_file_and_exits_with_its_code() {
    common::require_root();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("prog.py");
    std::fs::write(&f, "import sys\nprint('args', sys.argv[1:])\nsys.exit(3)\n").unwrap();
    let out = Command::new(KILN)
        .args(["exec", "--lang", "py"])
        .arg(&f)
        .args(["a", "--b"])
        .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "args ['a', '--b']\n");
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn serve_stops_cleanly_on_sigterm() {
    common::require_root();
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(KILN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path())
        .env("KILN_LOG_FORMAT", "json")
        .env("KILN_UID_BASE", common::fresh_uid_base().to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // read the log on a thread so a server that never listens fails the test
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let addr = loop {
        let line = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(l) => l,
            Err(e) => {
                let _ = child.kill();
                panic!("no 'kiln listening' log line: {e}");
            }
        };
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["fields"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("kiln listening"))
        {
            break v["fields"]["addr"].as_str().unwrap().to_owned();
        }
    };
    // it serves
    let rt = tokio::runtime::Runtime::new().unwrap();
    let health = rt.block_on(async {
        reqwest::get(format!("http://{addr}/v1/health"))
            .await
            .map(|r| r.status().as_u16())
    });
    assert_eq!(health.unwrap(), 200);
    // SIGTERM: exits 0, promptly
    let t = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "kiln did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status:?}");
    // it logged that it stopped
    reader.join().unwrap();
    let rest: Vec<String> = rx.try_iter().collect();
    assert!(rest.iter().any(|l| l.contains("stopped")), "{rest:?}");
}
