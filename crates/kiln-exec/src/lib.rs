//! Kiln's executor: stages inputs into a fresh workspace, runs the code in
//! the sandbox, harvests outputs with the walker and stores them.
//!
//! Flow of one execution ([`Executor::run`]):
//! plan inputs (dedupe, collisions) → authorize refs against their storage
//! session's owner → take a sandbox slot (queueing) → stage inputs and the
//! entry file into `<work>/<session>` owned by the slot's uid → compile and
//! run in the sandbox → walk the workspace → store outputs → remove the
//! workspace.

mod egress;
mod executor;
pub mod plan;
pub mod types;
pub mod walker;

pub use egress::{SERVICES_PORT, SERVICES_URL};
pub use executor::{ExecConfig, Executor, WARM_EXEC, classify, content_type, environment};
pub use types::*;
pub use walker::WalkLimits;
