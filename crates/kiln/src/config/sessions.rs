//! The default number of live kernels, sized from the machine: the memory
//! Kiln may use (the host's `MemTotal`, or less when its cgroup is limited)
//! and the measured cost of an idle kernel (BENCHMARKS.md: ~4 MiB PSS
//! for `py`, 14.8 MiB for `js`). An explicit `max_sessions` or
//! `max_sessions_per_user` (TOML, `KILN_*`) always wins.

use std::path::Path;

/// Memory set aside per live kernel: about four idle `js` kernels (sixteen idle
/// `py` ones), so kernels that grow with their users' data still fit.
pub const KERNEL_BUDGET_BYTES: u64 = 64 << 20;
/// The share of the machine's memory idle kernels may take at most: the
/// rest is for one-shot runs, the warm pool and the server.
const MEMORY_SHARE_DIVISOR: u64 = 2;
/// Memory per kernel at the most `max_sessions` accepted: an idle `py`
/// kernel takes ~4 MiB (PSS: 3.9 private and its share of the template),
/// a `js` one ~15 MiB (BENCHMARKS.md, "Live-kernel density").
pub const IDLE_KERNEL_BYTES: u64 = 16 << 20;
/// The most `max_sessions` accepted whatever the memory (what the old
/// fixed limit allowed), and when the memory is unknown.
const MOST_SESSIONS_FLOOR: u32 = 256;
/// The most `max_sessions` accepted at all: uid slots of 65,536 ids above
/// the default `uid_base` fit below 2^32 up to ~65,500; kernels beyond a
/// few thousand per node want more nodes.
const MOST_SESSIONS_CEILING: u32 = 16_384;
/// The default when the machine's memory is unknown, or very small.
const FLOOR_SESSIONS: u32 = 3;

/// The chosen defaults and what they came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSizing {
    pub max_sessions: u32,
    /// The most `max_sessions` this memory allows (what the configuration
    /// accepts): every kernel idle at [`IDLE_KERNEL_BYTES`].
    pub most_sessions: u32,
    pub max_sessions_per_user: usize,
    /// The memory they were sized from; `None` when it could not be read.
    pub memory_bytes: Option<u64>,
}

impl SessionSizing {
    /// Sized for `memory_bytes` of memory: half of it in
    /// [`KERNEL_BUDGET_BYTES`] per kernel, at least 3; one principal may
    /// hold half of them (at least 2), so one LibreChat (all of its users
    /// under one key) gets many while another key still finds room. The
    /// most accepted is all of it in [`IDLE_KERNEL_BYTES`] per kernel (at
    /// least 256, at most 16,384): 1,536 on 24 GiB.
    pub fn for_memory(memory_bytes: Option<u64>) -> SessionSizing {
        let most_sessions = memory_bytes.map_or(MOST_SESSIONS_FLOOR, |m| {
            u32::try_from(m / IDLE_KERNEL_BYTES)
                .unwrap_or(u32::MAX)
                .clamp(MOST_SESSIONS_FLOOR, MOST_SESSIONS_CEILING)
        });
        let max_sessions = memory_bytes.map_or(FLOOR_SESSIONS, |m| {
            let n = m / MEMORY_SHARE_DIVISOR / KERNEL_BUDGET_BYTES;
            u32::try_from(n)
                .unwrap_or(u32::MAX)
                .clamp(FLOOR_SESSIONS, most_sessions)
        });
        SessionSizing {
            max_sessions,
            most_sessions,
            max_sessions_per_user: (max_sessions as usize / 2).max(2),
            memory_bytes,
        }
    }

    /// Sized for this machine (see [`usable_memory`]), read once.
    pub fn for_this_machine() -> SessionSizing {
        static SIZED: std::sync::OnceLock<SessionSizing> = std::sync::OnceLock::new();
        *SIZED.get_or_init(|| SessionSizing::for_memory(usable_memory()))
    }

    /// Why these numbers, for the start-up log and `kiln doctor`.
    pub fn why(&self) -> String {
        match self.memory_bytes {
            Some(m) => format!(
                "sized from {:.1} GiB of memory: half of it at {} MiB per kernel \
                 (an idle py kernel takes ~4 MiB, js ~15 MiB); half of them per \
                 principal; max_sessions may be set up to {} (all of it at {} MiB \
                 per idle kernel)",
                m as f64 / f64::from(1u32 << 30),
                KERNEL_BUDGET_BYTES >> 20,
                self.most_sessions,
                IDLE_KERNEL_BYTES >> 20
            ),
            None => format!(
                "the machine's memory is unknown: the smallest defaults \
                 (max_sessions may be set up to {})",
                self.most_sessions
            ),
        }
    }
}

/// The most kernels of one language `parked_kernels` may keep started ahead.
pub const MOST_PARKED_KERNELS: u32 = 16;

impl super::Config {
    /// Kernel slots held by kernels started ahead (`parked_kernels` per
    /// session language; none when sessions are off).
    pub fn parked_kernel_slots(&self) -> u32 {
        if self.max_sessions == 0 {
            return 0;
        }
        self.parked_kernels * kiln_core::Language::with_kernels().count() as u32
    }

    /// Every slot kept for live kernels: one per session, and those of the
    /// kernels started ahead.
    pub fn kernel_slots(&self) -> u32 {
        self.max_sessions + self.parked_kernel_slots()
    }

    /// Every uid slot the sandbox gets: the runs' concurrency, the parked
    /// warm jails' and the kernels' ([`Self::kernel_slots`]).
    pub fn slots(&self) -> u32 {
        self.max_concurrency + self.warm_jails + self.kernel_slots()
    }

