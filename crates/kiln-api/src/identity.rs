//! Who is calling ([`Caller`]) and whether they may read a storage session
//! ([`authorize_session`]), for every face.
//!
//! Identity sources, first hit wins: a verified token ([`Identity`], set by
//! the auth middleware; when there is one, nothing else is asked) →
//! `User-Id` header → (for `/exec`) body `user_id` → `kind=user` + `id`
//! (query, or upload form) → none. Without any the caller is
//! "identity-less" and acts as user `anonymous`.
//!
//! Whether a caller may read a session is the one access rule of
//! `kiln_core::access` (the executor asks the same rule about by-reference
//! inputs): this module only turns a request's `kind`/`id`/`version` and
//! `entity_id` into a claim and the rule's refusals into envelopes.

use axum::http::HeaderMap;
use kiln_core::access::{Action, Claim, Denied, Policy, may, may_read};
use kiln_core::id::is_resource_id;
use kiln_core::{Kind, Nanoid, Owner, Principal, SessionKey};
use serde::Deserialize;

pub use kiln_core::access::{ANONYMOUS, Caller};

use crate::config::ApiConfig;
use crate::error::ApiError;

/// The caller a verified token named, if the request carried one: the
/// auth middleware puts it in the request's extensions, handlers extract it.
/// With one, the request's identity hints are never read, so with JWT the
/// identity is a security boundary.
#[derive(Debug, Clone, Default)]
pub struct Identity(pub Option<Caller>);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Identity {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Identity>()
            .cloned()
            .unwrap_or_default())
    }
}

/// The caller: the verified one, else the first of the candidate user ids
/// in priority order (`None` = source absent). Enforces `require_identity`.
pub fn resolve_caller(
    config: &ApiConfig,
    verified: &Identity,
    candidates: &[Option<&str>],
) -> Result<Caller, ApiError> {
    if let Some(c) = &verified.0 {
        return Ok(c.clone());
    }
    if let Some(c) = candidates.iter().flatten().next() {
        check_user_id(c)?;
        return Ok(Caller::identified(&config.tenant, c));
    }
    if config.require_identity {
        return Err(ApiError::IdentityRequired);
    }
    Ok(Caller::anonymous(&config.tenant))
}

fn check_user_id(id: &str) -> Result<(), ApiError> {
    if is_resource_id(id) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(
            "user id must match ^[A-Za-z0-9_.:-]{1,128}$".to_owned(),
        ))
    }
}

/// The `User-Id` header, if present and non-empty.
pub fn header_user_id(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    match headers.get("user-id") {
        None => Ok(None),
        Some(v) => {
            let s = v
                .to_str()
                .map_err(|_| ApiError::BadRequest("User-Id header must be ASCII".to_owned()))?
                .trim();
            Ok((!s.is_empty()).then_some(s))
        }
    }
}

/// Scope parameters of a session route's query string.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ScopeQuery {
    /// Claimed scope: `user`, `agent` or `skill`.
    pub kind: Option<String>,
    /// The scope's id (agent or skill id; with `kind=user` an identity hint).
    pub id: Option<String>,
    /// Skill version.
    pub version: Option<String>,
    /// G1: the agent (or user) the files belong to.
    pub entity_id: Option<String>,
    /// `GET /files/{session_id}` only: `simple` (keys), `summary`, `full` or `normalized`.
    pub detail: Option<String>,
}

impl ScopeQuery {
    /// `id` when `kind=user`: an identity source.
    pub fn user_hint(&self) -> Option<&str> {
        match (self.kind.as_deref(), self.id.as_deref()) {
            (Some("user"), Some(id)) if !id.is_empty() => Some(id),
            _ => None,
        }
    }

    /// The caller of a session route: the verified one, else `User-Id`,
    /// then `kind=user&id=`.
    pub fn caller(
        &self,
        config: &ApiConfig,
        verified: &Identity,
        headers: &HeaderMap,
    ) -> Result<Caller, ApiError> {
        resolve_caller(
            config,
            verified,
            &[header_user_id(headers)?, self.user_hint()],
        )
    }

