//! Reads the server's per-phase execution timings out of a Prometheus text
//! exposition (`kiln_exec_phase_seconds{phase=…}` `_sum`/`_count`, rendered
//! by the exporter for histograms and summaries alike), and the difference
//! between two scrapes so each scenario gets its own breakdown.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The histogram the executor records per phase.
pub const PHASE_METRIC: &str = "kiln_exec_phase_seconds";
/// Phases in pipeline order (the report's column order).
pub const PHASES: [&str; 6] = ["queue", "acquire", "store", "stage", "run", "harvest"];

/// Total seconds and observation count of one phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseTotals {
    pub sum_seconds: f64,
    pub count: f64,
}

impl PhaseTotals {
    /// Mean duration of one observation in milliseconds, `None` without observations.
    pub fn mean_ms(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum_seconds * 1000.0 / self.count)
    }
}

/// Phase name → totals, summed over every other label (e.g. language).
pub type Phases = BTreeMap<String, PhaseTotals>;

/// The gauge the server sets to each Python template's fork-server pid.
pub const ZYGOTE_PID_METRIC: &str = "kiln_zygote_pid";

/// Template name → fork-server pid, from a Prometheus text exposition.
pub fn parse_zygote_pids(text: &str) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix(ZYGOTE_PID_METRIC) else {
            continue;
        };
        let Some((labels, value)) = rest.strip_prefix('{').and_then(|r| r.split_once('}')) else {
            continue;
        };
        let (Some(template), Some(pid)) = (
            label(labels, "template"),
            value
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok()),
        ) else {
            continue;
        };
        if pid >= 1.0 && pid <= f64::from(u32::MAX) {
            out.insert(template, pid as u32);
        }
    }
    out
}

/// Extract the phase totals from a Prometheus text exposition. Lines of
/// other metrics, comments and malformed lines are ignored.
pub fn parse_phases(text: &str) -> Phases {
    let mut out = Phases::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(PHASE_METRIC) else {
            continue;
        };
        let (is_sum, rest) = if let Some(r) = rest.strip_prefix("_sum") {
            (true, r)
        } else if let Some(r) = rest.strip_prefix("_count") {
            (false, r)
        } else {
            continue;
        };
        let Some(rest) = rest.strip_prefix('{') else {
            continue;
        };
        let Some((labels, value)) = rest.split_once('}') else {
            continue;
        };
        let Some(phase) = label(labels, "phase") else {
            continue;
        };
        // the value may be followed by a timestamp
        let Some(value) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        let t = out.entry(phase).or_default();
        if is_sum {
            t.sum_seconds += value;
        } else {
            t.count += value;
        }
    }
    out
}

/// The value of label `name` in a `a="x",b="y"` label set (escapes `\"`,
/// `\\` and `\n` are decoded).
fn label(labels: &str, name: &str) -> Option<String> {
    let mut rest = labels;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if rest.is_empty() {
            return None;
        }
        let (key, after) = rest.split_once('=')?;
        let after = after.strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => return None,
                },
                '"' => {
                    end = Some(i);
                    break;
                }
                c => value.push(c),
            }
        }
        let end = end?;
        if key.trim() == name {
            return Some(value);
        }
        rest = after.get(end + 1..)?;
    }
}

