//! The result of one benchmark invocation: its data model (what the JSON
//! file holds, so runs can be compared later), the median-of-runs reduction,
//! and the markdown rendering printed at the end.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::machine::{Descendants, MachineInfo, Rss, TemplateMemory};
use crate::prom::{PHASES, Phases};
use crate::stats::{median, ratio};

/// Version of the JSON layout below; bump on incompatible changes.
pub const SCHEMA: u32 = 1;

/// What a metric's numbers mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    Ms,
    PerSecond,
    Percent,
    /// A plain number (kernels, processes).
    Count,
    Mib,
}

/// Which direction is good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Lower,
    Higher,
}

/// One statistic of a scenario: its value in every run, for Kiln and the
/// baseline, and the medians the table shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    pub name: String,
    pub unit: Unit,
    pub better: Better,
    pub kiln_runs: Vec<Option<f64>>,
    pub baseline_runs: Vec<Option<f64>>,
    /// Median of `kiln_runs`.
    pub kiln: Option<f64>,
    /// Median of `baseline_runs`.
    pub baseline: Option<f64>,
    /// `kiln / baseline`.
    pub ratio: Option<f64>,
}

impl Metric {
    /// Reduce per-run values to their medians and ratio.
    pub fn new(
        name: &str,
        unit: Unit,
        better: Better,
        kiln_runs: Vec<Option<f64>>,
        baseline_runs: Vec<Option<f64>>,
    ) -> Metric {
        let kiln = median(&kiln_runs);
        let baseline = median(&baseline_runs);
        Metric {
            name: name.to_owned(),
            unit,
            better,
            ratio: ratio(kiln, baseline),
            kiln_runs,
            baseline_runs,
            kiln,
            baseline,
        }
    }
}

/// Request accounting of one side (Kiln or baseline) over all runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tally {
    /// Measured requests (warm-up excluded).
    pub attempted: usize,
    /// Requests that failed or returned a wrong result.
    pub failed: usize,
    /// The first failure, to start debugging from.
    pub first_error: Option<String>,
}

impl Tally {
    /// Fold another run's accounting into this one.
    pub fn absorb(&mut self, other: Tally) {
        self.attempted += other.attempted;
        self.failed += other.failed;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// One scenario's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioReport {
    /// `A`…`E`.
    pub id: String,
    pub title: String,
    /// What the baseline column measures.
    pub baseline: String,
    pub runs: usize,
    pub kiln: Tally,
    pub baseline_tally: Tally,
    pub metrics: Vec<Metric>,
    /// The server's phase timings during this scenario (Kiln side only).
    pub phases: Phases,
    /// CPU of each Python template's fork-server and the programs it forked
    /// and reaped, over the measured runs, ms.
    #[serde(default)]
    pub template_cpu_ms: BTreeMap<String, f64>,
}

/// The server process's memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerReport {
    /// After start-up, before any load.
    pub idle: Rss,
    /// After the last scenario.
    pub after: Rss,
    /// The server's child processes when idle: fork-server and parked
    /// warm jails (reported apart from the server's own memory).
    #[serde(default)]
    pub pool_idle: Descendants,
    /// Each Python template's fork-server, read after the last scenario.
    #[serde(default)]
    pub templates: Vec<TemplateMemory>,
    /// The answer of `GET /v1/health` (languages and versions).
    pub health: Option<serde_json::Value>,
}

/// Everything one invocation measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema: u32,
    pub started_at: String,
    pub finished_at: String,
    pub machine: MachineInfo,
    /// The effective settings (counts, paths, runs).
    pub settings: serde_json::Value,
    pub server: ServerReport,
    pub scenarios: Vec<ScenarioReport>,
    /// Phase totals from the final `/metrics` scrape (all scenarios, warm-up included).
    pub phases_total: Phases,
    pub notes: Vec<String>,
}

impl Report {
    /// Whether any measured request, Kiln or baseline, failed verification.
    pub fn has_failures(&self) -> bool {
        self.scenarios
            .iter()
            .any(|s| s.kiln.failed > 0 || s.baseline_tally.failed > 0)
    }

