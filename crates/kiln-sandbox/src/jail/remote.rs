//! A jail init's side of the fork-server protocol (see `zygote/mod.rs`): it
//! asks the fork-server for the program process of its jail. Kept with the
//! jail so that the jail does not depend on the fork-server's module (which
//! depends on the jail for the program's confinement).

use std::os::fd::{AsRawFd, OwnedFd};

use crate::seqpacket::{self, recv, send};

/// The fds of one program request, in protocol order.
pub(crate) struct ProgramFds<'a> {
    pub stdout: &'a dyn AsRawFd,
    pub stderr: &'a dyn AsRawFd,
    pub exec_w: &'a OwnedFd,
    pub go_r: &'a OwnedFd,
    pub exit_w: &'a OwnedFd,
    pub init_pidfd: &'a OwnedFd,
}

/// In a jail's init: asks the fork-server on `sock` for the program process
/// of the jail whose init `fds.init_pidfd` is; returns its pid. The request
/// is `g`, the spec (one line of JSON, no newline), a newline and the
/// program's Landlock rules as the jail's starter made them (JSON): the program
/// process applies those rather than building the mount plan again.
pub(crate) fn request_program(
    sock: &OwnedFd,
    spec: &[u8],
    landlock_rules: &[u8],
    fds: &ProgramFds<'_>,
) -> Result<i32, String> {
    let (ours, theirs) = seqpacket::pair().map_err(|e| format!("socketpair: {e}"))?;
    let mut msg = Vec::with_capacity(spec.len() + landlock_rules.len() + 2);
    msg.push(b'g');
    msg.extend_from_slice(spec);
    msg.push(b'\n');
    msg.extend_from_slice(landlock_rules);
    let raw = [
        fds.stdout.as_raw_fd(),
        fds.stderr.as_raw_fd(),
        fds.exec_w.as_raw_fd(),
        fds.go_r.as_raw_fd(),
        fds.exit_w.as_raw_fd(),
        fds.init_pidfd.as_raw_fd(),
        theirs.as_raw_fd(),
    ];
    send(sock, &msg, &raw).map_err(|e| format!("ask the fork-server: {e}"))?;
    drop(theirs);
    let (bytes, _) = recv(&ours, 4096).map_err(|e| format!("fork-server answer: {e}"))?;
    match <[u8; 4]>::try_from(bytes.as_slice()) {
        Ok(pid) => Ok(i32::from_le_bytes(pid)),
        Err(_) if bytes.is_empty() => Err("the fork-server is gone".to_owned()),
        Err(_) => Err(format!(
            "the fork-server refused: {}",
            String::from_utf8_lossy(&bytes)
        )),
    }
}
