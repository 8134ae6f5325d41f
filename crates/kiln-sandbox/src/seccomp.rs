//! Seccomp policy: profiles are data (seccompiler JSON embedded from
//! `resources/seccomp/`), compiled to BPF here. Compiling is done by the
//! server at startup (to fail early) and by the helper before it clones, so
//! the user program's process only installs ready programs.

use seccompiler::{BpfProgram, TargetArch, sock_filter};

/// Embedded profiles: (name, JSON text).
const PROFILES: &[(&str, &str)] = &[(
    "default",
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../resources/seccomp/default.json"
    )),
)];

/// Errors compiling a profile.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("unknown seccomp profile {0:?}")]
    UnknownProfile(String),
    #[error("compile seccomp profile {profile:?}: {reason}")]
    Compile { profile: String, reason: String },
}

/// Names of the embedded profiles.
pub fn profile_names() -> impl Iterator<Item = &'static str> {
    PROFILES.iter().map(|(n, _)| *n)
}

fn target_arch() -> Result<TargetArch, PolicyError> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| PolicyError::Compile {
        profile: String::new(),
        reason: e.to_string(),
    })
}

/// Compiles a profile into the BPF programs to install, in order: the fixed
/// architecture prelude first, then the profile's filters by name.
pub fn compile(profile: &str) -> Result<Vec<BpfProgram>, PolicyError> {
    let json = PROFILES
        .iter()
        .find(|(n, _)| *n == profile)
        .map(|(_, j)| *j)
        .ok_or_else(|| PolicyError::UnknownProfile(profile.to_owned()))?;
    let map = seccompiler::compile_from_json(json.as_bytes(), target_arch()?).map_err(|e| {
        PolicyError::Compile {
            profile: profile.to_owned(),
            reason: e.to_string(),
        }
    })?;
    let mut named: Vec<(String, BpfProgram)> = map.into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let mut programs = Vec::with_capacity(named.len() + 1);
    programs.extend(arch_prelude());
    programs.extend(named.into_iter().map(|(_, p)| p));
    Ok(programs)
}

/// Installs the programs on the calling thread (sets no_new_privs first).
pub fn install(programs: &[BpfProgram]) -> Result<(), String> {
    for p in programs {
        seccompiler::apply_filter(p).map_err(|e| e.to_string())?;
    }
    Ok(())
}

// Classic BPF opcodes (linux/filter.h).
const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// x86_64 only: refuse x32-ABI system calls (bit 30 set) with EPERM, so the
/// name-based filters cannot be bypassed through the x32 table.
#[cfg(target_arch = "x86_64")]
fn arch_prelude() -> Option<BpfProgram> {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    const OFFSET_NR: u32 = 0;
    const OFFSET_ARCH: u32 = 4;
    Some(vec![
        stmt(BPF_LD_W_ABS, OFFSET_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, OFFSET_NR),
        jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::EPERM as u32),
        stmt(BPF_RET_K, SECCOMP_RET_ALLOW),
    ])
}

#[cfg(not(target_arch = "x86_64"))]
fn arch_prelude() -> Option<BpfProgram> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_profile_compiles() {
        for name in profile_names() {
            let programs = compile(name).expect(name);
            assert!(programs.len() >= 2, "{name}: {} programs", programs.len());
            assert!(programs.iter().all(|p| !p.is_empty()));
        }
    }

    #[test]
    fn unknown_profile_is_refused() {
        assert!(matches!(
            compile("nope"),
            Err(PolicyError::UnknownProfile(n)) if n == "nope"
        ));
    }

    #[test]
    fn default_profile_names_the_required_denials() {
        let json: serde_json::Value = serde_json::from_str(PROFILES[0].1).expect("json");
        let deny: Vec<&str> = json["deny_eperm"]["filter"]
            .as_array()
            .expect("filter list")
            .iter()
            .filter_map(|r| r["syscall"].as_str())
            .collect();
        for required in [
            "mount",
            "umount2",
            "pivot_root",
            "move_mount",
            "open_tree",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
            "mount_setattr",
            "unshare",
            "setns",
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "bpf",
            "perf_event_open",
            "keyctl",
            "add_key",
            "request_key",
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "userfaultfd",
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "reboot",
            "swapon",
            "swapoff",
            "acct",
            "quotactl",
            "syslog",
            "open_by_handle_at",
            "name_to_handle_at",
            "clone",
            "socket",
            "socketpair",
        ] {
            assert!(
                deny.contains(&required),
                "{required} missing from deny_eperm"
            );
        }
        assert_eq!(
            json["deny_clone3_enosys"]["filter"][0]["syscall"], "clone3",
            "clone3 must answer ENOSYS"
        );
        assert_eq!(
            json["deny_clone3_enosys"]["match_action"]["errno"],
            libc::ENOSYS
        );
        assert_eq!(json["deny_eperm"]["match_action"]["errno"], libc::EPERM);
    }
}
