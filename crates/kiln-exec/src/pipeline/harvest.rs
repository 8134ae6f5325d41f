//! Step 4, harvest: walk the workspace once every process of the jail is
//! dead, store each new or modified output (opened through [`Workspace`]
//! and handed to the store as a stream), and report it to the run's
//! watchers. Into a workspace session ([`Outputs::Workspace`]) an output
//! replaces the objects of the same name, and an input the program deleted
//! is deleted; so does every other file the program left there (a `.pkl`,
//! a file without an extension): stored, not reported, so the workspace
//! persists whole as it would on a machine that kept it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::TryStreamExt as _;
use kiln_core::{Nanoid, RelPath};
use kiln_store::{NewObject, Store, StoreError};
use tokio::io::AsyncReadExt as _;
use tokio_util::io::ReaderStream;
use tracing::warn;

use super::outcome::content_type;
use super::stage::blocking;
use crate::runs::RunContext;
use crate::types::{ExecError, OutputFile, Outputs, Truncation};
use crate::walker::{self, StagedInput, WalkLimits};
use crate::workspace::Workspace;

/// What the harvest found and stored.
#[derive(Debug, Default)]
pub(crate) struct Harvest {
    pub files: Vec<OutputFile>,
    /// Files kept in the workspace session without being reported (name,
    /// object id).
    pub kept: Vec<(String, Nanoid)>,
    pub deleted: Vec<String>,
    pub truncation: Option<Truncation>,
    pub attempted: u32,
    pub failed: u32,
}

/// Walks, stores, reports.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn harvest(
    store: &Store,
    run: &RunContext,
    ws: &Arc<Workspace>,
    staged: HashMap<String, StagedInput>,
    entry: (&'static str, String),
    limits: &WalkLimits,
    session: &Nanoid,
    outputs: &Outputs,
) -> Result<Harvest, ExecError> {
    let walk_limits = limits.clone();
    let staged = Arc::new(staged);
    let persists = matches!(outputs, Outputs::Workspace(_));
    let walked = {
        let staged = Arc::clone(&staged);
        blocking(ws, move |ws| {
            let walk = if persists {
                walker::walk_keeping
            } else {
                walker::walk
            };
            walk(ws, &staged, (entry.0, &entry.1), &walk_limits)
        })
        .await
        .map_err(|e| ExecError::SandboxFailed(format!("walk workspace: {e}")))?
    };

    let mut h = Harvest::default();
    let mut trunc = walked.truncation;
    for g in walked.generated {
        let Ok(name) = RelPath::parse(&g.name) else {
            h.failed += 1;
            continue;
        };
        let obj = new_object(session, name);
        let file_id = obj.file_id.clone();
        match store_output(store, ws, obj).await {
            Ok(bytes) => {
                let f = OutputFile {
                    id: file_id,
                    name: g.name,
                    storage_session_id: session.clone(),
                    inherited: false,
                    modified_from: g.modified_from,
                    entity_id: None,
                };
                run.file_stored(&f, bytes);
                h.files.push(f);
            }
            // a storage budget, not a failure: reported like the walker's caps
            Err(StoreError::QuotaExceeded { .. } | StoreError::DiskFull { .. }) => {
                walker::skip(trunc.get_or_insert_default(), g.name, |t| &mut t.storage);
            }
            Err(e) => {
                warn!(file = %g.name, error = %e, "could not store output");
                h.failed += 1;
            }
        }
    }
    h.attempted = h.files.len() as u32 + h.failed;
    for k in walked.kept {
        let Ok(name) = RelPath::parse(&k.name) else {
            continue;
        };
        let obj = new_object(session, name);
        let file_id = obj.file_id.clone();
        match store_output(store, ws, obj).await {
            Ok(_) => h.kept.push((k.name, file_id)),
            Err(e) => warn!(file = %k.name, error = %e, "could not keep a workspace file"),
        }
    }
    if !walked.kept_skipped.is_empty() {
        warn!(files = ?walked.kept_skipped, "workspace files over the caps were not kept");
    }
    for i in walked.inherited {
        h.files.push(OutputFile {
            id: i.id,
            name: i.name,
            storage_session_id: i.storage_session_id,
            inherited: true,
            modified_from: None,
            entity_id: i.entity_id,
        });
    }
    h.deleted = walked.deleted;
    h.truncation = trunc;
    if let Outputs::Workspace(sid) = outputs {
        sync_workspace(store, sid, &h, &staged).await;
    }
    Ok(h)
}

/// A new object named `name` in `session`, with a fresh id.
fn new_object(session: &Nanoid, name: RelPath) -> NewObject {
    NewObject {
        session_id: session.clone(),
        file_id: Nanoid::random(),
        content_type: content_type(name.as_str()),
        name,
        read_only: false,
    }
}

/// Opens one output without following links and streams it into the
/// store; returns its size.
async fn store_output(
    store: &Store,
    ws: &Arc<Workspace>,
    obj: NewObject,
) -> Result<u64, StoreError> {
    let name = obj.name.as_str().to_owned();
    let opened = blocking(ws, move |ws| ws.open_regular(&name))
        .await
        .map_err(|source| StoreError::Io {
            op: "open output",
            path: obj.name.as_str().into(),
            source,
        })?;
    let Some((file, len)) = opened else {
        return Err(StoreError::NotRegularFile {
            path: obj.name.as_str().into(),
        });
    };
    // at most the size it had when opened
    let body = ReaderStream::new(tokio::fs::File::from_std(file).take(len));
    store
        .put_stream(obj, body.map_err(std::io::Error::other), len)
        .await
        .map(|meta| meta.size)
}

/// A workspace session keeps one object per name: the outputs just stored
/// replace older objects of their names, and inputs of this session that
/// the program deleted go.
async fn sync_workspace(
    store: &Store,
    sid: &Nanoid,
    h: &Harvest,
    staged: &HashMap<String, StagedInput>,
) {
    let new: HashSet<(&str, &Nanoid)> = h
        .files
        .iter()
        .filter(|f| !f.inherited && &f.storage_session_id == sid)
        .map(|f| (f.name.as_str(), &f.id))
        .chain(h.kept.iter().map(|(name, id)| (name.as_str(), id)))
        .collect();
    let new_names: HashSet<&str> = new.iter().map(|(n, _)| *n).collect();
    let gone: HashSet<&Nanoid> = h
        .deleted
        .iter()
        .filter_map(|n| staged.get(n)?.origin.as_ref())
        .filter(|(_, s)| s == sid)
        .map(|(id, _)| id)
        .collect();
    let objects = match store.list(sid).await {
        Ok(o) => o,
        Err(e) => {
            warn!(session = %sid, error = %e, "could not list the workspace session");
            return;
        }
    };
    for o in objects {
        let replaced =
            new_names.contains(o.name.as_str()) && !new.contains(&(o.name.as_str(), &o.file_id));
        if (replaced || gone.contains(&o.file_id))
            && let Err(e) = store.delete(sid, &o.file_id).await
        {
            warn!(session = %sid, file = %o.file_id, error = %e, "could not remove a replaced object");
        }
    }
}
