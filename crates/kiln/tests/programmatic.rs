//! Programmatic tool calling over HTTP (spec §7; issue 13 §1) against a
//! real server and real jails: the program stays alive and paused while
//! the test plays the host, so code between tool calls runs once; calls
//! made together come in one round; paused time does not count against
//! the timeout; and every status and error string of §7.1–7.5.

mod common;

use std::time::Duration;

use common::*;
use kiln::testing::TestServer;
use serde_json::{Value, json};

/// POST /v1/exec/programmatic as `user`; (status, body).
async fn ptc(s: &TestServer, user: &'static str, body: Value) -> (u16, Value) {
    post(s.v1(), user, None, body).await
}

/// The same with owned arguments (to run concurrently) and a request id.
async fn post(
    v1: String,
    user: &'static str,
    request_id: Option<&'static str>,
    body: Value,
) -> (u16, Value) {
    let mut req = client()
        .post(format!("{v1}/exec/programmatic"))
        .header("User-Id", user)
        .json(&body);
    if let Some(id) = request_id {
        req = req.header("X-LibreChat-Code-Request-ID", id);
    }
    status_json(req).await
}

/// Continues `answer`'s execution as alice with `results`.
async fn reply(s: &TestServer, answer: &Value, results: Value) -> (u16, Value) {
    ptc(s, "alice", cont(&answer["continuation_token"], results)).await
}

