//! One network namespace per uid slot, made once and joined by that slot's
//! jails one after another, instead of a new one in every jail's `clone3`
//! (creating one costs the helper about 0.5 ms of CPU, and the kernel's
//! `cleanup_net` worker about 0.6 ms more when the jail ends).
//!
//! Like a services channel's namespace (`netns.rs`) it is made by a
//! short-lived thread of the server and owned by the host's user namespace:
//! the jail's root has no `CAP_NET_ADMIN` in it, so no jail can bring `lo`
//! up, add an address or a route, or change a sysctl under `/proc/sys/net`.
//! It is never brought up: like the namespace every jail made before, it has
//! `lo` down, no address, no route — no network at all, not even loopback.
//!
//! What a jail can leave in it is sockets (the run's seccomp profile allows
//! `AF_UNIX` only, so: unix sockets, e.g. one bound to an abstract name and
//! kept alive past the run by an `SCM_RIGHTS` cycle until the kernel's
//! garbage collector finds it) and, without that profile, counters. So the
//! namespace is handed to the slot's next jail only after the slot's runs
//! are over (every process of the jail is dead) and a check found it exactly
//! as it was made: each per-namespace socket table and counter file under
//! `/proc/net` ([`WATCHED`]) read again, byte for byte equal to what it held
//! when the namespace was new. Anything else, or any error on the way, and
//! the namespace is dropped and a new one made. This runs in the slot's
//! clean-up (off the request path), before its index is handed out again.
//!
//! Kernel (on-demand) slots keep a namespace per jail: a kernel lives long,
//! so creating one is no part of a request's floor. So do runs without the
//! seccomp profile (degraded hosts: every socket family) and runs with a
//! services channel (they join their own namespace, `netns.rs`).

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::netns::{new_namespace, server_fd_path};
use crate::spec::SlotNetnsSpec;

/// The name of the short-lived threads that make the namespaces.
const THREAD: &str = "kiln-slotnet";

/// The files under `/proc/<thread>/net/` that hold a namespace's own
/// state: its socket tables and its counters. Files with host-wide numbers
/// in them (`sockstat`'s memory, `protocols`, `softnet_stat`) are not here:
/// they change with the host, not with the namespace. Nor are the tables
/// whose read walks a host-wide table, of sockets no jail that joins a
/// slot's namespace can make (its seccomp profile allows `AF_UNIX` only):
/// `tcp` and `tcp6` (the host's whole TCP hash table, 3.4 ms of CPU each,
/// measured), `udp`, `udp6`, `udplite` and `udplite6` (the host's UDP hash
/// table) and `netlink` (every netlink socket of every namespace on the
/// host: each live kernel's namespace adds its own kernel sockets, so with
/// 1,000 idle kernels the check cost the server ~1.2 ms more per request).
/// Traffic on any IP socket would move `snmp`'s and `netstat`'s counters
/// anyway.
pub(crate) const WATCHED: &[&str] = &[
    "unix", "packet", "raw", "raw6", "icmp", "icmp6", "snmp", "snmp6", "netstat", "dev",
];

/// The observable state of a namespace: each watched file's bytes (`None`:
/// the kernel has no such file).
type State = Vec<Option<Vec<u8>>>;

/// One slot's namespace, its watched files and what they held when it was
/// new. The files are opened once, by the thread that made the namespace
/// (a `/proc/<thread>/net/` file shows the namespace of the thread that
/// opened it, for as long as it is open), and read again from their start
/// at each check: no thread, `setns`, open or close per check.
#[derive(Debug)]
struct SlotNetns {
    fd: OwnedFd,
    inode: u64,
    watched: Vec<Option<File>>,
    fresh: State,
}

/// The namespaces of a pool's fixed slots (index → namespace, none until
/// the slot's first clean-up made one).
#[derive(Debug)]
pub(crate) struct SlotNets {
    nets: Mutex<Vec<Option<Arc<SlotNetns>>>>,
}

impl SlotNets {
    pub(crate) fn new(slots: usize) -> SlotNets {
        SlotNets {
            nets: Mutex::new(vec![None; slots]),
        }
    }

    fn nets(&self) -> MutexGuard<'_, Vec<Option<Arc<SlotNetns>>>> {
        // every update is one slot's assignment: a poisoned lock is consistent
        self.nets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What a jail of slot `index` needs to join its namespace; `None`: the
    /// jail makes its own (the slot has none yet).
    pub(crate) fn spec(&self, index: u32) -> Option<SlotNetnsSpec> {
        let nets = self.nets();
        let net = nets.get(index as usize)?.as_ref()?;
        Some(SlotNetnsSpec {
            netns_path: server_fd_path(&net.fd),
            netns_inode: net.inode,
        })
    }

