//! The jail helper on its own, for this crate's integration tests (the kiln
//! binary runs the same code as `kiln __jail`).

fn main() {
    kiln_sandbox::helper_main()
}
