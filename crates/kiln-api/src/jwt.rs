//! LibreChat's CodeAPI token (spec §2.2): a short-lived JWT LibreChat mints
//! per user when `CODEAPI_AUTH_PROVIDER=librechat-jwt` (or `both`), sent as
//! `Authorization: Bearer`. With auth `jwt` Kiln verifies it here and takes
//! the caller from it alone.
//!
//! What is checked, in order (any failure is 401 `Invalid bearer token`;
//! the reason is logged, never the token):
//! - the header: `alg` one of `EdDSA`, `RS256`, `HS256` and in the
//!   configured allow-list; `typ` absent or `JWT`; `kid` present and naming
//!   a configured key whose family fits the `alg` (an HMAC secret only for
//!   `HS256`, so a public key can never be used as an HMAC secret) and whose
//!   JWK `alg`, if it has one, is that `alg`;
//! - the signature (jsonwebtoken, on ring);
//! - the claims: `iss` equal to the configured issuer; `aud` a string equal
//!   to the audience or an array of strings containing it; `sub` a user id
//!   Kiln accepts; `jti` non-empty, at most 256 characters; `iat`, `nbf`,
//!   `exp` numbers with `exp` not past (`exp > now - skew`), `nbf` and `iat`
//!   not ahead (`<= now + skew`), `exp > iat` and a lifetime `exp - iat` of
//!   at most the configured maximum (≤ 300 s); skew ≤ 30 s;
//!   `principal_source` `librechat_jwt` or `openid_reuse`;
//!   `auth_context_hash` a non-empty string (its value is LibreChat's
//!   business, as for the official server); `tenant_id` optional (the
//!   configured tenant when absent, unless tenants are required) and free of
//!   `:` since it prefixes session keys.

use std::collections::HashMap;
use std::path::Path;

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use kiln_core::id::is_resource_id;
use serde_json::Value;

/// Longest accepted `jti`.
const MAX_JTI: usize = 256;
/// Most clock skew one can configure, in seconds.
pub const MAX_SKEW_SECS: u64 = 30;
/// Longest token lifetime one can configure, in seconds.
pub const MAX_LIFETIME_SECS: u64 = 300;

/// What kind of key a `kid` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Hmac,
    Ed,
    Rsa,
}

impl Family {
    fn alg(self) -> Algorithm {
        match self {
            Family::Hmac => Algorithm::HS256,
            Family::Ed => Algorithm::EdDSA,
            Family::Rsa => Algorithm::RS256,
        }
    }
}

struct Key {
    family: Family,
    /// A JWK's own `alg`, when it names one.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

/// Why the operator's key configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JwtConfigError {
    #[error("JWKS JSON is invalid: {0}")]
    Jwks(String),
    #[error("JWT key {kid}: {reason}")]
    Key { kid: String, reason: String },
    #[error("JWT public key directory {dir}: {reason}")]
    Dir { dir: String, reason: String },
    #[error("no JWT verification key is configured")]
    NoKeys,
    #[error("JWT allowed algorithm {0:?} is not one of EdDSA, RS256, HS256")]
    UnknownAlg(String),
}

/// The keys tokens may be signed with, by `kid`.
#[derive(Default)]
pub struct JwtKeys {
    keys: HashMap<String, Key>,
}

impl std::fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut kids: Vec<&String> = self.keys.keys().collect();
        kids.sort();
        f.debug_struct("JwtKeys").field("kids", &kids).finish()
    }
}

impl JwtKeys {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn has_hmac(&self) -> bool {
        self.keys.values().any(|k| k.family == Family::Hmac)
    }

    /// Every key with a `kid` of a JWKS document (`{"keys": [...]}`):
    /// Ed25519 (`OKP`) and RSA public keys.
    pub fn add_jwks(&mut self, json: &str) -> Result<(), JwtConfigError> {
        let set: JwkSet =
            serde_json::from_str(json).map_err(|e| JwtConfigError::Jwks(e.to_string()))?;
        for jwk in &set.keys {
            let Some(kid) = jwk.common.key_id.clone() else {
                continue;
            };
            let family = match &jwk.algorithm {
                AlgorithmParameters::OctetKeyPair(_) => Family::Ed,
                AlgorithmParameters::RSA(_) => Family::Rsa,
                _ => {
                    return Err(JwtConfigError::Key {
                        kid,
                        reason: "only Ed25519 (OKP) and RSA keys are accepted".into(),
                    });
                }
            };
            let alg = match jwk.common.key_algorithm {
                None => None,
                Some(KeyAlgorithm::EdDSA) => Some(Algorithm::EdDSA),
                Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
                Some(other) => {
                    return Err(JwtConfigError::Key {
                        kid,
                        reason: format!("alg {other:?} is not accepted"),
                    });
                }
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| JwtConfigError::Key {
                kid: kid.clone(),
                reason: e.to_string(),
            })?;
            self.keys.insert(kid, Key { family, alg, key });
        }
        Ok(())
    }

