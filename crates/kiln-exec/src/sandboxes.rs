//! Bridge sandboxes (the `/v1/sandbox` face): a persistent `/workspace`
//! owned by the principal that created it. Each command the face runs in
//! one is a run of the one registry ([`crate::Runs`]) in a fresh jail with
//! the sandbox's project bound at `/workspace`; this registry only knows
//! which sandboxes exist, whose they are, and when they were last used.
//!
//! - **Caps**: at most `per_principal` sandboxes per principal and `total`
//!   on the node ([`crate::caps`], the mechanism the kernels use); a place
//!   is held while the sandbox exists.
//! - **Idle TTL**: a sandbox not used for `idle_ttl` is gone: [`Sandboxes::get`]
//!   no longer finds it and [`Sandboxes::sweep`] removes it (the caller
//!   then deletes its project).
//! - **Restarts**: the registry is the node's memory, its projects are on
//!   disk. A face that finds no sandbox by an id its caller names, but the
//!   caller's project of that sandbox used within the idle TTL, takes it
//!   back with [`Sandboxes::restore`].

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use kiln_core::access::Caller;
use kiln_core::{Nanoid, Owner};

use crate::caps::{CapError, CapGuard, Caps};
use crate::expiring::Expiring;

/// The registry's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxesConfig {
    /// Sandboxes one principal may hold at once.
    pub per_principal: usize,
    /// Sandboxes on the node.
    pub total: usize,
    /// Unused this long, a sandbox is removed.
    pub idle_ttl: Duration,
}

impl Default for SandboxesConfig {
    fn default() -> Self {
        SandboxesConfig {
            per_principal: 4,
            total: 64,
            idle_ttl: Duration::from_secs(3600),
        }
    }
}

/// Why a sandbox could not be created or found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxesError {
    /// No such sandbox (never created, deleted, or idle past its TTL).
    #[error("no such sandbox")]
    NotFound,
    /// The caller holds its most sandboxes already.
    #[error("the caller holds {0} sandboxes, the most allowed")]
    PrincipalCap(usize),
    /// The node holds its most sandboxes already.
    #[error("this node holds {0} sandboxes, the most allowed")]
    NodeCap(usize),
}

impl From<CapError> for SandboxesError {
    fn from(e: CapError) -> Self {
        match e {
            CapError::Principal(n) => SandboxesError::PrincipalCap(n),
            CapError::Total(n) => SandboxesError::NodeCap(n),
        }
    }
}

/// One sandbox.
#[derive(Debug)]
pub struct Sandbox {
    id: Nanoid,
    creator: Caller,
    owner: Owner,
    created_at: SystemTime,
    _place: CapGuard,
}

impl Sandbox {
    pub fn id(&self) -> &Nanoid {
        &self.id
    }

    /// Its owner, the creator's principal (what the access rule asks about).
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// Who created it: its project is this caller's, whoever else the
    /// access rule lets use the sandbox.
    pub fn creator(&self) -> &Caller {
        &self.creator
    }

    pub fn created_at(&self) -> SystemTime {
        self.created_at
    }

    /// The name of its project: unique per sandbox, never chosen by a
    /// caller.
    pub fn project_name(&self) -> String {
        Sandbox::project_name_of(&self.id)
    }

    /// The project name of the sandbox `id`.
    pub fn project_name_of(id: &Nanoid) -> String {
        format!("sandbox-{}", id.as_str())
    }
}

/// The sandboxes of this node. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Sandboxes {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    cfg: SandboxesConfig,
    caps: Caps,
    /// The sandboxes and their idle clocks (the one expiry rule; no
    /// maximum age).
    map: Expiring<Nanoid, Arc<Sandbox>>,
}

impl Sandboxes {
    pub fn new(cfg: SandboxesConfig) -> Sandboxes {
        Sandboxes {
            inner: Arc::new(Inner {
                caps: Caps::new(cfg.per_principal, cfg.total),
                map: Expiring::new(cfg.idle_ttl, Duration::MAX),
                cfg,
            }),
        }
    }

    pub fn config(&self) -> SandboxesConfig {
        self.inner.cfg
    }

    /// A new sandbox of `caller`'s, within the caps.
    pub fn create(&self, caller: &Caller) -> Result<Arc<Sandbox>, SandboxesError> {
        self.create_at(caller, Instant::now())
    }

    fn create_at(&self, caller: &Caller, now: Instant) -> Result<Arc<Sandbox>, SandboxesError> {
        self.add(Nanoid::random(), caller, now)
    }

    /// Holds a place of `caller`'s for the sandbox `id` and keeps it, used
    /// at `now`; if `id` is held meanwhile, that sandbox (the place taken
    /// for it goes back when it drops).
    fn add(
        &self,
        id: Nanoid,
        caller: &Caller,
        now: Instant,
    ) -> Result<Arc<Sandbox>, SandboxesError> {
        let owner = Owner::of(caller);
        // an expired sandbox of the caller's must not hold a place
        self.expire(now);
        let place = self.inner.caps.acquire(&owner)?;
        let sandbox = Arc::new(Sandbox {
            id: id.clone(),
            creator: caller.clone(),
            owner,
            created_at: SystemTime::now(),
            _place: place,
        });
        Ok(self.inner.map.get_or_insert_at(id, sandbox, now))
    }

    /// The sandbox `id`, marked used now, unless it is gone.
    pub fn get(&self, id: &Nanoid) -> Result<Arc<Sandbox>, SandboxesError> {
        self.get_at(id, Instant::now())
    }

