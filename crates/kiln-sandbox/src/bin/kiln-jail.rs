//! The jail helper and fork-server on their own, for this crate's
//! integration tests (the kiln binary runs the same code as `kiln __jail`,
//! `kiln __zygote` and `kiln __launcher`).

fn main() {
    match std::env::args_os().nth(1) {
        Some(a) if a == "__zygote" => kiln_sandbox::zygote_main(),
        Some(a) if a == "__launcher" => kiln_sandbox::launcher_main(),
        _ => {}
    }
    kiln_sandbox::helper_main()
}