    /// One public key in PEM (`PUBLIC KEY` of Ed25519 or RSA, or `RSA
    /// PUBLIC KEY`), or a single JWK as JSON.
    pub fn add_public_key(&mut self, kid: &str, text: &str) -> Result<(), JwtConfigError> {
        let text = text.replace("\\n", "\n");
        let text = text.trim();
        if text.starts_with('{') {
            let mut jwk: Value = serde_json::from_str(text).map_err(|e| JwtConfigError::Key {
                kid: kid.to_owned(),
                reason: e.to_string(),
            })?;
            jwk["kid"] = Value::String(kid.to_owned());
            return self.add_jwks(&serde_json::json!({ "keys": [jwk] }).to_string());
        }
        let bytes = text.as_bytes();
        let (family, key) = if let Ok(k) = DecodingKey::from_ed_pem(bytes) {
            (Family::Ed, k)
        } else if let Ok(k) = DecodingKey::from_rsa_pem(bytes) {
            (Family::Rsa, k)
        } else {
            return Err(JwtConfigError::Key {
                kid: kid.to_owned(),
                reason: "not an Ed25519 or RSA public key in PEM".into(),
            });
        };
        self.keys.insert(
            kid.to_owned(),
            Key {
                family,
                alg: None,
                key,
            },
        );
        Ok(())
    }

    /// Every regular file of `dir`, as [`JwtKeys::add_public_key`] with the
    /// file's name without its extension as `kid` (the official server's
    /// layout).
    pub fn add_dir(&mut self, dir: &Path) -> Result<(), JwtConfigError> {
        let err = |reason: String| JwtConfigError::Dir {
            dir: dir.display().to_string(),
            reason,
        };
        let entries = std::fs::read_dir(dir).map_err(|e| err(e.to_string()))?;
        for entry in entries {
            let entry = entry.map_err(|e| err(e.to_string()))?;
            let path = entry.path();
            if !entry.file_type().map_err(|e| err(e.to_string()))?.is_file() {
                continue;
            }
            let Some(kid) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
            self.add_public_key(kid, &text)?;
        }
        Ok(())
    }

    /// A shared HS256 secret.
    pub fn add_hs256(&mut self, kid: &str, secret: &[u8]) {
        self.keys.insert(
            kid.to_owned(),
            Key {
                family: Family::Hmac,
                alg: Some(Algorithm::HS256),
                key: DecodingKey::from_secret(secret),
            },
        );
    }
}

/// Parses an allow-list such as `EdDSA,RS256`.
pub fn parse_algs(list: &str) -> Result<Vec<Algorithm>, JwtConfigError> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s {
            "EdDSA" => Ok(Algorithm::EdDSA),
            "RS256" => Ok(Algorithm::RS256),
            "HS256" => Ok(Algorithm::HS256),
            other => Err(JwtConfigError::UnknownAlg(other.to_owned())),
        })
        .collect()
}

/// How tokens are verified.
#[derive(Debug)]
pub struct JwtVerifier {
    pub issuer: String,
    pub audience: String,
    pub allowed_algs: Vec<Algorithm>,
    /// Seconds, at most [`MAX_SKEW_SECS`].
    pub skew_secs: u64,
    /// Seconds, at most [`MAX_LIFETIME_SECS`].
    pub max_lifetime_secs: u64,
    /// Tenant of tokens without `tenant_id`.
    pub default_tenant: String,
    /// Refuse tokens without `tenant_id`.
    pub require_tenant: bool,
    pub keys: JwtKeys,
}

impl JwtVerifier {
    /// LibreChat's defaults (issuer `librechat`, audience `codeapi`, skew
    /// 30 s, lifetime 300 s) over `keys`; `allowed_algs` EdDSA and RS256,
    /// plus HS256 when an HS256 secret is among the keys.
    pub fn new(keys: JwtKeys, default_tenant: &str) -> Result<JwtVerifier, JwtConfigError> {
        if keys.is_empty() {
            return Err(JwtConfigError::NoKeys);
        }
        let mut allowed_algs = vec![Algorithm::EdDSA, Algorithm::RS256];
        if keys.has_hmac() {
            allowed_algs.push(Algorithm::HS256);
        }
        Ok(JwtVerifier {
            issuer: "librechat".to_owned(),
            audience: "codeapi".to_owned(),
            allowed_algs,
            skew_secs: MAX_SKEW_SECS,
            max_lifetime_secs: MAX_LIFETIME_SECS,
            default_tenant: default_tenant.to_owned(),
            require_tenant: false,
            keys,
        })
    }

