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
        // the process as the kernel shows it: name, command line, initial
        // environment, and `ps`'s view of it
        "process name and command line",
        "py",
        "import os, subprocess\nprint(open('/proc/self/comm').read())\n\
         print(open('/proc/self/cmdline', 'rb').read())\n\
         print(open('/proc/self/environ', 'rb').read())\n\
         print(subprocess.run(['ps', '-o', 'comm=,args=', '-p', str(os.getpid())], capture_output=True, text=True))",
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
        "seaborn and scikit-learn",
        "py",
        "import seaborn as sns\nfrom sklearn.linear_model import LinearRegression\n\
         print(sns.__name__, LinearRegression().fit([[0], [1], [2]], [1, 3, 5]).coef_.round(6).tolist())",
        &[],
    ),
    (
        "input is eof",
        "py",
        "try:\n    input()\nexcept EOFError:\n    print('eof')",
        &[],
    ),
    (
        // how deep a program can recurse, and the limit as sys shows and takes it: the
        // template's frames below main.py are hidden from both
        "recursion limit",
        "py",
        "import sys\nprint(sys.getrecursionlimit())\ndepth = 0\ndef down():\n    global depth\n    depth += 1\n    down()\n\
         try:\n    down()\nexcept RecursionError:\n    print('depth reached', depth)\n\
         sys.setrecursionlimit(60)\nprint(sys.getrecursionlimit())\ndepth = 0\ntry:\n    down()\nexcept RecursionError:\n    print('depth reached', depth)\n\
         def again(n):\n    return again(n + 1)\nagain(0)",
        &[],
    ),
    (
        // site's user base and user site come from the run's HOME, as a cold start
        // computes them
        "user site",
        "py",
        "import site, sys\nprint(site.USER_BASE, site.USER_SITE, site.ENABLE_USER_SITE)\n\
         print(site.getuserbase(), site.getusersitepackages())\nprint(sys.path)",
        &[],
    ),
    (
        // a finalizer at exit writing to both streams, and output left without a newline
        "__del__ at exit and no newline",
        "py",
        "import sys\nclass Resource:\n    def __del__(self):\n        print('released', file=sys.stderr)\n        \
         print('bye from __del__', end='')\nr = Resource()\nsys.stdout.write('end of main, no newline ')",
        &[],
    ),
    (
        // atexit handlers run last registered first; one that raises is reported (through
        // sys.unraisablehook: the default one prints the handler's address) and the others
        // still run
        "atexit order and a failing handler",
        "py",
        "import atexit, sys\ndef hook(u):\n    print('unraisable:', repr(u.exc_value), file=sys.stderr)\n\
         sys.unraisablehook = hook\n@atexit.register\ndef first():\n    print('registered first, runs last')\n\
         @atexit.register\ndef failing():\n    raise RuntimeError('in an atexit handler')\n\
         atexit.register(print, 'registered last, runs first', file=sys.stderr)\nprint('main done')",
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
    warm_server_with("auto").await
}

/// A warm server whose fork-servers hold `template` (`auto`: all four).
async fn warm_server_with(template: &str) -> kiln::testing::TestServer {
    let s = server_with(|c| c.python_template = template.to_owned()).await;
    let profiles: &[&str] = match template {
        "min" => &["py-min"],
        "lean" => &["py-lean"],
        "data" => &["py-data"],
        "rich" => &["py"],
        _ => &["py-min", "py-lean", "py-data", "py"],
    };
    for profile in profiles {
        assert!(
            s.wait_warm(profile, Duration::from_secs(120)).await,
            "the {profile} fork-server must be up (libpython and the data stack are installed by scripts/install-runtimes.sh)"
        );
    }
    s
}

/// Runs every case on `warm` and on `cold`; the differences, if any.
async fn differences(
    warm: &kiln::testing::TestServer,
    cold: &kiln::testing::TestServer,
) -> Vec<String> {
    let mut differences = Vec::new();
    for (name, lang, code, args) in CASES {
        let body = json!({"lang": lang, "code": code, "args": args});
        let (ws, w) = exec_raw(warm, body.clone()).await;
        let (cs, c) = exec_raw(cold, body).await;
        assert_eq!((ws, cs), (200, 200), "{name}: {w} / {c}");
        let (w, c) = (outcome(&w), outcome(&c));
        if w != c {
            differences.push(format!("{name}:\n  warm {w}\n  cold {c}"));
        }
    }
    differences
}

