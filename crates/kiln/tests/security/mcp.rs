//! The MCP endpoint (`/v1/mcp`): another user's outputs, live kernels and
//! MCP sessions are out of reach through it, as through the HTTP API.

use serde_json::{Value, json};

use crate::{client, shared, wait_for_warm_py};

/// A modern (2026-07-28) JSON-RPC request as `user`; the whole answer.
async fn rpc(user: &str, method: &str, params: Value, extra: &[(&str, &str)]) -> (u16, Value) {
    let mut params = params;
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    let name = params
        .get("name")
        .or_else(|| params.get("uri"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let mut req = client()
        .post(format!("{}/mcp", shared().v1))
        .header("User-Id", user)
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .header("mcp-name", name)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}));
    for (k, v) in extra {
        req = req.header(*k, *v);
    }
    let r = req.send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn tool(user: &str, name: &str, args: Value) -> Value {
    let (status, v) = rpc(
        user,
        "tools/call",
        json!({"name": name, "arguments": args}),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v["result"].clone()
}

fn link(result: &Value) -> String {
    crate::common::mcp_blocks(result, "resource_link")
        .first()
        .and_then(|b| b["uri"].as_str())
        .unwrap_or_else(|| panic!("no resource link: {result}"))
        .to_owned()
}

#[tokio::test]
async fn another_users_outputs_and_kernels_are_not_readable_through_mcp() {
    wait_for_warm_py().await;
    let victim = "sec-mcp-victim";
    let attacker = "sec-mcp-attacker";
    let run = tool(
        victim,
        "execute_code",
        json!({"lang": "py", "code": "open('secret.csv', 'w').write('mcp-secret-51c2')"}),
    )
    .await;
    let stored = link(&run);
    // the owner reads it
    let (_, own) = rpc(victim, "resources/read", json!({"uri": stored}), &[]).await;
    assert_eq!(
        own["result"]["contents"][0]["text"], "mcp-secret-51c2",
        "{own}"
    );
    // another user may not
    let (_, stolen) = rpc(attacker, "resources/read", json!({"uri": stored}), &[]).await;
    assert!(!stolen.to_string().contains("mcp-secret-51c2"), "{stolen}");
    assert_eq!(stolen["error"]["code"], -32602, "{stolen}");

    // a victim's live kernel: neither usable nor readable by the attacker
    let created = tool(victim, "create_session", json!({"lang": "py"})).await;
    let sid = created["structuredContent"]["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let wrote = tool(
        victim,
        "execute_code",
        json!({"lang": "py", "session_id": sid, "code": "secret = 'mcp-kernel-9e1d'\nopen('k.txt', 'w').write(secret)"}),
    )
    .await;
    let in_kernel = link(&wrote);
    let used = tool(
        attacker,
        "execute_code",
        json!({"lang": "py", "session_id": sid, "code": "print(secret)"}),
    )
    .await;
    assert_eq!(used["isError"], true, "{used}");
    assert!(!used.to_string().contains("mcp-kernel-9e1d"), "{used}");
    let (_, stolen) = rpc(attacker, "resources/read", json!({"uri": in_kernel}), &[]).await;
    assert!(!stolen.to_string().contains("mcp-kernel-9e1d"), "{stolen}");
    assert!(stolen["error"].is_object(), "{stolen}");
    let closed = tool(attacker, "close_session", json!({"session_id": sid})).await;
    assert_eq!(closed["isError"], true, "{closed}");
    let still = tool(
        victim,
        "execute_code",
        json!({"lang": "py", "session_id": sid, "code": "print(secret)"}),
    )
    .await;
    assert!(still.to_string().contains("mcp-kernel-9e1d"), "{still}");
    tool(victim, "close_session", json!({"session_id": sid})).await;
}

#[tokio::test]
async fn another_users_mcp_session_id_is_not_honoured() {
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "victim", "version": "1"}}});
    let r = client()
        .post(format!("{}/mcp", shared().v1))
        .header("User-Id", "sec-mcp-victim")
        .json(&init)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    let session = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let as_user = |user: &'static str| {
        client()
            .post(format!("{}/mcp", shared().v1))
            .header("User-Id", user)
            .header("mcp-session-id", session.clone())
            .json(&list)
            .send()
    };
    assert_eq!(
        as_user("sec-mcp-victim").await.unwrap().status().as_u16(),
        200
    );
    assert_eq!(
        as_user("sec-mcp-attacker").await.unwrap().status().as_u16(),
        404
    );
    let end = client()
        .delete(format!("{}/mcp", shared().v1))
        .header("User-Id", "sec-mcp-attacker")
        .header("mcp-session-id", session.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(end.status().as_u16(), 404);
    assert_eq!(
        as_user("sec-mcp-victim").await.unwrap().status().as_u16(),
        200
    );
}
