//! The five scenarios. Each warms up both sides, then alternates a measured
//! Kiln run and a measured baseline run `runs` times, verifies every answer,
//! and reduces the per-run statistics to their medians. The server's phase
//! timings are scraped around the measured runs.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::baseline::{self, AnalysisDir, ScriptDir, SumDir};
use crate::client::{ExecResponse, KilnClient, file_ref};
use crate::machine;
use crate::measure::{RunOutcome, Sample, Tickets, baseline_workers, kiln_workers};
use crate::prom::{self, Phases};
use crate::report::{Better, Metric, ScenarioReport, Tally, Unit};
use crate::settings::{Scenario, Settings};
use crate::stats::{Latencies, per_second, percent};
use crate::workload::{self, SplitMix64};

/// What every scenario needs.
pub struct Ctx<'a> {
    pub settings: &'a Settings,
    pub kiln: &'a KilnClient,
    /// The server's pid when this run started it (its processes can be
    /// weighed).
    pub server_pid: Option<u32>,
    /// The fork-servers' CPU (template → ms, reaped programs included) at
    /// each [`Ctx::phases`] scrape: a scenario's scrapes bracket its
    /// measured runs.
    pub template_cpu: std::sync::Mutex<Vec<BTreeMap<String, f64>>>,
}

impl Ctx<'_> {
    /// The server's phase totals now (empty, with a warning, if unavailable);
    /// notes the fork-servers' CPU at the same moment.
    pub async fn phases(&self) -> Phases {
        match self.kiln.metrics().await {
            Ok(text) => {
                let cpu = prom::parse_zygote_pids(&text)
                    .into_iter()
                    .filter_map(|(t, pid)| Some((t, machine::cpu_ms_with_reaped_children(pid)?)))
                    .collect();
                self.template_cpu
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(cpu);
                prom::parse_phases(&text)
            }
            Err(e) => {
                eprintln!("warning: cannot scrape metrics: {e:#}");
                Phases::new()
            }
        }
    }

    /// CPU per template between the first and the last scrape since
    /// `mark` (the count of scrapes before the scenario).
    fn template_cpu_since(&self, mark: usize) -> BTreeMap<String, f64> {
        let all = self.template_cpu.lock().unwrap_or_else(|p| p.into_inner());
        let (Some(first), Some(last)) = (all.get(mark), all.last()) else {
            return BTreeMap::new();
        };
        last.iter()
            .filter_map(|(t, after)| Some((t.clone(), after - first.get(t)?)))
            .collect()
    }

    fn scrapes(&self) -> usize {
        self.template_cpu
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// Run one scenario. A scenario that cannot even start (e.g. its upload is
/// refused) is reported with one failure and no metrics.
pub async fn run(sc: Scenario, ctx: &Ctx<'_>) -> ScenarioReport {
    let (id, title, baseline) = describe(sc, ctx.settings);
    let mark = ctx.scrapes();
    let result = match sc {
        Scenario::A => {
            hello(
                ctx,
                "A",
                "py",
                workload::PY_HELLO,
                1,
                ctx.settings.a_requests,
            )
            .await
        }
        Scenario::B => analysis(ctx).await,
        Scenario::B2 => snippets(ctx).await,
        Scenario::C => {
            let (clients, total) = (ctx.settings.c_clients, ctx.settings.c_requests);
            hello(ctx, "C", "py", workload::PY_HELLO, clients, total).await
        }
        Scenario::D => upload_and_sum(ctx).await,
        Scenario::S => stateful(ctx).await,
        Scenario::P => crate::person::person(ctx).await,
        Scenario::K => crate::density::density(ctx).await,
        Scenario::E => {
            hello(
                ctx,
                "E",
                "js",
                workload::JS_HELLO,
                1,
                ctx.settings.e_requests,
            )
            .await
        }
    };
    let (kiln, baseline_tally, metrics, phases) = match result {
        Ok(m) => (m.kiln, m.baseline, m.metrics, m.phases),
        Err(e) => {
            eprintln!("[{id}] aborted: {e:#}");
            let t = Tally {
                attempted: 1,
                failed: 1,
                first_error: Some(format!("scenario aborted: {e:#}")),
            };
            (t, Tally::default(), Vec::new(), Phases::new())
        }
    };
    ScenarioReport {
        id: id.to_owned(),
        title,
        baseline,
        runs: ctx.settings.runs,
        kiln,
        baseline_tally,
        metrics,
        phases,
        template_cpu_ms: ctx.template_cpu_since(mark),
    }
}

/// Scenario id, title and what its baseline measures.
fn describe(sc: Scenario, s: &Settings) -> (&'static str, String, String) {
    let py = s.bare_python().describe();
    let node = s.bare_node().describe();
    match sc {
        Scenario::A => (
            "A",
            "py hello, 1 client".into(),
            format!(
                "`{py} -c \"print('hello')\"` spawned directly (clean env), {} times",
                s.a_requests
            ),
        ),
        Scenario::B => (
            "B",
            "pandas CSV + plot, 1 client".into(),
            format!(
                "the same script run by `{py}` in a temp dir holding the 1,000-row CSV, {} times",
                s.b_requests
            ),
        ),
        Scenario::B2 => (
            "B2",
            "seaborn, scikit-learn, statsmodels, scipy + sympy snippets, 1 client".into(),
            format!(
                "each snippet run by `{py}` in a temp dir, {} times per snippet",
                s.b2_requests
            ),
        ),
        Scenario::C => (
            "C",
            format!("py hello, {} clients", s.c_clients),
            format!(
                "{} parallel threads spawning `{py} -c \"print('hello')\"`, {} in total",
                s.c_clients, s.c_requests
            ),
        ),
        Scenario::D => (
            "D",
            format!("{} users × {} upload+exec", s.d_users, s.d_requests),
            format!(
                "{} parallel threads, each writing its numbers file and spawning `{py} -c <sum>` {} times",
                s.d_users, s.d_requests
            ),
        ),
        Scenario::S => (
            "S",
            format!(
                "{} users × {} stateful requests (seed 004's face)",
                s.s_users, s.s_requests
            ),
            format!(
                "the same {} requests as one-shot `/v1/exec` runs through the same server (each program rebuilds the state), {} users in parallel",
                s.s_users * s.s_requests,
                s.s_users
            ),
        ),
        Scenario::P => (
            "P",
            format!(
                "a person: py hello with pauses of {} ms, hello after a data run, js after py; 1 client, a new connection per request, {} measured requests per sequence",
                crate::person::PAUSES_MS.map(|p| p.to_string()).join("/"),
                s.p_requests
            ),
            format!(
                "the same sequences as bare spawns of `{py}` and `{node}` with the same pauses",
            ),
        ),
        Scenario::K => (
            "K",
            format!(
                "live-kernel density: {} idle py kernels, each created and verified with a first evaluation",
                s.k_kernels
            ),
            format!(
                "the same py hellos ({} per run) before the kernels were created",
                s.a_requests
            ),
        ),
        Scenario::E => (
            "E",
            "js hello, 1 client".into(),
            format!(
                "`{node} -e \"console.log('hello')\"` spawned directly (clean env), {} times",
                s.e_requests
            ),
        ),
    }
}

/// A scenario's measured outcome.
pub(crate) struct Measured {
    pub(crate) kiln: Tally,
    pub(crate) baseline: Tally,
    pub(crate) metrics: Vec<Metric>,
    pub(crate) phases: Phases,
}

/// Per-run outcomes of both sides.
#[derive(Default)]
pub(crate) struct Runs {
    pub(crate) kiln: Vec<RunOutcome>,
    pub(crate) baseline: Vec<RunOutcome>,
}

impl Runs {
    pub(crate) fn push(
        &mut self,
        id: &str,
        run: usize,
        total: usize,
        kiln: RunOutcome,
        baseline: RunOutcome,
    ) {
        let p50 = |o: &RunOutcome| {
            crate::report::fmt_value(
                Latencies::from_durations(&o.latencies).percentile(50.0),
                Unit::Ms,
            )
        };
        eprintln!(
            "[{id}] run {}/{total}: kiln p50 {} ({} ok, {} failed, {:.1}s) | baseline p50 {} ({} ok, {} failed, {:.1}s)",
            run + 1,
            p50(&kiln),
            kiln.ok(),
            kiln.tally.failed,
            kiln.wall.as_secs_f64(),
            p50(&baseline),
            baseline.ok(),
            baseline.tally.failed,
            baseline.wall.as_secs_f64(),
        );
        if let Some(e) = &kiln.tally.first_error {
            eprintln!("[{id}]   kiln failure: {e}");
        }
        if let Some(e) = &baseline.tally.first_error {
            eprintln!("[{id}]   baseline failure: {e}");
        }
        self.kiln.push(kiln);
        self.baseline.push(baseline);
    }

    /// A statistic of each run, both sides.
    fn metric(
        &self,
        name: &str,
        unit: Unit,
        better: Better,
        f: impl Fn(&RunOutcome) -> Option<f64>,
    ) -> Metric {
        Metric::new(
            name,
            unit,
            better,
            self.kiln.iter().map(&f).collect(),
            self.baseline.iter().map(&f).collect(),
        )
    }

    pub(crate) fn latency(&self, name: &str, p: f64) -> Metric {
        self.metric(name, Unit::Ms, Better::Lower, |o| {
            Latencies::from_durations(&o.latencies).percentile(p)
        })
    }

    pub(crate) fn verified(&self) -> Metric {
        self.metric("verified", Unit::Percent, Better::Higher, |o| {
            percent(o.ok(), o.tally.attempted)
        })
    }

    pub(crate) fn into_measured(self, metrics: Vec<Metric>, phases: Phases) -> Measured {
        let mut kiln = Tally::default();
        let mut baseline = Tally::default();
        for o in self.kiln {
            kiln.absorb(o.tally);
        }
        for o in self.baseline {
            baseline.absorb(o.tally);
        }
        Measured {
            kiln,
            baseline,
            metrics,
            phases,
        }
    }
}

/// Check a hello world's answer.
pub(crate) fn expect_hello(r: &ExecResponse) -> anyhow::Result<()> {
    if r.stdout.trim_end() != workload::HELLO_STDOUT {
        bail!(
            "expected stdout \"hello\", got {:?}; stderr: {:?}",
            r.stdout,
            r.stderr.chars().take(300).collect::<String>()
        );
    }
    Ok(())
}

/// Run a baseline loop without stalling the async runtime's other work.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// A, C and E: a hello world by `clients` concurrent clients, `total`
/// requests per run. C reports throughput, A and E latency percentiles.
async fn hello(
    ctx: &Ctx<'_>,
    id: &str,
    lang: &str,
    code: &str,
    clients: usize,
    total: usize,
) -> anyhow::Result<Measured> {
    let s = ctx.settings;
    let body = json!({"lang": lang, "code": code});
    let body = &body;
    let kiln = ctx.kiln;
    let kiln_one = move |_: usize, _: usize| async move {
        let (took, r) = kiln.exec(body).await?;
        expect_hello(&r)?;
        Ok(Sample::single(took))
    };
    let (node, python) = (s.bare_node(), s.bare_python());
    let (node, python) = (&node, &python);
    let base_one = move |_: usize, _: usize| {
        if lang == "js" {
            baseline::js_hello(node)
        } else {
            baseline::py_hello(python)
        }
    };

    if s.warmup > 0 {
        kiln_workers(clients, Tickets::shared(s.warmup.max(clients)), &kiln_one).await;
        blocking(|| baseline_workers(clients, Tickets::shared(s.warmup.max(clients)), base_one));
    }
    let before = ctx.phases().await;
    let mut runs = Runs::default();
    for run in 0..s.runs {
        let k = kiln_workers(clients, Tickets::shared(total), &kiln_one).await;
        let b = blocking(|| baseline_workers(clients, Tickets::shared(total), base_one));
        runs.push(id, run, s.runs, k, b);
    }
    let phases = prom::delta(&before, &ctx.phases().await);
    let metrics = if id == "C" {
        vec![
            runs.metric("throughput", Unit::PerSecond, Better::Higher, |o| {
                per_second(o.ok(), o.wall)
            }),
            runs.latency("p50 latency", 50.0),
            runs.latency("p99 latency", 99.0),
            runs.verified(),
        ]
    } else {
        vec![
            runs.latency("p50 latency", 50.0),
            runs.latency("p95 latency", 95.0),
            runs.latency("p99 latency", 99.0),
            runs.verified(),
        ]
    };
    Ok(runs.into_measured(metrics, phases))
}

/// B: pandas reads the uploaded CSV, plots it, prints a column total.
async fn analysis(ctx: &Ctx<'_>) -> anyhow::Result<Measured> {
    let s = ctx.settings;
    let expected = workload::csv_expected_sum().to_string();
    let (_, up) = ctx
        .kiln
        .upload("bench", workload::CSV_NAME, workload::csv().into_bytes())
        .await
        .context("upload the CSV")?;
    let body = json!({
        "lang": "py",
        "code": workload::ANALYSIS_SCRIPT,
        "files": [file_ref(&up, workload::CSV_NAME, "bench")],
        "user_id": "bench",
    });
    let (body, expected) = (&body, expected.as_str());
    let kiln = ctx.kiln;
    let kiln_one = move |_: usize, _: usize| async move {
        let (took, r) = kiln.exec(body).await?;
        if r.stdout.trim_end() != expected {
            bail!(
                "expected stdout {expected:?}, got {:?}; stderr: {:?}",
                r.stdout,
                r.stderr.chars().take(500).collect::<String>()
            );
        }
        if !r.files.iter().any(|f| f.name == workload::PLOT_NAME) {
            let names: Vec<&str> = r.files.iter().map(|f| f.name.as_str()).collect();
            bail!("{} missing from files {names:?}", workload::PLOT_NAME);
        }
        Ok(Sample::single(took))
    };
    let python = &s.bare_python();
    let dir = AnalysisDir::new(python)?;
    let base_one = |_: usize, _: usize| dir.run(python);

    let warmup = s.warmup.min(2);
    if warmup > 0 {
        kiln_workers(1, Tickets::shared(warmup), &kiln_one).await;
        blocking(|| baseline_workers(1, Tickets::shared(warmup), base_one));
    }
    let before = ctx.phases().await;
    let mut runs = Runs::default();
    for run in 0..s.runs {
        let k = kiln_workers(1, Tickets::shared(s.b_requests), &kiln_one).await;
        let b = blocking(|| baseline_workers(1, Tickets::shared(s.b_requests), base_one));
        runs.push("B", run, s.runs, k, b);
    }
    let phases = prom::delta(&before, &ctx.phases().await);
    let metrics = vec![
        runs.latency("p50 latency", 50.0),
        runs.latency("p95 latency", 95.0),
        runs.latency("p99 latency", 99.0),
        runs.verified(),
    ];
    Ok(runs.into_measured(metrics, phases))
}

/// B2: each analysis snippet, one client; per snippet a p50 latency. Kiln's
/// answer must equal the baseline's (same script, same machine).
async fn snippets(ctx: &Ctx<'_>) -> anyhow::Result<Measured> {
    let s = ctx.settings;
    let python = &s.bare_python();
    let mut metrics = Vec::new();
    let mut all = Runs::default();
    let before = ctx.phases().await;
    for (name, script, output) in workload::SNIPPETS {
        let dir = ScriptDir::new(python, script, *output)?;
        let (_, expected) =
            blocking(|| dir.run(python)).with_context(|| format!("{name}: baseline"))?;
        let body = json!({"lang": "py", "code": script});
        let (body, expected) = (&body, expected.as_str());
        let kiln = ctx.kiln;
        let kiln_one = move |_: usize, _: usize| async move {
            let (took, r) = kiln.exec(body).await?;
            if r.stdout != expected {
                bail!(
                    "{name}: expected stdout {expected:?}, got {:?}; stderr: {:?}",
                    r.stdout,
                    r.stderr.chars().take(500).collect::<String>()
                );
            }
            if let Some(file) = output
                && !r.files.iter().any(|f| f.name == *file)
            {
                bail!("{name}: {file} missing from the files");
            }
            Ok(Sample::single(took))
        };
        let base_one = |_: usize, _: usize| dir.run(python).map(|(sample, _)| sample);
        let warmup = s.warmup.min(1);
        if warmup > 0 {
            kiln_workers(1, Tickets::shared(warmup), &kiln_one).await;
        }
        let mut runs = Runs::default();
        for run in 0..s.runs {
            let k = kiln_workers(1, Tickets::shared(s.b2_requests), &kiln_one).await;
            let b = blocking(|| baseline_workers(1, Tickets::shared(s.b2_requests), base_one));
            runs.push("B2", run, s.runs, k, b);
        }
        metrics.push(runs.latency(&format!("{name} p50"), 50.0));
        all.kiln.append(&mut runs.kiln);
        all.baseline.append(&mut runs.baseline);
    }
    let phases = prom::delta(&before, &ctx.phases().await);
    metrics.push(all.verified());
    Ok(all.into_measured(metrics, phases))
}

/// D, Kiln side: one upload + exec pair of user `user`, verified.
async fn kiln_pair(
    kiln: &KilnClient,
    seed: u64,
    run: usize,
    user: usize,
    request: usize,
) -> anyhow::Result<Sample> {
    let numbers = workload::numbers(&mut SplitMix64::for_request(seed, run, user, request));
    let user_id = format!("user{user}");
    let t = Instant::now();
    let (_, up) = kiln
        .upload(
            &user_id,
            workload::NUMBERS_NAME,
            numbers.contents.into_bytes(),
        )
        .await?;
    let body: Value = json!({
        "lang": "py",
        "code": workload::SUM_SCRIPT,
        "files": [file_ref(&up, workload::NUMBERS_NAME, &user_id)],
        "user_id": user_id,
    });
    let (exec, r) = kiln.exec(&body).await?;
    let pair = t.elapsed();
    if r.stdout.trim_end() != numbers.expected.to_string() {
        bail!(
            "{user_id} request {request}: expected {}, got stdout {:?}; stderr: {:?}",
            numbers.expected,
            r.stdout,
            r.stderr.chars().take(300).collect::<String>()
        );
    }
    Ok(Sample {
        latency: exec,
        pair: Some(pair),
    })
}

/// D: `d_users` concurrent users, each uploading a fresh random numbers file
/// and running a program that sums it, `d_requests` times in sequence.
async fn upload_and_sum(ctx: &Ctx<'_>) -> anyhow::Result<Measured> {
    let s = ctx.settings;
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_nanos() as u64;
    let kiln = ctx.kiln;
    let python = &s.bare_python();
    let dirs = (0..s.d_users)
        .map(|_| SumDir::new(python))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let dirs = &dirs;
    let base_seed = seed ^ 0x5EED_0000_0000_0000;
    let base_one = move |run: usize| {
        move |user: usize, request: usize| -> anyhow::Result<Sample> {
            let numbers =
                workload::numbers(&mut SplitMix64::for_request(base_seed, run, user, request));
            let dir = dirs.get(user).context("no directory for this user")?;
            dir.run(python, &numbers)
        }
    };

    if s.warmup > 0 {
        let warm_run = s.runs; // an index no measured run uses
        kiln_workers(s.d_users, Tickets::PerWorker(1), |u, i| {
            kiln_pair(kiln, seed, warm_run, u, i)
        })
        .await;
        blocking(|| baseline_workers(s.d_users, Tickets::PerWorker(1), base_one(warm_run)));
    }
    let before = ctx.phases().await;
    let mut runs = Runs::default();
    for run in 0..s.runs {
        let k = kiln_workers(s.d_users, Tickets::PerWorker(s.d_requests), |u, i| {
            kiln_pair(kiln, seed, run, u, i)
        })
        .await;
        let b = blocking(|| {
            baseline_workers(s.d_users, Tickets::PerWorker(s.d_requests), base_one(run))
        });
        runs.push("D", run, s.runs, k, b);
    }
    let phases = prom::delta(&before, &ctx.phases().await);
    let mut http = runs.metric(
        "HTTP requests/s (upload+exec)",
        Unit::PerSecond,
        Better::Higher,
        |o| per_second(2 * o.ok(), o.wall),
    );
    // the baseline makes no HTTP requests
    http = Metric::new(
        &http.name,
        http.unit,
        http.better,
        http.kiln_runs,
        vec![None; s.runs],
    );
    let metrics = vec![
        runs.metric(
            "exec requests/s (= pairs/s)",
            Unit::PerSecond,
            Better::Higher,
            |o| per_second(o.ok(), o.wall),
        ),
        http,
        runs.latency("p95 exec latency", 95.0),
        runs.metric("p95 upload+exec pair", Unit::Ms, Better::Lower, |o| {
            Latencies::from_durations(&o.pairs).percentile(95.0)
        }),
        runs.verified(),
    ];
    Ok(runs.into_measured(metrics, phases))
}

/// S, stateful side: request `i` of `user` through seed 004's face,
/// verified against what the state built so far must print.
async fn stateful_one(kiln: &KilnClient, user: &str, i: usize) -> anyhow::Result<Sample> {
    let (took, text) = kiln.stateful(user, &workload::stateful_step(i)).await?;
    let expected = workload::stateful_expected(i);
    if text.trim_end() != expected {
        bail!("{user} request {i}: expected {expected:?}, got {text:?}");
    }
    Ok(Sample::single(took))
}

/// S, one-shot side: the same request as a `/v1/exec` run.
async fn oneshot_one(kiln: &KilnClient, i: usize) -> anyhow::Result<Sample> {
    let body = json!({"lang": "py", "code": workload::stateless_step(i)});
    let (took, r) = kiln.exec(&body).await?;
    let expected = workload::stateful_expected(i);
    if r.stdout.trim_end() != expected {
        bail!(
            "one-shot request {i}: expected {expected:?}, got {:?}; stderr: {:?}",
            r.stdout,
            r.stderr.chars().take(300).collect::<String>()
        );
    }
    Ok(Sample::single(took))
}

/// S: `s_users` concurrent users, each sending `s_requests` sequential
/// requests to its own live kernel through seed 004's face, every one
/// building on the last and verified; next to it, the same requests as
/// one-shot `/v1/exec` runs (in the baseline column). Each run starts with
/// fresh kernels (their start is in the first request's latency) and
/// releases them at its end.
async fn stateful(ctx: &Ctx<'_>) -> anyhow::Result<Measured> {
    let s = ctx.settings;
    let kiln = ctx.kiln;
    let user = |run: usize, u: usize| format!("bench-s{run}-u{u}");
    let release_all = |run: usize| async move {
        for u in 0..s.s_users {
            kiln.release(&user(run, u)).await?;
        }
        anyhow::Ok(())
    };
    if s.warmup > 0 {
        let warm_run = s.runs; // an index no measured run uses
        let warm = s.warmup.min(s.s_requests);
        let o = kiln_workers(s.s_users, Tickets::PerWorker(warm), |u, i| {
            let name = user(warm_run, u);
            async move { stateful_one(kiln, &name, i).await }
        })
        .await;
        if let Some(e) = &o.tally.first_error {
            eprintln!("[S] warm-up failure: {e}");
        }
        release_all(warm_run).await?;
        kiln_workers(s.s_users, Tickets::PerWorker(1), |_, i| {
            oneshot_one(kiln, i)
        })
        .await;
    }
    let before = ctx.phases().await;
    let mut runs = Runs::default();
    for run in 0..s.runs {
        let k = kiln_workers(s.s_users, Tickets::PerWorker(s.s_requests), |u, i| {
            let name = user(run, u);
            async move { stateful_one(kiln, &name, i).await }
        })
        .await;
        release_all(run).await?;
        let b = kiln_workers(s.s_users, Tickets::PerWorker(s.s_requests), |_, i| {
            oneshot_one(kiln, i)
        })
        .await;
        runs.push("S", run, s.runs, k, b);
    }
    let phases = prom::delta(&before, &ctx.phases().await);
    let metrics = vec![
        runs.metric("requests/s", Unit::PerSecond, Better::Higher, |o| {
            per_second(o.ok(), o.wall)
        }),
        runs.latency("p50 latency", 50.0),
        runs.latency("p95 latency", 95.0),
        runs.latency("p99 latency", 99.0),
        runs.verified(),
    ];
    Ok(runs.into_measured(metrics, phases))
}

/// Whether `path` can be executed at all (checked before the baselines run).
pub fn check_runtime(path: &Path, what: &str) -> anyhow::Result<()> {
    if !path.is_file() {
        bail!("{what} {} not found (pass --python/--node)", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_answers_are_checked_exactly() {
        let ok = ExecResponse {
            stdout: "hello\n".into(),
            stderr: String::new(),
            files: vec![],
        };
        expect_hello(&ok).unwrap();
        let bad = ExecResponse {
            stdout: "hello world\n".into(),
            stderr: "x".into(),
            files: vec![],
        };
        assert!(expect_hello(&bad).is_err());
        let empty = ExecResponse {
            stdout: String::new(),
            stderr: String::new(),
            files: vec![],
        };
        assert!(expect_hello(&empty).is_err());
    }

    #[test]
    fn stateful_steps_and_their_one_shot_twins_expect_the_same_line() {
        assert_eq!(workload::stateful_expected(0), "1 1 0");
        assert_eq!(workload::stateful_expected(3), "4 4 6");
        assert!(workload::stateful_step(0).contains("pd.DataFrame"));
        assert!(workload::stateful_step(5).contains("items.append(5)"));
        assert!(workload::stateless_step(3).contains("list(range(4))"));
    }

    #[test]
    fn descriptions_name_the_configured_counts() {
        let s = Settings::resolve(<crate::settings::Cli as clap::Parser>::parse_from([
            "kiln-bench",
            "--d-users",
            "7",
        ]))
        .unwrap();
        let (id, title, base) = describe(Scenario::D, &s);
        assert_eq!(id, "D");
        assert_eq!(title, "7 users × 100 upload+exec");
        assert!(base.contains("7 parallel threads"), "{base}");
        let (_, title, _) = describe(Scenario::C, &s);
        assert_eq!(title, "py hello, 10 clients");
    }
}
