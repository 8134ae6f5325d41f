//! Scenario P: the latency a person sees. One client, a new connection per
//! request (as a chat backend calls), pauses between requests (a person
//! reads before sending the next cell), and mixed sequences (a hello right
//! after a data run, js right after py). The baseline runs the same sequence
//! of bare spawns with the same pauses in the same run, so CPU frequency and
//! idle wake-ups cost both sides alike. Only the hello requests are measured;
//! whatever work one run leaves behind (pool refill, workspace reset,
//! template switch) shows up in the next measured request.

use std::time::Duration;

use anyhow::bail;
use serde_json::json;

use crate::baseline::{self, Program, ScriptDir};
use crate::client::KilnClient;
use crate::measure::{RunOutcome, Sample};
use crate::prom;
use crate::report::Metric;
use crate::scenarios::{Ctx, Measured, Runs, blocking, expect_hello};
use crate::workload;

/// Pauses (ms) between the requests of the paced sequences.
pub const PAUSES_MS: [u64; 4] = [0, 50, 300, 1000];

/// The pause a person takes between the unmeasured and the measured
/// request of a mixed sequence, and after the measured one.
const MIXED_PAUSE: Duration = Duration::from_millis(300);

/// One measured sequence of scenario P.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sequence {
    /// `print('hello')`, this many ms between requests.
    Paced(u64),
    /// A pandas + matplotlib run, then the measured py hello.
    HelloAfterData,
    /// A py hello, then the measured js hello.
    JsAfterPy,
}

impl Sequence {
    pub fn all() -> Vec<Sequence> {
        let mut v: Vec<Sequence> = PAUSES_MS.iter().map(|&p| Sequence::Paced(p)).collect();
        v.extend([Sequence::HelloAfterData, Sequence::JsAfterPy]);
        v
    }

    /// The metric name's prefix.
    pub fn label(self) -> String {
        match self {
            Sequence::Paced(ms) => format!("pause {ms} ms"),
            Sequence::HelloAfterData => "hello after data".into(),
            Sequence::JsAfterPy => "js after py".into(),
        }
    }
}

/// The Kiln side of one sequence: `n` measured requests.
async fn kiln_sequence(kiln: &KilnClient, seq: Sequence, n: usize) -> RunOutcome {
    let py = json!({"lang": "py", "code": workload::PY_HELLO});
    let js = json!({"lang": "js", "code": workload::JS_HELLO});
    let data = json!({"lang": "py", "code": workload::DATA_RUN_SCRIPT});
    let mut out = RunOutcome::default();
    let start = std::time::Instant::now();
    for _ in 0..n {
        let r: anyhow::Result<Sample> = async {
            let measured = match seq {
                Sequence::Paced(_) => &py,
                Sequence::HelloAfterData => {
                    let (_, r) = kiln.exec(&data).await?;
                    if r.stdout.trim_end() != workload::DATA_RUN_STDOUT {
                        bail!(
                            "data run: unexpected stdout {:?}; stderr {:?}",
                            r.stdout,
                            r.stderr
                        );
                    }
                    tokio::time::sleep(MIXED_PAUSE).await;
                    &py
                }
                Sequence::JsAfterPy => {
                    let (_, r) = kiln.exec(&py).await?;
                    expect_hello(&r)?;
                    tokio::time::sleep(MIXED_PAUSE).await;
                    &js
                }
            };
            let (took, r) = kiln.exec(measured).await?;
            expect_hello(&r)?;
            Ok(Sample::single(took))
        }
        .await;
        out.record(r);
        tokio::time::sleep(pause_after(seq)).await;
    }
    out.wall = start.elapsed();
    out
}

/// The baseline side of one sequence: the same programs as bare spawns.
fn baseline_sequence(
    python: &Program,
    node: &Program,
    data: &ScriptDir,
    seq: Sequence,
    n: usize,
) -> RunOutcome {
    let mut out = RunOutcome::default();
    let start = std::time::Instant::now();
    for _ in 0..n {
        let r = (|| match seq {
            Sequence::Paced(_) => baseline::py_hello(python),
            Sequence::HelloAfterData => {
                let (_, stdout) = data.run(python)?;
                if stdout.trim_end() != workload::DATA_RUN_STDOUT {
                    bail!("data run: unexpected stdout {stdout:?}");
                }
                std::thread::sleep(MIXED_PAUSE);
                baseline::py_hello(python)
            }
            Sequence::JsAfterPy => {
                baseline::py_hello(python)?;
                std::thread::sleep(MIXED_PAUSE);
                baseline::js_hello(node)
            }
        })();
        out.record(r);
        std::thread::sleep(pause_after(seq));
    }
    out.wall = start.elapsed();
    out
}

fn pause_after(seq: Sequence) -> Duration {
    match seq {
        Sequence::Paced(ms) => Duration::from_millis(ms),
        Sequence::HelloAfterData | Sequence::JsAfterPy => MIXED_PAUSE,
    }
}

/// P: every sequence, `p_requests` measured requests each, per run.
pub async fn person(ctx: &Ctx<'_>) -> anyhow::Result<Measured> {
    let s = ctx.settings;
    // a new connection per request: nothing idles in the pool
    let fresh = ctx.kiln.with_http(
        reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(300))
            .pool_max_idle_per_host(0)
            .build()?,
    );
    let (python, node) = (&s.bare_python(), &s.bare_node());
    let data = ScriptDir::new(python, workload::DATA_RUN_SCRIPT, None)?;
    let sequences = Sequence::all();
    // warm both sides' paths once (templates, page cache)
    for seq in [Sequence::HelloAfterData, Sequence::JsAfterPy] {
        kiln_sequence(&fresh, seq, 1).await;
        blocking(|| baseline_sequence(python, node, &data, seq, 1));
    }
    let before = ctx.phases().await;
    let mut per_seq: Vec<Runs> = sequences.iter().map(|_| Runs::default()).collect();
    for run in 0..s.runs {
        for (seq, runs) in sequences.iter().zip(per_seq.iter_mut()) {
            let k = kiln_sequence(&fresh, *seq, s.p_requests).await;
            let b = blocking(|| baseline_sequence(python, node, &data, *seq, s.p_requests));
            runs.push(&format!("P {}", seq.label()), run, s.runs, k, b);
        }
    }
    let phases = prom::delta(&before, &ctx.phases().await);
    let mut metrics: Vec<Metric> = Vec::new();
    let mut all = Runs::default();
    for (seq, mut runs) in sequences.into_iter().zip(per_seq) {
        metrics.push(runs.latency(&format!("{} p50", seq.label()), 50.0));
        metrics.push(runs.latency(&format!("{} p95", seq.label()), 95.0));
        all.kiln.append(&mut runs.kiln);
        all.baseline.append(&mut runs.baseline);
    }
    metrics.push(all.verified());
    Ok(all.into_measured(metrics, phases))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pause_and_both_mixed_sequences_are_measured_with_distinct_names() {
        let all = Sequence::all();
        assert_eq!(all.len(), PAUSES_MS.len() + 2);
        let mut labels: Vec<String> = all.iter().map(|s| s.label()).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), all.len());
        assert_eq!(pause_after(Sequence::Paced(50)), Duration::from_millis(50));
    }
}
