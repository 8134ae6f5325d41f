//! The one access rule, in two entry points over one core:
//!
//! - [`may`]: may this caller see, use or act for a thing an [`Owner`] owns
//!   (a run, kernel, bridge sandbox, programmatic run or request, MCP
//!   session)? Every face and registry asks it; none compares owners
//!   itself. (Runtime sessions, file workspaces and projects need no check:
//!   their ids are derived from the caller's own `Owner`, so a caller only
//!   ever names its own.)
//! - [`may_read`]: may this caller read something stored under a session
//!   key (a storage session's files, by-reference inputs)? Its case without
//!   a claim is [`may`]'s read rule, widened to the tenant's shared (agent
//!   and skill) keys; [`may_write_stored`] is the write case.
//!
//! [`may`], by [`Action`]:
//! - `Read` (see it or what it produced) and `Control` (evaluate in it, put
//!   or delete its files, interrupt, cancel or close it), named by its
//!   server-minted id: an identified caller only its own; an identity-less
//!   caller anything (ids are 126-bit capabilities) unless the deployment
//!   requires identity (then 401).
//! - `Write` (act in its owner's name where the name is no capability: a
//!   signed continuation, a client-chosen request id, a protocol session):
//!   only its owner, identified or not.
//!
//! A *claim* is the scope a request names for what it reads: an explicit
//! `kind`/`id`/`version` (G2/G3), a G1 `entity_id`, both, or neither.
//!
//! - With a claim: some claimed key must equal the stored key. A scope
//!   claim derives its key as [`SessionKey::derive`] does; an `entity_id`
//!   stands for the caller's own user key when it names the caller, else for
//!   the agent of that id, and — for identity-less callers, whose G1 builds
//!   sent user ids as `entity_id` — for that user too.
//!   An identity-less caller's `user`-kind claim is no claim: it names the
//!   caller's own files, and such a caller has none (see below).
//! - Without a claim: an identified caller may read its own user key and
//!   every agent or skill key of its tenant; an identity-less caller may read
//!   anything (ids are 126-bit capabilities; this is how G1 clients download)
//!   unless the deployment requires identity.
//!
//! Identity is a scoping hint, not a security boundary, unless a verified
//! identity (a JWT) backs it: with auth `none`, any caller can claim any user.

use crate::id::is_resource_id;
use crate::owner::Owner;
use crate::scope::{Kind, Principal, ScopeError, SessionKey};

/// Who is asking: the principal and whether any identity source named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub principal: Principal,
    /// False when no identity source was present (user `anonymous`).
    pub identified: bool,
}

/// User id of callers no identity source named.
pub const ANONYMOUS: &str = "anonymous";

impl Caller {
    /// A caller an identity source named.
    pub fn identified(tenant: &str, user_id: &str) -> Caller {
        Caller {
            principal: Principal {
                tenant: tenant.to_owned(),
                user_id: user_id.to_owned(),
            },
            identified: true,
        }
    }

    /// A caller without identity: user [`ANONYMOUS`].
    pub fn anonymous(tenant: &str) -> Caller {
        Caller {
            principal: Principal {
                tenant: tenant.to_owned(),
                user_id: ANONYMOUS.to_owned(),
            },
            identified: false,
        }
    }
}

/// The scope a request names for what it reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claim {
    /// `kind` with its `id` and `version` (strings as sent).
    pub scope: Option<(Kind, Option<String>, Option<String>)>,
    /// G1's `entity_id`.
    pub entity_id: Option<String>,
}

impl Claim {
    /// No claim: the caller's identity decides.
    pub fn none() -> Claim {
        Claim::default()
    }

    pub fn is_none(&self) -> bool {
        self.scope.is_none() && self.entity_id.is_none()
    }
}

/// Why a read is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// The claim is malformed (a bad kind/id/version or entity id): 400.
    #[error(transparent)]
    BadClaim(#[from] ScopeError),
    /// The deployment requires an identity and the caller has none: 401.
    #[error("a user identity is required")]
    IdentityRequired,
    /// The caller may not read it: 403.
    #[error("not readable by the caller")]
    Forbidden,
}

/// Deployment-wide setting the rule depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Policy {
    /// Refuse identity-less reads without a claim.
    pub require_identity: bool,
}