    /// What `max_sessions` and `max_sessions_per_user` are and why: sized
    /// from the machine, or configured (for the start-up log and `kiln
    /// doctor`).
    pub fn sessions_sizing(&self) -> String {
        let sized = SessionSizing::for_this_machine();
        let origin = |configured: bool| if configured { "configured" } else { "default" };
        let both = format!(
            "{} live kernels ({}), {} per principal ({})",
            self.max_sessions,
            origin(self.max_sessions != sized.max_sessions),
            self.max_sessions_per_user,
            origin(self.max_sessions_per_user != sized.max_sessions_per_user),
        );
        format!(
            "{both}; the defaults here are {} and {}, {}",
            sized.max_sessions,
            sized.max_sessions_per_user,
            sized.why()
        )
    }
}

/// The memory Kiln may use: `MemTotal`, or its cgroup's limit when lower
/// (cgroup v2 `memory.max`, v1 `memory.limit_in_bytes`).
pub fn usable_memory() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| mem_total(&t))?;
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let limit = cgroup_memory_files(&cgroups)
        .iter()
        .filter_map(|f| std::fs::read_to_string(Path::new(f)).ok())
        .filter_map(|v| v.trim().parse::<u64>().ok())
        .min();
    Some(limit.map_or(total, |l| l.min(total)))
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The files holding the memory limit of the cgroups named in a
/// `/proc/self/cgroup` text.
fn cgroup_memory_files(cgroups: &str) -> Vec<String> {
    cgroups
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            if path.split('/').any(|c| c == "..") {
                return None;
            }
            if id == "0" && controllers.is_empty() {
                Some(format!("/sys/fs/cgroup{path}/memory.max"))
            } else if controllers.split(',').any(|c| c == "memory") {
                Some(format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"))
            } else {
                None
            }
        })
        .map(|f| f.replace("//", "/"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_24_gib_machine_gets_room_for_seed_004s_25_users_under_one_key() {
        let s = SessionSizing::for_memory(Some(24 * GIB));
        assert_eq!(s.max_sessions, 192);
        assert_eq!(s.max_sessions_per_user, 96);
        assert!(s.max_sessions_per_user >= 25);
    }

    #[test]
    fn sizing_stays_between_the_old_defaults_and_what_memory_allows() {
        let tiny = SessionSizing::for_memory(Some(GIB / 4));
        assert_eq!((tiny.max_sessions, tiny.max_sessions_per_user), (3, 2));
        assert_eq!(tiny.most_sessions, 256);
        let unknown = SessionSizing::for_memory(None);
        assert_eq!(
            (unknown.max_sessions, unknown.max_sessions_per_user),
            (3, 2)
        );
        assert_eq!(unknown.most_sessions, 256);
        assert!(unknown.why().contains("unknown"));
        let huge = SessionSizing::for_memory(Some(1024 * GIB));
        assert_eq!(huge.max_sessions, 8192);
        assert_eq!(huge.max_sessions_per_user, 4096);
        assert_eq!(huge.most_sessions, 16_384);
        let vast = SessionSizing::for_memory(Some(u64::MAX));
        assert_eq!(vast.max_sessions, 16_384);
        let four = SessionSizing::for_memory(Some(4 * GIB));
        assert_eq!((four.max_sessions, four.max_sessions_per_user), (32, 16));
        assert!(four.why().contains("4.0 GiB"), "{}", four.why());
    }

    #[test]
    fn a_24_gib_node_may_be_set_to_a_thousand_idle_kernels() {
        let s = SessionSizing::for_memory(Some(24 * GIB));
        assert_eq!(s.most_sessions, 1536);
        assert!(s.most_sessions >= 1000);
        assert!(s.why().contains("set up to 1536"), "{}", s.why());
    }

    #[test]
    fn mem_total_and_cgroup_limit_files_are_read_from_their_texts() {
        let meminfo = "MemTotal:       24684084 kB\nMemFree:  1 kB\n";
        assert_eq!(mem_total(meminfo), Some(24_684_084 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        let v1 = "5:devices:/\n4:memory:/process_api/abc\n0::/\n";
        assert_eq!(
            cgroup_memory_files(v1),
            vec![
                "/sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes".to_owned(),
                "/sys/fs/cgroup/memory.max".to_owned(),
            ]
        );
        let v2 = "0::/system.slice/kiln.service\n";
        assert_eq!(
            cgroup_memory_files(v2),
            vec!["/sys/fs/cgroup/system.slice/kiln.service/memory.max".to_owned()]
        );
        assert!(cgroup_memory_files("0::/../../etc\n").is_empty());
    }

    #[test]
    fn the_sizing_says_which_values_were_configured() {
        let mut c = super::super::Config::default();
        let said = c.sessions_sizing();
        assert!(said.contains("live kernels (default)"), "{said}");
        assert!(said.contains("per principal (default)"), "{said}");
        c.max_sessions = SessionSizing::for_this_machine().max_sessions + 1;
        let said = c.sessions_sizing();
        assert!(said.contains("live kernels (configured)"), "{said}");
        assert!(said.contains("GiB of memory"), "{said}");
    }

    #[test]
    fn this_machine_is_sized_from_memory_it_can_read() {
        let s = SessionSizing::for_this_machine();
        let m = s.memory_bytes.expect("/proc/meminfo is readable");
        assert_eq!(s, SessionSizing::for_memory(Some(m)));
    }
}
