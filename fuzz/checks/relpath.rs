//! The property every accepted relative name must have, shared by the
//! `relpath` fuzz target and the stable property tests in `cargo test`
//! (included with `#[path]` from `crates/kiln-core/tests/relpath_props.rs`
//! and `crates/kiln-api/tests/fuzz_props.rs`).
//!
//! Invariant: a name [`RelPath::parse`] accepts is non-empty, at most 256
//! bytes, not absolute, has no empty, `.` or `..` segment, no NUL, backslash
//! or control character, at most 10 parent directories, and joined to any
//! directory stays inside it (only `Normal` path components).
#![allow(dead_code)] // each including crate uses a different part

use std::path::{Component, Path};

use kiln_core::RelPath;
use kiln_core::path::{MAX_DEPTH, MAX_PATH_LEN};

/// Feed `s` to [`RelPath::parse`]; if accepted, assert the invariant.
/// Returns whether it was accepted.
pub fn check_relpath(s: &str) -> bool {
    match RelPath::parse(s) {
        Ok(p) => {
            assert_accepted_name_is_safe(s);
            assert_eq!(p.as_str(), s, "parse must not rewrite the name");
            assert_eq!(p.depth(), s.matches('/').count());
            assert_eq!(p.ancestors().count(), p.depth());
            assert!(!p.file_name().is_empty() && !p.file_name().contains('/'));
            true
        }
        Err(_) => false,
    }
}

/// The invariant, stated independently of the validator's own code.
pub fn assert_accepted_name_is_safe(s: &str) {
    assert!(!s.is_empty(), "accepted an empty name");
    assert!(s.len() <= MAX_PATH_LEN, "accepted {} bytes: {s:?}", s.len());
    assert!(s.len() <= 256, "accepted {} bytes: {s:?}", s.len());
    assert!(!s.starts_with('/'), "accepted an absolute name: {s:?}");
    assert!(!s.contains('\0'), "accepted a NUL: {s:?}");
    assert!(!s.contains('\\'), "accepted a backslash: {s:?}");
    assert!(
        !s.chars().any(char::is_control),
        "accepted a control character: {s:?}"
    );
    for seg in s.split('/') {
        assert!(
            !seg.is_empty() && seg != "." && seg != "..",
            "accepted segment {seg:?} in {s:?}"
        );
    }
    let depth = s.matches('/').count();
    assert!(
        depth <= MAX_DEPTH && depth <= 10,
        "accepted depth {depth}: {s:?}"
    );
    assert!(
        Path::new(s)
            .components()
            .all(|c| matches!(c, Component::Normal(_))),
        "{s:?} has a component that could leave the workspace"
    );
}
