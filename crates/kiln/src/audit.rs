//! Where the audit log goes (`audit_log`): `stderr` — the `kiln::audit`
//! target of the server's log, one event per run with the record as its
//! `audit` field; a file path — one JSON object per line, appended, the
//! file created `0600`; `off` — none. See docs/console.md ("Audit log").

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use kiln_exec::{AuditRecord, AuditSink, TracingAudit};

/// Appends one JSON line per record to a file.
#[derive(Debug)]
pub struct FileAudit {
    path: PathBuf,
    file: Mutex<std::fs::File>,
}

impl FileAudit {
    pub fn open(path: &Path) -> anyhow::Result<FileAudit> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("create audit log dir {}", dir.display()))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("open audit log {}", path.display()))?;
        Ok(FileAudit {
            path: path.to_owned(),
            file: Mutex::new(file),
        })
    }
}

impl AuditSink for FileAudit {
    fn record(&self, r: &AuditRecord) {
        let mut line = match serde_json::to_vec(r) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "audit record not serializable");
                return;
            }
        };
        line.push(b'\n');
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        // one write per line on an O_APPEND file: lines never interleave
        if let Err(e) = f.write_all(&line) {
            tracing::error!(path = %self.path.display(), error = %e, run = %r.run_id,
                "audit log write failed");
        }
    }
}

/// The sink `audit_log` names.
pub fn sink(audit_log: &str) -> anyhow::Result<Option<Arc<dyn AuditSink>>> {
    Ok(match audit_log.trim() {
        "off" | "none" | "" => None,
        "stderr" => Some(Arc::new(TracingAudit)),
        path => Some(Arc::new(FileAudit::open(Path::new(path))?)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(run_id: &str) -> AuditRecord {
        AuditRecord {
            event: "run",
            run_id: run_id.into(),
            session_id: None,
            request_id: Some("req-1".into()),
            tenant: "local".into(),
            user_id: "alice".into(),
            identified: true,
            lang: "py",
            status: "finished",
            exit_code: Some(0),
            signal: None,
            run_status: None,
            error: None,
            created_at_ms: 1,
            finished_at_ms: 2,
            compile: None,
            run: None,
            files_in: vec![],
            files_out: vec![],
        }
    }

    #[test]
    fn a_file_sink_appends_one_json_object_per_line_to_a_private_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs/audit.jsonl");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "{\"earlier\":true}\n").unwrap();
        let sink = sink(path.to_str().unwrap()).unwrap().expect("a sink");
        sink.record(&record("a"));
        sink.record(&record("b"));
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "appended, not truncated: {text}");
        assert_eq!(lines[1]["run_id"], "a");
        assert_eq!(lines[2]["run_id"], "b");
        assert_eq!(lines[2]["request_id"], "req-1");
        let fresh = dir.path().join("new/audit.jsonl");
        sink_mode(&fresh);
    }

    fn sink_mode(path: &Path) {
        use std::os::unix::fs::PermissionsExt as _;
        let s = sink(path.to_str().unwrap()).unwrap().unwrap();
        s.record(&record("c"));
        let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn off_means_no_sink_and_stderr_the_log_target() {
        assert!(sink("off").unwrap().is_none());
        assert!(sink("stderr").unwrap().is_some());
    }
}
