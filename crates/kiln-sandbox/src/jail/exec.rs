//! The user program's process: leaves init's session, drops to uid 1000
//! with limits, no capabilities, no_new_privs, Landlock and the seccomp
//! filters, and `execve`s `argv[0]` with exactly the spec's environment.
//!
//! Failures before `execve` are written to the exec pipe (close-on-exec, so
//! a successful `execve` closes it without data) for init to report.
//!
//! A parked (warm) jail's program process confines itself exactly the same
//! way, says `parked` on the exec pipe and then waits for the go message on
//! the go pipe (see [`ParkMode`]): only then does it learn what to run.

use std::convert::Infallible;
use std::ffi::CString;
use std::os::fd::OwnedFd;

use super::confine::{self, Enforcement};
use super::{Confinement, EmbeddedRunner, JailError};
use crate::seccomp;
use crate::spec::{GO_MAX_BYTES, GoMsg, JAIL_UID, JailSpec, ParkMode, STATUS_FD, StatusMsg};
use crate::sys;
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use nix::sys::stat::{Mode, umask};
use nix::unistd::{
    Gid, Uid, chdir, execve, getgroups, getppid, setresgid, setresuid, setsid, write,
};

/// RLIMIT_SIGPENDING of the jail's user: signals queued at once.
pub const SIGPENDING: u64 = 1024;
/// RLIMIT_MSGQUEUE: bytes of POSIX message queues (three default-sized
/// queues).
pub const MSGQUEUE_BYTES: u64 = 256 * 1024;

/// Runs G; only returns through `execve`, the embedded runner or `_exit(127)`.
pub(super) fn exec_main(
    spec: &JailSpec,
    confinement: &Confinement,
    err_w: OwnedFd,
    go_r: Option<OwnedFd>,
    runner: Option<EmbeddedRunner>,
) -> ! {
    let failure = match exec(spec, confinement, &err_w, go_r, runner) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    let _ = write(&err_w, &failure.into_status().to_line());
    sys::exit_now(127)
}

/// Reads the go message: one line. The jail's init writes nothing after it
/// (and closes the go pipe) unless the program is a kernel, which then
/// asks for more with its first output; so reading up to the newline never
/// takes a byte meant for the program. (The line holds no other newline:
/// it is JSON.)
fn read_go(go_r: &OwnedFd) -> Result<GoMsg, JailError> {
    let mut bytes = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match nix::unistd::read(go_r, &mut buf) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(JailError::setup("read go message", e)),
        };
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&buf[..n]);
        if bytes.len() > GO_MAX_BYTES {
            return Err(JailError::Setup("go message too large".to_owned()));
        }
        if bytes.ends_with(b"\n") {
            break;
        }
    }
    serde_json::from_slice(&bytes).map_err(|e| JailError::setup("parse go message", e))
}

fn cstrings(what: &str, items: impl Iterator<Item = String>) -> Result<Vec<CString>, JailError> {
    items.map(|s| cstring(what, &s)).collect()
}

fn cstring(what: &str, s: &str) -> Result<CString, JailError> {
    CString::new(s).map_err(|_| JailError::Setup(format!("{what}: contains a NUL byte")))
}

/// Sets a limit, clamped to the current hard limit (raising it would need
/// CAP_SYS_RESOURCE in the host's user namespace).
fn limit(resource: Resource, soft: u64, hard: u64) -> Result<(), JailError> {
    let (_, cur_hard) = getrlimit(resource)
        .map_err(|e| JailError::setup(format_args!("getrlimit {resource:?}"), e))?;
    let hard = hard.min(cur_hard);
    setrlimit(resource, soft.min(hard), hard)
        .map_err(|e| JailError::setup(format_args!("setrlimit {resource:?}"), e))
}

/// Fails unless the permitted, effective and ambient capability sets are
/// empty (read from /proc/self/status: the jail mounts its own /proc).
fn no_capabilities_left() -> Result<(), JailError> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| JailError::setup("read /proc/self/status", e))?;
    for set in ["CapPrm:", "CapEff:", "CapAmb:"] {
        let value = status
            .lines()
            .find_map(|l| l.strip_prefix(set))
            .map(str::trim)
            .ok_or_else(|| JailError::Setup(format!("no {set} in /proc/self/status")))?;
        if value.bytes().any(|b| b != b'0') {
            return Err(JailError::Setup(format!(
                "capabilities survived the change to uid {JAIL_UID}: {set} {value}"
            )));
        }
    }
    Ok(())
}

