//! What the operator's view reads that no face owns: the sandbox's report
//! ([`Operations`], given by the binary) and the last hour of key numbers
//! ([`History`], filled by `admin::spawn_sampler`).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use utoipa::ToSchema;

/// What the sandbox reported at start-up (`kiln doctor`'s host checks).
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct SandboxView {
    pub kernel: String,
    pub root: bool,
    pub user_namespaces: bool,
    /// `cgroup v2 at ...: memory pids cpu`, or why not.
    pub cgroup: String,
    pub cgroup_limits: bool,
    pub seccomp: bool,
    pub landlock_abi: Option<u32>,
    /// How run workspaces are size-limited.
    pub workspace_quota: String,
    /// Every required protection is in place.
    pub enforceable: bool,
    pub problems: Vec<String>,
    pub warnings: Vec<String>,
    /// Protections this server runs without (development flag).
    pub degraded: Vec<String>,
}

/// One warm-pool profile.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WarmProfileView {
    pub profile: String,
    /// Parked jails ready now.
    pub ready: u32,
    /// How many the pool aims to keep.
    pub target: u32,
    pub hits: u64,
    pub misses: u64,
    pub built: u64,
    pub build_failures: u64,
}

/// One Python fork-server (one per template), when it runs.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ForkServerView {
    /// The template it holds (`py-min`, `py-lean`, `py-data`, `py`).
    pub template: String,
    pub alive: bool,
    pub pid: u32,
    /// Interpreter start-up plus preload, milliseconds.
    pub preload_ms: u64,
    /// Resident memory of the template process (shared copy-on-write).
    pub rss_bytes: u64,
}

/// What the binary knows about its sandbox, asked on each status request.
pub trait Operations: Send + Sync + 'static {
    fn sandbox(&self) -> SandboxView;
    /// Empty when the warm pool is off.
    fn warm(&self) -> Vec<WarmProfileView>;
    /// Every fork-server started, by template.
    fn fork_servers(&self) -> Vec<ForkServerView>;
}

/// One sample of the key numbers.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct Sample {
    /// Unix milliseconds.
    pub at_ms: u64,
    /// Runs not ended (queued or running).
    pub runs_active: u64,
    /// Runs waiting for an execution slot.
    pub queued: u64,
    /// Runs that ended since the previous sample.
    pub finished: u64,
    /// Parked warm jails, every profile.
    pub warm_ready: u64,
    /// Resident memory of the Kiln process (bytes; 0 when unknown).
    pub rss_bytes: u64,
}

/// The last `capacity` samples, oldest first.
#[derive(Debug)]
pub struct History {
    every: Duration,
    capacity: usize,
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    /// Room for one hour at one sample per `every`.
    pub fn hour(every: Duration) -> History {
        let every = every.max(Duration::from_secs(1));
        let capacity = usize::try_from(3600 / every.as_secs().max(1)).unwrap_or(360);
        History {
            every,
            capacity: capacity.max(1),
            samples: Mutex::new(VecDeque::new()),
        }
    }

    pub fn every(&self) -> Duration {
        self.every
    }

    pub fn push(&self, s: Sample) {
        let mut q = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == self.capacity {
            q.pop_front();
        }
        q.push_back(s);
    }

    pub fn samples(&self) -> Vec<Sample> {
        let q = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        q.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at_ms: u64) -> Sample {
        Sample {
            at_ms,
            runs_active: 0,
            queued: 0,
            finished: 0,
            warm_ready: 0,
            rss_bytes: 0,
        }
    }

    #[test]
    fn the_history_keeps_the_last_hour_oldest_first() {
        let h = History::hour(Duration::from_secs(600));
        assert_eq!(h.capacity, 6);
        for t in 0..8 {
            h.push(s(t));
        }
        let at: Vec<u64> = h.samples().iter().map(|x| x.at_ms).collect();
        assert_eq!(at, [2, 3, 4, 5, 6, 7]);
    }
}