    /// Verifies `token` at `now` (seconds since the epoch).
    pub fn verify(&self, token: &str, now: u64) -> Result<TokenPrincipal, Reject> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| Reject::Malformed)?;
        let alg = header.alg;
        if !matches!(alg, Algorithm::EdDSA | Algorithm::RS256 | Algorithm::HS256)
            || !self.allowed_algs.contains(&alg)
        {
            return Err(Reject::AlgNotAllowed);
        }
        if header.typ.as_deref().is_some_and(|t| t != "JWT") {
            return Err(Reject::Malformed);
        }
        let kid = header
            .kid
            .filter(|k| !k.trim().is_empty())
            .ok_or(Reject::MissingKid)?;
        let key = self.keys.keys.get(&kid).ok_or(Reject::UnknownKid)?;
        if key.family.alg() != alg || key.alg.is_some_and(|a| a != alg) {
            return Err(Reject::AlgKeyMismatch);
        }
        let mut v = Validation::new(alg);
        // every claim is checked below, with the contract's own rules
        v.required_spec_claims.clear();
        v.validate_exp = false;
        v.validate_nbf = false;
        v.validate_aud = false;
        let data = jsonwebtoken::decode::<Value>(token, &key.key, &v).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            match e.kind() {
                ErrorKind::InvalidSignature => Reject::BadSignature,
                _ => Reject::Malformed,
            }
        })?;
        self.check_claims(&data.claims, now)
    }

    /// The claim rules of the module docs.
    pub fn check_claims(&self, c: &Value, now: u64) -> Result<TokenPrincipal, Reject> {
        let text = |name: &'static str| -> Result<&str, Reject> {
            c.get(name)
                .and_then(Value::as_str)
                .filter(|s| !s.trim().is_empty())
                .ok_or(Reject::Claim(name))
        };
        let number = |name: &'static str| -> Result<f64, Reject> {
            c.get(name)
                .and_then(Value::as_f64)
                .filter(|n| n.is_finite())
                .ok_or(Reject::Claim(name))
        };
        if text("iss")? != self.issuer {
            return Err(Reject::WrongIssuer);
        }
        match c.get("aud") {
            Some(Value::String(a)) if !a.trim().is_empty() => {
                if *a != self.audience {
                    return Err(Reject::WrongAudience);
                }
            }
            Some(Value::Array(items)) if !items.is_empty() => {
                if !items.iter().all(Value::is_string) {
                    return Err(Reject::Claim("aud"));
                }
                if !items.iter().any(|a| a.as_str() == Some(&self.audience)) {
                    return Err(Reject::WrongAudience);
                }
            }
            _ => return Err(Reject::Claim("aud")),
        }
        let sub = text("sub")?;
        if !is_resource_id(sub) {
            return Err(Reject::Claim("sub"));
        }
        let jti = text("jti")?;
        if jti.chars().count() > MAX_JTI {
            return Err(Reject::Claim("jti"));
        }
        let (iat, nbf, exp) = (number("iat")?, number("nbf")?, number("exp")?);
        let now = now as f64;
        let skew = self.skew_secs.min(MAX_SKEW_SECS) as f64;
        if exp <= now - skew {
            return Err(Reject::Expired);
        }
        if nbf > now + skew {
            return Err(Reject::NotYetValid);
        }
        if iat > now + skew {
            return Err(Reject::IssuedInFuture);
        }
        if exp <= iat {
            return Err(Reject::Claim("exp"));
        }
        if exp - iat > self.max_lifetime_secs.min(MAX_LIFETIME_SECS) as f64 {
            return Err(Reject::TooLong);
        }
        let source = text("principal_source")?;
        if source != "librechat_jwt" && source != "openid_reuse" {
            return Err(Reject::Claim("principal_source"));
        }
        text("auth_context_hash")?;
        let tenant = match c.get("tenant_id") {
            None | Some(Value::Null) if self.require_tenant => {
                return Err(Reject::Claim("tenant_id"));
            }
            None | Some(Value::Null) => self.default_tenant.clone(),
            Some(Value::String(t)) if is_resource_id(t) && !t.contains(':') => t.clone(),
            Some(_) => return Err(Reject::Claim("tenant_id")),
        };
        Ok(TokenPrincipal {
            user_id: sub.to_owned(),
            tenant,
            principal_source: source.to_owned(),
        })
    }
}

