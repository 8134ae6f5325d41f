//! The pool of uid slots. Slot `i` owns the host id range
//! `uid_base + i*65536 .. +65536`; the jailed user (inside uid 1000) is
//! `uid_base + i*65536 + 1000` on the host.
//!
//! A slot index is reused only when its [`Slot`] was dropped *and* every run
//! started with it has been torn down (its processes dead, its cgroups gone),
//! so two jails never share a uid even when a run's future is dropped while
//! the jail is still dying. Each slot also owns a workspace area (its own
//! filesystem where the quota is enforced, see `quota.rs`); the area is
//! emptied before the index is handed out again, so every job starts with an
//! empty area and the whole quota.
//!
//! The last `on_demand` indices are kept for live kernels
//! ([`SlotPool::acquire_on_demand`]) and have a free count of their own: their
//! filesystem is removed when one is released (rather than emptied), so
//! idle kernel slots cost no mount. A few of them ([`READY_KERNEL_SLOTS`])
//! are kept mounted and empty ahead of use, refilled in the background after
//! every take, so a kernel's create does not wait for its filesystem; a
//! take that finds none ready mounts one itself.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Semaphore;

use crate::cgroup::{CgroupDriver, SlotGroups};
use crate::quota::SlotFs;
use crate::slotnet::SlotNets;
use crate::spec::{ID_RANGE, JAIL_UID, SlotNetnsSpec};

/// Free kernel slots kept mounted ahead of use (fewer when there are fewer
/// kernel slots).
pub const READY_KERNEL_SLOTS: usize = 4;

#[derive(Debug, Default, Clone, Copy)]
struct SlotState {
    held: bool,
    /// Runs started with this slot whose teardown is not finished.
    live_runs: u32,
    /// The slot's workspace area is being emptied.
    cleaning: bool,
    /// A kernel slot's filesystem is being made ahead of use.
    mounting: bool,
    /// A free kernel slot whose filesystem is made, empty and unused.
    ready: bool,
}

impl SlotState {
    fn is_free(&self) -> bool {
        !self.held && self.live_runs == 0 && !self.cleaning && !self.mounting
    }
}

#[derive(Debug)]
pub(crate) struct SlotPool {
    uid_base: u32,
    states: Mutex<Vec<SlotState>>,
    /// Indices below this are mounted for good; the rest on demand.
    fixed: usize,
    /// One permit per free index below `fixed`.
    free: Semaphore,
    /// One permit per free on-demand index.
    free_on_demand: Semaphore,
    areas: Arc<SlotFs>,
    /// The fixed slots' network namespaces (`slotnet.rs`); `None`: every
    /// jail makes its own.
    nets: Option<SlotNets>,
    /// The fixed slots' kept cgroups (`cgroup/slot.rs`); `None` without
    /// cgroups.
    groups: Option<Arc<SlotGroups>>,
}

impl SlotPool {
    pub(crate) fn new(
        uid_base: u32,
        slots: u32,
        on_demand: u32,
        areas: Arc<SlotFs>,
        reuse_netns: bool,
        cgroups: Option<Arc<CgroupDriver>>,
    ) -> Arc<SlotPool> {
        let n = slots as usize;
        let fixed = n - (on_demand as usize).min(n);
        Arc::new(SlotPool {
            uid_base,
            states: Mutex::new(vec![SlotState::default(); n]),
            fixed,
            free: Semaphore::new(fixed),
            free_on_demand: Semaphore::new(n - fixed),
            areas,
            nets: reuse_netns.then(|| SlotNets::new(fixed)),
            groups: cgroups.map(|d| SlotGroups::new(d, fixed, uid_base)),
        })
    }

    /// The fixed slots' kept cgroups, where runs get cgroups.
    pub(crate) fn cgroups(&self) -> Option<&Arc<SlotGroups>> {
        self.groups.as_ref()
    }

    /// Removes the slots' kept cgroups (those lent go when their run
    /// ends). On shutdown.
    pub(crate) fn remove_cgroups(&self) {
        if let Some(g) = &self.groups {
            g.remove_all();
        }
    }

