//! LibreChat's attached workspaces (`@librechat/agents` 3.9's `bash_tool`
//! with `workspaceId`, issue 26 §1) over HTTP against a real server and
//! real jails: `/exec/programmatic` with `tools: []`, the
//! `X-LibreChat-Code-Workspace-ID` header and `workspace_instance_id` runs
//! in the caller's persistent project (`/workspace`, kept between calls and
//! across a restart, within its budget), with `LIBRECHAT_CODE_DATA_DIR`
//! holding the call's injected files and artifacts.

mod common;

use common::*;
use kiln::testing::TestServer;
use serde_json::{Value, json};

const INSTANCE: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// One `bash_tool` call as the package makes it: `(status, body)`.
async fn bash(
    s: &TestServer,
    user: &str,
    workspace: Option<&str>,
    instance: Option<&str>,
    code: &str,
    files: Option<Value>,
) -> (u16, Value) {
    let mut body = json!({"lang": "bash", "code": code, "tools": []});
    if let Some(i) = instance {
        body["workspace_instance_id"] = json!(i);
    }
    if let Some(f) = files {
        body["files"] = f;
    }
    let mut req = client()
        .post(format!("{}/exec/programmatic", s.v1()))
        .header("User-Id", user)
        .json(&body);
    if let Some(w) = workspace {
        req = req.header("X-LibreChat-Code-Workspace-ID", w);
    }
    status_json(req).await
}

/// A call of alice's workspace `proj-1`.
async fn alice(s: &TestServer, code: &str) -> Value {
    let (st, v) = bash(s, "alice", Some("proj-1"), Some(INSTANCE), code, None).await;
    assert_eq!(st, 200, "{v}");
    v
}

/// The same, which must complete: its stdout.
async fn alice_ok(s: &TestServer, code: &str) -> String {
    let v = alice(s, code).await;
    assert_eq!(v["status"], "completed", "{v}");
    v["stdout"].as_str().unwrap().to_owned()
}

fn names(v: &Value) -> Vec<String> {
    v["files"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| f["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn no_tools_is_a_plain_execution_in_the_programmatic_shape() {
    let s = server().await;
    const CODE: &str = "pwd; echo hi; echo oops >&2; echo x > /mnt/data/a.txt";
    let (st, v) = bash(&s, "alice", None, None, CODE, None).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["stdout"], "/mnt/data\nhi\n");
    assert_eq!(v["stderr"], "oops\n");
    assert_eq!(names(&v), ["a.txt"]);
    // a failing program is the contract's error
    let (st, v) = bash(&s, "alice", None, None, "exit 3", None).await;
    assert_eq!((st, &v["status"]), (200, &json!("error")), "{v}");
    assert_eq!(v["error"], "Sandbox exited with code 3");
}

#[tokio::test]
async fn an_attached_workspace_keeps_project_files_and_nothing_else_between_calls() {
    let s = server().await;
    const FIRST: &str = r#"pwd; echo "data=$LIBRECHAT_CODE_DATA_DIR"
mkdir -p src && echo kept > src/notes.txt
echo scratch > /tmp/scratch.txt; export MYVAR=set
echo artifact > "$LIBRECHAT_CODE_DATA_DIR/report.txt""#;
    let v = alice(&s, FIRST).await;
    assert_eq!(v["status"], "completed", "{v}");
    assert!(
        v["stdout"]
            .as_str()
            .unwrap()
            .starts_with("/workspace\ndata=/mnt/data\n"),
        "{v}"
    );
    // the artifact comes back as a file; project files do not
    assert_eq!(names(&v), ["report.txt"]);

    // injected files go to the data dir, for that call only
    let (st, v) = bash(
        &s,
        "alice",
        Some("proj-1"),
        Some(INSTANCE),
        r#"cat src/notes.txt; cat "$LIBRECHAT_CODE_DATA_DIR/in.txt"; echo; test -e /tmp/scratch.txt || echo no-tmp; echo "var=${MYVAR:-unset}""#,
        Some(json!([{"name": "in.txt", "content": "injected"}])),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["stdout"], "kept\ninjected\nno-tmp\nvar=unset\n", "{v}");
    let out = alice_ok(
        &s,
        "test -e /mnt/data/in.txt || echo gone; cat src/notes.txt",
    )
    .await;
    assert_eq!(out, "gone\nkept\n");

    // another principal, workspace or instance sees nothing of it
    for (user, ws, inst) in [
        ("bob", "proj-1", Some(INSTANCE)),
        ("alice", "proj-2", Some(INSTANCE)),
        ("alice", "proj-1", Some(&"f".repeat(64)[..])),
        ("alice", "proj-1", None),
    ] {
        let (st, v) = bash(&s, user, Some(ws), inst, "ls -A; echo end", None).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["stdout"], "end\n", "{user} {ws} {inst:?}: {v}");
    }
}

