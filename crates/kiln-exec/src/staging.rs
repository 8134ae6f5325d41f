//! Staging a run from a file workspace (the application layer): which
//! stored files a run of a seed-000 session or of LibreChat's runtime
//! session starts from, and where its outputs go. Faces parse requests and
//! render answers; what a call of a workspace runs with is decided here, once.
//!
//! A workspace holds every version of a file a run ever wrote; a run starts
//! from the newest of each name ([`newest_per_name`]), each staged as a
//! reference of the caller's own ([`as_input`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use kiln_core::Nanoid;
use kiln_core::access::Caller;
use kiln_core::path::{PathError, RelPath};
use kiln_core::scope::Kind;
use kiln_store::ObjectMeta;

use crate::RunHandle;
use crate::sessions::{FileSessions, OpenError};
use crate::turns::Taken;
use crate::types::{ExecRequest, InputFile, InputRef, Outputs};

/// The newest object of each name in a workspace (a later version of a name
/// replaces the earlier; of two equally new, the later listed).
pub fn newest_per_name(objects: &[ObjectMeta]) -> Vec<ObjectMeta> {
    let mut newest: BTreeMap<&str, &ObjectMeta> = BTreeMap::new();
    for o in objects {
        match newest.get(o.name.as_str()) {
            Some(n) if n.created_at_ms > o.created_at_ms => {}
            _ => {
                newest.insert(&o.name, o);
            }
        }
    }
    newest.into_values().cloned().collect()
}

/// A workspace's object as an input of the caller's own (`kind: user`).
pub fn as_input(m: ObjectMeta) -> Result<InputFile, PathError> {
    let name = RelPath::parse(&m.name)?;
    Ok(InputFile::Ref(InputRef {
        id: m.file_id,
        storage_session_id: m.session_id,
        name,
        kind: Some(Kind::User),
        resource_id: None,
        version: None,
        entity_id: None,
    }))
}

/// Why a runtime session's call could not be staged.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// Another call of the session held its turn past the wait.
    #[error("the runtime session is busy with another call")]
    Busy,
    /// The session could not be opened or its files listed.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A stored name is not a valid path (never written by Kiln).
    #[error("a stored file name is not a valid path: {0}")]
    BadName(#[from] PathError),
}

/// A call of a runtime session, staged: the session's id and status, its
/// workspace, and the references the request itself sent (echoed when
/// unchanged; the session's other files are not).
#[derive(Debug)]
pub struct RuntimeCall {
    /// `rt_` + 40 hex digits.
    pub id: String,
    /// The session was in use within its TTL (`runtime_status: reused`).
    pub reused: bool,
    /// The storage session that is its `/mnt/data`.
    pub workspace: Nanoid,
    /// `(storage_session_id, id)` of every reference the request sent.
    pub sent: HashSet<(Nanoid, Nanoid)>,
}

/// The session's turn, held by a staged call until its run ends.
#[derive(Debug)]
pub struct CallTurn {
    taken: Taken,
    workspace: Nanoid,
}

impl CallTurn {
    /// Keeps the turn until `run` has ended, however it is watched (or
    /// not), then marks the session used: the next call of the session
    /// waits for this one's outputs.
    pub fn hold_until_done(self, run: RunHandle, sessions: Arc<FileSessions>) {
        tokio::spawn(async move {
            run.outcome().await;
            sessions.touch(&self.workspace);
            drop(self.taken);
        });
    }
}

impl FileSessions {
    /// Opens `caller`'s runtime session `hint`, takes its turn (waiting up
    /// to `wait`), and stages `req` in it: the run starts from the session's
    /// files (the newest per name) except those the request sends a file
    /// of the same name for, and its outputs go to the session. A reference
    /// to an earlier version of a session file (a later call replaced it)
    /// stands for that name: the session's current file is staged.
    pub async fn stage_runtime_call(
        &self,
        caller: &Caller,
        hint: &str,
        req: &mut ExecRequest,
        wait: Duration,
    ) -> Result<(RuntimeCall, CallTurn), StageError> {
        let (workspace, reused) = self.open_runtime(caller, hint).await?;
        let taken = self
            .take_turn(&workspace, wait)
            .await
            .map_err(|_| StageError::Busy)?;
        let objects = self
            .store()
            .list(&workspace)
            .await
            .map_err(OpenError::from)?;
        req.files.retain(|f| match f {
            InputFile::Ref(r) if r.storage_session_id == workspace => {
                objects.iter().any(|o| o.file_id == r.id)
            }
            _ => true,
        });
        let sent_names: HashSet<&str> = req.files.iter().map(|f| f.name().as_str()).collect();
        let mut files = Vec::new();
        for m in newest_per_name(&objects) {
            if !sent_names.contains(m.name.as_str()) {
                files.push(as_input(m)?);
            }
        }
        let sent = req
            .files
            .iter()
            .filter_map(|f| match f {
                InputFile::Ref(r) => Some((r.storage_session_id.clone(), r.id.clone())),
                InputFile::Inline { .. } => None,
            })
            .collect();
        files.append(&mut req.files);
        req.files = files;
        req.outputs = Outputs::Workspace(workspace.clone());
        let call = RuntimeCall {
            id: crate::sessions::runtime_session_id(caller, hint),
            reused,
            workspace: workspace.clone(),
            sent,
        };
        Ok((call, CallTurn { taken, workspace }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(session: &Nanoid, name: &str, at: i64) -> ObjectMeta {
        ObjectMeta {
            session_id: session.clone(),
            file_id: Nanoid::random(),
            name: name.to_owned(),
            size: 1,
            sha256: String::new(),
            content_type: "text/plain".into(),
            read_only: false,
            created_at_ms: at,
            version: String::new(),
        }
    }

    #[test]
    fn the_newest_version_of_each_name_is_staged() {
        let s = Nanoid::random();
        let old = meta(&s, "a.csv", 1);
        let new = meta(&s, "a.csv", 5);
        let other = meta(&s, "b.txt", 3);
        let got = newest_per_name(&[old, new.clone(), other.clone()]);
        let ids: Vec<_> = got.iter().map(|m| m.file_id.clone()).collect();
        assert_eq!(ids, vec![new.file_id, other.file_id]);
    }

    #[test]
    fn a_workspace_file_is_staged_as_the_callers_own_reference() {
        let s = Nanoid::random();
        let m = meta(&s, "dir/x.txt", 1);
        match as_input(m.clone()).unwrap() {
            InputFile::Ref(r) => {
                assert_eq!(r.id, m.file_id);
                assert_eq!(r.storage_session_id, s);
                assert_eq!(r.name.as_str(), "dir/x.txt");
                assert_eq!(r.kind, Some(Kind::User));
            }
            InputFile::Inline { .. } => panic!("staged inline"),
        }
    }

    #[test]
    fn a_stored_name_that_is_no_path_is_refused_not_staged() {
        let s = Nanoid::random();
        assert!(as_input(meta(&s, "../escape", 1)).is_err());
    }
}