    fn states(&self) -> MutexGuard<'_, Vec<SlotState>> {
        // A panic while holding this lock leaves the vector consistent (every
        // update is a single field write), so a poisoned lock is still usable.
        self.states.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `index` is one kept for live kernels.
    pub(crate) fn is_on_demand(&self, index: u32) -> bool {
        index as usize >= self.fixed
    }

    pub(crate) async fn acquire(self: &Arc<Self>) -> Slot {
        self.acquire_ranked(|| |_| 0).await
    }

    /// [`SlotPool::acquire`], taking the free index of the lowest rank (the
    /// lowest index among equals). `ranks` is asked once a permit is held,
    /// so what it ranks by is as of the take, not of the wait before it.
    pub(crate) async fn acquire_ranked<R: Fn(u32) -> u8>(
        self: &Arc<Self>,
        ranks: impl FnOnce() -> R,
    ) -> Slot {
        self.take_free(&self.free, 0..self.fixed, ranks).await.0
    }

    /// Takes a free on-demand index, one whose filesystem is ready if any
    /// (else it is mounted now), and has another made ready in the
    /// background (any free index when there are no on-demand ones).
    /// Dropping the slot unmounts it again.
    pub(crate) async fn acquire_on_demand(self: &Arc<Self>) -> Result<Slot, String> {
        let n = self.states().len();
        if self.fixed == n {
            return Ok(self.acquire().await);
        }
        let (slot, ready) = self
            .take_free(&self.free_on_demand, self.fixed..n, || |_| 0)
            .await;
        self.refill_in_background();
        if ready {
            return Ok(slot);
        }
        let pool = Arc::clone(self);
        // The slot moves into the blocking task: if this future is dropped
        // the mount still completes, and the slot's drop then unmounts it.
        let (slot, mounted) = tokio::task::spawn_blocking(move || {
            let mounted = pool.areas.take(slot.index);
            (slot, mounted)
        })
        .await
        .map_err(|e| format!("mounting a kernel slot: {e}"))?;
        mounted.map(|()| slot)
    }

    /// Takes a free index of `range`: of the lowest rank `ranks` gives,
    /// a ready one first among those; whether it was.
    async fn take_free<R: Fn(u32) -> u8>(
        self: &Arc<Self>,
        free: &Semaphore,
        range: Range<usize>,
        ranks: impl FnOnce() -> R,
    ) -> (Slot, bool) {
        // The semaphore is never closed, so acquire cannot fail.
        if let Ok(permit) = free.acquire().await {
            permit.forget();
        }
        let rank = ranks();
        let mut states = self.states();
        // (`min_by_key` keeps the first of equals: the lowest index)
        let index = range
            .filter(|&i| states[i].is_free())
            .min_by_key(|&i| (rank(i as u32), !states[i].ready))
            .unwrap_or_else(|| unreachable!("a permit was taken, so an index is free"));
        let ready = std::mem::take(&mut states[index].ready);
        states[index].held = true;
        let slot = Slot {
            pool: Arc::clone(self),
            index: index as u32,
        };
        (slot, ready)
    }

    /// Makes free kernel slots ready until [`READY_KERNEL_SLOTS`] are (or
    /// are being made), one at a time; a slot being made ready is not free.
    /// Blocks while it mounts.
    pub(crate) fn refill(self: &Arc<Self>) {
        loop {
            // a free index leaves the free count while it is made ready
            let Ok(permit) = self.free_on_demand.try_acquire() else {
                return;
            };
            let index = {
                let mut states = self.states();
                let kernel = &states[self.fixed..];
                let ahead = kernel
                    .iter()
                    .filter(|s| s.mounting || (s.ready && s.is_free()))
                    .count();
                let target = READY_KERNEL_SLOTS.min(kernel.len());
                let found =
                    (self.fixed..states.len()).find(|&i| states[i].is_free() && !states[i].ready);
                match found {
                    Some(i) if ahead < target => {
                        states[i].mounting = true;
                        i
                    }
                    _ => return,
                }
            };
            permit.forget();
            let made = self.areas.take(index as u32);
            if let Some(s) = self.states().get_mut(index) {
                s.mounting = false;
                s.ready = made.is_ok();
            }
            self.free_on_demand.add_permits(1);
            if let Err(e) = made {
                tracing::warn!(slot = index, error = %e, "a kernel slot could not be made ready");
                return;
            }
        }
    }

