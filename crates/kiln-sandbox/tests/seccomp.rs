//! Every denial of the default seccomp profile, made from inside a jail:
//! the calls the issue names, calls that are merely not on the allow-list
//! (EPERM), and calls newer than the policy (ENOSYS).
//!
//! The calls use arguments for which the kernel, without the filter, would
//! answer something other than the expected errno wherever possible
//! (bogus pointers → EFAULT, bad fds → EBADF, or plain success for calls an
//! unprivileged user may make: unshare(CLONE_NEWUSER), ptrace(TRACEME),
//! keyctl, userfaultfd, socket(AF_INET), ...), so the test fails if the
//! filter is missing.

#![cfg(target_arch = "x86_64")]

mod common;

use std::collections::BTreeMap;

use common::*;
use kiln_core::ExitStatus;
use tokio_util::sync::CancellationToken;

const UID_BASE: u32 = 1_700_000_000;

/// (name, syscall number, arguments, expected errno name)
fn cases() -> Vec<(&'static str, i64, Vec<i64>, &'static str)> {
    use libc::*;
    let eperm = "EPERM";
    let bad = 1; // an invalid user pointer
    let mut v: Vec<(&'static str, i64, Vec<i64>, &'static str)> = vec![
        ("mount", SYS_mount, vec![bad, bad, bad, 0, 0], eperm),
        ("umount2", SYS_umount2, vec![bad, 0], eperm),
        ("pivot_root", SYS_pivot_root, vec![bad, bad], eperm),
        (
            "move_mount",
            SYS_move_mount,
            vec![-1, bad, -1, bad, 0],
            eperm,
        ),
        ("open_tree", SYS_open_tree, vec![-1, bad, 0], eperm),
        ("fsopen", SYS_fsopen, vec![bad, 0], eperm),
        ("fsconfig", SYS_fsconfig, vec![-1, 0, 0, 0, 0], eperm),
        ("fsmount", SYS_fsmount, vec![-1, 0, 0], eperm),
        ("fspick", SYS_fspick, vec![-1, bad, 0], eperm),
        (
            "mount_setattr",
            SYS_mount_setattr,
            vec![-1, bad, 0, 0, 0],
            eperm,
        ),
        ("unshare", SYS_unshare, vec![CLONE_NEWUSER as i64], eperm),
        ("setns", SYS_setns, vec![-1, 0], eperm),
        (
            "ptrace",
            SYS_ptrace,
            vec![PTRACE_TRACEME as i64, 0, 0, 0],
            eperm,
        ),
        (
            "process_vm_readv",
            SYS_process_vm_readv,
            vec![0, 0, 0, 0, 0, 0],
            eperm,
        ),
        (
            "process_vm_writev",
            SYS_process_vm_writev,
            vec![0, 0, 0, 0, 0, 0],
            eperm,
        ),
        ("bpf", SYS_bpf, vec![0, bad, 0], eperm),
        (
            "perf_event_open",
            SYS_perf_event_open,
            vec![bad, 0, -1, -1, 0],
            eperm,
        ),
        // KEYCTL_GET_KEYRING_ID of the session keyring: allowed unfiltered.
        ("keyctl", SYS_keyctl, vec![0, -3, 0], eperm),
        ("add_key", SYS_add_key, vec![bad, bad, 0, 0, 0], eperm),
        ("request_key", SYS_request_key, vec![bad, bad, 0, 0], eperm),
        ("io_uring_setup", SYS_io_uring_setup, vec![1, bad], eperm),
        (
            "io_uring_enter",
            SYS_io_uring_enter,
            vec![-1, 0, 0, 0, 0, 0],
            eperm,
        ),
        (
            "io_uring_register",
            SYS_io_uring_register,
            vec![-1, 0, 0, 0],
            eperm,
        ),
        // UFFD_USER_MODE_ONLY: allowed unfiltered.
        ("userfaultfd", SYS_userfaultfd, vec![1], eperm),
        ("kexec_load", SYS_kexec_load, vec![0, 0, 0, 0], eperm),
        (
            "kexec_file_load",
            SYS_kexec_file_load,
            vec![-1, -1, 0, 0, 0],
            eperm,
        ),
        ("init_module", SYS_init_module, vec![0, 0, 0], eperm),
        ("finit_module", SYS_finit_module, vec![-1, 0, 0], eperm),
        ("delete_module", SYS_delete_module, vec![bad, 0], eperm),
        ("reboot", SYS_reboot, vec![0, 0, 0, 0], eperm),
        ("swapon", SYS_swapon, vec![bad, 0], eperm),
        ("swapoff", SYS_swapoff, vec![bad], eperm),
        ("acct", SYS_acct, vec![bad], eperm),
        ("quotactl", SYS_quotactl, vec![0, bad, 0, 0], eperm),
        // SYSLOG_ACTION_SIZE_BUFFER
        ("syslog", SYS_syslog, vec![10, 0, 0], eperm),
        (
            "open_by_handle_at",
            SYS_open_by_handle_at,
            vec![-1, bad, 0],
            eperm,
        ),
        (
            "name_to_handle_at",
            SYS_name_to_handle_at,
            vec![-100, bad, bad, bad, 0],
            eperm,
        ),
        // clone3 → ENOSYS (unfiltered: EINVAL for a zero size).
        ("clone3", SYS_clone3, vec![0, 0], "ENOSYS"),
        (
            "socket_inet",
            SYS_socket,
            vec![AF_INET as i64, SOCK_STREAM as i64, 0],
            eperm,
        ),
        (
            "socket_inet6",
            SYS_socket,
            vec![AF_INET6 as i64, SOCK_DGRAM as i64, 0],
            eperm,
        ),
        (
            "socket_netlink",
            SYS_socket,
            vec![AF_NETLINK as i64, SOCK_RAW as i64, 0],
            eperm,
        ),
        (
            "socket_packet",
            SYS_socket,
            vec![AF_PACKET as i64, SOCK_RAW as i64, 0],
            eperm,
        ),
        (
            "socket_vsock",
            SYS_socket,
            vec![AF_VSOCK as i64, SOCK_STREAM as i64, 0],
            eperm,
        ),
        (
            "socketpair_inet",
            SYS_socketpair,
            vec![AF_INET as i64, SOCK_STREAM as i64, 0, bad],
            eperm,
        ),
        // The x32 ABI's getpid: ENOSYS unfiltered on kernels without x32.
        ("x32_getpid", 0x4000_0000 | SYS_getpid, vec![], eperm),
        // Not on the allow-list. Unfiltered (6.18): ENOSYS (removed in 6.10),
        // ENOSYS without CONFIG_X86_IOPL_IOPERM or 0 with it (lowering is
        // always allowed), EFAULT, 0 (a zero-length read of the LDT), EBADF,
        // EBADF, the current persona.
        ("lookup_dcookie", SYS_lookup_dcookie, vec![0, 0, 0], eperm),
        ("iopl_0", SYS_iopl, vec![0], eperm),
        ("ioperm_off", SYS_ioperm, vec![0, 0, 0], eperm),
        ("seccomp", SYS_seccomp, vec![2, 0, bad], eperm),
        ("modify_ldt_read", SYS_modify_ldt, vec![0, bad, 0], eperm),
        ("pidfd_getfd", SYS_pidfd_getfd, vec![-1, 0, 0], eperm),
        (
            "process_madvise",
            SYS_process_madvise,
            vec![-1, 0, 0, 0, 0],
            eperm,
        ),
        // Native AIO reserves from the host-wide fs.aio-max-nr budget.
        // Unfiltered: EFAULT (bad ctx pointer), EINVAL (bad context).
        ("io_setup", SYS_io_setup, vec![1, bad], eperm),
        ("io_submit", SYS_io_submit, vec![0, 1, bad], eperm),
        ("io_destroy", SYS_io_destroy, vec![0], eperm),
        // ADDR_NO_RANDOMIZE: only the persona values Docker allows pass.
        (
            "personality_no_aslr",
            SYS_personality,
            vec![0x0040000],
            eperm,
        ),
        (
            "personality_query",
            SYS_personality,
            vec![0xffff_ffff],
            "ok",
        ),
        // setxattrat (Linux 6.13) is newer than the policy: ENOSYS, so libc
        // falls back to older calls. Unfiltered: EINVAL.
        (
            "newer_than_policy",
            463,
            vec![-1, bad, 0, bad, bad, 0],
            "ENOSYS",
        ),
    ];
    for (name, flag) in [
        ("clone_newns", CLONE_NEWNS),
        ("clone_newcgroup", CLONE_NEWCGROUP),
        ("clone_newuts", CLONE_NEWUTS),
        ("clone_newipc", CLONE_NEWIPC),
        ("clone_newuser", CLONE_NEWUSER),
        ("clone_newpid", CLONE_NEWPID),
        ("clone_newnet", CLONE_NEWNET),
        // Unfiltered: a child of the program's parent.
        ("clone_parent", CLONE_PARENT),
    ] {
        v.push((
            name,
            SYS_clone,
            vec![(flag | SIGCHLD) as i64, 0, 0, 0, 0],
            eperm,
        ));
    }
    v
}