async fn cancel(s: &TestServer, user: &str, body: Value) -> (u16, Value) {
    let r = client()
        .post(format!("{}/exec/programmatic/cancel", s.v1()))
        .header("User-Id", user)
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn tool(name: &str) -> Value {
    json!({"name": name, "description": "a tool", "parameters": {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a"]
    }})
}

fn calls(v: &Value) -> Vec<(String, String, Value)> {
    assert_eq!(v["status"], "tool_call_required", "{v}");
    v["tool_calls"]
        .as_array()
        .expect("tool_calls")
        .iter()
        .map(|c| {
            (
                c["id"].as_str().expect("id").to_owned(),
                c["name"].as_str().expect("name").to_owned(),
                c["input"].clone(),
            )
        })
        .collect()
}

fn cont(token: &Value, results: Value) -> Value {
    json!({"continuation_token": token, "tool_results": results})
}

const PYTHON: &str = r#"
import asyncio, os
p = "/mnt/data/counter.txt"
def bump():
    c = int(open(p).read()) if os.path.exists(p) else 0
    open(p, "w").write(str(c + 1))
bump()
print("before", open("/mnt/data/input.txt").read())
first = await add(a=1, b=2)
bump()
print("sum", first["sum"])
both = await asyncio.gather(add(a=first["sum"], b=1), add(10, b=20))
bump()
print("both", [r["sum"] for r in both])
try:
    await fail(a=0)
except ToolExecutionError as e:
    print("caught", e)
print("counter", open(p).read())
"#;

#[tokio::test]
async fn python_pauses_for_tools_and_runs_the_code_between_calls_once() {
    let s = server().await;
    let (st, v) = ptc(
        &s,
        "alice",
        json!({"code": PYTHON, "tools": [tool("add"), tool("fail")], "timeout": 20000,
               "files": [{"name": "input.txt", "content": "hello"}]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        calls(&v),
        [("call_001".into(), "add".into(), json!({"a": 1, "b": 2}))]
    );
    assert_eq!(v["partial_stdout"], "before hello\n", "{v}");

    // the two gathered calls come in one round
    let (st, v) = reply(
        &s,
        &v,
        json!([{"call_id": "call_001", "result": {"sum": 3}}]),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        calls(&v),
        [
            ("call_002".into(), "add".into(), json!({"a": 3, "b": 1})),
            ("call_003".into(), "add".into(), json!({"a": 10, "b": 20})),
        ]
    );
    assert_eq!(v["partial_stdout"], "sum 3\n", "{v}");
    let round2 = json!([{"call_id": "call_002", "result": {"sum": 4}},
                        {"call_id": "call_003", "result": {"sum": 30}, "is_error": false}]);
    let (st, v3) = reply(&s, &v, round2.clone()).await;
    assert_eq!(st, 200, "{v3}");
    assert_eq!(calls(&v3)[0].1, "fail");

    // a retry of the same results gets the same answer; different ones 409
    let (st, again) = reply(&s, &v, round2).await;
    assert_eq!((st, &again), (200, &v3));
    let (st, e) = reply(
        &s,
        &v,
        json!([{"call_id": "call_002", "result": {"sum": 5}},
                   {"call_id": "call_003", "result": {"sum": 30}}]),
    )
    .await;
    assert_eq!(st, 409, "{e}");

    // a tool error is raised in the program as ToolExecutionError
    let (st, done) = reply(
        &s,
        &v3,
        json!([{"call_id": "call_004", "result": null, "is_error": true,
                    "error_message": "no such thing"}]),
    )
    .await;
    assert_eq!(st, 200, "{done}");
    assert_eq!(done["status"], "completed", "{done}");
    let out = done["stdout"].as_str().expect("stdout");
    assert!(out.contains("both [4, 30]\n"), "{out}");
    assert!(out.contains("caught no such thing\n"), "{out}");
    // three bumps: the code before and between the calls ran exactly once
    assert!(out.ends_with("counter 3\n"), "{out}");
    let counter = file(&done, "counter.txt");
    let (st, bytes) = download(
        &s,
        done["session_id"].as_str().expect("session"),
        counter["id"].as_str().expect("id"),
        "",
    )
    .await;
    assert_eq!((st, bytes), (200, b"3".to_vec()));
}

#[tokio::test]
async fn paused_time_does_not_count_against_the_timeout() {
    let s = server().await;
    let code =
        "import time\nt = time.time()\nr = await wait(a=1)\nprint('ok', r, round(time.time() - t))";
    let (st, v) = ptc(
        &s,
        "alice",
        json!({"code": code, "tools": [tool("wait")], "timeout": 1500}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    // the host takes twice the run's timeout
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let (st, done) = reply(&s, &v, json!([{"call_id": "call_001", "result": "x"}])).await;
    assert_eq!(st, 200, "{done}");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["stdout"], "ok x 3\n");

    // the timeout still holds for time the program spends itself
    let (st, v) = ptc(
        &s,
        "alice",
        json!({"code": "import time\nawait wait(a=1)\ntime.sleep(10)", "tools": [tool("wait")], "timeout": 1500}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let (st, done) = reply(&s, &v, json!([{"call_id": "call_001", "result": 1}])).await;
    assert_eq!(st, 200, "{done}");
    assert_eq!(done["status"], "error", "{done}");
    assert_eq!(done["error"], "Time limit exceeded", "{done}");
}

#[tokio::test]
async fn continuation_tokens_are_signed_and_bound_to_their_principal() {
    let s = server().await;
    let code = "import time\na = await t(a=1)\ntime.sleep(1.5)\nb = await t(a=2)\nprint(a, b)";
    let (st, v) = ptc(&s, "alice", json!({"code": code, "tools": [tool("t")]})).await;
    assert_eq!(st, 200, "{v}");
    let token = v["continuation_token"].as_str().expect("token").to_owned();
    let ok1 = json!([{"call_id": "call_001", "result": 1}]);

    // forged: a plain base64 token like the official server's, and an altered one
    let (st, e) = ptc(
        &s,
        "alice",
        cont(&json!("eyJleGVjdXRpb25faWQiOiJ4In0="), ok1.clone()),
    )
    .await;
    assert_eq!(
        (st, e),
        (400, json!({"error": "Invalid continuation token"}))
    );
    let mut altered = token.clone().into_bytes();
    altered[3] = if altered[3] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).expect("ascii");
    let (st, e) = ptc(&s, "alice", cont(&json!(altered), ok1.clone())).await;
    assert_eq!(
        (st, e),
        (400, json!({"error": "Invalid continuation token"}))
    );
    // another principal
    let (st, e) = ptc(&s, "mallory", cont(&json!(token), ok1.clone())).await;
    assert_eq!((st, e), (403, json!({"error": "Forbidden"})));
    // a call the server never issued
    let (st, e) = ptc(
        &s,
        "alice",
        cont(&json!(token), json!([{"call_id": "call_002", "result": 1}])),
    )
    .await;
    assert_eq!(st, 400, "{e}");

    // two continuations at once: the second is refused while the first
    // waits for the program's next stop (it sleeps 1.5 s)
    let first = tokio::spawn(post(
        s.v1(),
        "alice",
        None,
        cont(&json!(token), ok1.clone()),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (st, e) = ptc(&s, "alice", cont(&json!(token), ok1.clone())).await;
    assert_eq!(st, 409, "{e}");
    assert_eq!(
        e["error"],
        "Another continuation is already in flight for this execution"
    );
    let (st, v2) = first.await.expect("first");
    assert_eq!(st, 200, "{v2}");
    assert_eq!(calls(&v2)[0].0, "call_002");
    let (st, done) = reply(&s, &v2, json!([{"call_id": "call_002", "result": 2}])).await;
    assert_eq!(
        (st, done["stdout"].clone()),
        (200, json!("1 2\n")),
        "{done}"
    );
}

#[tokio::test]
async fn an_unanswered_round_expires_and_ends_its_run() {
    let s = server_with(|c| c.ptc_state_ttl_secs = 1).await;
    let (st, v) = ptc(
        &s,
        "alice",
        json!({"code": "await t(a=1)", "tools": [tool("t")]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (st, e) = reply(&s, &v, json!([{"call_id": "call_001", "result": 1}])).await;
    assert_eq!(
        (st, e),
        (404, json!({"error": "Execution not found or expired"}))
    );
}

#[tokio::test]
async fn paused_runs_are_capped() {
    let s = server_with(|c| c.ptc_max_active = 1).await;
    let body = json!({"code": "await t(a=1)", "tools": [tool("t")]});
    let (st, v) = ptc(&s, "alice", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let (st, e) = ptc(&s, "bob", body.clone()).await;
    assert_eq!(st, 503, "{e}");
    assert_eq!(
        e["error"],
        "Too many programmatic executions in progress (at most 1); retry later"
    );
    // once the first is done, there is room again
    let (st, done) = reply(&s, &v, json!([{"call_id": "call_001", "result": 1}])).await;
    assert_eq!((st, &done["status"]), (200, &json!("completed")), "{done}");
    let (st, v) = ptc(&s, "bob", body).await;
    assert_eq!(st, 200, "{v}");
}

#[tokio::test]
async fn cancel_ends_the_request_in_flight() {
    let s = server().await;
    let id = "3f0c2a4e-9d1b-4c8e-a7f5-0b6d2e1c9a88";
    let body = json!({"code": "import time\ntime.sleep(30)\nawait t(a=1)", "tools": [tool("t")]});
    let inflight = tokio::spawn(post(s.v1(), "alice", Some(id), body));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // the id is in use while its request is in flight
    let (st, e) = post(
        s.v1(),
        "alice",
        Some(id),
        json!({"code": "await t(a=1)", "tools": [tool("t")]}),
    )
    .await;
    assert_eq!(
        (st, e),
        (
            409,
            json!({"error": "Programmatic request ID is already in use"})
        )
    );
    let (st, e) = cancel(&s, "mallory", json!({"request_id": id})).await;
    assert_eq!((st, e), (403, json!({"error": "Forbidden"})));
    let (st, e) = cancel(&s, "alice", json!({"request_id": id})).await;
    assert_eq!((st, e), (202, json!({"status": "cancellation_requested"})));
    let (st, v) = tokio::time::timeout(Duration::from_secs(10), inflight)
        .await
        .expect("answered soon")
        .expect("task");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["status"], "error");
    assert_eq!(v["error"], "Programmatic execution request cancelled");
    let (st, e) = cancel(&s, "alice", json!({"request_id": id})).await;
    assert_eq!((st, e), (200, json!({"status": "already_completed"})));
    let (st, e) = cancel(&s, "alice", json!({"nope": 1})).await;
    assert_eq!(
        (st, e),
        (400, json!({"error": "Invalid or missing request_id"}))
    );
}

#[tokio::test]
async fn requests_are_validated_with_the_contracts_messages() {
    let s = server().await;
    let t = [tool("t")];
    let cases = [
        (
            json!({"tools": t}),
            "code is required and must be a non-empty string",
        ),
        // `tools: []` is a plain execution (issue 26), see workspaces.rs
        (
            json!({"code": "x"}),
            "tools must be an array of at most 100 tools",
        ),
        (
            json!({"code": "x", "tools": (0..101).map(|i| tool(&format!("t{i}"))).collect::<Vec<_>>()}),
            "tools must be an array of at most 100 tools",
        ),
        (
            json!({"code": "x", "tools": t, "lang": "js"}),
            "Unsupported language: js",
        ),
        (
            json!({"code": "x", "tools": t, "lang": "bash", "language": "ruby"}),
            "Unsupported language: ruby",
        ),
        (
            json!({"code": "x", "tools": t, "timeout": 0}),
            "timeout must be a positive number of milliseconds",
        ),
        (
            json!({"code": "x", "tools": [tool("a-b"), tool("a_b")]}),
            "Tool names collide after normalization: a-b, a_b (a_b)",
        ),
        (
            json!({"code": "x", "tools": t, "files": [{"name": "d/_ptc_history.json", "content": "{}"}]}),
            "Invalid file name: d/_ptc_history.json",
        ),
        (
            json!({"continuation_token": "x", "tool_results": []}),
            "tool_results must be a non-empty array",
        ),
        (
            json!({"continuation_token": "x", "tool_results": [{"call_id": "call_1", "result": 1}]}),
            "tool_results[0].call_id must match ^call_\\d{3,6}$",
        ),
        (
            json!({"continuation_token": "x", "tool_results": [{"call_id": "call_001"}]}),
            "tool_results[0].result is required",
        ),
    ];
    for (body, msg) in cases {
        let (st, e) = ptc(&s, "alice", body.clone()).await;
        assert_eq!((st, e), (400, json!({"error": msg})), "{body}");
    }
    let (st, e) = post(
        s.v1(),
        "alice",
        Some("not a uuid!"),
        json!({"code": "x", "tools": t}),
    )
    .await;
    assert_eq!(
        (st, e),
        (
            400,
            json!({"error": "Invalid X-LibreChat-Code-Request-ID header"})
        )
    );
}

#[tokio::test]
async fn an_unregistered_tool_fails_the_run_with_the_contracts_reason() {
    let s = server().await;
    let (st, v) = ptc(
        &s,
        "alice",
        json!({"code": "print('hi')\nawait _ptc_call('rm_rf', {})", "tools": [tool("t")]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["status"], "error", "{v}");
    assert_eq!(v["error"], "Sandbox requested an unregistered tool: rm_rf");
    assert_eq!(v["stdout"], "hi\n");
}

const BASH: &str = r#"
echo start
n=$(cat /mnt/data/n 2>/dev/null || echo 0); echo $((n + 1)) > /mnt/data/n
r=$(add '{"a":1,"b":2}')
echo "sum=$r jq=$(printf '%s' "$r" | jq -r .sum)"
echo "who=$(whoami_tool)"
add '{"a":5}' > /mnt/data/x.json &
add '{"a":6}' > /mnt/data/y.json &
wait
echo "x=$(cat /mnt/data/x.json) y=$(cat /mnt/data/y.json)"
if ! failing 2>/mnt/data/err.txt; then echo "failed: $(cat /mnt/data/err.txt)"; fi
echo "runs=$(cat /mnt/data/n)"
"#;

#[tokio::test]
async fn bash_tools_take_a_json_string_and_print_compact_json() {
    let s = server().await;
    let (st, v) = ptc(
        &s,
        "alice",
        json!({"code": BASH, "lang": "bash",
               "tools": [tool("add"), {"name": "whoami_tool"}, {"name": "failing"}]}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        calls(&v),
        [("call_001".into(), "add".into(), json!({"a": 1, "b": 2}))]
    );
    assert_eq!(v["partial_stdout"], "start\n");
    let (_, v) = reply(
        &s,
        &v,
        json!([{"call_id": "call_001", "result": {"sum": 3}}]),
    )
    .await;
    assert_eq!(calls(&v)[0].1, "whoami_tool");
    let (_, v) = reply(&s, &v, json!([{"call_id": "call_002", "result": "alice"}])).await;
    // the two background jobs' calls come in one round
    let mut round: Vec<Value> = calls(&v).into_iter().map(|c| c.2).collect();
    round.sort_by_key(|i| i["a"].as_i64());
    assert_eq!(round, [json!({"a": 5}), json!({"a": 6})]);
    let ids: Vec<String> = calls(&v).into_iter().map(|c| c.0).collect();
    let results: Vec<Value> = calls(&v)
        .into_iter()
        .map(|(id, _, input)| json!({"call_id": id, "result": [input["a"]]}))
        .collect();
    assert_eq!(ids.len(), 2);
    let (_, v) = reply(&s, &v, json!(results)).await;
    assert_eq!(calls(&v)[0].1, "failing");
    let (st, done) = reply(
        &s,
        &v,
        json!([{"call_id": "call_005", "result": null, "is_error": true, "error_message": "denied"}]),
    )
    .await;
    assert_eq!(st, 200, "{done}");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["stdout"],
        "start\nsum={\"sum\":3} jq=3\nwho=alice\nx=[5] y=[6]\nfailed: denied\nruns=1\n",
        "{done}"
    );
}

#[tokio::test]
async fn more_than_200_tool_calls_end_the_run_with_400() {
    let s = server().await;
    let code = "import asyncio\nawait asyncio.gather(*[t(a=i) for i in range(201)])";
    let (st, e) = ptc(&s, "alice", json!({"code": code, "tools": [tool("t")]})).await;
    assert_eq!(
        (st, e),
        (
            400,
            json!({"error": "Tool call limit exceeded: at most 200 tool calls per execution"})
        )
    );
}

#[tokio::test]
async fn a_paused_runs_watchers_see_its_tool_calls() {
    let s = server().await;
    let resp = client()
        .post(format!("{}/exec/programmatic", s.v1()))
        .header("User-Id", "alice")
        .json(&json!({"code": "print('hi')\nawait t(a=7)", "tools": [tool("t")]}))
        .send()
        .await
        .expect("send");
    let run_id = resp.headers()["x-kiln-run-id"]
        .to_str()
        .expect("run id")
        .to_owned();
    let v: Value = resp.json().await.expect("json");
    let events = client()
        .get(format!("{}/runs/{run_id}/events", s.v1()))
        .header("User-Id", "alice")
        .send()
        .await
        .expect("events");
    // the run is paused: read what is there, then answer the round
    let watch = tokio::spawn(sse_events(events, Duration::from_secs(15)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (st, done) = reply(&s, &v, json!([{"call_id": "call_001", "result": 1}])).await;
    assert_eq!((st, &done["status"]), (200, &json!("completed")), "{done}");
    let events = watch.await.expect("watch");
    let names: Vec<&str> = events.iter().filter_map(|e| e.event.as_deref()).collect();
    let at = |name: &str| names.iter().position(|n| *n == name);
    let calls = &events
        .iter()
        .find(|e| e.event.as_deref() == Some("tool_calls"))
        .expect("a tool_calls event")
        .data;
    assert_eq!(
        calls["tool_calls"],
        json!([{"id": "call_001", "name": "t", "input": {"a": 7}}])
    );
    assert!(at("stdout") < at("tool_calls"), "{names:?}");
    assert!(at("tool_calls") < at("result"), "{names:?}");
}

/// Finding 4 of issue 24: one user leaving tool calls unanswered took every
/// programmatic place. A user at their cap gets 429; others still get in.
#[tokio::test]
async fn a_user_at_their_paused_run_cap_gets_429_and_others_still_get_in() {
    let s = server_with(|c| {
        c.max_concurrency = 4;
        c.ptc_max_active = 3;
        c.ptc_max_per_user = 1;
    })
    .await;
    let body = json!({"code": "await t(a=1)", "tools": [tool("t")]});
    let (st, paused) = ptc(&s, "alice", body.clone()).await;
    assert_eq!(st, 200, "{paused}");
    calls(&paused);
    let (st, e) = ptc(&s, "alice", body.clone()).await;
    assert_eq!(st, 429, "{e}");
    assert_eq!(
        e["error"],
        "Too many programmatic executions of this user in progress (at most 1); \
         answer or cancel one first"
    );
    for user in ["bob", "carol"] {
        let (st, v) = ptc(&s, user, body.clone()).await;
        assert_eq!(st, 200, "{user}: {v}");
        calls(&v);
    }
    // the node's cap still holds for everyone
    let (st, e) = ptc(&s, "dave", body.clone()).await;
    assert_eq!(st, 503, "{e}");
    // alice's answered run gives her place back
    let (st, done) = reply(&s, &paused, json!([{"call_id": "call_001", "result": 1}])).await;
    assert_eq!((st, &done["status"]), (200, &json!("completed")), "{done}");
    let (st, v) = ptc(&s, "alice", body).await;
    assert_eq!(st, 200, "{v}");
}

/// Finding 5 of issue 24: finished programmatic runs kept their event log
/// and answer for the whole state TTL, outside `run_retention_mb`. A
/// finished one is kept like any run: once the registry's retention budget
/// lets it go, nothing of it is left (a retried continuation is 404, not a
/// replay from a copy the face kept).
#[tokio::test]
async fn finished_programmatic_runs_count_against_the_run_retention_budget() {
    let s = server_with(|c| {
        c.run_retention_mb = 1;
        c.stdout_bytes = 1024 * 1024;
        c.ptc_state_ttl_secs = 600;
    })
    .await;
    let body = json!({
        "code": "r = await t(a=1)\nprint('x' * 300_000)",
        "tools": [tool("t")],
    });
    let result = json!([{"call_id": "call_001", "result": 1}]);
    let mut first = None;
    for i in 0..6 {
        let (st, paused) = ptc(&s, "alice", body.clone()).await;
        assert_eq!(st, 200, "run {i}: {paused}");
        calls(&paused);
        let (st, done) = reply(&s, &paused, result.clone()).await;
        assert_eq!((st, &done["status"]), (200, &json!("completed")), "run {i}");
        assert_eq!(done["stdout"].as_str().map(str::len), Some(300_001));
        if i == 0 {
            // a retry while the run is kept: the same answer
            let (st, again) = reply(&s, &paused, result.clone()).await;
            assert_eq!((st, &again), (200, &done));
            first = Some(paused);
        }
    }
    // six runs of 300 KB (twice: log and result) are past 1 MiB: the first
    // is gone from the registry, and from the face with it
    let (st, e) = reply(&s, &first.expect("first run"), result).await;
    assert_eq!(st, 404, "answered {}", e["status"]);
    assert_eq!(e, json!({"error": "Execution not found or expired"}));
}