    fn refill_in_background(self: &Arc<Self>) {
        let pool = Arc::clone(self);
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(move || pool.refill());
            }
            Err(_) => pool.refill(),
        }
    }

    fn update(self: &Arc<Self>, index: u32, f: impl FnOnce(&mut SlotState)) {
        let released = {
            let mut states = self.states();
            let Some(state) = states.get_mut(index as usize) else {
                return;
            };
            let was_free = state.is_free();
            f(state);
            let released = !was_free && state.is_free();
            if released {
                state.cleaning = true;
            }
            released
        };
        if released {
            self.empty_then_free(index);
        }
    }

    /// Empties the slot's workspace area (unmounts it, for an on-demand
    /// index) off the async runtime, then hands the index out again. An
    /// area that cannot be emptied keeps its slot out of use: the next job
    /// must never see another job's files.
    fn empty_then_free(self: &Arc<Self>, index: u32) {
        let pool = Arc::clone(self);
        let on_demand = index as usize >= self.fixed;
        let work = move || match if on_demand {
            pool.areas.give_back(index)
        } else {
            pool.areas.empty(index)
        } {
            Ok(()) => {
                // every process of the slot's jails is gone: its network
                // namespace is checked (or made) before the next job's
                if let Some(nets) = pool.nets.as_ref().filter(|_| !on_demand) {
                    nets.recycle(index);
                }
                // and its cgroups reset (the workspace's files and their page
                // cache are gone) or made
                if let Some(groups) = pool.groups.as_ref().filter(|_| !on_demand) {
                    groups.recycle(index);
                }
                if let Some(s) = pool.states().get_mut(index as usize) {
                    s.cleaning = false;
                }
                if on_demand {
                    pool.free_on_demand.add_permits(1);
                } else {
                    pool.free.add_permits(1);
                }
            }
            Err(e) => tracing::error!(
                slot = index,
                error = %e,
                "cannot empty the slot's workspace area; the slot stays out of use"
            ),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(work);
            }
            Err(_) => work(),
        }
    }

    fn base_of(&self, index: u32) -> u32 {
        self.uid_base + index * ID_RANGE
    }
}

/// An exclusive uid range for the lifetime of one execution (compile + run).
/// Returns its index to the pool on drop.
#[derive(Debug)]
pub struct Slot {
    pool: Arc<SlotPool>,
    index: u32,
}

impl Slot {
    pub fn index(&self) -> u32 {
        self.index
    }

    /// First host uid of the range (in-jail uid 0).
    pub fn id_base(&self) -> u32 {
        self.pool.base_of(self.index)
    }

    /// Host uid of the in-jail user 1000: owner of the workspace.
    pub fn host_uid(&self) -> u32 {
        self.id_base() + JAIL_UID
    }

    /// Host gid of the in-jail group 1000.
    pub fn host_gid(&self) -> u32 {
        self.id_base() + JAIL_UID
    }

    /// The directory to create this job's workspace in (a directory directly
    /// below it is what [`crate::RunRequest::workspace`] must be): the
    /// slot's own filesystem, where the workspace quota applies. It is empty
    /// when the slot is acquired and emptied again after the slot is dropped.
    pub fn workspace_parent(&self) -> PathBuf {
        self.pool.areas.parent(self.index)
    }

    /// The slot's network namespace, for a jail with no network at all;
    /// `None`: the jail makes its own (see `slotnet.rs`).
    pub(crate) fn netns(&self) -> Option<SlotNetnsSpec> {
        self.pool.nets.as_ref()?.spec(self.index)
    }

