//! Seccomp policy: an allow-list per profile, kept as data in
//! `resources/seccomp/` (the shared `base.json` plus one file per profile
//! under `profiles/`), embedded at build time and compiled to BPF here with
//! seccompiler. The server compiles every profile once at start-up and
//! hands the run's programs to the helper in the jail spec, so neither the
//! helper nor the user program's process parses or compiles anything.
//!
//! A profile compiles to three filters, installed in this order:
//! 1. `enosys`: calls that must look absent (`clone3`, whose flags BPF cannot
//!    read, so libc falls back to `clone`);
//! 2. `deny_eperm`: argument checks (socket families, `CLONE_NEW*` and
//!    `CLONE_PARENT` flags);
//! 3. the allow-list: everything else not listed answers `EPERM`. It is
//!    installed last because installing a filter is itself a system call the
//!    list does not allow. Its first instructions refuse x32-ABI calls with
//!    `EPERM` and answer `ENOSYS` for system calls newer than this policy
//!    knows, so libc falls back to older calls instead of failing. The
//!    unconditional part is a binary search over the allowed numbers (built
//!    here from seccompiler's output, see [`allowed_numbers`]): seccompiler
//!    emits a linear chain, which made attaching the filter cost ~1 ms per
//!    run (the kernel emulates the filter for every syscall number to build
//!    its allow cache) and every unlisted call walk ~1400 instructions.
//!
//! The kernel runs every filter and keeps the most restrictive action, so an
//! `EPERM`/`ENOSYS` from any filter wins over the allow-list's `allow`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use seccompiler::{BpfProgram, TargetArch, sock_filter};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::spec::BpfInsns;

/// The profile every run uses unless the request names another.
pub const DEFAULT_PROFILE: &str = "default";

/// The shared base of every profile.
const BASE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../resources/seccomp/base.json"
));

/// Embedded profiles: (name, JSON text).
const PROFILES: &[(&str, &str)] = &[(
    DEFAULT_PROFILE,
    include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../resources/seccomp/profiles/default.json"
    )),
)];

/// First system call number this policy does not know, on every supported
/// architecture (numbers are shared across architectures from 424 on;
/// 462 is `mseal`, the last one seccompiler 0.5 names).
const FIRST_UNKNOWN_NR: u32 = 463;

/// Errors compiling a profile.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("unknown seccomp profile {0:?}")]
    UnknownProfile(String),
    #[error("compile seccomp profile {profile:?}: {reason}")]
    Compile { profile: String, reason: String },
}

/// `base.json`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Base {
    #[allow(dead_code)]
    comment: String,
    /// Allowed whatever the arguments, on every architecture.
    allow: Vec<String>,
    /// Allowed on one architecture only (legacy calls of x86_64, ...).
    #[serde(default)]
    allow_arch: BTreeMap<String, Vec<String>>,
    /// Allowed only with these arguments (seccompiler rules).
    #[serde(default)]
    allow_if: Vec<Value>,
    /// Refused with EPERM when the arguments match (seccompiler rules).
    deny_eperm: Vec<Value>,
    /// Replaces `deny_eperm`'s rules for the same calls in runs with a
    /// services channel (see [`variant`]).
    #[serde(default)]
    deny_eperm_network: Option<NetworkRules>,
    /// Refused with ENOSYS.
    enosys: Vec<String>,
    /// Names no profile may allow.
    forbidden: Vec<String>,
}

/// `base.json`'s `deny_eperm_network`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkRules {
    #[allow(dead_code)]
    comment: String,
    rules: Vec<Value>,
}

/// Suffix of a profile's variant for runs with a services channel.
pub const NETWORK_SUFFIX: &str = "+network";

/// The name under which [`compile_all`] keeps `profile`'s programs for a
/// run with (`network`) or without a services channel.
pub fn variant(profile: &str, network: bool) -> String {
    if network {
        format!("{profile}{NETWORK_SUFFIX}")
    } else {
        profile.to_owned()
    }
}

/// `profiles/<name>.json`: additions to the base.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Profile {
    #[allow(dead_code)]
    comment: String,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    allow_arch: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    allow_if: Vec<Value>,
}

/// Names of the embedded profiles.
pub fn profile_names() -> impl Iterator<Item = &'static str> {
    PROFILES.iter().map(|(n, _)| *n)
}

