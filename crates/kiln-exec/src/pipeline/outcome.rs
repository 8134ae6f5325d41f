//! Step 5, outcome: what the steps and the harvest amount to — the
//! result's `status` and `message`, the note appended to stderr when Kiln
//! stopped the program, the usage figures — and the end of the run's
//! output stream, so that a watcher's concatenated output equals the
//! result's.

use std::time::Instant;

use kiln_core::outcome::{ExitStatus, RunStatus, signal_name};
use kiln_core::{Language, Nanoid, Usage};
use kiln_sandbox::RunResult;

use super::harvest::Harvest;
use super::step::{StepRun, Steps};
use crate::runs::{RunContext, Stream};
use crate::types::{DeliveryFailure, ExecResult, Truncation};

/// The message of a run cancelled on request.
pub const CANCELLED: &str = "Cancelled";

/// Builds the result of an execution whose steps ran.
pub(crate) fn finish(
    run: &RunContext,
    session_id: Nanoid,
    lang: Language,
    steps: Steps,
    h: Harvest,
    started: Instant,
) -> ExecResult {
    let usage = Usage {
        compile: steps.compile.as_ref().map(StepRun::usage),
        run: steps.run.as_ref().map(StepRun::usage),
    };
    // the step whose output is the result's: the run, or the compile step
    // that failed (then nothing streamed live: its output goes out now)
    let (last, live) = match (steps.run, steps.compile) {
        (Some(r), _) => (r, true),
        (None, Some(c)) => (c, false),
        (None, None) => unreachable!("an execution has at least one step"),
    };
    let compile_failed = !live;
    let (status, mut message) = if last.cancelled {
        (Some(RunStatus::Signal), Some(CANCELLED.to_owned()))
    } else {
        classify(&last.result)
    };
    if compile_failed
        && !last.cancelled
        && let Some(m) = compile_failure_message(&last.result)
    {
        message = Some(m.to_owned());
    }
    let r = &last.result;
    if !live {
        run.output(Stream::Stdout, &r.stdout);
        run.output(Stream::Stderr, &r.stderr);
    }
    let mut stderr = String::from_utf8_lossy(&r.stderr).into_owned();
    let notes = stop_note(r, last.cancelled, status, message.as_deref())
        .into_iter()
        .chain(storage_note(h.truncation.as_ref()));
    for note in notes {
        let mut add = String::new();
        if !stderr.is_empty() && !stderr.ends_with('\n') {
            add.push('\n');
        }
        add.push_str(&note);
        add.push('\n');
        run.output(Stream::Stderr, add.as_bytes());
        stderr.push_str(&add);
    }
    metrics::histogram!("kiln_exec_duration_seconds", "lang" => lang.name())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!("kiln_exec_total", "lang" => lang.name(),
        "status" => status.map(|s| s.code()).unwrap_or("OK"))
    .increment(1);
    let delivery = (h.failed > 0).then(|| DeliveryFailure {
        attempted: h.attempted,
        delivered: h.attempted - h.failed,
        failed: h.failed,
    });
    ExecResult {
        session_id,
        stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
        stderr,
        files: h.files,
        deleted_files: h.deleted,
        truncation: h.truncation,
        delivery,
        exit: r.exit,
        status,
        message,
        wall_time: r.wall_time,
        usage,
        cancelled: last.cancelled,
        evaluation: None,
    }
}

/// Map a sandbox result to the API's `status` and `message`.
pub fn classify(r: &RunResult) -> (Option<RunStatus>, Option<String>) {
    if r.stdout_overflow {
        return (
            Some(RunStatus::StdoutOverflow),
            Some("stdout length exceeded".into()),
        );
    }
    if r.stderr_overflow {
        return (
            Some(RunStatus::StderrOverflow),
            Some("stderr length exceeded".into()),
        );
    }
    if r.timed_out {
        return (Some(RunStatus::Timeout), Some("Time limit exceeded".into()));
    }
    if r.oom_killed {
        return (Some(RunStatus::Signal), Some("Out of memory".into()));
    }
    match r.exit {
        ExitStatus::Code(0) => (None, None),
        ExitStatus::Code(_) => (Some(RunStatus::RuntimeError), None),
        ExitStatus::Signal(24) => (
            Some(RunStatus::Timeout),
            Some("CPU time limit exceeded".into()),
        ),
        ExitStatus::Signal(25) => (
            Some(RunStatus::Signal),
            Some("File size limit exceeded".into()),
        ),
        ExitStatus::Signal(s) => (
            Some(RunStatus::Signal),
            Some(format!("Killed by {}", signal_name(s))),
        ),
    }
}

