//! Authentication: the mode (`auth`, `api_key`) and the JWT verifier
//! (`jwt_*`).

use anyhow::{Context, bail};

use super::Config;

/// Authentication mode after resolving defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    None,
    ApiKey,
    /// LibreChat's CodeAPI token only.
    Jwt,
    /// The shared key or a token.
    ApiKeyOrJwt,
}

impl Config {
    pub fn auth_mode(&self) -> anyhow::Result<Auth> {
        let key_set = self.api_key.as_deref().is_some_and(|k| !k.is_empty());
        match self.auth.as_deref() {
            None | Some("") => Ok(if key_set { Auth::ApiKey } else { Auth::None }),
            Some("none") => Ok(Auth::None),
            Some("api-key") | Some("api_key") => {
                if !key_set {
                    bail!("auth is api-key but no KILN_API_KEY (or LIBRECHAT_CODE_API_KEY) is set");
                }
                Ok(Auth::ApiKey)
            }
            Some("jwt") => {
                self.check_jwt_keys()?;
                Ok(Auth::Jwt)
            }
            Some("api-key,jwt") | Some("jwt,api-key") => {
                if !key_set {
                    bail!(
                        "auth is api-key,jwt but no KILN_API_KEY (or LIBRECHAT_CODE_API_KEY) is set"
                    );
                }
                self.check_jwt_keys()?;
                Ok(Auth::ApiKeyOrJwt)
            }
            Some(other) => {
                bail!("unknown auth mode {other:?} (use none, api-key, jwt or api-key,jwt)")
            }
        }
    }

    /// With JWT on, some key must be configured and the limits hold.
    fn check_jwt_keys(&self) -> anyhow::Result<()> {
        if self.jwt_jwks_file.is_none()
            && self.jwt_public_keys_dir.is_none()
            && self.jwt_public_key_file.is_none()
            && self.jwt_hs256_secret.as_deref().is_none_or(str::is_empty)
        {
            bail!(
                "auth uses jwt but no key is configured: set jwt_jwks_file, jwt_public_keys_dir, \
                 jwt_public_key_file or jwt_hs256_secret"
            );
        }
        if self.jwt_clock_skew_secs > kiln_api::jwt::MAX_SKEW_SECS {
            bail!("jwt_clock_skew_secs must be at most 30");
        }
        if self.jwt_max_lifetime_secs == 0
            || self.jwt_max_lifetime_secs > kiln_api::jwt::MAX_LIFETIME_SECS
        {
            bail!("jwt_max_lifetime_secs must be between 1 and 300");
        }
        if let Some(algs) = &self.jwt_allowed_algs {
            kiln_api::jwt::parse_algs(algs)?;
        }
        Ok(())
    }

    /// The token verifier of the JWT settings, its keys read from their
    /// files; `None` unless auth uses JWT.
    pub fn jwt_verifier(&self) -> anyhow::Result<Option<kiln_api::jwt::JwtVerifier>> {
        use kiln_api::jwt::{JwtKeys, JwtVerifier, parse_algs};
        if !matches!(self.auth_mode()?, Auth::Jwt | Auth::ApiKeyOrJwt) {
            return Ok(None);
        }
        let mut keys = JwtKeys::default();
        if let Some(f) = &self.jwt_jwks_file {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("read jwt_jwks_file {}", f.display()))?;
            keys.add_jwks(&text)?;
        }
        if let Some(d) = &self.jwt_public_keys_dir {
            keys.add_dir(d)?;
        }
        if let Some(f) = &self.jwt_public_key_file {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("read jwt_public_key_file {}", f.display()))?;
            keys.add_public_key(&self.jwt_kid, &text)?;
        }
        if let Some(secret) = self.jwt_hs256_secret.as_deref().filter(|s| !s.is_empty()) {
            keys.add_hs256(&self.jwt_hs256_kid, secret.as_bytes());
        }
        let mut v = JwtVerifier::new(keys, "local")?;
        v.issuer = self.jwt_issuer.clone();
        v.audience = self.jwt_audience.clone();
        if let Some(algs) = &self.jwt_allowed_algs {
            v.allowed_algs = parse_algs(algs)?;
        }
        v.skew_secs = self.jwt_clock_skew_secs;
        v.max_lifetime_secs = self.jwt_max_lifetime_secs;
        v.require_tenant = self.jwt_require_tenant;
        Ok(Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_without_explicit_mode_means_api_key() {
        let c = Config {
            api_key: Some("k".into()),
            ..Config::default()
        };
        assert_eq!(c.auth_mode().unwrap(), Auth::ApiKey);
        let c = Config {
            auth: Some("api-key".into()),
            ..Config::default()
        };
        assert!(c.auth_mode().is_err());
        let c = Config {
            auth: Some("bogus".into()),
            ..Config::default()
        };
        assert!(c.auth_mode().is_err());
    }

    #[test]
    fn jwt_needs_a_key_and_builds_a_verifier_from_it() {
        let c = Config {
            auth: Some("jwt".into()),
            ..Config::default()
        };
        assert!(c.auth_mode().is_err(), "jwt without any key");
        let c = Config {
            auth: Some("jwt".into()),
            jwt_hs256_secret: Some("s".into()),
            ..Config::default()
        };
        assert_eq!(c.auth_mode().unwrap(), Auth::Jwt);
        let v = c.jwt_verifier().unwrap().expect("a verifier");
        assert_eq!(
            (v.issuer.as_str(), v.audience.as_str()),
            ("librechat", "codeapi")
        );
        assert!(v.allowed_algs.contains(&jsonwebtoken::Algorithm::HS256));
        let both = Config {
            auth: Some("api-key,jwt".into()),
            jwt_hs256_secret: Some("s".into()),
            ..Config::default()
        };
        assert!(both.auth_mode().is_err(), "api-key,jwt without a key");
        let too_long = Config {
            jwt_max_lifetime_secs: 301,
            ..c.clone()
        };
        assert!(too_long.auth_mode().is_err());
        let missing = Config {
            auth: Some("jwt".into()),
            jwt_public_key_file: Some("/nonexistent/key.pem".into()),
            ..Config::default()
        };
        assert!(
            missing.jwt_verifier().is_err(),
            "an unreadable key file stops the start"
        );
        assert!(Config::default().jwt_verifier().unwrap().is_none());
    }
}