fn py_cases() -> u64 {
    CASES.iter().filter(|c| c.1 == "py").count() as u64
}

#[tokio::test]
async fn warm_and_cold_runs_give_identical_results() {
    let warm = warm_server().await;
    let cold = server_with(|c| c.warm_jails = 0).await;
    assert!(cold.warm.is_none());
    let differences = differences(&warm, &cold).await;
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    let stats = warm.warm.as_ref().expect("pool").stats();
    // each program took the template the scan picks for it, and every one of the four
    // took some
    let py = kiln_core::Language::resolve("py").expect("py");
    for profile in ["py-min", "py-lean", "py-data", "py"] {
        let expected = CASES
            .iter()
            .filter(|c| c.1 == "py" && py.warm_profile_for(c.2) == profile)
            .count() as u64;
        let ran = stats[profile].hits + stats[profile].misses;
        assert_eq!(ran, expected, "{profile}: {stats:?}");
        assert!(ran >= 1, "{profile}: {stats:?}");
    }
    let (min, lean) = (&stats["py-min"], &stats["py-lean"]);
    assert!(min.hits + min.misses >= 5, "{stats:?}");
    assert!(lean.hits + lean.misses >= 5, "{stats:?}");
    let js = &stats["js"];
    assert!(
        js.hits + js.misses >= 5,
        "js ran in pre-started jails: {js:?}"
    );
}

/// A wrong guess costs time, never behaviour: every program, whatever it
/// imports, gives the same result in either template as in a cold run.
#[tokio::test]
async fn every_template_runs_every_case_like_a_cold_run() {
    let cold = server_with(|c| c.warm_jails = 0).await;
    for (template, profile) in [
        ("min", "py-min"),
        ("lean", "py-lean"),
        ("data", "py-data"),
        ("rich", "py"),
    ] {
        let warm = warm_server_with(template).await;
        let differences = differences(&warm, &cold).await;
        assert!(
            differences.is_empty(),
            "{template} template:\n{}",
            differences.join("\n")
        );
        let stats = warm.warm.as_ref().expect("pool").stats();
        let ran = &stats[profile];
        assert_eq!(ran.hits + ran.misses, py_cases(), "{template}: {stats:?}");
        drop(warm);
    }
}

