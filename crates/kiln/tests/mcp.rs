//! The MCP endpoint (`/mcp`) on a real server, driven by the official MCP
//! Python SDK (PyPI `mcp` 2.x) through `tests/mcp/client.py`, over both
//! protocol generations: the `initialize` handshake with `Mcp-Session-Id`
//! and the 2026-07-28 stateless revision (`server/discover`, per-request
//! `_meta`). Plus the transport's refusals over raw HTTP.
//!
//! scripts/test.sh installs the SDK into a directory of its own and names
//! it in `KILN_MCP_PYTHONPATH`. Without the SDK the SDK tests skip with a
//! message — unless `CI` is set, where a missing SDK is a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use kiln::testing::TestServer;
use serde_json::{Value, json};
use tokio::process::Command;

const KEY: &str = "mcp-test-key";
const CLIENT_TIMEOUT: Duration = Duration::from_secs(600);

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/mcp/client.py")
}

fn python() -> Command {
    let mut cmd = Command::new("python3");
    if let Some(path) = std::env::var_os("KILN_MCP_PYTHONPATH") {
        cmd.env("PYTHONPATH", path);
    }
    cmd
}

/// Whether the SDK is importable; under CI its absence fails the test.
async fn sdk_present() -> bool {
    let probe = python()
        .args(["-c", "import mcp, httpx2; from mcp import Client"])
        .output()
        .await;
    if probe.is_ok_and(|o| o.status.success()) {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the MCP Python SDK is missing; scripts/test.sh installs it (KILN_MCP_PYTHONPATH)"
    );
    eprintln!("MCP Python SDK not installed: skipped (scripts/test.sh installs it)");
    false
}