/// Whether `profile` is an embedded profile.
pub fn is_profile(profile: &str) -> bool {
    PROFILES.iter().any(|(n, _)| *n == profile)
}

fn compile_error(profile: &str, reason: impl std::fmt::Display) -> PolicyError {
    PolicyError::Compile {
        profile: profile.to_owned(),
        reason: reason.to_string(),
    }
}

/// The names and conditional rules `profile` allows on `arch`, after
/// checking that none of them is forbidden and that no call is allowed both
/// unconditionally and conditionally (seccompiler would silently keep only
/// the conditions).
fn allowed(
    profile: &str,
    base: &Base,
    extra: &Profile,
    arch: &str,
) -> Result<(BTreeSet<String>, Vec<Value>), PolicyError> {
    let mut names = BTreeSet::new();
    let lists = [
        Some(&base.allow),
        base.allow_arch.get(arch),
        Some(&extra.allow),
        extra.allow_arch.get(arch),
    ];
    for name in lists.into_iter().flatten().flatten() {
        names.insert(name.clone());
    }
    let rules: Vec<Value> = base
        .allow_if
        .iter()
        .chain(&extra.allow_if)
        .cloned()
        .collect();
    let forbidden: BTreeSet<&str> = base.forbidden.iter().map(String::as_str).collect();
    for rule in &rules {
        let Some(name) = rule.get("syscall").and_then(Value::as_str) else {
            return Err(compile_error(profile, "allow_if rule without a syscall"));
        };
        if names.contains(name) {
            return Err(compile_error(
                profile,
                format_args!("{name} is allowed both always and conditionally"),
            ));
        }
        if forbidden.contains(name) {
            return Err(compile_error(profile, format_args!("{name} is forbidden")));
        }
    }
    if let Some(name) = names.iter().find(|n| forbidden.contains(n.as_str())) {
        return Err(compile_error(profile, format_args!("{name} is forbidden")));
    }
    Ok((names, rules))
}

/// The profile in seccompiler's JSON format, for the architecture named as
/// `std::env::consts::ARCH` spells it.
#[cfg(test)]
fn seccompiler_json(profile: &str, arch: &str) -> Result<Value, PolicyError> {
    seccompiler_json_variant(profile, arch, false)
}

/// The argument checks: the base's, or for a run with a services channel
/// (`network`) the base's with the rules of every call that
/// `deny_eperm_network` names replaced by its own.
fn deny_rules(profile: &str, base: &Base, network: bool) -> Result<Vec<Value>, PolicyError> {
    if !network {
        return Ok(base.deny_eperm.clone());
    }
    let net = base
        .deny_eperm_network
        .as_ref()
        .ok_or_else(|| compile_error(profile, "base.json has no deny_eperm_network"))?;
    let replaced: BTreeSet<&str> = net
        .rules
        .iter()
        .filter_map(|r| r.get("syscall").and_then(Value::as_str))
        .collect();
    Ok(base
        .deny_eperm
        .iter()
        .filter(|r| {
            !r.get("syscall")
                .and_then(Value::as_str)
                .is_some_and(|n| replaced.contains(n))
        })
        .chain(&net.rules)
        .cloned()
        .collect())
}

fn seccompiler_json_variant(
    profile: &str,
    arch: &str,
    network: bool,
) -> Result<Value, PolicyError> {
    let text = PROFILES
        .iter()
        .find(|(n, _)| *n == profile)
        .map(|(_, j)| *j)
        .ok_or_else(|| PolicyError::UnknownProfile(profile.to_owned()))?;
    let base: Base = serde_json::from_str(BASE)
        .map_err(|e| compile_error(profile, format_args!("base: {e}")))?;
    let extra: Profile = serde_json::from_str(text).map_err(|e| compile_error(profile, e))?;
    let (names, rules) = allowed(profile, &base, &extra, arch)?;
    let always: Vec<Value> = names.iter().map(|n| json!({ "syscall": n })).collect();
    let enosys: Vec<Value> = base
        .enosys
        .iter()
        .map(|n| json!({ "syscall": n }))
        .collect();
    Ok(json!({
        "allow": {
            "mismatch_action": { "errno": libc::EPERM },
            "match_action": "allow",
            "filter": always,
        },
        "allow_if": {
            "mismatch_action": { "errno": libc::EPERM },
            "match_action": "allow",
            "filter": rules,
        },
        "deny_eperm": {
            "mismatch_action": "allow",
            "match_action": { "errno": libc::EPERM },
            "filter": deny_rules(profile, &base, network)?,
        },
        "enosys": {
            "mismatch_action": "allow",
            "match_action": { "errno": libc::ENOSYS },
            "filter": enosys,
        },
    }))
}