/// The one-line note appended to stderr when Kiln stopped the run.
fn stop_note(
    r: &RunResult,
    cancelled: bool,
    status: Option<RunStatus>,
    message: Option<&str>,
) -> Option<String> {
    let status = status?;
    let why = match status {
        _ if cancelled => "cancelled".to_owned(),
        RunStatus::Timeout if r.timed_out => {
            format!(
                "time limit of {:.1} s exceeded",
                r.wall_time.as_secs_f64().round()
            )
        }
        RunStatus::RuntimeError => return None,
        _ => message?.to_owned(),
    };
    Some(format!("[kiln] execution stopped: {why}"))
}

/// Tells the program's reader (LibreChat ignores `artifact_truncation`)
/// which outputs a storage budget kept out.
fn storage_note(t: Option<&Truncation>) -> Option<String> {
    let t = t.filter(|t| t.storage > 0)?;
    Some(format!(
        "[kiln] {} output file(s) not kept: the storage budget (this run's output total, \
         your stored files' quota, or the server's free disk) is used up",
        t.storage
    ))
}

/// The `message` of a run whose compile step failed. Output overflows keep
/// their own message (`None`).
fn compile_failure_message(r: &RunResult) -> Option<&'static str> {
    if r.stdout_overflow || r.stderr_overflow {
        None
    } else if r.timed_out || r.exit == ExitStatus::Signal(24) {
        // the compile budget (wall) or RLIMIT_CPU's SIGXCPU
        Some("Compilation time limit exceeded")
    } else if r.oom_killed {
        Some("Out of memory during compilation")
    } else {
        Some("Compilation failed")
    }
}

/// Content type guessed from a file name (outputs, and uploads that declare
/// none).
pub fn content_type(name: &str) -> String {
    mime_guess::from_path(name)
        .first_or_octet_stream()
        .essence_str()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn result(exit: ExitStatus) -> RunResult {
        RunResult {
            exit,
            wall_time: Duration::from_millis(2400),
            ..RunResult::default()
        }
    }

    #[test]
    fn statuses_and_messages() {
        assert_eq!(classify(&result(ExitStatus::Code(0))), (None, None));
        assert_eq!(
            classify(&result(ExitStatus::Code(3))),
            (Some(RunStatus::RuntimeError), None)
        );
        let mut t = result(ExitStatus::Signal(9));
        t.timed_out = true;
        assert_eq!(classify(&t).0, Some(RunStatus::Timeout));
        assert_eq!(
            stop_note(&t, false, Some(RunStatus::Timeout), None).as_deref(),
            Some("[kiln] execution stopped: time limit of 2.0 s exceeded")
        );
        let mut o = result(ExitStatus::Signal(9));
        o.stdout_overflow = true;
        assert_eq!(
            classify(&o),
            (
                Some(RunStatus::StdoutOverflow),
                Some("stdout length exceeded".into())
            )
        );
        assert_eq!(
            classify(&result(ExitStatus::Signal(24))).1.as_deref(),
            Some("CPU time limit exceeded")
        );
        assert_eq!(
            stop_note(
                &result(ExitStatus::Code(1)),
                false,
                Some(RunStatus::RuntimeError),
                None
            ),
            None
        );
        assert_eq!(
            stop_note(
                &result(ExitStatus::Signal(9)),
                true,
                Some(RunStatus::Signal),
                Some(CANCELLED)
            )
            .as_deref(),
            Some("[kiln] execution stopped: cancelled")
        );
    }

    #[test]
    fn compile_failures_say_why() {
        let mut r = result(ExitStatus::Code(1));
        assert_eq!(compile_failure_message(&r), Some("Compilation failed"));
        r.timed_out = true;
        assert_eq!(
            compile_failure_message(&r),
            Some("Compilation time limit exceeded")
        );
        r.stderr_overflow = true;
        assert_eq!(compile_failure_message(&r), None);
    }
}
