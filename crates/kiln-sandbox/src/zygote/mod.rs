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
//! 3. per warm jail: helper → zygote: `g`, the [`crate::spec::JailSpec`]
//!    line, a newline and the program's Landlock rules as the helper made
//!    them from the spec's mount plan (JSON), with seven fds attached: stdout, stderr, the exec pipe's write
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
    /// The shared libpython (`libpython3.X.so.1.0`): the host's, or with
    /// [`ZygoteConfig::image_root`] the image's, by its path inside the
    /// image.
    pub libpython: PathBuf,
    /// A runtime image's root: the fork-server re-executes itself in a
    /// mount namespace where the image's `/usr` and `/etc` replace the
    /// host's (see `mountns::enter_image_system`), so the image's C library
    /// loads it and the image's libpython, and the template imports the
    /// image's modules, the ones its jails see. `None`: the host's.
    #[serde(default)]
    pub image_root: Option<PathBuf>,
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

/// Finds a runtime image's shared libpython: the newest
/// `usr/lib/<multiarch>/libpython3.N.so.1.0` below `image_root`, as the
/// path the fork-server sees once the image's `/usr` is its own.
pub fn find_image_libpython(image_root: &Path) -> Result<PathBuf, SandboxError> {
    let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
    let dir = image_root.join("usr/lib").join(&triple);
    let newest = std::fs::read_dir(&dir)
        .map_err(|e| SandboxError::io("read", &dir, e))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| {
            let minor: u32 = name
                .strip_prefix("libpython3.")?
                .strip_suffix(".so.1.0")?
                .parse()
                .ok()?;
            Some((minor, name))
        })
        .max();
    match newest {
        Some((_, name)) => Ok(PathBuf::from("/usr/lib").join(triple).join(name)),
        None => Err(SandboxError::Zygote(format!(
            "the runtime image has no shared libpython in {} (its recipe needs libpython3.N)",
            dir.display()
        ))),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_images_newest_libpython_is_found_by_its_path_inside_the_image() {
        let root = tempfile::tempdir().unwrap();
        let triple = format!("{}-linux-gnu", std::env::consts::ARCH);
        let lib = root.path().join("usr/lib").join(&triple);
        std::fs::create_dir_all(&lib).unwrap();
        assert!(find_image_libpython(root.path()).is_err());
        for name in [
            "libpython3.9.so.1.0",
            "libpython3.13.so.1.0",
            "libpython3.13.so.1",
            "libpython3.12.a",
        ] {
            std::fs::write(lib.join(name), b"").unwrap();
        }
        assert_eq!(
            find_image_libpython(root.path()).unwrap(),
            PathBuf::from("/usr/lib")
                .join(triple)
                .join("libpython3.13.so.1.0")
        );
    }
}
