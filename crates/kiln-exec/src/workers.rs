//! Kernels by name: `(owner, name)` → one live kernel of [`Kernels`],
//! started on first use. This is what seed 004's per-user workers
//! (`user_uuid`), seed 003's default runtime session and the live runtime
//! sessions of LibreChat's stateful profile are; the faces name a kernel
//! instead of holding its id.
//!
//! - A name is a [`WorkerName`]: the face it belongs to is part of the key,
//!   not a prefix of a string, so no string a client sends in one face
//!   (a `user_uuid`, a runtime session hint) can name another face's kernel.
//! - A named kernel belongs to its [`Owner`] (a principal) and
//!   counts against the owner's cap like any of the owner's kernels,
//!   whatever face started it and however many names the owner uses: a
//!   name is the caller's choice, so caps never count per name. No other
//!   principal's name reaches it.
//! - Starting is serialised per name: two first calls at once start one
//!   kernel.
//! - A kernel that was lost, closed or expired is replaced by a fresh one
//!   on the next call; [`Workers::release`] closes it on purpose.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kiln_core::{Language, Nanoid, Owner};

use crate::kernels::{Kernel, Kernels, KernelsError};

/// A name's kernel id, locked while it is looked up or started. Not a
/// [`crate::turns::Turn`]: it guards a value (which kernel the name has)
/// and a second caller waits for a start in progress however long it takes
/// (the kernels' own caps and start timeout bound it) rather than being
/// refused as busy; the evaluation's one-at-a-time turn is the kernel's.
type Entry = Arc<tokio::sync::Mutex<Option<Nanoid>>>;

/// The name of a named kernel, with the face it belongs to: names of
/// different faces never compare equal, whatever their strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WorkerName {
    /// Seed 003's default runtime session (one per owner).
    Seed003Default,
    /// Seed 004's worker of a `user_uuid`.
    Seed004(String),
    /// A runtime session of LibreChat's stateful profile (its `rt_` id).
    Runtime(String),
}

/// Named kernels over a [`Kernels`] registry. Cheap to clone.
#[derive(Clone)]
pub struct Workers {
    kernels: Kernels,
    names: Arc<Mutex<HashMap<(Owner, WorkerName), Entry>>>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Workers {
    pub fn new(kernels: Kernels) -> Workers {
        Workers {
            kernels,
            names: Arc::default(),
        }
    }

    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    fn entry(&self, owner: &Owner, name: &WorkerName) -> Entry {
        let mut names = lock(&self.names);
        // forget names whose kernel is gone (expired, released elsewhere)
        if names.len() > 2 * self.kernels.config().max_total + 64 {
            names.retain(|_, e| match e.try_lock() {
                Ok(id) => id.as_ref().is_some_and(|id| self.kernels.get(id).is_ok()),
                Err(_) => true,
            });
        }
        Arc::clone(names.entry((owner.clone(), name.clone())).or_default())
    }

    /// The live `lang` kernel `name` of `owner`, started now if there is
    /// none (or the last one is gone). The flag says whether it was started
    /// now.
    pub async fn get_or_start(
        &self,
        owner: &Owner,
        name: &WorkerName,
        lang: Language,
    ) -> Result<(Arc<Kernel>, bool), KernelsError> {
        let entry = self.entry(owner, name);
        let mut id = entry.lock().await;
        if let Some(current) = id.as_ref() {
            match self.kernels.get(current) {
                Ok(s) if self.kernels.info(&s).lost.is_none() => return Ok((s, false)),
                Ok(_) => {
                    // lost: free it before starting its successor
                    let _ = self.kernels.delete(current).await;
                }
                Err(_) => {}
            }
            *id = None;
        }
        let info = self.kernels.create(owner, lang.name(), None).await?;
        let session = self.kernels.get(&info.id)?;
        *id = Some(info.id);
        Ok((session, true))
    }

    /// The live kernel `name` of `owner`, if one runs; never starts one.
    pub fn find(&self, owner: &Owner, name: &WorkerName) -> Option<Arc<Kernel>> {
        let entry = lock(&self.names)
            .get(&(owner.clone(), name.clone()))
            .cloned()?;
        let id = entry.try_lock().ok()?.clone()?;
        self.kernels
            .get(&id)
            .ok()
            .filter(|s| self.kernels.info(s).lost.is_none())
    }

    /// Closes the kernel `name` of `owner` and forgets the name; `false`
    /// when there was none.
    pub async fn release(&self, owner: &Owner, name: &WorkerName) -> bool {
        let Some(entry) = lock(&self.names).remove(&(owner.clone(), name.clone())) else {
            return false;
        };
        let id = entry.lock().await.take();
        match id {
            Some(id) => self.kernels.delete(&id).await.is_ok(),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_different_faces_never_meet_whatever_their_strings() {
        let names = [
            WorkerName::Seed003Default,
            WorkerName::Seed004("seed003-default".into()),
            WorkerName::Seed004("default".into()),
            WorkerName::Seed004("rt_abc".into()),
            WorkerName::Runtime("rt_abc".into()),
            WorkerName::Runtime("default".into()),
        ];
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
