//! Who is calling ([`Caller`]) and whether they may read a storage session
//! ([`authorize_session`]).
//!
//! Identity sources, first hit wins: `User-Id` header → (for `/exec`) body
//! `user_id` → `kind=user` + `id` (query, or upload form) → none. Without any
//! the caller is "identity-less" and acts as user `anonymous`.
//!
//! Session reads (download, list, metadata, delete) are authorized as
//! follows. A *claim* is a scope the request names: `kind`/`id`/`version`
//! (G2/G3) or `entity_id` (G1). With a claim, the claimed key must equal the
//! session's stored key (403 otherwise). Without a claim, an identified caller
//! may read its own user sessions and any agent/skill session of its tenant;
//! an identity-less caller may read any session (ids are 126-bit
//! capabilities; this is how G1 clients download) unless `require_identity`
//! is on (401). Identity is a scoping hint here, not a security boundary:
//! with auth `none` any caller can claim any user id.

use axum::http::HeaderMap;
use kiln_core::id::is_resource_id;
use kiln_core::{Kind, Nanoid, Principal, SessionKey};
use serde::Deserialize;

use crate::config::ApiConfig;
use crate::error::ApiError;

/// User id of identity-less callers.
pub const ANONYMOUS: &str = "anonymous";

/// The caller of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub principal: Principal,
    /// False when no identity source was present (user `anonymous`).
    pub identified: bool,
}

impl Caller {
    pub fn identified(tenant: &str, user_id: &str) -> Caller {
        Caller {
            principal: Principal {
                tenant: tenant.to_owned(),
                user_id: user_id.to_owned(),
            },
            identified: true,
        }
    }

    pub fn anonymous(tenant: &str) -> Caller {
        Caller {
            principal: Principal {
                tenant: tenant.to_owned(),
                user_id: ANONYMOUS.to_owned(),
            },
            identified: false,
        }
    }

    /// Resolve from candidate user ids in priority order (`None` = source
    /// absent). Enforces `require_identity`.
    pub fn resolve(config: &ApiConfig, candidates: &[Option<&str>]) -> Result<Caller, ApiError> {
        if let Some(c) = candidates.iter().flatten().next() {
            check_user_id(c)?;
            return Ok(Caller::identified(&config.tenant, c));
        }
        if config.require_identity {
            return Err(ApiError::IdentityRequired);
        }
        Ok(Caller::anonymous(&config.tenant))
    }
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
#[derive(Debug, Default, Deserialize)]
pub struct ScopeQuery {
    pub kind: Option<String>,
    pub id: Option<String>,
    pub version: Option<String>,
    pub entity_id: Option<String>,
    /// `/files/{sid}` only: the listing shape.
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

    /// The caller of a session route: `User-Id`, then `kind=user&id=`.
    pub fn caller(&self, config: &ApiConfig, headers: &HeaderMap) -> Result<Caller, ApiError> {
        Caller::resolve(config, &[header_user_id(headers)?, self.user_hint()])
    }
}

/// Derive the key for an explicit `kind`/`id`/`version` triple.
pub fn derive_key(
    principal: &Principal,
    kind: &str,
    id: Option<&str>,
    version: Option<&str>,
) -> Result<SessionKey, ApiError> {
    let kind = Kind::parse(kind).ok_or_else(|| {
        ApiError::BadRequest("kind must be one of: skill, agent, user".to_owned())
    })?;
    SessionKey::derive(principal, kind, id, version)
        .map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// Keys an `entity_id` (G1) may stand for: the caller's own user key when
/// it names the caller, else the agent key; identity-less callers may mean
/// either (a later G1 build sent the user id as `entity_id`).
pub fn entity_keys(caller: &Caller, entity_id: &str) -> Result<Vec<SessionKey>, ApiError> {
    if !is_resource_id(entity_id) {
        return Err(ApiError::BadRequest(
            "entity_id must match ^[A-Za-z0-9_.:-]{1,128}$".to_owned(),
        ));
    }
    let p = &caller.principal;
    if caller.identified && p.user_id == entity_id {
        return Ok(vec![p.user_key()]);
    }
    let agent = SessionKey::derive(p, Kind::Agent, Some(entity_id), None)
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
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

/// May `caller`, naming `query`, read the session whose stored key is
/// `stored`? See the module docs for the rules.
pub fn authorize_session(
    config: &ApiConfig,
    caller: &Caller,
    query: &ScopeQuery,
    session: &Nanoid,
    stored: &SessionKey,
) -> Result<(), ApiError> {
    let forbidden = || ApiError::SessionForbidden {
        session: session.clone(),
    };
    if let Some(kind) = query.kind.as_deref() {
        let claimed = derive_key(
            &caller.principal,
            kind,
            query.id.as_deref(),
            query.version.as_deref(),
        )?;
        return if &claimed == stored {
            Ok(())
        } else {
            Err(forbidden())
        };
    }
    if let Some(entity) = query.entity_id.as_deref() {
        let keys = entity_keys(caller, entity)?;
        return if keys.iter().any(|k| k == stored) {
            Ok(())
        } else {
            Err(forbidden())
        };
    }
    if caller.identified {
        let tenant = &caller.principal.tenant;
        let s = stored.as_str();
        let shared = s.starts_with(&format!("{tenant}:agent:"))
            || s.starts_with(&format!("{tenant}:skill:"));
        if stored == &caller.principal.user_key() || shared {
            Ok(())
        } else {
            Err(forbidden())
        }
    } else if config.require_identity {
        Err(ApiError::IdentityRequired)
    } else {
        Ok(())
    }
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
        let c = Caller::resolve(&cfg(), &[None, Some("bob"), Some("carol")]).unwrap();
        assert_eq!(c, Caller::identified("local", "bob"));
        let c = Caller::resolve(&cfg(), &[None, None]).unwrap();
        assert_eq!(c, Caller::anonymous("local"));
        assert!(!c.identified);
    }

    #[test]
    fn resolve_rejects_malformed_ids_and_enforces_require_identity() {
        assert!(matches!(
            Caller::resolve(&cfg(), &[Some("a/b")]),
            Err(ApiError::BadRequest(_))
        ));
        let strict = ApiConfig {
            require_identity: true,
            ..cfg()
        };
        assert!(matches!(
            Caller::resolve(&strict, &[None]),
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
