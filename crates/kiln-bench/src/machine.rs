//! Facts about the machine and the checkout a run was measured on (CPU
//! count and model, kernel, memory, git commit, runtime versions), and the
//! resident memory of a process, read from `/proc`.

use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::baseline::Program;

/// Where the numbers come from, so results can be compared across runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineInfo {
    /// CPUs available to this process (`nproc`).
    pub nproc: usize,
    /// `model name` from `/proc/cpuinfo`.
    pub cpu_model: Option<String>,
    /// `uname -r`.
    pub kernel: Option<String>,
    /// `MemTotal` in KiB.
    pub mem_total_kib: Option<u64>,
    /// `git rev-parse HEAD` of the working directory.
    pub git_commit: Option<String>,
    /// Whether tracked files had uncommitted changes.
    pub git_dirty: Option<bool>,
    /// `--version` of the baseline Python (the server's image's when it runs on one).
    pub python: Option<String>,
    /// `--version` of the baseline Node (likewise).
    pub node: Option<String>,
    /// `kiln --version`.
    pub kiln: Option<String>,
}

impl MachineInfo {
    /// Collect everything; missing pieces stay `None`.
    pub fn collect(python: &Program, node: &Program, kiln: &Path) -> MachineInfo {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        MachineInfo {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: cpu_model(&cpuinfo),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .map(|s| s.trim().to_owned()),
            mem_total_kib: kib_field(&meminfo, "MemTotal"),
            git_commit: command_line("git", &["rev-parse", "HEAD"]),
            git_dirty: command_line_status("git", &["diff", "--quiet", "HEAD", "--"])
                .map(|clean| !clean),
            python: version_of(python),
            node: version_of(node),
            kiln: command_line(&kiln.to_string_lossy(), &["--version"]),
        }
    }
}

/// The first `model name` line of a `/proc/cpuinfo` text.
pub fn cpu_model(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == "model name")
        .map(|(_, v)| v.trim().to_owned())
}

/// A `Key:   123 kB` field of `/proc/meminfo` or `/proc/<pid>/status`, in KiB.
pub fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == key)
        .and_then(|(_, v)| v.split_whitespace().next()?.parse().ok())
}

/// Current and peak resident set of a process, KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Rss {
    pub rss_kib: Option<u64>,
    pub peak_kib: Option<u64>,
}

/// `VmRSS` and `VmHWM` of process `pid`.
pub fn rss(pid: u32) -> Rss {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    Rss {
        rss_kib: kib_field(&status, "VmRSS"),
        peak_kib: kib_field(&status, "VmHWM"),
    }
}

/// Memory of a process's descendants (the jail helpers, parked jails and
/// the fork-server a Kiln server keeps): how many, and their summed
/// proportional set size (shared copy-on-write pages counted once overall).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Descendants {
    pub processes: u32,
    pub pss_kib: u64,
}

/// Walks `/proc` for every descendant of `pid` and sums their `Pss`.
pub fn descendants(pid: u32) -> Descendants {
    let pids = descendant_pids(pid);
    Descendants {
        processes: u32::try_from(pids.len()).unwrap_or(u32::MAX),
        pss_kib: memory_of(&pids).pss_kib,
    }
}

/// Every descendant of `pid` now (children, their children, ...), sorted.
pub fn descendant_pids(pid: u32) -> Vec<u32> {
    let mut parent_of = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // the fields after the parenthesised command name: state, ppid, ...
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if let Some(ppid) = rest
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse::<u32>().ok())
        {
            parent_of.insert(p, ppid);
        }
    }
    let mut out = Vec::new();
    for (&p, _) in parent_of.iter() {
        let mut cur = p;
        let mut hops = 0;
        while let Some(&pp) = parent_of.get(&cur) {
            if pp == pid {
                out.push(p);
                break;
            }
            cur = pp;
            hops += 1;
            if pp <= 1 || hops > 64 {
                break;
            }
        }
    }
    out.sort_unstable();
    out
}

/// The memory of a set of processes, from their `smaps_rollup`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessesMemory {
    pub processes: u32,
    /// Summed proportional set size (a page shared by n processes counts
    /// 1/n for each).
    pub pss_kib: u64,
    /// Summed pages only one process maps (`Private_Clean + Private_Dirty`).
    pub private_kib: u64,
}

/// Sums the `smaps_rollup` of `pids` (those gone count nothing).
pub fn memory_of(pids: &[u32]) -> ProcessesMemory {
    let mut m = ProcessesMemory::default();
    for p in pids {
        let Ok(rollup) = std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")) else {
            continue;
        };
        let field = |k: &str| kib_field(&rollup, k).unwrap_or(0);
        m.processes += 1;
        m.pss_kib += field("Pss");
        m.private_kib += field("Private_Clean") + field("Private_Dirty");
    }
    m
}

/// The memory cgroups `pids` live in (each once) and their summed usage,
/// bytes: what the kernel charges them, page cache and kernel memory
/// included (cgroup v2 `memory.current`, v1 `memory.usage_in_bytes`).
pub fn cgroups_memory(pids: &[u32]) -> (usize, u64) {
    let mut files = std::collections::BTreeSet::new();
    for p in pids {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{p}/cgroup")) else {
            continue;
        };
        files.extend(memory_usage_file(&text));
    }
    let bytes = files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .filter_map(|v| v.trim().parse::<u64>().ok())
        .sum();
    (files.len(), bytes)
}

