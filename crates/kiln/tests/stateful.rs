//! LibreChat's stateful profile on a real server: what persists between
//! the calls of one runtime session.

mod common;

use common::{client, server_with};
use kiln::testing::TestServer;
use serde_json::{Value, json};

const HINT: &str = "v2:user:kernels";

async fn stateful(s: &TestServer, user: &str, code: &str) -> Value {
    let r = client()
        .post(format!("{}/exec", s.v1()))
        .header("X-CodeAPI-Expected-Profile", "stateful")
        .json(&json!({"lang": "py", "code": code, "user_id": user, "runtime_session_hint": HINT}))
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