fn exec(
    spec: &JailSpec,
    confinement: &Confinement,
    err_w: &OwnedFd,
    go_r: Option<OwnedFd>,
    runner: Option<EmbeddedRunner>,
) -> Result<Infallible, JailError> {
    // Our parent: the jail's init (1), or the fork-server (0: outside the
    // pid namespace); see the parent-death signal below.
    let parent = getppid();
    // The status pipe is init's alone.
    sys::close_raw(STATUS_FD);
    setsid().map_err(|e| JailError::setup("setsid", e))?;
    sys::reset_signals().map_err(|e| JailError::setup("reset signals", e))?;
    // Make the user program the OOM killer's first choice, before init.
    // Changing to uid 0 of the namespace left us non-dumpable, which makes
    // our /proc files belong to host root; dumpable again, they are ours
    // (setresuid below and execve reset the flag as usual).
    nix::sys::prctl::set_dumpable(true).map_err(|e| JailError::setup("set dumpable", e))?;
    std::fs::write("/proc/self/oom_score_adj", "1000")
        .map_err(|e| JailError::setup("write oom_score_adj", e))?;

    let l = &spec.limits;
    limit(Resource::RLIMIT_CORE, 0, 0)?;
    limit(Resource::RLIMIT_NOFILE, l.open_files, l.open_files)?;
    limit(Resource::RLIMIT_FSIZE, l.file_size_bytes, l.file_size_bytes)?;
    limit(
        Resource::RLIMIT_CPU,
        l.cpu_secs,
        l.cpu_secs.saturating_add(1),
    )?;
    limit(Resource::RLIMIT_NPROC, l.nproc, l.nproc)?;
    // Queued signals and POSIX message queue bytes are per-user budgets:
    // bounded here for the jail's user (and charged to the slot's uid on
    // the host, never to root's; see `clone_owned_by`).
    limit(Resource::RLIMIT_SIGPENDING, SIGPENDING, SIGPENDING)?;
    limit(Resource::RLIMIT_MSGQUEUE, MSGQUEUE_BYTES, MSGQUEUE_BYTES)?;

    // The starter dropped host root's groups and the jail may not call
    // setgroups (denied in its user namespace): check instead of setting.
    let groups = getgroups().map_err(|e| JailError::setup("getgroups", e))?;
    if !groups.is_empty() {
        return Err(JailError::Setup(format!(
            "setgroups: supplementary groups remain: {groups:?}"
        )));
    }
    // Nothing may ever hand a capability back (file caps, setuid binaries).
    sys::drop_bounding_and_ambient_caps().map_err(|e| JailError::setup("drop bounding set", e))?;
    let gid = Gid::from_raw(JAIL_UID);
    let uid = Uid::from_raw(JAIL_UID);
    setresgid(gid, gid, gid).map_err(|e| JailError::setup("setresgid 1000", e))?;
    // Leaving uid 0 clears every capability.
    setresuid(uid, uid, uid).map_err(|e| JailError::setup("setresuid 1000", e))?;
    // ... but only when leaving uid 0: make sure that is what happened.
    no_capabilities_left()?;
    umask(Mode::from_bits_truncate(0o022));
    let cwd = if spec.project.is_some() {
        crate::PROJECT_DIR
    } else {
        "/mnt/data"
    };
    chdir(cwd).map_err(|e| JailError::setup("chdir to the working directory", e))?;

    // A pre-started runtime reads the go message on its stdin.
    if spec.park == Some(ParkMode::Prestart) {
        let Some(go_r) = go_r.as_ref() else {
            return Err(JailError::Setup("prestart: no go pipe".to_owned()));
        };
        sys::dup2_raw(go_r, 0).map_err(|e| JailError::setup("go pipe onto stdin", e))?;
    }
    // Every fd above stderr (the exec and go pipes included) closes on execve.
    sys::cloexec_from(STATUS_FD).map_err(|e| JailError::setup("close fds", e))?;
    nix::sys::prctl::set_no_new_privs().map_err(|e| JailError::setup("no_new_privs", e))?;
    // Landlock first: its system calls are not on the seccomp allow-list.
    if let Some(rules) = &confinement.landlock {
        match confine::restrict(rules, confinement.connect_port)
            .map_err(|e| JailError::setup("landlock", e))?
        {
            Enforcement::Full | Enforcement::Partial => {}
            Enforcement::None => {
                return Err(JailError::Setup(
                    "landlock: the kernel enforced none of the rules".to_owned(),
                ));
            }
        }
    }
    if !confinement.filters.is_empty() {
        seccomp::install(&confinement.filters).map_err(|e| JailError::setup("seccomp", e))?;
    }
    // Every credential change (joining the jail, uid 0, uid 1000) cleared
    // the parent-death signal; none follows, so arm it now: a fork-server
    // that dies takes its programs with it. A parent that died before is
    // seen as a new parent (the jail's init).
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| JailError::setup("set parent-death signal", e))?;
    if getppid() != parent {
        return Err(JailError::Setup(
            "the program's parent exited during setup".to_owned(),
        ));
    }

    // Fully confined. A parked process waits here for what to run.
    let (argv, env) = match (spec.park, go_r) {
        (None | Some(ParkMode::Prestart), _) => (spec.argv.clone(), spec.env.clone()),
        (Some(mode @ (ParkMode::Exec | ParkMode::Embedded)), Some(go_r)) => {
            write(err_w, &StatusMsg::Parked.to_line())
                .map_err(|e| JailError::setup("report parked", e))?;
            let go = read_go(&go_r)?;
            if go.kernel {
                // a kernel reads its requests where the go came from
                sys::dup2_raw(&go_r, 0).map_err(|e| JailError::setup("go pipe onto stdin", e))?;
            }
            drop(go_r);
            // Only ever lowers: the parked limit came from the server's
            // configuration, the go from one request.
            limit(
                Resource::RLIMIT_CPU,
                go.cpu_secs,
                go.cpu_secs.saturating_add(1),
            )?;
            if mode == ParkMode::Embedded {
                let Some(run) = runner else {
                    return Err(JailError::Setup(
                        "embedded park mode outside the fork-server".to_owned(),
                    ));
                };
                // Nothing of the jail's plumbing may stay open in the
                // program's process (there is no execve to close it).
                sys::close_from(STATUS_FD).map_err(|e| JailError::setup("close fds", e))?;
                run(&go);
            }
            (go.argv, go.env)
        }
        (Some(_), None) => return Err(JailError::Setup("parked without a go pipe".to_owned())),
    };
    let argv = cstrings("argv", argv.into_iter())?;
    let env = cstrings("env", env.into_iter().map(|(k, v)| format!("{k}={v}")))?;
    let Some(program) = argv.first() else {
        return Err(JailError::Setup("execve: empty argv".to_owned()));
    };
    let shown = program.to_string_lossy().into_owned();
    execve(program, &argv, &env).map_err(|e| JailError::Exec(format!("execve {shown}: {e}")))
}
