//! Kernels started ahead (issue 28): [`ParkedHost`] wraps a
//! [`KernelHost`] and keeps a few kernels of each session language started
//! and ready (the jail built, the kernel forked from its template, its
//! `ready` frame read), each under a fresh kernel slot of its own that no
//! session has used. A create whose language, template, limits and life
//! match takes one, so what is left of it is the registry and the
//! hand-over; any other create, or one that finds none, starts its kernel
//! as before — it never waits for a refill.
//!
//! - One background task refills, one kernel at a time (as the warm pool
//!   builds one-shot jails), woken by every take. Each is started at idle
//!   CPU priority ([`KernelHost::start_ahead`]) and waits at it until a
//!   create takes it ([`HostedKernel::taken`]): back-to-back creates that
//!   outrun the pool start their own kernels at normal priority beside it.
//! - Nothing in a parked kernel depends on a create: the language's kernel
//!   program, its environment, the registry's limits, an empty workspace.
//!   A kernel parked for a template that is no longer the one a create
//!   would fork (the data template came up after the lean one) is closed
//!   and replaced; so is one parked longer than [`PARKED_AT_MOST`] (its own
//!   life clock covers that much beyond the session's maximum age) or one
//!   that died while parked.
//! - Parked kernels hold kernel slots beyond `max_sessions` and take no
//!   place under the registry's caps, so they never take a user's room;
//!   the binary counts them against the memory `max_sessions` may take.
//! - [`KernelHost::shutdown`] stops the refill and closes every parked
//!   kernel, giving back its slot; they are processes of the server, so
//!   none survives a restart.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kiln_core::{Language, Limits};
use kiln_sandbox::{Backoff, BoxFuture};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::kernel_host::{HostedKernel, KernelHost, KernelsError};

/// Longest a kernel stays parked before it is replaced.
pub const PARKED_AT_MOST: Duration = Duration::from_secs(15 * 60);

/// How many kernels to keep started ahead, and for which kernels.
#[derive(Debug, Clone)]
pub struct ParkedConfig {
    /// Kernels kept ready per session language.
    pub per_language: usize,
    /// The languages to park kernels of, in order of refill.
    pub languages: Vec<Language>,
    /// The registry's kernel limits and maximum age: a create asking for
    /// others starts its own kernel.
    pub limits: Limits,
    pub max_age: Duration,
}

/// Counters of one language's parked kernels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParkedStats {
    pub ready: usize,
    pub hits: u64,
    pub misses: u64,
    pub built: u64,
    pub retired: u64,
    pub build_failures: u64,
}

/// One kernel started ahead.
struct Parked {
    language: Language,
    /// The template it forked (the host's [`KernelHost::template`] then).
    template: String,
    kernel: Box<dyn HostedKernel>,
    since: Instant,
}

#[derive(Default)]
struct State {
    parked: Vec<Parked>,
    stats: Vec<(Language, ParkedStats)>,
    /// Failed starts in a row per language, and the wait before the next.
    backoff: Vec<(Language, Backoff)>,
}

/// `language`'s value in a short per-language list, added as the default
/// on first use.
fn entry<T: Default>(list: &mut Vec<(Language, T)>, language: Language) -> &mut T {
    let i = match list.iter().position(|(l, _)| *l == language) {
        Some(i) => i,
        None => {
            list.push((language, T::default()));
            list.len() - 1
        }
    };
    &mut list[i].1
}

impl State {
    fn stats_of(&mut self, language: Language) -> &mut ParkedStats {
        entry(&mut self.stats, language)
    }

    /// Records a failed start of `language`: no other attempt for it
    /// before the wait [`Backoff`] returns.
    fn failed(&mut self, language: Language) -> Duration {
        self.stats_of(language).build_failures += 1;
        self.backoff_of(language).failed(Instant::now())
    }

    fn backoff_of(&mut self, language: Language) -> &mut Backoff {
        entry(&mut self.backoff, language)
    }

    fn count(&self, language: Language) -> usize {
        self.parked
            .iter()
            .filter(|p| p.language == language)
            .count()
    }

    fn publish(&self, language: Language) {
        metrics::gauge!("kiln_kernel_pool_ready", "lang" => language.name())
            .set(self.count(language) as f64);
    }
}

