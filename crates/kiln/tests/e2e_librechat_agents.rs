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

use std::time::Duration;

use common::node::{assert_suite_passed, count_after, e2e_dir, node_or_skip, run_node_suite};

/// Longest the whole Node suite may take (cold Python imports included).
const NODE_SUITE_TIMEOUT: Duration = Duration::from_secs(600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librechat_agents_code_tools_work_against_kiln() {
    let Some(node) = node_or_skip("librechat_agents_code_tools_work_against_kiln") else {
        return;
    };
    let dir = e2e_dir();
    let server = common::server().await;
    let kiln_url = server.v1();
    eprintln!(
        "running `{} --test` in {} against {kiln_url}",
        node.display(),
        dir.display()
    );
    let (status, output) = run_node_suite(
        &node,
        &dir,
        &[],
        &[("KILN_URL", kiln_url.as_str())],
        NODE_SUITE_TIMEOUT,
    )
    .await;
    eprintln!("{output}");
    server.stop().await.expect("stop kiln test server");
    assert_suite_passed(status, &output, NODE_SUITE_TIMEOUT);
}

#[test]
fn summary_counts_are_read_from_node_spec_output() {
    let out = "✔ a (1ms)\nℹ tests 5\nℹ suites 1\nℹ pass 4\nℹ fail 1\nℹ skipped 0\n";
    assert_eq!(count_after(out, "ℹ pass "), Some(4));
    assert_eq!(count_after(out, "ℹ fail "), Some(1));
    assert_eq!(count_after("no summary here", "ℹ pass "), None);
}
