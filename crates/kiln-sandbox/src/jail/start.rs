//! Starting a jail: the host side of a jail's set-up up to the moment its
//! init **C** is released. The jail launcher runs it in its own process for
//! every jail (it clones C itself: no helper process in between); a spawned
//! `kiln __jail` (no launcher) runs it too and then only waits for C.
//!
//! The starter (host root, single-threaded) parses the spec, builds the
//! mount plan and the program's confinement, joins the slot's or services
//! channel's network namespace if the jail gets one (and goes back to its
//! own after the clone), `clone3`s C into its new namespaces (starting it in
//! the run's cgroup on v2), attaches C to the run's v1 cgroups, writes C's
//! uid/gid maps and releases it. Everything after that is C's (`init.rs`,
//! `watch.rs`): the go, a kernel's relay, the wall-time backstop, the status.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;
use nix::unistd::{Pid, pipe2};

use super::{JailError, clone_owned_by, init, join_network, prepare, write_id_maps};
use crate::probe::JAIL_NAMESPACES;
use crate::spec::{CgroupAttach, JailSpec, ParkMode};
use crate::sys::{self, Forked};

/// The server's ends of a jail: what its init gets from the server.
pub(crate) struct JailFds<'a> {
    /// The control pipe (read end): the spec for a spawned helper, then the
    /// go, a kernel's input; its end stops the jail.
    pub control: &'a OwnedFd,
    pub stdout: &'a OwnedFd,
    pub stderr: &'a OwnedFd,
    pub status: &'a OwnedFd,
    /// A socket to the fork-server (embedded warm jails).
    pub zygote: Option<&'a OwnedFd>,
}

/// What C gets from its starter besides the spec.
pub(crate) struct StartFds<'a> {
    pub jail: JailFds<'a>,
    /// `/dev/null`, opened once by the starter.
    pub devnull: &'a OwnedFd,
    /// A pidfd of the starter itself: C's parent-death signal is unset for
    /// a moment while C changes its uid; through this C sees whether its
    /// parent died meanwhile.
    pub starter: &'a OwnedFd,
    /// The starter's own network namespace, to go back to after cloning C
    /// into a namespace the server made.
    pub home_netns: &'a OwnedFd,
}

/// Starts the jail of `spec_line` (one line of JSON, no newline): clones
/// C and releases it. Returns C's pid and pidfd. On an error no C is left
/// running (it is killed; its starter's reaper collects it).
pub(crate) fn start(spec_line: &[u8], fds: &StartFds<'_>) -> Result<(Pid, OwnedFd), JailError> {
    let spec: JailSpec =
        serde_json::from_slice(spec_line).map_err(|e| JailError::setup("parse spec", e))?;
    let zygote = match (spec.park, fds.jail.zygote) {
        (Some(ParkMode::Embedded), Some(z)) => Some(z),
        (Some(ParkMode::Embedded), None) => {
            return Err(JailError::Setup(
                "embedded park mode without a fork-server socket".to_owned(),
            ));
        }
        (_, _) => None,
    };
    // Host root's supplementary groups (gid 0 among them) must not follow
    // the jail; inside, setgroups is denied, so drop them here.
    nix::unistd::setgroups(&[]).map_err(|e| JailError::setup("setgroups", e))?;
    let (plan, confinement) = prepare(&spec);
    // What the fork-server's program process applies (see `request_program`).
    let landlock_json = match zygote {
        Some(_) => serde_json::to_vec(&confinement.landlock)
            .map_err(|e| JailError::setup("encode the Landlock rules", e))?,
        None => Vec::new(),
    };
    // A kept jail's init outlives its runs: only its programs join the
    // run's groups (see `JailSpec::keep`).
    let cgroup_fd = match &spec.cgroup {
        Some(CgroupAttach::V2 { dir }) if !spec.keep => Some(
            open(
                dir,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| JailError::setup(format_args!("open cgroup {}", dir.display()), e))?,
        ),
        _ => None,
    };
    let (release_r, release_w) =
        pipe2(OFlag::O_CLOEXEC).map_err(|e| JailError::setup("release pipe", e))?;
    // the jail's init inherits the namespace joined here
    let joined = match (&spec.network, &spec.slot_netns) {
        (Some(net), _) => Some((&net.netns_path, net.netns_inode)),
        (None, Some(slot)) => Some((&slot.netns_path, slot.netns_inode)),
        (None, None) => None,
    };
    let namespaces = match joined {
        None => JAIL_NAMESPACES,
        Some((path, inode)) => {
            join_network(path, inode)?;
            JAIL_NAMESPACES & !libc::CLONE_NEWNET
        }
    };
    let forked = clone_owned_by(
        nix::unistd::Uid::from_raw(spec.id_base),
        namespaces,
        cgroup_fd.as_ref().map(|f| f.as_raw_fd()),
    );
    let (pid, pidfd) = match forked {
        Ok(Forked::Child) => {
            let start = init::Start {
                fds,
                release_r,
                zygote,
                spec_line,
                landlock_json: &landlock_json,
            };
            init::init_main(&spec, &plan, &confinement, start)
        }
        Ok(Forked::Parent { pid, pidfd }) => (pid, pidfd),
        Err(e) => {
            back_home(joined.is_some(), fds)?;
            return Err(e);
        }
    };
    drop(release_r);
    drop(cgroup_fd);
    let Some(pidfd) = pidfd else {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        back_home(joined.is_some(), fds)?;
        return Err(JailError::Setup("clone3 gave no pidfd".to_owned()));
    };
    let back = back_home(joined.is_some(), fds);
    let ready = back
        .and_then(|()| attach_v1(&spec, pid))
        .and_then(|()| write_id_maps(pid, spec.id_base))
        .and_then(|()| {
            nix::unistd::write(&release_w, b"1")
                .map(|_| ())
                .map_err(|e| JailError::setup("release jail init", e))
        });
    if let Err(e) = ready {
        let _ = sys::pidfd_kill(&pidfd);
        return Err(e);
    }
    Ok((pid, pidfd))
}

/// Returns the starter to its own network namespace after it joined the
/// jail's to clone C there.
fn back_home(joined: bool, fds: &StartFds<'_>) -> Result<(), JailError> {
    if !joined {
        return Ok(());
    }
    nix::sched::setns(fds.home_netns, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| JailError::setup("back to the starter's network namespace", e))
}

/// Attaches C to the run's cgroup-v1 groups (v2: C was cloned into its
/// group), before it is released, so that it and everything it forks is
/// counted and limited from its first step on.
fn attach_v1(spec: &JailSpec, pid: Pid) -> Result<(), JailError> {
    if let Some(CgroupAttach::V1 { procs }) = &spec.cgroup
        && !spec.keep
    {
        let pid = pid.to_string();
        for p in procs {
            std::fs::write(p, &pid)
                .map_err(|e| JailError::setup(format_args!("attach to {}", p.display()), e))?;
        }
    }
    Ok(())
}
