//! A run on a persistent project (see [`crate::projects`]): its working
//! copy is checked out next to the jail's workspace, on the slot's
//! filesystem (the slot's quota bounds what the run writes; releasing the
//! slot removes it), bound at `/workspace` for the run step, and committed
//! back after the run unless it is over the project's budget.

use std::path::{Path, PathBuf};

use kiln_core::Nanoid;

use crate::projects::{ProjectBinding, ProjectError};
use crate::types::{ExecError, ExecResult};

/// Makes the working copy beside `workspace` (owned by the jail's user)
/// and fills it with the project.
pub(crate) async fn check_out(
    binding: &ProjectBinding,
    workspace: &Path,
    owner: (u32, u32),
) -> Result<PathBuf, ExecError> {
    let setup = |e: String| ExecError::SandboxSetup(format!("check out the project: {e}"));
    let parent = workspace
        .parent()
        .ok_or_else(|| setup("the workspace has no parent".to_owned()))?;
    let work = parent.join(format!("project-{}", Nanoid::random()));
    let dir = work.clone();
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o755).create(&dir)?;
        std::os::unix::fs::chown(&dir, Some(owner.0), Some(owner.1))
    })
    .await
    .map_err(|e| setup(e.to_string()))?
    .map_err(|e| setup(e.to_string()))?;
    binding
        .projects
        .check_out(&binding.project, &work, owner)
        .await
        .map_err(|e| setup(e.to_string()))?;
    Ok(work)
}

/// Commits the working copy; `Err` holds a refusal the caller is told
/// about in the result (over the budget: the project is unchanged).
pub(crate) async fn commit(
    binding: &ProjectBinding,
    work: &Path,
) -> Result<Result<u64, ProjectError>, ExecError> {
    match binding.projects.commit(&binding.project, work).await {
        Ok(bytes) => Ok(Ok(bytes)),
        Err(e @ (ProjectError::OverBudget { .. } | ProjectError::BadPath(_))) => Ok(Err(e)),
        Err(e) => Err(ExecError::Storage(format!("commit the project: {e}"))),
    }
}

/// Tells the caller the run's project changes were discarded: the reason
/// ends its stderr and is the result's message, and the run counts as
/// failed.
pub(crate) fn refused(result: &mut ExecResult, why: &ProjectError) {
    let why = format!("kiln: {why}");
    if !result.stderr.is_empty() && !result.stderr.ends_with('\n') {
        result.stderr.push('\n');
    }
    result.stderr.push_str(&why);
    result.stderr.push('\n');
    result.message = Some(why);
    if result.status.is_none() {
        result.status = Some(kiln_core::outcome::RunStatus::RuntimeError);
    }
}
