//! Step 2, stage: fill the jail's workspace — the inputs, then the entry
//! file (which wins over an input of the same name), then what the
//! language table stages next to the code (its support files, read-only,
//! under `.kiln/`; the jail-owned build directory `.kiln-build/` of compiled
//! languages). Both are hidden, so the walker never reports them. Every
//! file goes through [`Workspace`]: created new, below the root, never
//! through a link.

use std::collections::HashMap;
use std::io::{self, Write as _};
use std::path::Path;
use std::sync::Arc;

use futures::TryStreamExt as _;
use kiln_core::Language;
use kiln_core::lang::{BUILD_DIR, SUPPORT_DIR};
use kiln_store::{LocalBlob, ObjectMeta, Store};
use tokio::io::AsyncWriteExt as _;

use super::authorize::Resolved;
use crate::types::ExecError;
use crate::walker::{StagedInput, hash_bytes};
use crate::workspace::Workspace;

/// Runs `f` on a blocking thread with the workspace.
pub(crate) async fn blocking<T: Send + 'static>(
    ws: &Arc<Workspace>,
    f: impl FnOnce(&Workspace) -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let ws = Arc::clone(ws);
    tokio::task::spawn_blocking(move || f(&ws))
        .await
        .map_err(io::Error::other)?
}

fn setup(e: io::Error) -> ExecError {
    ExecError::SandboxSetup(format!("stage workspace: {e}"))
}

/// A file written in the final batch.
struct Small {
    name: String,
    content: Vec<u8>,
    read_only: bool,
    /// Remove what is there first (the entry file, support files: staging
    /// put it there, so it is ours to replace).
    replace: bool,
}

fn storage(name: &str, e: impl std::fmt::Display) -> ExecError {
    ExecError::Storage(format!("stage {name}: {e}"))
}

/// An input whose bytes are on this node's disk: created, copied and
/// finished in the final blocking step, with the small files.
struct Local {
    name: String,
    blob: LocalBlob,
    read_only: bool,
}

impl Local {
    /// Copies the blob in; a failure of the blob itself is the store's
    /// (`Ok(Err)`), one of the workspace the set-up's.
    fn copy(self, ws: &Workspace) -> io::Result<Result<(), ExecError>> {
        ws.make_parents(&self.name)?;
        let mut file = ws.create_file(&self.name)?;
        if let Err(e) = self.blob.copy_into(&mut file, Path::new(&self.name)) {
            return Ok(Err(storage(&self.name, e)));
        }
        ws.finish_file(&file, self.read_only)?;
        Ok(Ok(()))
    }
}

/// An input in a remote store: its bytes streamed into the workspace.
async fn stream_remote(
    store: &Store,
    ws: &Arc<Workspace>,
    name: String,
    meta: &ObjectMeta,
) -> Result<(), ExecError> {
    let file = {
        let name = name.clone();
        blocking(ws, move |ws| {
            ws.make_parents(&name)?;
            ws.create_file(&name)
        })
        .await
        .map_err(setup)?
    };
    let mut out = tokio::fs::File::from_std(file);
    let mut body = store.read(meta).await.map_err(|e| storage(&name, e))?;
    while let Some(chunk) = body.try_next().await.map_err(|e| storage(&name, e))? {
        out.write_all(&chunk).await.map_err(|e| storage(&name, e))?;
    }
    out.flush().await.map_err(|e| storage(&name, e))?;
    let file = out.into_std().await;
    let read_only = meta.read_only;
    blocking(ws, move |ws| ws.finish_file(&file, read_only))
        .await
        .map_err(setup)
}

/// Stages everything; returns what the walker needs to know about each
/// staged input (not the entry file).
pub(crate) async fn stage(
    store: &Store,
    ws: &Arc<Workspace>,
    inputs: Vec<Resolved>,
    lang: Language,
    code: &str,
) -> Result<HashMap<String, StagedInput>, ExecError> {
    let mut staged = HashMap::new();
    let mut local = Vec::new();
    let mut small = Vec::new();
    for input in inputs {
        match input {
            Resolved::Ref { r, meta } => {
                let name = r.name.as_str().to_owned();
                let read_only = meta.read_only;
                match store.local_blob(&meta).map_err(|e| storage(&name, e))? {
                    Some(blob) => local.push(Local {
                        name: name.clone(),
                        blob,
                        read_only,
                    }),
                    None => stream_remote(store, ws, name.clone(), &meta).await?,
                }
                staged.insert(
                    name,
                    StagedInput {
                        origin: Some((r.id, r.storage_session_id)),
                        sha256: meta.sha256,
                        size: meta.size,
                        read_only,
                        entity_id: r.entity_id,
                    },
                );
            }
            Resolved::Inline { name, content } => {
                staged.insert(
                    name.as_str().to_owned(),
                    StagedInput {
                        origin: None,
                        sha256: hash_bytes(&content),
                        size: content.len() as u64,
                        read_only: false,
                        entity_id: None,
                    },
                );
                small.push(Small {
                    name: name.as_str().to_owned(),
                    content,
                    read_only: false,
                    replace: false,
                });
            }
        }
    }
    // the code goes last among the inputs: it wins over one of the same name
    let entry = lang.spec().entry_file;
    small.push(Small {
        name: entry.to_owned(),
        content: code.as_bytes().to_vec(),
        read_only: false,
        replace: true,
    });
    staged.remove(entry);
    for f in lang.support_files_for(code) {
        small.push(Small {
            name: format!("{SUPPORT_DIR}/{}", f.name),
            content: f.contents.as_bytes().to_vec(),
            read_only: true,
            replace: true,
        });
    }
    let build_dir = lang.needs_build_dir();
    // one blocking step for every file on this node's disk: the local
    // inputs (their names are distinct: planned when authorizing), then the
    // entry and support files, then the build directory
    blocking(ws, move |ws| {
        for l in local {
            if let Err(e) = l.copy(ws)? {
                return Ok(Err(e));
            }
        }
        for f in small {
            ws.make_parents(&f.name)?;
            if f.replace {
                ws.remove_file(&f.name)?;
            }
            let mut file = ws.create_file(&f.name)?;
            file.write_all(&f.content)?;
            ws.finish_file(&file, f.read_only)?;
        }
        if build_dir {
            ws.replace_with_dir(BUILD_DIR, 0o755)?;
        }
        Ok(Ok(()))
    })
    .await
    .map_err(setup)??;
    Ok(staged)
}