struct Inner {
    host: Arc<dyn KernelHost>,
    cfg: ParkedConfig,
    state: Mutex<State>,
    wake: Notify,
    stop: CancellationToken,
    refill: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // every update leaves the state consistent; a poisoned lock is usable
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A [`KernelHost`] that hands out kernels started ahead. Needs a tokio
/// runtime (its refill task).
pub struct ParkedHost {
    inner: Arc<Inner>,
}

/// Whether parked kernel `p` is what a create of `language` forking
/// `template` would start now, `now`.
fn fits(p: &Parked, language: Language, template: &str, now: Instant) -> bool {
    p.language == language
        && p.template == template
        && now.duration_since(p.since) < PARKED_AT_MOST
        && p.kernel.lost().is_none()
}

impl ParkedHost {
    /// Wraps `host` and starts the refill task.
    pub fn start(host: Arc<dyn KernelHost>, cfg: ParkedConfig) -> Arc<ParkedHost> {
        let inner = Arc::new(Inner {
            host,
            cfg,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            stop: CancellationToken::new(),
            refill: Mutex::new(None),
        });
        let task = tokio::spawn(refill_loop(Arc::clone(&inner)));
        *inner.refill.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        Arc::new(ParkedHost { inner })
    }

    /// Counters per language (those asked for or parked so far).
    pub fn stats(&self) -> Vec<(Language, ParkedStats)> {
        let state = self.inner.state();
        let mut out = state.stats.clone();
        for (l, s) in &mut out {
            s.ready = state.count(*l);
        }
        out
    }

    /// Waits until every language the host can start holds its parked
    /// kernels (or `limit` passes); `true` when reached. For tests.
    pub async fn wait_filled(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            let filled = {
                let state = self.inner.state();
                self.inner
                    .cfg
                    .languages
                    .iter()
                    .filter(|l| self.inner.host.template(**l).is_ok())
                    .all(|l| state.count(*l) >= self.inner.cfg.per_language)
            };
            if filled {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A parked kernel that fits a create of `language` under `limits` and
    /// `max_age`, taken out of the pool; `None` when there is none.
    fn take(&self, language: Language, limits: &Limits, max_age: Duration) -> Option<Parked> {
        let cfg = &self.inner.cfg;
        if !cfg.languages.contains(&language) || *limits != cfg.limits || max_age != cfg.max_age {
            return None;
        }
        let template = self.inner.host.template(language).ok()?;
        let now = Instant::now();
        let mut state = self.inner.state();
        let i = state
            .parked
            .iter()
            .position(|p| fits(p, language, &template, now))?;
        let parked = state.parked.remove(i);
        state.publish(language);
        Some(parked)
    }
}

impl KernelHost for ParkedHost {
    fn can_start(&self, language: Language) -> Result<(), KernelsError> {
        self.inner.host.can_start(language)
    }

    fn template(&self, language: Language) -> Result<String, KernelsError> {
        self.inner.host.template(language)
    }

    fn start(
        &self,
        language: Language,
        limits: Limits,
        max_age: Duration,
    ) -> BoxFuture<'_, Result<Box<dyn HostedKernel>, KernelsError>> {
        Box::pin(async move {
            let taken = self.take(language, &limits, max_age);
            let result = if taken.is_some() { "hit" } else { "miss" };
            metrics::counter!("kiln_kernel_pool_takes_total", "lang" => language.name(), "result" => result)
                .increment(1);
            {
                let mut state = self.inner.state();
                let stats = state.stats_of(language);
                match taken {
                    Some(_) => stats.hits += 1,
                    None => stats.misses += 1,
                }
            }
            self.inner.wake.notify_one();
            match taken {
                Some(p) => {
                    tracing::info!(
                        lang = language.name(),
                        template = %p.template,
                        parked_ms = p.since.elapsed().as_secs_f64() * 1000.0,
                        "kernel taken from those started ahead"
                    );
                    // at normal priority before the create answers, so
                    // before its first evaluation
                    p.kernel.taken();
                    Ok(p.kernel)
                }
                None => self.inner.host.start(language, limits, max_age).await,
            }
        })
    }

    fn ready(&self) -> bool {
        self.inner.host.ready()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.inner.stop.cancel();
            let task = self
                .inner
                .refill
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(mut task) = task {
                // a start in progress is dropped at the stop; what else the
                // task may be doing (closing stale kernels) ends within the
                // kernel's limits, past which the task is dropped
                if tokio::time::timeout(Duration::from_secs(35), &mut task)
                    .await
                    .is_err()
                {
                    task.abort();
                }
            }
            let parked: Vec<Parked> = {
                let mut state = self.inner.state();
                let all = std::mem::take(&mut state.parked);
                for l in &self.inner.cfg.languages {
                    state.publish(*l);
                }
                all
            };
            for p in parked {
                retire(p.kernel.as_ref()).await;
            }
            self.inner.host.shutdown().await;
        })
    }
}

