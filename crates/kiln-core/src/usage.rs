//! What a run used: wall time, CPU time and peak memory, per step.

use std::time::Duration;

/// What one step (a compile or a run) of an execution used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepUsage {
    /// From the step's start to the death of its last process. For a jail
    /// built for the step this includes building it (a few milliseconds);
    /// for a warm jail it starts at the go.
    pub wall: Duration,
    /// User + system CPU time of every process of the step, from the run's
    /// cgroup (so processes killed with the jail count too); absent where the
    /// host cannot account it.
    pub cpu: Option<Duration>,
    /// Peak memory of the step's cgroup (page cache included).
    pub memory_peak: Option<u64>,
}

/// What an execution used: its compile step (compiled languages only) and
/// its run step (absent when compilation failed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub compile: Option<StepUsage>,
    pub run: Option<StepUsage>,
}

impl Usage {
    /// Both steps together: walls and CPU times add up, the peak is the
    /// larger one. CPU is absent if either step's is.
    pub fn total(&self) -> StepUsage {
        let steps: Vec<&StepUsage> = self.compile.iter().chain(self.run.iter()).collect();
        StepUsage {
            wall: steps.iter().map(|s| s.wall).sum(),
            cpu: if steps.is_empty() {
                None
            } else {
                steps
                    .iter()
                    .map(|s| s.cpu)
                    .try_fold(Duration::ZERO, |acc, c| c.map(|c| acc + c))
            },
            memory_peak: steps.iter().filter_map(|s| s.memory_peak).max(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_adds_times_and_keeps_the_larger_peak() {
        let u = Usage {
            compile: Some(StepUsage {
                wall: Duration::from_millis(300),
                cpu: Some(Duration::from_millis(250)),
                memory_peak: Some(90 << 20),
            }),
            run: Some(StepUsage {
                wall: Duration::from_millis(20),
                cpu: Some(Duration::from_millis(5)),
                memory_peak: Some(2 << 20),
            }),
        };
        let t = u.total();
        assert_eq!(t.wall, Duration::from_millis(320));
        assert_eq!(t.cpu, Some(Duration::from_millis(255)));
        assert_eq!(t.memory_peak, Some(90 << 20));
    }

    #[test]
    fn cpu_is_unknown_when_a_step_could_not_account_it() {
        let u = Usage {
            compile: Some(StepUsage::default()),
            run: Some(StepUsage {
                cpu: Some(Duration::from_millis(5)),
                ..StepUsage::default()
            }),
        };
        assert_eq!(u.total().cpu, None);
        assert_eq!(Usage::default().total(), StepUsage::default());
    }
}