    /// The claim these parameters make: `kind` (with `id`, `version`) or
    /// `entity_id`; an explicit kind is the whole claim.
    pub fn claim(&self) -> Result<Claim, ApiError> {
        if let Some(kind) = self.kind.as_deref() {
            return Ok(Claim {
                scope: Some((parse_kind(kind)?, self.id.clone(), self.version.clone())),
                entity_id: None,
            });
        }
        if let Some(entity) = self.entity_id.as_deref() {
            check_entity_id(entity)?;
            return Ok(Claim {
                scope: None,
                entity_id: Some(entity.to_owned()),
            });
        }
        Ok(Claim::none())
    }
}

fn parse_kind(kind: &str) -> Result<Kind, ApiError> {
    Kind::parse(kind)
        .ok_or_else(|| ApiError::BadRequest("kind must be one of: skill, agent, user".to_owned()))
}

fn check_entity_id(entity_id: &str) -> Result<(), ApiError> {
    if is_resource_id(entity_id) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(
            "entity_id must match ^[A-Za-z0-9_.:-]{1,128}$".to_owned(),
        ))
    }
}

/// Derive the key for an explicit `kind`/`id`/`version` triple.
pub fn derive_key(
    principal: &Principal,
    kind: &str,
    id: Option<&str>,
    version: Option<&str>,
) -> Result<SessionKey, ApiError> {
    SessionKey::derive(principal, parse_kind(kind)?, id, version)
        .map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// Keys an `entity_id` (G1) may stand for (see `kiln_core::access`).
pub fn entity_keys(caller: &Caller, entity_id: &str) -> Result<Vec<SessionKey>, ApiError> {
    check_entity_id(entity_id)?;
    kiln_core::access::entity_keys(caller, entity_id)
        .map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// The deployment's access policy.
pub fn policy(config: &ApiConfig) -> Policy {
    Policy {
        require_identity: config.require_identity,
    }
}

/// May `caller`, naming `claim`, read what `session`'s stored key
/// `stored` owns? The access rule's refusals as envelopes.
pub fn authorize(
    config: &ApiConfig,
    caller: &Caller,
    claim: &Claim,
    session: &Nanoid,
    stored: &SessionKey,
) -> Result<(), ApiError> {
    may_read(policy(config), caller, claim, stored).map_err(|d| refusal(d, session))
}

/// A refusal of the access rule about `id` as an envelope.
fn refusal(denied: Denied, id: &Nanoid) -> ApiError {
    match denied {
        Denied::BadClaim(e) => ApiError::BadRequest(e.to_string()),
        Denied::IdentityRequired => ApiError::IdentityRequired,
        Denied::Forbidden => ApiError::SessionForbidden {
            session: id.clone(),
        },
    }
}

/// May `caller` do `action` to the thing `id` that `owner` owns (a run, a
/// kernel, a sandbox)? The one access rule's refusals as envelopes: not
/// the caller's is `SessionForbidden` (403; a face that hides others'
/// things maps it to its 404).
pub fn authorize_owned(
    config: &ApiConfig,
    caller: &Caller,
    action: Action,
    id: &Nanoid,
    owner: &Owner,
) -> Result<(), ApiError> {
    may(policy(config), caller, action, owner).map_err(|d| refusal(d, id))
}

/// May `caller`, naming `query`, read the session whose stored key is
/// `stored`?
pub fn authorize_session(
    config: &ApiConfig,
    caller: &Caller,
    query: &ScopeQuery,
    session: &Nanoid,
    stored: &SessionKey,
) -> Result<(), ApiError> {
    authorize(config, caller, &query.claim()?, session, stored)
}

/// Parse a path/ref id as a nanoid (400 `Bad request` otherwise).
pub fn parse_id(s: &str) -> Result<Nanoid, ApiError> {
    Nanoid::parse(s).map_err(|_| ApiError::MalformedId)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ApiConfig {
        ApiConfig::default()
    }

    fn key(s: &str) -> SessionKey {
        SessionKey::from_stored(s.to_owned())
    }

    fn sid() -> Nanoid {
        Nanoid::random()
    }

    fn q(kind: Option<&str>, id: Option<&str>, entity: Option<&str>) -> ScopeQuery {
        ScopeQuery {
            kind: kind.map(Into::into),
            id: id.map(Into::into),
            version: None,
            entity_id: entity.map(Into::into),
            detail: None,
        }
    }

    #[test]
    fn resolve_takes_the_first_present_source() {
        let c = resolve_caller(
            &cfg(),
            &Identity::default(),
            &[None, Some("bob"), Some("carol")],
        )
        .unwrap();
        assert_eq!(c, Caller::identified("local", "bob"));
        let c = resolve_caller(&cfg(), &Identity::default(), &[None, None]).unwrap();
        assert_eq!(c, Caller::anonymous("local"));
        assert!(!c.identified);
    }

    #[test]
    fn a_verified_caller_wins_over_every_hint() {
        let token = Identity(Some(Caller::identified("t1", "alice")));
        let c = resolve_caller(&cfg(), &token, &[Some("mallory")]).unwrap();
        assert_eq!(c, Caller::identified("t1", "alice"));
    }

    #[test]
    fn resolve_rejects_malformed_ids_and_enforces_require_identity() {
        assert!(matches!(
            resolve_caller(&cfg(), &Identity::default(), &[Some("a/b")]),
            Err(ApiError::BadRequest(_))
        ));
        let strict = ApiConfig {
            require_identity: true,
            ..cfg()
        };
        assert!(matches!(
            resolve_caller(&strict, &Identity::default(), &[None]),
            Err(ApiError::IdentityRequired)
        ));
    }

    #[test]
    fn claims_must_match_the_stored_key() {
        let alice = Caller::identified("local", "alice");
        let s = sid();
        let stored = key("local:user:alice");
        assert!(
            authorize_session(&cfg(), &alice, &q(Some("user"), None, None), &s, &stored).is_ok()
        );
        let bob = Caller::identified("local", "bob");
        assert!(matches!(
            authorize_session(
                &cfg(),
                &bob,
                &q(Some("user"), Some("bob"), None),
                &s,
                &stored
            ),
            Err(ApiError::SessionForbidden { .. })
        ));
        let agent = key("local:agent:agent_x");
        assert!(
            authorize_session(
                &cfg(),
                &bob,
                &q(Some("agent"), Some("agent_x"), None),
                &s,
                &agent
            )
            .is_ok()
        );
        assert!(matches!(
            authorize_session(&cfg(), &bob, &q(Some("robot"), Some("x"), None), &s, &agent),
            Err(ApiError::BadRequest(_))
        ));
    }

    #[test]
    fn entity_id_means_agent_or_the_callers_own_user_scope() {
        let s = sid();
        let alice = Caller::identified("local", "alice");
        let user = key("local:user:alice");
        let agent = key("local:agent:alice");
        assert!(
            authorize_session(&cfg(), &alice, &q(None, None, Some("alice")), &s, &user).is_ok()
        );
        assert!(
            authorize_session(&cfg(), &alice, &q(None, None, Some("alice")), &s, &agent).is_err()
        );
        let anon = Caller::anonymous("local");
        assert!(authorize_session(&cfg(), &anon, &q(None, None, Some("alice")), &s, &user).is_ok());
        assert!(
            authorize_session(&cfg(), &anon, &q(None, None, Some("alice")), &s, &agent).is_ok()
        );
        assert!(authorize_session(&cfg(), &anon, &q(None, None, Some("bob")), &s, &user).is_err());
    }

    #[test]
    fn unclaimed_reads_follow_identity() {
        let s = sid();
        let none = q(None, None, None);
        let alice = Caller::identified("local", "alice");
        assert!(authorize_session(&cfg(), &alice, &none, &s, &key("local:user:alice")).is_ok());
        assert!(authorize_session(&cfg(), &alice, &none, &s, &key("local:agent:a")).is_ok());
        assert!(authorize_session(&cfg(), &alice, &none, &s, &key("local:skill:k:v:1")).is_ok());
        assert!(authorize_session(&cfg(), &alice, &none, &s, &key("local:user:bob")).is_err());
        assert!(authorize_session(&cfg(), &alice, &none, &s, &key("other:agent:a")).is_err());
        let anon = Caller::anonymous("local");
        assert!(authorize_session(&cfg(), &anon, &none, &s, &key("local:user:bob")).is_ok());
        let strict = ApiConfig {
            require_identity: true,
            ..cfg()
        };
        assert!(matches!(
            authorize_session(&strict, &anon, &none, &s, &key("local:user:bob")),
            Err(ApiError::IdentityRequired)
        ));
    }
}
