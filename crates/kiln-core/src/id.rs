//! 21-character nanoids, the only id format LibreChat accepts for execution
//! sessions, storage sessions and files (`^[A-Za-z0-9_-]{21}$`).

use std::fmt;

use rand::Rng;

/// The nanoid alphabet: 64 url-safe characters.
const ALPHABET: &[u8; 64] = b"useandom-26T198340PX75pxJACKVERYMINDBUSHWOLF_GQZbfghjklqvwyzrict";

/// Length of every server-minted id.
pub const NANOID_LEN: usize = 21;

/// A validated 21-character nanoid.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Nanoid(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a 21-character nanoid")]
pub struct InvalidNanoid;

impl Nanoid {
    /// A fresh random id (126 bits of entropy from the thread-local CSPRNG).
    pub fn random() -> Self {
        let mut rng = rand::rng();
        let s: String = (0..NANOID_LEN)
            .map(|_| ALPHABET[rng.random_range(0..64)] as char)
            .collect();
        Nanoid(s)
    }

    pub fn parse(s: &str) -> Result<Self, InvalidNanoid> {
        if is_nanoid(s) {
            Ok(Nanoid(s.to_owned()))
        } else {
            Err(InvalidNanoid)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An id built of [`NANOID_LEN`] alphabet characters by this crate
    /// (see [`crate::owner::Owner::derive_id`]).
    pub(crate) fn from_derived(s: String) -> Self {
        debug_assert!(is_nanoid(&s));
        Nanoid(s)
    }
}

/// True when `s` is exactly 21 characters of `[A-Za-z0-9_-]`.
pub fn is_nanoid(s: &str) -> bool {
    s.len() == NANOID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Resource ids (`resource_id`, upload `id`, query `id`): Mongo ObjectIds,
/// `agent_<nanoid>` slugs, user ids. `^[A-Za-z0-9_.:-]{1,128}$`.
pub fn is_resource_id(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

impl TryFrom<String> for Nanoid {
    type Error = InvalidNanoid;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        if is_nanoid(&s) {
            Ok(Nanoid(s))
        } else {
            Err(InvalidNanoid)
        }
    }
}

impl From<Nanoid> for String {
    fn from(id: Nanoid) -> String {
        id.0
    }
}

impl fmt::Display for Nanoid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Nanoid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Nanoid({})", self.0)
    }
}

impl AsRef<str> for Nanoid {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_are_valid_and_distinct() {
        let a = Nanoid::random();
        let b = Nanoid::random();
        assert!(is_nanoid(a.as_str()));
        assert_eq!(a.as_str().len(), 21);
        assert_ne!(a, b);
    }

    #[test]
    fn rejects_wrong_length_and_charset() {
        assert!(Nanoid::parse("abc").is_err());
        assert!(Nanoid::parse("aaaaaaaaaaaaaaaaaaaaaa").is_err()); // 22
        assert!(Nanoid::parse("aaaaaaaaaaaaaaaaaaaa/").is_err());
        assert!(Nanoid::parse("aaaaaaaaaaaaaaaaaaaa.").is_err());
        assert!(Nanoid::parse("V1StGXR8_Z5jdHi6B-myT").is_ok());
    }

    #[test]
    fn resource_ids_accept_mongo_ids_and_slugs() {
        assert!(is_resource_id("507f1f77bcf86cd799439011"));
        assert!(is_resource_id("agent_V1StGXR8_Z5jdHi6B-myT"));
        assert!(is_resource_id("user:1.2"));
        assert!(!is_resource_id(""));
        assert!(!is_resource_id("a/b"));
        assert!(!is_resource_id(&"a".repeat(129)));
    }
}