/// May `caller`, naming `claim`, read what is stored under `stored`?
pub fn may_read(
    policy: Policy,
    caller: &Caller,
    claim: &Claim,
    stored: &SessionKey,
) -> Result<(), Denied> {
    if !claim.is_none() && !claims_nothing(caller, claim) {
        let mut keys = Vec::new();
        if let Some((kind, id, version)) = &claim.scope {
            keys.push(SessionKey::derive(
                &caller.principal,
                *kind,
                id.as_deref(),
                version.as_deref(),
            )?);
        }
        if let Some(entity) = &claim.entity_id {
            keys.extend(entity_keys(caller, entity)?);
        }
        return if keys.iter().any(|k| k == stored) {
            Ok(())
        } else {
            Err(Denied::Forbidden)
        };
    }
    identity_decides(policy, caller, |p| {
        let s = stored.as_str();
        let shared = s.starts_with(&format!("{}:agent:", p.tenant))
            || s.starts_with(&format!("{}:skill:", p.tenant));
        *stored == p.user_key() || shared
    })
}

/// What a caller does with an owned thing (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// See it or what it produced, named by its server-minted id.
    Read,
    /// Act in its owner's name where the name is no capability (a signed
    /// continuation, a client-chosen request id, a protocol session): its
    /// owner only.
    Write,
    /// Use or end it, named by its server-minted id: evaluate in it, put or
    /// delete its files, interrupt, cancel, close.
    Control,
}

/// May `caller` do `action` to a thing `owner` owns? The one rule for
/// runs, kernels, runtime sessions, projects, sandboxes, programmatic runs
/// and MCP sessions. Refuses with `Forbidden` (the face picks 403 or 404)
/// or `IdentityRequired` (401).
pub fn may(policy: Policy, caller: &Caller, action: Action, owner: &Owner) -> Result<(), Denied> {
    let own = |p: &Principal| p == owner.principal();
    match action {
        Action::Read | Action::Control => identity_decides(policy, caller, own),
        Action::Write if own(&caller.principal) => Ok(()),
        Action::Write => Err(Denied::Forbidden),
    }
}

/// May `caller` write into the storage session whose key is `stored`
/// (upload into it, add a run's outputs to it)? Only into its own user
/// key's, identified or not: agent and skill sessions are written by
/// whoever created them, under their own new session.
pub fn may_write_stored(caller: &Caller, stored: &SessionKey) -> Result<(), Denied> {
    if *stored == Owner::of(caller).key() {
        Ok(())
    } else {
        Err(Denied::Forbidden)
    }
}

/// The core of both rules without a claim: an identified caller reaches
/// what `own` says is its own; an identity-less caller anything, unless the
/// deployment requires identity.
fn identity_decides(
    policy: Policy,
    caller: &Caller,
    own: impl FnOnce(&Principal) -> bool,
) -> Result<(), Denied> {
    if caller.identified {
        if own(&caller.principal) {
            Ok(())
        } else {
            Err(Denied::Forbidden)
        }
    } else if policy.require_identity {
        Err(Denied::IdentityRequired)
    } else {
        Ok(())
    }
}

/// A `user`-kind claim names the caller's own files; an identity-less
/// caller has none, so such a claim (with no `entity_id` beside it) says
/// nothing and the caller reads as one without a claim: ids are
/// capabilities, unless the deployment requires identity. This is how
/// LibreChat's programmatic tools pass on files of earlier calls: they send
/// no user, and their refs say `kind: "user"` with the file's id as
/// `resource_id`. A verified or hinted identity is never affected.
fn claims_nothing(caller: &Caller, claim: &Claim) -> bool {
    !caller.identified
        && claim.entity_id.is_none()
        && matches!(claim.scope, Some((Kind::User, _, _)))
}