/// Compiles a profile for the running architecture into the BPF programs
/// to install, in installation order.
#[cfg(test)]
pub fn compile(profile: &str) -> Result<Vec<BpfProgram>, PolicyError> {
    compile_for(profile, std::env::consts::ARCH)
}

#[cfg(test)]
fn compile_for(profile: &str, arch: &str) -> Result<Vec<BpfProgram>, PolicyError> {
    compile_variant_for(profile, arch, false)
}

fn compile_variant_for(
    profile: &str,
    arch: &str,
    network: bool,
) -> Result<Vec<BpfProgram>, PolicyError> {
    let target = TargetArch::try_from(arch).map_err(|e| compile_error(profile, e))?;
    let audit_arch = audit_arch(arch)
        .ok_or_else(|| compile_error(profile, format_args!("unsupported architecture {arch}")))?;
    let json = seccompiler_json_variant(profile, arch, network)?;
    let text = serde_json::to_vec(&json).map_err(|e| compile_error(profile, e))?;
    let mut map = seccompiler::compile_from_json(text.as_slice(), target)
        .map_err(|e| compile_error(profile, e))?;
    let mut take = |name: &str| {
        map.remove(name)
            .ok_or_else(|| compile_error(profile, format_args!("filter {name} missing")))
    };
    let enosys = take("enosys")?;
    let deny = take("deny_eperm")?;
    let always = take("allow")?;
    let conditional = take("allow_if")?;
    let numbers = allowed_numbers(&always, audit_arch).map_err(|e| compile_error(profile, e))?;
    let allow = allow_program(arch, audit_arch, &numbers, conditional);
    if allow.len() > BPF_MAXINSNS {
        return Err(compile_error(
            profile,
            format_args!("allow filter has {} instructions", allow.len()),
        ));
    }
    Ok(vec![enosys, deny, allow])
}

/// A program as plain `(code, jt, jf, k)` tuples, for the jail spec.
pub fn to_insns(program: &BpfProgram) -> BpfInsns {
    program.iter().map(|i| (i.code, i.jt, i.jf, i.k)).collect()
}

/// The inverse of [`to_insns`].
pub fn from_insns(insns: &BpfInsns) -> BpfProgram {
    insns
        .iter()
        .map(|&(code, jt, jf, k)| sock_filter { code, jt, jf, k })
        .collect()
}

/// Every embedded profile, compiled for the running architecture, each
/// also in its variant for runs with a services channel (see [`variant`]).
pub fn compile_all() -> Result<HashMap<String, Vec<BpfInsns>>, PolicyError> {
    let arch = std::env::consts::ARCH;
    let mut out = HashMap::new();
    for name in profile_names() {
        for network in [false, true] {
            let programs = compile_variant_for(name, arch, network)?;
            out.insert(
                variant(name, network),
                programs.iter().map(to_insns).collect(),
            );
        }
    }
    Ok(out)
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
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
/// Offsets in `struct seccomp_data`.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;

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

const BPF_JA: u16 = 0x05; // BPF_JMP | BPF_JA
const BPF_JGT_K: u16 = 0x25; // BPF_JMP | BPF_JGT | BPF_K
const BPF_JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const BPF_AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
/// The kernel's limit on one classic BPF program.
const BPF_MAXINSNS: usize = 4096;

/// `AUDIT_ARCH_*` of an architecture as `std::env::consts::ARCH` names it.
fn audit_arch(arch: &str) -> Option<u32> {
    match arch {
        "x86_64" => Some(0xc000_003e),
        "aarch64" => Some(0xc000_00b7),
        _ => None,
    }
}

/// The allow-list program: arch check, x32 refusal (x86_64), ENOSYS from
/// [`FIRST_UNKNOWN_NR`] on, a binary search that allows `numbers`, and
/// `conditional` (seccompiler's program for the calls allowed only with
/// certain arguments, answering EPERM otherwise) for every other number.
fn allow_program(
    arch: &str,
    audit_arch: u32,
    numbers: &[u32],
    conditional: BpfProgram,
) -> BpfProgram {
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let mut p = vec![
        stmt(BPF_LD_W_ABS, OFFSET_ARCH),
        jump(BPF_JEQ_K, audit_arch, 1, 0),
        stmt(BPF_RET_K, SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, OFFSET_NR),
    ];
    if arch == "x86_64" {
        p.push(jump(BPF_JGE_K, X32_SYSCALL_BIT, 0, 1));
        p.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::EPERM as u32));
    }
    p.push(jump(BPF_JGE_K, FIRST_UNKNOWN_NR, 0, 1));
    p.push(stmt(BPF_RET_K, SECCOMP_RET_ERRNO | libc::ENOSYS as u32));
    p.extend(search_tree(numbers));
    p.extend(conditional);
    p
}

