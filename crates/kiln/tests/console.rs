//! The operator's web console: its pages over plain HTTP (no secret, a
//! CSP, the key needed for every piece of data, 404 when turned off), and
//! the whole flow in a real browser — headless Chromium driven over
//! WebDriver by chromedriver on loopback: log in, run Python that prints,
//! plots and writes a CSV, watch the output stream in, see the plot and the
//! CSV table and the download links, then find the run in the operations
//! view. Screenshots go to `target/console-screenshots/`.
//!
//! Chromium and chromedriver come from Debian (`scripts/test.sh` installs
//! them). Without them the browser test is skipped locally and fails under
//! `CI`.

mod common;

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

const KEY: &str = "console-test-key-5f1d0c";

async fn keyed_server() -> kiln::testing::TestServer {
    server_with(|c| c.api_key = Some(KEY.into())).await
}

/// `GET path` with the key (which the open routes ignore), as JSON.
async fn admin_json(s: &kiln::testing::TestServer, path: &str) -> Value {
    let r = client()
        .get(format!("{}{path}", s.base_url))
        .header("X-API-Key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{path}");
    r.json().await.unwrap()
}

/// `POST /v1/exec` as user `ops-check`; the run's id.
async fn exec_as_ops(s: &kiln::testing::TestServer, body: Value) -> String {
    let r = client()
        .post(format!("{}/exec", s.v1()))
        .header("X-API-Key", KEY)
        .header("User-Id", "ops-check")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.headers()["x-kiln-run-id"].to_str().unwrap().to_owned()
}

/// The element of the JSON array `list` whose `key` is `id`.
fn row<'a>(list: &'a Value, key: &str, id: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|r| r[key] == id)
        .unwrap_or_else(|| panic!("{key} {id} not listed: {list}"))
}

