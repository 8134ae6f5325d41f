//! Raw system calls that neither `nix` nor `std` wrap safely: `clone3`,
//! `mount_setattr`, `close_range`, fd plumbing on raw fd numbers, forking,
//! signal reset, the `pre_exec` hook that hands the status pipe to the
//! helper, loop-device set-up and `atexit`.
//!
//! This module (with `embed.rs`) is the only code of the crate that
//! contains `unsafe`. Every function here exposes a safe interface: the
//! preconditions an `unsafe` block relies on are either checked at run time
//! (single-threadedness before forking) or guaranteed by the function's own
//! construction.
//!
//! Split by area: [`process`] (forking, signals, reaping), [`fd`] (raw fd
//! numbers), [`mount`] (mount attributes, loop devices, trim), [`confine`]
//! (Landlock probe, capabilities) and [`identity`] (how a process shows
//! itself, scrubbing memory). Callers use the re-exports: `sys::clone3_fork`.

#![allow(unsafe_code)]

mod confine;
mod fd;
mod identity;
mod mount;
mod process;

pub use confine::*;
pub use fd::*;
pub use identity::*;
pub use mount::*;
pub use process::*;
