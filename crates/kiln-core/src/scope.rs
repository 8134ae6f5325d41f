//! Who owns a stored object and who may read it.
//!
//! A storage session is bound at creation to a *session key*:
//! `<tenant>:user:<user>` for a user's files, `<tenant>:agent:<id>` for an
//! agent's files (shared by every user of the tenant), and
//! `<tenant>:skill:<id>:v:<version>` for skill files (shared; a version bump
//! gives a new key). Outputs of a run always belong to the caller's user key.

use std::fmt;

use crate::id::is_resource_id;

/// The caller, as established by authentication and identity hints.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    pub tenant: String,
    pub user_id: String,
}

impl Principal {
    pub fn user_key(&self) -> SessionKey {
        SessionKey(format!("{}:user:{}", self.tenant, self.user_id))
    }
}

/// Ownership kind of uploaded files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    User,
    Agent,
    Skill,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "user" => Some(Kind::User),
            "agent" => Some(Kind::Agent),
            "skill" => Some(Kind::Skill),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Kind::User => "user",
            Kind::Agent => "agent",
            Kind::Skill => "skill",
        }
    }
}

/// Authorization scope of a storage session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    #[error("kind must be one of: skill, agent, user")]
    BadKind,
    #[error("id is required for kind {0}")]
    MissingId(&'static str),
    #[error("id must match ^[A-Za-z0-9_.:-]{{1,128}}$")]
    BadId,
    #[error("version is required for kind skill")]
    MissingVersion,
    #[error("version is only allowed for kind skill")]
    UnexpectedVersion,
    #[error("version must be a non-negative integer")]
    BadVersion,
}

impl SessionKey {
    /// Derive the key for `(kind, id, version)` as seen by `principal`.
    /// For `user`, the id is ignored: a user's files are always the caller's.
    pub fn derive(
        principal: &Principal,
        kind: Kind,
        id: Option<&str>,
        version: Option<&str>,
    ) -> Result<SessionKey, ScopeError> {
        match kind {
            Kind::User => {
                if version.is_some() {
                    return Err(ScopeError::UnexpectedVersion);
                }
                Ok(principal.user_key())
            }
            Kind::Agent => {
                if version.is_some() {
                    return Err(ScopeError::UnexpectedVersion);
                }
                let id = id.ok_or(ScopeError::MissingId("agent"))?;
                if !is_resource_id(id) {
                    return Err(ScopeError::BadId);
                }
                Ok(SessionKey(format!("{}:agent:{id}", principal.tenant)))
            }
            Kind::Skill => {
                let id = id.ok_or(ScopeError::MissingId("skill"))?;
                if !is_resource_id(id) {
                    return Err(ScopeError::BadId);
                }
                let v = version.ok_or(ScopeError::MissingVersion)?;
                let v = parse_version(v)?;
                Ok(SessionKey(format!("{}:skill:{id}:v:{v}", principal.tenant)))
            }
        }
    }

    /// Rebuild a key read back from storage.
    pub fn from_stored(s: String) -> SessionKey {
        SessionKey(s)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Versions arrive as strings (`"3"`) or JSON numbers (`3`, `3.0`).
pub fn parse_version(v: &str) -> Result<u64, ScopeError> {
    let v = v.trim();
    if let Ok(n) = v.parse::<u64>() {
        return Ok(n);
    }
    match v.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f < 9.0e15 => Ok(f as u64),
        _ => Err(ScopeError::BadVersion),
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Principal {
        Principal {
            tenant: "local".into(),
            user_id: "alice".into(),
        }
    }

    #[test]
    fn user_kind_always_means_the_caller() {
        let k = SessionKey::derive(&alice(), Kind::User, Some("bob"), None).unwrap();
        assert_eq!(k.as_str(), "local:user:alice");
    }

    #[test]
    fn agent_and_skill_keys_are_shared_across_users() {
        let bob = Principal {
            tenant: "local".into(),
            user_id: "bob".into(),
        };
        let a1 = SessionKey::derive(&alice(), Kind::Agent, Some("agent_x"), None).unwrap();
        let a2 = SessionKey::derive(&bob, Kind::Agent, Some("agent_x"), None).unwrap();
        assert_eq!(a1, a2);
        let s1 = SessionKey::derive(&alice(), Kind::Skill, Some("sk"), Some("2")).unwrap();
        let s2 = SessionKey::derive(&bob, Kind::Skill, Some("sk"), Some("2.0")).unwrap();
        let s3 = SessionKey::derive(&bob, Kind::Skill, Some("sk"), Some("3")).unwrap();
        assert_eq!(s1, s2);
        assert_ne!(s1, s3);
    }

    #[test]
    fn version_rules() {
        assert_eq!(
            SessionKey::derive(&alice(), Kind::Skill, Some("sk"), None),
            Err(ScopeError::MissingVersion)
        );
        assert_eq!(
            SessionKey::derive(&alice(), Kind::Agent, Some("a"), Some("1")),
            Err(ScopeError::UnexpectedVersion)
        );
        assert_eq!(parse_version("-1"), Err(ScopeError::BadVersion));
        assert_eq!(parse_version("1.5"), Err(ScopeError::BadVersion));
        assert_eq!(
            SessionKey::derive(&alice(), Kind::Agent, Some("a/b"), None),
            Err(ScopeError::BadId)
        );
    }
}
