//! The crate's error type.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::seccomp::PolicyError;

/// Why the sandbox could not be created or a run could not be carried out.
/// A run that merely fails (non-zero exit, signal, timeout, OOM) is not an
/// error: it is a [`crate::RunResult`].
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The host cannot enforce a jail; one reason per problem.
    #[error("sandbox cannot be enforced on this host: {}", .0.join("; "))]
    Unsupported(Vec<String>),
    /// The configuration is unusable.
    #[error("invalid sandbox config: {0}")]
    Config(String),
    /// The run request is malformed (empty argv, relative path, NUL byte, ...).
    #[error("invalid run request: {0}")]
    Request(String),
    /// The jail (running as an unprivileged uid on the host) could not reach
    /// this path: every ancestor directory needs the search (`o+x`) bit.
    #[error("{path} is not reachable from the jail: every ancestor directory needs o+x")]
    PathNotSearchable { path: PathBuf },
    /// The jail could not be built: `"<step>: <errno text>"`.
    #[error("jail setup failed: {0}")]
    Setup(String),
    /// Everything was set up but `execve` of `argv[0]` failed.
    #[error("exec in jail failed: {0}")]
    Exec(String),
    /// The helper process could not be started.
    #[error("spawn jail helper {path}: {source}")]
    Spawn { path: PathBuf, source: io::Error },
    /// The helper ended without reporting a status.
    #[error("jail helper ended without a status: {0}")]
    Helper(String),
    /// A file operation of the server side failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A run's cgroup still had processes (or could not be removed) after
    /// this long; a background thread keeps trying.
    #[error("cgroup {path} still busy after {waited:?}")]
    CgroupBusy { path: PathBuf, waited: Duration },
    /// The seccomp profile is unknown or does not compile.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The slot passed to `run` belongs to another `Sandbox`.
    #[error("slot {0} does not belong to this sandbox")]
    ForeignSlot(u32),
    /// The caller's cancellation token fired; the jail was killed. Carries
    /// what the run had used by then where the sandbox measured it (a run
    /// it supervised; `None` from a kernel's seat or before the program ran).
    #[error("run cancelled")]
    Cancelled(Option<KilledUsage>),
    /// [`crate::Sandbox::shutdown`] was called: no more runs.
    #[error("sandbox is shut down")]
    ShutDown,
    /// The fork-server (embedded interpreter for warm `py` jails) failed.
    #[error("fork-server: {0}")]
    Zygote(String),
}

impl SandboxError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        SandboxError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// What a run killed on its cancel token had used, measured as for any run:
/// its wall time, the CPU time and peak memory of its cgroups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KilledUsage {
    pub wall_time: std::time::Duration,
    pub cpu_time: Option<std::time::Duration>,
    pub memory_peak: Option<u64>,
}
