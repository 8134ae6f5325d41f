//! Landlock for the user program's process: file access only beneath the
//! paths of [`plan::landlock_rules`], no TCP bind or connect (ABI 4+), no
//! signals to or abstract-socket connections with processes outside the jail
//! (ABI 6+), and no audit records for what it is denied (ABI 7+: a jail must
//! not be able to flood the host's audit log).
//!
//! Targets ABI 7 (what this kernel offers and the tests exercise) in
//! best-effort mode: an older kernel enforces what it knows. The caller
//! decides whether "not enforced at all" is an error.

use std::path::PathBuf;

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, NetPort, PathBeneath, PathFd, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, make_bitflags,
};

use super::plan::PathAccess;

/// The ABI whose rights we ask for.
const TARGET_ABI: ABI = ABI::V7;

/// How far Landlock is in force after [`restrict`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    Full,
    Partial,
    None,
}

fn rights(access: PathAccess) -> BitFlags<AccessFs> {
    match access {
        PathAccess::ReadExec => make_bitflags!(AccessFs::{Execute | ReadFile | ReadDir}),
        PathAccess::Proc => make_bitflags!(AccessFs::{ReadFile | ReadDir | WriteFile}),
        PathAccess::Devices => {
            make_bitflags!(AccessFs::{ReadFile | ReadDir | WriteFile | Truncate | IoctlDev})
        }
        PathAccess::ReadWrite => AccessFs::from_all(TARGET_ABI),
    }
}

/// Restricts the calling thread (and everything it executes or forks) to
/// `rules`; TCP connect only to `connect_port` (a services channel), if
/// any. Sets no_new_privs. Fails with `"<step>: <error>"`.
pub fn restrict(
    rules: &[(PathBuf, PathAccess)],
    connect_port: Option<u16>,
) -> Result<Enforcement, String> {
    let mut ruleset = landlock::Ruleset::default()
        .handle_access(AccessFs::from_all(TARGET_ABI))
        .and_then(|r| r.handle_access(AccessNet::from_all(TARGET_ABI)))
        .and_then(|r| r.scope(Scope::from_all(TARGET_ABI)))
        .and_then(|r| r.create())
        .and_then(|r| r.log_same_exec(false))
        .map_err(|e| format!("create ruleset: {e}"))?;
    for (path, access) in rules {
        let fd = PathFd::new(path).map_err(|e| format!("open {}: {e}", path.display()))?;
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, rights(*access)))
            .map_err(|e| format!("add rule for {}: {e}", path.display()))?;
    }
    if let Some(port) = connect_port {
        ruleset = ruleset
            .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
            .map_err(|e| format!("add rule for port {port}: {e}"))?;
    }
    let status = ruleset
        .restrict_self()
        .map_err(|e| format!("restrict self: {e}"))?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforcement::Full,
        RulesetStatus::PartiallyEnforced => Enforcement::Partial,
        _ => Enforcement::None,
    })
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};

    use super::*;

    /// Landlock restricts only the calling thread and what it starts, so a
    /// dedicated thread can try it without touching the test process.
    #[test]
    fn restricted_thread_cannot_read_outside_its_rules_nor_use_tcp() {
        if crate::sys::landlock_abi().is_none() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set and this kernel has no Landlock"
            );
            eprintln!("SKIPPED: no Landlock on this kernel");
            return;
        }
        let allowed = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(allowed.path().join("in"), "x").expect("write");
        std::fs::write(outside.path().join("out"), "x").expect("write");
        // A listener made before the restriction: connecting to it needs
        // LANDLOCK_ACCESS_NET_CONNECT_TCP, which no rule grants.
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let rules = vec![(allowed.path().to_path_buf(), PathAccess::ReadWrite)];
        let (a, o) = (allowed.path().to_path_buf(), outside.path().to_path_buf());
        let result = std::thread::spawn(move || {
            let enforced = restrict(&rules, None);
            let inside = std::fs::read_to_string(a.join("in")).map_err(|e| e.kind());
            let created = std::fs::write(a.join("new"), "y").map_err(|e| e.kind());
            let out = std::fs::read_to_string(o.join("out")).map_err(|e| e.kind());
            let bind = TcpListener::bind("127.0.0.1:0")
                .map(|_| ())
                .map_err(|e| e.kind());
            let connect = TcpStream::connect(("127.0.0.1", port))
                .map(|_| ())
                .map_err(|e| e.kind());
            (enforced, inside, created, out, bind, connect)
        })
        .join()
        .expect("thread");
        let (enforced, inside, created, out, bind, connect) = result;
        assert_eq!(enforced, Ok(Enforcement::Full));
        assert_eq!(inside, Ok("x".to_owned()));
        assert_eq!(created, Ok(()));
        let denied = std::io::ErrorKind::PermissionDenied;
        assert_eq!(out, Err(denied));
        assert_eq!(bind, Err(denied));
        assert_eq!(connect, Err(denied));
        // The test process itself is unaffected.
        assert!(std::fs::read_to_string(outside.path().join("out")).is_ok());
    }
}
