//! Kiln as PID 1 (a container started without an init): the process
//! splits in two before anything else runs. PID 1 stays a minimal init: it
//! forwards the signals an operator sends (TERM, INT, HUP, QUIT, USR1,
//! USR2) to the server, reaps every process that is orphaned into it, and
//! exits with the server's status when the server ends (which makes the
//! kernel kill whatever is left in the namespace). The server runs as its
//! child, a normal process that never has to reap what it did not start.
//!
//! The server does not leave jail inits behind on its own (the launcher is
//! their subreaper, and a dropped run ends through its helper), but as PID 1
//! it would inherit every orphan of the container, and tokio only reaps
//! the children it spawned.

use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::sys::{self, Forked};

/// Signals PID 1 passes on to the server.
const FORWARDED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// When this process is PID 1 of its pid namespace, forks: returns in the
/// child (which goes on as the server) and never returns in PID 1, which
/// becomes the init described above. Does nothing otherwise. Call first
/// thing in `main`, while the process is single-threaded.
pub fn init_if_pid1() -> std::io::Result<()> {
    if nix::unistd::getpid().as_raw() != 1 {
        return Ok(());
    }
    let mut signals = SigSet::empty();
    for s in FORWARDED.into_iter().chain([Signal::SIGCHLD]) {
        signals.add(s);
    }
    // Blocked before the fork, so none sent meanwhile is lost.
    signals.thread_block()?;
    match sys::fork_single_threaded()? {
        Forked::Child => {
            signals.thread_unblock()?;
            Ok(())
        }
        Forked::Parent { pid, .. } => run_init(pid, &signals),
    }
}

/// PID 1's loop. Never returns.
fn run_init(server: Pid, signals: &SigSet) -> ! {
    let _ = nix::sys::prctl::set_name(c"kiln-init");
    let sigfd = match SignalFd::new(signals) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("kiln init: signalfd: {e}; the server runs without an init");
            // Without a way to hear signals, only waiting is left.
            wait_for(server)
        }
    };
    loop {
        let signo = match sigfd.read_signal() {
            Ok(Some(info)) => info.ssi_signo as i32,
            Ok(None) => continue,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => {
                eprintln!("kiln init: read signal: {e}");
                wait_for(server)
            }
        };
        match Signal::try_from(signo) {
            Ok(Signal::SIGCHLD) => reap(server),
            Ok(sig) => {
                let _ = kill(server, sig);
            }
            Err(_) => {}
        }
    }
}

/// Reaps every child that has exited; exits like the server once it has.
fn reap(server: Pid) {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == server => sys::exit_now(code),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == server => {
                sys::exit_now(128 + sig as i32)
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(_) => continue,
        }
    }
}

/// Reaps until the server has exited, then exits like it.
fn wait_for(server: Pid) -> ! {
    loop {
        match waitpid(Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(pid, code)) if pid == server => sys::exit_now(code),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == server => {
                sys::exit_now(128 + sig as i32)
            }
            Err(nix::errno::Errno::ECHILD) => sys::exit_now(1),
            _ => continue,
        }
    }
}
