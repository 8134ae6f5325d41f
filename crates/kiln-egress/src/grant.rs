//! Grants: which services one owner (a run today) may call, for how long,
//! and how much it has used. Deny by default: a grant names only the
//! services its principal may use, is minted by the server
//! ([`crate::Gateway::mint`]), never from anything a request or a jail
//! says, and is revoked when its owner ends.
//!
//! A grant belongs to a [`GrantOwner`] and lives as long as it does: the
//! owner holds the grant (through its [`crate::Channel`]) for its whole
//! life, moves the expiry with [`Grant::extend_to`] if its life grows (an
//! idle timeout renewed by use), and revokes it when it ends. A run is the
//! only owner today; a live session or a paused programmatic run becomes
//! another variant holding its grant the same way.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use kiln_core::{Nanoid, Principal};
use tokio::sync::Semaphore;

use crate::registry::Service;

/// What a grant belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantOwner {
    /// One execution; the id is its storage session id.
    Run(String),
}

impl std::fmt::Display for GrantOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GrantOwner::Run(id) => write!(f, "run:{id}"),
        }
    }
}

/// One service in a grant, with the grant's use of it.
#[derive(Debug)]
pub struct ServiceGrant {
    pub service: Arc<Service>,
    requests: AtomicU32,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

impl ServiceGrant {
    /// Counts one call, unless the grant's quota for the service is used up.
    pub fn reserve_request(&self) -> bool {
        let max = self.service.max_requests_per_grant;
        self.requests
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    /// Gives back a call counted by [`ServiceGrant::reserve_request`] that
    /// was refused before it reached the upstream.
    pub fn release_request(&self) {
        let _ = self
            .requests
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }

    pub fn add_bytes(&self, up: u64, down: u64) {
        self.bytes_up.fetch_add(up, Ordering::Relaxed);
        self.bytes_down.fetch_add(down, Ordering::Relaxed);
    }

    pub fn requests(&self) -> u32 {
        self.requests.load(Ordering::SeqCst)
    }

    pub fn remaining_requests(&self) -> u32 {
        self.service
            .max_requests_per_grant
            .saturating_sub(self.requests())
    }

    pub fn bytes(&self) -> (u64, u64) {
        (
            self.bytes_up.load(Ordering::Relaxed),
            self.bytes_down.load(Ordering::Relaxed),
        )
    }
}

#[derive(Debug)]
struct State {
    id: Nanoid,
    owner: GrantOwner,
    principal: Principal,
    services: Vec<ServiceGrant>,
    issued_at: SystemTime,
    expires_at: Mutex<Instant>,
    revoked: AtomicBool,
    /// Upstream calls in flight for this grant.
    in_flight: Arc<Semaphore>,
}

/// A grant; cheap to clone (all clones are the same grant).
#[derive(Debug, Clone)]
pub struct Grant(Arc<State>);

/// Why a grant refuses a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantState {
    Active,
    Expired,
    Revoked,
}

impl Grant {
    pub(crate) fn new(
        owner: GrantOwner,
        principal: Principal,
        services: Vec<Arc<Service>>,
        lifetime: Duration,
        max_in_flight: usize,
    ) -> Grant {
        Grant(Arc::new(State {
            id: Nanoid::random(),
            owner,
            principal,
            services: services
                .into_iter()
                .map(|service| ServiceGrant {
                    service,
                    requests: AtomicU32::new(0),
                    bytes_up: AtomicU64::new(0),
                    bytes_down: AtomicU64::new(0),
                })
                .collect(),
            issued_at: SystemTime::now(),
            expires_at: Mutex::new(Instant::now() + lifetime),
            revoked: AtomicBool::new(false),
            in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
        }))
    }

    pub fn id(&self) -> &Nanoid {
        &self.0.id
    }

    pub fn owner(&self) -> &GrantOwner {
        &self.0.owner
    }

    pub fn principal(&self) -> &Principal {
        &self.0.principal
    }

    pub fn issued_at(&self) -> SystemTime {
        self.0.issued_at
    }

    /// The granted services, in name order.
    pub fn services(&self) -> &[ServiceGrant] {
        &self.0.services
    }

    /// The grant's entry for `name`, if granted.
    pub fn service(&self, name: &str) -> Option<&ServiceGrant> {
        self.0.services.iter().find(|s| s.service.name == name)
    }

    /// Names of the granted services.
    pub fn service_names(&self) -> Vec<String> {
        self.0
            .services
            .iter()
            .map(|s| s.service.name.clone())
            .collect()
    }

    pub fn expires_at(&self) -> Instant {
        *self.0.expires_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the expiry (an owner whose life was extended).
    pub fn extend_to(&self, at: Instant) {
        *self.0.expires_at.lock().unwrap_or_else(|e| e.into_inner()) = at;
    }

    /// Ends the grant: every later call is refused.
    pub fn revoke(&self) {
        self.0.revoked.store(true, Ordering::SeqCst);
    }

    pub fn state(&self, now: Instant) -> GrantState {
        if self.0.revoked.load(Ordering::SeqCst) {
            GrantState::Revoked
        } else if now >= self.expires_at() {
            GrantState::Expired
        } else {
            GrantState::Active
        }
    }

    pub(crate) fn in_flight(&self) -> Arc<Semaphore> {
        Arc::clone(&self.0.in_flight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_expires_and_is_revoked() {
        let g = Grant::new(
            GrantOwner::Run("r".into()),
            Principal {
                tenant: "t".into(),
                user_id: "u".into(),
            },
            Vec::new(),
            Duration::from_secs(60),
            1,
        );
        let now = Instant::now();
        assert_eq!(g.state(now), GrantState::Active);
        assert_eq!(g.state(now + Duration::from_secs(61)), GrantState::Expired);
        g.extend_to(now + Duration::from_secs(120));
        assert_eq!(g.state(now + Duration::from_secs(61)), GrantState::Active);
        g.clone().revoke();
        assert_eq!(g.state(now), GrantState::Revoked);
        assert_eq!(g.owner().to_string(), "run:r");
    }
}
