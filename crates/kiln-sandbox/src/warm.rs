//! [`WarmPool`]: parked jails kept ready per runtime profile, so that
//! namespace creation, mounts, the cgroup attach (≈10 ms after idle on
//! cgroup-v1 hosts), seccomp and — for pre-started or embedded runtimes —
//! interpreter start-up are off the request path.
//!
//! Every jail is used once ([`Sandbox::run_parked`]) and then destroyed. One
//! background task refills the pool, building one jail at a time so that
//! refilling never takes more than one CPU from running executions. How many
//! jails a profile keeps follows demand: it starts at the configured
//! minimum, grows by one each time a request finds the profile empty (up to
//! the per-profile maximum; when all targets together are at the total
//! maximum — each parked jail holds a uid slot — the profile that missed least
//! recently gives one up, down to the minimum), and shrinks by one after each
//! quiet period without such a miss.
//!
//! A miss does not wait for its own build alone: it queues for the next jail
//! of its profile that becomes ready — usually the refill already under way,
//! started by the take before it — and builds one at the same time. Whichever
//! is ready first serves it; the other is parked for the next request (or
//! serves another one waiting), so a miss costs what is left of a build in
//! flight, not a whole one, and no jail is built for nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kiln_core::Limits;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::error::SandboxError;
use crate::sandbox::{ParkSpec, ParkedJail, Sandbox};
use crate::slots::Slot;

/// Pool sizing.
#[derive(Debug, Clone)]
pub struct WarmConfig {
    /// Most parked jails over all profiles (each holds a uid slot, so the
    /// sandbox needs this many slots beyond the execution concurrency).
    pub max_total: u32,
    /// Most parked jails of one profile.
    pub max_per_profile: u32,
    /// Parked jails per profile when there is no demand (0: build only on
    /// demand).
    pub min_per_profile: u32,
    /// A profile's target shrinks by one after this long without a miss.
    pub decay_after: Duration,
    /// Limits jails are built with (a request may only lower wall and CPU
    /// time).
    pub limits: Limits,
}

impl Default for WarmConfig {
    fn default() -> Self {
        WarmConfig {
            max_total: 4,
            max_per_profile: 3,
            min_per_profile: 1,
            decay_after: Duration::from_secs(60),
            limits: Limits::default(),
        }
    }
}

/// A parked jail handed to one execution.
#[derive(Debug)]
pub struct WarmJail {
    pub slot: Slot,
    pub jail: ParkedJail,
    /// `true` when it was ready before the request asked (a hit).
    pub was_ready: bool,
}

/// Counters of one profile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WarmStats {
    pub ready: u32,
    pub target: u32,
    pub hits: u64,
    pub misses: u64,
    pub built: u64,
    pub build_failures: u64,
    /// Misses served by a jail that another build made ready before the
    /// miss's own build was done.
    pub served_early: u64,
}

/// A parked jail with the slot it holds.
type Ready = (Slot, ParkedJail);

#[derive(Debug)]
struct Profile {
    spec: ParkSpec,
    ready: VecDeque<Ready>,
    /// Misses waiting for the next jail that becomes ready (oldest first).
    waiters: VecDeque<oneshot::Sender<Ready>>,
    building: u32,
    target: u32,
    last_change: Instant,
    stats: WarmStats,
    /// Failed builds in a row, and the wait before the next attempt.
    backoff: Backoff,
}

impl Profile {
    /// A profile with nothing parked yet, aiming at the configured minimum.
    fn new(spec: ParkSpec, cfg: &WarmConfig) -> Profile {
        let target = cfg.min_per_profile.min(cfg.max_per_profile);
        Profile {
            spec,
            ready: VecDeque::new(),
            waiters: VecDeque::new(),
            building: 0,
            target,
            last_change: Instant::now(),
            stats: WarmStats {
                target,
                ..WarmStats::default()
            },
            backoff: Backoff::default(),
        }
    }
}

#[derive(Debug)]
struct Inner {
    sandbox: Sandbox,
    cfg: WarmConfig,
    profiles: Mutex<HashMap<String, Profile>>,
    wake: Notify,
    stop: CancellationToken,
}

/// Parked jails per profile, refilled in the background. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WarmPool {
    inner: Arc<Inner>,
}

