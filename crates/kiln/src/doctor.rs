//! `kiln doctor`: what the host provides, and what an operator's set-up gets
//! wrong before the first request does.
//!
//! Every check is split in two: a function that reads the host (files under
//! `/proc` and `/etc`, `statvfs`, a test bind) into plain values, and a pure
//! decision over those values that returns a [`Finding`]. The decisions are
//! what the unit tests below pin down; `crates/kiln/tests/cli.rs` checks the
//! printed output of the whole command.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use kiln_sandbox::CgroupSupport;

use crate::config::{Auth, Config};

/// Uids of one jail's range.
pub const UIDS_PER_SLOT: u64 = 65_536;

/// How bad a finding is. `Fail` makes `kiln doctor` exit non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

/// The outcome of one check: what was found and, when it is not fine, what
/// to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub check: &'static str,
    pub level: Level,
    pub message: String,
    pub fix: Option<String>,
}

impl Finding {
    fn ok(check: &'static str, message: impl Into<String>) -> Finding {
        Finding {
            check,
            level: Level::Ok,
            message: message.into(),
            fix: None,
        }
    }
    fn warn(check: &'static str, message: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            check,
            level: Level::Warn,
            message: message.into(),
            fix: Some(fix.into()),
        }
    }
    fn fail(check: &'static str, message: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding {
            check,
            level: Level::Fail,
            message: message.into(),
            fix: Some(fix.into()),
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self.level {
            Level::Ok => "ok  ",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        write!(f, "  {tag} {:<10} {}", self.check, self.message)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n       {:<10} fix: {fix}", "")?;
        }
        Ok(())
    }
}

// ---- data dir -------------------------------------------------------------------------------

/// One existing directory on the way to the data dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirInfo {
    pub path: PathBuf,
    pub mode: u32,
}

/// What `kiln serve` will find at the data dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataDirFacts {
    pub data_dir: PathBuf,
    /// The data dir itself or, when it does not exist yet, the nearest
    /// existing ancestor (where it would be created); `None`: nothing exists.
    pub nearest: Option<PathBuf>,
    /// `nearest` is a directory.
    pub nearest_is_dir: bool,
    /// `nearest` is on a read-only filesystem.
    pub read_only: bool,
    /// The existing ancestors of the data dir (and the data dir itself when
    /// it exists), outermost first.
    pub ancestors: Vec<DirInfo>,
    /// Where jail workspaces will live instead, when they cannot live here
    /// (see [`crate::work_dir`]).
    pub work_dir: PathBuf,
}

/// The first directory on the path that others (the jails' uids) cannot
/// search.
pub fn first_unsearchable(ancestors: &[DirInfo]) -> Option<&DirInfo> {
    ancestors.iter().find(|d| d.mode & 0o001 == 0)
}

/// Data dir permissions: can Kiln create and use it, and can the jails
/// (unprivileged host uids) reach the workspaces kept in it?
pub fn judge_data_dir(f: &DataDirFacts) -> Finding {
    const CHECK: &str = "data dir";
    let shown = f.data_dir.display();
    let Some(nearest) = &f.nearest else {
        return Finding::fail(
            CHECK,
            format!("{shown}: no part of this path exists"),
            "use an absolute path on a local filesystem, e.g. --data-dir /var/lib/kiln",
        );
    };
    if !f.nearest_is_dir {
        return Finding::fail(
            CHECK,
            format!("{} is not a directory", nearest.display()),
            "point data_dir (KILN_DATA_DIR, --data-dir) at a directory",
        );
    }
    if f.read_only {
        return Finding::fail(
            CHECK,
            format!("{} is on a read-only filesystem", nearest.display()),
            "mount a writable volume there (in a container: -v kiln_data:/data)",
        );
    }
    let creates = if nearest == &f.data_dir {
        String::new()
    } else {
        format!(" (created at start in {})", nearest.display())
    };
    match first_unsearchable(&f.ancestors) {
        None => Finding::ok(
            CHECK,
            format!(
                "{shown}{creates}: writable, and every directory above it is searchable by the jails' uids"
            ),
        ),
        Some(d) => Finding::warn(
            CHECK,
            format!(
                "{shown}{creates}: {} has mode {:04o}, so the jails' uids cannot reach run workspaces below it; \
                 Kiln keeps them in {} instead (stored files stay in the data dir)",
                d.path.display(),
                d.mode & 0o7777,
                f.work_dir.display()
            ),
            format!(
                "nothing, if {} suits you; to keep everything under the data dir, let others search {} \
                 (chmod o+x {}: they can pass through, not list it) or choose a data dir such as /var/lib/kiln; \
                 or set work_dir (KILN_WORK_DIR) to a directory of your choice",
                f.work_dir.display(),
                d.path.display(),
                d.path.display()
            ),
        ),
    }
}

