//! Fuzz target: arbitrary multipart bodies through the real router on
//! `/v1/upload` and `/v1/upload/batch` over a real store; see
//! `checks/multipart.rs` for the input encoding and the property.
#![no_main]

use std::sync::{LazyLock, Mutex};

use libfuzzer_sys::fuzz_target;

#[path = "../checks/relpath.rs"]
mod relpath;

#[path = "../checks/multipart.rs"]
mod multipart;

static HARNESS: LazyLock<Mutex<multipart::Harness>> =
    LazyLock::new(|| Mutex::new(multipart::Harness::new()));

fuzz_target!(|data: &[u8]| {
    // A panic inside `check` aborts the process (libFuzzer reports it), so
    // a poisoned lock is never observed by a later input.
    let mut harness = HARNESS.lock().unwrap_or_else(|p| p.into_inner());
    let _stored = harness.check(data);
});