/// One instruction of the search tree; `ToRest` jumps past the tree.
enum Ins {
    Real(sock_filter),
    ToRest,
}

/// Runs of consecutive numbers.
fn intervals(numbers: &[u32]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &n in numbers {
        match out.last_mut() {
            Some((_, hi)) if n == *hi + 1 => *hi = n,
            _ => out.push((n, n)),
        }
    }
    out
}

fn tree(iv: &[(u32, u32)], out: &mut Vec<Ins>) {
    match iv {
        [] => out.push(Ins::ToRest),
        [(lo, hi)] => {
            out.push(Ins::Real(jump(BPF_JGE_K, *lo, 1, 0)));
            out.push(Ins::ToRest);
            out.push(Ins::Real(jump(BPF_JGT_K, *hi, 0, 1)));
            out.push(Ins::ToRest);
            out.push(Ins::Real(stmt(BPF_RET_K, SECCOMP_RET_ALLOW)));
        }
        _ => {
            let mid = iv.len() / 2;
            // nr >= pivot: the next instruction jumps to the right half;
            // otherwise skip it into the left half.
            out.push(Ins::Real(jump(BPF_JGE_K, iv[mid].0, 0, 1)));
            let ja = out.len();
            out.push(Ins::Real(stmt(BPF_JA, 0)));
            tree(&iv[..mid], out);
            let right = out.len();
            out[ja] = Ins::Real(stmt(BPF_JA, (right - ja - 1) as u32));
            tree(&iv[mid..], out);
        }
    }
}

/// Expects the syscall number in the accumulator; returns ALLOW for
/// `numbers` and falls through to the instruction after the tree otherwise.
fn search_tree(numbers: &[u32]) -> BpfProgram {
    let mut ins = Vec::new();
    tree(&intervals(numbers), &mut ins);
    let end = ins.len();
    ins.into_iter()
        .enumerate()
        .map(|(i, ins)| match ins {
            Ins::Real(f) => f,
            Ins::ToRest => stmt(BPF_JA, (end - i - 1) as u32),
        })
        .collect()
}

/// What a seccomp program sees of one system call.
struct SeccompData {
    nr: u32,
    arch: u32,
    args: [u64; 6],
}

/// Runs a classic BPF seccomp program (the instructions seccompiler and
/// this module emit); returns the action and the instructions executed.
fn run_bpf(prog: &[sock_filter], d: &SeccompData) -> Result<(u32, usize), String> {
    let word = |off: u32| -> Result<u32, String> {
        Ok(match off {
            0 => d.nr,
            4 => d.arch,
            16..=63 if off.is_multiple_of(4) => {
                let arg = d.args[((off - 16) / 8) as usize];
                if (off - 16).is_multiple_of(8) {
                    arg as u32
                } else {
                    (arg >> 32) as u32
                }
            }
            _ => return Err(format!("load at offset {off}")),
        })
    };
    let (mut pc, mut acc, mut steps) = (0usize, 0u32, 0usize);
    loop {
        let Some(i) = prog.get(pc) else {
            return Err(format!("ran off the program at {pc}"));
        };
        steps += 1;
        let branch = |taken: bool| pc + 1 + usize::from(if taken { i.jt } else { i.jf });
        pc = match i.code {
            BPF_LD_W_ABS => {
                acc = word(i.k)?;
                pc + 1
            }
            BPF_AND_K => {
                acc &= i.k;
                pc + 1
            }
            BPF_JA => pc + 1 + i.k as usize,
            BPF_JEQ_K => branch(acc == i.k),
            BPF_JGT_K => branch(acc > i.k),
            BPF_JGE_K => branch(acc >= i.k),
            BPF_JSET_K => branch(acc & i.k != 0),
            BPF_RET_K => return Ok((i.k, steps)),
            code => return Err(format!("unexpected BPF opcode {code:#x}")),
        };
    }
}

