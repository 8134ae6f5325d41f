//! The host's cleanup against the trees a jail can build: a chain of
//! 40,000 nested directories (built bottom-up with renames, so no path is
//! ever long) once made the server abort with a stack overflow while it
//! removed the workspace. On a server with a single slot, the next run must
//! get that slot back, empty, and nothing may be left behind.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::*;

/// Builds a chain `depth` directories deep in the workspace.
fn deep_chain(depth: usize) -> String {
    format!(
        "import os\nos.mkdir('a')\nfor _ in range({depth}):\n    os.mkdir('b')\n    \
         os.rename('a', 'b/a')\n    os.rename('b', 'a')\nprint('built')"
    )
}

/// Entries in the slots' areas (`<data>/slots/<i>/`) besides `lost+found`.
pub fn workspaces_in(data: &Path) -> Vec<String> {
    std::fs::read_dir(data.join("slots"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|a| a.path().is_dir())
        .flat_map(|a| std::fs::read_dir(a.path()).into_iter().flatten().flatten())
        .filter(|e| e.file_name() != "lost+found")
        .map(|e| e.path().display().to_string())
        .collect()
}

#[tokio::test]
async fn a_forty_thousand_level_tree_neither_stops_the_server_nor_keeps_its_slot() {
    let s = common::server_with(|c| {
        c.max_concurrency = 1;
        c.warm_jails = 0;
        c.timeout_secs = 60;
    })
    .await;
    let c = client();
    for round in 0..2 {
        let r = common::exec(
            &s,
            serde_json::json!({"lang": "py", "code": deep_chain(40_000), "user_id": "attacker"}),
        )
        .await;
        assert_eq!(r["stdout"], "built\n", "round {round}: {r}");
        // The only slot must come back: the next run needs it.
        let t = Instant::now();
        let r = common::exec(
            &s,
            serde_json::json!({"lang": "py", "code": "print('after')", "user_id": "other"}),
        )
        .await;
        assert_eq!(r["stdout"], "after\n", "round {round}: {r}");
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "round {round}: the slot came back only after {:?}",
            t.elapsed()
        );
    }
    let health = c
        .get(format!("{}/health", s.v1()))
        .send()
        .await
        .expect("server alive");
    assert_eq!(health.status(), 200);
    let data = s.data_dir.path().to_owned();
    let t = Instant::now();
    while !workspaces_in(&data).is_empty() && t.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(workspaces_in(&data), Vec::<String>::new(), "left behind");
    assert!(common::jail_processes_of(&s).is_empty());
    s.stop().await.expect("graceful stop");
}
