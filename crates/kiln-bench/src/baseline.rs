//! The baselines: the same programs run directly on the host, one process
//! per request, spawned with `std::process::Command` and a clean environment
//! (`env_clear()` + `PATH`), timed around spawn → exit with output read.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::measure::Sample;
use crate::workload;

/// The `PATH` of every baseline process.
pub const CLEAN_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Run `program args…` in `cwd` with a clean environment; the duration
/// covers spawn, run and reading its output.
pub fn spawn(
    program: &Path,
    args: &[&str],
    cwd: Option<&Path>,
) -> anyhow::Result<(Duration, Output)> {
    let mut cmd = Command::new(program);
    cmd.args(args).env_clear().env("PATH", CLEAN_PATH);
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    let t = Instant::now();
    let out = cmd
        .output()
        .with_context(|| format!("spawn {}", program.display()))?;
    let took = t.elapsed();
    Ok((took, out))
}

/// Fail unless the process exited 0 and its stdout (trailing newline
/// ignored) is exactly `want`.
pub fn expect_stdout(out: &Output, want: &str) -> anyhow::Result<()> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || stdout.trim_end() != want {
        bail!(
            "expected stdout {want:?}, got {:?} ({}); stderr: {}",
            stdout,
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .chars()
                .take(300)
                .collect::<String>()
        );
    }
    Ok(())
}

/// Scenarios A/C: `python3 -c "print('hello')"`.
pub fn py_hello(python: &Path) -> anyhow::Result<Sample> {
    let (took, out) = spawn(python, &["-c", workload::PY_HELLO], None)?;
    expect_stdout(&out, workload::HELLO_STDOUT)?;
    Ok(Sample::single(took))
}

/// Scenario E: `node -e "console.log('hello')"`.
pub fn js_hello(node: &Path) -> anyhow::Result<Sample> {
    let (took, out) = spawn(node, &["-e", workload::JS_HELLO], None)?;
    expect_stdout(&out, workload::HELLO_STDOUT)?;
    Ok(Sample::single(took))
}

/// Scenario B: a directory holding the CSV and the analysis script.
pub struct AnalysisDir {
    dir: tempfile::TempDir,
}

impl AnalysisDir {
    pub fn new() -> anyhow::Result<AnalysisDir> {
        let dir = tempfile::Builder::new()
            .prefix("kiln-bench-b-")
            .tempdir()
            .context("create scenario B directory")?;
        std::fs::write(dir.path().join(workload::CSV_NAME), workload::csv())
            .context("write the CSV")?;
        std::fs::write(dir.path().join("main.py"), workload::ANALYSIS_SCRIPT)
            .context("write the analysis script")?;
        Ok(AnalysisDir { dir })
    }

    fn plot(&self) -> PathBuf {
        self.dir.path().join(workload::PLOT_NAME)
    }

    /// Run the script once; the plot of the previous run is removed first
    /// (untimed) so its existence proves this run wrote it.
    pub fn run(&self, python: &Path) -> anyhow::Result<Sample> {
        match std::fs::remove_file(self.plot()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).context("remove the previous plot"),
        }
        let (took, out) = spawn(python, &["main.py"], Some(self.dir.path()))?;
        expect_stdout(&out, &workload::csv_expected_sum().to_string())?;
        if !self.plot().is_file() {
            bail!("the script did not write {}", workload::PLOT_NAME);
        }
        Ok(Sample::single(took))
    }
}

/// Scenario B2: a directory holding one snippet as `main.py`.
pub struct ScriptDir {
    dir: tempfile::TempDir,
    output: Option<&'static str>,
}

impl ScriptDir {
    pub fn new(script: &str, output: Option<&'static str>) -> anyhow::Result<ScriptDir> {
        let dir = tempfile::Builder::new()
            .prefix("kiln-bench-b2-")
            .tempdir()
            .context("create scenario B2 directory")?;
        std::fs::write(dir.path().join("main.py"), script).context("write the snippet")?;
        Ok(ScriptDir { dir, output })
    }

    /// Run the snippet once: its time and stdout. The output file of the
    /// previous run is removed first (untimed) so its existence proves this
    /// run wrote it.
    pub fn run(&self, python: &Path) -> anyhow::Result<(Sample, String)> {
        if let Some(name) = self.output {
            match std::fs::remove_file(self.dir.path().join(name)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).context("remove the previous output"),
            }
        }
        let (took, out) = spawn(python, &["main.py"], Some(self.dir.path()))?;
        if !out.status.success() {
            bail!(
                "the snippet failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
                    .chars()
                    .take(500)
                    .collect::<String>()
            );
        }
        if let Some(name) = self.output
            && !self.dir.path().join(name).is_file()
        {
            bail!("the snippet did not write {name}");
        }
        Ok((
            Sample::single(took),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ))
    }
}

