//! One set of groups per uid slot for one-shot jails (fresh and warm),
//! made once and reset between runs, instead of groups made and removed
//! per run (mkdir, limits, rmdir and the kernel's css release: ≈ 0.95 ms of
//! CPU per request, `BENCHMARKS.md`).
//!
//! A slot's set is lent to one run at a time ([`SlotGroups::take`]); the
//! run's end waits, as for any run, until no process is left in it, reads
//! the figures and hands it back. It is reset in the slot's clean-up
//! ([`SlotGroups::recycle`]: off the request path, after every run of the
//! slot is over and its workspace emptied, so the files the run wrote are
//! gone and their page cache with them), and lent again only when the
//! reset found it clean:
//! - no process in any of its groups, no task counted in `pids.current`
//!   (read again for a few ms while no process is listed: [`settle`]);
//! - at most [`LEFT_BOUND`] of memory still charged, given back first
//!   (v1 `memory.force_empty`, v2 `memory.reclaim`) where more is, and
//!   read again for a few dozen ms while the kernel frees what exited
//!   processes left ([`MEMORY_PAUSES_US`]): a
//!   group's charge is not moved when a process leaves, so without this the
//!   page cache of one run would count against the next run's limit (what
//!   is left under the bound, mostly kernel objects no reclaim frees, counts
//!   in the next run's peak);
//! - the peak restarted (v1 `memory.max_usage_in_bytes`; v2 `memory.peak`
//!   is reset per open descriptor, Linux 6.12+: the run holds its own);
//! - the counters that only grow (CPU time, throttled time, OOM kills) read
//!   as the next run's baseline, so it reports only its own.
//!
//! Anything else, or any error on the way, and the set is removed and a new
//! one made (the same pattern as the slot network namespace in
//! `slotnet.rs`). A slot whose set is lent or not reset yet (a second run
//! under the same slot, e.g. a compile step's program) gets per-run groups
//! as before. Live kernels (on-demand slots) keep per-run groups.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use kiln_core::Limits;

use super::{CgroupDriver, PeakWindow, RunCgroups, detect, procs};
use crate::error::SandboxError;
use crate::slots::SlotLease;

/// The most memory a set may still be charged with after the reset: what
/// the kernel keeps charged to an empty group for a while (slab objects
/// such as the dentries of files it looked up, per-CPU stock) is well
/// below it; a run's page cache or anonymous memory is not.
pub(crate) const LEFT_BOUND: u64 = 2 * 1024 * 1024;

/// The limits written to a set's groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupLimits {
    pub memory_bytes: u64,
    pub pids: u32,
}

impl GroupLimits {
    pub(crate) fn of(limits: &Limits) -> GroupLimits {
        GroupLimits {
            memory_bytes: limits.memory_bytes,
            pids: limits.pids,
        }
    }
}

/// What the counters that only grow held when a set was reset: a run lent
/// the set reports the difference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Baseline {
    pub cpu: Duration,
    pub oom_kills: u64,
    pub throttled: Duration,
}

/// A slot's groups (the same directories a run's groups would be).
#[derive(Debug)]
pub(crate) struct KeptSet {
    /// Memory group first, as in [`RunCgroups`].
    pub dirs: Vec<PathBuf>,
    /// The group with the CPU quota, if any.
    pub cpu: Option<PathBuf>,
    /// The group whose CPU time is read, if any.
    pub cpu_dir: Option<PathBuf>,
    pub limits: GroupLimits,
    pub base: Baseline,
}

#[derive(Debug, Default)]
enum State {
    /// None made yet, or the last one removed.
    #[default]
    None,
    /// Reset and found clean: the next run may take it.
    Clean(KeptSet),
    /// Lent to a run.
    Lent,
    /// Its run is over; the reset has not run yet.
    Used(KeptSet),
}

#[derive(Debug, Default)]
struct Entry {
    state: State,
    /// The limits of the slot's last run (what a new set is made with).
    limits: Option<GroupLimits>,
}

/// The kept sets of a pool's fixed slots (index → set).
#[derive(Debug)]
pub(crate) struct SlotGroups {
    driver: Arc<CgroupDriver>,
    entries: Mutex<Vec<Entry>>,
    /// After shutdown sets are removed, not kept.
    closed: AtomicBool,
    /// A new set failed its reset: the host cannot give what a reset needs
    /// (e.g. a v2 kernel before 6.12, without a per-descriptor peak), so
    /// every run gets per-run groups.
    off: AtomicBool,
    /// The first host uid of slot 0 (a set's name says its slot's range).
    uid_base: u32,
}

/// Part of each set's name, so a new set never meets an old one that could
/// not be removed yet (process-wide: several sandboxes in one process, in
/// tests).
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// A set lent to a run: what [`RunCgroups`] needs to hand it back.
#[derive(Debug)]
pub(crate) struct Lent {
    groups: Arc<SlotGroups>,
    index: u32,
    limits: GroupLimits,
}

