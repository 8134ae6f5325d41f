//! Kiln's native Linux sandbox.
//!
//! Every run gets a fresh jail: a helper process (see [`helper_main`]; a
//! fork of the jail launcher, [`launcher_main`], or a spawned `kiln __jail`) attaches to per-run memory and pids cgroups and clones
//! the jail's init into new user, mount, pid, ipc and uts namespaces and its
//! slot's network namespace (made once per slot, no network at all; see
//! `slotnet.rs`) under a slot's private uid range. Init builds a minimal read-only root
//! (runtimes bound from the host, our own `/etc`, the workspace at
//! `/mnt/data`, private `/tmp`, `/dev` and `/proc`), `pivot_root`s into it and
//! runs the user program as uid 1000 with rlimits, no capabilities,
//! no_new_privs and a seccomp filter; when the program exits, init exits and
//! the kernel kills everything left in the namespace.
//!
//! The user program runs under Landlock (where the kernel has it) and a
//! seccomp allow-list chosen per run ([`RunRequest::seccomp_profile`]); its
//! workspace lives on the slot's own filesystem, so a size and file-count
//! quota is enforced by the kernel ([`SandboxConfig::workspace_bytes`]).
//!
//! The server side ([`Sandbox`]) never forks itself into a jail: it has the
//! launcher fork the helper (or spawns one with `tokio::process`), captures output with caps, enforces the wall time
//! and cancellation, and returns only once every process of the jail is dead
//! and its cgroups are gone.
//!
//! Warm jails ([`Sandbox::park`], [`Sandbox::run_parked`]) are the same
//! jails built ahead and parked, fully confined, right before the program
//! runs; [`WarmPool`] keeps some per runtime. For `py` the parked process is
//! a fork of the fork-server's preloaded interpreter (`zygote/`).
//!
//! The executor takes its jails through one small trait, [`Jails`]
//! (`acquire(profile) -> Jail`); [`JailSource`] implements it with the warm
//! pool (and its fallback to generic jails) or cold jails.
//!
//! This is the only crate of the workspace with `unsafe`: system calls in
//! `sys/` and the embedded interpreter's C API in `embed.rs`.

mod backoff;
mod cgroup;
mod config;
mod embed;
mod error;
mod jail;
mod jails;
mod kernel;
mod launcher;
mod mountns;
mod netns;
mod pause;
mod probe;
mod quota;
mod reaper;
mod run;
mod sandbox;
mod seccomp;
mod seqpacket;
mod slotnet;
mod slots;
mod spec;
mod sys;
mod tree;
mod warm;
mod zygote;

/// Where a run's persistent project ([`RunRequest::project`]) is bound in
/// the jail, and the program's working directory then.
pub const PROJECT_DIR: &str = "/workspace";

pub use backoff::Backoff;
pub use cgroup::CgroupSupport;
pub use config::{
    DEFAULT_ETC_BINDS, JailSystem, LanguageImage, MIN_WORKSPACE_BYTES, MIN_WORKSPACE_INODES,
    SandboxConfig,
};
pub use error::{KilledUsage, SandboxError};
pub use jail::helper_main;
pub use jail::plan::source_of;
pub use jails::{BoxFuture, COLD_PROFILE, Jail, JailSource, Jails, ZygoteStart};
pub use kernel::{
    EvalError, EvalFile, EvalLimits, EvalResult, Kernel, KernelError, KernelLost, KernelStart,
    node_kernel_park, python_kernel_park,
};
pub use launcher::launcher_main;
pub use mountns::{enter_own_mount_namespace, own_mount_namespace, visible_mounts};
pub use netns::JailNetwork;
pub use pause::PauseClock;
pub use probe::{HostReport, cpu_budget_warning, probe_host};
pub use quota::{QuotaMode, WorkspaceQuota};
pub use reaper::init_if_pid1;
pub use run::{OutputSink, OutputStream, RunRequest, RunResult};
pub use sandbox::{ParkSpec, ParkedJail, Sandbox};
pub use seccomp::{DEFAULT_PROFILE as DEFAULT_SECCOMP_PROFILE, PolicyError};
pub use slots::{READY_KERNEL_SLOTS, Slot};
pub use spec::{JAIL_UID, ParkMode};
pub use sys::chroot_before_exec;
pub use tree::remove_tree;
pub use warm::{WarmConfig, WarmJail, WarmPool, WarmStats};
pub use zygote::{ZygoteConfig, ZygoteInfo, find_image_libpython, find_libpython, zygote_main};
