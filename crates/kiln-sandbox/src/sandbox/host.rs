//! Start-up checks of the host: which missing protection refuses the start
//! and which a degraded sandbox records, and the searchable paths the jail's
//! unprivileged init needs.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::error::SandboxError;
use crate::probe::HostReport;
use crate::quota::WorkspaceQuota;

/// Names of the protections a degraded sandbox can run without.
const WITHOUT_CGROUP: &str = "memory and pids limits (cgroups)";
const WITHOUT_SECCOMP: &str = "seccomp";
const WITHOUT_QUOTA: &str = "workspace quota";

/// Replaces the probe's guess about the workspace quota with what was set
/// up, then decides: every problem refuses the start unless
/// `allow_degraded`, which records what runs without protection.
pub(super) fn settle_report(
    mut report: HostReport,
    quota: &WorkspaceQuota,
    allow_degraded: bool,
) -> Result<HostReport, SandboxError> {
    report
        .problems
        .retain(|p| !p.starts_with("no workspace quota"));
    report
        .warnings
        .retain(|w| !w.starts_with("workspace quota"));
    match quota {
        WorkspaceQuota::LoopExt4 => {}
        WorkspaceQuota::Tmpfs { .. } => report
            .warnings
            .push("workspace quota falls back to tmpfs: workspaces use RAM, not disk".to_owned()),
        WorkspaceQuota::None { reason } => report
            .problems
            .push(format!("no workspace quota: {reason}")),
    }
    report.workspace_quota = quota.clone();
    if report.problems.is_empty() {
        return Ok(report);
    }
    if !allow_degraded || !report.jail_possible() {
        return Err(SandboxError::Unsupported(report.problems.clone()));
    }
    if !report.cgroup_limits {
        report.degraded.push(WITHOUT_CGROUP.to_owned());
    }
    if !report.seccomp {
        report.degraded.push(WITHOUT_SECCOMP.to_owned());
    }
    if matches!(quota, WorkspaceQuota::None { .. }) {
        report.degraded.push(WITHOUT_QUOTA.to_owned());
    }
    Ok(report)
}

/// Fails unless every ancestor of `path` is searchable by others: the jail's
/// init runs as an unprivileged host uid while it resolves bind sources.
pub(super) fn check_searchable(path: &Path) -> Result<(), SandboxError> {
    for dir in path.ancestors().skip(1) {
        let meta = std::fs::metadata(dir).map_err(|e| SandboxError::io("stat", dir, e))?;
        if meta.mode() & 0o001 == 0 {
            return Err(SandboxError::PathNotSearchable {
                path: path.to_path_buf(),
            });
        }
    }
    Ok(())
}

pub(super) fn prepare_root_dir(root: &Path) -> Result<(), SandboxError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(root)
        .map_err(|e| SandboxError::io("create root dir", root, e))?;
    let meta = std::fs::symlink_metadata(root).map_err(|e| SandboxError::io("stat", root, e))?;
    if !meta.is_dir() || meta.uid() != 0 {
        return Err(SandboxError::Config(format!(
            "root_dir {} must be a directory owned by root",
            root.display()
        )));
    }
    if meta.permissions().mode() & 0o001 == 0 {
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| SandboxError::io("chmod", root, e))?;
    }
    check_searchable(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> HostReport {
        HostReport {
            kernel: "6.18".into(),
            root: true,
            user_namespaces: true,
            cgroup: crate::CgroupSupport::None,
            cgroup_limits: false,
            seccomp: true,
            landlock_abi: None,
            workspace_quota: WorkspaceQuota::LoopExt4,
            keep_jails_blocker: None,
            problems: vec!["cgroup: no memory controller in cgroup v1 or v2".into()],
            warnings: vec![],
            degraded: vec![],
        }
    }

    #[test]
    fn a_missing_protection_refuses_the_start_without_the_degraded_flag() {
        let e = settle_report(report(), &WorkspaceQuota::LoopExt4, false).expect_err("refused");
        assert!(matches!(e, SandboxError::Unsupported(p) if p.len() == 1));
    }

    #[test]
    fn the_degraded_flag_records_every_protection_it_waives() {
        let quota = WorkspaceQuota::None {
            reason: "no mounts".into(),
        };
        let r = settle_report(report(), &quota, true).expect("degraded start");
        assert_eq!(r.degraded, vec![WITHOUT_CGROUP, WITHOUT_QUOTA]);
        assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
        assert!(r.to_string().contains("DEGRADED"));
    }

    #[test]
    fn the_degraded_flag_never_waives_namespaces() {
        let mut r = report();
        r.user_namespaces = false;
        r.problems
            .push("cannot create the jail's namespaces: EPERM".into());
        assert!(settle_report(r, &WorkspaceQuota::LoopExt4, true).is_err());
    }

    #[test]
    fn a_tmpfs_quota_is_a_warning_and_a_missing_one_a_problem() {
        let mut ok = report();
        ok.problems.clear();
        ok.cgroup_limits = true;
        let tmpfs = WorkspaceQuota::Tmpfs {
            reason: "no loop".into(),
        };
        let r = settle_report(ok.clone(), &tmpfs, false).expect("tmpfs is enough");
        assert!(
            r.warnings.iter().any(|w| w.contains("tmpfs")),
            "{:?}",
            r.warnings
        );
        assert_eq!(r.workspace_quota, tmpfs);
        let none = WorkspaceQuota::None {
            reason: "off".into(),
        };
        assert!(settle_report(ok, &none, false).is_err());
    }

    #[test]
    fn unsearchable_ancestors_are_reported() {
        let top = tempfile::tempdir().expect("tempdir");
        let inner = top.path().join("ws");
        std::fs::create_dir(&inner).expect("mkdir");
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        assert!(matches!(
            check_searchable(&inner),
            Err(SandboxError::PathNotSearchable { .. })
        ));
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o711))
            .expect("chmod");
        assert!(check_searchable(&inner).is_ok());
    }
}