#[tokio::test]
async fn bad_workspace_ids_are_refused_with_400() {
    let s = server().await;
    let cases = [
        (
            Some("-bad"),
            Some(INSTANCE),
            "X-LibreChat-Code-Workspace-ID must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$",
        ),
        (
            Some("ws/../x"),
            None,
            "X-LibreChat-Code-Workspace-ID must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$",
        ),
        (
            Some("ws"),
            Some("ABC"),
            "workspace_instance_id must be 64 lowercase hex digits",
        ),
        (
            None,
            Some(INSTANCE),
            "workspace_instance_id needs the X-LibreChat-Code-Workspace-ID header",
        ),
    ];
    for (ws, inst, msg) in cases {
        let (st, v) = bash(&s, "alice", ws, inst, "echo x", None).await;
        assert_eq!((st, v), (400, json!({"error": msg})), "{ws:?} {inst:?}");
    }
}

#[tokio::test]
async fn a_call_that_overfills_its_project_keeps_none_of_its_changes() {
    let s = server_with(|c| c.project_budget_bytes = 4096).await;
    alice_ok(&s, "echo small > keep.txt").await;
    let v = alice(
        &s,
        "echo changed > keep.txt; head -c 8192 /dev/zero > big.bin; echo ran",
    )
    .await;
    assert_eq!(v["status"], "error", "{v}");
    let err = v["error"].as_str().unwrap();
    assert!(err.contains("project storage budget exceeded"), "{v}");
    assert!(err.contains("discarded"), "{v}");
    assert_eq!(v["stdout"], "ran\n");
    assert_eq!(alice_ok(&s, "cat keep.txt; ls").await, "small\nkeep.txt\n");
}

#[tokio::test]
async fn a_project_survives_a_server_restart() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_owned();
    let s = server_with(|c| c.data_dir = dir.clone()).await;
    alice_ok(&s, "echo durable > state.txt").await;
    s.stop().await.unwrap();
    let s = server_with(|c| c.data_dir = dir.clone()).await;
    assert_eq!(alice_ok(&s, "cat state.txt").await, "durable\n");
}

#[tokio::test]
async fn calls_of_one_project_take_turns_and_python_starts_there_too() {
    let s = server().await;
    // the second call waits for the first: no interleaving, no lost update
    let first = alice(&s, "echo a >> log.txt; sleep 2; echo b >> log.txt");
    let second = async {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        alice(&s, "echo c >> log.txt").await
    };
    let (one, two) = tokio::join!(first, second);
    assert_eq!(
        (&one["status"], &two["status"]),
        (&json!("completed"), &json!("completed"))
    );
    assert_eq!(alice_ok(&s, "cat log.txt").await, "a\nb\nc\n");

    // any language starts in the project (its entry file stays in /mnt/data)
    let body = json!({"lang": "python", "tools": [], "workspace_instance_id": INSTANCE,
        "code": "import os\nprint(os.getcwd())\nprint(open('log.txt').read().split())"});
    let (st, v) = status_json(
        client()
            .post(format!("{}/exec/programmatic", s.v1()))
            .header("User-Id", "alice")
            .header("X-LibreChat-Code-Workspace-ID", "proj-1")
            .json(&body),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["stdout"], "/workspace\n['a', 'b', 'c']\n", "{v}");
}
