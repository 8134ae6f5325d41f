//! The Kiln server under test: spawned from the release binary with a fresh
//! data directory on a free loopback port and a clean environment, waited
//! for until `GET /v1/health` answers, stopped with SIGTERM (SIGKILL if it
//! does not exit in time; also killed if the benchmark itself fails).

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::machine::{Rss, rss};

/// How the server is started.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The `kiln` binary.
    pub kiln: PathBuf,
    /// Extra `KEY=VALUE` environment for the server (e.g. `KILN_MAX_CONCURRENCY=4`).
    pub env: Vec<(String, String)>,
    /// How long start-up may take.
    pub startup_timeout: Duration,
    /// How long the server may take to exit after SIGTERM.
    pub stop_timeout: Duration,
}

/// A running server. Dropping it kills the process (the data dir goes with it).
pub struct Server {
    child: Child,
    pid: u32,
    /// `http://127.0.0.1:<port>`.
    pub origin: String,
    /// Holds the data dir and the server log.
    dir: tempfile::TempDir,
}

impl Server {
    /// Start `kiln serve` and wait until it answers `/v1/health`.
    pub async fn start(opts: &ServerOptions, http: &reqwest::Client) -> anyhow::Result<Server> {
        if !opts.kiln.is_file() {
            bail!(
                "kiln binary {} not found (build it with `cargo build --release -p kiln`, or pass --kiln)",
                opts.kiln.display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("kiln-bench-")
            .tempdir()
            .context("create a temporary directory for the server")?;
        let data_dir = dir.path().join("data");
        let log_path = dir.path().join("kiln.log");
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("create server log {}", log_path.display()))?;
        let log_err = log
            .try_clone()
            .with_context(|| format!("reopen server log {}", log_path.display()))?;
        let port = free_port()?;
        let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, port));

        let mut cmd = Command::new(&opts.kiln);
        cmd.arg("serve")
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--data-dir")
            .arg(&data_dir)
            // a clean environment: no API key, config file or KILN_* setting
            // of the invoking shell changes what is measured
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            .kill_on_drop(true);
        // the benchmark measures throughput, not the per-user limits (one
        // benchmark user runs far more often than a person would)
        for class in ["EXEC", "UPLOAD", "DOWNLOAD", "LIST", "DELETE", "CANCEL"] {
            cmd.env(format!("KILN_RATE_{class}"), "off");
        }
        if let Ok(rust_log) = std::env::var("RUST_LOG") {
            cmd.env("RUST_LOG", rust_log);
        }
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawn {} serve", opts.kiln.display()))?;
        let pid = child
            .id()
            .context("the spawned server has no pid (exited at once)")?;
        let origin = format!("http://{listen}");

        let deadline = Instant::now() + opts.startup_timeout;
        let health = format!("{origin}/v1/health");
        loop {
            if let Some(status) = child.try_wait().context("poll the server process")? {
                bail!(
                    "kiln serve exited during start-up ({status}); log:\n{}",
                    log_tail(&log_path)
                );
            }
            match http
                .get(&health)
                .timeout(Duration::from_secs(2))
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => break,
                _ if Instant::now() >= deadline => {
                    bail!(
                        "kiln serve did not answer {health} within {:?}; log:\n{}",
                        opts.startup_timeout,
                        log_tail(&log_path)
                    );
                }
                // start-up polling, outside any measurement
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        Ok(Server {
            child,
            pid,
            origin,
            dir,
        })
    }

    /// The server process's memory now.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn rss(&self) -> Rss {
        rss(self.pid)
    }

    /// Where the server writes its log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("kiln.log")
    }

    /// SIGTERM, wait up to `timeout`, then SIGKILL. Returns how it ended.
    pub async fn stop(mut self, timeout: Duration) -> anyhow::Result<String> {
        let pid = Pid::from_raw(
            i32::try_from(self.pid).with_context(|| format!("pid {} out of range", self.pid))?,
        );
        if self
            .child
            .try_wait()
            .context("poll the server process")?
            .is_some()
        {
            bail!(
                "kiln serve had already exited; log:\n{}",
                log_tail(&self.log_path())
            );
        }
        kill(pid, Signal::SIGTERM).with_context(|| format!("SIGTERM kiln (pid {pid})"))?;
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => {
                let status = status.context("wait for kiln to exit")?;
                Ok(format!("exited after SIGTERM: {status}"))
            }
            Err(_) => {
                self.child.kill().await.context("SIGKILL kiln")?;
                Ok(format!(
                    "did not exit within {timeout:?} of SIGTERM; killed"
                ))
            }
        }
    }
}

/// A port nobody listens on right now (bound and released; the server binds
/// it a moment later).
fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("bind 127.0.0.1:0")?;
    Ok(l.local_addr()
        .context("local address of 127.0.0.1:0")?
        .port())
}

/// The last lines of the server log, for error messages.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_port_is_bindable_again() {
        let p = free_port().unwrap();
        assert_ne!(p, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, p)).unwrap();
    }

    #[test]
    fn log_tail_keeps_the_last_forty_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&p, text).unwrap();
        let tail = log_tail(&p);
        assert!(tail.starts_with("line 60\n"), "{tail}");
        assert!(tail.ends_with("line 99"), "{tail}");
    }

    #[tokio::test]
    async fn a_missing_binary_is_a_clear_error() {
        let opts = ServerOptions {
            kiln: PathBuf::from("/nonexistent/kiln"),
            env: vec![],
            startup_timeout: Duration::from_secs(1),
            stop_timeout: Duration::from_secs(1),
        };
        let err = Server::start(&opts, &{
            crate::install_crypto_provider();
            reqwest::Client::new()
        })
        .await
        .err()
        .unwrap();
        assert!(err.to_string().contains("not found"), "{err:#}");
    }

    #[tokio::test]
    async fn a_server_that_exits_at_once_is_reported_with_its_log() {
        // /bin/false ignores its arguments and exits 1 without listening
        let opts = ServerOptions {
            kiln: PathBuf::from("/bin/false"),
            env: vec![],
            startup_timeout: Duration::from_secs(10),
            stop_timeout: Duration::from_secs(1),
        };
        let err = Server::start(&opts, &{
            crate::install_crypto_provider();
            reqwest::Client::new()
        })
        .await
        .err()
        .unwrap();
        assert!(
            err.to_string().contains("exited during start-up"),
            "{err:#}"
        );
    }
}