/// Reads [`DataDirFacts`] for `data_dir` (made absolute against the current
/// directory, as `kiln serve` does).
pub fn data_dir_facts(data_dir: &Path, work_dir: PathBuf) -> DataDirFacts {
    let abs = absolute(data_dir);
    let nearest = abs.ancestors().find(|p| p.exists()).map(Path::to_path_buf);
    let nearest_is_dir = nearest.as_deref().is_some_and(Path::is_dir);
    let read_only = nearest.as_deref().is_some_and(|p| {
        nix::sys::statvfs::statvfs(p)
            .map(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
            .unwrap_or(false)
    });
    let mut ancestors: Vec<DirInfo> = abs
        .ancestors()
        .filter_map(|p| {
            let m = std::fs::metadata(p).ok()?;
            m.is_dir().then(|| DirInfo {
                path: p.to_path_buf(),
                mode: m.mode(),
            })
        })
        .collect();
    ancestors.reverse();
    DataDirFacts {
        data_dir: abs,
        nearest,
        nearest_is_dir,
        read_only,
        ancestors,
        work_dir,
    }
}

// ---- listen address ------------------------------------------------------------------------

/// What happened when doctor tried to bind the listen address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindOutcome {
    Free,
    /// In use; by this process when it could be found (pid, command name).
    InUse(Option<(u32, String)>),
    /// A port below 1024 without the privilege to bind it.
    Denied,
    /// The address is not one of this host's.
    NotLocal,
    Other(String),
}

/// The port: can `kiln serve` listen where it is told to?
pub fn judge_listen(addr: SocketAddr, bind: &BindOutcome) -> Finding {
    const CHECK: &str = "listen";
    match bind {
        BindOutcome::Free => Finding::ok(CHECK, format!("{addr} is free")),
        BindOutcome::InUse(Some((pid, comm))) if comm == "kiln" => Finding::ok(
            CHECK,
            format!("{addr} is served by a running kiln (pid {pid})"),
        ),
        BindOutcome::InUse(owner) => Finding::fail(
            CHECK,
            format!(
                "{addr} is already in use{}",
                owner
                    .as_ref()
                    .map(|(pid, comm)| format!(" by {comm} (pid {pid})"))
                    .unwrap_or_default()
            ),
            "stop that program or choose another port (listen, KILN_LISTEN, --listen)",
        ),
        BindOutcome::Denied => Finding::fail(
            CHECK,
            format!("binding {addr} is not permitted (ports below 1024 need CAP_NET_BIND_SERVICE)"),
            "use a port above 1023 (the default is 8000) and map it in front if needed",
        ),
        BindOutcome::NotLocal => Finding::fail(
            CHECK,
            format!("{} is not an address of this host", addr.ip()),
            "listen on 127.0.0.1 (same host), 0.0.0.0 (every interface) or one of `ip addr`'s addresses",
        ),
        BindOutcome::Other(e) => Finding::fail(
            CHECK,
            format!("cannot bind {addr}: {e}"),
            "check the address in listen / KILN_LISTEN",
        ),
    }
}

/// Tries to bind `addr` (and lets go at once).
pub fn try_bind(addr: SocketAddr) -> BindOutcome {
    match TcpListener::bind(addr) {
        Ok(_) => BindOutcome::Free,
        Err(e) => bind_failure(addr, &e),
    }
}

/// Why binding `addr` failed with `e`, with the process that holds the
/// port when that is the reason and it can be found.
pub fn bind_failure(addr: SocketAddr, e: &io::Error) -> BindOutcome {
    match e.kind() {
        io::ErrorKind::AddrInUse => BindOutcome::InUse(listener_owner(addr.port())),
        io::ErrorKind::PermissionDenied => BindOutcome::Denied,
        io::ErrorKind::AddrNotAvailable => BindOutcome::NotLocal,
        _ => BindOutcome::Other(e.to_string()),
    }
}

/// Socket inodes listening on `port` in a `/proc/net/tcp{,6}` table.
pub fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = f.get(1)?.rsplit(':').next()?;
            // state 0A is LISTEN
            (u16::from_str_radix(local_port, 16).ok()? == port && *f.get(3)? == "0A")
                .then(|| f.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// The process holding a listening socket on `port` (pid, comm), if this
/// process may look.
fn listener_owner(port: u16) -> Option<(u32, String)> {
    let mut inodes = Vec::new();
    for t in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(t) {
            inodes.extend(listening_inodes(&text, port));
        }
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            if wanted.iter().any(|w| target.as_os_str() == w.as_str()) {
                let comm = std::fs::read_to_string(e.path().join("comm"))
                    .map(|c| c.trim().to_owned())
                    .unwrap_or_default();
                return Some((pid, comm));
            }
        }
    }
    None
}

// ---- auth versus the network ----------------------------------------------------------------

/// The API-key mode against the address Kiln listens on.
pub fn judge_auth(auth: &anyhow::Result<Auth>, addr: SocketAddr) -> Finding {
    const CHECK: &str = "auth";
    match auth {
        Err(e) => Finding::fail(
            CHECK,
            format!("{e:#}"),
            "KILN_AUTH=none, or KILN_AUTH=api-key with KILN_API_KEY set (docs/librechat.md)",
        ),
        Ok(Auth::Jwt | Auth::ApiKeyOrJwt) => Finding::ok(
            CHECK,
            format!(
                "jwt on {addr}: requests need LibreChat's CodeAPI token (CODEAPI_AUTH_PROVIDER=librechat-jwt \
                 on LibreChat's side), and the caller is the token's user"
            ),
        ),
        Ok(Auth::ApiKey) => Finding::ok(
            CHECK,
            format!(
                "api-key on {addr}: requests need X-API-Key or Authorization: Bearer (LibreChat sends the key \
                 only from versions whose @librechat/agents reads LIBRECHAT_CODE_API_KEY; see docs/librechat.md)"
            ),
        ),
        Ok(Auth::None) if addr.ip().is_loopback() => Finding::ok(
            CHECK,
            format!("none, on loopback ({addr}): only this host can reach Kiln"),
        ),
        Ok(Auth::None) => Finding::warn(
            CHECK,
            format!(
                "none, and Kiln listens on {addr}: anyone who can reach this port can run code and read stored files"
            ),
            "fine on a network only LibreChat reaches (a compose network with no published port); \
             otherwise set KILN_API_KEY (for clients that send it), or listen on 127.0.0.1",
        ),
    }
}