    /// Write the JSON file, creating its directory.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("create directory {}", dir.display()))?;
        }
        let text = serde_json::to_string_pretty(self).context("serialize report")?;
        std::fs::write(path, text + "\n").with_context(|| format!("write {}", path.display()))
    }

    /// The human-readable report.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let m = &self.machine;
        let _ = writeln!(s, "## Kiln benchmark — {}\n", self.started_at);
        let _ = writeln!(
            s,
            "Machine: {} CPU(s), {}, kernel {}, {} memory; commit {}{}; {}; {}\n",
            m.nproc,
            m.cpu_model.as_deref().unwrap_or("unknown CPU"),
            m.kernel.as_deref().unwrap_or("unknown"),
            m.mem_total_kib
                .map_or_else(|| "unknown".to_owned(), fmt_kib),
            m.git_commit
                .as_deref()
                .map_or("unknown", |c| c.get(..12).unwrap_or(c)),
            if m.git_dirty == Some(true) {
                " (dirty)"
            } else {
                ""
            },
            m.python.as_deref().unwrap_or("python: unknown"),
            m.node
                .as_deref()
                .map_or_else(|| "node: unknown".to_owned(), |v| format!("node {v}")),
        );
        let runs = self.scenarios.first().map_or(0, |sc| sc.runs);
        let _ = writeln!(
            s,
            "Median of {runs} run(s). Ratio = Kiln ÷ baseline (latency: lower is better, so < 1 means Kiln is faster; throughput: higher is better).\n"
        );
        s.push_str("| Scenario | Metric | Kiln | Baseline | Ratio |\n");
        s.push_str("|---|---|---:|---:|---:|\n");
        for sc in &self.scenarios {
            for (i, metric) in sc.metrics.iter().enumerate() {
                let scen = if i == 0 {
                    format!("{} {}", sc.id, sc.title)
                } else {
                    String::new()
                };
                let _ = writeln!(
                    s,
                    "| {scen} | {} | {} | {} | {} |",
                    metric.name,
                    fmt_value(metric.kiln, metric.unit),
                    fmt_value(metric.baseline, metric.unit),
                    metric
                        .ratio
                        .map_or_else(|| "—".to_owned(), |r| format!("{r:.2}×")),
                );
            }
        }
        s.push_str("\nBaselines:\n");
        for sc in &self.scenarios {
            let _ = writeln!(s, "- {}: {}", sc.id, sc.baseline);
        }
        for sc in &self.scenarios {
            for (side, t) in [("Kiln", &sc.kiln), ("baseline", &sc.baseline_tally)] {
                if t.failed > 0 {
                    let _ = writeln!(
                        s,
                        "- **{} {side}: {} of {} requests failed**; first: {}",
                        sc.id,
                        t.failed,
                        t.attempted,
                        t.first_error.as_deref().unwrap_or("?")
                    );
                }
            }
        }

        s.push_str("\n### Server memory (kiln process)\n\n");
        s.push_str("| When | VmRSS | VmHWM (peak) |\n|---|---:|---:|\n");
        for (when, r) in [
            ("idle, after start-up", &self.server.idle),
            ("after the run", &self.server.after),
        ] {
            let _ = writeln!(
                s,
                "| {when} | {} | {} |",
                r.rss_kib.map_or_else(|| "—".to_owned(), fmt_kib),
                r.peak_kib.map_or_else(|| "—".to_owned(), fmt_kib),
            );
        }

        let _ = writeln!(
            s,
            "\nPool processes when idle (fork-server, parked warm jails and their helpers): {} processes, {} proportional set size in all (shared copy-on-write pages counted once).",
            self.server.pool_idle.processes,
            fmt_kib(self.server.pool_idle.pss_kib)
        );

        if !self.server.templates.is_empty() {
            s.push_str(
                "\n| Python template (fork-server, after the run) | RSS | PSS | private |\n|---|---:|---:|---:|\n",
            );
            for t in &self.server.templates {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} |",
                    t.template,
                    fmt_kib(t.rss_kib),
                    fmt_kib(t.pss_kib),
                    fmt_kib(t.private_kib)
                );
            }
        }
        let cpu_rows: Vec<_> = self
            .scenarios
            .iter()
            .flat_map(|sc| sc.template_cpu_ms.iter().map(move |(t, ms)| (sc, t, *ms)))
            .filter(|(_, _, ms)| *ms > 0.0)
            .collect();
        if !cpu_rows.is_empty() {
            s.push_str("\nCPU of each template's fork-server and of the programs it forked (fork, set-up, run, exit), over the measured runs:\n\n| Scenario | template | CPU | per execution of the scenario |\n|---|---|---:|---:|\n");
            for (sc, t, ms) in cpu_rows {
                let execs = sc.phases.get("queue").map_or(0.0, |p| p.count);
                let per = if execs > 0.0 {
                    format!("{:.2} ms", ms / execs)
                } else {
                    "—".to_owned()
                };
                let _ = writeln!(s, "| {} | {t} | {ms:.0} ms | {per} |", sc.id);
            }
        }

        s.push_str("\n### Where the time goes (server phases, mean ms per execution)\n\n");
        s.push_str("| Scenario | executions |");
        for p in PHASES {
            let _ = write!(s, " {p} |");
        }
        s.push_str("\n|---|---:|");
        for _ in PHASES {
            s.push_str("---:|");
        }
        s.push('\n');
        let mut rows: Vec<(String, &Phases)> = self
            .scenarios
            .iter()
            .map(|sc| (sc.id.clone(), &sc.phases))
            .collect();
        rows.push(("all (incl. warm-up)".to_owned(), &self.phases_total));
        for (name, phases) in rows {
            let execs = phases
                .get("queue")
                .or_else(|| phases.values().next())
                .map_or(0.0, |t| t.count);
            let _ = write!(s, "| {name} | {execs:.0} |");
            for p in PHASES {
                let cell = phases
                    .get(p)
                    .and_then(|t| t.mean_ms())
                    .map_or_else(|| "—".to_owned(), |v| format!("{v:.1}"));
                let _ = write!(s, " {cell} |");
            }
            s.push('\n');
        }
        if !self.notes.is_empty() {
            s.push_str("\nNotes:\n");
            for n in &self.notes {
                let _ = writeln!(s, "- {n}");
            }
        }
        s
    }
}

