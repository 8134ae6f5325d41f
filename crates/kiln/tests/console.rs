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
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

const KEY: &str = "console-test-key-5f1d0c";

async fn keyed_server() -> kiln::testing::TestServer {
    server_with(|c| c.api_key = Some(KEY.into())).await
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
    let r = http
        .get(format!("{}/console/nothing.js", s.base_url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);

    // its data needs the key
    for path in ["/v1/admin/status", "/v1/admin/runs"] {
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
    let get = |path: String| {
        http.get(format!("{}{path}", s.base_url))
            .header("X-API-Key", KEY)
            .send()
    };
    let st: Value = get("/v1/admin/status".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(st["auth"], "api-key");
    assert_eq!(st["languages"].as_array().unwrap().len(), 13);
    assert_eq!(st["sandbox"]["enforceable"], true, "{st}");
    assert!(st["sandbox"]["seccomp"].as_bool().unwrap());
    assert!(st["history"].as_array().is_some_and(|h| !h.is_empty()));
    assert!(st["stored"].is_array());

    // a run shows in the list, with its principal and usage; filters apply
    let r = http
        .post(format!("{}/exec", s.v1()))
        .header("X-API-Key", KEY)
        .header("User-Id", "ops-check")
        .json(&json!({"lang": "py", "code": "print(1)"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let run_id = r.headers()["x-kiln-run-id"].to_str().unwrap().to_owned();
    let runs: Value = get("/v1/admin/runs?lang=py&status=finished".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mine = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["run_id"] == run_id.as_str())
        .unwrap_or_else(|| panic!("run {run_id} not listed: {runs}"));
    assert_eq!(mine["principal"], "local:user:ops-check");
    assert_eq!(mine["exit_code"], 0);
    assert!(mine["usage"]["wall_time_ms"].is_u64());
    let other: Value = get("/v1/admin/runs?lang=js".into())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(other.as_array().unwrap().iter().all(|r| r["lang"] == "js"));
    assert!(
        !other.to_string().contains(&run_id),
        "the language filter applies"
    );
    let bad = get("/v1/admin/runs?status=sleeping".into()).await.unwrap();
    assert_eq!(bad.status(), 400);
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
    for path in ["/console/", "/console/app.js", "/console"] {
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

    // the log-in page
    c.goto(&format!("{}/console/", s.base_url)).await.unwrap();
    wait_for(
        &c,
        "the log-in form",
        "!document.getElementById('login').hidden",
        Duration::from_secs(10),
    )
    .await;
    save_screenshot(&c, "login").await;
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

    // the playground, with every language of the server
    let options = wait_for(
        &c,
        "the playground",
        "!document.getElementById('playground').hidden && document.getElementById('lang').options.length",
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(options, 13, "all 13 languages offered");
    assert_eq!(
        c.execute("return document.getElementById('lang').value", vec![])
            .await
            .unwrap(),
        "py"
    );
    let kind = if kiln_api::console::has_editor() {
        wait_for(
            &c,
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
    let editor = c.find(Locator::Css(input)).await.unwrap();
    editor.click().await.unwrap();
    let select_all = fantoccini::key::Key::Control + "a";
    editor.send_keys(&select_all).await.unwrap();
    editor
        .send_keys(&fantoccini::key::Key::Delete.to_string())
        .await
        .unwrap();
    editor.send_keys(PROGRAM).await.unwrap();
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

    // run: the first line arrives while the program still sleeps
    let key_in_page = |src: &str| src.contains(KEY);
    c.find(Locator::Css("#run"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
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
    let usage = c
        .find(Locator::Css("#usage"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for label in ["wall", "CPU", "memory peak"] {
        assert!(usage.contains(label), "usage shows {label}: {usage}");
    }
    assert!(!usage.contains("n/a"), "usage is measured: {usage}");
    let shot = save_screenshot(&c, "playground").await;

    // the key is in no URL and not in the page
    assert!(!key_in_page(c.current_url().await.unwrap().as_str()));
    assert!(!key_in_page(&c.source().await.unwrap()));

    // a long run is stopped by Cancel
    editor.click().await.unwrap();
    editor.send_keys(&select_all).await.unwrap();
    editor
        .send_keys(&fantoccini::key::Key::Delete.to_string())
        .await
        .unwrap();
    editor
        .send_keys("import time\nprint('waiting', flush=True)\ntime.sleep(60)\n")
        .await
        .unwrap();
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
    let sandbox = c
        .find(Locator::Css("#sandbox"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(sandbox.contains("enforceable"), "{sandbox}");
    let charts = c
        .execute(
            "return document.querySelectorAll('#charts svg polyline').length",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(charts, 5);
    let stored = c
        .find(Locator::Css("#stored"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(stored.contains("local:user:console"), "{stored}");
    save_screenshot(&c, "operations").await;

    // the status filter narrows the list
    c.execute(
        "const s = document.getElementById('runs-status'); s.value = 'failed'; s.dispatchEvent(new Event('change'));",
        vec![],
    )
    .await
    .unwrap();
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