// ---- uid ranges -----------------------------------------------------------------------------

/// One `name:start:count` line of `/etc/subuid` or `/etc/subgid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubIdRange {
    pub file: &'static str,
    pub owner: String,
    pub start: u64,
    pub count: u64,
}

/// Parses `/etc/subuid`-style text; malformed lines are skipped.
pub fn parse_subids(file: &'static str, text: &str) -> Vec<SubIdRange> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut f = l.trim().split(':');
            let owner = f.next()?.to_owned();
            let start = f.next()?.parse().ok()?;
            let count = f.next()?.parse().ok()?;
            Some(SubIdRange {
                file,
                owner,
                start,
                count,
            })
        })
        .collect()
}

/// `(name, uid)` of every account in `/etc/passwd`-style text.
pub fn parse_passwd(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((f.first()?.to_string(), f.get(2)?.parse().ok()?))
        })
        .collect()
}

/// `(inside start, outside start, count)` lines of a `uid_map`.
pub fn parse_id_map(text: &str) -> Vec<(u64, u64, u64)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<u64> = l
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (f.len() == 3).then(|| (f[0], f[1], f[2]))
        })
        .collect()
}

/// What the uid check looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UidFacts {
    pub uid_base: u64,
    pub slots: u64,
    pub subids: Vec<SubIdRange>,
    pub accounts: Vec<(String, u64)>,
    /// This process's `uid_map` (identity `0 0 4294967295` outside any
    /// user namespace).
    pub uid_map: Vec<(u64, u64, u64)>,
}

/// `uid_base` and the jails' uid ranges against the accounts, the subordinate
/// ranges other users' containers run as, and what this (possibly
/// namespaced) root can map at all.
pub fn judge_uids(f: &UidFacts) -> Finding {
    const CHECK: &str = "uid range";
    let start = f.uid_base;
    let end = f.uid_base + f.slots * UIDS_PER_SLOT; // exclusive
    let range = format!("{start}..{} ({} slots of 65536)", end - 1, f.slots);
    if end - 1 > u64::from(u32::MAX - 1) {
        return Finding::fail(
            CHECK,
            format!("{range} runs past the largest uid (4294967294)"),
            "lower uid_base (KILN_UID_BASE) or max_concurrency/warm_jails",
        );
    }
    // the whole range must lie in one extent of this process's uid_map
    if !f
        .uid_map
        .iter()
        .any(|&(inside, _, count)| inside <= start && end <= inside + count)
    {
        let have: u64 = f.uid_map.iter().map(|m| m.2).sum();
        return Finding::fail(
            CHECK,
            format!(
                "{range} is not inside this process's user namespace, which maps {have} uids \
                 (a rootless or userns-remapped container)"
            ),
            "run Kiln's container without user-namespace remapping, or map it enough uids \
             (podman: --uidmap 0:<host start>:<uid_base + slots*65536>) (docs/container.md)",
        );
    }
    let accounts: Vec<String> = f
        .accounts
        .iter()
        .filter(|(_, uid)| *uid >= start && *uid < end)
        .map(|(n, uid)| format!("{n} ({uid})"))
        .collect();
    if !accounts.is_empty() {
        return Finding::fail(
            CHECK,
            format!(
                "{range} contains the account(s) {}: a jail would run as them and could use their files",
                accounts.join(", ")
            ),
            "set uid_base (KILN_UID_BASE) above every account's uid (the default is 200000)",
        );
    }
    let overlaps: Vec<String> = f
        .subids
        .iter()
        .filter(|r| r.start < end && start < r.start + r.count)
        .map(|r| {
            format!(
                "{} of {} ({}..{})",
                r.file,
                r.owner,
                r.start,
                r.start + r.count - 1
            )
        })
        .collect();
    if !overlaps.is_empty() {
        return Finding::warn(
            CHECK,
            format!(
                "{range} overlaps {}: that user's rootless containers run as the same host uids as jails \
                 and could signal, trace or read them",
                overlaps.join(", ")
            ),
            "move uid_base (KILN_UID_BASE) past those ranges, or shrink them (usermod --del-subuids/--del-subgids)",
        );
    }
    Finding::ok(
        CHECK,
        format!("{range}: no account and no /etc/subuid or /etc/subgid range in it"),
    )
}

// ---- memory: swap and huge pages ------------------------------------------------------------

