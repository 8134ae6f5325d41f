//! Scenario K: live-kernel density. Creates `k_kernels` idle `py` kernels
//! one after another (`POST /v1/sessions`), each verified with a first
//! evaluation, and reports:
//! - create → first output (the create request sent → the first
//!   evaluation's answer read) and the create alone, p50/p95/p99 over the
//!   last [`LAST`] creates, when the node already holds the others;
//! - the memory of an idle kernel: the server's descendants that appeared
//!   while the kernels were created (`smaps_rollup` PSS and private), and
//!   their cgroups' `memory.current`, divided by the count; idle kernels per
//!   GiB from the PSS;
//! - scenario A's py hello (`/v1/exec`) while the kernels sit idle, with
//!   the same hello before they were created as the baseline column: a
//!   busy node should not slow down. Measured twice: right after the
//!   creates (and the memory read), and again after [`PACED`] paced
//!   creates and [`QUIET`] more, so what the creates left running in the
//!   background is told apart from what the idle kernels cost;
//! - creates as people make them at full density: [`PACED`] sessions
//!   created, evaluated once and deleted, [`PACE`] apart (the back-to-back
//!   creates above outrun any pool of kernels started ahead).
//!
//! Every kernel is deleted again at the end of a run, failed or not.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::json;

use crate::client::KilnClient;
use crate::machine;
use crate::measure::{RunOutcome, Sample};
use crate::report::{Better, Metric, Tally, Unit};
use crate::scenarios::{Ctx, Measured, expect_hello};
use crate::stats::Latencies;
use crate::workload;

/// The creates the latency percentiles are taken over: the last ones, at
/// full density.
pub const LAST: usize = 100;

/// What the first evaluation runs and must print.
const FIRST_CODE: &str = "print(6 * 7)";
const FIRST_STDOUT: &str = "42";

/// How long the kernels sit idle before their memory is read.
const SETTLE: Duration = Duration::from_secs(3);

/// Creates made one at a time at full density, each deleted again.
pub const PACED: usize = 50;
/// The pause after each paced create's delete.
const PACE: Duration = Duration::from_millis(300);
/// How long the kernels sit idle after the paced creates before the
/// second hello.
const QUIET: Duration = Duration::from_secs(20);

/// One run's numbers.
#[derive(Default)]
struct DensityRun {
    /// Create → first output, ms, in creation order (successful ones).
    first_output: Vec<Duration>,
    /// The create request alone.
    create: Vec<Duration>,
    /// Paced creates at full density: create → first output, create.
    paced_first_output: Vec<Duration>,
    paced_create: Vec<Duration>,
    hello_before: RunOutcome,
    hello_during: RunOutcome,
    /// The hello again after the paced creates and [`QUIET`].
    hello_settled: RunOutcome,
    kernels: usize,
    pss_kib: u64,
    private_kib: u64,
    processes: u32,
    cgroups: usize,
    cgroup_bytes: u64,
    tally: Tally,
}

/// `n` sequential py hellos through `/v1/exec`.
async fn hellos(kiln: &KilnClient, n: usize) -> RunOutcome {
    let body = json!({"lang": "py", "code": workload::PY_HELLO});
    let mut out = RunOutcome::default();
    let start = Instant::now();
    for _ in 0..n {
        let r = async {
            let (took, r) = kiln.exec(&body).await?;
            expect_hello(&r)?;
            Ok(Sample::single(took))
        }
        .await;
        out.record(r);
    }
    out.wall = start.elapsed();
    out
}

/// Creates one kernel and evaluates its first cell: (create → first
/// output, create alone), and its id once it exists.
async fn create_one(kiln: &KilnClient) -> (Option<String>, anyhow::Result<(Duration, Duration)>) {
    let t0 = Instant::now();
    let (create, id) = match kiln.create_session("py").await {
        Ok(c) => c,
        Err(e) => return (None, Err(e)),
    };
    let r = async {
        let (_, stdout) = kiln.session_exec(&id, FIRST_CODE).await?;
        if stdout.trim_end() != FIRST_STDOUT {
            bail!("first evaluation printed {stdout:?}, not {FIRST_STDOUT}");
        }
        Ok((t0.elapsed(), create))
    }
    .await;
    (Some(id), r)
}

