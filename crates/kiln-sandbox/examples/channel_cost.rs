//! What a services channel costs a run (BENCHMARKS.md, "Egress channel"):
//! making the jail's network namespace with `lo` up and the listener bound,
//! and a cold jail running `/bin/true` with and without joining it.
//!
//! `cargo run --release -p kiln-sandbox --example channel_cost -- <helper> [runs]`
//! as root, where `<helper>` is a built `kiln` or `kiln-jail` binary.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kiln_core::Limits;
use kiln_sandbox::{JailNetwork, RunRequest, Sandbox, SandboxConfig};
use tokio_util::sync::CancellationToken;

fn stats(mut v: Vec<Duration>) -> String {
    v.sort();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    format!(
        "median {:>7.0} µs  p95 {:>7.0} µs  (n={})",
        at(0.5).as_secs_f64() * 1e6,
        at(0.95).as_secs_f64() * 1e6,
        v.len()
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let helper = PathBuf::from(args.next().expect("usage: channel_cost <helper> [runs]"));
    let runs: usize = args.next().map_or(50, |n| n.parse().expect("runs"));

    let mut create = Vec::new();
    for _ in 0..runs * 4 {
        let t = Instant::now();
        let made = JailNetwork::create(80).expect("network namespace");
        create.push(t.elapsed());
        drop(made);
    }
    println!("JailNetwork::create             {}", stats(create));

    let tmp = std::env::temp_dir().join(format!("kiln-channel-cost-{}", std::process::id()));
    let sb = Sandbox::new(SandboxConfig {
        helper,
        root_dir: tmp.join("root"),
        slots_dir: Some(tmp.join("slots")),
        uid_base: 1_890_000_000,
        slots: 2,
        ..SandboxConfig::default()
    })
    .expect("sandbox");
    let slot = sb.acquire_slot().await;
    let mut plain = Vec::new();
    let mut granted = Vec::new();
    for i in 0..runs * 2 {
        let ws = slot.workspace_parent().join(format!("ws{i}"));
        std::fs::create_dir(&ws).expect("workspace");
        std::os::unix::fs::chown(&ws, Some(slot.host_uid()), Some(slot.host_gid())).expect("chown");
        let with_net = i % 2 == 1;
        let t = Instant::now();
        let network = if with_net {
            let (net, listener) = JailNetwork::create(80).expect("network");
            drop(listener);
            Some(net)
        } else {
            None
        };
        let req = RunRequest {
            workspace: ws.clone(),
            argv: vec!["/bin/true".into()],
            limits: Limits::default(),
            network,
            ..RunRequest::default()
        };
        let r = sb
            .run(&slot, req, CancellationToken::new())
            .await
            .expect("run");
        assert_eq!(r.exit, kiln_core::ExitStatus::Code(0));
        if with_net { &mut granted } else { &mut plain }.push(t.elapsed());
        let _ = std::fs::remove_dir_all(&ws);
    }
    println!("cold /bin/true, no channel      {}", stats(plain));
    println!("cold /bin/true, with a channel  {}", stats(granted));
    drop(slot);
    sb.shutdown();
    let _ = std::fs::remove_dir_all(&tmp);
}
