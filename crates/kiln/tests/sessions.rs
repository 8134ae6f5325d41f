//! Kiln's sessions API over HTTP: live `py` kernels whose state persists
//! between calls (`/v1/sessions`).

mod common;

use std::time::{Duration, Instant};

use common::{Sse, client, metric, server_with, sse_events};
use kiln::testing::TestServer;
use serde_json::{Value, json};

/// A server whose `py` fork-server (the data template only, to start
/// quickly) is up, so kernels can be forked.
async fn sessions_server(tweak: impl FnOnce(&mut kiln::config::Config)) -> TestServer {
    let s = server_with(|c| {
        c.python_template = "data".into();
        c.warm_jails = 2;
        c.warm_per_runtime = 1;
        tweak(c);
    })
    .await;
    common::wait_for_profile(&s, "py-data").await;
    s
}

async fn call(
    s: &TestServer,
    method: reqwest::Method,
    path: &str,
    user: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = client().request(method, format!("{}{path}", s.v1()));
    if let Some(u) = user {
        req = req.header("User-Id", u);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.json::<Value>().await.unwrap_or(Value::Null))
}

async fn create(s: &TestServer, user: Option<&str>) -> String {
    create_lang(s, user, "py").await
}

/// Creates a `lang` session as `user` (201); its id.
async fn create_lang(s: &TestServer, user: Option<&str>, lang: &str) -> String {
    let (status, v) = call(
        s,
        reqwest::Method::POST,
        "/sessions",
        user,
        Some(json!({ "lang": lang })),
    )
    .await;
    assert_eq!(status, 201, "create: {v}");
    assert_eq!(v["lang"], lang, "{v}");
    v["session_id"].as_str().expect("session_id").to_owned()
}

