//! Statistics over measured samples: nearest-rank percentiles over sorted
//! latencies, throughput, and the median of per-run statistics that the
//! report shows. Pure functions, no IO.

use std::time::Duration;

/// Latency samples of one run, in milliseconds, kept sorted ascending.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Latencies {
    sorted_ms: Vec<f64>,
}

impl Latencies {
    /// Sort `samples_ms` (NaN-safe total order) and keep them.
    pub fn from_ms(mut samples_ms: Vec<f64>) -> Latencies {
        samples_ms.sort_by(f64::total_cmp);
        Latencies {
            sorted_ms: samples_ms,
        }
    }

    /// Convenience: from measured durations.
    pub fn from_durations(samples: &[Duration]) -> Latencies {
        Latencies::from_ms(samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect())
    }

    /// Nearest-rank percentile: the smallest sample such that at least `p`
    /// percent of all samples are ≤ it. `p` is clamped to (0, 100]; `None`
    /// when there are no samples.
    pub fn percentile(&self, p: f64) -> Option<f64> {
        let n = self.sorted_ms.len();
        if n == 0 {
            return None;
        }
        let p = p.clamp(f64::MIN_POSITIVE, 100.0);
        // rank in 1..=n; the float → usize cast saturates and is clamped below.
        let rank = ((p / 100.0) * n as f64).ceil() as usize;
        let idx = rank.clamp(1, n) - 1;
        self.sorted_ms.get(idx).copied()
    }
}

/// Completed operations per second over a wall-clock window; `None` for an
/// empty window.
pub fn per_second(count: usize, wall: Duration) -> Option<f64> {
    let secs = wall.as_secs_f64();
    if secs <= 0.0 {
        return None;
    }
    Some(count as f64 / secs)
}

/// Share of `ok` in `total` as a percentage; `None` when nothing was attempted.
pub fn percent(ok: usize, total: usize) -> Option<f64> {
    if total == 0 {
        return None;
    }
    Some(ok as f64 * 100.0 / total as f64)
}

/// Median of per-run values (mean of the two middle values for an even
/// count); runs that produced no value are ignored. `None` if none did.
pub fn median(values: &[Option<f64>]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().flatten().copied().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v.get(mid).copied()
    } else {
        match (v.get(mid - 1), v.get(mid)) {
            (Some(a), Some(b)) => Some((a + b) / 2.0),
            _ => None,
        }
    }
}

/// `kiln / baseline`, `None` if either is missing or the baseline is zero.
pub fn ratio(kiln: Option<f64>, baseline: Option<f64>) -> Option<f64> {
    match (kiln, baseline) {
        (Some(k), Some(b)) if b != 0.0 => Some(k / b),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank_on_sorted_samples() {
        // unsorted on purpose: 1..=100 reversed
        let l = Latencies::from_ms((1..=100).rev().map(f64::from).collect());
        assert_eq!(l.percentile(50.0), Some(50.0));
        assert_eq!(l.percentile(95.0), Some(95.0));
        assert_eq!(l.percentile(99.0), Some(99.0));
        assert_eq!(l.percentile(100.0), Some(100.0));
        assert_eq!(l.percentile(0.5), Some(1.0));
    }

    #[test]
    fn percentiles_of_few_samples_round_up_to_the_next_sample() {
        let l = Latencies::from_ms(vec![30.0, 10.0, 20.0]);
        // 50% of 3 = 1.5 → rank 2
        assert_eq!(l.percentile(50.0), Some(20.0));
        // 95% of 3 = 2.85 → rank 3 (the maximum)
        assert_eq!(l.percentile(95.0), Some(30.0));
        assert_eq!(l.percentile(34.0), Some(20.0));
        assert_eq!(l.percentile(33.0), Some(10.0));
    }

    #[test]
    fn percentile_of_one_sample_is_that_sample_and_of_none_is_none() {
        assert_eq!(Latencies::from_ms(vec![7.5]).percentile(99.0), Some(7.5));
        assert_eq!(Latencies::from_ms(vec![]).percentile(50.0), None);
    }

    #[test]
    fn out_of_range_percentiles_are_clamped() {
        let l = Latencies::from_ms(vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(l.percentile(250.0), Some(4.0));
        assert_eq!(l.percentile(-3.0), Some(1.0));
    }

    #[test]
    fn latencies_from_durations_are_milliseconds() {
        let l = Latencies::from_durations(&[Duration::from_micros(2500), Duration::from_millis(1)]);
        assert_eq!(l.percentile(50.0), Some(1.0));
        assert_eq!(l.percentile(100.0), Some(2.5));
    }

    #[test]
    fn median_of_odd_runs_is_the_middle_value() {
        assert_eq!(median(&[Some(9.0), Some(1.0), Some(5.0)]), Some(5.0));
    }

    #[test]
    fn median_of_even_runs_averages_the_two_middle_values() {
        assert_eq!(
            median(&[Some(4.0), Some(1.0), Some(3.0), Some(10.0)]),
            Some(3.5)
        );
    }

    #[test]
    fn median_ignores_runs_without_a_value() {
        assert_eq!(median(&[None, Some(2.0), None]), Some(2.0));
        assert_eq!(median(&[None, None]), None);
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn throughput_and_percent_handle_empty_inputs() {
        assert_eq!(per_second(300, Duration::from_secs(2)), Some(150.0));
        assert_eq!(per_second(3, Duration::ZERO), None);
        assert_eq!(percent(24, 25), Some(96.0));
        assert_eq!(percent(0, 0), None);
    }

    #[test]
    fn ratio_is_kiln_over_baseline_and_refuses_zero_baselines() {
        assert_eq!(ratio(Some(30.0), Some(15.0)), Some(2.0));
        assert_eq!(ratio(Some(30.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
        assert_eq!(ratio(Some(1.0), None), None);
    }
}
