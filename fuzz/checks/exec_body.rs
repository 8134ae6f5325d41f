//! The property of the `/exec` body parser ([`kiln_api::exec::parse_exec_body`]),
//! shared by the `exec_body` fuzz target and the stable property test in
//! `crates/kiln-api/tests/fuzz_props.rs` (both include it with `#[path]`,
//! next to `relpath.rs` as the sibling module `crate::relpath`).
//!
//! Property: for any bytes the parser returns instead of panicking; a
//! refusal is a 4xx envelope with an `error` string; an accepted request is
//! well-formed (identity is a valid resource id, a timeout is positive,
//! every file name is a safe relative name, by-reference scopes are
//! consistent).
#![allow(dead_code)] // each including crate uses a different part

use axum::http::{HeaderMap, HeaderValue};
use kiln_api::ApiConfig;
use kiln_api::exec::parse_exec_body;
use kiln_core::Kind;
use kiln_core::id::is_resource_id;
use kiln_exec::InputFile;

use crate::relpath::assert_accepted_name_is_safe;

/// Parse `bytes` without and with a `User-Id` header, and with identity
/// required; assert the property on each outcome.
pub fn check_exec_body(bytes: &[u8]) {
    let open = ApiConfig::default();
    let strict = ApiConfig {
        require_identity: true,
        ..ApiConfig::default()
    };
    let mut with_user = HeaderMap::new();
    with_user.insert("user-id", HeaderValue::from_static("fuzz-user"));
    for (config, headers) in [
        (&open, &HeaderMap::new()),
        (&open, &with_user),
        (&strict, &HeaderMap::new()),
    ] {
        check_one(config, headers, bytes);
    }
}

fn check_one(config: &ApiConfig, headers: &HeaderMap, bytes: &[u8]) {
    match parse_exec_body(config, headers, bytes) {
        Ok((caller, req)) => {
            let user = &caller.principal.user_id;
            assert!(is_resource_id(user), "accepted user id {user:?}");
            assert_eq!(caller.principal.tenant, config.tenant);
            if config.require_identity {
                assert!(caller.identified, "identity-less caller accepted");
            }
            if headers.contains_key("user-id") {
                assert_eq!(user, "fuzz-user", "the User-Id header must win");
            }
            if let Some(t) = req.timeout_ms {
                assert!(t > 0, "accepted timeout {t}");
            }
            assert!(req.lang.name().is_ascii() && !req.lang.name().is_empty());
            for f in &req.files {
                match f {
                    InputFile::Inline { name, .. } => assert_accepted_name_is_safe(name.as_str()),
                    InputFile::Ref(r) => {
                        assert_accepted_name_is_safe(r.name.as_str());
                        match (&r.kind, &r.resource_id) {
                            // no scope claimed: no resource id kept either
                            (None, id) => assert_eq!(*id, None, "resource id without a kind"),
                            (Some(Kind::User), _) => {}
                            (_, Some(id)) => assert!(is_resource_id(id), "resource id {id:?}"),
                            (k, None) => panic!("accepted kind {k:?} without a resource id"),
                        }
                        if let Some(e) = &r.entity_id {
                            assert!(is_resource_id(e), "entity id {e:?}");
                        }
                        if let Some(v) = &r.version {
                            assert_eq!(r.kind, Some(Kind::Skill), "version on a non-skill ref");
                            assert!(
                                v.parse::<u64>().is_ok(),
                                "version {v:?} is not a non-negative integer"
                            );
                        } else {
                            assert_ne!(r.kind, Some(Kind::Skill), "skill ref without a version");
                        }
                    }
                }
            }
        }
        Err(e) => {
            let (status, body) = e.status_and_body();
            assert!(
                status.is_client_error(),
                "parse failure answered {status}: {e}"
            );
            assert!(body["error"].is_string(), "envelope without error: {body}");
        }
    }
}