/// Closes session `id` (204).
async fn close(s: &TestServer, id: &str) {
    let (status, v) = call(
        s,
        reqwest::Method::DELETE,
        &format!("/sessions/{id}"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 204, "close {id}: {v}");
}

async fn exec_as(s: &TestServer, id: &str, user: Option<&str>, body: Value) -> (u16, Value) {
    call(
        s,
        reqwest::Method::POST,
        &format!("/sessions/{id}/exec"),
        user,
        Some(body),
    )
    .await
}

async fn exec_ok(s: &TestServer, id: &str, code: &str) -> Value {
    let (status, v) = exec_as(s, id, None, json!({ "code": code })).await;
    assert_eq!(status, 200, "exec {code:?}: {v}");
    v
}

/// Starts evaluating `code` in session `id` on a task of its own; returns
/// once the session says it is busy.
async fn start_long(s: &TestServer, id: &str, code: &str) -> tokio::task::JoinHandle<Value> {
    let (v1, id2, code) = (s.v1(), id.to_owned(), code.to_owned());
    let long = tokio::spawn(async move {
        client()
            .post(format!("{v1}/sessions/{id2}/exec"))
            .json(&json!({ "code": code }))
            .send()
            .await
            .expect("send")
            .json::<Value>()
            .await
            .expect("json")
    });
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let path = format!("/sessions/{id}");
        let (status, v) = call(s, reqwest::Method::GET, &path, None, None).await;
        assert_eq!(status, 200, "{v}");
        if v["status"] == "busy" {
            return long;
        }
        assert!(
            Instant::now() < until,
            "the long evaluation never started: {v}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Interrupts session `id` through its route (202) and returns the answer
/// of the evaluation `long` it stopped.
async fn interrupt(s: &TestServer, id: &str, long: tokio::task::JoinHandle<Value>) -> Value {
    let path = format!("/sessions/{id}/interrupt");
    let (status, v) = call(s, reqwest::Method::POST, &path, None, None).await;
    assert_eq!(status, 202, "{v}");
    tokio::time::timeout(Duration::from_secs(10), long)
        .await
        .expect("the interrupted evaluation answers")
        .expect("join")
}

#[tokio::test]
async fn a_session_keeps_state_and_reports_values_output_and_errors() {
    let s = sessions_server(|_| {}).await;
    let t0 = Instant::now();
    let id = create(&s, None).await;
    let create_ms = t0.elapsed().as_millis();
    let (status, v) = call(
        &s,
        reqwest::Method::GET,
        &format!("/sessions/{id}"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "idle");
    assert_eq!(v["lang"], "py");

    let v = exec_ok(
        &s,
        &id,
        "x = 40\nimport math\ndef twice(n):\n    return 2 * n\n",
    )
    .await;
    assert_eq!(v["status"], "ok", "{v}");
    assert!(v["result"].is_null(), "no final expression: {v}");
    let v = exec_ok(&s, &id, "twice(x + 1) + math.floor(0.5)").await;
    assert_eq!(v["result"]["text"], "82", "{v}");
    let v = exec_ok(&s, &id, "_ + 1").await;
    assert_eq!(v["result"]["text"], "83", "`_` holds the last value: {v}");

    let v = exec_ok(
        &s,
        &id,
        "import sys, subprocess\nprint('out', x)\nprint('err', file=sys.stderr)\nsubprocess.run(['echo', 'child'])\n'done'",
    )
    .await;
    assert_eq!(v["stdout"], "out 40\nchild\n", "{v}");
    assert_eq!(v["stderr"], "err\n", "{v}");
    assert_eq!(v["result"]["text"], "'done'");
    assert!(v["usage"]["wall_time_ms"].as_u64().is_some(), "{v}");
    assert!(v["usage"]["cpu_time_ms"].as_u64().is_some(), "{v}");
    assert!(v["usage"]["memory_peak_bytes"].as_u64().is_some(), "{v}");

    let v = exec_ok(&s, &id, "def g():\n    return 1 / 0\n\ng()").await;
    assert_eq!(v["status"], "error", "{v}");
    assert_eq!(v["error"]["ename"], "ZeroDivisionError");
    assert_eq!(v["error"]["evalue"], "division by zero");
    let tb = v["error"]["traceback"].to_string();
    assert!(
        tb.contains("<cell 5>") && tb.contains("return 1 / 0"),
        "{tb}"
    );
    assert!(!tb.contains("kiln_kernel"), "kernel frames hidden: {tb}");

    let v = exec_ok(&s, &id, "def broken(:\n").await;
    assert_eq!(v["error"]["ename"], "SyntaxError", "{v}");
    // the state survived both errors
    let v = exec_ok(&s, &id, "x").await;
    assert_eq!(v["result"]["text"], "40");

    let (_, v) = call(
        &s,
        reqwest::Method::GET,
        &format!("/sessions/{id}"),
        None,
        None,
    )
    .await;
    assert_eq!(v["evaluations"], 7, "{v}");
    close(&s, &id).await;
    let (status, v) = exec_as(&s, &id, None, json!({"code": "x"})).await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"], "session_not_found");
    eprintln!("session create took {create_ms} ms");
}

#[tokio::test]
async fn a_timeout_or_an_interrupt_stops_the_evaluation_and_keeps_the_state() {
    let s = sessions_server(|c| c.session_busy_wait_ms = 300).await;
    let id = create(&s, None).await;
    exec_ok(&s, &id, "kept = 'yes'").await;

    let t0 = Instant::now();
    let (status, v) = exec_as(
        &s,
        &id,
        None,
        json!({"code": "import time\nwhile True:\n    time.sleep(0.05)", "timeout": 700}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "timeout", "{v}");
    assert_eq!(v["error"]["ename"], "KeyboardInterrupt", "{v}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(exec_ok(&s, &id, "kept").await["result"]["text"], "'yes'");

    // a long evaluation: a second call waits, then 409; the interrupt route
    // stops the first one
    let long = start_long(
        &s,
        &id,
        "import time\nfor i in range(600):\n    time.sleep(0.05)",
    )
    .await;
    let (status, v) = exec_as(&s, &id, None, json!({"code": "1"})).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"], "session_busy");
    let v = interrupt(&s, &id, long).await;
    assert_eq!(v["status"], "error", "{v}");
    assert_eq!(v["error"]["ename"], "KeyboardInterrupt", "{v}");
    assert_eq!(exec_ok(&s, &id, "kept").await["result"]["text"], "'yes'");
    // an interrupt while idle changes nothing
    let (status, _) = call(
        &s,
        reqwest::Method::POST,
        &format!("/sessions/{id}/interrupt"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 202);
    assert_eq!(exec_ok(&s, &id, "kept").await["result"]["text"], "'yes'");
}

#[tokio::test]
async fn an_evaluation_that_ignores_its_interrupt_loses_the_session() {
    let s = sessions_server(|c| c.session_interrupt_grace_secs = 1).await;
    let id = create(&s, None).await;
    let code = "import time\nwhile True:\n    try:\n        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass";
    let (status, v) = exec_as(&s, &id, None, json!({"code": code, "timeout": 500})).await;
    assert_eq!(status, 410, "{v}");
    assert_eq!(v["error"], "session_lost");
    let msg = v["message"].as_str().unwrap_or_default();
    assert!(msg.starts_with("session lost: "), "{msg}");
    assert!(msg.contains("interrupt"), "{msg}");
    let (status, again) = exec_as(&s, &id, None, json!({"code": "1"})).await;
    assert_eq!(status, 410, "{again}");
    assert_eq!(again["message"], v["message"]);
}

#[tokio::test]
async fn out_of_memory_ends_the_session_with_a_distinct_error() {
    let s = sessions_server(|c| c.memory_mb = 256).await;
    let id = create(&s, None).await;
    exec_ok(&s, &id, "state = 1").await;
    let (status, v) = exec_as(&s, &id, None, json!({"code": "big = b'x' * (1 << 30)"})).await;
    assert_eq!(status, 410, "{v}");
    assert_eq!(v["message"], "session lost: out of memory", "{v}");
    let (status, v) = exec_as(&s, &id, None, json!({"code": "state"})).await;
    assert_eq!(status, 410, "the next call says so too: {v}");
    assert_eq!(v["message"], "session lost: out of memory");
    let (status, v) = call(
        &s,
        reqwest::Method::GET,
        &format!("/sessions/{id}"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v["status"], "lost");
    assert_eq!(v["lost_reason"], "session lost: out of memory");
    // a new session works
    let id = create(&s, None).await;
    assert_eq!(exec_ok(&s, &id, "6 * 7").await["result"]["text"], "42");
}

#[tokio::test]
async fn sessions_belong_to_their_creator_and_obey_caps_and_the_idle_ttl() {
    let s = sessions_server(|c| {
        c.max_sessions = 2;
        c.max_sessions_per_user = 1;
    })
    .await;
    let alice = create(&s, Some("alice")).await;
    exec_as(&s, &alice, Some("alice"), json!({"code": "secret = 'a'"})).await;
    // another user cannot see, use, interrupt or delete it
    for (method, path, body) in [
        (reqwest::Method::GET, format!("/sessions/{alice}"), None),
        (
            reqwest::Method::POST,
            format!("/sessions/{alice}/exec"),
            Some(json!({"code": "secret"})),
        ),
        (
            reqwest::Method::POST,
            format!("/sessions/{alice}/interrupt"),
            None,
        ),
        (
            reqwest::Method::GET,
            format!("/sessions/{alice}/files"),
            None,
        ),
        (reqwest::Method::DELETE, format!("/sessions/{alice}"), None),
    ] {
        let (status, v) = call(&s, method.clone(), &path, Some("bob"), body).await;
        assert_eq!(status, 403, "{method} {path}: {v}");
    }
    // caps: one per user (429), two on the node (503)
    let (status, v) = call(
        &s,
        reqwest::Method::POST,
        "/sessions",
        Some("alice"),
        Some(json!({"lang": "py"})),
    )
    .await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"], "session_limit");
    let bob = create(&s, Some("bob")).await;
    let (status, v) = call(
        &s,
        reqwest::Method::POST,
        "/sessions",
        Some("carol"),
        Some(json!({"lang": "py"})),
    )
    .await;
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"], "sessions_full");
    // one-shot runs still get jails: kernels have slots of their own
    let run = common::run(&s, "py", "print(1 + 1)").await;
    assert_eq!(run["stdout"], "2\n", "{run}");

    let (status, v) = call(
        &s,
        reqwest::Method::POST,
        "/sessions",
        None,
        Some(json!({"lang": "cobol"})),
    )
    .await;
    assert_eq!(status, 400, "{v}");

    // the idle TTL: bob's session, asked to live 1 s idle, is closed
    let (status, _) = call(
        &s,
        reqwest::Method::DELETE,
        &format!("/sessions/{bob}"),
        Some("bob"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, v) = call(
        &s,
        reqwest::Method::POST,
        "/sessions",
        Some("bob"),
        Some(json!({"lang": "py", "ttl_seconds": 1})),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let short = v["session_id"].as_str().unwrap().to_owned();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _) = call(
            &s,
            reqwest::Method::GET,
            &format!("/sessions/{short}"),
            Some("bob"),
            None,
        )
        .await;
        if status == 404 {
            break;
        }
        assert!(Instant::now() < until, "the idle session was not closed");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // alice's, in use, is still there
    let (status, v) = exec_as(&s, &alice, Some("alice"), json!({"code": "secret"})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["text"], "'a'");
}

#[tokio::test]
async fn workspace_files_can_be_written_read_listed_and_deleted() {
    let s = sessions_server(|_| {}).await;
    let id = create(&s, None).await;
    let url = |p: &str| format!("{}/sessions/{id}/files{p}", s.v1());
    let r = client()
        .put(url("/data/in.txt"))
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let v = exec_ok(
        &s,
        &id,
        "import os\ntext = open('data/in.txt').read()\nopen('out.csv', 'w').write('a,b\\n1,2\\n')\nos.symlink('/etc/passwd', 'link')\ntext",
    )
    .await;
    assert_eq!(v["result"]["text"], "'hello'", "{v}");
    assert_eq!(v["files"], json!([{"path": "out.csv", "size": 8}]), "{v}");

    let list: Value = client()
        .get(url(""))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        list["files"],
        json!([{"path": "data/in.txt", "size": 5}, {"path": "out.csv", "size": 8}]),
        "links are not listed: {list}"
    );
    let r = client().get(url("/out.csv")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.text().await.unwrap(), "a,b\n1,2\n");
    // a link the kernel planted is never followed
    let r = client().get(url("/link")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let r = client()
        .get(url("/..%2F..%2Fetc%2Fpasswd"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);

    let r = client().delete(url("/out.csv")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let r = client().get(url("/out.csv")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let v = exec_ok(&s, &id, "import os\nos.path.exists('out.csv')").await;
    assert_eq!(v["result"]["text"], "False");

    // streaming: output as it is written, then the result
    let r = client()
        .post(format!("{}/sessions/{id}/exec", s.v1()))
        .header("Accept", "text/event-stream")
        .json(&json!({"code": "import time\nprint('first', flush=True)\ntime.sleep(0.3)\nprint('second')\n6 * 7"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let events = sse_events(r, Duration::from_secs(20)).await;
    let named: Vec<&Sse> = events.iter().filter(|e| e.event.is_some()).collect();
    let (last, output) = named.split_last().expect("events");
    assert_eq!(last.event.as_deref(), Some("result"), "{events:?}");
    assert_eq!(last.data["result"]["text"], "42");
    assert!(
        output.iter().all(|e| e.event.as_deref() == Some("stdout")),
        "{events:?}"
    );
    let text: String = output
        .iter()
        .map(|e| e.data["text"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(text, "first\nsecond\n");
    let second = output
        .iter()
        .find(|e| {
            e.data["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("second"))
        })
        .expect("second line");
    assert!(
        second.at.duration_since(output[0].at) >= Duration::from_millis(200),
        "the first line arrived as it was written, before the code finished: {events:?}"
    );
}

/// PNG's signature, base64.
const PNG_BASE64: &str = "iVBORw0KGgo";

#[tokio::test]
async fn a_figure_as_final_expression_is_a_png_result_and_plt_show_writes_files() {
    let s = sessions_server(|_| {}).await;
    let id = create(&s, None).await;
    let v = exec_ok(
        &s,
        &id,
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2, 3])\nfig",
    )
    .await;
    assert_eq!(v["status"], "ok", "{v}");
    let text = v["result"]["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("<Figure size"), "{v}");
    let png = v["result"]["png"].as_str().unwrap_or_default();
    assert!(png.starts_with(PNG_BASE64) && png.len() > 1000, "{v}");
    // the figure was closed once shown, as Jupyter's inline backend does
    let v = exec_ok(&s, &id, "len(plt.get_fignums())").await;
    assert_eq!(v["result"]["text"], "0", "{v}");

    // axes stand for their figure; an object with _repr_png_ draws itself
    let v = exec_ok(&s, &id, "plt.figure().gca()").await;
    assert!(
        v["result"]["png"]
            .as_str()
            .is_some_and(|p| p.starts_with(PNG_BASE64)),
        "{v}"
    );
    let v = exec_ok(
        &s,
        &id,
        "import io\nclass Dot:\n    def _repr_png_(self):\n        return fig_bytes\n\nf2 = plt.figure()\nbuf = io.BytesIO()\nf2.savefig(buf, format='png')\nplt.close(f2)\nfig_bytes = buf.getvalue()\nDot()",
    )
    .await;
    assert!(
        v["result"]["png"]
            .as_str()
            .is_some_and(|p| p.starts_with(PNG_BASE64)),
        "{v}"
    );
    // a plain value has text only
    let v = exec_ok(&s, &id, "[1, 2]").await;
    assert_eq!(v["result"]["text"], "[1, 2]");
    assert!(v["result"].get("png").is_none(), "{v}");

    // plt.show() inside an evaluation: each open figure becomes a file of
    // that evaluation, through the template's hook
    let v = exec_ok(
        &s,
        &id,
        "plt.figure(); plt.plot([3, 1])\nplt.figure(); plt.bar([1], [2])\nplt.show()",
    )
    .await;
    let files = v["files"].as_array().expect("files");
    let names: Vec<&str> = files.iter().filter_map(|f| f["path"].as_str()).collect();
    assert_eq!(names, ["plot_1.png", "plot_2.png"], "{v}");
    assert!(v["result"].is_null(), "{v}");
    let r = client()
        .get(format!("{}/sessions/{id}/files/plot_2.png", s.v1()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let bytes = r.bytes().await.unwrap();
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG file");
    // the next show() numbers on
    let v = exec_ok(&s, &id, "plt.plot([1]); plt.show()").await;
    assert_eq!(v["files"][0]["path"], "plot_3.png", "{v}");
}

#[tokio::test]
async fn a_js_session_keeps_state_with_repl_semantics() {
    let s = sessions_server(|_| {}).await;
    let id = create_lang(&s, None, "js").await;
    let v = exec_ok(
        &s,
        &id,
        "let x = 40; const y = 2; function twice(n) { return 2 * n }\nclass C { get k() { return 7 } }",
    )
    .await;
    assert_eq!(v["status"], "ok", "{v}");
    assert!(v["result"].is_null(), "a declaration has no value: {v}");
    let v = exec_ok(&s, &id, "twice(x) + y + new C().k").await;
    assert_eq!(
        v["result"]["text"], "89",
        "let, const, function and class persist: {v}"
    );
    let v = exec_ok(&s, &id, "_ + 1").await;
    assert_eq!(v["result"]["text"], "90", "`_` holds the last value: {v}");
    // top-level await, its declarations persisting too
    let v = exec_ok(
        &s,
        &id,
        "const got = await new Promise(r => setTimeout(() => r(x + 1), 50));\ngot",
    )
    .await;
    assert_eq!(v["result"]["text"], "41", "{v}");
    let v = exec_ok(&s, &id, "got * 2").await;
    assert_eq!(v["result"]["text"], "82", "{v}");
    let v = exec_ok(&s, &id, "{a: 1, b: [x]}").await;
    assert_eq!(
        v["result"]["text"], "{ a: 1, b: [ 40 ] }",
        "an object literal: {v}"
    );

    let v = exec_ok(
        &s,
        &id,
        "console.log('out', x); console.error('err'); process.stdout.write('raw\\n');\nrequire('child_process').execSync('echo child', {stdio: 'inherit'});\n'done'",
    )
    .await;
    assert_eq!(v["stdout"], "out 40\nraw\n", "{v}");
    assert_eq!(v["stderr"], "err\n", "{v}");
    assert_eq!(v["result"]["text"], "'done'");
    assert!(v["usage"]["cpu_time_ms"].as_u64().is_some(), "{v}");

    let v = exec_ok(&s, &id, "function g() { return null.k }\ng()").await;
    assert_eq!(v["status"], "error", "{v}");
    assert_eq!(v["error"]["ename"], "TypeError", "{v}");
    let tb = v["error"]["traceback"].to_string();
    assert!(tb.contains("at g (<cell 8>:1:"), "{tb}");
    assert!(
        !tb.contains("node_kernel") && !tb.contains("node:vm"),
        "kernel frames hidden: {tb}"
    );
    let v = exec_ok(&s, &id, "let broken = ;").await;
    assert_eq!(v["error"]["ename"], "SyntaxError", "{v}");
    let v = exec_ok(&s, &id, "await Promise.reject(new RangeError('no'))").await;
    assert_eq!(v["error"]["ename"], "RangeError", "{v}");
    assert_eq!(v["error"]["evalue"], "no", "{v}");
    // an error thrown later, from a timer, does not end the kernel
    exec_ok(
        &s,
        &id,
        "setTimeout(() => { throw new Error('later') }, 1); 1",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let v = exec_ok(&s, &id, "x").await;
    assert_eq!(v["result"]["text"], "40", "the state survived: {v}");
    assert!(
        v["stderr"]
            .as_str()
            .unwrap_or_default()
            .contains("Error: later"),
        "the late error is reported on stderr: {v}"
    );

    // files: written by the code, listed, readable, with the workspace's rules
    let v = exec_ok(
        &s,
        &id,
        "require('fs').writeFileSync('out.json', JSON.stringify({x}));\nprocess.cwd()",
    )
    .await;
    assert_eq!(v["result"]["text"], "'/mnt/data'", "{v}");
    assert_eq!(v["files"], json!([{"path": "out.json", "size": 8}]), "{v}");
    let r = client()
        .get(format!("{}/sessions/{id}/files/out.json", s.v1()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "{\"x\":40}");
    let r = client()
        .put(format!("{}/sessions/{id}/files/in.txt", s.v1()))
        .body("hello")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    let v = exec_ok(&s, &id, "require('fs').readFileSync('in.txt', 'utf8')").await;
    assert_eq!(v["result"]["text"], "'hello'", "{v}");
}

#[tokio::test]
async fn a_js_timeout_or_interrupt_stops_busy_and_awaiting_code_and_keeps_the_state() {
    let s = sessions_server(|_| {}).await;
    let id = create_lang(&s, None, "js").await;
    exec_ok(&s, &id, "let kept = 'yes'").await;
    for code in [
        "for (;;) {}",
        "await new Promise(r => setTimeout(r, 60000))",
    ] {
        let t0 = Instant::now();
        let (status, v) = exec_as(&s, &id, None, json!({"code": code, "timeout": 700})).await;
        assert_eq!(status, 200, "{code}: {v}");
        assert_eq!(v["status"], "timeout", "{code}: {v}");
        assert_eq!(v["error"]["ename"], "Interrupted", "{code}: {v}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(exec_ok(&s, &id, "kept").await["result"]["text"], "'yes'");
    }
    // the interrupt route reaches a busy loop
    let long = start_long(&s, &id, "kept = 'changed'; for (;;) {}").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let v = interrupt(&s, &id, long).await;
    assert_eq!(v["error"]["ename"], "Interrupted", "{v}");
    assert_eq!(
        exec_ok(&s, &id, "kept").await["result"]["text"],
        "'changed'"
    );
}

#[tokio::test]
async fn a_js_kernel_out_of_memory_or_deaf_to_its_interrupt_ends_the_session() {
    let s = sessions_server(|c| {
        c.memory_mb = 256;
        c.session_interrupt_grace_secs = 1;
    })
    .await;
    let id = create_lang(&s, None, "js").await;
    exec_ok(&s, &id, "const state = 1").await;
    let (status, v) = exec_as(
        &s,
        &id,
        None,
        json!({"code": "const hog = []; for (;;) hog.push(Buffer.alloc(16 << 20, 1))"}),
    )
    .await;
    assert_eq!(status, 410, "{v}");
    assert_eq!(v["message"], "session lost: out of memory", "{v}");
    let (status, v) = exec_as(&s, &id, None, json!({"code": "state"})).await;
    assert_eq!(status, 410, "the next call says so too: {v}");

    // SIGINT ignored by a process the code started and waits for
    // synchronously: the interrupt cannot get through, the kernel is killed
    let id = create_lang(&s, None, "js").await;
    let code = "require('child_process').execFileSync('sh', ['-c', 'trap \"\" INT; sleep 30'])";
    let (status, v) = exec_as(&s, &id, None, json!({"code": code, "timeout": 500})).await;
    assert_eq!(status, 410, "{v}");
    let msg = v["message"].as_str().unwrap_or_default();
    assert!(msg.contains("interrupt"), "{msg}");
}

/// Finding 7 of issue 24: after a caller's `/v1/exec` was answered 429,
/// its kernel evaluations still ran. Every face that runs code counts in
/// the one "starts code" budget of the caller: §4's exec limit and the run
/// registry's per-caller limit alike.
#[tokio::test]
async fn kernel_evaluations_on_every_face_count_against_the_callers_exec_limits() {
    let s = sessions_server(|c| {
        c.rate_exec = "3/min".into();
        c.rate_limit_runs = 1;
        c.rate_limit_window_secs = 60;
    })
    .await;
    let mine = create(&s, Some("greedy")).await;
    let theirs = create(&s, Some("patient")).await;
    let exec = |body: Value| client().post(format!("{}/exec", s.v1())).json(&body).send();
    let r = exec(json!({"lang": "py", "code": "print(1)", "user_id": "greedy"}))
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    // MCP's execute_code in the kernel (the stateless revision), within
    // §4's exec limit still: the run registry's per-caller limit refuses it
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "execute_code",
        "arguments": {"lang": "py", "code": "1", "session_id": mine},
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        },
    }});
    let r = client()
        .post(format!("{}/mcp", s.v1()))
        .header("User-Id", "greedy")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "execute_code")
        .json(&call)
        .send()
        .await
        .expect("send");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["result"]["isError"], true, "/mcp execute_code: {v}");
    assert!(
        v["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("Too many")),
        "/mcp execute_code: {v}"
    );
    let r = exec(json!({"lang": "py", "code": "print(1)", "user_id": "greedy"}))
        .await
        .expect("send");
    assert_eq!(r.status(), 429, "the run registry's per-caller limit");
    // the sessions API: the run registry's limit (the exec class counts it)
    let (status, v) = exec_as(&s, &mine, Some("greedy"), json!({"code": "1"})).await;
    assert_eq!(status, 429, "/v1/sessions/{{id}}/exec: {v}");
    assert_eq!(v["error"], "rate_limited", "{v}");
    // seed 003's /runtime/code, then seed 004's /api/v1/execute: past §4's
    // exec limit as well by now
    for route in ["/runtime/code", "/api/v1/execute?user_uuid=w1"] {
        let r = client()
            .post(format!("{}{route}", s.base_url))
            .header("User-Id", "greedy")
            .json(&json!({"code": "1"}))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 429, "{route}");
    }
    let r = exec(json!({"lang": "py", "code": "print(1)", "user_id": "greedy"}))
        .await
        .expect("send");
    assert_eq!(r.status(), 429, "§4's exec limit");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"], "rate_limited", "{v}");
    // another caller is unaffected, and the kernel still works
    let (status, v) = exec_as(&s, &theirs, Some("patient"), json!({"code": "6 * 7"})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["text"], "42", "{v}");
}

#[tokio::test]
async fn kernel_evaluations_are_runs_their_owner_finds_with_events_and_usage() {
    const KEY: &str = "evaluations-are-runs";
    let s = common::kernel_server(KEY, |_| {}).await;
    // the seed faces need the key; Kiln's API then does too
    let client = || KeyedClient(client(), KEY);
    let r = client()
        .post(format!("{}/sessions", s.v1()))
        .header("User-Id", "alice")
        .json(&json!({"lang": "py"}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 201);
    let id = r.json::<Value>().await.unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Kiln's sessions API: the run id in the body and the header
    let r = client()
        .post(format!("{}/sessions/{id}/exec", s.v1()))
        .header("User-Id", "alice")
        .json(&json!({"code": "x = sum(range(3 * 10**6)); print('in a session')"}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let header = r.headers()["x-run-id"].to_str().unwrap().to_owned();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["stdout"], "in a session\n", "{v}");
    assert_eq!(v["run_id"], header.as_str(), "{v}");
    // seed 004's worker: the run id in the header (its body is the seed's)
    let r = client()
        .post(format!("{}/api/v1/execute?user_uuid=w1", s.base_url))
        .header("X-Auth-Token", KEY)
        .header("User-Id", "alice")
        .json(&json!({"code": "print(6 * 7)"}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let seed004 = r.headers()["x-run-id"].to_str().unwrap().to_owned();
    let v: Value = r.json().await.unwrap();
    assert!(
        v.get("run_id").is_none(),
        "seed 004's body is unchanged: {v}"
    );
    let get = |user: &'static str, path: String| {
        client()
            .get(format!("{}{path}", s.v1()))
            .header("User-Id", user)
            .send()
    };
    for (run, out) in [(header, "in a session\n"), (seed004, "42\n")] {
        let r = get("alice", format!("/runs/{run}")).await.expect("send");
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["status"], "finished", "{v}");
        assert_eq!(v["lang"], "py", "{v}");
        assert_eq!(v["result"]["stdout"], out, "{v}");
        let usage = &v["usage"]["run"];
        assert!(usage["wall_time_ms"].as_u64().is_some(), "{v}");
        assert!(usage["cpu_time_ms"].as_u64().is_some(), "{v}");
        assert!(usage["memory_peak_bytes"].as_u64().unwrap() > 0, "{v}");
        let r = get("alice", format!("/runs/{run}/events"))
            .await
            .expect("send");
        assert_eq!(r.status(), 200);
        let events = sse_events(r, Duration::from_secs(10)).await;
        let names: Vec<&str> = events.iter().filter_map(|e| e.event.as_deref()).collect();
        assert_eq!(names.first(), Some(&"started"), "{names:?}");
        assert_eq!(names.last(), Some(&"result"), "{names:?}");
        let printed: String = events
            .iter()
            .filter(|e| e.event.as_deref() == Some("stdout"))
            .filter_map(|e| e.data["text"].as_str())
            .collect();
        assert_eq!(printed, out);
        // the runs' one access rule: someone else's run is not theirs to see
        for path in [format!("/runs/{run}"), format!("/runs/{run}/events")] {
            let r = get("mallory", path).await.expect("send");
            assert_eq!(r.status(), 403);
        }
    }
    // a cancel of the run interrupts the kernel; the state stays
    let r = client()
        .post(format!("{}/sessions/{id}/exec", s.v1()))
        .header("User-Id", "alice")
        .header("accept", "text/event-stream")
        .json(&json!({"code": "import time\nprint('waiting', flush=True)\ntime.sleep(60)"}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let run = r.headers()["x-run-id"].to_str().unwrap().to_owned();
    let watch = tokio::spawn(sse_events(r, Duration::from_secs(20)));
    wait_until_running(&s, KEY, &run).await;
    let c = client()
        .post(format!("{}/runs/{run}/cancel", s.v1()))
        .header("User-Id", "alice")
        .send()
        .await
        .expect("send");
    assert!(c.status().is_success(), "{}", c.status());
    let events = watch.await.expect("join");
    let last = events.last().expect("events");
    assert_eq!(last.event.as_deref(), Some("result"), "{events:?}");
    assert_eq!(
        last.data["error"]["ename"], "KeyboardInterrupt",
        "{}",
        last.data
    );
    assert_eq!(last.data["run_id"], run.as_str());
    let v = get("alice", format!("/runs/{run}"))
        .await
        .expect("send")
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(v["status"], "cancelled", "{v}");
    let v: Value = client()
        .post(format!("{}/sessions/{id}/exec", s.v1()))
        .header("User-Id", "alice")
        .json(&json!({"code": "x"}))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .unwrap();
    assert_eq!(v["result"]["text"], "4499998500000", "the state stays: {v}");
}

/// Waits until the run `id` (of `alice`'s) runs, and a second more (its
/// program is under way).
async fn wait_until_running(s: &TestServer, key: &str, id: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let v: Value = client()
            .get(format!("{}/runs/{id}", s.v1()))
            .header("X-API-Key", key)
            .header("User-Id", "alice")
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
        if v["status"] == "running" {
            tokio::time::sleep(Duration::from_secs(1)).await;
            return;
        }
        assert!(Instant::now() < until, "the evaluation never ran: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client whose every request carries the API key.
struct KeyedClient(reqwest::Client, &'static str);

impl KeyedClient {
    fn get(&self, url: String) -> reqwest::RequestBuilder {
        self.0.get(url).header("X-API-Key", self.1)
    }

    fn post(&self, url: String) -> reqwest::RequestBuilder {
        self.0.post(url).header("X-API-Key", self.1)
    }
}

/// Mount points of slot filesystems of the server with data dir `data`.
fn slot_mounts(data: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&*data.to_string_lossy()) && m.contains("/slots/"))
        .map(str::to_owned)
        .collect()
}

/// Issue 28: a server with 64 kernel slots mounts at start only its run
/// and warm slots and the few kernel slots kept ready ahead (as many as a
/// server with 4 kernel slots); each kernel opened adds exactly one slot
/// filesystem (a ready one, made again behind it) and closing it removes
/// it.
#[tokio::test]
async fn kernel_slots_are_mounted_only_while_their_kernels_live_or_ready_ahead() {
    let s = sessions_server(|c| {
        c.max_sessions = 64;
        // 64 kernel slots take more uid space than a shared test range
        c.uid_base = 3_300_000_000;
    })
    .await;
    let data = s.data_dir.path().to_owned();
    let at_start = slot_mounts(&data);
    // max_concurrency (8 by default) + warm_jails (2) + the ready kernel slots
    let ahead = 10 + kiln_sandbox::READY_KERNEL_SLOTS;
    assert_eq!(at_start.len(), ahead, "{at_start:?}");
    let wait_for = |n: usize| {
        let data = data.clone();
        async move {
            let t = Instant::now();
            while slot_mounts(&data).len() != n && t.elapsed() < Duration::from_secs(20) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            slot_mounts(&data)
        }
    };
    let a = create(&s, None).await;
    let b = create(&s, None).await;
    exec_ok(&s, &a, "x = 1").await;
    let open = wait_for(at_start.len() + 2).await;
    assert_eq!(open.len(), at_start.len() + 2, "{open:?}");
    assert!(at_start.iter().all(|m| open.contains(m)));
    for (id, left) in [(a, 1), (b, 0)] {
        close(&s, &id).await;
        let now = wait_for(at_start.len() + left).await;
        assert_eq!(now.len(), at_start.len() + left, "{now:?}");
    }
    // the run and warm slots as at start; the ready kernel slots are others now
    let end = slot_mounts(&data);
    assert_eq!(end.len(), at_start.len(), "{end:?}");
    assert!((0..10).all(|i| end.iter().any(|m| m.ends_with(&format!("/slots/{i}")))));
}

/// The tests of kernels started ahead read the process-wide pool counters
/// (`/metrics`): one at a time.
static PARKED_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A sessions server keeping one kernel per language started ahead, on a
/// uid range of its own (those kernels hold slots beyond `max_sessions`).
async fn parked_server(uid_base: u32) -> TestServer {
    sessions_server(|c| {
        c.parked_kernels = 1;
        c.uid_base = uid_base;
    })
    .await
}

/// `(ready, hits, misses)` of the `py` kernels started ahead.
async fn py_pool(s: &TestServer) -> (u64, u64, u64) {
    kernel_pool(s, "py").await
}

/// `(ready, hits, misses)` of `lang`'s kernels started ahead.
async fn kernel_pool(s: &TestServer, lang: &str) -> (u64, u64, u64) {
    let value = async |series: String| metric(s, &series).await as u64;
    (
        value(format!(r#"kiln_kernel_pool_ready{{lang="{lang}"}}"#)).await,
        value(format!(
            r#"kiln_kernel_pool_takes_total{{lang="{lang}",result="hit"}}"#
        ))
        .await,
        value(format!(
            r#"kiln_kernel_pool_takes_total{{lang="{lang}",result="miss"}}"#
        ))
        .await,
    )
}

/// Waits until a `py` kernel is parked ahead.
async fn wait_parked(s: &TestServer) {
    wait_parked_lang(s, "py").await
}

/// Waits until a `lang` kernel is parked ahead.
async fn wait_parked_lang(s: &TestServer, lang: &str) {
    let until = Instant::now() + Duration::from_secs(60);
    while kernel_pool(s, lang).await.0 < 1 {
        assert!(Instant::now() < until, "no {lang} kernel was started ahead");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The host uid the session's kernel runs as, and what its `/mnt/data`
/// holds, as the kernel sees them.
async fn uid_and_files(s: &TestServer, id: &str) -> (u64, Value) {
    let v = exec_ok(
        s,
        id,
        "import os, json\n\
         host = int(open('/proc/self/uid_map').read().split()[1])\n\
         print(json.dumps([host + os.getuid(), sorted(os.listdir('/mnt/data'))]))",
    )
    .await;
    let out: Value = serde_json::from_str(v["stdout"].as_str().expect("stdout").trim())
        .unwrap_or_else(|e| panic!("{e}: {v}"));
    (out[0].as_u64().expect("uid"), out[1].clone())
}

/// Issue 28: a create takes a kernel started ahead; the next create's
/// kernel, started ahead while the first session lived, is another slot's
/// (another host uid) with an empty workspace: nothing session 1 wrote is
/// visible to session 2, through the kernel or the files API.
#[tokio::test]
async fn a_create_takes_a_kernel_started_ahead_on_a_fresh_slot_of_its_own() {
    let _one = PARKED_TESTS.lock().await;
    let s = parked_server(3_400_000_000).await;
    wait_parked(&s).await;
    let (_, hits0, misses0) = py_pool(&s).await;
    let first = create(&s, Some("alice")).await;
    assert_eq!(py_pool(&s).await.1, hits0 + 1, "a hit");
    let (uid1, files1) = uid_and_files(&s, &first).await;
    assert_eq!(files1, json!([]), "a fresh workspace");
    exec_ok(
        &s,
        &first,
        "open('/mnt/data/secret.txt', 'w').write('alice')\nsecret = 'alice'",
    )
    .await;
    wait_parked(&s).await;
    close(&s, &first).await;
    let second = create(&s, Some("bob")).await;
    let (_, hits, misses) = py_pool(&s).await;
    assert_eq!((hits, misses), (hits0 + 2, misses0), "two hits, no miss");
    let (uid2, files2) = uid_and_files(&s, &second).await;
    assert_ne!(uid2, uid1, "another slot's uid");
    assert_eq!(files2, json!([]), "session 1's file is not there");
    let v = exec_ok(&s, &second, "print('secret' in globals())").await;
    assert_eq!(v["stdout"], "False\n", "{v}");
    let (status, listed) = call(
        &s,
        reqwest::Method::GET,
        &format!("/sessions/{second}/files"),
        Some("bob"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{listed}");
    assert!(!listed.to_string().contains("secret.txt"), "{listed}");
    close(&s, &second).await;
    s.stop().await.unwrap();
}

/// Issue 28: `js` kernels are started ahead too: a `js` create takes one,
/// and the next `js` session, on a kernel parked after it, sees none of the
/// first one's globals or files.
#[tokio::test]
async fn a_js_create_takes_a_js_kernel_started_ahead_that_holds_nothing_of_the_last() {
    let _one = PARKED_TESTS.lock().await;
    let s = parked_server(3_600_000_000).await;
    wait_parked_lang(&s, "js").await;
    let (_, hits0, misses0) = kernel_pool(&s, "js").await;
    let first = create_lang(&s, Some("alice"), "js").await;
    exec_ok(
        &s,
        &first,
        "require('fs').writeFileSync('/mnt/data/secret.txt', 'alice'); globalThis.secret = 'alice';",
    )
    .await;
    wait_parked_lang(&s, "js").await;
    close(&s, &first).await;
    let second = create_lang(&s, Some("bob"), "js").await;
    let (_, hits, misses) = kernel_pool(&s, "js").await;
    assert_eq!((hits, misses), (hits0 + 2, misses0), "two hits, no miss");
    let v = exec_ok(
        &s,
        &second,
        "console.log(typeof secret, require('fs').existsSync('/mnt/data/secret.txt'))",
    )
    .await;
    assert_eq!(v["stdout"], "undefined false\n", "{v}");
    close(&s, &second).await;
    s.stop().await.unwrap();
}

/// Issue 28: creates that find no kernel started ahead (three at once, one
/// parked) start their own and do not wait for the refill; deleting them
/// and stopping the server leave no process, slot mount or workspace
/// filesystem behind, the kernels still parked included.
#[tokio::test]
async fn creates_finding_none_parked_start_their_own_and_nothing_outlives_the_server() {
    let _one = PARKED_TESTS.lock().await;
    let s = parked_server(3_500_000_000).await;
    wait_parked(&s).await;
    let (_, hits0, misses0) = py_pool(&s).await;
    let creates: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|u| {
            let (v1, u) = (s.v1(), u.to_owned());
            tokio::spawn(async move {
                let r = client()
                    .post(format!("{v1}/sessions"))
                    .header("User-Id", u)
                    .json(&json!({"lang": "py"}))
                    .send()
                    .await
                    .expect("send");
                assert_eq!(r.status().as_u16(), 201);
                r.json::<Value>().await.expect("json")["session_id"]
                    .as_str()
                    .expect("id")
                    .to_owned()
            })
        })
        .collect();
    let mut ids = Vec::new();
    for c in creates {
        ids.push(c.await.expect("create"));
    }
    let (_, hits, misses) = py_pool(&s).await;
    assert_eq!(hits + misses, hits0 + misses0 + 3, "every create counted");
    assert!(misses > misses0, "one kernel parked, three creates at once");
    let mut uids = Vec::new();
    for id in &ids {
        let (uid, files) = uid_and_files(&s, id).await;
        assert_eq!(files, json!([]));
        uids.push(uid);
    }
    uids.sort_unstable();
    uids.dedup();
    assert_eq!(uids.len(), 3, "three slots: {uids:?}");
    for id in &ids {
        close(&s, id).await;
    }
    wait_parked(&s).await;
    assert!(!common::jail_processes_of(&s).is_empty(), "kernels parked");
    let data = s.data_dir.path().to_owned();
    let range = s.uid_range.clone();
    s.stop().await.unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let (procs, mounts) = (common::processes_in(range.clone()), slot_mounts(&data));
        if procs.is_empty() && mounts.is_empty() {
            break;
        }
        assert!(Instant::now() < until, "left behind: {procs:?} {mounts:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
