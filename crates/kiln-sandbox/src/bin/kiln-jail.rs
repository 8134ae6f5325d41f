//! The jail helper and fork-server on their own, for this crate's
//! integration tests (the kiln binary runs the same code as `kiln __jail`
//! and `kiln __zygote`).

fn main() {
    if std::env::args_os().nth(1).is_some_and(|a| a == "__zygote") {
        kiln_sandbox::zygote_main()
    }
    kiln_sandbox::helper_main()
}