/// With `keep_jails`, a slot's jail takes the slot's next programs (each a
/// fresh fork): every case still gives what a cold run gives, in jails
/// that were in fact reused (two slots, one run at a time, the lean
/// template: the cases alternate between the two slots' kept jails).
#[tokio::test]
async fn kept_jails_run_every_case_like_a_cold_run() {
    let cold = server_with(|c| c.warm_jails = 0).await;
    let kept = server_with(keeping).await;
    // (each case's cold run gives the slot's clean-up and the pool's
    // refill the time to hand the kept jail its next program)
    let differences = differences(&kept, &cold).await;
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    let reused = metric(&kept, r#"kiln_kept_jails_total{result="reused"}"#).await;
    assert!(
        reused >= (py_cases() / 2) as f64,
        "the py cases ran in kept jails: {reused} reused of {}",
        py_cases()
    );
}

/// In mixed traffic a `js` jail is built on a slot without a kept `py`
/// jail, and a `py` park takes a slot holding one: with `py` and `js`
/// runs alternating, each `py` run's next park finds the kept jail a
/// `py` run left (a `js` park that took that slot would have ended it).
#[tokio::test]
async fn a_js_run_between_py_runs_leaves_the_kept_py_jails_in_use() {
    let s = server_with(|c| {
        keeping(c);
        c.max_concurrency = 2;
        c.warm_jails = 3;
    })
    .await;
    let kept = |result: &'static str| {
        let s = &s;
        async move {
            let series = format!("kiln_kept_jails_total{{result=\"{result}\"}}");
            metric(s, &series).await
        }
    };
    let round = |i: u32| {
        let s = &s;
        async move {
            let py = exec(s, json!({"lang": "py", "code": format!("print({i} * 2)")})).await;
            assert_eq!(py["stdout"], format!("{}\n", i * 2), "{py}");
            tokio::time::sleep(Duration::from_millis(300)).await;
            let js = exec(
                s,
                json!({"lang": "js", "code": format!("console.log({i} + 1)")}),
            )
            .await;
            assert_eq!(js["stdout"], format!("{}\n", i + 1), "{js}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    // a first round fills the pool and leaves the first kept py jail
    round(100).await;
    let (reused0, rebuilt0, replaced0) = (
        kept("reused").await,
        kept("rebuilt").await,
        kept("replaced").await,
    );
    let rounds = 8;
    for i in 0..rounds {
        round(i).await;
    }
    let reused = kept("reused").await - reused0;
    let rebuilt = kept("rebuilt").await - rebuilt0;
    let replaced = kept("replaced").await - replaced0;
    // each py run's next park found a kept py jail on its slot (at most
    // one missed as the pool settles); the first kept on a slot ran in
    // groups of its own (the slot's are made by its first clean-up), so
    // it is rebuilt once, the rest are reused
    let found = reused + rebuilt + replaced;
    assert!(
        found >= f64::from(rounds - 1) && reused >= f64::from(rounds / 2),
        "py runs between js runs find kept jails: {reused} reused, {rebuilt} rebuilt, \
         {replaced} replaced in {rounds} rounds"
    );
}

/// Code the import scan cannot see through (an import by a computed name)
/// runs in the min template, which then imports pandas and pyplot itself
/// (and the stdlib modules they import, which the min template does not
/// hold either): slower, but with the same result as a cold run, plt.show()
/// hook included.
#[tokio::test]
async fn a_min_chosen_run_that_imports_pandas_dynamically_still_works() {
    let code = "imp = getattr(__builtins__, '__imp' + 'ort__')\n\
                pd = imp('pandas')\n\
                plt = imp('matplotlib.pyplot', fromlist=['show'])\n\
                df = pd.DataFrame({'x': [1, 2, 3], 'y': [2, 4, 8]})\n\
                print(df['y'].sum())\n\
                df.plot(x='x', y='y')\n\
                plt.show()";
    let py = kiln_core::Language::resolve("py").expect("py");
    assert_eq!(
        py.warm_profile_for(code),
        "py-min",
        "the scan must be fooled"
    );
    let warm = warm_server().await;
    let cold = server_with(|c| c.warm_jails = 0).await;
    let w = exec(&warm, json!({"lang": "py", "code": code})).await;
    let c = exec(&cold, json!({"lang": "py", "code": code})).await;
    assert_eq!(w["stdout"], "14\n", "{w}");
    assert_eq!(outcome(&w), outcome(&c));
    assert_eq!(outcome(&w)["files"], json!(["plot_1.png"]), "{w}");
    let stats = warm.warm.as_ref().expect("pool").stats();
    let min = &stats["py-min"];
    assert_eq!(min.hits + min.misses, 1, "{stats:?}");
}

/// Labels in Chinese, Japanese and Korean are drawn with a CJK font's
/// glyphs (no "Glyph ... missing" warning), and the picture differs from
/// the same text drawn without the fallback (boxes), cold and warm.
#[tokio::test]
async fn plots_draw_chinese_japanese_and_korean_labels_with_real_glyphs() {
    let code = r#"import warnings
import matplotlib.pyplot as plt
from matplotlib import font_manager as fm
warnings.simplefilter("always")

def draw():
    fig, ax = plt.subplots(figsize=(4, 1))
    ax.set_title("中文标题 日本語のラベル 한국어 라벨")
    fig.canvas.draw()
    return bytes(fig.canvas.buffer_rgba())

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    real = draw()
    plt.show()
print("missing glyphs:", [str(w.message) for w in caught if "Glyph" in str(w.message)])
print("cjk font in the fallback list:", any("wqy" in p.lower() or "cjk" in p.lower() for p in fm.fontManager._find_fonts_by_props(fm.FontProperties())))
fm.FontManager._find_fonts_by_props = fm.FontManager._find_fonts_by_props.__wrapped__
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    boxes = draw()
print("without it, glyphs are missing:", any("Glyph" in str(w.message) for w in caught))
print("the real glyphs differ from boxes:", real != boxes)
"#;
    let expected = "missing glyphs: []\ncjk font in the fallback list: True\n\
                    without it, glyphs are missing: True\nthe real glyphs differ from boxes: True\n";
    let warm = warm_server_with("data").await;
    let cold = server_with(|c| c.warm_jails = 0).await;
    for (kind, s) in [("warm", &warm), ("cold", &cold)] {
        let r = exec(s, json!({"lang": "py", "code": code})).await;
        assert_eq!(r["stdout"], expected, "{kind}: {r}");
        assert!(
            !r["stderr"].as_str().unwrap_or("").contains("Glyph"),
            "{kind}: {r}"
        );
        assert_eq!(outcome(&r)["files"], json!(["plot_1.png"]), "{kind}: {r}");
    }
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
