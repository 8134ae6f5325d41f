//! Named file workspaces (seed 000's sessions): a caller's session name
//! (`"sess_abc"`, one per chat) names a set of files that persists between
//! calls. Files uploaded to the session and the outputs of its runs are
//! there for its later runs; a session left idle longer than the TTL is
//! emptied, files included.
//!
//! A session is one storage session of the caller's, with an id derived
//! from (tenant, user, name): any node finds it without a lookup table, and
//! two callers' sessions of the same name never meet. Runs use it with
//! [`crate::Outputs::Workspace`], so an output replaces the file it
//! modified. When a session was last used is kept in memory: after a
//! restart, a session not used again expires with the store's retention
//! instead of the TTL.
//!
//! LibreChat's stateful profile (spec §13.4) is the same machinery under
//! another name: a runtime session (`rt_` + 40 hex of sha256(tenant, user,
//! hint)) is a workspace derived in its own namespace ([`FileSessions::open_runtime`]),
//! and its calls take turns ([`FileSessions::take_turn`]).

use std::time::{Duration, Instant};

use crate::expiring::Expiring;
use crate::turns::{Taken, Turns};
use kiln_core::Nanoid;
use kiln_core::Owner;
use kiln_core::access::{Caller, may_write_stored};
use kiln_core::id::is_resource_id;
use kiln_store::{Store, StoreError};
use sha2::{Digest, Sha256};

/// Why a session name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("session_id must match ^[A-Za-z0-9_.:-]{{1,128}}$")]
pub struct BadSessionName;

/// The sessions of this node.
#[derive(Debug)]
pub struct FileSessions {
    store: Store,
    ttl: Duration,
    /// When each session was last used (the idle TTL's clock).
    used: Expiring<Nanoid, ()>,
    /// A turn per workspace whose calls take turns (runtime sessions).
    turns: Turns<Nanoid>,
}

/// The namespaces of derived workspaces: a seed-000 session and a runtime
/// session of the same name are different workspaces.
const FILE_SESSION: &[u8] = b"kiln file session\0";
const RUNTIME_SESSION: &[u8] = b"kiln runtime session\0";

/// Another call of the same runtime session held it past the wait.
pub use crate::turns::Busy;

/// LibreChat's runtime session id: `rt_` + the first 40 hex digits of
/// sha256(`tenant \0 user \0 hint`), or of the JSON array of the three when
/// one of them contains a NUL (spec §13.4).
pub fn runtime_session_id(caller: &Caller, hint: &str) -> String {
    let p = &caller.principal;
    let fields = [p.tenant.as_str(), p.user_id.as_str(), hint];
    let digest = if fields.iter().any(|f| f.contains('\0')) {
        Sha256::digest(
            serde_json::to_string(&fields)
                .unwrap_or_default()
                .as_bytes(),
        )
    } else {
        Sha256::digest(fields.join("\0").as_bytes())
    };
    let mut id = String::from("rt_");
    id.push_str(&hex::encode(digest)[..40]);
    id
}

impl FileSessions {
    pub fn new(store: Store, ttl: Duration) -> FileSessions {
        FileSessions {
            store,
            ttl,
            used: Expiring::new(ttl, Duration::MAX),
            turns: Turns::default(),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The store the sessions live in.
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The storage session that holds `caller`'s session `name`.
    pub fn storage_id(caller: &Caller, name: &str) -> Result<Nanoid, BadSessionName> {
        Self::derive(FILE_SESSION, caller, name)
    }

    /// The storage session that holds `caller`'s runtime session `hint`.
    pub fn runtime_storage_id(caller: &Caller, hint: &str) -> Result<Nanoid, BadSessionName> {
        Self::derive(RUNTIME_SESSION, caller, hint)
    }

    /// An id in `namespace` derived from `caller` (its [`Owner`]) and
    /// `name` (also the projects' ids, see [`crate::projects`]).
    pub(crate) fn derive(
        namespace: &[u8],
        caller: &Caller,
        name: &str,
    ) -> Result<Nanoid, BadSessionName> {
        if !is_resource_id(name) {
            return Err(BadSessionName);
        }
        Ok(Owner::of(caller).derive_id(namespace, name))
    }

    /// The session's storage id, creating the storage session on first use,
    /// and marks it used.
    pub async fn open(&self, caller: &Caller, name: &str) -> Result<Nanoid, OpenError> {
        let id = Self::storage_id(caller, name)?;
        self.open_id(caller, id).await
    }

    /// The storage id of `caller`'s runtime session `hint`, created on
    /// first use, and whether it was in use within the TTL (LibreChat's
    /// `runtime_status: reused`); marks it used.
    pub async fn open_runtime(
        &self,
        caller: &Caller,
        hint: &str,
    ) -> Result<(Nanoid, bool), OpenError> {
        let id = Self::runtime_storage_id(caller, hint)?;
        let reused = self.used.contains(&id);
        Ok((self.open_id(caller, id).await?, reused))
    }

    /// Waits up to `wait` for the workspace's turn: one call at a time.
    /// The turn lasts as long as the guard.
    pub async fn take_turn(&self, id: &Nanoid, wait: Duration) -> Result<Taken, Busy> {
        self.turns.take(id, wait).await
    }

    async fn open_id(&self, caller: &Caller, id: Nanoid) -> Result<Nanoid, OpenError> {
        match self.store.session(&id).await? {
            Some(s) if may_write_stored(caller, &s.key).is_ok() => {}
            // derived from the caller: another key means a collision
            Some(_) => return Err(OpenError::Conflict),
            None => match self
                .store
                .create_session(&id, &Owner::of(caller).key())
                .await
            {
                Ok(()) | Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e.into()),
            },
        }
        self.touch(&id);
        Ok(id)
    }

    /// The session's storage id if it exists (without creating it); marks
    /// it used.
    pub async fn find(&self, caller: &Caller, name: &str) -> Result<Option<Nanoid>, OpenError> {
        let id = Self::storage_id(caller, name)?;
        match self.store.session(&id).await? {
            Some(s) if may_write_stored(caller, &s.key).is_ok() => {
                self.touch(&id);
                Ok(Some(id))
            }
            _ => Ok(None),
        }
    }

    /// Marks a session used now.
    pub fn touch(&self, id: &Nanoid) {
        self.used.insert(id.clone(), (), None);
    }

    /// Empties every session idle longer than the TTL as of `now`; returns
    /// how many files it deleted.
    pub async fn sweep_at(&self, now: Instant) -> Result<u64, StoreError> {
        self.turns.forget_unused();
        let mut deleted = 0;
        for (id, ()) in self.used.expired(now) {
            for o in self.store.list(&id).await? {
                if self.store.delete(&id, &o.file_id).await? {
                    deleted += 1;
                }
            }
            // used again meanwhile: keep its mark
            self.used.remove_expired(&id, now);
        }
        Ok(deleted)
    }

    /// Empties idle sessions now.
    pub async fn sweep(&self) -> Result<u64, StoreError> {
        self.sweep_at(Instant::now()).await
    }
}

/// Why a session could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    BadName(#[from] BadSessionName),
    #[error("the session's storage belongs to someone else")]
    Conflict,
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(user: &str) -> Caller {
        Caller::identified("local", user)
    }