/// The keys a G1 `entity_id` may stand for (see the module docs).
pub fn entity_keys(caller: &Caller, entity_id: &str) -> Result<Vec<SessionKey>, ScopeError> {
    if !is_resource_id(entity_id) {
        return Err(ScopeError::BadId);
    }
    let p = &caller.principal;
    if caller.identified && p.user_id == entity_id {
        return Ok(vec![p.user_key()]);
    }
    let agent = SessionKey::derive(p, Kind::Agent, Some(entity_id), None)?;
    if caller.identified {
        Ok(vec![agent])
    } else {
        let as_user = Principal {
            tenant: p.tenant.clone(),
            user_id: entity_id.to_owned(),
        };
        Ok(vec![agent, as_user.user_key()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(user: &str) -> Caller {
        Caller::identified("local", user)
    }

    fn anonymous() -> Caller {
        Caller::anonymous("local")
    }

    fn key(s: &str) -> SessionKey {
        SessionKey::from_stored(s.to_owned())
    }

    fn scope(kind: Kind, id: Option<&str>) -> Claim {
        Claim {
            scope: Some((kind, id.map(Into::into), None)),
            entity_id: None,
        }
    }

    fn entity(e: &str) -> Claim {
        Claim {
            scope: None,
            entity_id: Some(e.into()),
        }
    }

    const OPEN: Policy = Policy {
        require_identity: false,
    };

    #[test]
    fn a_scope_claim_must_derive_the_stored_key() {
        let alice = caller("alice");
        let own = key("local:user:alice");
        assert!(may_read(OPEN, &alice, &scope(Kind::User, None), &own).is_ok());
        // a user claim always means the caller, whatever id it names
        let bob = caller("bob");
        assert_eq!(
            may_read(OPEN, &bob, &scope(Kind::User, Some("alice")), &own),
            Err(Denied::Forbidden)
        );
        let agent = key("local:agent:agent_x");
        assert!(may_read(OPEN, &bob, &scope(Kind::Agent, Some("agent_x")), &agent).is_ok());
        assert!(matches!(
            may_read(OPEN, &bob, &scope(Kind::Agent, Some("a/b")), &agent),
            Err(Denied::BadClaim(_))
        ));
    }

    #[test]
    fn an_entity_claim_means_the_agent_or_the_callers_own_user_key() {
        let alice = caller("alice");
        assert!(may_read(OPEN, &alice, &entity("alice"), &key("local:user:alice")).is_ok());
        assert!(may_read(OPEN, &alice, &entity("alice"), &key("local:agent:alice")).is_err());
        assert!(may_read(OPEN, &alice, &entity("ag"), &key("local:agent:ag")).is_ok());
        // identity-less G1 callers sent user ids as entity_id
        let anon = anonymous();
        assert!(may_read(OPEN, &anon, &entity("alice"), &key("local:user:alice")).is_ok());
        assert!(may_read(OPEN, &anon, &entity("alice"), &key("local:agent:alice")).is_ok());
        assert!(may_read(OPEN, &anon, &entity("bob"), &key("local:user:alice")).is_err());
    }

    #[test]
    fn either_claimed_key_may_match() {
        let alice = caller("alice");
        let both = Claim {
            scope: Some((Kind::User, None, None)),
            entity_id: Some("agent_x".into()),
        };
        assert!(may_read(OPEN, &alice, &both, &key("local:agent:agent_x")).is_ok());
        assert!(may_read(OPEN, &alice, &both, &key("local:user:alice")).is_ok());
        assert!(may_read(OPEN, &alice, &both, &key("local:user:bob")).is_err());
    }

    #[test]
    fn without_a_claim_identity_decides() {
        let alice = caller("alice");
        let none = Claim::none();
        assert!(may_read(OPEN, &alice, &none, &key("local:user:alice")).is_ok());
        assert!(may_read(OPEN, &alice, &none, &key("local:agent:a")).is_ok());
        assert!(may_read(OPEN, &alice, &none, &key("local:skill:k:v:1")).is_ok());
        assert!(may_read(OPEN, &alice, &none, &key("local:user:bob")).is_err());
        assert!(may_read(OPEN, &alice, &none, &key("other:agent:a")).is_err());
        assert!(may_read(OPEN, &anonymous(), &none, &key("local:user:bob")).is_ok());
        let strict = Policy {
            require_identity: true,
        };
        assert_eq!(
            may_read(strict, &anonymous(), &none, &key("local:user:bob")),
            Err(Denied::IdentityRequired)
        );
    }

    #[test]
    fn an_identity_less_callers_user_claim_reads_as_no_claim() {
        // LibreChat's programmatic tools send no user; their refs say
        // kind user with the file id as resource_id
        let anon = anonymous();
        let user_claim = scope(Kind::User, Some("V1StGXR8_Z5jdHi6B-myT"));
        let stored = key("local:user:e2e-user-1");
        assert!(may_read(OPEN, &anon, &user_claim, &stored).is_ok());
        let strict = Policy {
            require_identity: true,
        };
        assert_eq!(
            may_read(strict, &anon, &user_claim, &stored),
            Err(Denied::IdentityRequired)
        );
        // an identity (hinted or verified) keeps its own files only
        assert_eq!(
            may_read(OPEN, &caller("bob"), &user_claim, &stored),
            Err(Denied::Forbidden)
        );
        // other kinds still name what they claim
        assert_eq!(
            may_read(OPEN, &anon, &scope(Kind::Agent, Some("agent_x")), &stored),
            Err(Denied::Forbidden)
        );
        // and an entity_id beside it is still the whole claim
        let with_entity = Claim {
            scope: Some((Kind::User, None, None)),
            entity_id: Some("bob".into()),
        };
        assert_eq!(
            may_read(OPEN, &anon, &with_entity, &stored),
            Err(Denied::Forbidden)
        );
    }

    fn owner(user: &str) -> Owner {
        Owner::of(&caller(user))
    }

    const STRICT: Policy = Policy {
        require_identity: true,
    };

    #[test]
    fn an_identified_caller_reads_and_controls_only_its_own() {
        for action in [Action::Read, Action::Control] {
            assert_eq!(may(OPEN, &caller("alice"), action, &owner("alice")), Ok(()));
            assert_eq!(
                may(OPEN, &caller("bob"), action, &owner("alice")),
                Err(Denied::Forbidden)
            );
            // the tenant is part of the owner
            assert_eq!(
                may(
                    OPEN,
                    &Caller::identified("other", "alice"),
                    action,
                    &owner("alice")
                ),
                Err(Denied::Forbidden)
            );
            // requiring identity changes nothing for an identified caller
            assert_eq!(
                may(STRICT, &caller("alice"), action, &owner("alice")),
                Ok(())
            );
        }
    }

    #[test]
    fn an_identity_less_caller_reads_and_controls_by_id_unless_identity_is_required() {
        for action in [Action::Read, Action::Control] {
            assert_eq!(may(OPEN, &anonymous(), action, &owner("alice")), Ok(()));
            assert_eq!(
                may(OPEN, &anonymous(), action, &Owner::of(&anonymous())),
                Ok(())
            );
            assert_eq!(
                may(STRICT, &anonymous(), action, &owner("alice")),
                Err(Denied::IdentityRequired)
            );
            assert_eq!(
                may(STRICT, &anonymous(), action, &Owner::of(&anonymous())),
                Err(Denied::IdentityRequired)
            );
        }
    }

    #[test]
    fn only_the_owner_writes_identified_or_not() {
        for policy in [OPEN, STRICT] {
            assert_eq!(
                may(policy, &caller("alice"), Action::Write, &owner("alice")),
                Ok(())
            );
            assert_eq!(
                may(policy, &caller("bob"), Action::Write, &owner("alice")),
                Err(Denied::Forbidden)
            );
            assert_eq!(
                may(policy, &anonymous(), Action::Write, &owner("alice")),
                Err(Denied::Forbidden)
            );
            assert_eq!(
                may(
                    policy,
                    &anonymous(),
                    Action::Write,
                    &Owner::of(&anonymous())
                ),
                Ok(())
            );
            // an identified caller named `anonymous` is the same principal
            assert_eq!(
                may(
                    policy,
                    &caller(ANONYMOUS),
                    Action::Write,
                    &Owner::of(&anonymous())
                ),
                Ok(())
            );
        }
    }

    #[test]
    fn a_storage_session_is_written_only_under_the_callers_own_user_key() {
        assert_eq!(
            may_write_stored(&caller("alice"), &key("local:user:alice")),
            Ok(())
        );
        assert_eq!(
            may_write_stored(&caller("bob"), &key("local:user:alice")),
            Err(Denied::Forbidden)
        );
        assert_eq!(
            may_write_stored(&caller("alice"), &key("local:agent:alice")),
            Err(Denied::Forbidden)
        );
        assert_eq!(
            may_write_stored(&anonymous(), &key("local:user:anonymous")),
            Ok(())
        );
        assert_eq!(
            may_write_stored(&anonymous(), &key("local:user:alice")),
            Err(Denied::Forbidden)
        );
    }
}
