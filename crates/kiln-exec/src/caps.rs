//! Caps per principal: at most `per_principal` things held by one
//! principal and `total` on the node, counted together and reserved
//! atomically (the check and the reservation are one step under one lock,
//! so two requests at once cannot both take the last place).
//!
//! One mechanism for every face: the kernels registry counts live kernels
//! with it (whatever face started them: the sessions API, seed 004's
//! workers, seed 003's runtime sessions, LibreChat's live runtime
//! sessions), programmatic tool calling counts its runs alive (running or
//! paused). The key is the [`Owner`] — never a name the principal chose —
//! so one caller cannot multiply its share by naming more things.
//!
//! A place is held by a [`CapGuard`] and given back when it drops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use kiln_core::Owner;

/// Why a place was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CapError {
    /// The principal holds its most already.
    #[error("the caller holds {0}, the most allowed")]
    Principal(usize),
    /// The node holds its most already.
    #[error("this node holds {0}, the most allowed")]
    Total(usize),
}

#[derive(Debug, Default)]
struct Held {
    by: HashMap<Owner, usize>,
    total: usize,
}

/// A pair of caps (per principal, on the node) and what is held. Cheap to
/// clone; every clone counts the same places.
#[derive(Debug, Clone)]
pub struct Caps {
    per_principal: usize,
    total: usize,
    held: Arc<Mutex<Held>>,
}

fn lock(m: &Mutex<Held>) -> MutexGuard<'_, Held> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Caps {
    pub fn new(per_principal: usize, total: usize) -> Caps {
        Caps {
            per_principal,
            total,
            held: Arc::default(),
        }
    }

    pub fn per_principal(&self) -> usize {
        self.per_principal
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// Takes a place for `principal`, or says which cap is full (the
    /// principal's first: a caller at its own cap is told so even when the
    /// node is full too).
    pub fn acquire(&self, principal: &Owner) -> Result<CapGuard, CapError> {
        let mut held = lock(&self.held);
        let mine = held.by.get(principal).copied().unwrap_or(0);
        if mine >= self.per_principal {
            return Err(CapError::Principal(mine));
        }
        if held.total >= self.total {
            return Err(CapError::Total(held.total));
        }
        *held.by.entry(principal.clone()).or_default() += 1;
        held.total += 1;
        Ok(CapGuard {
            held: Arc::clone(&self.held),
            principal: principal.clone(),
        })
    }

    /// Places held on the node.
    pub fn held(&self) -> usize {
        lock(&self.held).total
    }

    /// Places `principal` holds.
    pub fn held_by(&self, principal: &Owner) -> usize {
        lock(&self.held).by.get(principal).copied().unwrap_or(0)
    }
}

/// One place held; given back on drop.
#[derive(Debug)]
pub struct CapGuard {
    held: Arc<Mutex<Held>>,
    principal: Owner,
}

impl CapGuard {
    pub fn principal(&self) -> &Owner {
        &self.principal
    }
}

impl Drop for CapGuard {
    fn drop(&mut self) {
        let mut held = lock(&self.held);
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.by.get_mut(&self.principal) {
            *n -= 1;
            if *n == 0 {
                held.by.remove(&self.principal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use kiln_core::access::Caller;

    use super::*;

    fn p(user: &str) -> Owner {
        Owner::of(&Caller::identified("local", user))
    }

    #[test]
    fn a_principal_at_its_cap_is_refused_and_others_are_not() {
        let caps = Caps::new(2, 3);
        let a1 = caps.acquire(&p("a")).expect("a1");
        let _a2 = caps.acquire(&p("a")).expect("a2");
        assert_eq!(caps.acquire(&p("a")).unwrap_err(), CapError::Principal(2));
        let b1 = caps.acquire(&p("b")).expect("b1");
        // the node is full: a newcomer is told so, a capped caller its own cap
        assert_eq!(caps.acquire(&p("c")).unwrap_err(), CapError::Total(3));
        assert_eq!(caps.acquire(&p("a")).unwrap_err(), CapError::Principal(2));
        drop(a1);
        assert_eq!((caps.held(), caps.held_by(&p("a"))), (2, 1));
        let _c1 = caps
            .acquire(&p("c"))
            .expect("a place given back is free again");
        drop(b1);
        assert_eq!(caps.held_by(&p("b")), 0);
    }

    #[test]
    fn concurrent_acquires_never_pass_the_caps() {
        let caps = Caps::new(3, 5);
        let guards: Vec<CapGuard> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..32u32)
                .map(|i| {
                    let caps = caps.clone();
                    s.spawn(move || {
                        caps.acquire(&p(if i.is_multiple_of(2) { "a" } else { "b" }))
                            .ok()
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().expect("thread"))
                .collect()
        });
        assert_eq!(guards.len(), 5);
        assert!(caps.held_by(&p("a")) <= 3 && caps.held_by(&p("b")) <= 3);
        drop(guards);
        assert_eq!(caps.held(), 0);
    }
}
