//! The fork-server (`kiln __zygote`): one long-lived host process that
//! embeds CPython, imports the data stack once (the preload, a never-used
//! template), and then forks the program process of each warm `py` jail.
//! The jail itself (helper, init, namespaces, root, cgroups) is built like
//! any other by small `kiln __jail` processes; once its root is ready, the
//! helper asks the fork-server for the program: the fork joins the jail's
//! namespaces (`setns` through the init's pidfd) and cgroups, confines itself
//! exactly as a program process forked by the init would (uid 1000, limits,
//! Landlock, seccomp), parks, and at the go runs the user's program in
//! process instead of `execve`ing a new interpreter. So a run pays neither
//! interpreter start-up nor `import pandas`, still starts in a fresh process
//! in its own namespaces, cgroups and uid range, and the 90 MiB template is
//! copied once per run.
//!
//! Protocol on a `SOCK_SEQPACKET` socket (the fork-server's stdin; the
//! server and the helpers of embedded jails hold the other end):
//! 1. server → zygote: the [`ZygoteConfig`] as JSON;
//! 2. zygote → server: `{"ready": ZygoteInfo}` or `{"failed": "why"}`;
//! 3. per warm jail: helper → zygote: `g` and the [`crate::spec::JailSpec`]
//!    line, with seven fds attached: stdout, stderr, the exec pipe's write
//!    end, the go pipe's read end, the exit pipe's write end, the jail
//!    init's pidfd and a reply socket. The zygote forks the program into the
//!    init's pid namespace and answers on the reply socket with its pid
//!    (4 bytes, little-endian), or with an error text. When the program
//!    exits, the zygote reaps it and writes its [`StatusMsg::Finished`] line
//!    on the exit pipe, where the jail's init reads and reports it.
//!
//! Each request is one message and each answer goes to the requester's own
//! reply socket, so helpers may ask concurrently. The fork-server never reads
//! anything but these messages; it holds no secret (its environment is
//! exactly the jail's) and exits when every holder of the socket closed it.
//!
//! Split by side: `client.rs` is the server's handle (start the fork-server,
//! hand helpers a socket to it), `server.rs` the fork-server process itself.
//! A jail helper's request for its program lives with the helper
//! (`jail/remote.rs`), so the jail does not depend on this module.

mod client;
mod server;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::{Deserialize, Serialize};

pub(crate) use self::client::Zygote;
pub use self::server::zygote_main;
use crate::error::SandboxError;

/// What the fork-server loads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZygoteConfig {
    /// The host's shared libpython (`libpython3.X.so.1.0`).
    pub libpython: PathBuf,
    /// Python source run once at start-up; must define the
    /// `_kiln_zygote` module whose `run(go: bytes)` runs one program and
    /// ends the process.
    pub preload: String,
    /// The complete environment of the interpreter (the jail's, with host
    /// paths where the preload needs a writable directory).
    pub env: Vec<(String, String)>,
}

/// What the fork-server reported once its preload finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZygoteInfo {
    pub pid: u32,
    /// Interpreter start-up plus preload.
    pub preload_ms: u64,
    /// Resident memory of the template after the preload (shared,
    /// copy-on-write, with every warm `py` jail).
    pub rss_bytes: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Hello {
    Ready(ZygoteInfo),
    Failed(String),
}

/// Finds the host's shared libpython for `python3` (the interpreter the
/// `py` language runs): asks it where its `INSTSONAME` lives.
pub fn find_libpython(python: &Path) -> Result<PathBuf, SandboxError> {
    let out = std::process::Command::new(python)
        .args([
            "-I",
            "-c",
            "import os, sysconfig as s; print(os.path.join(s.get_config_var('LIBDIR') or '', \
             s.get_config_var('INSTSONAME') or ''))",
        ])
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .map_err(|e| SandboxError::Zygote(format!("run {}: {e}", python.display())))?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !out.status.success() || !path.is_file() {
        return Err(SandboxError::Zygote(format!(
            "no shared libpython for {} (looked for {:?}; install libpython3-dev or libpython3.X)",
            python.display(),
            path
        )));
    }
    Ok(path)
}