fn fail(t: &mut Tally, e: &anyhow::Error) {
    t.failed += 1;
    if t.first_error.is_none() {
        t.first_error = Some(format!("{e:#}"));
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

async fn one_run(ctx: &Ctx<'_>, run: usize) -> DensityRun {
    let s = ctx.settings;
    let kiln = ctx.kiln;
    let mut d = DensityRun {
        hello_before: hellos(kiln, s.a_requests).await,
        ..DensityRun::default()
    };
    tokio::time::sleep(SETTLE).await;
    let before = ctx.server_pid.map(machine::descendant_pids);
    eprintln!(
        "[K] run {}: creating {} py kernels (load average {})",
        run + 1,
        s.k_kernels,
        load_average()
    );
    let mut ids = Vec::with_capacity(s.k_kernels);
    for i in 0..s.k_kernels {
        d.tally.attempted += 1;
        let (id, r) = create_one(kiln).await;
        ids.extend(id);
        match r {
            Ok((first, create)) => {
                d.first_output.push(first);
                d.create.push(create);
            }
            Err(e) => fail(&mut d.tally, &e),
        }
        if (i + 1) % 100 == 0 {
            eprintln!("[K]   {} kernels (load average {})", i + 1, load_average());
        }
    }
    d.kernels = ids.len();
    tokio::time::sleep(SETTLE).await;
    if let (Some(pid), Some(before)) = (ctx.server_pid, before) {
        let new: Vec<u32> = machine::descendant_pids(pid)
            .into_iter()
            .filter(|p| before.binary_search(p).is_err())
            .collect();
        let m = machine::memory_of(&new);
        (d.processes, d.pss_kib, d.private_kib) = (m.processes, m.pss_kib, m.private_kib);
        (d.cgroups, d.cgroup_bytes) = machine::cgroups_memory(&new);
    }
    eprintln!(
        "[K] run {}: {} kernels idle; hello while they sit (load average {})",
        run + 1,
        d.kernels,
        load_average()
    );
    d.hello_during = hellos(kiln, s.a_requests).await;
    eprintln!("[K] run {}: {PACED} creates {PACE:?} apart", run + 1);
    for _ in 0..PACED {
        d.tally.attempted += 1;
        let (id, r) = create_one(kiln).await;
        match r {
            Ok((first, create)) => {
                d.paced_first_output.push(first);
                d.paced_create.push(create);
            }
            Err(e) => fail(&mut d.tally, &e),
        }
        if let Some(id) = id
            && let Err(e) = kiln.delete_session(&id).await
        {
            d.tally.attempted += 1;
            fail(&mut d.tally, &e);
        }
        tokio::time::sleep(PACE).await;
    }
    tokio::time::sleep(QUIET).await;
    eprintln!(
        "[K] run {}: hello again after {QUIET:?} more (load average {})",
        run + 1,
        load_average()
    );
    d.hello_settled = hellos(kiln, s.a_requests).await;
    for id in &ids {
        if let Err(e) = kiln.delete_session(id).await {
            d.tally.attempted += 1;
            fail(&mut d.tally, &e);
        }
    }
    eprintln!(
        "[K] run {}: {} kernels deleted (load average {})",
        run + 1,
        ids.len(),
        load_average()
    );
    d
}

/// A percentile of the last [`LAST`] samples.
fn last_percentile(v: &[Duration], p: f64) -> Option<f64> {
    let from = v.len().saturating_sub(LAST);
    Latencies::from_durations(&v[from..]).percentile(p)
}

/// Memory per kernel, MiB.
fn per_kernel_mib(kib: u64, kernels: usize) -> Option<f64> {
    (kernels > 0 && kib > 0).then(|| kib as f64 / 1024.0 / kernels as f64)
}

/// K: `k_kernels` idle kernels per run, `runs` runs.
pub async fn density(ctx: &Ctx<'_>) -> anyhow::Result<Measured> {
    let s = ctx.settings;
    // warm the paths once: the templates, a kernel's slot, the pool
    for _ in 0..s.warmup.min(5) {
        if let (Some(id), _) = create_one(ctx.kiln).await {
            ctx.kiln.delete_session(&id).await?;
        }
    }
    hellos(ctx.kiln, s.warmup).await;
    let before = ctx.phases().await;
    let mut runs = Vec::with_capacity(s.runs);
    for run in 0..s.runs {
        runs.push(one_run(ctx, run).await);
    }
    let phases = crate::prom::delta(&before, &ctx.phases().await);
    let each = |f: &dyn Fn(&DensityRun) -> Option<f64>| runs.iter().map(f).collect::<Vec<_>>();
    let kiln_only = |name: &str, unit: Unit, better: Better, v: Vec<Option<f64>>| {
        Metric::new(name, unit, better, v, Vec::new())
    };
    let mut metrics = Vec::new();
    let last = LAST.min(s.k_kernels);
    for p in [50.0, 95.0, 99.0] {
        metrics.push(kiln_only(
            &format!("create → first output p{p:.0}, last {last}"),
            Unit::Ms,
            Better::Lower,
            each(&|d| last_percentile(&d.first_output, p)),
        ));
    }
    for p in [50.0, 95.0] {
        metrics.push(kiln_only(
            &format!("create alone p{p:.0}, last {last}"),
            Unit::Ms,
            Better::Lower,
            each(&|d| last_percentile(&d.create, p)),
        ));
    }
    for p in [50.0, 95.0] {
        metrics.push(kiln_only(
            &format!("create → first output p{p:.0}, {PACED} paced at full density"),
            Unit::Ms,
            Better::Lower,
            each(&|d| Latencies::from_durations(&d.paced_first_output).percentile(p)),
        ));
        metrics.push(kiln_only(
            &format!("create alone p{p:.0}, {PACED} paced at full density"),
            Unit::Ms,
            Better::Lower,
            each(&|d| Latencies::from_durations(&d.paced_create).percentile(p)),
        ));
    }
    metrics.push(kiln_only(
        "create → first output p50, all",
        Unit::Ms,
        Better::Lower,
        each(&|d| Latencies::from_durations(&d.first_output).percentile(50.0)),
    ));
    metrics.push(kiln_only(
        "idle kernels",
        Unit::Count,
        Better::Higher,
        each(&|d| Some(d.kernels as f64)),
    ));
    metrics.push(kiln_only(
        "processes per kernel",
        Unit::Count,
        Better::Lower,
        each(&|d| (d.kernels > 0).then(|| f64::from(d.processes) / d.kernels as f64)),
    ));
    metrics.push(kiln_only(
        "memory per idle kernel, PSS",
        Unit::Mib,
        Better::Lower,
        each(&|d| per_kernel_mib(d.pss_kib, d.kernels)),
    ));
    metrics.push(kiln_only(
        "memory per idle kernel, private",
        Unit::Mib,
        Better::Lower,
        each(&|d| per_kernel_mib(d.private_kib, d.kernels)),
    ));
    metrics.push(kiln_only(
        "memory per idle kernel, cgroup memory.current",
        Unit::Mib,
        Better::Lower,
        each(&|d| per_kernel_mib(d.cgroup_bytes / 1024, d.kernels)),
    ));
    metrics.push(kiln_only(
        "idle kernels per GiB (PSS)",
        Unit::Count,
        Better::Higher,
        each(&|d| per_kernel_mib(d.pss_kib, d.kernels).map(|m| 1024.0 / m)),
    ));
    metrics.push(kiln_only(
        "kernel cgroups",
        Unit::Count,
        Better::Higher,
        each(&|d| Some(d.cgroups as f64)),
    ));
    let hello_during: fn(&DensityRun) -> &RunOutcome = |d| &d.hello_during;
    let hello_settled: fn(&DensityRun) -> &RunOutcome = |d| &d.hello_settled;
    for (when, hello) in [("", hello_during), (", later", hello_settled)] {
        for p in [50.0, 95.0] {
            metrics.push(Metric::new(
                &format!("py hello p{p:.0} with the kernels idle{when}"),
                Unit::Ms,
                Better::Lower,
                each(&|d| Latencies::from_durations(&hello(d).latencies).percentile(p)),
                each(&|d| Latencies::from_durations(&d.hello_before.latencies).percentile(p)),
            ));
        }
    }
    let mut kiln = Tally::default();
    let mut baseline = Tally::default();
    for d in runs {
        kiln.absorb(d.tally);
        kiln.absorb(d.hello_during.tally);
        kiln.absorb(d.hello_settled.tally);
        baseline.absorb(d.hello_before.tally);
    }
    Ok(Measured {
        kiln,
        baseline,
        metrics,
        phases,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_taken_over_the_last_creates_only() {
        let v: Vec<Duration> = (1..=300).map(Duration::from_millis).collect();
        assert_eq!(last_percentile(&v, 50.0), Some(250.0));
        assert_eq!(last_percentile(&v, 99.0), Some(299.0));
        let few: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        assert_eq!(last_percentile(&few, 50.0), Some(5.0));
        assert_eq!(last_percentile(&[], 50.0), None);
    }

    #[test]
    fn memory_per_kernel_needs_kernels_and_memory() {
        assert_eq!(per_kernel_mib(10 * 1024, 5), Some(2.0));
        assert_eq!(per_kernel_mib(0, 5), None);
        assert_eq!(per_kernel_mib(1024, 0), None);
    }
}