/// Who a verified token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenPrincipal {
    pub user_id: String,
    pub tenant: String,
    pub principal_source: String,
}

/// Why a token was refused (logged; every one answers 401 `Invalid bearer
/// token`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    #[error("token is not a well-formed JWT")]
    Malformed,
    #[error("alg is not allowed")]
    AlgNotAllowed,
    #[error("kid is missing")]
    MissingKid,
    #[error("kid is not configured")]
    UnknownKid,
    #[error("alg does not match the key")]
    AlgKeyMismatch,
    #[error("signature is invalid")]
    BadSignature,
    #[error("issuer is not trusted")]
    WrongIssuer,
    #[error("audience is not accepted")]
    WrongAudience,
    #[error("token is expired")]
    Expired,
    #[error("token is not yet valid")]
    NotYetValid,
    #[error("iat is in the future")]
    IssuedInFuture,
    #[error("lifetime exceeds the maximum")]
    TooLong,
    #[error("claim {0} is missing or malformed")]
    Claim(&'static str),
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn verifier() -> JwtVerifier {
        let mut keys = JwtKeys::default();
        keys.add_hs256("hs", b"0123456789abcdef0123456789abcdef");
        JwtVerifier::new(keys, "local").unwrap()
    }

    fn claims() -> Value {
        json!({"iss": "librechat", "aud": "codeapi", "sub": "u1", "jti": "j",
               "iat": NOW, "nbf": NOW, "exp": NOW + 300, "tenant_id": "legacy",
               "role": "USER", "principal_source": "librechat_jwt", "auth_context_hash": "h"})
    }

    fn hs(c: &Value) -> String {
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("hs".into());
        jsonwebtoken::encode(
            &h,
            c,
            &EncodingKey::from_secret(b"0123456789abcdef0123456789abcdef"),
        )
        .unwrap()
    }

    #[test]
    fn the_time_rules_allow_thirty_seconds_of_skew_and_five_minutes_of_life() {
        let v = verifier();
        let at = |iat: u64, exp: u64, now: u64| {
            let mut c = claims();
            c["iat"] = json!(iat);
            c["nbf"] = json!(iat);
            c["exp"] = json!(exp);
            v.check_claims(&c, now)
        };
        assert!(at(NOW, NOW + 300, NOW).is_ok());
        assert_eq!(at(NOW, NOW + 301, NOW), Err(Reject::TooLong));
        assert!(at(NOW, NOW + 300, NOW + 329).is_ok());
        assert_eq!(at(NOW, NOW + 300, NOW + 330), Err(Reject::Expired));
        assert!(at(NOW + 30, NOW + 100, NOW).is_ok());
        assert_eq!(at(NOW + 31, NOW + 100, NOW), Err(Reject::NotYetValid));
        assert_eq!(at(NOW, NOW, NOW), Err(Reject::Claim("exp")));
    }

    #[test]
    fn tenant_defaults_and_must_not_split_session_keys() {
        let v = verifier();
        let mut c = claims();
        assert_eq!(v.check_claims(&c, NOW).unwrap().tenant, "legacy");
        c.as_object_mut().unwrap().remove("tenant_id");
        assert_eq!(v.check_claims(&c, NOW).unwrap().tenant, "local");
        c["tenant_id"] = json!("a:user:b");
        assert_eq!(v.check_claims(&c, NOW), Err(Reject::Claim("tenant_id")));
        let strict = JwtVerifier {
            require_tenant: true,
            ..verifier()
        };
        c.as_object_mut().unwrap().remove("tenant_id");
        assert_eq!(
            strict.check_claims(&c, NOW),
            Err(Reject::Claim("tenant_id"))
        );
    }

    #[test]
    fn hs256_needs_the_allow_list_and_an_hmac_key() {
        let mut v = verifier();
        assert!(v.verify(&hs(&claims()), NOW).is_ok());
        v.allowed_algs = vec![Algorithm::EdDSA, Algorithm::RS256];
        assert_eq!(v.verify(&hs(&claims()), NOW), Err(Reject::AlgNotAllowed));
    }

    #[test]
    fn allow_lists_parse() {
        assert_eq!(
            parse_algs("EdDSA, RS256").unwrap(),
            [Algorithm::EdDSA, Algorithm::RS256]
        );
        assert!(parse_algs("none").is_err());
    }
}