impl WarmPool {
    /// Starts the refill task (needs a tokio runtime). `profiles` maps a
    /// name (a language, or `exec` for the generic jail) to how its jails
    /// are parked.
    pub fn start(sandbox: Sandbox, cfg: WarmConfig, profiles: Vec<(String, ParkSpec)>) -> WarmPool {
        let map = profiles
            .into_iter()
            .map(|(name, spec)| (name, Profile::new(spec, &cfg)))
            .collect();
        let pool = WarmPool {
            inner: Arc::new(Inner {
                sandbox,
                cfg,
                profiles: Mutex::new(map),
                wake: Notify::new(),
                stop: CancellationToken::new(),
            }),
        };
        let inner = Arc::clone(&pool.inner);
        tokio::spawn(async move { refill_loop(inner).await });
        pool
    }

    /// Adds (or replaces the spec of) a profile, e.g. `py` once the
    /// fork-server is up. Jails already parked for it are kept.
    pub fn add_profile(&self, name: impl Into<String>, spec: ParkSpec) {
        let mut profiles = self.inner.lock();
        match profiles.entry(name.into()) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().spec = spec,
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Profile::new(spec, &self.inner.cfg));
            }
        }
        drop(profiles);
        self.inner.wake.notify_one();
    }

    /// Whether `profile` is one this pool parks jails for.
    pub fn has_profile(&self, profile: &str) -> bool {
        self.inner.lock().contains_key(profile)
    }

    /// A parked jail of `profile`: a ready one, or — on a miss — one built
    /// now (and the profile's target grows).
    pub async fn get(&self, profile: &str) -> Result<WarmJail, SandboxError> {
        let (spec, mut early) = {
            let mut profiles = self.inner.lock();
            let Some(p) = profiles.get_mut(profile) else {
                return Err(SandboxError::Request(format!(
                    "no warm profile {profile:?}"
                )));
            };
            if let Some((slot, jail)) = p.ready.pop_front() {
                p.stats.hits += 1;
                p.stats.ready = p.ready.len() as u32;
                metrics::counter!("kiln_warm_takes_total", "profile" => profile.to_owned(), "result" => "hit")
                    .increment(1);
                metrics::gauge!("kiln_warm_ready", "profile" => profile.to_owned())
                    .set(p.ready.len() as f64);
                drop(profiles);
                self.inner.wake.notify_one();
                return Ok(WarmJail {
                    slot,
                    jail,
                    was_ready: true,
                });
            }
            p.stats.misses += 1;
            p.last_change = Instant::now();
            metrics::counter!("kiln_warm_takes_total", "profile" => profile.to_owned(), "result" => "miss")
                .increment(1);
            let spec = p.spec.clone();
            let (tx, rx) = oneshot::channel();
            p.waiters.retain(|w| !w.is_closed());
            p.waiters.push_back(tx);
            grow_target(&mut profiles, profile, &self.inner.cfg);
            (spec, rx)
        };
        self.inner.wake.notify_one();
        // The miss's own build runs on its own task and delivers to this
        // request; if the request no longer wants it (served early, or
        // gone), the jail goes to the pool instead of being thrown away.
        let (own_tx, mut own) = oneshot::channel::<Result<Ready, SandboxError>>();
        let inner = Arc::clone(&self.inner);
        let name = profile.to_owned();
        tokio::spawn(async move {
            // Not cut short by the pool's shutdown: a miss builds its jail
            // as before (tests drain the pool and still run); one nobody
            // wants after the shutdown is torn down by `arrive`.
            let built = build(&inner, &spec, false).await;
            if let Err(Ok(unwanted)) = own_tx.send(built) {
                inner.arrive(&name, unwanted).await;
            }
        });
        let (slot, jail) = tokio::select! {
            Ok(ready) = &mut early => {
                own.close();
                if let Ok(Ok(unwanted)) = own.try_recv() {
                    self.inner.arrive(profile, unwanted).await;
                }
                self.inner.count_served_early(profile);
                ready
            }
            built = &mut own => {
                early.close();
                if let Ok(unwanted) = early.try_recv() {
                    self.inner.arrive(profile, unwanted).await;
                }
                match built {
                    Ok(r) => r?,
                    Err(_) => return Err(SandboxError::Setup("building a jail: its task ended without a result".to_owned())),
                }
            }
        };
        Ok(WarmJail {
            slot,
            jail,
            was_ready: false,
        })
    }

    /// Counters per profile.
    pub fn stats(&self) -> HashMap<String, WarmStats> {
        self.inner
            .lock()
            .iter()
            .map(|(k, p)| {
                let mut s = p.stats.clone();
                s.ready = p.ready.len() as u32;
                s.target = p.target;
                (k.clone(), s)
            })
            .collect()
    }

    /// Stops refilling and tears down every parked jail and every kept
    /// one-shot jail. Call before
    /// [`Sandbox::shutdown`].
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        let parked: Vec<_> = {
            let mut profiles = self.inner.lock();
            profiles
                .values_mut()
                .flat_map(|p| p.ready.drain(..).collect::<Vec<_>>())
                .collect()
        };
        for (slot, jail) in parked {
            self.inner.sandbox.discard(jail).await;
            drop(slot);
        }
        // kept one-shot jails are warm jails too
        self.inner.sandbox.end_kept_jails();
    }

    /// Waits until every profile holds its target (or `limit` passes);
    /// `true` when reached. For start-up and tests.
    pub async fn wait_filled(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            let filled = self.inner.lock().values().all(|p| {
                p.ready.len() as u32 >= p.target.min(self.inner.cfg.max_total)
                    || p.backoff.failing()
            });
            if filled {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Profile {
    /// Hands `ready` to the oldest miss still waiting; gives it back when
    /// none is.
    fn serve_waiter(&mut self, mut ready: Ready) -> Option<Ready> {
        while let Some(tx) = self.waiters.pop_front() {
            match tx.send(ready) {
                Ok(()) => return None,
                Err(back) => ready = back,
            }
        }
        Some(ready)
    }
}

impl Inner {
    /// A jail a miss built but did not need: it serves another miss or
    /// joins the ready ones (a surplus is trimmed by the refill loop); after
    /// shutdown it is torn down.
    async fn arrive(&self, name: &str, ready: Ready) {
        let left = {
            // Checked under the lock: shutdown cancels before it drains.
            let mut profiles = self.lock();
            match profiles.get_mut(name) {
                Some(_) if self.stop.is_cancelled() => Some(ready),
                Some(p) => p.serve_waiter(ready).and_then(|r| {
                    p.ready.push_back(r);
                    metrics::gauge!("kiln_warm_ready", "profile" => name.to_owned())
                        .set(p.ready.len() as f64);
                    None
                }),
                None => Some(ready),
            }
        };
        if let Some((slot, jail)) = left {
            self.sandbox.discard(jail).await;
            drop(slot);
        }
        self.wake.notify_one();
    }

    fn count_served_early(&self, name: &str) {
        if let Some(p) = self.lock().get_mut(name) {
            p.stats.served_early += 1;
        }
        metrics::counter!("kiln_warm_misses_served_early_total", "profile" => name.to_owned())
            .increment(1);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Profile>> {
        // Every update keeps the map consistent; a poisoned lock is usable.
        self.profiles.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies decay, drops surplus jails, and picks the profile that most
    /// lacks a jail (marking one build as started).
    fn next_build(&self) -> (Option<(String, ParkSpec)>, Vec<Ready>) {
        let now = Instant::now();
        let mut profiles = self.lock();
        let mut surplus = Vec::new();
        for p in profiles.values_mut() {
            if p.target > self.cfg.min_per_profile
                && now.duration_since(p.last_change) >= self.cfg.decay_after
            {
                p.target -= 1;
                p.stats.target = p.target;
                p.last_change = now;
            }
            while p.ready.len() as u32 > p.target {
                if let Some(j) = p.ready.pop_back() {
                    surplus.push(j);
                }
            }
        }
        let total: u32 = profiles
            .values()
            .map(|p| p.ready.len() as u32 + p.building)
            .sum();
        if total >= self.cfg.max_total {
            return (None, surplus);
        }
        let pick = profiles
            .iter_mut()
            .filter(|(_, p)| p.backoff.allows(now))
            .filter(|(_, p)| (p.ready.len() as u32 + p.building) < p.target)
            .max_by_key(|(_, p)| p.target - (p.ready.len() as u32 + p.building))
            .map(|(name, p)| {
                p.building += 1;
                (name.clone(), p.spec.clone())
            });
        (pick, surplus)
    }

    fn built(&self, name: &str, result: Result<(Slot, ParkedJail), SandboxError>) {
        let mut profiles = self.lock();
        let Some(p) = profiles.get_mut(name) else {
            return;
        };
        p.building = p.building.saturating_sub(1);
        match result {
            Ok((slot, jail)) => {
                metrics::histogram!("kiln_warm_build_seconds", "profile" => name.to_owned())
                    .record(jail.build_time().as_secs_f64());
                p.stats.built += 1;
                p.backoff.succeeded();
                if let Some(ready) = p.serve_waiter((slot, jail)) {
                    p.ready.push_back(ready);
                }
                metrics::gauge!("kiln_warm_ready", "profile" => name.to_owned())
                    .set(p.ready.len() as f64);
            }
            Err(e) => {
                p.stats.build_failures += 1;
                let wait = p.backoff.failed(Instant::now());
                tracing::warn!(profile = name, error = %e, retry_in = ?wait, "building a warm jail failed");
            }
        }
    }
}

/// A miss in `name` raises its target by one, up to the per-profile
/// maximum. Targets together never exceed the total maximum: when they are
/// there already, the profile that missed least recently gives one up if it
/// has more than the minimum (the refill loop then discards its surplus
/// jail); if none can, the target stays. Without this, a profile that was
/// busy earlier would keep every jail until its target decayed, and a
/// profile in demand now would find the pool full and miss every time.
fn grow_target(profiles: &mut HashMap<String, Profile>, name: &str, cfg: &WarmConfig) {
    let Some(target) = profiles.get(name).map(|p| p.target) else {
        return;
    };
    if target >= cfg.max_per_profile {
        return;
    }
    let total: u32 = profiles.values().map(|p| p.target).sum();
    if total >= cfg.max_total {
        let donor = profiles
            .iter_mut()
            .filter(|(n, q)| n.as_str() != name && q.target > cfg.min_per_profile)
            .min_by_key(|(_, q)| q.last_change);
        let Some((_, d)) = donor else {
            return;
        };
        d.target -= 1;
        d.stats.target = d.target;
    }
    if let Some(p) = profiles.get_mut(name) {
        p.target += 1;
        p.stats.target = p.target;
    }
}

async fn refill_loop(inner: Arc<Inner>) {
    loop {
        let (pick, surplus) = inner.next_build();
        for (slot, jail) in surplus {
            inner.sandbox.discard(jail).await;
            drop(slot);
        }
        match pick {
            Some((name, spec)) => {
                let result = tokio::select! {
                    r = build(&inner, &spec, true) => r,
                    () = inner.stop.cancelled() => return,
                };
                inner.built(&name, result);
            }
            None => {
                tokio::select! {
                    () = inner.wake.notified() => {}
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = inner.stop.cancelled() => return,
                }
            }
        }
        if inner.stop.is_cancelled() {
            return;
        }
    }
}

/// A parked jail of `spec`: built `ahead` of any request (the refill, at
/// idle CPU priority) or for a request that found none (at its priority).
async fn build(
    inner: &Inner,
    spec: &ParkSpec,
    ahead: bool,
) -> Result<(Slot, ParkedJail), SandboxError> {
    let slot = inner.sandbox.acquire_slot_for(spec).await;
    let limits = &inner.cfg.limits;
    let jail = if ahead {
        inner.sandbox.park_ahead(&slot, spec, limits).await?
    } else {
        inner.sandbox.park(&slot, spec, limits, None).await?
    };
    Ok((slot, jail))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool_of(names: &[&str], cfg: &WarmConfig) -> HashMap<String, Profile> {
        names
            .iter()
            .map(|n| ((*n).to_owned(), Profile::new(ParkSpec::exec(), cfg)))
            .collect()
    }

    fn targets(p: &HashMap<String, Profile>) -> Vec<(String, u32)> {
        let mut v: Vec<_> = p.iter().map(|(n, q)| (n.clone(), q.target)).collect();
        v.sort();
        v
    }

    fn miss(p: &mut HashMap<String, Profile>, name: &str, cfg: &WarmConfig) {
        p.get_mut(name).expect("profile").last_change = Instant::now();
        grow_target(p, name, cfg);
    }

    #[test]
    fn a_miss_grows_the_target_up_to_the_per_profile_maximum() {
        let cfg = WarmConfig {
            max_total: 10,
            ..WarmConfig::default()
        };
        let mut p = pool_of(&["py"], &cfg);
        for _ in 0..5 {
            miss(&mut p, "py", &cfg);
        }
        assert_eq!(targets(&p), vec![("py".into(), 3)]);
    }

    #[test]
    fn a_profile_in_demand_takes_jails_from_the_one_that_missed_least_recently() {
        let cfg = WarmConfig::default(); // 4 in all, 3 per profile, 1 each at least
        let mut p = pool_of(&["exec", "js", "py"], &cfg);
        miss(&mut p, "py", &cfg);
        miss(&mut p, "py", &cfg); // the total is full: py stays at 2
        assert_eq!(
            targets(&p),
            vec![("exec".into(), 1), ("js".into(), 1), ("py".into(), 2)]
        );
        std::thread::sleep(Duration::from_millis(2));
        miss(&mut p, "js", &cfg); // py gives one up, but not below its minimum
        miss(&mut p, "js", &cfg);
        assert_eq!(
            targets(&p),
            vec![("exec".into(), 1), ("js".into(), 2), ("py".into(), 1)]
        );
        let total: u32 = p.values().map(|q| q.target).sum();
        assert!(total <= cfg.max_total);
    }
}
