//! How a run ends: its cgroups removed (for the statistics), its slot lease
//! released, and what the helper reported mapped to a [`RunResult`].

use std::time::Duration;

use kiln_core::{ExitStatus, Limits};

use crate::cgroup::{CgroupStats, RunCgroups};
use crate::error::SandboxError;
use crate::run::{CpuBudget, KillReason, RunResult, Supervised};
use crate::slots::SlotLease;
use crate::spec::StatusMsg;

/// Ends a run, whatever happened: removes its cgroups (waiting until they
/// are empty, for the statistics), releases the slot lease, and maps what
/// the helper reported to the run's result.
/// The whole jail's CPU budget of a run in `cgroups` (none where the host
/// does not account CPU per group: then RLIMIT_CPU per process is all).
pub(super) fn cpu_budget(cgroups: Option<&RunCgroups>, limits: &Limits) -> Option<CpuBudget> {
    let meter = cgroups?.cpu_meter()?;
    Some(CpuBudget::new(meter, limits.cpu_time))
}

pub(super) async fn conclude(
    name: &str,
    supervised: Result<Supervised, SandboxError>,
    cgroups: Option<RunCgroups>,
    lease: Option<SlotLease>,
) -> Result<RunResult, SandboxError> {
    let waited = std::time::Instant::now();
    let stats = match cgroups {
        Some(c) => c.finish().await,
        None => Ok(CgroupStats::default()),
    };
    let cgroups_us = waited.elapsed().as_micros() as u64;
    drop(lease);
    let s = supervised?;
    tracing::debug!(
        run = %name,
        wall_ms = s.wall_time.as_millis() as u64,
        cgroups_us,
        killed = ?s.killed,
        status = ?s.status,
        "jail finished"
    );
    into_result(s, stats?)
}

/// Maps what the helper reported to a run's result.
fn into_result(s: Supervised, stats: CgroupStats) -> Result<RunResult, SandboxError> {
    let (exit, cpu_time) = match (s.status, s.killed) {
        (_, Some(KillReason::Cancelled)) => {
            return Err(SandboxError::Cancelled(Some(crate::KilledUsage {
                wall_time: s.wall_time,
                cpu_time: stats.cpu,
                memory_peak: stats.memory_peak,
            })));
        }
        (
            Some(StatusMsg::Finished {
                code,
                signal,
                cpu_us,
            }),
            _,
        ) => {
            let exit = match (code, signal) {
                (_, Some(sig)) => ExitStatus::Signal(sig),
                (Some(code), None) => ExitStatus::Code(code),
                (None, None) => ExitStatus::Signal(libc::SIGKILL),
            };
            (exit, Some(Duration::from_micros(cpu_us)))
        }
        (Some(StatusMsg::Error(m)), None) => return Err(SandboxError::Setup(m)),
        (Some(StatusMsg::ExecFailed(m)), None) => return Err(SandboxError::Exec(m)),
        (_, Some(_)) => (ExitStatus::Signal(libc::SIGKILL), None),
        (None | Some(StatusMsg::Parked), None) if stats.oom_kills > 0 => {
            (ExitStatus::Signal(libc::SIGKILL), None)
        }
        (None | Some(StatusMsg::Parked), None) => {
            let tail = String::from_utf8_lossy(&s.stderr.buf);
            let tail: String = tail
                .chars()
                .rev()
                .take(500)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            return Err(SandboxError::Helper(format!(
                "{} (stderr: {})",
                s.helper_exit,
                tail.trim()
            )));
        }
    };
    // the jail used its CPU budget: reported as RLIMIT_CPU's would be
    let exit = match s.killed {
        Some(KillReason::CpuTime) => ExitStatus::Signal(libc::SIGXCPU),
        _ => exit,
    };
    // the run's cgroup sees every process (also those killed with the jail,
    // and a warm `py` program, which is not the init's child); the init's
    // rusage only those it reaped
    let cpu_time = stats.cpu.or(cpu_time);
    Ok(RunResult {
        exit,
        stdout: s.stdout.buf,
        stderr: s.stderr.buf,
        stdout_overflow: s.stdout.overflow,
        stderr_overflow: s.stderr.overflow,
        timed_out: s.killed == Some(KillReason::Timeout),
        oom_killed: stats.oom_kills > 0,
        wall_time: s.wall_time,
        cpu_time,
        memory_peak: stats.memory_peak,
        cpu_throttled: stats.cpu_throttled,
    })
}
