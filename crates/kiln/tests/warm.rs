//! Warm runs are indistinguishable from cold ones: the same programs sent to
//! a server with the warm pool and the Python fork-server, and to one that
//! builds a fresh jail and starts a fresh interpreter per run, give the same
//! stdout, stderr, exit code and output files. And a warm run never sees
//! anything of an earlier one.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// (name, lang, code, args)
const CASES: &[(&str, &str, &str, &[&str])] = &[
    ("print", "py", "print('hello')\nprint(1 + 1)", &[]),
    (
        "stderr",
        "py",
        "import sys\nprint('err', file=sys.stderr)\nprint('out')",
        &[],
    ),
    (
        "argv and identity",
        "py",
        "import sys, os\nprint(sys.argv, __name__, __file__, sys.path[0], sys.executable, os.getcwd(), os.getuid())",
        &["--flag", "a b"],
    ),
    (
        // in order: os.environ's, and the C library's as a child inherits it
        "environment",
        "py",
        "import os, subprocess\nprint(list(os.environ.items()))\n\
         print(subprocess.run(['/usr/bin/env'], capture_output=True, text=True).stdout)",
        &[],
    ),
    (
        "exception in a function",
        "py",
        "def f(x):\n    return 1 / x\n\nf(0)",
        &[],
    ),
    (
        "chained exception",
        "py",
        "try:\n    {}['k']\nexcept KeyError as e:\n    raise ValueError('bad') from e",
        &[],
    ),
    ("syntax error", "py", "print('x'\n", &[]),
    ("indentation error", "py", "if True:\nprint(1)", &[]),
    ("exit none", "py", "import sys\nprint('a')\nsys.exit()", &[]),
    ("exit 3", "py", "import sys\nsys.exit(3)", &[]),
    (
        "exit message",
        "py",
        "import sys\nsys.exit('fatal: no')",
        &[],
    ),
    ("exit object", "py", "raise SystemExit([1, 2])", &[]),
    (
        "os._exit",
        "py",
        "import os\nprint('x', flush=True)\nos._exit(5)",
        &[],
    ),
    ("keyboard interrupt", "py", "raise KeyboardInterrupt", &[]),
    (
        "thread outlives main",
        "py",
        "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\nprint('main')",
        &[],
    ),
    (
        "atexit",
        "py",
        "import atexit\natexit.register(print, 'bye')\nprint('hi')",
        &[],
    ),
    (
        "pickle a class from main",
        "py",
        "import pickle\nclass P:\n    x = 1\nprint(type(pickle.loads(pickle.dumps(P()))).__module__)",
        &[],
    ),
    (
        "multiprocessing",
        "py",
        "import multiprocessing as mp\nif __name__ == '__main__':\n    with mp.Pool(2) as p:\n        print(p.map(abs, [-1, -2, -3]))",
        &[],
    ),
    (
        "subprocess of sys.executable",
        "py",
        "import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', 'import sys; print(sys.argv)'], capture_output=True, text=True).stdout)",
        &[],
    ),
    (
        "files out",
        "py",
        "with open('out.csv', 'w') as f:\n    f.write('a,b\\n1,2\\n')\nprint(open('out.csv').read())",
        &[],
    ),
    (
        "pandas and a plot",
        "py",
        "import pandas as pd\nimport matplotlib.pyplot as plt\ndf = pd.DataFrame({'x': [1, 2, 3], 'y': [3, 1, 2]})\nprint(df.describe().loc['mean'].to_dict())\ndf.plot(x='x', y='y')\nplt.show()",
        &[],
    ),
    (
        "input is eof",
        "py",
        "try:\n    input()\nexcept EOFError:\n    print('eof')",
        &[],
    ),
    ("js print", "js", "console.log('hello', 1 + 1)", &[]),
    (
        "js main module and argv",
        "js",
        "console.log(require.main === module, process.argv.slice(1), __filename, process.cwd())",
        &["x y"],
    ),
    (
        "js environment",
        "js",
        "console.log(Object.keys(process.env).sort().join(','))",
        &[],
    ),
    (
        "js exit code",
        "js",
        "console.log('a'); process.exit(3)",
        &[],
    ),
    (
        "js stdin is eof",
        "js",
        "process.stdin.on('data', d => console.log('data', d.length)).on('end', () => console.log('end'))",
        &[],
    ),
];

