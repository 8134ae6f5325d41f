//! Every syscall the policy denies, made for real from Python (x86_64
//! numbers). Each must fail with EPERM/EACCES/ENOSYS and the server must
//! stay healthy.

use crate::*;

/// One test per denied call: `name => (nr, args...)`.
macro_rules! denied_syscalls {
    ($($name:ident => $call:expr;)*) => {$(
        #[tokio::test]
        async fn $name() {
            let code = format!("{PY_SYSCALL}\ndenied({})", $call);
            let r = attack("py", &code).await;
            assert_eq!(out(&r), "DENIED\n", "{}: {r}", stringify!($name));
            assert_healthy().await;
        }
    )*};
}

denied_syscalls! {
    mount_is_denied => "165, 0, 0, 0, 0, 0";
    umount2_is_denied => "166, 0, 0";
    pivot_root_is_denied => "155, 0, 0";
    unshare_user_namespace_is_denied => "272, 0x10000000";
    unshare_mount_namespace_is_denied => "272, 0x00020000";
    unshare_net_namespace_is_denied => "272, 0x40000000";
    setns_is_denied => "308, 0, 0";
    ptrace_traceme_is_denied => "101, 0, 0, 0, 0";
    ptrace_attach_to_init_is_denied => "101, 16, 1, 0, 0";
    process_vm_readv_is_denied => "310, os.getpid(), 0, 0, 0, 0, 0";
    process_vm_writev_is_denied => "311, os.getpid(), 0, 0, 0, 0, 0";
    bpf_is_denied => "321, 0, 0, 0";
    perf_event_open_is_denied => "298, 0, 0, -1, -1, 0";
    keyctl_is_denied => "250, 0, 0, 0, 0, 0";
    add_key_is_denied => "248, 0, 0, 0, 0, 0";
    request_key_is_denied => "249, 0, 0, 0, 0";
    io_uring_setup_is_denied => "425, 8, 0";
    userfaultfd_is_denied => "323, 0";
    kexec_load_is_denied => "246, 0, 0, 0, 0";
    kexec_file_load_is_denied => "320, 0, 0, 0, 0, 0";
    init_module_is_denied => "175, 0, 0, 0";
    finit_module_is_denied => "313, 0, 0, 0";
    delete_module_is_denied => "176, 0, 0";
    reboot_is_denied => "169, 0, 0, 0, 0";
    swapon_is_denied => "167, 0, 0";
    acct_is_denied => "163, 0";
    open_tree_is_denied => "428, -100, 0, 0";
    fsopen_is_denied => "430, 0, 0";
    move_mount_is_denied => "429, 0, 0, 0, 0, 0";
    clone_with_new_user_namespace_is_denied => "56, 0x10000000 | 17, 0, 0, 0, 0";
    clone3_is_refused => "435, 0, 0";
    chroot_is_denied => "161, 0";
}

#[tokio::test]
async fn vsock_sockets_are_denied() {
    // AF_VSOCK = 40: the VM host is reachable over vsock, a netns does not isolate it
    let code = format!("{PY_SYSCALL}\ndenied(41, 40, 1, 0)");
    let r = attack("py", &code).await;
    assert_eq!(out(&r), "DENIED\n", "{r}");
    assert_healthy().await;
}

#[tokio::test]
async fn the_seccomp_filter_and_no_new_privs_are_in_force() {
    let r = attack("bash", "grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status").await;
    let o = out(&r);
    assert!(o.contains("Seccomp:\t2"), "{r}");
    assert!(o.contains("NoNewPrivs:\t1"), "{r}");
}
