//! What confines a process beyond namespaces: the Landlock ABI probe and
//! the capability bounding, ambient and securebits settings.

use nix::errno::Errno;

/// Landlock ABI version the kernel supports, if Landlock is enabled.
pub fn landlock_abi() -> Option<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attr, size 0 and the VERSION flag the call only
    // returns a number.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(v).ok().filter(|v| *v > 0)
}

/// Empty the capability bounding set and the ambient set of the calling
/// process, so no later transition (file capabilities, setuid binaries) can
/// ever hand a capability back. Needs CAP_SETPCAP in the current user
/// namespace (the jail's root has it before it drops to uid 1000).
pub fn drop_bounding_and_ambient_caps() -> Result<(), Errno> {
    // SAFETY: PR_CAP_AMBIENT with PR_CAP_AMBIENT_CLEAR_ALL takes no pointers;
    // the unused arguments are zero as the man page requires.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r != 0 {
        return Err(Errno::last());
    }
    for cap in 0..64 as libc::c_ulong {
        // SAFETY: PR_CAPBSET_DROP takes a capability number by value and no
        // pointers; numbers past the kernel's last capability fail with EINVAL.
        let r = unsafe {
            libc::prctl(
                libc::PR_CAPBSET_DROP,
                cap,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        if r != 0 {
            let e = Errno::last();
            if e == Errno::EINVAL {
                break;
            }
            return Err(e);
        }
    }
    Ok(())
}

/// `PR_SET_SECUREBITS` with `SECBIT_NO_SETUID_FIXUP`: changing the
/// effective uid away from 0 keeps the capability sets. Needs
/// `CAP_SETPCAP`. The bit is not inherited into a new user namespace.
pub fn keep_caps_across_uid_changes() -> Result<(), Errno> {
    // SAFETY: PR_SET_SECUREBITS takes its value by value and no pointers;
    // the unused arguments are zero.
    let r = unsafe {
        libc::prctl(
            libc::PR_SET_SECUREBITS,
            libc::SECBIT_NO_SETUID_FIXUP as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r != 0 { Err(Errno::last()) } else { Ok(()) }
}
