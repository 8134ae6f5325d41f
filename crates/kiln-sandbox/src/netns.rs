//! The services channel's network: a network namespace made for one jail,
//! with `lo` up and one TCP listener on `127.0.0.1:<port>` that the server
//! keeps (the egress gateway serves it). The jail joins this namespace
//! instead of getting an empty one of its own, so loopback there reaches
//! exactly that listener and nothing else: the namespace has no other
//! interface, no route and no other socket.
//!
//! The namespace is created by a short-lived thread of the server (host
//! root; `unshare(CLONE_NEWNET)` affects only the calling thread) and is
//! owned by the host's user namespace, so the jail's root — whose user
//! namespace does not own it — cannot reconfigure it (no `CAP_NET_ADMIN`
//! there). The helper finds it through `/proc/<server>/fd/<n>` and checks
//! its inode before joining (`setns`), so a reused fd number can never put
//! a jail into another run's namespace.
//!
//! Runs without a channel never come here: their jails keep today's empty,
//! down network namespace, socket rules and seccomp profile.

use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use nix::fcntl::{OFlag, open};
use nix::sched::{CloneFlags, unshare};
use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto, socket,
};
use nix::sys::stat::{Mode, fstat};

use crate::error::SandboxError;
use crate::spec::NetworkSpec;

/// `lo` is the first interface of every network namespace.
const LOOPBACK_IFINDEX: i32 = 1;

/// One jail's network namespace (see the module docs). Cheap to clone; the
/// namespace lives while a clone, the listener or a process in it does.
#[derive(Debug, Clone)]
pub struct JailNetwork {
    netns: Arc<OwnedFd>,
    inode: u64,
    port: u16,
}

impl PartialEq for JailNetwork {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.netns, &other.netns)
    }
}

impl Eq for JailNetwork {}

impl JailNetwork {
    /// Makes the namespace, brings `lo` up and binds the listener on
    /// `127.0.0.1:port` inside it (non-blocking, ready for
    /// `tokio::net::TcpListener::from_std`). Costs a thread and a network
    /// namespace (what every jail's `clone3` pays anyway).
    pub fn create(port: u16) -> Result<(JailNetwork, TcpListener), SandboxError> {
        let (netns, inode, listener) = new_namespace("kiln-netns", move || listen(port))
            .map_err(|e| SandboxError::Setup(format!("network namespace: {e}")))?;
        Ok((
            JailNetwork {
                netns: Arc::new(netns),
                inode,
                port,
            },
            listener,
        ))
    }

    /// The port the jail connects to on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What the helper needs to join the namespace.
    pub(crate) fn spec(&self) -> NetworkSpec {
        NetworkSpec {
            netns_path: server_fd_path(&self.netns),
            netns_inode: self.inode,
            connect_port: self.port,
        }
    }
}

/// In the new namespace: `lo` up and the listener.
fn listen(port: u16) -> Result<TcpListener, String> {
    loopback_up().map_err(|e| format!("bring lo up: {e}"))?;
    let listener = TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listener: {e}"))?;
    Ok(listener)
}

/// Runs `f` on a short-lived thread named `name`, so that the namespace
/// changes it makes stay on that thread.
pub(crate) fn on_thread<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(f)
        .map_err(|e| format!("spawn thread: {e}"))?
        .join()
        .map_err(|_| "thread panicked".to_owned())?
}

/// A new network namespace, owned by the host's user namespace and made on
/// a short-lived thread (`name`) that runs `inside` in it: a descriptor of
/// the namespace, its inode and what `inside` returned.
pub(crate) fn new_namespace<T: Send + 'static>(
    name: &str,
    inside: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<(OwnedFd, u64, T), String> {
    let (netns, made) = on_thread(name, move || {
        unshare(CloneFlags::CLONE_NEWNET).map_err(|e| format!("unshare: {e}"))?;
        let made = inside()?;
        let netns = open(
            "/proc/thread-self/ns/net",
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("open /proc/thread-self/ns/net: {e}"))?;
        Ok((netns, made))
    })?;
    let inode = fstat(&netns).map_err(|e| format!("fstat: {e}"))?.st_ino;
    Ok((netns, inode, made))
}

