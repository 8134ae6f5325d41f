//! Who owns a thing that lives for a while: a run, a kernel, a runtime
//! session, a project (attached workspace), a sandbox of the bridge, a
//! programmatic run, an MCP session. One type, [`Owner`], with every
//! encoding of it a registry needs as a method, so that no registry formats
//! its own: the store key ([`Owner::key`]), the hash a token carries
//! ([`Owner::token_hash`]) and the ids derived from it and a name
//! ([`Owner::derive_id`]: file workspaces, runtime sessions' storage,
//! projects, whose directories are named by them).
//!
//! Who may read, change or control an owned thing is decided by
//! [`crate::access::may`], never by comparing owners in a face.

use sha2::{Digest, Sha256};

use crate::access::Caller;
use crate::id::{NANOID_LEN, Nanoid};
use crate::scope::{Principal, SessionKey};

/// The owner of a thing: the principal (tenant and user) that created it.
/// Whether an identity source named that principal is not part of it: an
/// identity-less caller owns what it creates as user `anonymous`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Owner(Principal);

/// The URL-safe nanoid alphabet, indexed by 6-bit values.
const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

impl Owner {
    pub fn new(principal: Principal) -> Owner {
        Owner(principal)
    }

    /// What `caller` creates belongs to its principal.
    pub fn of(caller: &Caller) -> Owner {
        Owner(caller.principal.clone())
    }

    pub fn principal(&self) -> &Principal {
        &self.0
    }

    /// The owner's user key (`<tenant>:user:<user>`): where its stored
    /// files live, and the key its caps and rate limits count under.
    pub fn key(&self) -> SessionKey {
        self.0.user_key()
    }

    /// The owner as a token names it, showing no identity: the first 16
    /// bytes of sha256(`tenant \0 user`), hex.
    pub fn token_hash(&self) -> String {
        let d = Sha256::new()
            .chain_update(self.0.tenant.as_bytes())
            .chain_update(b"\0")
            .chain_update(self.0.user_id.as_bytes())
            .finalize();
        hex::encode(&d[..16])
    }

    /// Whether a token's owner hash ([`Owner::token_hash`]) names this
    /// owner: a token issued to someone else does not.
    pub fn named_by(&self, token_hash: &str) -> bool {
        self.token_hash() == token_hash
    }

    /// The id of the owner's thing `name` in `namespace` (a nanoid, safe as
    /// a file name): sha256(`namespace tenant \0 user \0 name`) mapped onto
    /// the nanoid alphabet. Two owners' things of one name never share it;
    /// any node derives it without a lookup table.
    pub fn derive_id(&self, namespace: &[u8], name: &str) -> Nanoid {
        let digest = Sha256::new()
            .chain_update(namespace)
            .chain_update(self.0.tenant.as_bytes())
            .chain_update(b"\0")
            .chain_update(self.0.user_id.as_bytes())
            .chain_update(b"\0")
            .chain_update(name.as_bytes())
            .finalize();
        let id: String = digest
            .iter()
            .take(NANOID_LEN)
            .map(|b| ALPHABET[usize::from(b & 63)] as char)
            .collect();
        Nanoid::from_derived(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(user: &str) -> Owner {
        Owner::of(&Caller::identified("local", user))
    }

    #[test]
    fn the_key_is_the_principals_user_key() {
        assert_eq!(owner("alice").key().as_str(), "local:user:alice");
        // identity is not part of ownership
        assert_eq!(
            Owner::of(&Caller::anonymous("local")),
            Owner::new(Principal {
                tenant: "local".into(),
                user_id: crate::access::ANONYMOUS.into()
            })
        );
    }

    #[test]
    fn the_token_hash_is_sixteen_bytes_of_sha256_of_tenant_and_user() {
        // sha256("local\0alice"), first 16 bytes
        let h = owner("alice").token_hash();
        assert_eq!(h.len(), 32);
        assert_eq!(h, "fe8a67d0acb52eb7cc76f6caf3e1c8da");
        assert_ne!(h, owner("bob").token_hash());
        assert!(owner("alice").named_by(&h));
        assert!(!owner("bob").named_by(&h));
    }

    #[test]
    fn derived_ids_differ_by_owner_namespace_and_name() {
        let a = owner("alice").derive_id(b"ns\0", "x");
        assert_eq!(a, owner("alice").derive_id(b"ns\0", "x"));
        assert_ne!(a, owner("bob").derive_id(b"ns\0", "x"));
        assert_ne!(a, owner("alice").derive_id(b"other\0", "x"));
        assert_ne!(a, owner("alice").derive_id(b"ns\0", "y"));
        assert!(Nanoid::parse(a.as_str()).is_ok());
    }
}
