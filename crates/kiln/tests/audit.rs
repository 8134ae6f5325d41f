//! The audit log through the real server: a run that read an upload and
//! wrote an output leaves one JSON line in the configured file, naming the
//! request that started it, who ran it, what went in and came out (with
//! sizes) and what it used; a refused run (bad language) is audited as
//! failed, with why.

mod common;

use common::*;
use serde_json::{Value, json};

fn lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect()
}

#[tokio::test]
async fn each_ended_run_appends_one_audit_line_with_request_principal_files_and_usage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit/runs.jsonl");
    let p = path.clone();
    let s = server_with(move |c| c.audit_log = p.display().to_string()).await;

    let (status, up) = upload(&s, "auditor", &[], "in.txt", b"12345".to_vec()).await;
    assert_eq!(status, 200, "{up}");
    let sid = up["session_id"].as_str().unwrap();
    let fid = up["files"][0]["fileId"].as_str().unwrap();
    let r = client()
        .post(format!("{}/exec", s.v1()))
        .header("User-Id", "auditor")
        .header("X-Request-Id", "audit-req-1")
        .json(&json!({
            "lang": "py",
            "code": "data = open('/mnt/data/in.txt').read()\nopen('/mnt/data/out.txt', 'w').write(data * 2)\nprint('ok')",
            "files": [{"id": fid, "session_id": sid, "name": "in.txt"}],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let run_id = r.headers()["x-kiln-run-id"].to_str().unwrap().to_owned();

    let recs = lines(&path);
    assert_eq!(recs.len(), 1, "{recs:?}");
    let a = &recs[0];
    assert_eq!(a["event"], "run");
    assert_eq!(a["run_id"], run_id.as_str());
    assert_eq!(a["request_id"], "audit-req-1");
    assert_eq!(
        (&a["tenant"], &a["user_id"]),
        (&json!("local"), &json!("auditor"))
    );
    assert_eq!(a["identified"], true);
    assert_eq!(
        (&a["lang"], &a["status"]),
        (&json!("py"), &json!("finished"))
    );
    assert_eq!(a["exit_code"], 0);
    assert_eq!(a["files_in"], json!([{"name": "in.txt", "bytes": 5}]));
    assert_eq!(a["files_out"], json!([{"name": "out.txt", "bytes": 10}]));
    assert!(a["run"]["wall_ms"].is_u64(), "{a}");
    assert!(
        a["run"]["memory_peak_bytes"].as_u64().unwrap_or(0) > 0,
        "{a}"
    );

    // a run that fails before it starts is audited too
    let (status, _) = exec_raw(
        &s,
        json!({"lang": "py", "code": "", "files": [
            {"id": "A".repeat(21), "session_id": "B".repeat(21), "name": "gone.txt"}
        ]}),
    )
    .await;
    assert_ne!(status, 200);
    let recs = lines(&path);
    assert_eq!(recs.len(), 2, "{recs:?}");
    assert_eq!(recs[1]["status"], "failed");
    assert!(recs[1]["error"].as_str().is_some_and(|e| !e.is_empty()));
    assert_eq!(recs[1]["user_id"], "anonymous");
    assert_eq!(recs[1]["identified"], false);
    // the request id the server made up is the one it answered with
    assert!(
        recs[1]["request_id"]
            .as_str()
            .is_some_and(|r| !r.is_empty())
    );
    s.stop().await.unwrap();
}

#[tokio::test]
async fn each_session_evaluation_appends_one_evaluation_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let p = path.clone();
    let s = server_with(move |c| c.audit_log = p.display().to_string()).await;
    let post = |path: String, body: Value| {
        client()
            .post(format!("{}{path}", s.v1()))
            .header("User-Id", "evaluator")
            .json(&body)
            .send()
    };
    let r = post("/sessions".into(), json!({"lang": "js"}))
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let id = r.json::<Value>().await.unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for code in ["require('fs').writeFileSync('out.txt', 'abc'); 1", "null.x"] {
        let r = post(format!("/sessions/{id}/exec"), json!({"code": code}))
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let recs = lines(&path);
    assert_eq!(recs.len(), 2, "one line per evaluation: {recs:?}");
    for a in &recs {
        assert_eq!(a["event"], "evaluation", "{a}");
        assert_eq!(a["session_id"], id.as_str(), "{a}");
        assert_eq!(
            (&a["user_id"], &a["identified"]),
            (&json!("evaluator"), &json!(true))
        );
        assert_eq!(a["lang"], "js");
        assert!(a["run"]["wall_ms"].as_u64().is_some(), "{a}");
        assert!(a["run"]["cpu_ms"].as_u64().is_some(), "{a}");
    }
    assert_ne!(recs[0]["run_id"], recs[1]["run_id"]);
    assert_eq!(
        recs[0]["files_out"],
        json!([{"name": "out.txt", "bytes": 3}])
    );
    assert!(recs[0]["run_status"].is_null(), "{}", recs[0]);
    assert_eq!(recs[1]["run_status"], "RE");
    assert!(
        recs[1]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("TypeError: ")),
        "{}",
        recs[1]
    );
}
