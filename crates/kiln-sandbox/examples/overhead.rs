//! Measures what a jail costs per run: `/bin/true` through [`Sandbox::run`],
//! back to back and after an idle gap (cgroup v1 attach is slow after idle),
//! plus the start-up of the sandbox itself (slot filesystems included).
//! Needs root. Build and run in release:
//!
//! ```text
//! cargo build --release -p kiln-sandbox --example overhead --bin kiln-jail
//! target/release/examples/overhead [RUNS]
//! ```

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kiln_sandbox::{RunRequest, Sandbox, SandboxConfig};
use tokio_util::sync::CancellationToken;

fn summary(label: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{label:<22} n={:<4} median {:6.2} ms   p90 {:6.2} ms   min {:6.2} ms",
        ms.len(),
        at(0.5),
        at(0.9),
        at(0.0)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runs: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(50);
    let exe = std::env::current_exe()?;
    let helper = exe
        .parent()
        .and_then(|examples| examples.parent())
        .map(|dir| dir.join("kiln-jail"))
        .ok_or("cannot locate kiln-jail next to this example")?;
    let tmp = std::env::temp_dir();
    let started = Instant::now();
    let sb = Sandbox::new(SandboxConfig {
        helper,
        root_dir: tmp.join("kiln-overhead-root"),
        slots_dir: Some(tmp.join("kiln-overhead-slots")),
        uid_base: 1_100_000_000,
        slots: 1,
        ..SandboxConfig::default()
    })?;
    println!(
        "sandbox start-up        {:6.2} ms (1 slot; workspace quota: {})",
        started.elapsed().as_secs_f64() * 1000.0,
        sb.report().workspace_quota
    );
    let slot = sb.acquire_slot().await;
    for (label, gap) in [
        ("back to back", Duration::ZERO),
        ("after 100 ms idle", Duration::from_millis(100)),
    ] {
        let mut ms = Vec::with_capacity(runs);
        for i in 0..runs + 3 {
            let ws: PathBuf = slot.workspace_parent().join(format!("ws-{i}"));
            std::fs::create_dir(&ws)?;
            std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(0o700))?;
            std::os::unix::fs::chown(&ws, Some(slot.host_uid()), Some(slot.host_gid()))?;
            tokio::time::sleep(gap).await;
            let req = RunRequest {
                workspace: ws.clone(),
                argv: vec!["/bin/true".into()],
                ..RunRequest::default()
            };
            let t = Instant::now();
            let r = sb.run(&slot, req, CancellationToken::new()).await?;
            let took = t.elapsed().as_secs_f64() * 1000.0;
            std::fs::remove_dir_all(&ws)?;
            if r.exit != kiln_core::ExitStatus::Code(0) {
                return Err(format!("/bin/true failed: {:?}", r.exit).into());
            }
            // The first runs warm caches.
            if i >= 3 {
                ms.push(took);
            }
        }
        summary(label, ms);
    }
    drop(slot);
    sb.shutdown();
    Ok(())
}
