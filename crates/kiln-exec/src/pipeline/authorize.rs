//! Step 1, authorize: plan the inputs (de-duplication, collisions), check
//! every by-reference input against its storage session's owner with the
//! one access rule, and resolve it to stored metadata; check the session
//! outputs go to. Nothing is taken before this passes.

use kiln_core::access::{Caller, Policy, may_read, may_write_stored};
use kiln_store::{ObjectMeta, Store};

use crate::plan::plan_inputs;
use crate::types::{ExecError, InputFile, InputRef, Outputs};

/// An input ready to stage.
#[derive(Debug)]
pub(crate) enum Resolved {
    Ref {
        r: InputRef,
        meta: Box<ObjectMeta>,
    },
    Inline {
        name: kiln_core::RelPath,
        content: Vec<u8>,
    },
}

/// Plans `files` and resolves every reference the caller may read under
/// `policy`; `Unauthorized` for any it may not (or that does not exist).
/// A ref that claims nothing is judged as a download without a claim.
pub(crate) async fn inputs(
    store: &Store,
    policy: Policy,
    caller: &Caller,
    files: Vec<InputFile>,
) -> Result<Vec<Resolved>, ExecError> {
    let planned = plan_inputs(files)?;
    let mut out = Vec::with_capacity(planned.len());
    for f in planned {
        match f {
            InputFile::Inline { name, content } => out.push(Resolved::Inline { name, content }),
            InputFile::Ref(r) => {
                // the session's key and the object in one statement; the
                // access rule is judged on the key before the object is used
                let Some((stored, meta)) = store
                    .session_object(&r.storage_session_id, &r.id)
                    .await
                    .map_err(|e| ExecError::Storage(e.to_string()))?
                else {
                    return Err(ExecError::Unauthorized);
                };
                if may_read(policy, caller, &r.claim(), &stored).is_err() {
                    return Err(ExecError::Unauthorized);
                }
                let meta = meta.ok_or(ExecError::Unauthorized)?;
                out.push(Resolved::Ref {
                    r,
                    meta: Box::new(meta),
                });
            }
        }
    }
    Ok(out)
}

/// The outputs may go into a workspace session only when it is the
/// caller's own (its user key).
pub(crate) async fn outputs(
    store: &Store,
    caller: &Caller,
    outputs: &Outputs,
) -> Result<(), ExecError> {
    let Outputs::Workspace(id) = outputs else {
        return Ok(());
    };
    match store
        .session(id)
        .await
        .map_err(|e| ExecError::Storage(e.to_string()))?
    {
        Some(s) if may_write_stored(caller, &s.key).is_ok() => Ok(()),
        _ => Err(ExecError::Unauthorized),
    }
}
