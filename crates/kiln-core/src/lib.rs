//! Kiln's domain core.
//!
//! Everything here is pure data and rules: identifiers, the language table
//! (cold and warm recipes, the jail environment), limits, relative-path
//! validation, ownership scopes and the one access rule, execution outcomes
//! and usage figures, and the output allow-list. This crate does no IO (no files, no sockets, no
//! clocks) and knows nothing about HTTP or LibreChat's JSON shapes.

pub mod access;
pub mod allow;
pub mod egress;
pub mod id;
pub mod lang;
pub mod limits;
pub mod outcome;
pub mod owner;
pub mod path;
pub mod scope;
pub mod usage;

pub use id::Nanoid;
pub use lang::{Language, LanguageSpec};
pub use limits::Limits;
pub use outcome::{ExitStatus, RunStatus};
pub use owner::Owner;
pub use path::RelPath;
pub use scope::{Kind, Principal, SessionKey};
pub use usage::{StepUsage, Usage};
