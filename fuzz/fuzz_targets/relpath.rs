//! Fuzz target: `kiln_core::RelPath::parse` on arbitrary text; every
//! accepted name must satisfy the safety invariant of `checks/relpath.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../checks/relpath.rs"]
mod relpath;

fuzz_target!(|data: &[u8]| {
    match std::str::from_utf8(data) {
        Ok(s) => {
            relpath::check_relpath(s);
        }
        Err(_) => {
            relpath::check_relpath(&String::from_utf8_lossy(data));
        }
    }
});