fn outcome(v: &Value) -> Value {
    let mut files: Vec<String> = v["files"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    json!({
        "stdout": v["stdout"],
        "stderr": v["stderr"],
        "code": v["code"],
        "status": v["status"],
        "files": files,
    })
}

async fn warm_server() -> kiln::testing::TestServer {
    let s = server().await;
    assert!(
        s.wait_warm("py", Duration::from_secs(90)).await,
        "the fork-server must be up (libpython and the data stack are installed by scripts/install-runtimes.sh)"
    );
    s
}

#[tokio::test]
async fn warm_and_cold_runs_give_identical_results() {
    let warm = warm_server().await;
    let cold = server_with(|c| c.warm_jails = 0).await;
    assert!(cold.warm.is_none());
    let mut differences = Vec::new();
    for (name, lang, code, args) in CASES {
        let body = json!({"lang": lang, "code": code, "args": args});
        let (ws, w) = exec_raw(&warm, body.clone()).await;
        let (cs, c) = exec_raw(&cold, body).await;
        assert_eq!((ws, cs), (200, 200), "{name}: {w} / {c}");
        let (w, c) = (outcome(&w), outcome(&c));
        if w != c {
            differences.push(format!("{name}:\n  warm {w}\n  cold {c}"));
        }
    }
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    let stats = warm.warm.as_ref().expect("pool").stats();
    let py = &stats["py"];
    assert!(
        py.hits + py.misses >= 20,
        "py ran in embedded jails: {py:?}"
    );
    let js = &stats["js"];
    assert!(
        js.hits + js.misses >= 5,
        "js ran in pre-started jails: {js:?}"
    );
}

#[tokio::test]
async fn a_warm_run_sees_nothing_of_an_earlier_one() {
    let s = warm_server().await;
    let first = exec(
        &s,
        json!({"lang": "py", "code": "import numpy, os\nnumpy.kiln_marker = 1\nglobals()['leak'] = 2\nos.environ['LEAK'] = '3'\nopen('/tmp/leak', 'w').write('4')\nprint(os.getpid())"}),
    )
    .await;
    assert_eq!(first["stdout"], "2\n");
    for _ in 0..3 {
        let r = exec(
            &s,
            json!({"lang": "py", "code": "import numpy, os\nprint(hasattr(numpy, 'kiln_marker'), 'leak' in globals(), os.environ.get('LEAK'), os.path.exists('/tmp/leak'), sorted(os.listdir('.')))"}),
        )
        .await;
        assert_eq!(r["stdout"], "False False None False ['main.py']\n", "{r}");
    }
    let js = exec(
        &s,
        json!({"lang": "js", "code": "globalThis.leak = 1; console.log(typeof leak)"}),
    )
    .await;
    assert_eq!(js["stdout"], "number\n");
    let js = exec(
        &s,
        json!({"lang": "js", "code": "console.log(typeof leak)"}),
    )
    .await;
    assert_eq!(js["stdout"], "undefined\n");
}

#[tokio::test]
async fn warm_py_jails_are_forks_of_the_preloaded_template() {
    let s = warm_server().await;
    // pandas is already imported in the parent: importing it costs nothing
    let r = exec(
        &s,
        json!({"lang": "py", "code": "import sys, time\nt = time.perf_counter()\nimport pandas, matplotlib.pyplot\nprint('pandas' in sys.modules, time.perf_counter() - t < 0.05)"}),
    )
    .await;
    assert_eq!(r["stdout"], "True True\n", "{r}");
}

#[tokio::test]
async fn a_server_without_the_fork_server_still_warms_py_in_generic_jails() {
    let s = server_with(|c| c.python_zygote = false).await;
    assert!(s.wait_warm("exec", Duration::from_secs(30)).await);
    let r = exec(
        &s,
        json!({"lang": "py", "code": "import sys\nprint(sys.argv)"}),
    )
    .await;
    assert_eq!(r["stdout"], "['main.py']\n");
    let stats = s.warm.as_ref().expect("pool").stats();
    assert!(!stats.contains_key("py"));
    assert!(stats["exec"].hits + stats["exec"].misses >= 1, "{stats:?}");
}