/// The numbers an unconditional allow-list program (seccompiler's, with
/// no argument checks) allows below [`FIRST_UNKNOWN_NR`].
fn allowed_numbers(prog: &[sock_filter], audit_arch: u32) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for nr in 0..FIRST_UNKNOWN_NR {
        let d = SeccompData {
            nr,
            arch: audit_arch,
            args: [0; 6],
        };
        if run_bpf(prog, &d)?.0 == SECCOMP_RET_ALLOW {
            out.push(nr);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Base {
        serde_json::from_str(BASE).expect("base.json")
    }

    #[test]
    fn every_embedded_profile_compiles_for_x86_64_and_aarch64() {
        for name in profile_names() {
            for arch in ["x86_64", "aarch64"] {
                let programs = compile_for(name, arch).expect(name);
                assert_eq!(programs.len(), 3, "{name}/{arch}");
                assert!(programs.iter().all(|p| !p.is_empty() && p.len() < 4096));
            }
        }
    }

    #[test]
    fn unknown_profile_is_refused() {
        assert!(matches!(
            compile("nope"),
            Err(PolicyError::UnknownProfile(n)) if n == "nope"
        ));
        assert!(!is_profile("nope"));
        assert!(is_profile(DEFAULT_PROFILE));
    }

    /// What the issue requires the policy to deny, by name.
    const REQUIRED_FORBIDDEN: &[&str] = &[
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
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
        "syslog",
        "open_by_handle_at",
        "name_to_handle_at",
        "lookup_dcookie",
        "vhangup",
        "iopl",
        "ioperm",
        "io_setup",
        "io_submit",
    ];

    #[test]
    fn no_profile_allows_a_forbidden_call_on_any_architecture() {
        let b = base();
        for required in REQUIRED_FORBIDDEN {
            assert!(
                b.forbidden.iter().any(|f| f == required),
                "{required} missing from forbidden"
            );
        }
        for name in profile_names() {
            for arch in ["x86_64", "aarch64"] {
                let json = seccompiler_json(name, arch).expect(name);
                let allowed: Vec<&str> = json["allow"]["filter"]
                    .as_array()
                    .expect("allow filter")
                    .iter()
                    .filter_map(|r| r["syscall"].as_str())
                    .collect();
                for f in &b.forbidden {
                    assert!(!allowed.contains(&f.as_str()), "{name}/{arch} allows {f}");
                }
            }
        }
    }

    #[test]
    fn a_profile_adding_a_forbidden_call_does_not_compile() {
        let b = base();
        let extra = Profile {
            comment: String::new(),
            allow: vec!["mount".into()],
            allow_arch: BTreeMap::new(),
            allow_if: vec![],
        };
        let err = allowed("evil", &b, &extra, "x86_64").expect_err("mount allowed");
        assert!(err.to_string().contains("mount is forbidden"), "{err}");
        let extra = Profile {
            comment: String::new(),
            allow: vec![],
            allow_arch: BTreeMap::new(),
            allow_if: vec![json!({"syscall": "ptrace", "args": []})],
        };
        assert!(allowed("evil", &b, &extra, "x86_64").is_err());
    }

    #[test]
    fn a_call_allowed_always_and_conditionally_is_refused() {
        let b = base();
        let extra = Profile {
            comment: String::new(),
            allow: vec!["personality".into()],
            allow_arch: BTreeMap::new(),
            allow_if: vec![],
        };
        let err = allowed("p", &b, &extra, "x86_64").expect_err("ambiguous");
        assert!(err.to_string().contains("personality"), "{err}");
    }

    #[test]
    fn argument_checks_and_enosys_stay_stacked_on_the_allow_list() {
        let json = seccompiler_json(DEFAULT_PROFILE, "x86_64").expect("default");
        let deny: Vec<&str> = json["deny_eperm"]["filter"]
            .as_array()
            .expect("deny filter")
            .iter()
            .filter_map(|r| r["syscall"].as_str())
            .collect();
        for name in ["clone", "socket", "socketpair"] {
            assert!(deny.contains(&name), "{name} has no argument check");
        }
        assert_eq!(json["enosys"]["filter"][0]["syscall"], "clone3");
        assert_eq!(json["enosys"]["match_action"]["errno"], libc::ENOSYS);
        assert_eq!(json["allow"]["mismatch_action"]["errno"], libc::EPERM);
    }

    #[test]
    fn legacy_x86_64_calls_are_allowed_only_there() {
        let x86 = seccompiler_json(DEFAULT_PROFILE, "x86_64").expect("x86_64");
        let arm = seccompiler_json(DEFAULT_PROFILE, "aarch64").expect("aarch64");
        let has = |j: &Value, n: &str| {
            j["allow"]["filter"]
                .as_array()
                .is_some_and(|a| a.iter().any(|r| r["syscall"] == n))
        };
        for n in ["open", "stat", "fork", "arch_prctl"] {
            assert!(has(&x86, n), "{n} on x86_64");
            assert!(!has(&arm, n), "{n} on aarch64");
        }
        assert!(has(&x86, "openat") && has(&arm, "openat"));
    }

    /// seccompiler's own (linear) compilation of the whole allow-list.
    fn reference_allow(arch: &str) -> BpfProgram {
        let json = seccompiler_json(DEFAULT_PROFILE, arch).expect("json");
        let mut all = json["allow"]["filter"].as_array().expect("always").clone();
        all.extend(
            json["allow_if"]["filter"]
                .as_array()
                .expect("if")
                .iter()
                .cloned(),
        );
        let reference = json!({ "allow": {
            "mismatch_action": { "errno": libc::EPERM },
            "match_action": "allow",
            "filter": all,
        }});
        let text = serde_json::to_vec(&reference).expect("encode");
        let target = TargetArch::try_from(arch).expect("arch");
        let mut map = seccompiler::compile_from_json(text.as_slice(), target).expect("compile");
        map.remove("allow").expect("allow")
    }

    #[test]
    fn the_search_tree_allows_exactly_what_seccompilers_linear_list_allows() {
        for arch in ["x86_64", "aarch64"] {
            let audit = audit_arch(arch).expect("supported");
            let reference = reference_allow(arch);
            let ours = compile_for(DEFAULT_PROFILE, arch)
                .expect("compile")
                .remove(2);
            let arg_sets: [[u64; 6]; 5] = [
                [0; 6],
                [u64::MAX; 6],
                [8, 0, 0, 0, 0, 0],
                [0x0040000, 1, 2, 3, 4, 5],
                [0xffff_ffff, 0, 0, 0, 0, 0],
            ];
            let mut allowed = 0;
            let mut max_steps = 0;
            for nr in 0..FIRST_UNKNOWN_NR {
                for args in arg_sets {
                    let d = SeccompData {
                        nr,
                        arch: audit,
                        args,
                    };
                    let want = run_bpf(&reference, &d).expect("reference").0;
                    let (got, steps) = run_bpf(&ours, &d).expect("ours");
                    assert_eq!(got, want, "{arch} nr {nr} args {args:?}");
                    allowed += usize::from(got == SECCOMP_RET_ALLOW);
                    max_steps = max_steps.max(steps);
                }
            }
            assert!(allowed > 5 * 230, "{arch}: only {allowed} allowed");
            assert!(
                max_steps < 60,
                "{arch}: a call runs {max_steps} instructions"
            );
            let linear_steps = (0..FIRST_UNKNOWN_NR)
                .map(|nr| {
                    let d = SeccompData {
                        nr,
                        arch: audit,
                        args: [0; 6],
                    };
                    run_bpf(&reference, &d).expect("reference").1
                })
                .max()
                .unwrap_or(0);
            assert!(
                linear_steps > 10 * max_steps,
                "{arch}: {linear_steps} vs {max_steps}"
            );
        }
    }

    #[test]
    fn numbers_newer_than_the_policy_answer_enosys_and_x32_eperm() {
        let ours = compile_for(DEFAULT_PROFILE, "x86_64")
            .expect("compile")
            .remove(2);
        let audit = audit_arch("x86_64").expect("x86_64");
        let run = |nr: u32, arch: u32| {
            run_bpf(
                &ours,
                &SeccompData {
                    nr,
                    arch,
                    args: [0; 6],
                },
            )
            .expect("run")
            .0
        };
        for nr in [FIRST_UNKNOWN_NR, 470, 1000] {
            assert_eq!(run(nr, audit), SECCOMP_RET_ERRNO | libc::ENOSYS as u32);
        }
        assert_eq!(
            run(0x4000_0000 | 39, audit),
            SECCOMP_RET_ERRNO | libc::EPERM as u32
        );
        assert_eq!(
            run(39, 0x4000_0003),
            SECCOMP_RET_KILL_PROCESS,
            "i386 arch value"
        );
        assert_eq!(run(39, audit), SECCOMP_RET_ALLOW, "getpid");
        assert_eq!(
            run(103, audit),
            SECCOMP_RET_ERRNO | libc::EPERM as u32,
            "syslog"
        );
    }

    /// `socket(family, type)` through a profile's argument checks.
    fn socket_action(network: bool, family: u64, typ: u64) -> u32 {
        let deny = compile_variant_for(DEFAULT_PROFILE, "x86_64", network)
            .expect("compile")
            .remove(1);
        let d = SeccompData {
            nr: 41, // socket on x86_64
            arch: audit_arch("x86_64").expect("x86_64"),
            args: [family, typ, 0, 0, 0, 0],
        };
        run_bpf(&deny, &d).expect("run").0
    }

    #[test]
    fn only_a_services_channel_run_may_create_inet_stream_sockets() {
        let eperm = SECCOMP_RET_ERRNO | libc::EPERM as u32;
        let (unix, inet, inet6, vsock, netlink, packet) = (1, 2, 10, 40, 16, 17);
        let (stream, dgram, raw) = (1, 2, 3);
        let flags = (libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u64;
        // without a channel: exactly today's rule, AF_UNIX only
        assert_eq!(socket_action(false, unix, stream), SECCOMP_RET_ALLOW);
        assert_eq!(socket_action(false, inet, stream), eperm);
        assert_eq!(socket_action(false, inet, stream | flags), eperm);
        // with one: AF_INET stream sockets (whatever the flags), nothing else
        assert_eq!(socket_action(true, unix, stream), SECCOMP_RET_ALLOW);
        assert_eq!(socket_action(true, unix, dgram), SECCOMP_RET_ALLOW);
        assert_eq!(socket_action(true, inet, stream), SECCOMP_RET_ALLOW);
        assert_eq!(socket_action(true, inet, stream | flags), SECCOMP_RET_ALLOW);
        for typ in [0, dgram, raw, 4, 5, 6, 10, dgram | flags, raw | flags] {
            assert_eq!(socket_action(true, inet, typ), eperm, "AF_INET type {typ}");
        }
        for family in [inet6, vsock, netlink, packet, 0, 3, 44] {
            assert_eq!(
                socket_action(true, family, stream),
                eperm,
                "family {family}"
            );
        }
        // the other argument checks are untouched
        let deny = |network| {
            seccompiler_json_variant(DEFAULT_PROFILE, "x86_64", network).expect("json")
                ["deny_eperm"]["filter"]
                .as_array()
                .expect("rules")
                .iter()
                .filter(|r| r["syscall"] != "socket")
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(deny(false), deny(true));
        let all = compile_all().expect("compile all");
        assert!(all.contains_key(DEFAULT_PROFILE));
        assert!(all.contains_key(&variant(DEFAULT_PROFILE, true)));
    }

    #[test]
    fn consecutive_numbers_collapse_into_intervals() {
        assert_eq!(intervals(&[0, 1, 2, 5, 7, 8]), vec![(0, 2), (5, 5), (7, 8)]);
        assert!(intervals(&[]).is_empty());
        let tree = search_tree(&[]);
        assert_eq!(tree.len(), 1, "empty tree falls through");
    }
}