/// Closes a kernel that no session will have and gives back its slot.
async fn retire(kernel: &dyn HostedKernel) {
    kernel.close().await;
    kernel.release();
}

/// The parked kernels that no create may take any more (their template is
/// not the one a create would fork now, they are too old, or dead), taken
/// out of `state`.
fn stale(state: &mut State, host: &dyn KernelHost, now: Instant) -> Vec<Parked> {
    let (keep, gone): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut state.parked)
        .into_iter()
        .partition(|p| {
            host.template(p.language)
                .is_ok_and(|t| fits(p, p.language, &t, now))
        });
    state.parked = keep;
    for p in &gone {
        state.stats_of(p.language).retired += 1;
    }
    gone
}

/// The next language to start a kernel ahead for: the first one short of
/// its count that the host can start now and that is not backing off.
fn next_language(state: &State, cfg: &ParkedConfig, host: &dyn KernelHost) -> Option<Language> {
    let now = Instant::now();
    cfg.languages.iter().copied().find(|l| {
        state.count(*l) < cfg.per_language
            && state.backoff.iter().all(|(bl, b)| bl != l || b.allows(now))
            && host.template(*l).is_ok()
    })
}

async fn refill_loop(inner: Arc<Inner>) {
    let host = Arc::clone(&inner.host);
    while !inner.stop.is_cancelled() {
        let (gone, next) = {
            let mut state = inner.state();
            let gone = stale(&mut state, host.as_ref(), Instant::now());
            for p in &gone {
                state.publish(p.language);
            }
            (gone, next_language(&state, &inner.cfg, host.as_ref()))
        };
        for p in gone {
            retire(p.kernel.as_ref()).await;
        }
        let Some(language) = next else {
            tokio::select! {
                () = inner.wake.notified() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                () = inner.stop.cancelled() => {}
            }
            continue;
        };
        let Ok(template) = host.template(language) else {
            continue;
        };
        // its own clocks cover the time it may stay parked
        let life = inner.cfg.max_age + PARKED_AT_MOST;
        // at idle CPU priority until taken: a create that starts its own
        // kernel meanwhile does not compete with it. On a busy node such a
        // start may take long; a shutdown drops it rather than wait for it
        // (its jail is killed and its slot given back as it is dropped).
        let started = tokio::select! {
            started = host.start_ahead(language, inner.cfg.limits.clone(), life) => started,
            () = inner.stop.cancelled() => break,
        };
        // the template moved while it started, or the server is stopping:
        // no create will take it
        let unwanted = inner.stop.is_cancelled()
            || host.template(language).ok().as_deref() != Some(template.as_str());
        match started {
            Ok(kernel) if unwanted => {
                inner.state().stats_of(language).retired += 1;
                retire(kernel.as_ref()).await;
            }
            Ok(kernel) => {
                let mut state = inner.state();
                state.stats_of(language).built += 1;
                state.backoff_of(language).succeeded();
                state.parked.push(Parked {
                    language,
                    template,
                    kernel,
                    since: Instant::now(),
                });
                state.publish(language);
            }
            Err(e) => {
                let wait = inner.state().failed(language);
                tracing::warn!(lang = language.name(), error = %e, retry_in = ?wait,
                    "starting a kernel ahead failed");
            }
        }
    }
}

#[cfg(test)]
#[path = "kernel_pool_tests.rs"]
mod tests;
