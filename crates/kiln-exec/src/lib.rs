//! Kiln's executor: stages inputs into a fresh workspace, runs the code in
//! the sandbox, harvests outputs with the walker and stores them.

pub mod types;

pub use types::*;