#[tokio::test]
async fn console_pages_carry_no_secret_set_a_csp_and_need_the_key_for_data() {
    let s = keyed_server().await;
    let http = client();

    // the page and its assets load without a key and hold no secret
    for (path, ty) in [
        ("/console/", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/app.css", "text/css"),
        ("/console/editor.js", "text/javascript"),
        ("/console/favicon.svg", "image/svg+xml"),
        ("/console/api", "text/html"),
        ("/console/api.js", "text/javascript"),
        ("/console/api.css", "text/css"),
        ("/console/swagger-ui.js", "text/javascript"),
        ("/console/swagger-ui.css", "text/css"),
    ] {
        let r = http
            .get(format!("{}{path}", s.base_url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let h = r.headers().clone();
        assert!(
            h["content-type"].to_str().unwrap().starts_with(ty),
            "{path}: {:?}",
            h["content-type"]
        );
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
        assert!(csp.contains("frame-ancestors 'none'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"));
        assert_eq!(h["x-content-type-options"], "nosniff");
        if path == "/console/" {
            assert!(csp.contains("style-src 'self' 'nonce-"), "{csp}");
        }
        let body = r.text().await.unwrap();
        assert!(!body.contains(KEY), "{path} carries the key");
    }
    let r = http
        .get(format!("{}/console", s.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.url().path(), "/console/", "redirected to the slash form");
    // the server's address leads to the console
    let r = http.get(format!("{}/", s.base_url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.url().path(),
        "/console/",
        "GET / redirects to the console"
    );
    let r = http
        .get(format!("{}/console/nothing.js", s.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // its data needs the key
    for path in [
        "/v1/admin/status",
        "/v1/admin/runs",
        "/v1/admin/runs/V1StGXR8_Z5jdHi6B-myT",
        "/v1/admin/runs/V1StGXR8_Z5jdHi6B-myT/files/V1StGXR8_Z5jdHi6B-myT",
        "/v1/admin/kernels",
    ] {
        let r = http
            .get(format!("{}{path}", s.base_url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{path} without a key");
        let r = http
            .get(format!("{}{path}", s.base_url))
            .header("X-API-Key", "wrong")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{path} with a wrong key");
    }
    let st: Value = admin_json(&s, "/v1/admin/status").await;
    assert_eq!(st["auth"], "api-key");
    assert_eq!(st["languages"].as_array().unwrap().len(), 13);
    assert_eq!(st["sandbox"]["enforceable"], true, "{st}");
    assert!(st["sandbox"]["seccomp"].as_bool().unwrap());
    assert!(st["history"].as_array().is_some_and(|h| !h.is_empty()));
    assert!(st["stored"].is_array());

    // a run shows in the list, with its principal and usage; filters apply
    let run_id = exec_as_ops(&s, json!({"lang": "py", "code": "print(1)"})).await;
    let runs: Value = admin_json(&s, "/v1/admin/runs?lang=py&status=finished").await;
    let mine = row(&runs, "run_id", &run_id);
    assert_eq!(mine["principal"], "local:user:ops-check");
    assert_eq!(mine["exit_code"], 0);
    assert!(mine["usage"]["wall_time_ms"].is_u64());
    let other: Value = admin_json(&s, "/v1/admin/runs?lang=js").await;
    assert!(other.as_array().unwrap().iter().all(|r| r["lang"] == "js"));
    assert!(
        !other.to_string().contains(&run_id),
        "the language filter applies"
    );

    // a run opened whole: its code, output and usage, whoever started it
    let one: Value = admin_json(&s, &format!("/v1/admin/runs/{run_id}")).await;
    assert_eq!(one["code"], "print(1)");
    assert_eq!(one["code_truncated"], false);
    assert_eq!(one["stdout"], "1\n");
    assert_eq!(one["principal"], "local:user:ops-check");
    assert!(one["usage"]["run"]["wall_time_ms"].is_u64(), "{one}");
    assert!(one["run_status"].is_null());
    // its outputs download through the operator's route, whoever owns them;
    // only files the run's result lists
    let writer = "open('/mnt/data/out.txt', 'w').write('made by ops-check')";
    let writer_id = exec_as_ops(&s, json!({"lang": "py", "code": writer})).await;
    let made = admin_json(&s, &format!("/v1/admin/runs/{writer_id}")).await;
    let fid = made["files"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(made["files"][0]["name"], "out.txt", "{made}");
    let r = http
        .get(format!(
            "{}/v1/admin/runs/{writer_id}/files/{fid}",
            s.base_url
        ))
        .header("X-API-Key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "made by ops-check");
    let not_its = format!("/v1/admin/runs/{run_id}/files/{fid}");
    for (path, status) in [
        (not_its.as_str(), 404),
        ("/v1/admin/runs?status=sleeping", 400),
        ("/v1/admin/runs?run_status=ZZ", 400),
        ("/v1/admin/runs/V1StGXR8_Z5jdHi6B-myT", 404),
        ("/v1/admin/runs/not-an-id", 400),
    ] {
        let r = http
            .get(format!("{}{path}", s.base_url))
            .header("X-API-Key", KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status, "{path}");
    }

    // a timeout shows as TO, not as a plain finish, and filters by it
    let slow = "import time\nprint('slow', flush=True)\ntime.sleep(30)";
    let slow_id = exec_as_ops(&s, json!({"lang": "py", "code": slow, "timeout": 1000})).await;
    let timed_out: Value = admin_json(&s, "/v1/admin/runs?run_status=TO").await;
    let slow = row(&timed_out, "run_id", &slow_id);
    assert_eq!(slow["run_status"], "TO");
    assert_eq!(slow["signal"], 9, "{slow}");
    assert!(!timed_out.to_string().contains(&run_id), "only TO runs");
    let ok: Value = admin_json(&s, "/v1/admin/runs?run_status=ok").await;
    assert!(ok.to_string().contains(&run_id) && !ok.to_string().contains(&slow_id));
    let one: Value = admin_json(&s, &format!("/v1/admin/runs/{slow_id}")).await;
    assert_eq!(one["stdout"], "slow\n");
    assert!(
        one["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{one}"
    );

    // every live kernel, any owner's, and the operator closes one
    let r = http
        .post(format!("{}/sessions", s.v1()))
        .header("X-API-Key", KEY)
        .header("User-Id", "k-owner")
        .json(&json!({"lang": "py"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let sid = r.json::<Value>().await.unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let kernels: Value = admin_json(&s, "/v1/admin/kernels").await;
    let k = row(&kernels, "session_id", &sid);
    assert_eq!(k["owner"], "local:user:k-owner");
    assert_eq!(k["lang"], "py");
    assert_eq!(k["busy"], false);
    assert!(k["age_secs"].is_u64());
    assert!(
        k["memory_bytes"].as_u64().is_some_and(|m| m > 1_000_000),
        "a Python kernel holds megabytes: {k}"
    );
    let close = |id: &str| {
        http.delete(format!("{}/v1/admin/kernels/{id}", s.base_url))
            .header("X-API-Key", KEY)
            .send()
    };
    assert_eq!(close("not-an-id").await.unwrap().status(), 400);
    assert_eq!(close(&sid).await.unwrap().status(), 204);
    assert_eq!(close(&sid).await.unwrap().status(), 404, "already closed");
    let r = http
        .get(format!("{}/sessions/{sid}", s.v1()))
        .header("X-API-Key", KEY)
        .header("User-Id", "k-owner")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "the owner's session is gone");
    let r = http
        .delete(format!("{}/v1/admin/kernels/{sid}", s.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "closing needs the key");
    s.stop().await.unwrap();
}

#[tokio::test]
async fn the_console_answers_404_when_turned_off_and_the_api_stays() {
    let s = server_with(|c| {
        c.api_key = Some(KEY.into());
        c.console = false;
    })
    .await;
    let http = client();
    for path in [
        "/console/",
        "/console/app.js",
        "/console",
        "/",
        "/console/api",
    ] {
        let r = http
            .get(format!("{}{path}", s.base_url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }
    let r = http
        .get(format!("{}/v1/admin/status", s.base_url))
        .header("X-API-Key", KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    s.stop().await.unwrap();
}

// ---------- the browser ----------

/// chromedriver on a loopback port, killed on drop.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

/// Chromium and chromedriver, or `None` (a failure under `CI`).
fn browser() -> Option<(PathBuf, PathBuf)> {
    let chromium = find_program(&["chromium", "chromium-browser", "google-chrome"]);
    let driver = find_program(&["chromedriver"]);
    match (chromium, driver) {
        (Some(c), Some(d)) => Some((c, d)),
        _ if std::env::var_os("CI").is_some() => {
            panic!("CI: chromium and chromedriver are required (scripts/test.sh installs them)")
        }
        _ => {
            eprintln!("skipped: chromium or chromedriver not installed");
            None
        }
    }
}

async fn start_driver(driver: &Path) -> Driver {
    let port = StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(driver)
        .arg(format!("--port={port}"))
        .arg("--allowed-ips=127.0.0.1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let d = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let http = client();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = http.get(format!("{}/status", d.url)).send().await
            && r.status().is_success()
        {
            return d;
        }
        assert!(Instant::now() < until, "chromedriver did not come up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn connect(d: &Driver, chromium: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1400", "--no-first-run", "--disable-extensions"],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&d.url)
        .await
        .expect("WebDriver session")
}

/// Polls `script` (a JS expression) until it is truthy; returns its value.
async fn wait_for(c: &Client, what: &str, script: &str, limit: Duration) -> Value {
    let until = Instant::now() + limit;
    let body = format!("return ({script});");
    loop {
        let v = c.execute(&body, vec![]).await.expect("execute");
        let truthy = match &v {
            Value::Null | Value::Bool(false) => false,
            Value::String(s) => !s.is_empty(),
            Value::Number(n) => n.as_f64() != Some(0.0),
            _ => true,
        };
        if truthy {
            return v;
        }
        if Instant::now() >= until {
            let _ = save_screenshot(c, &format!("failed-{}", what.replace(' ', "-"))).await;
            let state = c
                .execute(
                    "return document.getElementById('run-state').textContent + ' | ' + document.getElementById('output').textContent",
                    vec![],
                )
                .await
                .unwrap_or_default();
            panic!("timed out waiting for {what} ({script}); page state: {state}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/console-screenshots")
}

async fn save_screenshot(c: &Client, name: &str) -> PathBuf {
    let png = c.screenshot().await.expect("screenshot");
    let dir = screenshot_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.png"));
    std::fs::write(&path, png).unwrap();
    path
}

/// Opens the console, logs in with the key and waits for the playground
/// and its editor; returns the editor's kind and its input element.
async fn log_in(c: &Client, s: &kiln::testing::TestServer) -> (&'static str, Element) {
    c.goto(&format!("{}/console/", s.base_url)).await.unwrap();
    wait_for(
        c,
        "the log-in form",
        "!document.getElementById('login').hidden",
        Duration::from_secs(10),
    )
    .await;
    save_screenshot(c, "login").await;
    c.find(Locator::Css("#api-key"))
        .await
        .unwrap()
        .send_keys(KEY)
        .await
        .unwrap();
    c.find(Locator::Css("#login-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(
        c,
        "the playground",
        "!document.getElementById('playground').hidden && document.getElementById('lang').options.length",
        Duration::from_secs(10),
    )
    .await;
    let kind = if kiln_api::console::has_editor() {
        wait_for(
            c,
            "CodeMirror",
            // its styles got past the CSP (with the page's nonce)
            "document.querySelector('.cm-editor .cm-content') && getComputedStyle(document.querySelector('.cm-gutters')).display === 'flex'",
            Duration::from_secs(5),
        )
        .await;
        "codemirror"
    } else {
        "textarea"
    };
    let input = if kind == "codemirror" {
        ".cm-content"
    } else {
        "#code"
    };
    (kind, c.find(Locator::Css(input)).await.unwrap())
}

/// Replaces what the editor holds by typing `code`.
async fn set_code(editor: &Element, code: &str) {
    editor.click().await.unwrap();
    editor
        .send_keys(&(fantoccini::key::Key::Control + "a"))
        .await
        .unwrap();
    editor
        .send_keys(&fantoccini::key::Key::Delete.to_string())
        .await
        .unwrap();
    editor.send_keys(code).await.unwrap();
}

/// Runs what the editor holds with Ctrl+Enter and waits until the
/// playground says it is done; returns what it says.
async fn run_keyed(c: &Client, editor: &Element, what: &str) -> String {
    c.execute(
        "document.getElementById('run-state').textContent = ''",
        vec![],
    )
    .await
    .unwrap();
    editor.send_keys(&ctrl_enter()).await.unwrap();
    let state = wait_for(
        c,
        what,
        "document.getElementById('run-state').textContent.startsWith('done') && document.getElementById('run-state').textContent",
        Duration::from_secs(60),
    )
    .await;
    state.as_str().unwrap_or_default().to_owned()
}

/// Writes `name` with `text` in a new directory and chooses it as the
/// playground's input file; the directory lives as long as the result.
async fn choose_file(c: &Client, name: &str, text: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(name);
    std::fs::write(&file, text).unwrap();
    c.find(Locator::Css("#files"))
        .await
        .unwrap()
        .send_keys(file.to_str().unwrap())
        .await
        .unwrap();
    dir
}

/// What the element `css` shows.
async fn element_text(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Sets a `<select>` and tells the page.
async fn choose(c: &Client, id: &str, value: &str) {
    c.execute(
        "const s = document.getElementById(arguments[0]); s.value = arguments[1]; s.dispatchEvent(new Event('change'));",
        vec![json!(id), json!(value)],
    )
    .await
    .unwrap();
}

/// Ctrl+Enter, as the WebDriver sends it.
fn ctrl_enter() -> String {
    fantoccini::key::Key::Control + fantoccini::key::Key::Enter.to_string().as_str()
}

/// Typed into the editor: top-level statements only, so an editor's
/// auto-indent cannot change the program.
const PROGRAM: &str = r#"import time
print("streamed before the pause", flush=True)
time.sleep(2)
print("printed after the pause", flush=True)
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
plt.plot([1, 2, 3, 4], [1, 4, 9, 16])
plt.title("squares")
plt.savefig("/mnt/data/squares.png")
open("/mnt/data/squares.csv", "w").write("n,square\n1,1\n2,4\n3,9\n4,16\n")
"#;

#[tokio::test]
async fn a_browser_logs_in_runs_python_that_prints_plots_and_writes_a_csv_and_sees_it_in_operations()
 {
    let Some((chromium, driver_bin)) = browser() else {
        return;
    };
    let s = keyed_server().await;
    let driver = start_driver(&driver_bin).await;
    let c = connect(&driver, &chromium).await;
    let t0 = Instant::now();

    let (kind, editor) = log_in(&c, &s).await;
    assert_eq!(
        c.execute(
            "return document.getElementById('lang').options.length",
            vec![]
        )
        .await
        .unwrap(),
        13,
        "all 13 languages offered"
    );
    assert_eq!(
        c.execute("return document.getElementById('lang').value", vec![])
            .await
            .unwrap(),
        "py"
    );
    set_code(&editor, PROGRAM).await;
    // what the editor holds (and Run sends) is exactly the program
    let typed = c
        .execute("return window.kilnConsole.code()", vec![])
        .await
        .unwrap();
    assert_eq!(
        typed.as_str().unwrap_or_default().trim_end(),
        PROGRAM.trim_end(),
        "the {kind} editor holds the typed program"
    );

    // run with Ctrl+Enter in the editor (as the Run button says): the
    // program runs, and the editor does not take the keys for a blank line
    let key_in_page = |src: &str| src.contains(KEY);
    editor.send_keys(&ctrl_enter()).await.unwrap();
    let clicked = Instant::now();
    wait_for(
        &c,
        "the first streamed line",
        "document.getElementById('output').textContent.includes('streamed before the pause')",
        Duration::from_secs(30),
    )
    .await;
    let first_line = clicked.elapsed();
    let (output, state) = {
        let v = c
            .execute(
                "return [document.getElementById('output').textContent, document.getElementById('run-state').textContent]",
                vec![],
            )
            .await
            .unwrap();
        (
            v[0].as_str().unwrap().to_owned(),
            v[1].as_str().unwrap().to_owned(),
        )
    };
    assert!(
        !output.contains("printed after the pause") && !state.starts_with("done"),
        "the first line was shown before the run ended: {output:?} / {state:?}"
    );
    assert_eq!(
        c.execute("return document.getElementById('cancel').disabled", vec![])
            .await
            .unwrap(),
        false,
        "cancel is offered while the run goes"
    );
    wait_for(
        &c,
        "the end of the run",
        "document.getElementById('run-state').textContent.startsWith('done')",
        Duration::from_secs(60),
    )
    .await;
    let whole = clicked.elapsed();
    assert_eq!(
        c.execute("return window.kilnConsole.code()", vec![])
            .await
            .unwrap(),
        typed,
        "Ctrl+Enter ran the program and left the editor as it was"
    );

    // the plot inline, the CSV as a table, a download link per file, usage
    wait_for(
        &c,
        "the plot",
        "Array.from(document.querySelectorAll('#outputs img')).some(i => i.complete && i.naturalWidth > 100)",
        Duration::from_secs(20),
    )
    .await;
    let cells = wait_for(
        &c,
        "the CSV table",
        "Array.from(document.querySelectorAll('#outputs table.csv tr')).map(r => Array.from(r.children).map(x => x.textContent).join(','))",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(cells, json!(["n,square", "1,1", "2,4", "3,9", "4,16"]));
    let links = c
        .execute(
            "return Array.from(document.querySelectorAll('#outputs a.download')).map(a => [a.textContent, a.getAttribute('download'), a.href.startsWith('blob:')])",
            vec![],
        )
        .await
        .unwrap();
    let mut links: Vec<Value> = links.as_array().unwrap().clone();
    links.sort_by_key(|l| l[0].as_str().unwrap_or_default().to_owned());
    assert_eq!(
        links,
        [
            json!(["squares.csv", "squares.csv", true]),
            json!(["squares.png", "squares.png", true])
        ]
    );
    let usage = element_text(&c, "#usage").await;
    for label in ["wall", "CPU", "memory peak"] {
        assert!(usage.contains(label), "usage shows {label}: {usage}");
    }
    assert!(!usage.contains("n/a"), "usage is measured: {usage}");
    let shot = save_screenshot(&c, "playground").await;

    // the key is in no URL and not in the page
    assert!(!key_in_page(c.current_url().await.unwrap().as_str()));
    assert!(!key_in_page(&c.source().await.unwrap()));

    // a long run is stopped by Cancel
    set_code(
        &editor,
        "import time\nprint('waiting', flush=True)\ntime.sleep(60)\n",
    )
    .await;
    c.find(Locator::Css("#run"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(
        &c,
        "the long run to start",
        "document.getElementById('output').textContent.includes('waiting')",
        Duration::from_secs(30),
    )
    .await;
    let cancel_clicked = Instant::now();
    c.find(Locator::Css("#cancel"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let ended = wait_for(
        &c,
        "the cancelled run to end",
        "document.getElementById('run-state').textContent.startsWith('done') && document.getElementById('run-state').textContent",
        Duration::from_secs(15),
    )
    .await;
    assert!(
        ended.as_str().unwrap_or_default().contains("SG"),
        "cancelled: {ended}"
    );
    // what the killed run had used is measured too (from its cgroups)
    let usage = element_text(&c, "#usage").await;
    assert!(
        usage.contains("memory peak") && !usage.contains("n/a"),
        "a cancelled run's usage: {usage}"
    );
    let cancel_took = cancel_clicked.elapsed();

    // the operations view lists the run with its principal
    c.goto(&format!("{}/console/#operations", s.base_url))
        .await
        .unwrap();
    wait_for(
        &c,
        "the run in the operations view",
        "Array.from(document.querySelectorAll('#runs-table tbody tr')).some(r => r.textContent.includes('local:user:console') && r.textContent.includes('finished') && r.textContent.includes('py'))",
        Duration::from_secs(15),
    )
    .await;
    let sandbox = element_text(&c, "#sandbox").await;
    assert!(sandbox.contains("enforceable"), "{sandbox}");
    let charts = c
        .execute(
            "return document.querySelectorAll('#charts svg polyline').length",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(charts, 5);
    let stored = element_text(&c, "#stored").await;
    assert!(stored.contains("local:user:console"), "{stored}");
    save_screenshot(&c, "operations").await;

    // why the cancelled run ended shows in its own column (LibreChat's SG)
    let stops = c
        .execute(
            "return Array.from(document.querySelectorAll('#runs-table tbody tr')).map(r => r.children[3].textContent)",
            vec![],
        )
        .await
        .unwrap();
    assert!(
        stops.as_array().unwrap().iter().any(|s| s == "SG"),
        "the cancelled run shows SG: {stops}"
    );
    choose(&c, "runs-stop", "SG").await;
    wait_for(
        &c,
        "the runs stopped by a signal",
        "(() => { const rows = Array.from(document.querySelectorAll('#runs-table tbody tr')); return rows.length === 1 && rows[0].children[3].textContent === 'SG'; })()",
        Duration::from_secs(10),
    )
    .await;
    choose(&c, "runs-stop", "").await;

    // the plotting run opened from the table: code, output, files, usage
    wait_for(
        &c,
        "both runs listed again",
        "document.querySelectorAll('#runs-table tbody tr').length === 2",
        Duration::from_secs(10),
    )
    .await;
    c.execute(
        "Array.from(document.querySelectorAll('#runs-table button.run-open')).pop().click()",
        vec![],
    )
    .await
    .unwrap();
    wait_for(
        &c,
        "the run's detail",
        "!document.getElementById('run-detail').hidden && document.querySelectorAll('#run-detail-files a.download').length === 2",
        Duration::from_secs(15),
    )
    .await;
    let detail = c
        .execute(
            "return ['run-detail-code', 'run-detail-output', 'run-detail-facts', 'run-detail-files'].map(id => document.getElementById(id).textContent)",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        detail[0].as_str().unwrap().trim_end(),
        PROGRAM.trim_end(),
        "the run's code"
    );
    assert!(
        detail[1]
            .as_str()
            .unwrap()
            .contains("streamed before the pause\nprinted after the pause"),
        "{detail}"
    );
    for fact in ["finished", "memory peak", "CPU", "exit0"] {
        assert!(
            detail[2].as_str().unwrap().contains(fact),
            "{fact}: {detail}"
        );
    }
    assert!(
        detail[3].as_str().unwrap().contains("squares.png"),
        "{detail}"
    );
    save_screenshot(&c, "run-detail").await;

    // the status filter narrows the list
    choose(&c, "runs-status", "failed").await;
    wait_for(
        &c,
        "the filtered list",
        "document.getElementById('runs').textContent.includes('no runs kept')",
        Duration::from_secs(10),
    )
    .await;

    eprintln!(
        "console browser test: editor {kind}, first line {:?} after Run, run shown done after {:?}, cancel took {:?}, whole flow {:?}; screenshot {}",
        first_line,
        whole,
        cancel_took,
        t0.elapsed(),
        shot.display()
    );
    c.close().await.unwrap();
    drop(driver);
    s.stop().await.unwrap();
}

/// A keyed server, chromedriver and a browser session on it, or `None`
/// where Chromium is missing (a failure under `CI`).
async fn browse() -> Option<(kiln::testing::TestServer, Driver, Client)> {
    let (chromium, driver_bin) = browser()?;
    let s = keyed_server().await;
    let driver = start_driver(&driver_bin).await;
    let c = connect(&driver, &chromium).await;
    Some((s, driver, c))
}

async fn text_of(c: &Client, id: &str) -> String {
    let v = c
        .execute(
            "return document.getElementById(arguments[0]).textContent",
            vec![json!(id)],
        )
        .await
        .unwrap();
    v.as_str().unwrap_or_default().to_owned()
}

async fn code(c: &Client) -> String {
    let v = c
        .execute("return window.kilnConsole.code()", vec![])
        .await
        .unwrap();
    v.as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_browser_runs_cells_in_a_session_whose_variables_persist_and_closes_its_kernel_from_operations()
 {
    let Some((s, driver, c)) = browse().await else {
        return;
    };
    let (kind, editor) = log_in(&c, &s).await;

    // Python's editor indents a block by four spaces
    if kind == "codemirror" {
        set_code(&editor, "if True:\n").await;
        assert_eq!(code(&c).await, "if True:\n    ", "a 4-space indent");
    }

    // cells in one kernel: a variable set in the first is there in the next
    choose(&c, "mode", "session").await;
    set_code(&editor, "x = 41").await;
    assert_eq!(run_keyed(&c, &editor, "the first cell").await, "done: ok");
    set_code(&editor, "print(x + 1)\nx * 2").await;
    assert_eq!(run_keyed(&c, &editor, "the second cell").await, "done: ok");
    let out = text_of(&c, "output").await;
    assert!(
        out.contains("In [1]:\nIn [2]:\n42\nOut[2]: 82\n"),
        "both cells and the value: {out:?}"
    );
    let state = text_of(&c, "session-state").await;
    assert!(state.contains("(py), 2 cells"), "{state}");
    save_screenshot(&c, "session").await;

    // a chosen file is written into the kernel's workspace
    let _dir = choose_file(&c, "cell-input.txt", "read by a cell\n").await;
    set_code(
        &editor,
        "print(open('/mnt/data/cell-input.txt').read(), end='')",
    )
    .await;
    assert_eq!(
        run_keyed(&c, &editor, "the cell reading a file").await,
        "done: ok"
    );
    let out = text_of(&c, "output").await;
    assert!(out.ends_with("In [3]:\nread by a cell\n"), "{out:?}");

    // the kernel in operations: its owner, language, memory; closed there
    c.execute("location.hash = '#operations'", vec![])
        .await
        .unwrap();
    let row = wait_for(
        &c,
        "the kernel in operations",
        "Array.from(document.querySelectorAll('#kernels-table tbody tr')).map(r => r.textContent).find(t => t.includes('local:user:console'))",
        Duration::from_secs(15),
    )
    .await;
    let row = row.as_str().unwrap_or_default();
    assert!(row.contains("py") && row.contains("MiB"), "{row}");
    save_screenshot(&c, "kernels").await;
    c.find(Locator::Css("#kernels-table button.kernel-close"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(
        &c,
        "the kernel closed",
        "document.getElementById('kernels').textContent.includes('no live kernels')",
        Duration::from_secs(15),
    )
    .await;

    // the playground knows: its next cell starts a new kernel, empty
    c.execute("location.hash = '#playground'", vec![])
        .await
        .unwrap();
    set_code(&editor, "print('x' in globals())").await;
    assert_eq!(
        run_keyed(&c, &editor, "a cell in a new kernel").await,
        "done: ok"
    );
    let out = text_of(&c, "output").await;
    assert!(out.ends_with("In [1]:\nFalse\n"), "{out:?}");

    c.close().await.unwrap();
    drop(driver);
    s.stop().await.unwrap();
}

#[tokio::test]
async fn the_playground_uploads_a_chosen_file_once_clears_it_and_draws_chatty_output_per_frame() {
    let Some((s, driver, c)) = browse().await else {
        return;
    };
    let (_, editor) = log_in(&c, &s).await;
    let _dir = choose_file(&c, "in.txt", "hello from a file\n").await;
    let uploads = "performance.getEntriesByType('resource').filter(e => new URL(e.name).pathname === '/v1/upload').length";

    // two runs read the file; it was uploaded once
    set_code(&editor, "print(open('/mnt/data/in.txt').read(), end='')").await;
    for n in 1..=2 {
        run_keyed(&c, &editor, &format!("run {n} with the file")).await;
        assert_eq!(text_of(&c, "output").await, "hello from a file\n");
    }
    let count = c
        .execute(&format!("return {uploads}"), vec![])
        .await
        .unwrap();
    assert_eq!(count, 1, "the chosen file is uploaded once");
    assert!(text_of(&c, "files-state").await.contains("1 uploaded"));

    // cleared: the next run has no input
    c.find(Locator::Css("#files-clear"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    set_code(
        &editor,
        "import os\nprint('in.txt' in os.listdir('/mnt/data'))",
    )
    .await;
    run_keyed(&c, &editor, "the run without the file").await;
    assert_eq!(text_of(&c, "output").await, "False\n");
    let count = c
        .execute(&format!("return {uploads}"), vec![])
        .await
        .unwrap();
    assert_eq!(count, 1, "nothing uploaded after Clear");

    // a thousand small writes: all shown, in order, in one span (one
    // append per animation frame and stream, not one per event)
    // (a pause every line, so they arrive as many events, not one chunk)
    set_code(
        &editor,
        "import time\nfor i in range(1000): print(i, flush=True); time.sleep(0.001)",
    )
    .await;
    let t0 = Instant::now();
    run_keyed(&c, &editor, "the chatty run").await;
    let took = t0.elapsed();
    eprintln!("chatty output: 1000 lines run and drawn in {took:?}");
    let want: String = (0..1000).map(|i| format!("{i}\n")).collect();
    assert_eq!(text_of(&c, "output").await, want);
    let spans = c
        .execute(
            "return document.getElementById('output').children.length",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(spans, 1, "stdout drawn as one span");

    c.close().await.unwrap();
    drop(driver);
    s.stop().await.unwrap();
}

/// No element of the page reaches past the window's width.
const FITS: &str = "document.documentElement.scrollWidth <= window.innerWidth";

#[tokio::test]
async fn the_console_fits_a_420_px_screen_and_the_api_reference_renders_every_operation() {
    let Some((s, driver, c)) = browse().await else {
        return;
    };
    log_in(&c, &s).await;
    assert!(
        c.execute(
            "return document.querySelector('link[rel=icon]').href.endsWith('/console/favicon.svg')",
            vec![]
        )
        .await
        .unwrap()
        .as_bool()
        .unwrap(),
        "a favicon"
    );

    // at 1280 px every card holds its table
    c.execute("location.hash = '#operations'", vec![])
        .await
        .unwrap();
    wait_for(
        &c,
        "the operations view",
        "document.getElementById('ops-updated').textContent",
        Duration::from_secs(15),
    )
    .await;
    let inside = c
        .execute(
            "const grid = document.querySelector('.cards').getBoundingClientRect(); return Array.from(document.querySelectorAll('.cards article')).every(a => a.getBoundingClientRect().right <= grid.right + 1)",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(inside, true, "every card inside the grid");

    // at 420 px nothing scrolls sideways
    c.set_window_size(420, 900).await.unwrap();
    for page in ["operations", "playground"] {
        c.execute(&format!("location.hash = '#{page}'"), vec![])
            .await
            .unwrap();
        wait_for(
            &c,
            &format!("the {page} at 420 px"),
            &format!("!document.getElementById('{page}').hidden"),
            Duration::from_secs(10),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let fits = c
            .execute(
                &format!(
                    "return [{FITS}, document.documentElement.scrollWidth, window.innerWidth]"
                ),
                vec![],
            )
            .await
            .unwrap();
        save_screenshot(&c, &format!("{page}-420")).await;
        assert_eq!(
            fits[0], true,
            "{page} at 420 px: [fits, scrollWidth, innerWidth] = {fits}"
        );
    }

    // the API reference: Swagger UI under the console's CSP, every operation
    c.set_window_size(1280, 1400).await.unwrap();
    let doc = admin_json(&s, "/openapi.json").await;
    let operations = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|p| p.as_object().unwrap().keys())
        .filter(|m| {
            ["get", "post", "put", "delete", "patch", "head", "options"].contains(&m.as_str())
        })
        .count();
    c.goto(&format!("{}{}", s.base_url, kiln_api::console::API_PATH))
        .await
        .unwrap();
    if kiln_api::console::has_api_reference() {
        let shown = wait_for(
            &c,
            "the API reference",
            "document.querySelectorAll('.opblock').length",
            Duration::from_secs(20),
        )
        .await;
        assert_eq!(
            shown, operations,
            "one block per operation of /openapi.json"
        );
        let title = element_text(&c, ".info .title").await;
        assert!(title.contains("Kiln"), "{title}");
        let violations = c
            .execute("return window.kilnApiDoc.violations", vec![])
            .await
            .unwrap();
        assert_eq!(violations, json!([]), "nothing refused by the CSP");
        save_screenshot(&c, "api").await;
    } else {
        wait_for(
            &c,
            "the page saying the reference was not built",
            "!document.getElementById('api-missing').hidden",
            Duration::from_secs(10),
        )
        .await;
    }

    c.close().await.unwrap();
    drop(driver);
    s.stop().await.unwrap();
}