/// The path through which a jail's helper opens the server's descriptor
/// `fd` (`/proc/<server>/fd/<n>`).
pub(crate) fn server_fd_path(fd: &OwnedFd) -> std::path::PathBuf {
    format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd()).into()
}

/// `ip link set lo up`, through rtnetlink: one `RTM_NEWLINK` request, and
/// its acknowledgement checked.
fn loopback_up() -> Result<(), String> {
    const RTM_NEWLINK: u16 = 16;
    const NLM_F_REQUEST: u16 = 1;
    const NLM_F_ACK: u16 = 4;
    const NLMSG_ERROR: u16 = 2;
    const IFF_UP: u32 = 1;
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )
    .map_err(|e| format!("netlink socket: {e}"))?;
    // struct nlmsghdr (16 bytes) + struct ifinfomsg (16 bytes)
    let mut msg = Vec::with_capacity(32);
    msg.extend_from_slice(&32u32.to_ne_bytes()); // nlmsg_len
    msg.extend_from_slice(&RTM_NEWLINK.to_ne_bytes()); // nlmsg_type
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes()); // nlmsg_flags
    msg.extend_from_slice(&1u32.to_ne_bytes()); // nlmsg_seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // nlmsg_pid
    msg.extend_from_slice(&[0u8, 0u8]); // ifi_family AF_UNSPEC, pad
    msg.extend_from_slice(&0u16.to_ne_bytes()); // ifi_type
    msg.extend_from_slice(&LOOPBACK_IFINDEX.to_ne_bytes()); // ifi_index
    msg.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_flags
    msg.extend_from_slice(&IFF_UP.to_ne_bytes()); // ifi_change
    sendto(
        fd.as_raw_fd(),
        &msg,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )
    .map_err(|e| format!("netlink send: {e}"))?;
    let mut buf = [0u8; 1024];
    let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())
        .map_err(|e| format!("netlink receive: {e}"))?;
    // the acknowledgement: nlmsghdr of type NLMSG_ERROR, then the errno
    // (0 = success, else negative)
    if n < 20 || u16::from_ne_bytes([buf[4], buf[5]]) != NLMSG_ERROR {
        return Err("netlink: unexpected answer".to_owned());
    }
    let err = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
    if err != 0 {
        return Err(format!("netlink: {}", nix::errno::Errno::from_raw(-err)));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// Whether we are root; if not, says the test is skipped (and fails
    /// under CI, where tests run as root).
    pub(crate) fn root() -> bool {
        let root = nix::unistd::geteuid().is_root();
        let ci = std::env::var_os("CI").is_some();
        assert!(root || !ci, "CI is set and we are not root");
        if !root {
            eprintln!("SKIPPED: needs root");
        }
        root
    }

    /// A connection made from inside the namespace reaches the listener;
    /// the host's loopback does not.
    #[test]
    fn the_listener_is_reachable_from_inside_the_namespace_only() {
        if !root() {
            return;
        }
        let (net, listener) = JailNetwork::create(80).expect("create");
        listener.set_nonblocking(false).expect("blocking");
        let spec = net.spec();
        // the host has nothing on 127.0.0.1:80 of this namespace
        let path = spec.netns_path.clone();
        let inside = std::thread::spawn(move || {
            let fd = open(&path, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).expect("open");
            assert_eq!(fstat(&fd).expect("fstat").st_ino, spec.netns_inode);
            nix::sched::setns(&fd, CloneFlags::CLONE_NEWNET).expect("setns");
            let mut s = std::net::TcpStream::connect(("127.0.0.1", 80)).expect("connect inside");
            s.write_all(b"ping").expect("write");
            let other = std::net::TcpStream::connect(("127.0.0.1", 81));
            assert!(other.is_err(), "another port answered inside");
            let outside = std::net::TcpStream::connect_timeout(
                &"1.1.1.1:80".parse().expect("addr"),
                std::time::Duration::from_millis(500),
            );
            assert!(outside.is_err(), "a route out of the namespace exists");
        });
        let (mut conn, _) = listener.accept().expect("accept");
        let mut buf = [0u8; 4];
        conn.read_exact(&mut buf).expect("read");
        assert_eq!(&buf, b"ping");
        inside.join().expect("inside thread");
        // two namespaces bind the same port independently
        let (_net2, _l2) = JailNetwork::create(80).expect("second");
        assert_ne!(net, _net2);
    }
}