    fn get_at(&self, id: &Nanoid, now: Instant) -> Result<Arc<Sandbox>, SandboxesError> {
        self.inner
            .map
            .use_at(id, now)
            .ok_or(SandboxesError::NotFound)
    }

    /// Takes back the sandbox `id` of `caller`'s, which this registry does
    /// not hold (a restart forgot it) but whose project exists: the caller
    /// is its creator, since a sandbox's project is its creator's. Within
    /// the caps, as a create; if the id is held meanwhile, that sandbox.
    pub fn restore(&self, id: Nanoid, caller: &Caller) -> Result<Arc<Sandbox>, SandboxesError> {
        let now = Instant::now();
        if let Some(held) = self.inner.map.use_at(&id, now) {
            return Ok(held);
        }
        self.add(id, caller, now)
    }

    /// Marks `sandbox` used now (a command that ran long ends).
    pub fn touch(&self, sandbox: &Sandbox) {
        self.inner.map.touch(&sandbox.id);
    }

    /// Removes the sandbox `id`; the caller deletes its project.
    pub fn remove(&self, id: &Nanoid) -> Result<Arc<Sandbox>, SandboxesError> {
        self.inner.map.remove(id).ok_or(SandboxesError::NotFound)
    }

    /// Removes every sandbox idle past the TTL and returns them (their
    /// places are given back when the last reference drops).
    pub fn sweep(&self) -> Vec<Arc<Sandbox>> {
        self.expire(Instant::now())
    }

    fn expire(&self, now: Instant) -> Vec<Arc<Sandbox>> {
        let map = &self.inner.map;
        map.expired(now)
            .into_iter()
            .filter_map(|(id, _)| map.remove_expired(&id, now))
            .collect()
    }

    /// Sandboxes on the node.
    pub fn len(&self) -> usize {
        self.inner.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(user: &str) -> Caller {
        Caller::identified("t", user)
    }

    fn registry(per: usize, total: usize, ttl_secs: u64) -> Sandboxes {
        Sandboxes::new(SandboxesConfig {
            per_principal: per,
            total,
            idle_ttl: Duration::from_secs(ttl_secs),
        })
    }

    #[test]
    fn a_principal_at_its_cap_is_refused_and_a_deleted_sandbox_frees_its_place() {
        let r = registry(2, 10, 60);
        let a1 = r.create(&caller("alice")).expect("a1");
        r.create(&caller("alice")).expect("a2");
        assert_eq!(
            r.create(&caller("alice")).unwrap_err(),
            SandboxesError::PrincipalCap(2)
        );
        r.create(&caller("bob")).expect("bob is not alice");
        let id = a1.id().clone();
        drop(a1);
        r.remove(&id).expect("remove");
        r.create(&caller("alice")).expect("a place given back");
        assert_eq!(r.get(&id).unwrap_err(), SandboxesError::NotFound);
    }

    #[test]
    fn the_node_cap_counts_every_principal() {
        let r = registry(5, 2, 60);
        r.create(&caller("a")).expect("a");
        r.create(&caller("b")).expect("b");
        assert_eq!(
            r.create(&caller("c")).unwrap_err(),
            SandboxesError::NodeCap(2)
        );
    }

    #[test]
    fn an_idle_sandbox_expires_and_a_used_one_does_not() {
        let r = registry(1, 10, 60);
        let t0 = Instant::now();
        let s = r.create_at(&caller("alice"), t0).expect("create");
        let id = s.id().clone();
        drop(s);
        // used at 50 s: alive at 100 s, gone at 111 s
        r.get_at(&id, t0 + Duration::from_secs(50)).expect("used");
        r.get_at(&id, t0 + Duration::from_secs(100)).expect("alive");
        assert_eq!(
            r.get_at(&id, t0 + Duration::from_secs(161)).unwrap_err(),
            SandboxesError::NotFound
        );
        // its place is free again once expired, for a new one
        r.create_at(&caller("alice"), t0 + Duration::from_secs(161))
            .expect("the expired sandbox's place is free");
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn sweep_returns_the_expired_sandboxes() {
        let r = registry(3, 10, 0);
        r.create(&caller("a")).expect("a");
        let gone = r.sweep();
        assert_eq!(gone.len(), 1);
        assert!(r.is_empty());
    }

    #[test]
    fn a_restored_sandbox_keeps_its_id_counts_against_the_caps_and_is_held_once() {
        let r = registry(1, 10, 60);
        let id = Nanoid::random();
        let s = r.restore(id.clone(), &caller("alice")).expect("restore");
        assert_eq!(s.id(), &id);
        assert_eq!(s.owner(), &Owner::of(&caller("alice")));
        assert_eq!(r.get(&id).expect("held").id(), &id);
        let again = r.restore(id.clone(), &caller("alice")).expect("held");
        assert!(Arc::ptr_eq(&s, &again), "one sandbox per id");
        assert_eq!(r.len(), 1);
        assert_eq!(
            r.create(&caller("alice")).unwrap_err(),
            SandboxesError::PrincipalCap(1),
            "the restored sandbox holds alice's place"
        );
        assert_eq!(
            r.restore(Nanoid::random(), &caller("alice")).unwrap_err(),
            SandboxesError::PrincipalCap(1)
        );
    }

    #[test]
    fn owner_is_the_callers_principal_and_the_project_name_is_the_id() {
        let r = registry(3, 10, 60);
        let s = r.create(&caller("alice")).expect("a");
        assert_eq!(s.owner(), &Owner::of(&caller("alice")));
        assert_eq!(s.project_name(), format!("sandbox-{}", s.id().as_str()));
    }
}
