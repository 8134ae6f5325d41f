//! Fuzz target: the `/exec` body parser (`kiln_api::exec::parse_exec_body`)
//! on arbitrary bytes; see `checks/exec_body.rs` for the property.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../checks/relpath.rs"]
mod relpath;

#[path = "../checks/exec_body.rs"]
mod exec_body;

fuzz_target!(|data: &[u8]| {
    exec_body::check_exec_body(data);
});