impl Lent {
    /// The run is over and no process is left in `dirs`: the set waits for
    /// the slot's clean-up.
    pub(crate) fn hand_back(
        self,
        dirs: Vec<PathBuf>,
        cpu: Option<PathBuf>,
        cpu_dir: Option<PathBuf>,
    ) {
        let set = KeptSet {
            dirs,
            cpu,
            cpu_dir,
            limits: self.limits,
            base: Baseline::default(),
        };
        self.groups.store(self.index, State::Used(set));
    }
}

impl SlotGroups {
    /// The sets of `slots` slots, the first of which starts at host uid
    /// `uid_base`.
    pub(crate) fn new(driver: Arc<CgroupDriver>, slots: usize, uid_base: u32) -> Arc<SlotGroups> {
        let groups = Arc::new(SlotGroups {
            driver,
            entries: Mutex::new((0..slots).map(|_| Entry::default()).collect()),
            closed: AtomicBool::new(false),
            off: AtomicBool::new(false),
            uid_base,
        });
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        if live.is_empty()
            && let Err(e) = crate::sys::at_exit(remove_at_exit)
        {
            tracing::warn!(error = %e, "the slots' cgroups will not be removed at exit");
        }
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&groups));
        groups
    }

    fn entries(&self) -> MutexGuard<'_, Vec<Entry>> {
        // every update is one entry's assignment: a poisoned lock is consistent
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The groups of a run of slot `index` named `name`: the slot's set if
    /// it is clean (its limits rewritten where the run's differ), else new
    /// per-run groups. `lease` is released when the run's groups are
    /// handed back or gone.
    pub(crate) fn take(
        self: &Arc<Self>,
        index: u32,
        name: &str,
        limits: &Limits,
        lease: SlotLease,
    ) -> Result<RunCgroups, SandboxError> {
        let wanted = GroupLimits::of(limits);
        let set = {
            let mut entries = self.entries();
            match entries.get_mut(index as usize) {
                Some(e) => {
                    e.limits = Some(wanted);
                    match std::mem::take(&mut e.state) {
                        State::Clean(set) => {
                            e.state = State::Lent;
                            Some(set)
                        }
                        other => {
                            e.state = other;
                            None
                        }
                    }
                }
                None => None,
            }
        };
        let Some(set) = set else {
            return self.driver.create_run(name, limits, lease);
        };
        let lent = Lent {
            groups: Arc::clone(self),
            index,
            limits: wanted,
        };
        let peak = match self.prepare_run(&set, wanted) {
            Ok(peak) => peak,
            Err(e) => {
                // not usable: removed, and the run gets groups of its own
                tracing::warn!(slot = index, error = %e, "the slot's cgroups could not be set up for a run; replaced");
                if let Some(entry) = self.entries().get_mut(index as usize) {
                    entry.state = State::None;
                }
                self.remove(set);
                return self.driver.create_run(name, limits, lease);
            }
        };
        Ok(RunCgroups::lent(
            matches!(*self.driver, CgroupDriver::V2(_)),
            set,
            lent,
            peak,
            lease,
        ))
    }

    /// Rewrites `set`'s limits where `wanted` differs; on v2 opens the
    /// run's own peak window (a descriptor whose `memory.peak` was reset).
    fn prepare_run(
        &self,
        set: &KeptSet,
        wanted: GroupLimits,
    ) -> Result<Option<PeakWindow>, SandboxError> {
        if set.limits != wanted {
            self.driver.rewrite_limits(&set.dirs, set.limits, wanted)?;
        }
        match *self.driver {
            CgroupDriver::V1(_) => Ok(None),
            CgroupDriver::V2(_) => {
                let memory = set.dirs.first().cloned().unwrap_or_default();
                open_peak_window(&memory).map(Some)
            }
        }
    }

    /// After every run of slot `index` is over and its workspace emptied,
    /// before the index is handed out again: resets the slot's set and keeps
    /// it if the reset found it clean, else removes it; makes one where the
    /// slot has none. Blocks. A failure leaves the slot without a set (its
    /// runs then get per-run groups).
    pub(crate) fn recycle(&self, index: u32) {
        if self.closed.load(Ordering::SeqCst) || self.off.load(Ordering::Relaxed) {
            return;
        }
        let (state, limits) = {
            let mut entries = self.entries();
            let Some(e) = entries.get_mut(index as usize) else {
                return;
            };
            match &e.state {
                // in use, or clean and untouched since
                State::Lent | State::Clean(_) => return,
                State::None | State::Used(_) => {}
            }
            (std::mem::take(&mut e.state), e.limits)
        };
        let kept = match state {
            State::Used(mut set) => match self.reset(&set) {
                Ok(clean) => {
                    let result = if clean.waited.is_zero() {
                        "clean"
                    } else {
                        "settled"
                    };
                    metrics::counter!("kiln_slot_cgroups_total", "result" => result).increment(1);
                    set.base = clean.base;
                    Some(set)
                }
                Err(e) => {
                    metrics::counter!("kiln_slot_cgroups_total", "result" => "replaced")
                        .increment(1);
                    tracing::info!(slot = index, reason = %e, "the slot's cgroups were not found clean after a run; replaced");
                    self.remove(set);
                    None
                }
            },
            _ => None,
        };
        let kept = kept.or_else(|| match self.make(index, limits) {
            Ok(set) => Some(set),
            Err(e) => {
                tracing::warn!(slot = index, error = %e, "cannot make the slot's cgroups; its runs get their own");
                None
            }
        });
        self.store(
            index,
            match kept {
                Some(set) => State::Clean(set),
                None => State::None,
            },
        );
    }

    /// Sets slot `index`'s state; after shutdown its set is removed instead
    /// (checked under the lock [`SlotGroups::remove_all`] drains).
    fn store(&self, index: u32, state: State) {
        let left = {
            let mut entries = self.entries();
            match entries.get_mut(index as usize) {
                Some(e) if !self.closed.load(Ordering::SeqCst) => {
                    e.state = state;
                    None
                }
                _ => Some(state),
            }
        };
        if let Some(State::Clean(set) | State::Used(set)) = left {
            self.remove(set);
        }
    }

    /// A new set for slot `index` with `limits` (the default ones if the
    /// slot has not run yet), reset like a used one.
    fn make(&self, index: u32, limits: Option<GroupLimits>) -> Result<KeptSet, String> {
        let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        let first_uid = self.uid_base + index * crate::spec::ID_RANGE;
        let name = format!("{}-u{first_uid}.{generation}", std::process::id());
        let limits = limits.unwrap_or_else(|| GroupLimits::of(&Limits::default()));
        let run = self
            .driver
            .make(
                &name,
                &Limits {
                    memory_bytes: limits.memory_bytes,
                    pids: limits.pids,
                    ..Limits::default()
                },
            )
            .map_err(|e| e.to_string())?;
        let (dirs, cpu, cpu_dir) = run.into_parts();
        let mut set = KeptSet {
            dirs,
            cpu,
            cpu_dir,
            limits,
            base: Baseline::default(),
        };
        match self.reset(&set) {
            Ok(clean) => {
                set.base = clean.base;
                Ok(set)
            }
            Err(e) => {
                self.remove(set);
                self.off.store(true, Ordering::Relaxed);
                Err(format!(
                    "a new set fails its reset ({e}): no slot keeps cgroups, every run makes its own"
                ))
            }
        }
    }

    /// Resets a set whose run is over; what it read if it is clean.
    fn reset(&self, set: &KeptSet) -> Result<Clean, String> {
        let before = thread_cpu();
        let done = reset(
            matches!(*self.driver, CgroupDriver::V2(_)),
            set,
            &mut std::thread::sleep,
        );
        tracing::debug!(
            group = %set.dirs.first().map(|d| d.display().to_string()).unwrap_or_default(),
            cpu_us = thread_cpu().saturating_sub(before).as_micros() as u64,
            left_bytes = ?done.as_ref().ok().map(|c| c.left),
            waited_us = ?done.as_ref().ok().map(|c| c.waited.as_micros() as u64),
            error = ?done.as_ref().err(),
            "a slot's cgroups reset"
        );
        done
    }

    /// Removes a set's groups (in the background if they do not go at once).
    fn remove(&self, set: KeptSet) {
        RunCgroups::orphan(matches!(*self.driver, CgroupDriver::V2(_)), set.dirs).remove_or_leave();
    }

    /// Removes every set not lent; sets lent now are removed when their run
    /// hands them back. On shutdown.
    pub(crate) fn remove_all(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let sets: Vec<KeptSet> = self
            .entries()
            .iter_mut()
            .filter_map(|e| match std::mem::take(&mut e.state) {
                State::Clean(set) | State::Used(set) => Some(set),
                State::Lent => {
                    e.state = State::Lent;
                    None
                }
                State::None => None,
            })
            .collect();
        for set in sets {
            self.remove(set);
        }
    }
}

