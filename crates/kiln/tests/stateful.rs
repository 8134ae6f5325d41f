//! LibreChat's stateful profile on a real server: what persists between
//! the calls of one runtime session.

mod common;

use common::{client, server_with};
use kiln::testing::TestServer;
use serde_json::{Value, json};

const HINT: &str = "v2:user:kernels";

async fn stateful(s: &TestServer, user: &str, code: &str) -> Value {
    stateful_body(
        s,
        json!({"lang": "py", "code": code, "user_id": user, "runtime_session_hint": HINT}),
    )
    .await
}

async fn stateful_body(s: &TestServer, body: Value) -> Value {
    let r = client()
        .post(format!("{}/exec", s.v1()))
        .header("X-CodeAPI-Expected-Profile", "stateful")
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    r.json().await.expect("json")
}

fn names(v: &Value) -> Vec<&str> {
    v["files"]
        .as_array()
        .map(|fs| fs.iter().filter_map(|f| f["name"].as_str()).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn files_that_are_not_outputs_persist_in_a_runtime_session_unreported() {
    let s = server_with(|_| {}).await;
    let v = stateful(
        &s,
        "alice",
        "import pickle\npickle.dump({'n': 1}, open('model.pkl', 'wb'))\nopen('state', 'w').write('one')\nopen('table.csv', 'w').write('a\\n')\nprint('saved')",
    )
    .await;
    assert_eq!(v["stdout"], "saved\n", "{v}");
    assert_eq!(v["runtime_status"], "new", "{v}");
    assert_eq!(names(&v), ["table.csv"], "only outputs are reported: {v}");

    let v = stateful(
        &s,
        "alice",
        "import pickle, os\nm = pickle.load(open('model.pkl', 'rb'))\nm['n'] += 1\npickle.dump(m, open('model.pkl', 'wb'))\nprint(m['n'], open('state').read(), sorted(os.listdir('.')))",
    )
    .await;
    assert_eq!(v["runtime_status"], "reused", "{v}");
    assert_eq!(
        v["stdout"], "2 one ['main.py', 'model.pkl', 'state', 'table.csv']\n",
        "the pickle and the extension-less file came back: {v}"
    );
    assert!(names(&v).is_empty(), "nothing new to report: {v}");

    // the changed pickle is the one kept; a deleted file is gone for good
    let v = stateful(
        &s,
        "alice",
        "import pickle, os\nos.remove('state')\nprint(pickle.load(open('model.pkl', 'rb'))['n'])",
    )
    .await;
    assert_eq!(v["stdout"], "2\n", "{v}");
    let v = stateful(&s, "alice", "import os\nprint(os.path.exists('state'))").await;
    assert_eq!(v["stdout"], "False\n", "{v}");

    // another user's runtime session of the same hint sees none of it
    let v = stateful(&s, "bob", "import os\nprint(sorted(os.listdir('.')))").await;
    assert_eq!(v["stdout"], "['main.py']\n", "{v}");
}

#[tokio::test]
async fn without_the_live_setting_each_call_is_a_fresh_process() {
    let s = server_with(|_| {}).await;
    stateful(&s, "alice", "x = 1").await;
    let v = stateful(&s, "alice", "print('x' in globals())").await;
    assert_eq!(v["stdout"], "False\n", "{v}");
}

#[tokio::test]
async fn with_the_live_setting_a_runtime_sessions_calls_share_one_python() {
    let s = server_with(|c| {
        c.runtime_session_live = true;
        c.python_template = "data".into();
        c.warm_jails = 2;
        c.warm_per_runtime = 1;
    })
    .await;
    common::wait_for_profile(&s, "py-data").await;

    let v = stateful(
        &s,
        "alice",
        "import pickle\nx = 41\nopen('note.txt', 'w').write('hi')\npickle.dump(x, open('x.pkl', 'wb'))\nprint('set')",
    )
    .await;
    assert_eq!(v["stdout"], "set\n", "{v}");
    assert_eq!(v["runtime_status"], "new", "{v}");
    assert_eq!(v["code"], 0, "{v}");
    assert_eq!(
        names(&v),
        ["note.txt"],
        "outputs as in a fresh process: {v}"
    );
    let session = v["session_id"].clone();

    let v = stateful(
        &s,
        "alice",
        "import os\nprint(x + 1, open('note.txt').read(), sorted(os.listdir('.')))\nx",
    )
    .await;
    assert_eq!(
        v["stdout"], "42 hi ['main.py', 'note.txt', 'x.pkl']\n",
        "the variables and the files persist; a final value is not shown: {v}"
    );
    assert_eq!(v["runtime_status"], "reused", "{v}");
    assert!(
        names(&v).is_empty(),
        "an unchanged session file is not echoed: {v}"
    );
    assert_eq!(v["session_id"], session, "{v}");

    // an exception: a traceback on stderr and exit code 1, the state kept
    let v = stateful(&s, "alice", "x = 50\nraise ValueError('bad')").await;
    assert_eq!(v["code"], 1, "{v}");
    assert_eq!(v["status"], "RE", "{v}");
    let stderr = v["stderr"].as_str().unwrap_or_default();
    assert!(stderr.contains("ValueError: bad"), "{v}");
    let v = stateful(&s, "alice", "import sys\nprint(x)\nsys.exit(3)").await;
    assert_eq!(
        (v["stdout"].as_str(), v["code"].as_i64()),
        (Some("50\n"), Some(3)),
        "{v}"
    );

    // a timeout interrupts the evaluation and keeps the state
    let v = stateful_body(
        &s,
        json!({"lang": "py", "code": "import time\nwhile True:\n    time.sleep(0.05)", "user_id": "alice",
               "runtime_session_hint": HINT, "timeout": 800}),
    )
    .await;
    assert_eq!(v["status"], "TO", "{v}");
    let v = stateful(&s, "alice", "print(x)").await;
    assert_eq!(v["stdout"], "50\n", "{v}");

    // another user's runtime session of the same hint is another Python
    let v = stateful(&s, "bob", "print('x' in globals())").await;
    assert_eq!(v["stdout"], "False\n", "{v}");
    assert_eq!(v["runtime_status"], "new", "{v}");

    // a kernel lost to its memory limit is replaced at the next call: the
    // files are still there, the variables are not
    let v = stateful(&s, "alice", "big = b'x' * (8 << 30)").await;
    assert_ne!(v["code"], 0, "{v}");
    let v = stateful(
        &s,
        "alice",
        "print('x' in globals(), open('note.txt').read())",
    )
    .await;
    assert_eq!(v["stdout"], "False hi\n", "{v}");
}

#[tokio::test]
async fn a_runtime_session_without_a_free_kernel_runs_in_fresh_processes() {
    let s = server_with(|c| {
        c.runtime_session_live = true;
        c.max_sessions_per_user = 1;
        c.python_template = "data".into();
        c.warm_jails = 2;
        c.warm_per_runtime = 1;
    })
    .await;
    common::wait_for_profile(&s, "py-data").await;
    let live = stateful(&s, "carol", "y = 1").await;
    assert_eq!(live["code"], 0, "{live}");
    let body = |code: &str| json!({"lang": "py", "code": code, "user_id": "carol", "runtime_session_hint": "v2:user:other"});
    // carol's one kernel is the first session's: the second gets none
    let v = stateful_body(&s, body("z = 2\nopen('kept.txt', 'w').write('k')")).await;
    assert_eq!(v["code"], 0, "the call is served anyway: {v}");
    let v = stateful_body(&s, body("print('z' in globals(), open('kept.txt').read())")).await;
    assert_eq!(
        v["stdout"], "False k\n",
        "a fresh process, the files kept: {v}"
    );
    let v = stateful(&s, "carol", "print(y)").await;
    assert_eq!(v["stdout"], "1\n", "the first session is still live: {v}");
}