/// A value with its unit, `—` when missing.
pub fn fmt_value(v: Option<f64>, unit: Unit) -> String {
    match v {
        None => "—".to_owned(),
        Some(v) => match unit {
            Unit::Ms => format!("{v:.1} ms"),
            Unit::PerSecond => format!("{v:.1}/s"),
            Unit::Percent => format!("{v:.1} %"),
            Unit::Count => format!("{v:.1}"),
            Unit::Mib => format!("{v:.2} MiB"),
        },
    }
}

/// KiB as MiB (or GiB when large).
pub fn fmt_kib(kib: u64) -> String {
    let mib = kib as f64 / 1024.0;
    if mib >= 10240.0 {
        format!("{:.1} GiB", mib / 1024.0)
    } else {
        format!("{mib:.1} MiB")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prom::PhaseTotals;

    fn sample() -> Report {
        let mut phases = Phases::new();
        phases.insert(
            "queue".into(),
            PhaseTotals {
                sum_seconds: 0.01,
                count: 10.0,
            },
        );
        phases.insert(
            "run".into(),
            PhaseTotals {
                sum_seconds: 0.25,
                count: 10.0,
            },
        );
        Report {
            schema: SCHEMA,
            started_at: "2026-01-02T03:04:05Z".into(),
            finished_at: "2026-01-02T03:14:05Z".into(),
            machine: MachineInfo {
                nproc: 2,
                cpu_model: Some("Test CPU".into()),
                kernel: Some("6.18.0".into()),
                mem_total_kib: Some(24 * 1024 * 1024),
                git_commit: Some("0123456789abcdef0123".into()),
                git_dirty: Some(true),
                python: Some("Python 3.11.2".into()),
                node: Some("v20.0.0".into()),
                kiln: Some("kiln 0.1.0".into()),
            },
            settings: serde_json::json!({"runs": 3}),
            server: ServerReport {
                idle: Rss {
                    rss_kib: Some(20480),
                    peak_kib: Some(20480),
                },
                pool_idle: Descendants::default(),
                templates: Vec::new(),
                after: Rss {
                    rss_kib: Some(40960),
                    peak_kib: None,
                },
                health: None,
            },
            scenarios: vec![ScenarioReport {
                id: "A".into(),
                title: "py hello".into(),
                baseline: "python3 -c spawn".into(),
                runs: 3,
                kiln: Tally {
                    attempted: 600,
                    failed: 0,
                    first_error: None,
                },
                baseline_tally: Tally {
                    attempted: 600,
                    failed: 2,
                    first_error: Some("boom".into()),
                },
                metrics: vec![
                    Metric::new(
                        "p50 latency",
                        Unit::Ms,
                        Better::Lower,
                        vec![Some(30.0), Some(20.0), Some(25.0)],
                        vec![Some(10.0), Some(12.5), Some(15.0)],
                    ),
                    Metric::new(
                        "throughput",
                        Unit::PerSecond,
                        Better::Higher,
                        vec![Some(40.0)],
                        vec![None],
                    ),
                ],
                phases: phases.clone(),
                template_cpu_ms: BTreeMap::from([("py-lean".to_owned(), 3000.0)]),
            }],
            phases_total: phases,
            notes: vec!["noisy".into()],
        }
    }

    #[test]
    fn metric_reports_medians_of_runs_and_their_ratio() {
        let m = Metric::new(
            "p99",
            Unit::Ms,
            Better::Lower,
            vec![Some(30.0), Some(20.0), Some(25.0)],
            vec![Some(10.0), Some(12.5), Some(15.0)],
        );
        assert_eq!(m.kiln, Some(25.0));
        assert_eq!(m.baseline, Some(12.5));
        assert_eq!(m.ratio, Some(2.0));
    }

    #[test]
    fn markdown_table_has_one_row_per_metric_with_units_and_ratio() {
        let md = sample().markdown();
        assert!(
            md.contains("| Scenario | Metric | Kiln | Baseline | Ratio |"),
            "{md}"
        );
        assert!(
            md.contains("| A py hello | p50 latency | 25.0 ms | 12.5 ms | 2.00× |"),
            "{md}"
        );
        assert!(md.contains("|  | throughput | 40.0/s | — | — |"), "{md}");
        assert!(md.contains("Median of 3 run(s)"), "{md}");
        assert!(md.contains("commit 0123456789ab (dirty)"), "{md}");
    }

    #[test]
    fn markdown_shows_failures_memory_and_phase_means() {
        let md = sample().markdown();
        assert!(
            md.contains("**A baseline: 2 of 600 requests failed**; first: boom"),
            "{md}"
        );
        assert!(
            md.contains("| idle, after start-up | 20.0 MiB | 20.0 MiB |"),
            "{md}"
        );
        assert!(md.contains("| after the run | 40.0 MiB | — |"), "{md}");
        // queue 1.0 ms, acquire, store and stage none, run 25.0 ms, harvest none
        assert!(
            md.contains("| A | 10 | 1.0 | — | — | — | 25.0 | — |"),
            "{md}"
        );
        assert!(
            md.contains("| all (incl. warm-up) | 10 | 1.0 | — | — | — | 25.0 | — |"),
            "{md}"
        );
        assert!(md.contains("Pool processes when idle"), "{md}");
        assert!(md.contains("- noisy"), "{md}");
    }

    #[test]
    fn json_round_trips_and_names_the_fields_a_reader_compares() {
        let r = sample();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/out.json");
        r.write_json(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["schema"], 1);
        assert_eq!(v["machine"]["nproc"], 2);
        assert_eq!(v["machine"]["cpu_model"], "Test CPU");
        assert_eq!(v["server"]["idle"]["rss_kib"], 20480);
        assert_eq!(v["scenarios"][0]["metrics"][0]["unit"], "ms");
        assert_eq!(v["scenarios"][0]["metrics"][0]["better"], "lower");
        assert_eq!(v["scenarios"][0]["metrics"][0]["kiln"], 25.0);
        assert_eq!(
            v["scenarios"][0]["metrics"][1]["baseline_runs"][0],
            serde_json::Value::Null
        );
        assert_eq!(v["phases_total"]["run"]["count"], 10.0);
    }

    #[test]
    fn failures_are_detected_on_either_side() {
        let mut r = sample();
        assert!(r.has_failures());
        r.scenarios[0].baseline_tally.failed = 0;
        assert!(!r.has_failures());
        r.scenarios[0].kiln.failed = 1;
        assert!(r.has_failures());
    }

    #[test]
    fn values_are_formatted_with_their_units() {
        assert_eq!(fmt_value(Some(12.345), Unit::Ms), "12.3 ms");
        assert_eq!(fmt_value(Some(99.96), Unit::Percent), "100.0 %");
        assert_eq!(fmt_value(Some(32.8), Unit::PerSecond), "32.8/s");
        assert_eq!(fmt_value(None, Unit::Ms), "—");
        assert_eq!(fmt_kib(1536), "1.5 MiB");
        assert_eq!(fmt_kib(24 * 1024 * 1024), "24.0 GiB");
    }
}
