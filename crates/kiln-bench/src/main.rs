//! `kiln-bench`: starts a Kiln release server, runs the selected scenarios
//! against it and against direct runtime spawns on the same machine, prints
//! a markdown report and writes a JSON file for later comparison.

mod baseline;
mod client;
mod density;
mod machine;
mod measure;
mod person;
mod prom;
mod report;
mod scenarios;
mod server;
mod settings;
mod stats;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::client::KilnClient;
use crate::machine::MachineInfo;
use crate::report::{Report, SCHEMA, ServerReport};
use crate::server::{Server, ServerOptions};
use crate::settings::{BareImage, Cli, Scenario, Settings};

#[tokio::main]
async fn main() -> ExitCode {
    let settings = match Settings::resolve(Cli::parse()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kiln-bench: {e:#}");
            return ExitCode::from(2);
        }
    };
    match run(settings).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kiln-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `20260102T030405Z`, for the default output file name.
fn file_stamp(t: OffsetDateTime) -> anyhow::Result<String> {
    let f = time::macros::format_description!("[year][month][day]T[hour][minute][second]Z");
    t.format(&f).context("format the timestamp")
}

async fn run(mut settings: Settings) -> anyhow::Result<ExitCode> {
    let started = OffsetDateTime::now_utc();
    let started_at = started.format(&Rfc3339).context("format the start time")?;
    let out_path = match &settings.out {
        Some(p) => p.clone(),
        None => PathBuf::from("bench-results").join(format!("{}.json", file_stamp(started)?)),
    };
    install_crypto_provider();
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(300))
        .pool_max_idle_per_host(256)
        .build()
        .context("build the HTTP client")?;
    let opts = ServerOptions {
        kiln: settings.kiln.clone(),
        env: settings.server_env(),
        startup_timeout: settings.startup_timeout,
        stop_timeout: Duration::from_secs(60),
    };
    // `--url`: someone else's server (a balancer over several nodes), not started, stopped
    // or weighed here
    let server = match &settings.url {
        Some(_) => None,
        None => Some(Server::start(&opts, &http).await?),
    };
    let origin = match (&server, &settings.url) {
        (Some(s), _) => {
            eprintln!(
                "kiln-bench: {} serving on {} (log {})",
                settings.kiln.display(),
                s.origin,
                s.log_path().display()
            );
            s.origin.clone()
        }
        (None, Some(u)) => {
            eprintln!("kiln-bench: measuring the server at {u}");
            u.clone()
        }
        (None, None) => unreachable!("a server is started unless --url is given"),
    };
    let kiln = KilnClient::new(http, &origin);
    let health = kiln.health().await.ok();
    // a server on a runtime image: the baselines run the image's interpreters, in a chroot of
    // the same image, so both sides run the same Python and Node
    // (each baseline in the image of the language it times: runtime_images may differ)
    let runtime_dir = settings.runtime_dir();
    let image_of = |lang| {
        health
            .as_ref()
            .and_then(|h| BareImage::from_health(h, &runtime_dir, lang))
    };
    settings.bare_python_image = image_of("py");
    settings.bare_node_image = image_of("js");
    for (what, image) in [
        ("python", &settings.bare_python_image),
        ("node", &settings.bare_node_image),
    ] {
        match image {
            Some(i) => eprintln!(
                "kiln-bench: the {what} baselines spawn the interpreter of the server's runtime image {} in a chroot of {}",
                i.id,
                i.root.display()
            ),
            None => eprintln!("kiln-bench: the {what} baselines spawn the host's interpreter"),
        }
    }
    scenarios::check_runtime(&settings.bare_python().host_path(), "python")?;
    if settings.scenarios.contains(&Scenario::E) || settings.scenarios.contains(&Scenario::P) {
        scenarios::check_runtime(&settings.bare_node().host_path(), "node")?;
    }
    let machine = MachineInfo::collect(
        &settings.bare_python(),
        &settings.bare_node(),
        &settings.kiln,
    );
    // let start-up work (probes, the fork-server's preload, the warm pool) settle before reading the idle size;
    // nothing is measured yet
    if server.is_some() {
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    let idle = server.as_ref().map(Server::rss).unwrap_or_default();
    let pool_idle = server
        .as_ref()
        .map(|s| machine::descendants(s.pid()))
        .unwrap_or_default();

    let ctx = scenarios::Ctx {
        settings: &settings,
        kiln: &kiln,
        server_pid: server.as_ref().map(Server::pid),
        template_cpu: Default::default(),
    };
    let all = async {
        let mut reports = Vec::new();
        for &sc in &settings.scenarios {
            eprintln!("kiln-bench: scenario {sc:?}");
            reports.push(scenarios::run(sc, &ctx).await);
        }
        reports
    };
    let reports = tokio::select! {
        r = all => r,
        _ = tokio::signal::ctrl_c() => {
            if let Some(server) = server {
                eprintln!("kiln-bench: interrupted; stopping the server");
                let how = server.stop(opts.stop_timeout).await?;
                eprintln!("kiln-bench: server {how}");
            }
            return Ok(ExitCode::from(130));
        }
    };

    let after = server.as_ref().map(Server::rss).unwrap_or_default();
    // the templates after the run: the rich one's preload may outlast the idle wait, and a
    // fork-server's own memory does not grow with runs (it never runs user code)
    let templates = match kiln.metrics().await {
        Ok(text) => prom::parse_zygote_pids(&text)
            .iter()
            .map(|(t, pid)| machine::template_memory(t, *pid))
            .collect(),
        Err(_) => Vec::new(),
    };
    let phases_total = ctx.phases().await;
    let stopped = match server {
        Some(server) => server.stop(opts.stop_timeout).await,
        None => Ok(format!("at {origin} left running (--url)")),
    };

    let mut notes = vec![
        format!(
            "Measured on {} CPU(s) shared with whatever else runs on the host; concurrent builds or tests make the numbers noisy.",
            machine.nproc
        ),
        "Kiln latency is client-side: HTTP request sent → whole response read, over loopback with a pooled connection; baseline latency is spawn → exit with output read.".into(),
        "Every answer is verified (stdout value, and for B that plot.png is among the outputs; for B2 stdout equal to the baseline's and the heatmap among the outputs); failed requests are excluded from latencies and counted in `verified`.".into(),
        bare_note(
            &settings,
            machine.python.as_deref().unwrap_or("python ?"),
            machine.node.as_deref().unwrap_or("node ?"),
        ),
    ];
    if settings.scenarios.contains(&Scenario::P) {
        notes.push(
            "P opens a new connection for every request (a client that keeps no idle connection), as a chat backend calling between a person's messages does.".into(),
        );
    }
    if settings.scenarios.contains(&Scenario::D) || settings.scenarios.contains(&Scenario::S) {
        notes.push(
            "For orientation only (different hardware and design): seed 004 published 32.8 req/s and p95 496.5 ms for 25 users × 100 verified requests on an i5-14400.".into(),
        );
    }
    match &stopped {
        Ok(how) => notes.push(format!("Server {how}.")),
        Err(e) => notes.push(format!("Stopping the server failed: {e:#}")),
    }
    let report = Report {
        schema: SCHEMA,
        started_at,
        finished_at: OffsetDateTime::now_utc()
            .format(&Rfc3339)
            .context("format the end time")?,
        machine,
        settings: settings.to_json()?,
        server: ServerReport {
            idle,
            after,
            pool_idle,
            templates,
            health,
        },
        scenarios: reports,
        phases_total,
        notes,
    };
    println!("{}", report.markdown());
    report.write_json(&out_path)?;
    eprintln!("kiln-bench: results written to {}", out_path.display());
    Ok(if report.has_failures() || stopped.is_err() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// rustls' ring provider as the process default: in a workspace build,
/// reqwest carries no provider of its own (see Cargo.toml).
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The report's note on where the baselines' interpreters come from: each baseline runs
/// the interpreter of the image the server runs that language's jails from.
fn bare_note(settings: &Settings, python: &str, node: &str) -> String {
    let one = |name: &str, image: Option<&BareImage>| match image {
        Some(i) => format!(
            "{name} from the server's runtime image {} (each spawned process enters a chroot of {} and its working directory there before it executes the interpreter, with no process in between)",
            i.id,
            i.root.display()
        ),
        None => format!(
            "{name} from the host (the server runs those jails on the host's /usr, or its image is not on this machine)"
        ),
    };
    format!(
        "Baselines run the interpreters the server's jails of that language run: {}; {}.",
        one(python, settings.bare_python_image.as_ref()),
        one(node, settings.bare_node_image.as_ref())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_file_names_are_compact_utc_timestamps() {
        let t = time::macros::datetime!(2026-01-02 03:04:05 UTC);
        assert_eq!(file_stamp(t).unwrap(), "20260102T030405Z");
    }
}