/// The values of `/proc/meminfo` in kB (or plain counts), by name.
pub fn parse_meminfo(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((
                k.trim().to_owned(),
                v.split_whitespace().next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// Swap against the memory limit: a run's limit covers swap only where the
/// kernel accounts it (`memory.memsw.*` on v1, `memory.swap.max` on v2).
pub fn judge_swap(swap_kb: u64, cgroup_v1: bool, swap_accounted: bool) -> Finding {
    const CHECK: &str = "swap";
    if swap_kb == 0 {
        return Finding::ok(
            CHECK,
            "no swap on this host: memory_mb bounds each run's memory",
        );
    }
    let size = format!("{} MiB of swap", swap_kb / 1024);
    if swap_accounted {
        return Finding::ok(
            CHECK,
            format!("{size}, accounted: each run gets memory_mb and no swap"),
        );
    }
    let fix = if cgroup_v1 {
        "boot the kernel with swapaccount=1 (cgroup v1 swap accounting), or turn swap off (swapoff -a)"
    } else {
        "turn swap accounting on (do not boot with swapaccount=0), or turn swap off (swapoff -a)"
    };
    Finding::warn(
        CHECK,
        format!(
            "{size}, not accounted by the memory cgroup: a run can page out beyond memory_mb, \
             slowing the host, instead of being stopped as out of memory"
        ),
        fix,
    )
}

/// Whether the kernel accounts swap for Kiln's cgroups.
pub fn swap_accounted(cgroup: &CgroupSupport) -> bool {
    match cgroup {
        CgroupSupport::V1 { memory, .. } => memory.join("memory.memsw.limit_in_bytes").exists(),
        CgroupSupport::V2 { group, .. } => {
            // the root group has no memory.swap.max: look at a child
            group.join("memory.swap.max").exists()
                || std::fs::read_dir(group)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|e| e.path().join("memory.swap.max").exists())
        }
        CgroupSupport::None => false,
    }
}

/// Huge pages: a jail can map the host's pool with `MAP_HUGETLB`, and they
/// are not charged to its memory limit.
pub fn judge_hugepages(total: u64, overcommit: u64, page_kb: u64) -> Finding {
    const CHECK: &str = "hugepages";
    if total == 0 && overcommit == 0 {
        return Finding::ok(CHECK, "no huge page pool: nothing a jail could take");
    }
    Finding::warn(
        CHECK,
        format!(
            "{total} huge pages reserved and {overcommit} more on demand ({} kB each): a run can map them \
             (mmap MAP_HUGETLB) outside its memory_mb limit and starve whatever on this host relies on them",
            page_kb
        ),
        "set vm.nr_hugepages=0 and vm.nr_overcommit_hugepages=0 unless something here needs huge pages \
         (then give it a dedicated host, or keep the pool no larger than it needs)",
    )
}

// ---- runtimes and disk ----------------------------------------------------------------------

/// Languages whose runtime is missing: `(name, reason)`.
pub fn judge_runtimes(missing: &[(String, String)], total: usize) -> Finding {
    const CHECK: &str = "runtimes";
    if missing.is_empty() {
        return Finding::ok(CHECK, format!("all {total} languages have their runtime"));
    }
    let names: Vec<&str> = missing.iter().map(|(n, _)| n.as_str()).collect();
    Finding::warn(
        CHECK,
        format!(
            "{} of {total} languages unavailable ({}): requests for them get an error",
            missing.len(),
            names.join(", ")
        ),
        "the default runtime image has every language (an imported one may lack some); with runtime_image = \"host\", run scripts/install-runtimes.sh as root (Debian 12); or drop those languages from your agents",
    )
}

/// The runtime image jails run from: `error` when `runtime_image` names one that is not there
/// (the server would refuse to start); `image` the image's id, `None` for `host`.
pub fn judge_image(image: Option<&str>, error: Option<&str>) -> Finding {
    const CHECK: &str = "image";
    match (error, image) {
        (Some(e), _) => Finding::fail(
            CHECK,
            format!("{e}; `kiln serve` refuses to start without it"),
            "run `kiln runtime build` as root (or `kiln runtime import`), or point the setting the message names (runtime_image, or a language's entry in runtime_images) at another image or at \"host\"",
        ),
        (None, Some(id)) => Finding::ok(
            CHECK,
            format!("jails run from runtime image {id}; nothing of the host's /usr reaches them"),
        ),
        (None, None) => Finding::ok(
            CHECK,
            "jails run from the host's /usr (runtime_image = \"host\")",
        ),
    }
}

/// Free space where the data dir lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskFacts {
    pub free_bytes: u64,
    pub free_inodes: u64,
    /// The filesystem reports inodes at all (some, like btrfs, do not).
    pub has_inodes: bool,
}

/// Disk space for stored files and for every concurrent run filling its
/// workspace (`max_concurrency × workspace_mb`).
pub fn judge_disk(d: &DiskFacts, concurrency: u64, workspace_mb: u64, path: &Path) -> Finding {
    const CHECK: &str = "disk";
    const MIB: u64 = 1024 * 1024;
    const FLOOR: u64 = 256 * MIB;
    let free = format!("{} MiB free at {}", d.free_bytes / MIB, path.display());
    let needed = concurrency * workspace_mb * MIB + 1024 * MIB;
    if d.free_bytes < FLOOR {
        return Finding::fail(
            CHECK,
            format!("only {free}: uploads, outputs and workspaces will fail"),
            "free space there, or move data_dir (KILN_DATA_DIR) to a larger filesystem",
        );
    }
    if d.has_inodes && d.free_inodes < 10_000 {
        return Finding::fail(
            CHECK,
            format!("only {} inodes free at {}", d.free_inodes, path.display()),
            "free inodes there, or move data_dir to another filesystem",
        );
    }
    if d.free_bytes < needed {
        return Finding::warn(
            CHECK,
            format!(
                "{free}; {concurrency} runs filling their {workspace_mb} MiB workspaces at once, plus 1 GiB \
                 for stored files, need {} MiB",
                needed / MIB
            ),
            "free space, lower workspace_mb or max_concurrency, or move data_dir to a larger filesystem",
        );
    }
    Finding::ok(
        CHECK,
        format!(
            "{free} (enough for {concurrency} full {workspace_mb} MiB workspaces and 1 GiB of files)"
        ),
    )
}

/// Free bytes and inodes of the filesystem holding `path` (or its nearest
/// existing ancestor).
pub fn disk_facts(path: &Path) -> Option<(PathBuf, DiskFacts)> {
    let at = path.ancestors().find(|p| p.exists())?;
    let s = nix::sys::statvfs::statvfs(at).ok()?;
    Some((
        at.to_path_buf(),
        DiskFacts {
            free_bytes: s.blocks_available() * s.fragment_size(),
            free_inodes: s.files_available(),
            has_inodes: s.files() > 0,
        },
    ))
}

// ---- all of it ------------------------------------------------------------------------------

/// Every operator check, in the order printed.
pub fn checks(
    config: &Config,
    host: &kiln_sandbox::HostReport,
    languages: &[kiln_api::LanguageHealth],
) -> Vec<Finding> {
    let mut out = Vec::new();
    out.push(judge_data_dir(&data_dir_facts(
        &config.data_dir,
        crate::work_dir(config, &absolute(&config.data_dir)),
    )));
    match config.listen_addr() {
        Ok(addr) => {
            out.push(judge_listen(addr, &try_bind(addr)));
            out.push(judge_auth(&config.auth_mode(), addr));
        }
        Err(e) => out.push(Finding::fail(
            "listen",
            format!("{e:#}"),
            "use host:port, e.g. 127.0.0.1:8000 or 0.0.0.0:8000",
        )),
    }
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let mut subids = parse_subids("/etc/subuid", &read("/etc/subuid"));
    subids.extend(parse_subids("/etc/subgid", &read("/etc/subgid")));
    out.push(judge_uids(&UidFacts {
        uid_base: u64::from(config.uid_base),
        // every slot's uids, the kernels' too (as lib.rs gives the sandbox)
        slots: u64::from(config.slots()),
        subids,
        accounts: parse_passwd(&read("/etc/passwd")),
        uid_map: parse_id_map(&read("/proc/self/uid_map")),
    }));
    let mem = parse_meminfo(&read("/proc/meminfo"));
    let get = |k: &str| mem.get(k).copied().unwrap_or(0);
    out.push(judge_swap(
        get("SwapTotal"),
        matches!(host.cgroup, CgroupSupport::V1 { .. }),
        swap_accounted(&host.cgroup),
    ));
    out.push(judge_hugepages(
        get("HugePages_Total"),
        read("/proc/sys/vm/nr_overcommit_hugepages")
            .trim()
            .parse()
            .unwrap_or(0),
        get("Hugepagesize"),
    ));
    let missing: Vec<(String, String)> = languages
        .iter()
        .filter(|l| l.version.is_none())
        .map(|l| (l.name.clone(), l.reason.clone().unwrap_or_default()))
        .collect();
    out.push(judge_runtimes(&missing, languages.len()));
    out.push(judge_mounts(
        kiln_sandbox::visible_mounts(),
        config.max_concurrency + config.warm_jails,
    ));
    out.push(Finding::ok("sessions", config.sessions_sizing()));
    out.push(judge_storage(&config.store_backends()));
    match disk_facts(&absolute(&config.data_dir)) {
        Some((at, d)) => out.push(judge_disk(
            &d,
            u64::from(config.max_concurrency),
            config.workspace_mb,
            &at,
        )),
        None => out.push(Finding::fail(
            "disk",
            format!("cannot read free space for {}", config.data_dir.display()),
            "check that the data dir's filesystem is mounted",
        )),
    }
    out
}

/// CPU a jail spends per mount it copies (BENCHMARKS.md: 6.6 µs).
const MOUNT_COST_US: f64 = 6.6;
/// Mount tables above this size get a warning (≈ 0.7 ms per run).
const MANY_MOUNTS: usize = 100;

/// The mount table: every jail copies the host's mounts plus the server's
/// `slots` slot filesystems (one more per live kernel), and tears each
/// down again.
pub fn judge_mounts(host_mounts: usize, slots: u32) -> Finding {
    let n = host_mounts + slots as usize;
    let cost = format!(
        "each jail copies {n} mounts ({host_mounts} of the host, {slots} slot filesystems, \
         one more per live kernel), about {:.1} ms of CPU per run",
        n as f64 * MOUNT_COST_US / 1000.0
    );
    if n > MANY_MOUNTS {
        Finding::warn(
            "mounts",
            cost,
            "unmount what the host no longer needs, or run Kiln in a container of its own \
             (its mount table is short)",
        )
    } else {
        Finding::ok("mounts", cost)
    }
}

/// Which engines hold stored files: the embedded pair, or Postgres / S3
/// (named without secrets). Nothing is contacted.
pub fn judge_storage(backends: &anyhow::Result<kiln_store::Backends>) -> Finding {
    use kiln_store::{BlobBackend, MetaBackend};
    let b = match backends {
        Ok(b) => b,
        Err(e) => {
            return Finding::fail(
                "storage",
                format!("{e:#}"),
                "set database_url to a postgres:// URL (or unset it), and s3_bucket with its \
                 s3_* settings (or unset them); see docs/deploy.md",
            );
        }
    };
    let meta = match &b.meta {
        MetaBackend::Sqlite => "SQLite in the data dir".to_owned(),
        MetaBackend::Postgres { url } => format!("Postgres at {}", redact_url(url)),
    };
    let blobs = match &b.blobs {
        BlobBackend::Local => "blobs in the data dir".to_owned(),
        BlobBackend::S3(s3) => format!(
            "blobs in S3 bucket {} at {}{}",
            s3.bucket,
            s3.endpoint.as_deref().unwrap_or("AWS"),
            if s3.path_style { " (path-style)" } else { "" }
        ),
        BlobBackend::Custom(_) => "blobs in a custom object store".to_owned(),
    };
    let shared = !matches!(b.meta, MetaBackend::Sqlite) && !matches!(b.blobs, BlobBackend::Local);
    let nodes = if shared {
        "several nodes may share them"
    } else {
        "one node only"
    };
    Finding::ok("storage", format!("metadata: {meta}; {blobs}; {nodes}"))
}

/// A connection URL without its password (`user:***@host`).
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<unparsable URL>".to_owned();
    };
    let (auth, host) = match rest.rsplit_once('@') {
        Some((auth, host)) => (Some(auth), host),
        None => (None, rest),
    };
    let host = host.split('?').next().unwrap_or(host);
    match auth {
        Some(auth) => {
            let user = auth.split(':').next().unwrap_or("");
            let hidden = if auth.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}")
        }
        None => format!("{scheme}://{host}"),
    }
}

