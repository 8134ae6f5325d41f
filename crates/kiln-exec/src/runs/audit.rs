//! The audit log: one structured record per ended run — who ran what, in
//! which language, how it ended, what it used, which files went in and
//! came out — handed to an [`AuditSink`] when the run ends. The binary
//! chooses the sink (`audit_log`): the `kiln::audit` tracing target (the
//! server's log on stderr), an append-only JSON-lines file, or none.

use std::fmt::Debug;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::{Phase, Record};
use crate::types::{ExecError, ExecResult};

/// The tracing target [`TracingAudit`] writes to.
pub const AUDIT_TARGET: &str = "kiln::audit";

/// A file that went into or came out of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditFile {
    /// Path below `/mnt/data`.
    pub name: String,
    pub bytes: u64,
}

/// What one step used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditUsage {
    pub wall_ms: u64,
    pub cpu_ms: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
}

/// One ended run, or one evaluation of a live kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditRecord {
    /// The kind of record (a stable field to route on): `run`, or
    /// `evaluation` (a run that evaluated code in a session's kernel, see
    /// [`crate::eval`]).
    pub event: &'static str,
    pub run_id: String,
    /// `evaluation`: the session whose kernel evaluated it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// `x-request-id` of the request that started the run.
    pub request_id: Option<String>,
    pub tenant: String,
    pub user_id: String,
    /// False when no identity source named the caller (`anonymous`).
    pub identified: bool,
    pub lang: &'static str,
    /// `finished`, `failed` or `cancelled`.
    pub status: &'static str,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Why Kiln stopped the program (`RE`, `SG`, `TO`, `OL`, `EL`), if it did.
    pub run_status: Option<&'static str>,
    /// For `failed`: why the run ended without a result.
    pub error: Option<String>,
    /// Unix milliseconds.
    pub created_at_ms: u64,
    pub finished_at_ms: u64,
    pub compile: Option<AuditUsage>,
    pub run: Option<AuditUsage>,
    pub files_in: Vec<AuditFile>,
    pub files_out: Vec<AuditFile>,
}

/// Where audit records go.
pub trait AuditSink: Send + Sync + Debug + 'static {
    fn record(&self, r: &AuditRecord);
}

/// Writes each record as one JSON string field `audit` of an event on the
/// [`AUDIT_TARGET`] target (the server's log, JSON or text).
#[derive(Debug, Default)]
pub struct TracingAudit;

impl AuditSink for TracingAudit {
    fn record(&self, r: &AuditRecord) {
        match serde_json::to_string(r) {
            Ok(line) => tracing::info!(target: AUDIT_TARGET, audit = %line, "run audited"),
            Err(e) => {
                tracing::error!(target: AUDIT_TARGET, error = %e, "audit record not serializable")
            }
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, ms)
}

fn usage(s: &kiln_core::StepUsage) -> AuditUsage {
    AuditUsage {
        wall_ms: ms(s.wall),
        cpu_ms: s.cpu.map(ms),
        memory_peak_bytes: s.memory_peak,
    }
}

impl AuditRecord {
    /// The record of `rec`, which ended with `outcome` in `phase`.
    pub(super) fn of(
        rec: &Record,
        phase: Phase,
        outcome: &Result<ExecResult, ExecError>,
    ) -> AuditRecord {
        let files = rec.files();
        let principal = &rec.caller.principal;
        let ok = outcome.as_ref().ok();
        let (exit_code, signal) = match ok.map(|r| r.exit) {
            Some(kiln_core::ExitStatus::Code(c)) => (Some(c), None),
            Some(kiln_core::ExitStatus::Signal(s)) => (None, Some(s)),
            None => (None, None),
        };
        AuditRecord {
            event: if rec.kernel.is_some() {
                "evaluation"
            } else {
                "run"
            },
            run_id: rec.id.as_str().to_owned(),
            session_id: rec.kernel.as_ref().map(|k| k.as_str().to_owned()),
            request_id: rec.request_id.clone(),
            tenant: principal.tenant.clone(),
            user_id: principal.user_id.clone(),
            identified: rec.caller.identified,
            lang: rec.lang,
            status: phase.as_str(),
            exit_code,
            signal,
            run_status: ok.and_then(|r| r.status).map(|s| s.code()),
            // an evaluation's exception is its error too
            error: match outcome {
                Err(e) => Some(e.to_string()),
                Ok(r) => r
                    .evaluation
                    .as_ref()
                    .and_then(|e| e.error.as_ref())
                    .map(|e| format!("{}: {}", e.ename, e.evalue)),
            },
            created_at_ms: unix_ms(rec.created),
            finished_at_ms: unix_ms(rec.times().finished.unwrap_or_else(SystemTime::now)),
            compile: ok.and_then(|r| r.usage.compile.as_ref()).map(usage),
            run: ok.and_then(|r| r.usage.run.as_ref()).map(usage),
            files_in: files.inputs.clone(),
            files_out: files.outputs.clone(),
        }
    }
}