    /// Marks a run as started; the index stays reserved until the lease drops.
    pub(crate) fn lease(&self) -> SlotLease {
        self.pool.update(self.index, |s| s.live_runs += 1);
        SlotLease {
            pool: Arc::clone(&self.pool),
            index: self.index,
        }
    }

    /// Whether this slot came from `pool`.
    pub(crate) fn belongs_to(&self, pool: &Arc<SlotPool>) -> bool {
        Arc::ptr_eq(&self.pool, pool)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.pool.update(self.index, |s| s.held = false);
    }
}

/// Keeps a slot index reserved while a run's teardown is in progress.
#[derive(Debug)]
pub(crate) struct SlotLease {
    pool: Arc<SlotPool>,
    index: u32,
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        self.pool
            .update(self.index, |s| s.live_runs = s.live_runs.saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn pool(slots: u32) -> (tempfile::TempDir, Arc<SlotPool>) {
        with_on_demand(slots, 0)
    }

    fn with_on_demand(slots: u32, on_demand: u32) -> (tempfile::TempDir, Arc<SlotPool>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let areas = SlotFs::plain(dir.path(), slots);
        (
            dir,
            SlotPool::new(200_000, slots, on_demand, areas, false, None),
        )
    }

    #[tokio::test]
    async fn a_take_gets_the_free_slot_of_the_lowest_rank() {
        let (_dir, pool) = pool(4);
        let held = pool.acquire().await;
        assert_eq!(held.index(), 0);
        // free: 1, 2, 3; ranked 2, 1, 1: the lowest index of rank 1
        let ranked = |i: u32| if i == 1 { 2 } else { 1 };
        let got = pool.acquire_ranked(|| ranked).await;
        assert_eq!(got.index(), 2);
        // free: 1, 3: rank 1 again, though 1 is lower
        let got = pool.acquire_ranked(|| ranked).await;
        assert_eq!(got.index(), 3);
        // only 1 is left: a higher rank is still taken, not waited out
        let got = tokio::time::timeout(Duration::from_secs(5), pool.acquire_ranked(|| ranked))
            .await
            .expect("the one free slot");
        assert_eq!(got.index(), 1);
        drop(held);
    }

    #[tokio::test]
    async fn on_demand_slots_are_kept_apart_from_the_others() {
        let (_dir, pool) = with_on_demand(3, 2);
        let run = pool.acquire().await;
        assert_eq!(run.index(), 0);
        let waiting = tokio::time::timeout(Duration::from_millis(50), pool.acquire()).await;
        assert!(waiting.is_err(), "runs must not take kernel slots");
        let k1 = pool.acquire_on_demand().await.expect("kernel slot");
        let k2 = pool.acquire_on_demand().await.expect("kernel slot");
        let mut got = [k1.index(), k2.index()];
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
        let waiting =
            tokio::time::timeout(Duration::from_millis(50), pool.acquire_on_demand()).await;
        assert!(waiting.is_err(), "kernels must not take run slots");
        let area = k1.workspace_parent();
        std::fs::write(area.join("left"), "x").expect("write");
        let index = k1.index();
        drop(k1);
        let again = tokio::time::timeout(Duration::from_secs(5), pool.acquire_on_demand())
            .await
            .expect("kernel slot freed")
            .expect("kernel slot");
        assert_eq!(again.index(), index);
        assert_eq!(std::fs::read_dir(&area).expect("read").count(), 0);
    }

    fn ready_count(pool: &Arc<SlotPool>) -> usize {
        pool.states()
            .iter()
            .filter(|s| s.ready && s.is_free())
            .count()
    }

    #[tokio::test]
    async fn kernel_slots_are_made_ready_ahead_and_taken_first() {
        let (_dir, pool) = with_on_demand(7, 6);
        pool.refill();
        assert_eq!(ready_count(&pool), READY_KERNEL_SLOTS);
        // a run never takes a kernel slot, ready or not
        let run = pool.acquire().await;
        assert_eq!(run.index(), 0);
        let (k, was_ready) = pool.take_free(&pool.free_on_demand, 1..7, || |_| 0).await;
        assert!(was_ready, "a ready kernel slot is taken first");
        assert_eq!(ready_count(&pool), READY_KERNEL_SLOTS - 1);
        pool.refill();
        assert_eq!(ready_count(&pool), READY_KERNEL_SLOTS);
        // every kernel slot can still be taken, ready or not, and no more
        let mut held = vec![k];
        for _ in 1..6 {
            let slot = tokio::time::timeout(Duration::from_secs(5), pool.acquire_on_demand())
                .await
                .expect("a free kernel slot")
                .expect("kernel slot");
            held.push(slot);
        }
        let mut got: Vec<u32> = held.iter().map(Slot::index).collect();
        got.sort_unstable();
        assert_eq!(got, [1, 2, 3, 4, 5, 6]);
        let waiting =
            tokio::time::timeout(Duration::from_millis(50), pool.acquire_on_demand()).await;
        assert!(waiting.is_err(), "all kernel slots are held");
        assert_eq!(ready_count(&pool), 0);
        drop(held);
        let refilled = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                pool.refill();
                if ready_count(&pool) == READY_KERNEL_SLOTS {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(
            refilled.is_ok(),
            "released kernel slots are made ready again"
        );
    }

    #[tokio::test]
    async fn fewer_kernel_slots_than_the_ready_count_are_all_made_ready() {
        let (_dir, pool) = with_on_demand(3, 2);
        pool.refill();
        assert_eq!(ready_count(&pool), 2);
        let a = pool.acquire_on_demand().await.expect("kernel slot");
        let b = pool.acquire_on_demand().await.expect("kernel slot");
        assert_ne!(a.index(), b.index());
        assert!(a.index() >= 1 && b.index() >= 1);
    }

    #[tokio::test]
    async fn slots_map_to_disjoint_id_ranges() {
        let (_dir, pool) = pool(2);
        let a = pool.acquire().await;
        let b = pool.acquire().await;
        assert_ne!(a.index(), b.index());
        let (lo, hi) = if a.index() < b.index() {
            (&a, &b)
        } else {
            (&b, &a)
        };
        assert_eq!(lo.id_base(), 200_000);
        assert_eq!(lo.host_uid(), 201_000);
        assert_eq!(hi.id_base(), 200_000 + 65_536);
        assert_eq!(hi.host_gid(), 200_000 + 65_536 + 1000);
    }

    #[tokio::test]
    async fn acquire_waits_until_a_slot_is_dropped() {
        let (_dir, pool) = pool(1);
        let a = pool.acquire().await;
        let waiting = tokio::time::timeout(Duration::from_millis(50), pool.acquire()).await;
        assert!(waiting.is_err(), "second acquire must wait");
        let index = a.index();
        drop(a);
        let b = tokio::time::timeout(Duration::from_secs(1), pool.acquire())
            .await
            .expect("slot freed");
        assert_eq!(b.index(), index);
    }

    #[tokio::test]
    async fn a_live_lease_keeps_the_index_reserved_after_the_slot_drops() {
        let (_dir, pool) = pool(1);
        let a = pool.acquire().await;
        let lease = a.lease();
        drop(a);
        let waiting = tokio::time::timeout(Duration::from_millis(50), pool.acquire()).await;
        assert!(
            waiting.is_err(),
            "index must stay reserved while a run tears down"
        );
        drop(lease);
        tokio::time::timeout(Duration::from_secs(1), pool.acquire())
            .await
            .expect("slot freed after the lease");
    }

    #[tokio::test]
    async fn a_reacquired_slot_finds_its_workspace_area_empty() {
        let (_dir, pool) = pool(1);
        let a = pool.acquire().await;
        let area = a.workspace_parent();
        std::fs::create_dir(area.join("job1")).expect("mkdir");
        std::fs::write(area.join("job1/secret"), "x").expect("write");
        drop(a);
        let b = tokio::time::timeout(Duration::from_secs(5), pool.acquire())
            .await
            .expect("slot freed");
        assert_eq!(b.workspace_parent(), area);
        assert_eq!(std::fs::read_dir(&area).expect("read").count(), 0);
    }
}