/// Scenario D: one simulated user's directory; each request writes a fresh
/// numbers file (the "upload") and runs the summing program on it.
pub struct SumDir {
    dir: tempfile::TempDir,
}

impl SumDir {
    pub fn new() -> anyhow::Result<SumDir> {
        let dir = tempfile::Builder::new()
            .prefix("kiln-bench-d-")
            .tempdir()
            .context("create scenario D directory")?;
        Ok(SumDir { dir })
    }

    /// One write + run pair, verified.
    pub fn run(&self, python: &Path, numbers: &workload::Numbers) -> anyhow::Result<Sample> {
        let t = Instant::now();
        std::fs::write(
            self.dir.path().join(workload::NUMBERS_NAME),
            &numbers.contents,
        )
        .context("write the numbers file")?;
        let (took, out) = spawn(python, &["-c", workload::SUM_SCRIPT], Some(self.dir.path()))?;
        let pair = t.elapsed();
        expect_stdout(&out, &numbers.expected.to_string())?;
        Ok(Sample {
            latency: took,
            pair: Some(pair),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::SplitMix64;

    const PYTHON: &str = "/usr/bin/python3";

    /// Whether the host Python has the data stack; without `CI` a missing
    /// one skips the test with a printed reason, with `CI` it fails.
    fn python_with_pandas() -> bool {
        let ok = Command::new(PYTHON)
            .args(["-c", "import pandas, matplotlib"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            assert!(
                std::env::var_os("CI").is_none(),
                "{PYTHON} with pandas and matplotlib is required (scripts/install-runtimes.sh)"
            );
            eprintln!("skipped: {PYTHON} with pandas and matplotlib is not installed");
        }
        ok
    }

    #[test]
    fn spawned_processes_see_only_path() {
        let (_, out) = spawn(Path::new("/usr/bin/env"), &[], None).unwrap();
        let env = String::from_utf8_lossy(&out.stdout);
        assert_eq!(env.trim_end(), format!("PATH={CLEAN_PATH}"));
    }

    #[test]
    fn wrong_output_and_failed_exits_are_rejected() {
        let (_, out) = spawn(Path::new("/bin/sh"), &["-c", "echo hello"], None).unwrap();
        expect_stdout(&out, "hello").unwrap();
        let err = expect_stdout(&out, "bye").unwrap_err();
        assert!(err.to_string().contains("expected stdout \"bye\""), "{err}");
        let (_, out) = spawn(Path::new("/bin/sh"), &["-c", "echo hello; exit 3"], None).unwrap();
        assert!(expect_stdout(&out, "hello").is_err());
    }

    #[test]
    fn analysis_script_prints_the_expected_sum_and_writes_the_plot() {
        if !python_with_pandas() {
            return;
        }
        let d = AnalysisDir::new().unwrap();
        d.run(Path::new(PYTHON)).unwrap();
        // a second run works too (the previous plot is replaced)
        d.run(Path::new(PYTHON)).unwrap();
    }

    #[test]
    fn the_person_scenarios_data_run_prints_its_expected_total() {
        if !python_with_pandas() {
            return;
        }
        let d = ScriptDir::new(workload::DATA_RUN_SCRIPT, Some("trend.png")).unwrap();
        let (_, stdout) = d.run(Path::new(PYTHON)).unwrap();
        assert_eq!(stdout.trim_end(), workload::DATA_RUN_STDOUT);
    }

    #[test]
    fn sum_program_prints_the_sum_of_the_written_numbers() {
        let d = SumDir::new().unwrap();
        let n = workload::numbers(&mut SplitMix64::for_request(7, 0, 3, 9));
        let s = d.run(Path::new(PYTHON), &n).unwrap();
        assert!(s.pair.unwrap() >= s.latency);
        // a different file gives a different answer, and the old one is refused
        let wrong = workload::Numbers {
            contents: n.contents.clone(),
            expected: n.expected + 1,
        };
        assert!(d.run(Path::new(PYTHON), &wrong).is_err());
    }

    #[test]
    fn hello_baselines_verify_their_output() {
        py_hello(Path::new(PYTHON)).unwrap();
        let node = Path::new("/usr/bin/node");
        if node.exists() {
            js_hello(node).unwrap();
        } else {
            assert!(
                std::env::var_os("CI").is_none(),
                "/usr/bin/node is required"
            );
            eprintln!("skipped node: /usr/bin/node is not installed");
        }
    }
}