/// `p` against the current directory, without `.` components.
fn absolute(p: &Path) -> PathBuf {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|c| c.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    };
    abs.components().collect()
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_long_mount_table_is_a_warning_with_its_cost_per_run() {
        let short = judge_mounts(20, 16);
        assert_eq!(short.level, Level::Ok);
        assert!(short.message.contains("36 mounts"), "{}", short.message);
        let long = judge_mounts(500, 16);
        assert_eq!(long.level, Level::Warn);
        assert!(long.message.contains("3.4 ms"), "{}", long.message);
        assert!(long.fix.is_some());
    }

    use super::*;

    #[test]
    fn storage_names_the_backends_without_secrets() {
        let embedded = judge_storage(&Ok(kiln_store::Backends::default()));
        assert_eq!(embedded.level, Level::Ok);
        assert!(
            embedded.message.contains("SQLite in the data dir"),
            "{}",
            embedded.message
        );
        assert!(
            embedded.message.contains("one node only"),
            "{}",
            embedded.message
        );
        let shared = kiln_store::Backends {
            meta: kiln_store::MetaBackend::Postgres {
                url: "postgres://kiln:hunter2@db:5432/kiln?sslmode=require".into(),
            },
            blobs: kiln_store::BlobBackend::S3(kiln_store::S3Config {
                bucket: "kiln-files".into(),
                endpoint: Some("http://minio:9000".into()),
                path_style: true,
                secret_access_key: Some("s3cret".into()),
                ..Default::default()
            }),
        };
        let f = judge_storage(&Ok(shared));
        assert_eq!(f.level, Level::Ok);
        assert_eq!(
            f.message,
            "metadata: Postgres at postgres://kiln:***@db:5432/kiln; blobs in S3 bucket \
             kiln-files at http://minio:9000 (path-style); several nodes may share them"
        );
        let bad = judge_storage(&Err(anyhow::anyhow!(
            "database_url must be a postgres:// URL"
        )));
        assert_eq!(bad.level, Level::Fail);
    }

    fn dir(path: &str, mode: u32) -> DirInfo {
        DirInfo {
            path: path.into(),
            mode,
        }
    }

    fn facts(data: &str, ancestors: Vec<DirInfo>) -> DataDirFacts {
        DataDirFacts {
            data_dir: data.into(),
            nearest: Some(data.into()),
            nearest_is_dir: true,
            read_only: false,
            ancestors,
            work_dir: "/var/lib/kiln/work-0123456789abcdef".into(),
        }
    }

    #[test]
    fn a_0700_parent_is_reported_with_where_workspaces_go_and_how_to_fix_it() {
        let f = facts(
            "/root/kiln/kiln-data",
            vec![
                dir("/", 0o40755),
                dir("/root", 0o40700),
                dir("/root/kiln", 0o40755),
                dir("/root/kiln/kiln-data", 0o40755),
            ],
        );
        let r = judge_data_dir(&f);
        assert_eq!(r.level, Level::Warn);
        assert!(r.message.contains("/root has mode 0700"), "{}", r.message);
        assert!(
            r.message.contains("/var/lib/kiln/work-0123456789abcdef"),
            "{}",
            r.message
        );
        let fix = r.fix.unwrap();
        assert!(fix.contains("chmod o+x /root"), "{fix}");
        assert!(fix.contains("/var/lib/kiln"), "{fix}");
    }

    #[test]
    fn a_searchable_path_is_fine_and_a_missing_data_dir_is_created_in_its_parent() {
        let mut f = facts(
            "/var/lib/kiln",
            vec![dir("/", 0o40755), dir("/var", 0o40755)],
        );
        f.nearest = Some("/var".into());
        let r = judge_data_dir(&f);
        assert_eq!(r.level, Level::Ok, "{r}");
        assert!(
            r.message.contains("created at start in /var"),
            "{}",
            r.message
        );
    }

    #[test]
    fn read_only_and_non_directory_data_dirs_fail() {
        let mut f = facts("/data", vec![dir("/", 0o40755), dir("/data", 0o40755)]);
        f.read_only = true;
        assert_eq!(judge_data_dir(&f).level, Level::Fail);
        let mut f = facts("/data", vec![dir("/", 0o40755)]);
        f.nearest_is_dir = false;
        assert_eq!(judge_data_dir(&f).level, Level::Fail);
        let mut f = facts("/data", vec![]);
        f.nearest = None;
        assert_eq!(judge_data_dir(&f).level, Level::Fail);
    }

    #[test]
    fn data_dir_facts_read_modes_outermost_first() {
        let tmp = tempfile::tempdir().unwrap();
        let closed = tmp.path().join("closed");
        std::fs::create_dir(&closed).unwrap();
        std::fs::set_permissions(&closed, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        let data = closed.join("data");
        let f = data_dir_facts(&data, "/w".into());
        assert_eq!(f.nearest.as_deref(), Some(closed.as_path()));
        assert_eq!(f.ancestors.first().unwrap().path, Path::new("/"));
        assert_eq!(f.ancestors.last().unwrap().path, closed);
        assert_eq!(first_unsearchable(&f.ancestors).unwrap().path, closed);
    }

    #[test]
    fn listen_outcomes_say_who_holds_the_port() {
        let addr: SocketAddr = "0.0.0.0:8000".parse().unwrap();
        assert_eq!(judge_listen(addr, &BindOutcome::Free).level, Level::Ok);
        let kiln = judge_listen(addr, &BindOutcome::InUse(Some((42, "kiln".into()))));
        assert_eq!(kiln.level, Level::Ok);
        assert!(kiln.message.contains("running kiln (pid 42)"));
        let other = judge_listen(addr, &BindOutcome::InUse(Some((7, "nginx".into()))));
        assert_eq!(other.level, Level::Fail);
        assert!(
            other.message.contains("in use by nginx (pid 7)"),
            "{}",
            other.message
        );
        assert_eq!(
            judge_listen(addr, &BindOutcome::InUse(None)).level,
            Level::Fail
        );
        assert_eq!(judge_listen(addr, &BindOutcome::Denied).level, Level::Fail);
        assert_eq!(
            judge_listen(addr, &BindOutcome::NotLocal).level,
            Level::Fail
        );
    }

    #[test]
    fn listening_sockets_are_found_by_port_in_proc_net_tcp() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:1F40 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 999 1 0000000000000000 100 0 0 10 0\n\
   2: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0\n";
        assert_eq!(listening_inodes(table, 8000), vec![12345]);
        assert_eq!(listening_inodes(table, 80), vec![777]);
        assert!(listening_inodes(table, 9000).is_empty());
    }

    #[test]
    fn a_bound_port_is_found_in_use_by_this_process() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let BindOutcome::InUse(Some((pid, _))) = try_bind(addr) else {
            panic!("{addr} should be in use by this test");
        };
        assert_eq!(pid, std::process::id());
    }

    #[test]
    fn no_auth_is_fine_on_loopback_and_a_warning_beyond_it() {
        let lo: SocketAddr = "127.0.0.1:8000".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:8000".parse().unwrap();
        assert_eq!(judge_auth(&Ok(Auth::None), lo).level, Level::Ok);
        let open = judge_auth(&Ok(Auth::None), any);
        assert_eq!(open.level, Level::Warn);
        assert!(open.fix.unwrap().contains("KILN_API_KEY"));
        assert_eq!(judge_auth(&Ok(Auth::ApiKey), any).level, Level::Ok);
        assert_eq!(
            judge_auth(&Err(anyhow::anyhow!("auth is api-key but no key")), lo).level,
            Level::Fail
        );
    }

    fn uid_facts(uid_base: u64) -> UidFacts {
        UidFacts {
            uid_base,
            slots: 12,
            subids: parse_subids(
                "/etc/subuid",
                "alice:100000:65536\n# comment\nbob:1000000:65536\n",
            ),
            accounts: parse_passwd(
                "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/usr/sbin/nologin\nalice:x:1000:1000::/home/alice:/bin/bash\n",
            ),
            uid_map: parse_id_map("         0          0 4294967295\n"),
        }
    }

    #[test]
    fn uid_ranges_overlapping_subuid_ranges_are_warned_about() {
        // 200000 + 12 * 65536 = 986432: clear of alice (100000..165535) and bob (1000000..)
        assert_eq!(judge_uids(&uid_facts(200_000)).level, Level::Ok);
        let r = judge_uids(&uid_facts(150_000));
        assert_eq!(r.level, Level::Warn);
        assert!(
            r.message.contains("/etc/subuid of alice (100000..165535)"),
            "{}",
            r.message
        );
        let r = judge_uids(&uid_facts(300_000));
        assert_eq!(r.level, Level::Warn);
        assert!(r.message.contains("bob"), "{}", r.message);
    }

    #[test]
    fn uid_ranges_holding_an_account_or_past_the_last_uid_fail() {
        let r = judge_uids(&uid_facts(0));
        assert_eq!(r.level, Level::Fail);
        assert!(r.message.contains("root (0)"), "{}", r.message);
        assert_eq!(judge_uids(&uid_facts(4_294_500_000)).level, Level::Fail);
    }

    #[test]
    fn a_user_namespace_too_small_for_the_jails_fails() {
        let mut f = uid_facts(200_000);
        // rootless podman: root plus 65536 subordinate uids
        f.uid_map = parse_id_map("0 1000 1\n1 100000 65536\n");
        let r = judge_uids(&f);
        assert_eq!(r.level, Level::Fail);
        assert!(r.message.contains("maps 65537 uids"), "{}", r.message);
        f.uid_map = parse_id_map("0 1000000 2000000\n");
        assert_eq!(judge_uids(&f).level, Level::Ok);
    }

    #[test]
    fn swap_is_a_warning_only_when_present_and_unaccounted() {
        assert_eq!(judge_swap(0, true, false).level, Level::Ok);
        assert_eq!(judge_swap(2_097_152, true, true).level, Level::Ok);
        let v1 = judge_swap(2_097_152, true, false);
        assert_eq!(v1.level, Level::Warn);
        assert!(v1.message.contains("2048 MiB of swap"));
        assert!(v1.fix.unwrap().contains("swapaccount=1"));
        assert!(
            judge_swap(1024, false, false)
                .fix
                .unwrap()
                .contains("swapaccount=0")
        );
    }

    #[test]
    fn meminfo_is_read_by_name() {
        let m = parse_meminfo(
            "MemTotal:       24576000 kB\nSwapTotal:             0 kB\nHugePages_Total:       8\nHugepagesize:       2048 kB\n",
        );
        assert_eq!(m["SwapTotal"], 0);
        assert_eq!(m["HugePages_Total"], 8);
        assert_eq!(m["Hugepagesize"], 2048);
    }

    #[test]
    fn a_huge_page_pool_is_warned_about() {
        assert_eq!(judge_hugepages(0, 0, 2048).level, Level::Ok);
        let r = judge_hugepages(512, 0, 2048);
        assert_eq!(r.level, Level::Warn);
        assert!(r.message.contains("512 huge pages"));
        assert_eq!(judge_hugepages(0, 64, 2048).level, Level::Warn);
    }

    #[test]
    fn a_missing_runtime_image_fails_the_check_and_names_the_build_command() {
        let f = judge_image(
            Some("default"),
            Some("the default runtime image recipe-x is not built"),
        );
        assert_eq!(f.level, Level::Fail);
        assert!(f.message.contains("refuses to start"), "{}", f.message);
        let fix = f.fix.unwrap();
        assert!(fix.contains("kiln runtime build"), "{fix}");
        // a language's own image (runtime_images) is missing as often as the default one
        assert!(fix.contains("runtime_images"), "{fix}");
        assert_eq!(judge_image(Some("recipe-x"), None).level, Level::Ok);
        let host = judge_image(None, None);
        assert_eq!(host.level, Level::Ok);
        assert!(host.message.contains("host's /usr"), "{}", host.message);
    }

    #[test]
    fn missing_runtimes_are_named() {
        assert_eq!(judge_runtimes(&[], 13).level, Level::Ok);
        let r = judge_runtimes(
            &[
                ("r".into(), "not installed".into()),
                ("d".into(), "x".into()),
            ],
            13,
        );
        assert_eq!(r.level, Level::Warn);
        assert!(r.message.contains("2 of 13 languages unavailable (r, d)"));
        assert!(r.fix.unwrap().contains("install-runtimes.sh"));
    }

    #[test]
    fn disk_space_is_judged_against_full_workspaces() {
        const MIB: u64 = 1024 * 1024;
        let at = Path::new("/var/lib/kiln");
        let d = |free_mib: u64| DiskFacts {
            free_bytes: free_mib * MIB,
            free_inodes: 1_000_000,
            has_inodes: true,
        };
        assert_eq!(judge_disk(&d(100), 8, 1024, at).level, Level::Fail);
        let tight = judge_disk(&d(4096), 8, 1024, at);
        assert_eq!(tight.level, Level::Warn);
        assert!(tight.message.contains("need 9216 MiB"), "{}", tight.message);
        assert_eq!(judge_disk(&d(20_000), 8, 1024, at).level, Level::Ok);
        let no_inodes = DiskFacts {
            free_inodes: 10,
            ..d(20_000)
        };
        assert_eq!(judge_disk(&no_inodes, 8, 1024, at).level, Level::Fail);
        let btrfs = DiskFacts {
            free_inodes: 0,
            has_inodes: false,
            ..d(20_000)
        };
        assert_eq!(judge_disk(&btrfs, 8, 1024, at).level, Level::Ok);
    }
}
