//! Running the long steps of a build or an import: each step's output goes to the image's
//! `build.log`; the terminal gets one line per step and, while it runs, a live status line
//! (elapsed time, packages set up out of how many, the last line of output). On a pipe there
//! is no live line and no escape sequence: the step's start, a heartbeat every 30 s and its end.

use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How often a pipe gets a heartbeat line.
const HEARTBEAT: Duration = Duration::from_secs(30);

pub struct Progress {
    log: File,
    tty: bool,
    total_steps: usize,
    step: usize,
}

/// Counts apt's "Setting up" lines against the "N newly installed" it announces.
#[derive(Default)]
struct AptCount {
    total: Option<u32>,
    done: u32,
}

impl AptCount {
    fn see(&mut self, line: &str) {
        if let Some(n) = line
            .split(" newly installed")
            .next()
            .filter(|_| line.contains(" newly installed"))
            .and_then(|head| head.rsplit(", ").next())
            .and_then(|n| n.trim().split(' ').next())
            .and_then(|n| n.parse().ok())
        {
            self.total = Some(n);
        }
        if line.starts_with("Setting up ") {
            self.done += 1;
        }
    }

    fn describe(&self) -> Option<String> {
        self.total
            .map(|t| format!("{}/{t} packages set up", self.done.min(t)))
    }
}

fn elapsed(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

impl Progress {
    pub fn new(log: File, total_steps: usize) -> Progress {
        Progress {
            log,
            tty: std::io::stderr().is_terminal(),
            total_steps,
            step: 0,
        }
    }

    /// Says something on its own line (and in the log).
    pub fn say(&mut self, text: &str) {
        eprintln!("kiln runtime: {text}");
        let _ = writeln!(self.log, "== {text}");
    }

    /// Starts the next step: its head line, and the live status it shows while it runs.
    fn begin(&mut self, title: &str) -> Live {
        self.step += 1;
        let head = format!("[{}/{}] {title}", self.step, self.total_steps);
        self.say(&head);
        let now = Instant::now();
        Live {
            tty: self.tty,
            head,
            started: now,
            last_beat: now,
        }
    }

    /// Ends a step that `begin` started: the time it took, on the terminal and in the log.
    fn end(&mut self, live: &Live) {
        live.clear();
        let took = elapsed(live.started.elapsed());
        let _ = writeln!(self.log, "== done in {took}");
        eprintln!("kiln runtime:   done in {took}");
    }

    /// Runs `work` in-process as the next step; it reports what it is doing through the
    /// [`Live`] it is given. Fails with `work`'s error.
    pub fn work<T>(
        &mut self,
        title: &str,
        work: impl FnOnce(&mut Live) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let mut live = self.begin(title);
        match work(&mut live) {
            Ok(v) => {
                self.end(&live);
                Ok(v)
            }
            Err(e) => {
                live.clear();
                let _ = writeln!(self.log, "== {title} failed: {e:#}");
                Err(e.context(format!(
                    "{title} failed after {}",
                    elapsed(live.started.elapsed())
                )))
            }
        }
    }

    /// Runs `cmd` as the next step, its stdout and stderr both into the log; fails with the
    /// last lines of its output when it exits non-zero.
    pub fn run(&mut self, title: &str, cmd: &mut Command) -> anyhow::Result<()> {
        let mut live = self.begin(title);
        let (reader, writer) = std::io::pipe().context("pipe")?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(writer.try_clone()?)
            .stderr(writer)
            .spawn()
            .with_context(|| format!("start {:?}", cmd.get_program()))?;
        // drop the parent's copies of the writer (held by `cmd`): EOF comes at the child's exit
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let mut apt = AptCount::default();
        let mut tail: std::collections::VecDeque<String> = Default::default();
        let mut lines = BufReader::new(reader);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            if lines.read_until(b'\n', &mut buf)? == 0 {
                break;
            }
            let line = String::from_utf8_lossy(&buf).trim_end().to_owned();
            let _ = writeln!(self.log, "{line}");
            apt.see(&line);
            if tail.len() == 20 {
                tail.pop_front();
            }
            tail.push_back(line.clone());
            live.show(&apt.describe().unwrap_or_default(), &line);
        }
        let status = child.wait()?;
        if !status.success() {
            live.clear();
            for l in &tail {
                eprintln!("  | {l}");
            }
            bail!(
                "{title} failed ({status}) after {}; the whole output is in the build log",
                elapsed(live.started.elapsed())
            );
        }
        self.end(&live);
        Ok(())
    }
}

/// What a running step shows: on a terminal a live line (elapsed time, its status, the last
/// thing it did), on a pipe a heartbeat line every [`HEARTBEAT`].
pub struct Live {
    tty: bool,
    head: String,
    started: Instant,
    last_beat: Instant,
}

impl Live {
    /// Shows `status` (`12/300 packages set up`, `20.1 MB of 57.5 MB`; may be empty) and
    /// `detail` (the last line of output; the terminal only).
    pub fn show(&mut self, status: &str, detail: &str) {
        let sep = if status.is_empty() { "" } else { ", " };
        if self.tty {
            let short: String = detail.chars().take(60).collect();
            eprint!(
                "\r\x1b[K  {}{sep}{status}: {short}",
                elapsed(self.started.elapsed())
            );
        } else if self.last_beat.elapsed() >= HEARTBEAT {
            self.last_beat = Instant::now();
            eprintln!(
                "kiln runtime:   {} {}{sep}{status}",
                self.head,
                elapsed(self.started.elapsed())
            );
        }
    }

    fn clear(&self) {
        if self.tty {
            eprint!("\r\x1b[K");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apt_count_reads_the_announced_total_and_counts_setups() {
        let mut c = AptCount::default();
        c.see("0 upgraded, 312 newly installed, 0 to remove and 0 not upgraded.");
        c.see("Setting up libc6 (2.41-12) ...");
        c.see("Unpacking foo");
        c.see("Setting up bar (1) ...");
        assert_eq!(c.describe().as_deref(), Some("2/312 packages set up"));
    }

    #[test]
    fn a_failing_step_fails_and_its_output_lands_in_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("build.log");
        let mut p = Progress::new(File::create(&path).unwrap(), 2);
        p.run(
            "ok",
            Command::new("sh").args(["-c", "echo out; echo err >&2"]),
        )
        .unwrap();
        let err = p
            .run("bad", Command::new("sh").args(["-c", "echo dying; exit 3"]))
            .unwrap_err();
        assert!(err.to_string().contains("bad failed"), "{err}");
        let log = std::fs::read_to_string(&path).unwrap();
        for want in ["out", "err", "dying", "[2/2] bad"] {
            assert!(log.contains(want), "{want} missing from {log}");
        }
    }

    #[test]
    fn an_in_process_step_returns_its_value_or_fails_with_its_title_and_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("build.log");
        let mut p = Progress::new(File::create(&path).unwrap(), 2);
        let got = p
            .work("count", |live| {
                live.show("1 of 2", "first");
                Ok(2)
            })
            .unwrap();
        assert_eq!(got, 2);
        let err = p
            .work("verify", |_| -> anyhow::Result<()> {
                bail!("integrity mismatch")
            })
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("verify failed") && msg.contains("integrity mismatch"),
            "{msg}"
        );
        let log = std::fs::read_to_string(&path).unwrap();
        for want in [
            "[1/2] count",
            "== done in",
            "[2/2] verify",
            "verify failed: integrity mismatch",
        ] {
            assert!(log.contains(want), "{want} missing from {log}");
        }
    }
}