fn prober() -> String {
    let mut table = String::new();
    for (name, nr, args, _) in cases() {
        let args: Vec<String> = args.iter().map(i64::to_string).collect();
        table.push_str(&format!("    ({name:?}, {nr}, [{}]),\n", args.join(", ")));
    }
    format!(
        r#"import ctypes, errno, json, os, socket, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
CASES = [
{table}]
res = {{}}
for name, nr, args in CASES:
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if r == 0 and name.startswith("clone"):
        os._exit(0)  # only reached without the filter: the clone's child
    res[name] = "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")
# What must keep working.
a, b = socket.socketpair()
a.send(b"x"); res["unix_socketpair"] = b.recv(1).decode()
socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).close(); res["unix_socket"] = "ok"
pid = os.fork()
if pid == 0:
    os._exit(7)
res["fork"] = os.waitpid(pid, 0)[1] >> 8
t = threading.Thread(target=lambda: res.__setitem__("thread", "ran")); t.start(); t.join()
print(json.dumps(res))
"#
    )
}

#[tokio::test]
async fn every_listed_syscall_is_denied_and_ordinary_calls_still_work() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let ws = workspace(&slot);
    let script = prober();
    let r = sb
        .run(
            &slot,
            request(&ws, &["/usr/bin/python3", "-c", &script], limits()),
            CancellationToken::new(),
        )
        .await
        .expect("run");
    assert_eq!(r.exit, ExitStatus::Code(0), "stderr: {}", stderr(&r));
    let got: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&r.stdout).expect("prober output");
    let mut wrong = Vec::new();
    for (name, _, _, expected) in cases() {
        let actual = got.get(name).and_then(|v| v.as_str()).unwrap_or("missing");
        if actual != expected {
            wrong.push(format!("{name}: expected {expected}, got {actual}"));
        }
    }
    assert!(wrong.is_empty(), "seccomp gaps:\n{}", wrong.join("\n"));
    assert_eq!(got["unix_socketpair"], "x");
    assert_eq!(got["unix_socket"], "ok");
    assert_eq!(got["fork"], 7);
    assert_eq!(got["thread"], "ran");
}