    /// After every run of slot `index` is over and before the index is
    /// handed out again: keeps its namespace if it is exactly as it was
    /// made, else (or if it has none) makes a new one. Blocks; a failure
    /// leaves the slot without one (its jails then make their own).
    pub(crate) fn recycle(&self, index: u32) {
        let Some(current) = self.nets().get(index as usize).cloned() else {
            return;
        };
        if let Some(net) = current {
            match check(&net) {
                Ok(true) => return,
                Ok(false) => tracing::info!(
                    slot = index,
                    "the slot's network namespace was left with sockets or counters changed; replaced"
                ),
                Err(e) => tracing::warn!(
                    slot = index,
                    error = %e,
                    "cannot check the slot's network namespace; replaced"
                ),
            }
        }
        let made = match make() {
            Ok(net) => Some(Arc::new(net)),
            Err(e) => {
                tracing::warn!(slot = index, error = %e, "cannot make a slot's network namespace");
                None
            }
        };
        if let Some(slot) = self.nets().get_mut(index as usize) {
            *slot = made;
        }
    }
}

/// Opens every watched file of the calling thread's network namespace.
fn open_watched() -> Vec<Option<File>> {
    WATCHED
        .iter()
        .map(|f| File::open(format!("/proc/thread-self/net/{f}")).ok())
        .collect()
}

/// What the watched files hold now, each read from its start (a `seq_file`
/// read at offset 0 starts its table or counters again).
fn read_state(watched: &[Option<File>]) -> Result<State, String> {
    watched
        .iter()
        .zip(WATCHED)
        .map(|(file, name)| match file {
            None => Ok(None),
            Some(f) => {
                let mut bytes = Vec::with_capacity(4096);
                let mut chunk = [0u8; 4096];
                loop {
                    match f.read_at(&mut chunk, bytes.len() as u64) {
                        Ok(0) => return Ok(Some(bytes)),
                        Ok(n) => bytes.extend_from_slice(&chunk[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(format!("read /proc/net/{name}: {e}")),
                    }
                }
            }
        })
        .collect()
}

/// A new namespace (`lo` left down), its watched files and their state as
/// new.
fn make() -> Result<SlotNetns, String> {
    let (fd, inode, (watched, fresh)) = new_namespace(THREAD, || {
        let watched = open_watched();
        let fresh = read_state(&watched)?;
        Ok((watched, fresh))
    })?;
    Ok(SlotNetns {
        fd,
        inode,
        watched,
        fresh,
    })
}

/// Whether `net` is exactly as it was made.
fn check(net: &SlotNetns) -> Result<bool, String> {
    Ok(read_state(&net.watched)? == net.fresh)
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use nix::fcntl::{OFlag, open};
    use nix::sched::{CloneFlags, setns};
    use nix::sys::stat::{Mode, fstat};

    use super::*;
    use crate::netns::tests::root;

    /// Runs `f` on a thread inside slot `index`'s namespace.
    fn inside(nets: &SlotNets, index: u32, f: impl FnOnce() + Send + 'static) {
        let spec = nets.spec(index).expect("the slot has a namespace");
        std::thread::spawn(move || {
            let fd = open(&spec.netns_path, OFlag::O_RDONLY, Mode::empty()).expect("open");
            assert_eq!(fstat(&fd).expect("fstat").st_ino, spec.netns_inode);
            setns(&fd, CloneFlags::CLONE_NEWNET).expect("setns");
            f();
        })
        .join()
        .expect("inside thread");
    }

    #[test]
    fn an_untouched_namespace_is_kept_and_one_left_with_a_socket_is_replaced() {
        if !root() {
            return;
        }
        let nets = SlotNets::new(2);
        assert!(
            nets.spec(0).is_none(),
            "no namespace before the first clean-up"
        );
        nets.recycle(0);
        let first = nets.spec(0).expect("made at the first clean-up");
        assert!(nets.spec(1).is_none(), "only the recycled slot has one");
        // used without leaving anything: kept
        inside(&nets, 0, || {
            let s = UnixDatagram::unbound().expect("socket");
            drop(s);
        });
        nets.recycle(0);
        assert_eq!(nets.spec(0).expect("kept").netns_inode, first.netns_inode);
        // a socket still alive at the check (as one held by an SCM_RIGHTS
        // cycle is): replaced
        let (tx, rx) = std::sync::mpsc::channel();
        inside(&nets, 0, move || {
            let s = UnixDatagram::unbound().expect("socket");
            tx.send(s).expect("keep it");
        });
        let left = rx.recv().expect("the socket");
        nets.recycle(0);
        let second = nets.spec(0).expect("replaced");
        assert_ne!(second.netns_inode, first.netns_inode);
        drop(left);
    }

    #[test]
    fn a_new_namespace_has_loopback_down_and_one_with_counters_changed_is_replaced() {
        if !root() {
            return;
        }
        let nets = SlotNets::new(1);
        nets.recycle(0);
        inside(&nets, 0, || {
            let dev = std::fs::read_to_string("/proc/thread-self/net/dev").expect("dev");
            assert!(dev.contains("lo:"), "{dev}");
            let route = std::fs::read_to_string("/proc/thread-self/net/route").expect("route");
            assert_eq!(route.lines().skip(1).count(), 0, "a route exists: {route}");
            let s = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind");
            let sent = s.send_to(b"x", "127.0.0.1:9");
            assert!(sent.is_err(), "loopback reachable");
        });
        // that failed send counted in the namespace's counters: replaced
        let before = nets.spec(0).expect("made").netns_inode;
        nets.recycle(0);
        assert_ne!(nets.spec(0).expect("replaced").netns_inode, before);
    }
}
