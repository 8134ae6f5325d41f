//! Messages with attached descriptors on `SOCK_SEQPACKET` Unix sockets: how
//! the server, the jail launcher, the fork-server and jail helpers talk.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::cmsg_space;
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};

use crate::sys;

/// A connected pair, both ends close-on-exec.
pub(crate) fn pair() -> nix::Result<(OwnedFd, OwnedFd)> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
}

/// Sends one message with `fds` attached.
pub(crate) fn send(sock: &OwnedFd, bytes: &[u8], fds: &[RawFd]) -> nix::Result<()> {
    let iov = [IoSlice::new(bytes)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    loop {
        // A seqpacket message goes whole or not at all: after EINTR, resend.
        // A closed peer is EPIPE, never SIGPIPE.
        match sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => return r.map(|_| ()),
        }
    }
}

/// Receives one message (up to `max` bytes) and the fds attached to it.
pub(crate) fn recv(sock: &OwnedFd, max: usize) -> nix::Result<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; max];
    let (n, fds) = recv_into(sock, &mut buf)?;
    buf.truncate(n);
    Ok((buf, fds))
}

/// Receives one message into `buf` (truncated to its length); returns the
/// message's length and the fds attached to it.
pub(crate) fn recv_into(sock: &OwnedFd, buf: &mut [u8]) -> nix::Result<(usize, Vec<OwnedFd>)> {
    let mut space = cmsg_space!([RawFd; 8]);
    let (n, raw) = {
        let mut iov = [IoSliceMut::new(buf)];
        // EINTR consumed nothing: receive again.
        let msg = loop {
            match recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            ) {
                Err(nix::errno::Errno::EINTR) => continue,
                r => break r?,
            }
        };
        let mut raw = Vec::new();
        for c in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                raw.extend(fds);
            }
        }
        (msg.bytes, raw)
    };
    // Descriptors the kernel just installed for us (SCM_RIGHTS).
    let fds = raw
        .into_iter()
        .filter_map(sys::adopt_inherited_fd)
        .collect();
    Ok((n, fds))
}

/// Waits until `sock` is readable, for at most `limit`. A signal arriving
/// meanwhile (the server's runtime gets them) only restarts the wait.
pub(crate) fn wait_readable(sock: &OwnedFd, limit: Duration) -> Result<(), String> {
    let until = Instant::now() + limit;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("no answer within {limit:?}"));
        }
        // poll takes at most u16::MAX ms at a time; longer waits loop
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [nix::poll::PollFd::new(
            sock.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        match nix::poll::poll(&mut fds, ms) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => return Ok(()),
            Err(e) => return Err(format!("wait: {e}")),
        }
    }
}

/// A long-lived process of the server's (the fork-server, the jail
/// launcher), killed and reaped when dropped.
#[derive(Debug)]
pub(crate) struct OwnedChild(Mutex<std::process::Child>);

impl OwnedChild {
    pub(crate) fn new(child: std::process::Child) -> OwnedChild {
        OwnedChild(Mutex::new(child))
    }

    pub(crate) fn id(&self) -> u32 {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).id()
    }
}

impl Drop for OwnedChild {
    fn drop(&mut self) {
        let child = self.0.get_mut().unwrap_or_else(|p| p.into_inner());
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Spawns `helper __<name>` with a cleared environment and one end of a
/// new socket pair as its fd 0; returns the other end and the process.
pub(crate) fn spawn_peer(
    helper: &std::path::Path,
    name: &str,
    args: &[&std::ffi::OsStr],
) -> std::io::Result<(OwnedFd, OwnedChild)> {
    use std::os::unix::process::CommandExt;
    let (ours, theirs) = pair()?;
    let child = std::process::Command::new(helper)
        .arg0("kiln")
        .arg(format!("__{name}"))
        .args(args)
        .env_clear()
        .stdin(std::process::Stdio::from(theirs))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()?;
    Ok((ours, OwnedChild::new(child)))
}

/// Body of `kiln __<name>` for a process that serves the socket on its fd 0:
/// runs `serve` and exits 0 when it returns `Ok` (the socket closed); on an
/// error, `report`s it on the socket, prints it and exits 1. No parent-death
/// signal: it fires when the *thread* that spawned the process exits (a
/// tokio blocking thread retires after idling); the server's death closes
/// the socket instead.
pub(crate) fn serve_stdin(
    name: &str,
    serve: impl FnOnce(&OwnedFd) -> Result<(), String>,
    report: impl FnOnce(&OwnedFd, &str),
) -> ! {
    let Some(sock) = sys::adopt_inherited_fd(0) else {
        eprintln!("kiln __{name}: internal entry point of the sandbox (no socket on fd 0)");
        sys::exit_now(2);
    };
    match serve(&sock) {
        Ok(()) => sys::exit_now(0),
        Err(why) => {
            report(&sock, &why);
            eprintln!("kiln __{name}: {why}");
            sys::exit_now(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_for_an_answer_survives_signals() {
        // A handled signal makes poll(2) fail with EINTR whatever SA_RESTART says;
        // the server's runtime handles SIGCHLD, so this happens in practice.
        let rt = tokio::runtime::Runtime::new().unwrap();
        let _handler = rt.block_on(async {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()).unwrap()
        });
        let (a, b) = pair().unwrap();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            tid_tx.send(nix::sys::pthread::pthread_self()).unwrap();
            wait_readable(&a, Duration::from_secs(10))
        });
        let tid = tid_rx.recv().unwrap();
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(20));
            nix::sys::pthread::pthread_kill(tid, nix::sys::signal::Signal::SIGUSR1).unwrap();
        }
        send(&b, b"ready", &[]).unwrap();
        assert_eq!(waiter.join().unwrap(), Ok(()));
    }

    #[test]
    fn waiting_for_an_answer_gives_up_after_the_limit() {
        let (a, _b) = pair().unwrap();
        let e = wait_readable(&a, Duration::from_millis(50)).unwrap_err();
        assert!(e.contains("no answer within"), "{e}");
    }
}