/// The file holding the memory usage of the cgroup a `/proc/<pid>/cgroup`
/// text names: the v1 memory controller's when it has one, else v2's.
fn memory_usage_file(cgroup: &str) -> Option<String> {
    let mut v2 = None;
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            return Some(format!("/sys/fs/cgroup/memory{path}/memory.usage_in_bytes"));
        }
        if id == "0" && controllers.is_empty() {
            v2 = Some(format!("/sys/fs/cgroup{path}/memory.current"));
        }
    }
    v2
}

/// One Python template's fork-server: its memory after start-up (the
/// template itself, shared copy-on-write with every program forked from it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TemplateMemory {
    pub template: String,
    pub pid: u32,
    pub rss_kib: u64,
    pub pss_kib: u64,
    /// Pages only it maps (what stopping it would free at once).
    pub private_kib: u64,
}

/// A process's RSS, PSS and private memory from `smaps_rollup`.
pub fn template_memory(template: &str, pid: u32) -> TemplateMemory {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |k: &str| kib_field(&rollup, k).unwrap_or(0);
    TemplateMemory {
        template: template.to_owned(),
        pid,
        rss_kib: field("Rss"),
        pss_kib: field("Pss"),
        private_kib: field("Private_Clean") + field("Private_Dirty"),
    }
}

/// CPU milliseconds of a process and of its children it reaped (a
/// fork-server reaps every program it forked: their fork, run and exit),
/// from `/proc/<pid>/stat` (utime, stime, cutime, cstime in USER_HZ, 100 on
/// Linux). `None` if the process is gone.
pub fn cpu_ms_with_reaped_children(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    cpu_ms_of_stat(&stat)
}

fn cpu_ms_of_stat(stat: &str) -> Option<f64> {
    // after ")": state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: Option<Vec<f64>> = (11..=14)
        .map(|i| fields.get(i).and_then(|v| v.parse::<f64>().ok()))
        .collect();
    Some(ticks?.iter().sum::<f64>() * 10.0)
}

/// First line of a command's output (stdout, else stderr: `python --version`
/// used to print on stderr), `None` if it cannot run or fails.
fn command_line(program: &str, args: &[&str]) -> Option<String> {
    first_line(Command::new(program).args(args).output().ok()?)
}

fn first_line(out: std::process::Output) -> Option<String> {
    if !out.status.success() {
        return None;
    }
    let text = if out.stdout.is_empty() {
        out.stderr
    } else {
        out.stdout
    };
    String::from_utf8_lossy(&text)
        .lines()
        .next()
        .map(|l| l.trim().to_owned())
}

/// A baseline interpreter's `--version`, run as the baselines run it (in the image's chroot).
fn version_of(p: &Program) -> Option<String> {
    first_line(p.command(&["--version"], None).ok()?.output().ok()?)
}

/// Whether a command exited 0 (`None` if it could not run, or exited with
/// an error status other than 1).
fn command_line_status(program: &str, args: &[&str]) -> Option<bool> {
    let st = Command::new(program).args(args).output().ok()?.status;
    match st.code() {
        Some(0) => Some(true),
        Some(1) => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_processs_memory_cgroup_is_read_from_v1_or_v2() {
        let cases = [
            (
                "9:name=systemd:/\n4:memory:/kiln/k1\n0::/\n",
                Some("/sys/fs/cgroup/memory/kiln/k1/memory.usage_in_bytes"),
            ),
            (
                "0::/kiln/k2\n",
                Some("/sys/fs/cgroup/kiln/k2/memory.current"),
            ),
            ("1:cpu:/\n", None),
        ];
        for (text, file) in cases {
            assert_eq!(memory_usage_file(text).as_deref(), file, "{text:?}");
        }
    }

    #[test]
    fn cpu_model_is_the_first_model_name_line() {
        let text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor @ 2.50GHz\n\nprocessor\t: 1\nmodel name\t: other\n";
        assert_eq!(
            cpu_model(text).as_deref(),
            Some("Intel(R) Xeon(R) Processor @ 2.50GHz")
        );
        assert_eq!(cpu_model("processor : 0\n"), None);
    }

    #[test]
    fn kib_fields_are_parsed_from_proc_texts() {
        let status = "Name:\tkiln\nVmHWM:\t   20480 kB\nVmRSS:\t   12345 kB\n";
        assert_eq!(kib_field(status, "VmRSS"), Some(12345));
        assert_eq!(kib_field(status, "VmHWM"), Some(20480));
        assert_eq!(kib_field(status, "VmSwap"), None);
        assert_eq!(
            kib_field("MemTotal:       24684000 kB\n", "MemTotal"),
            Some(24_684_000)
        );
    }

    #[test]
    fn cpu_of_a_stat_line_sums_own_and_reaped_children_ticks() {
        // pid (comm with ) inside) state ppid pgrp session tty tpgid flags minflt cminflt majflt
        // cmajflt utime stime cutime cstime ...
        let stat = "42 (kiln (x)) S 1 42 42 0 -1 4194560 10 20 0 0 7 3 100 50 20 0 1 0";
        assert_eq!(cpu_ms_of_stat(stat), Some(1600.0));
        assert_eq!(cpu_ms_of_stat("42 (short) S 1"), None);
        let own = cpu_ms_with_reaped_children(std::process::id());
        assert!(own.is_some_and(|ms| ms >= 0.0), "{own:?}");
    }

    #[test]
    fn own_rss_is_readable() {
        let r = rss(std::process::id());
        assert!(r.rss_kib.is_some_and(|k| k > 0), "{r:?}");
        assert!(r.peak_kib >= r.rss_kib, "{r:?}");
    }
}