    #[test]
    fn storage_ids_are_stable_per_caller_and_name() {
        let a = FileSessions::storage_id(&caller("alice"), "sess_abc").unwrap();
        assert_eq!(
            a,
            FileSessions::storage_id(&caller("alice"), "sess_abc").unwrap()
        );
        assert_ne!(
            a,
            FileSessions::storage_id(&caller("bob"), "sess_abc").unwrap()
        );
        assert_ne!(
            a,
            FileSessions::storage_id(&caller("alice"), "sess_abd").unwrap()
        );
        assert!(FileSessions::storage_id(&caller("alice"), "").is_err());
        assert!(FileSessions::storage_id(&caller("alice"), "a/b").is_err());
    }

    #[test]
    fn runtime_session_ids_follow_librechats_derivation() {
        // sha256("local\0alice\0v2:user:abc"), first 40 hex digits
        assert_eq!(
            runtime_session_id(&caller("alice"), "v2:user:abc"),
            "rt_e266c61e3ba433332da8266576573e1d38c978fc"
        );
        assert_ne!(
            runtime_session_id(&caller("bob"), "v2:user:abc"),
            runtime_session_id(&caller("alice"), "v2:user:abc")
        );
        // a runtime session and a seed-000 session of the same name differ
        assert_ne!(
            FileSessions::runtime_storage_id(&caller("alice"), "h").unwrap(),
            FileSessions::storage_id(&caller("alice"), "h").unwrap()
        );
    }

    /// A store in a fresh directory (kept while the guard lives).
    async fn store() -> (Store, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(kiln_store::StoreConfig {
            dir: dir.path().to_path_buf(),
            retention: Duration::from_secs(3600),
            budget: Default::default(),
        })
        .await
        .unwrap();
        (store, dir)
    }

    #[tokio::test]
    async fn a_second_turn_waits_then_is_refused() {
        let (store, _dir) = store().await;
        let sessions = FileSessions::new(store, Duration::from_secs(60));
        let (id, reused) = sessions.open_runtime(&caller("alice"), "h").await.unwrap();
        assert!(!reused);
        assert!(
            sessions
                .open_runtime(&caller("alice"), "h")
                .await
                .unwrap()
                .1
        );
        let first = sessions
            .take_turn(&id, Duration::from_millis(10))
            .await
            .unwrap();
        assert_eq!(
            sessions
                .take_turn(&id, Duration::from_millis(50))
                .await
                .err(),
            Some(Busy)
        );
        drop(first);
        assert!(
            sessions
                .take_turn(&id, Duration::from_millis(10))
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn idle_sessions_are_emptied_and_used_ones_kept() {
        let (store, _dir) = store().await;
        let sessions = FileSessions::new(store.clone(), Duration::from_secs(60));
        let alice = caller("alice");
        let old = sessions.open(&alice, "old").await.unwrap();
        let fresh = sessions.open(&alice, "fresh").await.unwrap();
        for sid in [&old, &fresh] {
            let obj = kiln_store::NewObject {
                session_id: sid.clone(),
                file_id: Nanoid::random(),
                name: kiln_core::RelPath::parse("a.txt").unwrap(),
                content_type: "text/plain".into(),
                read_only: false,
            };
            let body = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from("x"))]);
            store.put_stream(obj, body, 10).await.unwrap();
        }
        // "old" was last used 61 s before the sweep, "fresh" just now
        let now = Instant::now() + Duration::from_secs(61);
        sessions.touch(&fresh);
        sessions.used.touch_at(&fresh, now);
        assert_eq!(sessions.sweep_at(now).await.unwrap(), 1);
        assert!(store.list(&old).await.unwrap().is_empty());
        assert_eq!(store.list(&fresh).await.unwrap().len(), 1);
        // the emptied session can be used again
        assert_eq!(sessions.open(&alice, "old").await.unwrap(), old);
        // another caller cannot find it
        assert!(
            sessions
                .find(&caller("bob"), "old")
                .await
                .unwrap()
                .is_none()
        );
    }
}