/// Runs the SDK client against `s` in `mode` and returns what it saw.
async fn drive(s: &TestServer, mode: &str) -> Value {
    let child = python()
        .arg(script())
        .args([&format!("{}/mcp", s.base_url), KEY, mode])
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env_remove("ALL_PROXY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn python3");
    let out = tokio::time::timeout(CLIENT_TIMEOUT, child.wait_with_output())
        .await
        .expect("the SDK client finished in time")
        .expect("wait for python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "SDK client failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn texts(result: &Value) -> String {
    mcp_blocks(result, "text")
        .iter()
        .map(|b| b["text"].as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// What both generations must show: the same tools, results and reads.
fn assert_tools_work(out: &Value) {
    let names: Vec<&str> = out["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["execute_code", "create_session", "close_session"]);
    assert_eq!(out["server_name"], "kiln");

    // execute_code in two languages: stdout as text, no error
    assert_eq!(texts(&out["py"]).trim(), "42", "{}", out["py"]);
    assert_eq!(out["py"]["isError"], false);
    assert_eq!(out["py"]["structuredContent"]["exit_code"], 0);
    assert!(
        texts(&out["bash"]).contains("HELLO FROM"),
        "{}",
        out["bash"]
    );
    assert_eq!(out["bash"]["isError"], false);
    // an input file given inline is in /mnt/data
    assert!(
        texts(&out["input_file"]).contains("UPLOADED"),
        "{}",
        out["input_file"]
    );

    // a failing program is a tool result with isError, its output kept
    let failing = &out["failing"];
    assert_eq!(failing["isError"], true, "{failing}");
    assert!(texts(failing).contains("before"), "{failing}");
    assert!(texts(failing).contains("exit code 3"), "{failing}");
    assert_eq!(failing["structuredContent"]["exit_code"], 3);
    // so is an argument the tool cannot take
    assert_eq!(out["bad_lang"]["isError"], true);
    assert!(texts(&out["bad_lang"]).contains("Unsupported language"));

    // a PNG comes back as image content
    let images = mcp_blocks(&out["plot"], "image");
    assert_eq!(images.len(), 1, "{}", out["plot"]);
    assert_eq!(images[0]["mimeType"], "image/png");
    let png = base64_decode(images[0]["data"].as_str().unwrap());
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");

    // a CSV as a resource link that resources/read returns
    let links = mcp_blocks(&out["csv"], "resource_link");
    assert_eq!(links.len(), 1, "{}", out["csv"]);
    assert_eq!(links[0]["name"], "table.csv");
    let read = &out["csv_read"]["contents"][0];
    assert_eq!(read["uri"], links[0]["uri"]);
    assert_eq!(read["text"], "a,b\n1,2\n3,4\n", "{read}");
    assert_eq!(
        out["missing_read"]["code"], -32002,
        "{}",
        out["missing_read"]
    );
    assert_eq!(out["unknown_tool"]["code"], -32602);

    // a live session: state shared between two calls, then closed
    let sid = out["create_session"]["structuredContent"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", out["create_session"]));
    assert_eq!(out["session_1"]["isError"], false, "{}", out["session_1"]);
    let second = &out["session_2"];
    assert_eq!(second["isError"], false, "{second}");
    assert!(texts(second).contains("42"), "{second}");
    assert_eq!(second["structuredContent"]["value"], "41");
    let links = mcp_blocks(&out["session_file"], "resource_link");
    assert_eq!(links.len(), 1, "{}", out["session_file"]);
    assert_eq!(
        links[0]["uri"],
        format!("kiln://sessions/{sid}/files/notes.txt")
    );
    assert_eq!(
        out["session_file_read"]["contents"][0]["text"],
        "kernel file"
    );
    assert_eq!(out["close_session"]["isError"], false);
    assert_eq!(out["after_close"]["isError"], true);
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

/// The SDK client's whole session in `mode` on a fresh server, with every
/// tool checked; `None` when the SDK is missing (outside CI).
async fn sdk_session(mode: &str) -> Option<Value> {
    if !sdk_present().await {
        return None;
    }
    let s = kernel_server(KEY, |_| {}).await;
    let out = drive(&s, mode).await;
    assert_tools_work(&out);
    Some(out)
}

#[tokio::test]
async fn the_official_sdk_runs_code_over_the_initialize_handshake() {
    let Some(out) = sdk_session("legacy").await else {
        return;
    };
    assert_eq!(out["protocol_version"], "2025-11-25");
    // initialize minted a session that every later POST carried
    let requests = out["requests"].as_array().unwrap();
    let init = &requests[0];
    assert_eq!(init["method"], "initialize");
    let session = init["session_answered"].as_str().expect("Mcp-Session-Id");
    let posts: Vec<&Value> = requests[1..]
        .iter()
        .filter(|r| r["http"] == "POST")
        .collect();
    assert!(posts.len() > 10);
    assert!(posts.iter().all(|r| r["session"] == session), "{posts:?}");
    // and the SDK ended it with DELETE on close
    assert!(
        requests
            .iter()
            .any(|r| r["http"] == "DELETE" && r["status"] == 204),
        "{requests:?}"
    );
}

#[tokio::test]
async fn the_official_sdk_runs_code_over_the_stateless_revision() {
    let Some(out) = sdk_session("auto").await else {
        return;
    };
    assert_eq!(out["protocol_version"], "2026-07-28");
    // no handshake and no session: discovery, then requests that carry
    // their version and method in headers
    let requests = out["requests"].as_array().unwrap();
    assert_eq!(requests[0]["method"], "server/discover");
    assert!(requests.iter().all(|r| r["method"] != "initialize"));
    assert!(
        requests.iter().all(|r| r["session"].is_null()
            && r["session_answered"].is_null()
            && r["version"] == "2026-07-28"
            && r["mcp_method"] == r["method"]),
        "{requests:?}"
    );
}

async fn post(s: &TestServer, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
    let mut req = client()
        .post(format!("{}{path}", s.base_url))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn modern(method: &str, params: Value) -> String {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    json!({ "jsonrpc": "2.0", "id": 7, "method": method, "params": params }).to_string()
}

#[tokio::test]
async fn the_transport_refuses_what_it_cannot_serve() {
    let s = server_with(|c| {
        c.warm_jails = 0;
        c.api_key = Some(KEY.into());
    })
    .await;
    let key = ("x-api-key", KEY);
    let list = modern("tools/list", json!({}));
    let v = [
        key,
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/list"),
    ];

    // a wrong key or none: 401 at the HTTP level, before any JSON-RPC
    for auth in [&[("x-api-key", "wrong")][..], &[]] {
        let (status, _) = post(&s, "/mcp", auth, &list).await;
        assert_eq!(status, 401);
    }
    // the right one, as X-API-Key or Bearer, at /mcp and /v1/mcp
    let (status, body) = post(&s, "/mcp", &v, &list).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["tools"][0]["name"], "execute_code");
    assert_eq!(body["result"]["resultType"], "complete");
    let bearer = format!("Bearer {KEY}");
    let with_bearer = [("authorization", bearer.as_str()), v[1], v[2]];
    let (status, body) = post(&s, "/v1/mcp", &with_bearer, &list).await;
    assert_eq!(status, 200, "{body}");

    // bad JSON: parse error; a notification: 202
    let (status, body) = post(&s, "/mcp", &[key], "{\"jsonrpc\"").await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (400, Some(-32700))
    );
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let (status, _) = post(&s, "/mcp", &[key], note).await;
    assert_eq!(status, 202);

    // modern: headers that disagree with the body, an unknown version, an
    // unknown method
    let wrong_method = [v[0], v[1], ("mcp-method", "tools/call")];
    let (status, body) = post(&s, "/mcp", &wrong_method, &list).await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (400, Some(-32020))
    );
    let old = list.replace("2026-07-28", "2099-01-01");
    let old_v = [v[0], ("mcp-protocol-version", "2099-01-01"), v[2]];
    let (status, body) = post(&s, "/mcp", &old_v, &old).await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (400, Some(-32022))
    );
    assert_eq!(body["error"]["data"]["supported"][0], "2026-07-28");
    let nothing = modern("nothing/here", json!({}));
    let n_v = [v[0], v[1], ("mcp-method", "nothing/here")];
    let (status, body) = post(&s, "/mcp", &n_v, &nothing).await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (404, Some(-32601))
    );

    // a call without a tool name: invalid params, answered like a result
    let nameless = modern("tools/call", json!({"arguments": {}}));
    let c_v = [v[0], v[1], ("mcp-method", "tools/call")];
    let (status, body) = post(&s, "/mcp", &c_v, &nameless).await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (200, Some(-32602))
    );

    // legacy: no session, an unknown session
    let plain = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let (status, body) = post(&s, "/mcp", &[key], plain).await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (400, Some(-32600))
    );
    let (status, _) = post(&s, "/mcp", &[key, ("mcp-session-id", "nope")], plain).await;
    assert_eq!(status, 404);

    // no standalone stream; a page on another site is refused
    let r = client()
        .get(format!("{}/mcp", s.base_url))
        .header("x-api-key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    let (status, _) = post(
        &s,
        "/mcp",
        &[v[0], v[1], v[2], ("origin", "https://evil.example")],
        &list,
    )
    .await;
    assert_eq!(status, 403);
}