/// What happened between two scrapes (`after - before`, per phase).
pub fn delta(before: &Phases, after: &Phases) -> Phases {
    after
        .iter()
        .map(|(phase, a)| {
            let b = before.get(phase).copied().unwrap_or_default();
            (
                phase.clone(),
                PhaseTotals {
                    sum_seconds: a.sum_seconds - b.sum_seconds,
                    count: a.count - b.count,
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"# HELP kiln_exec_phase_seconds Time per phase
# TYPE kiln_exec_phase_seconds summary
kiln_exec_phase_seconds{phase="queue",quantile="0.5"} 0.0001
kiln_exec_phase_seconds_sum{phase="queue"} 0.02
kiln_exec_phase_seconds_count{phase="queue"} 10
kiln_exec_phase_seconds_sum{lang="py",phase="run"} 0.3
kiln_exec_phase_seconds_count{lang="py",phase="run"} 10
kiln_exec_phase_seconds_sum{lang="js",phase="run"} 0.5
kiln_exec_phase_seconds_count{lang="js",phase="run"} 5
kiln_exec_phase_seconds_bucket{phase="stage",le="0.005"} 3
kiln_exec_phase_seconds_sum{phase="stage"} 0.015 1700000000000
kiln_exec_phase_seconds_count{phase="stage"} 3 1700000000000
kiln_exec_duration_seconds_sum{lang="py"} 9
kiln_http_requests_total{route="/v1/exec",status="200"} 10
kiln_exec_phase_seconds_sum{phase="harvest"} not-a-number
"#;

    #[test]
    fn phase_sums_and_counts_are_read_and_summed_over_other_labels() {
        let p = parse_phases(SAMPLE);
        assert_eq!(
            p["queue"],
            PhaseTotals {
                sum_seconds: 0.02,
                count: 10.0
            }
        );
        assert_eq!(
            p["run"],
            PhaseTotals {
                sum_seconds: 0.8,
                count: 15.0
            }
        );
        assert_eq!(
            p["stage"],
            PhaseTotals {
                sum_seconds: 0.015,
                count: 3.0
            }
        );
        assert!(
            !p.contains_key("harvest"),
            "malformed value is skipped: {p:?}"
        );
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn zygote_pids_are_read_per_template() {
        let text = "# TYPE kiln_zygote_pid gauge\nkiln_zygote_pid{template=\"py\"} 1234\n\
                    kiln_zygote_pid{template=\"py-lean\"} 99\nkiln_zygote_rss_bytes{template=\"py\"} 5\n\
                    kiln_zygote_pid{other=\"x\"} 7\n";
        let pids = parse_zygote_pids(text);
        assert_eq!(pids.len(), 2, "{pids:?}");
        assert_eq!(pids["py"], 1234);
        assert_eq!(pids["py-lean"], 99);
    }

    #[test]
    fn mean_is_sum_over_count_in_milliseconds() {
        let p = parse_phases(SAMPLE);
        let run = p["run"].mean_ms().unwrap();
        assert!((run - 53.333).abs() < 0.01, "{run}");
        assert_eq!(PhaseTotals::default().mean_ms(), None);
    }

    #[test]
    fn labels_with_escapes_and_any_order_are_understood() {
        assert_eq!(
            label(r#"a="x\"y",phase="run""#, "phase").as_deref(),
            Some("run")
        );
        assert_eq!(
            label(r#"phase="st\\age""#, "phase").as_deref(),
            Some("st\\age")
        );
        assert_eq!(label(r#"a="1""#, "phase"), None);
        assert_eq!(label(r#"phase="unterminated"#, "phase"), None);
    }

    #[test]
    fn delta_subtracts_the_earlier_scrape() {
        let before = parse_phases(
            "kiln_exec_phase_seconds_sum{phase=\"run\"} 1\nkiln_exec_phase_seconds_count{phase=\"run\"} 4\n",
        );
        let after = parse_phases(
            "kiln_exec_phase_seconds_sum{phase=\"run\"} 1.5\nkiln_exec_phase_seconds_count{phase=\"run\"} 14\n\
             kiln_exec_phase_seconds_sum{phase=\"queue\"} 0.1\nkiln_exec_phase_seconds_count{phase=\"queue\"} 10\n",
        );
        let d = delta(&before, &after);
        assert_eq!(
            d["run"],
            PhaseTotals {
                sum_seconds: 0.5,
                count: 10.0
            }
        );
        assert_eq!(
            d["queue"],
            PhaseTotals {
                sum_seconds: 0.1,
                count: 10.0
            }
        );
        assert!((d["run"].mean_ms().unwrap() - 50.0).abs() < 1e-9);
    }
}
