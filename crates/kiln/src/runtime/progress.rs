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

    /// Runs `cmd` as the next step, its stdout and stderr both into the log; fails with the
    /// last lines of its output when it exits non-zero.
    pub fn run(&mut self, title: &str, cmd: &mut Command) -> anyhow::Result<()> {
        self.step += 1;
        let head = format!("[{}/{}] {title}", self.step, self.total_steps);
        self.say(&head);
        let (reader, writer) = std::io::pipe().context("pipe")?;
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(writer.try_clone()?)
            .stderr(writer)
            .spawn()
            .with_context(|| format!("start {:?}", cmd.get_program()))?;
        // drop the parent's copies of the writer (held by `cmd`): EOF comes at the child's exit
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let started = Instant::now();
        let mut last_beat = started;
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
            let status = apt.describe().unwrap_or_default();
            if self.tty {
                let short: String = line.chars().take(60).collect();
                let sep = if status.is_empty() { "" } else { ", " };
                eprint!(
                    "\r\x1b[K  {}{sep}{status}: {short}",
                    elapsed(started.elapsed())
                );
            } else if last_beat.elapsed() >= HEARTBEAT {
                last_beat = Instant::now();
                let sep = if status.is_empty() { "" } else { ", " };
                eprintln!(
                    "kiln runtime:   {} {}{sep}{status}",
                    head,
                    elapsed(started.elapsed())
                );
            }
        }
        let status = child.wait()?;
        if self.tty {
            eprint!("\r\x1b[K");
        }
        let took = elapsed(started.elapsed());
        if !status.success() {
            for l in &tail {
                eprintln!("  | {l}");
            }
            bail!("{title} failed ({status}) after {took}; the whole output is in the build log");
        }
        let _ = writeln!(self.log, "== done in {took}");
        eprintln!("kiln runtime:   done in {took}");
        Ok(())
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
}
