//! Resource limits applied to one execution.

use std::time::Duration;

/// Hard limits for one execution. The sandbox enforces every field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time of the run step; the whole process tree dies after it.
    pub wall_time: Duration,
    /// CPU time (RLIMIT_CPU, whole seconds, rounded up).
    pub cpu_time: Duration,
    /// Memory cgroup limit (swap included where the host allows).
    pub memory_bytes: u64,
    /// Maximum number of tasks (pids cgroup).
    pub pids: u32,
    /// Largest file a process may write (RLIMIT_FSIZE).
    pub file_size_bytes: u64,
    /// Open file descriptors per process (RLIMIT_NOFILE).
    pub open_files: u64,
    /// Captured stdout bytes before the run is stopped with `OL`.
    pub stdout_bytes: usize,
    /// Captured stderr bytes before the run is stopped with `EL`.
    pub stderr_bytes: usize,
    /// Size of the jail's private `/tmp` (tmpfs).
    pub tmp_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            wall_time: Duration::from_secs(30),
            cpu_time: Duration::from_secs(30),
            memory_bytes: 512 * 1024 * 1024,
            pids: 256,
            file_size_bytes: 256 * 1024 * 1024,
            open_files: 1024,
            stdout_bytes: 64 * 1024,
            stderr_bytes: 64 * 1024,
            tmp_bytes: 64 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// Apply a request's `timeout` (milliseconds): it may lower the wall time,
    /// never raise it past the configured maximum.
    pub fn with_requested_timeout(mut self, timeout_ms: Option<u64>) -> Self {
        if let Some(ms) = timeout_ms {
            let requested = Duration::from_millis(ms.max(1));
            if requested < self.wall_time {
                self.wall_time = requested;
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requested_timeout_lowers_but_never_raises() {
        let l = Limits::default();
        assert_eq!(
            l.clone().with_requested_timeout(Some(5_000)).wall_time,
            Duration::from_secs(5)
        );
        assert_eq!(
            l.clone().with_requested_timeout(Some(900_000)).wall_time,
            Duration::from_secs(30)
        );
        assert_eq!(
            l.clone().with_requested_timeout(None).wall_time,
            l.wall_time
        );
    }
}