/// The kept sets of this process, removed at exit (a server that stops
/// without shutting its sandbox down, a test binary's static sandbox).
static LIVE: Mutex<Vec<Weak<SlotGroups>>> = Mutex::new(Vec::new());

extern "C" fn remove_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let live: Vec<Arc<SlotGroups>> = LIVE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for groups in live {
            groups.remove_all();
        }
    });
}

impl Drop for SlotGroups {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// Opens a v2 group's `memory.peak` for reading and writing and resets the
/// peak on that descriptor (Linux 6.12+): it then reads the peak since.
pub(crate) fn open_peak_window(memory: &Path) -> Result<PeakWindow, SandboxError> {
    let path = memory.join("memory.peak");
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| SandboxError::io("open", &path, e))?;
    f.write_all(b"reset\n")
        .map_err(|e| SandboxError::io("reset the peak (Linux 6.12+) of", &path, e))?;
    Ok(PeakWindow::V2(f))
}

/// The CPU time this thread has used (for the reset's debug line).
fn thread_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_THREAD)
        .map(|u| {
            let t = |tv: nix::sys::time::TimeVal| {
                Duration::new(
                    tv.tv_sec().max(0) as u64,
                    (tv.tv_usec().max(0) as u32) * 1000,
                )
            };
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or_default()
}

fn read_u64(dir: &Path, file: &str) -> Result<u64, String> {
    let path = dir.join(file);
    fs::read_to_string(&path)
        .map_err(|e| format!("read {}: {e}", path.display()))?
        .trim()
        .parse()
        .map_err(|e| format!("read {}: {e}", path.display()))
}

fn read_key(dir: &Path, file: &str, key: &str) -> Result<u64, String> {
    let path = dir.join(file);
    let text = fs::read_to_string(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    detect::keyed_value(&text, key).ok_or_else(|| format!("no {key} in {}", path.display()))
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), String> {
    let path = dir.join(file);
    fs::write(&path, value).map_err(|e| format!("write {}: {e}", path.display()))
}

/// What a reset that found a set clean read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Clean {
    /// The next run's baseline.
    pub base: Baseline,
    /// The memory still charged (under [`LEFT_BOUND`]).
    pub left: u64,
    /// How long it paused for `pids.current` to reach 0 and for the memory
    /// charged to fall under the bound after a reclaim (see [`settle`]).
    pub waited: Duration,
}

/// The pauses between readings of `pids.current` while it is not 0 though
/// no process is listed: 0.05 ms doubling to 0.4 ms, then 1 ms three times
/// and 2 ms, 5.75 ms in all (sleeps, not a busy loop). A
/// process leaves `cgroup.procs` when it exits but stays counted until its
/// parent reaps it: right after a run (the program reaped by its jail's
/// init) a reset can read 1 that would be 0 a moment later. Without the
/// wait the set was replaced (made and removed again, ≈ 1 ms of CPU); a
/// task still counted after the last pause is a process of the run that is
/// not gone, and the set is replaced as before.
const SETTLE_PAUSES_US: [u64; 8] = [50, 100, 200, 400, 1000, 1000, 1000, 2000];

/// The pauses between readings of the memory charged while it stays above
/// [`LEFT_BOUND`] after the reclaim: 1 ms doubling to 64 ms, 127 ms in all
/// (in the slot's clean-up, off any request's path).
/// The kernel frees an exited process's own objects (its task, its stack,
/// its page tables' last pages) after an RCU grace period, so a run that
/// forked many processes leaves them charged for a few dozen ms after the
/// last one is reaped, which no reclaim gives back (measured on this
/// machine's 6.18 kernel: 50 exited children left 0.7–1.4 MiB charged after
/// `force_empty`, none 35–70 ms later; 500 left 4–6 MiB). Without the wait
/// such a set was replaced, and a kept jail of the slot with it.
const MEMORY_PAUSES_US: [u64; 7] = [1000, 2000, 4000, 8000, 16000, 32000, 64000];

/// Reads a figure (`read`) until `done` accepts it, pausing (`pause`, a
/// sleep) between readings as `pauses` (µs) says: how long it paused and
/// the figure accepted, or, once the pauses ran out, what `unsettled` says
/// of the last figure and the time paused.
fn settle(
    mut read: impl FnMut() -> Result<u64, String>,
    done: impl Fn(u64) -> bool,
    pauses: &[u64],
    pause: &mut dyn FnMut(Duration),
    unsettled: impl FnOnce(u64, Duration) -> String,
) -> Result<(Duration, u64), String> {
    let mut waited = Duration::ZERO;
    let mut pauses = pauses.iter().map(|&us| Duration::from_micros(us));
    loop {
        let figure = read()?;
        if done(figure) {
            return Ok((waited, figure));
        }
        match pauses.next() {
            Some(p) => {
                pause(p);
                waited += p;
            }
            None => return Err(unsettled(figure, waited)),
        }
    }
}

/// The reset of a set whose run is over (see the module's text): what it
/// read if it is clean, else why not. `v2` picks the files; `pause` sleeps
/// while `pids.current` and the memory charged settle ([`settle`]).
pub(crate) fn reset(
    v2: bool,
    set: &KeptSet,
    pause: &mut dyn FnMut(Duration),
) -> Result<Clean, String> {
    for d in &set.dirs {
        if !procs(d).is_empty() {
            return Err(format!("a process is still in {}", d.display()));
        }
    }
    let memory = set.dirs.first().ok_or("no memory group")?;
    let pids = if v2 {
        memory
    } else {
        set.dirs.get(1).ok_or("no pids group")?
    };
    let (mut waited, _) = settle(
        || read_u64(pids, "pids.current"),
        |tasks| tasks == 0,
        &SETTLE_PAUSES_US,
        pause,
        |tasks, waited| format!("pids.current is {tasks} after {waited:?}"),
    )?;
    // What a hello leaves charged (≈ 200 KiB: kernel objects such as
    // dentries, which no reclaim frees) is under the bound: a reclaim then
    // gives back next to nothing and costs about 1 ms of CPU (v1
    // `force_empty` retries its reclaim until it gives up), so it runs only
    // above the bound.
    let usage = if v2 {
        "memory.current"
    } else {
        "memory.usage_in_bytes"
    };
    let mut left = read_u64(memory, usage)?;
    if left > LEFT_BOUND {
        if v2 {
            // EAGAIN: less could be reclaimed than asked; what is left is
            // checked below
            let _ = fs::write(memory.join("memory.reclaim"), left.to_string());
        } else {
            write(memory, "memory.force_empty", "0")?;
        }
        // what the reclaim could not give back may still be freed a moment
        // later (`MEMORY_PAUSES_US`)
        let (paused, charged) = settle(
            || read_u64(memory, usage),
            |bytes| bytes <= LEFT_BOUND,
            &MEMORY_PAUSES_US,
            pause,
            |bytes, paused| format!("{usage} is {bytes} after the reclaim and {paused:?}"),
        )?;
        left = charged;
        waited += paused;
    }
    let base = if v2 {
        // the peak is the run's own descriptor's: check it can be had
        open_peak_window(memory).map_err(|e| e.to_string())?;
        let cpu = read_key(memory, "cpu.stat", "usage_usec")?;
        Baseline {
            cpu: Duration::from_micros(cpu),
            oom_kills: read_key(memory, "memory.events", "oom_kill")?,
            throttled: match &set.cpu {
                Some(c) => Duration::from_micros(read_key(c, "cpu.stat", "throttled_usec")?),
                None => Duration::ZERO,
            },
        }
    } else {
        write(memory, "memory.max_usage_in_bytes", "0")?;
        let oom = fs::read_to_string(memory.join("memory.oom_control"))
            .map_err(|e| format!("read memory.oom_control: {e}"))?;
        if detect::keyed_value(&oom, "under_oom") == Some(1) {
            return Err("the memory group is under OOM".to_owned());
        }
        Baseline {
            cpu: match &set.cpu_dir {
                Some(d) => Duration::from_nanos(read_u64(d, "cpuacct.usage")?),
                None => Duration::ZERO,
            },
            oom_kills: detect::keyed_value(&oom, "oom_kill").unwrap_or(0),
            throttled: match &set.cpu {
                Some(c) => Duration::from_nanos(read_key(c, "cpu.stat", "throttled_time")?),
                None => Duration::ZERO,
            },
        }
    };
    Ok(Clean { base, left, waited })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::v1;

    const MIB: u64 = 1024 * 1024;

    /// A reset's pause that does not sleep (the files do not change).
    fn no_pause(_: Duration) {}

    fn put(dir: &Path, file: &str, text: &str) {
        fs::write(dir.join(file), text).expect(file);
    }

    fn get(dir: &Path, file: &str) -> String {
        fs::read_to_string(dir.join(file)).expect(file)
    }

    /// A v1 set after a run, as plain files: memory, pids, cpuacct and cpu
    /// groups, empty, a little memory left charged, a 150 MiB peak, 3 OOM
    /// kills, 1.5 s of CPU and 7 ms throttled so far.
    fn v1_set(root: &Path) -> KeptSet {
        let [mem, pids, acct, cpu] = ["memory", "pids", "cpuacct", "cpu"].map(|h| root.join(h));
        for d in [&mem, &pids, &acct, &cpu] {
            fs::create_dir_all(d).expect("dir");
            put(d, "cgroup.procs", "");
        }
        put(&pids, "pids.current", "0\n");
        put(&mem, "memory.usage_in_bytes", "65536\n");
        put(&mem, "memory.max_usage_in_bytes", "157286400\n");
        put(
            &mem,
            "memory.oom_control",
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        );
        put(&acct, "cpuacct.usage", "1500000000\n");
        put(
            &cpu,
            "cpu.stat",
            "nr_periods 10\nnr_throttled 2\nthrottled_time 7000000\n",
        );
        KeptSet {
            dirs: vec![mem, pids, acct.clone(), cpu.clone()],
            cpu: Some(cpu),
            cpu_dir: Some(acct),
            limits: GroupLimits {
                memory_bytes: MIB,
                pids: 7,
            },
            base: Baseline::default(),
        }
    }

    const V1_BASE: Baseline = Baseline {
        cpu: Duration::from_millis(1500),
        oom_kills: 3,
        throttled: Duration::from_millis(7),
    };

    #[test]
    fn a_clean_v1_set_has_its_peak_restarted_and_its_counters_taken_as_the_baseline() {
        let root = tempfile::tempdir().expect("tempdir");
        let set = v1_set(root.path());
        assert_eq!(
            reset(false, &set, &mut no_pause).map(|c| c.base),
            Ok(V1_BASE)
        );
        let mem = &set.dirs[0];
        assert!(
            !mem.join("memory.force_empty").exists(),
            "64 KiB left: no reclaim"
        );
        assert_eq!(get(mem, "memory.max_usage_in_bytes"), "0", "peak restarted");
    }

    #[test]
    fn a_set_with_a_process_or_a_task_left_is_not_clean() {
        let root = tempfile::tempdir().expect("tempdir");
        let set = v1_set(root.path());
        put(&set.dirs[3], "cgroup.procs", "4242\n");
        let mut paused = Duration::ZERO;
        let e = reset(false, &set, &mut |p| paused += p).expect_err("a process left");
        assert!(e.contains("a process is still in"), "{e}");
        assert_eq!(paused, Duration::ZERO, "a process listed: no wait");
        put(&set.dirs[3], "cgroup.procs", "");
        put(&set.dirs[1], "pids.current", "1\n");
        let e = reset(false, &set, &mut |p| paused += p).expect_err("a task counted");
        assert!(e.contains("pids.current is 1"), "{e}");
        // a task that stays counted is waited for a few ms at most
        assert!(
            paused > Duration::ZERO && paused <= Duration::from_millis(6),
            "{paused:?}"
        );
    }

    #[test]
    fn a_set_whose_exited_task_is_reaped_shortly_after_the_reset_starts_is_clean() {
        let root = tempfile::tempdir().expect("tempdir");
        let set = v1_set(root.path());
        // the run's last process has left cgroup.procs but its parent has
        // not reaped it yet: pids.current still counts it
        put(&set.dirs[1], "pids.current", "1\n");
        let pids = set.dirs[1].clone();
        let mut pauses = 0;
        let clean = reset(false, &set, &mut |_| {
            pauses += 1;
            if pauses == 2 {
                // reaped during the reset's second pause
                put(&pids, "pids.current", "0\n");
            }
        })
        .expect("clean once the task is reaped");
        assert_eq!(clean.base, V1_BASE);
        assert_eq!(pauses, 2);
        assert!(
            clean.waited > Duration::ZERO && clean.waited < Duration::from_millis(1),
            "{:?}",
            clean.waited
        );
        assert_eq!(
            get(&set.dirs[0], "memory.max_usage_in_bytes"),
            "0",
            "peak restarted"
        );
    }

    /// A v1 set ([`v1_set`]) whose `controller` group is a real one on the
    /// host (made here, named after `name`), for a test that needs it, and
    /// the temporary directory of the others: `None` (the test skips)
    /// without root, which fails under CI, or on a cgroup v2 host (no v1
    /// hierarchy to test against).
    fn with_host_v1_group(
        controller: &str,
        name: &str,
    ) -> Option<(tempfile::TempDir, KeptSet, PathBuf)> {
        if !nix::unistd::geteuid().is_root() {
            assert!(std::env::var_os("CI").is_none(), "CI is set: needs root");
            eprintln!("skipped: needs root");
            return None;
        }
        let (host, index) = match controller {
            "memory" => (Path::new("/sys/fs/cgroup/memory"), 0),
            "pids" => (Path::new("/sys/fs/cgroup/pids"), 1),
            other => panic!("no test uses the {other} hierarchy"),
        };
        if !host.join("cgroup.procs").exists() {
            eprintln!("skipped: needs cgroup v1's {controller} hierarchy");
            return None;
        }
        let root = tempfile::tempdir().expect("tempdir");
        let mut set = v1_set(root.path());
        let group = host.join(format!("kiln-test-{name}-{}", std::process::id()));
        fs::create_dir(&group).expect("host group");
        set.dirs[index] = group.clone();
        Some((root, set, group))
    }

    /// On the host's v1 `pids` hierarchy (root): a process that has exited
    /// but is not reaped yet is no longer in `cgroup.procs` and still in
    /// `pids.current`; the reset that reaps it in its first pause (as the
    /// run's parent does a moment later) finds the set clean.
    #[test]
    fn a_real_exited_but_unreaped_process_is_counted_until_reaped_and_then_clean() {
        let Some((_root, set, pids)) = with_host_v1_group("pids", "settle") else {
            return;
        };
        // the shell moves itself into the group and exits; not reaped yet
        let mut child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("echo $$ > {}/cgroup.procs", pids.display()))
            .spawn()
            .expect("spawn sh");
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        // wait until it has exited (a zombie), without reaping it
        use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG;
        let zombie =
            || matches!(waitid(Id::Pid(pid), flags), Ok(WaitStatus::Exited(p, _)) if p == pid);
        let mut tries = 0;
        while !zombie() {
            tries += 1;
            assert!(tries < 2500, "the shell did not exit");
            std::thread::sleep(Duration::from_millis(2));
        }
        let counted = get(&pids, "pids.current");
        let listed = get(&pids, "cgroup.procs");
        let mut reaped = false;
        let done = reset(false, &set, &mut |_| {
            if !reaped {
                child.wait().expect("reap");
                reaped = true;
            }
        });
        let _ = child.wait();
        let _ = fs::remove_dir(&pids);
        assert_eq!(
            (listed.as_str(), counted.trim()),
            ("", "1"),
            "a zombie: not listed, counted"
        );
        let clean = done.expect("clean once reaped");
        assert!(reaped && !clean.waited.is_zero(), "{clean:?}");
    }

    #[test]
    fn a_set_charged_above_the_bound_is_reclaimed_and_not_clean_if_it_stays_above() {
        let root = tempfile::tempdir().expect("tempdir");
        let set = v1_set(root.path());
        let mem = &set.dirs[0];
        put(mem, "memory.usage_in_bytes", &(LEFT_BOUND + 1).to_string());
        let mut paused = Duration::ZERO;
        let e = reset(false, &set, &mut |p| paused += p).expect_err("still charged");
        assert_eq!(get(mem, "memory.force_empty"), "0", "a reclaim was asked");
        assert!(e.contains("memory.usage_in_bytes is"), "{e}");
        // waited for the kernel's lazy frees, a few dozen ms at most
        assert!(
            paused >= Duration::from_millis(100) && paused <= Duration::from_millis(130),
            "{paused:?}"
        );
        put(mem, "memory.usage_in_bytes", &LEFT_BOUND.to_string());
        assert_eq!(
            reset(false, &set, &mut no_pause).map(|c| c.base),
            Ok(V1_BASE),
            "at the bound is clean"
        );
        put(mem, "memory.oom_control", "under_oom 1\noom_kill 3\n");
        let e = reset(false, &set, &mut no_pause).expect_err("under oom");
        assert!(e.contains("under OOM"), "{e}");
    }

    #[test]
    fn a_set_whose_exited_processes_are_freed_shortly_after_the_reclaim_is_clean() {
        let root = tempfile::tempdir().expect("tempdir");
        let set = v1_set(root.path());
        let mem = set.dirs[0].clone();
        // a run that forked many processes: what the reclaim cannot give
        // back (their tasks and stacks, freed after an RCU grace period)
        put(
            &mem,
            "memory.usage_in_bytes",
            &(LEFT_BOUND + MIB).to_string(),
        );
        let mut pauses = Vec::new();
        let clean = reset(false, &set, &mut |p| {
            pauses.push(p);
            if pauses.len() == 3 {
                put(&mem, "memory.usage_in_bytes", "4096\n");
            }
        })
        .expect("clean once the kernel freed them");
        assert_eq!(get(&mem, "memory.force_empty"), "0", "a reclaim was asked");
        assert_eq!(clean.left, 4096);
        assert_eq!(clean.waited, Duration::from_millis(7), "{pauses:?}");
        assert_eq!(clean.base, V1_BASE);
    }

    /// On the host's v1 `memory` hierarchy (root): a group whose process
    /// forked and reaped 500 children is found clean by the reset, though
    /// the reclaim cannot give back their kernel memory at once (4–6 MiB
    /// of it right after, on this machine's 6.18 kernel).
    #[test]
    fn a_real_group_whose_process_forked_many_children_is_clean_after_the_reset() {
        let Some((_root, set, mem)) = with_host_v1_group("memory", "freed") else {
            return;
        };
        let script = format!(
            "echo $$ > {}/cgroup.procs; for i in $(seq 500); do (sleep 0.01) & done; wait",
            mem.display()
        );
        let status = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(&script)
            .status()
            .expect("spawn sh");
        let done = reset(false, &set, &mut std::thread::sleep);
        let _ = fs::remove_dir(&mem);
        assert!(status.success(), "{status}");
        let clean = done.expect("clean");
        assert!(clean.left <= LEFT_BOUND, "{clean:?}");
    }

    #[test]
    fn a_write_or_read_that_fails_makes_the_set_not_clean() {
        let root = tempfile::tempdir().expect("tempdir");
        let set = v1_set(root.path());
        // a directory where the control file should be: the write fails
        put(&set.dirs[0], "memory.usage_in_bytes", "4194304\n");
        fs::create_dir(set.dirs[0].join("memory.force_empty")).expect("dir");
        let e = reset(false, &set, &mut no_pause).expect_err("write fails");
        assert!(
            e.contains("write") && e.contains("memory.force_empty"),
            "{e}"
        );
        let set = v1_set(&root.path().join("b"));
        fs::remove_file(set.dirs[2].join("cpuacct.usage")).expect("rm");
        assert!(
            reset(false, &set, &mut no_pause).is_err(),
            "a counter that cannot be read"
        );
    }

    /// A v2 set after a run: one group, 8 KiB charged, one OOM kill, 2.5 ms
    /// of CPU, 40 µs throttled.
    fn v2_set(root: &Path) -> KeptSet {
        let dir = root.join("run");
        fs::create_dir_all(&dir).expect("dir");
        put(&dir, "cgroup.procs", "");
        put(&dir, "pids.current", "0\n");
        put(&dir, "memory.current", "8192\n");
        put(&dir, "memory.peak", "157286400\n");
        put(
            &dir,
            "memory.events",
            "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n",
        );
        put(
            &dir,
            "cpu.stat",
            "usage_usec 2500\nuser_usec 2000\nthrottled_usec 40\n",
        );
        KeptSet {
            dirs: vec![dir.clone()],
            cpu: Some(dir.clone()),
            cpu_dir: Some(dir),
            limits: GroupLimits {
                memory_bytes: MIB,
                pids: 7,
            },
            base: Baseline::default(),
        }
    }

    #[test]
    fn a_v2_set_is_asked_to_reclaim_only_above_the_bound_and_its_counters_taken() {
        let root = tempfile::tempdir().expect("tempdir");
        let set = v2_set(root.path());
        assert_eq!(
            reset(true, &set, &mut no_pause),
            Ok(Clean {
                base: Baseline {
                    cpu: Duration::from_micros(2500),
                    oom_kills: 1,
                    throttled: Duration::from_micros(40),
                },
                left: 8192,
                waited: Duration::ZERO,
            })
        );
        let dir = &set.dirs[0];
        assert!(
            !dir.join("memory.reclaim").exists(),
            "8 KiB left: no reclaim"
        );
        // the peak window was tried on its own descriptor
        assert!(get(dir, "memory.peak").starts_with("reset\n"));
        put(dir, "memory.current", &(LEFT_BOUND * 2).to_string());
        let e = reset(true, &set, &mut no_pause).expect_err("still charged");
        assert_eq!(get(dir, "memory.reclaim"), (LEFT_BOUND * 2).to_string());
        assert!(e.contains("memory.current is"), "{e}");
    }

    #[test]
    fn a_v2_host_without_a_peak_per_descriptor_keeps_no_set() {
        let root = tempfile::tempdir().expect("tempdir");
        let set = v2_set(root.path());
        // a kernel before 5.19 has no memory.peak; one before 6.12 refuses
        // the write (here: the file is missing altogether)
        fs::remove_file(set.dirs[0].join("memory.peak")).expect("rm");
        let e = reset(true, &set, &mut no_pause).expect_err("no peak window");
        assert!(e.contains("memory.peak"), "{e}");
    }

    #[test]
    fn a_lent_set_reports_the_counters_from_its_baseline_only() {
        let root = tempfile::tempdir().expect("tempdir");
        let set = v1_set(root.path());
        let Clean { base, left, .. } = reset(false, &set, &mut no_pause).expect("clean");
        assert_eq!(left, 65536);
        // the next run: 250 ms of CPU, one OOM kill, 3 ms throttled, 20 MiB peak
        let [mem, _, acct, cpu] = [0, 1, 2, 3].map(|i| set.dirs[i].clone());
        put(&acct, "cpuacct.usage", "1750000000\n");
        put(&mem, "memory.oom_control", "under_oom 0\noom_kill 4\n");
        put(&mem, "memory.max_usage_in_bytes", &(20 * MIB).to_string());
        put(&cpu, "cpu.stat", "throttled_time 10000000\n");
        let mut run = RunCgroups::orphan(false, set.dirs.clone());
        run.cpu = set.cpu.clone();
        run.cpu_dir = set.cpu_dir.clone();
        run.cpu_base = Some(base.cpu);
        run.base = base;
        run.done = true;
        let stats = run.read_stats();
        assert_eq!(stats.cpu, Some(Duration::from_millis(250)));
        assert_eq!(stats.oom_kills, 1);
        assert_eq!(stats.cpu_throttled, Some(Duration::from_millis(3)));
        assert_eq!(stats.memory_peak, Some(20 * MIB));
    }

    #[test]
    fn limits_are_rewritten_only_where_the_runs_differ() {
        let root = tempfile::tempdir().expect("tempdir");
        let set = v1_set(root.path());
        let (mem, pids) = (&set.dirs[0], &set.dirs[1]);
        for (d, f) in [
            (mem, "memory.limit_in_bytes"),
            (mem, "memory.memsw.limit_in_bytes"),
            (pids, "pids.max"),
        ] {
            put(d, f, "untouched");
        }
        let old = set.limits;
        v1::rewrite_limits(&set.dirs, old, old).expect("same limits");
        assert_eq!(get(mem, "memory.limit_in_bytes"), "untouched");
        assert_eq!(get(pids, "pids.max"), "untouched");
        let more_memory = GroupLimits {
            memory_bytes: 2 * MIB,
            ..old
        };
        v1::rewrite_limits(&set.dirs, old, more_memory).expect("more memory");
        assert_eq!(get(mem, "memory.limit_in_bytes"), (2 * MIB).to_string());
        assert_eq!(
            get(mem, "memory.memsw.limit_in_bytes"),
            (2 * MIB).to_string()
        );
        assert_eq!(get(pids, "pids.max"), "untouched");
        let fewer_pids = GroupLimits {
            pids: 3,
            ..more_memory
        };
        v1::rewrite_limits(&set.dirs, more_memory, fewer_pids).expect("fewer pids");
        assert_eq!(get(pids, "pids.max"), "4", "+1: the init");
    }
}
