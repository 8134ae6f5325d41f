//! End-to-end: `@librechat/agents`' `cloudflare-sandbox` engine (the sandbox
//! bridge runtime and its coding tools) against a real Kiln server's
//! `/v1/sandbox` face and real jails.
//!
//! Starts a server (auth `api-key,jwt`) and runs `tests/e2e/bridge.e2e.mjs`
//! with `node --test`; skips with a message when the Node project is not
//! installed, unless `CI` is set.

mod common;

use std::time::Duration;

use common::node::{assert_suite_passed, e2e_dir, node_or_skip, run_node_suite};

/// Longest the bridge suite may take.
const SUITE_TIMEOUT: Duration = Duration::from_secs(600);

const KEY: &str = "bridge-e2e-key";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librechat_agents_cloudflare_sandbox_engine_works_against_kiln() {
    let Some(node) = node_or_skip("librechat_agents_cloudflare_sandbox_engine_works_against_kiln")
    else {
        return;
    };
    let server = common::server_with(|c| {
        c.auth = Some("api-key,jwt".into());
        c.api_key = Some(KEY.into());
        c.jwt_hs256_secret = Some(common::JWT_SECRET.into());
    })
    .await;
    let base = server.base_url.clone();
    let token = common::codeapi_token("carol");
    let (status, output) = run_node_suite(
        &node,
        &e2e_dir(),
        &["bridge.e2e.mjs"],
        &[
            ("KILN_BASE", base.as_str()),
            ("KILN_API_KEY", KEY),
            ("KILN_TOKEN", token.as_str()),
        ],
        SUITE_TIMEOUT,
    )
    .await;
    eprintln!("{output}");
    server.stop().await.expect("stop kiln test server");
    assert_suite_passed(status, &output, SUITE_TIMEOUT);
}
