//! The baselines: the same programs run directly, one process per request, spawned with
//! `std::process::Command` and a clean environment (`env_clear()` + `PATH`), timed around
//! spawn → exit with output read. The interpreter is the host's, or — when the measured server
//! runs its jails from a runtime image — the image's own, spawned in a chroot of the same image
//! ([`Program`]), so both sides run the same interpreter and libraries.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::measure::Sample;
use crate::workload;

/// The `PATH` of every baseline process.
pub const CLEAN_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// A baseline's interpreter: `path` on the host, or `path` inside the runtime image at
/// `image` (its root filesystem), spawned in a chroot of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    pub path: PathBuf,
    pub image: Option<PathBuf>,
}

impl Program {
    pub fn host(path: impl Into<PathBuf>) -> Program {
        Program {
            path: path.into(),
            image: None,
        }
    }

    /// Where the program's file is on the host (inside the image's root for an image).
    pub fn host_path(&self) -> PathBuf {
        match &self.image {
            Some(root) => root.join(self.path.strip_prefix("/").unwrap_or(&self.path)),
            None => self.path.clone(),
        }
    }

    /// The command that runs the program with `args` in `cwd` (a host directory; for an image
    /// one below its root, see [`Program::tempdir`]) with only `PATH` in its environment. On
    /// an image the spawned process itself enters a chroot of it (and starts in `cwd`'s path
    /// inside, else `/`) before it executes the image's program: no process in between.
    pub fn command(&self, args: &[&str], cwd: Option<&Path>) -> anyhow::Result<Command> {
        let mut cmd = Command::new(&self.path);
        match &self.image {
            None => {
                if let Some(d) = cwd {
                    cmd.current_dir(d);
                }
            }
            Some(root) => {
                let inside = match cwd {
                    Some(d) => Path::new("/").join(d.strip_prefix(root).with_context(|| {
                        format!("{} is not inside the image {}", d.display(), root.display())
                    })?),
                    None => PathBuf::from("/"),
                };
                kiln_sandbox::chroot_before_exec(&mut cmd, root, &inside)?;
            }
        }
        cmd.args(args).env_clear().env("PATH", CLEAN_PATH);
        Ok(cmd)
    }

    /// A fresh directory the program can work in: the host's temp dir, or the image's `/tmp`
    /// (jails never see it: they get a `/tmp` of their own); removed when dropped.
    pub fn tempdir(&self, prefix: &str) -> anyhow::Result<tempfile::TempDir> {
        let mut b = tempfile::Builder::new();
        b.prefix(prefix);
        match &self.image {
            Some(root) => b.tempdir_in(root.join("tmp")),
            None => b.tempdir(),
        }
        .with_context(|| format!("create a {prefix}… directory"))
    }

    /// What the reports say it is: `/usr/bin/python3`, or
    /// `/usr/bin/python3 in a chroot of <root>`.
    pub fn describe(&self) -> String {
        match &self.image {
            Some(root) => format!("{} in a chroot of {}", self.path.display(), root.display()),
            None => self.path.display().to_string(),
        }
    }
}

/// Run `program args…` in `cwd` with a clean environment; the duration
/// covers spawn, run and reading its output.
pub fn spawn(
    program: &Program,
    args: &[&str],
    cwd: Option<&Path>,
) -> anyhow::Result<(Duration, Output)> {
    let mut cmd = program.command(args, cwd)?;
    let t = Instant::now();
    let out = cmd
        .output()
        .with_context(|| format!("spawn {}", program.describe()))?;
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
pub fn py_hello(python: &Program) -> anyhow::Result<Sample> {
    let (took, out) = spawn(python, &["-c", workload::PY_HELLO], None)?;
    expect_stdout(&out, workload::HELLO_STDOUT)?;
    Ok(Sample::single(took))
}

/// Scenario E: `node -e "console.log('hello')"`.
pub fn js_hello(node: &Program) -> anyhow::Result<Sample> {
    let (took, out) = spawn(node, &["-e", workload::JS_HELLO], None)?;
    expect_stdout(&out, workload::HELLO_STDOUT)?;
    Ok(Sample::single(took))
}

/// Scenario B: a directory holding the CSV and the analysis script.
pub struct AnalysisDir {
    dir: tempfile::TempDir,
}

impl AnalysisDir {
    pub fn new(python: &Program) -> anyhow::Result<AnalysisDir> {
        let dir = python.tempdir("kiln-bench-b-")?;
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
    pub fn run(&self, python: &Program) -> anyhow::Result<Sample> {
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
    pub fn new(
        python: &Program,
        script: &str,
        output: Option<&'static str>,
    ) -> anyhow::Result<ScriptDir> {
        let dir = python.tempdir("kiln-bench-b2-")?;
        std::fs::write(dir.path().join("main.py"), script).context("write the snippet")?;
        Ok(ScriptDir { dir, output })
    }

    /// Run the snippet once: its time and stdout. The output file of the
    /// previous run is removed first (untimed) so its existence proves this
    /// run wrote it.
    pub fn run(&self, python: &Program) -> anyhow::Result<(Sample, String)> {
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
    pub fn new(python: &Program) -> anyhow::Result<SumDir> {
        let dir = python.tempdir("kiln-bench-d-")?;
        Ok(SumDir { dir })
    }

    /// One write + run pair, verified.
    pub fn run(&self, python: &Program, numbers: &workload::Numbers) -> anyhow::Result<Sample> {
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

    fn args_of(c: &Command) -> Vec<String> {
        c.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_host_baseline_spawns_the_program_itself_in_its_directory() {
        let p = Program::host(PYTHON);
        let c = p.command(&["main.py"], Some(Path::new("/tmp/d"))).unwrap();
        assert_eq!(c.get_program(), PYTHON);
        assert_eq!(args_of(&c), ["main.py"]);
        assert_eq!(c.get_current_dir(), Some(Path::new("/tmp/d")));
        assert_eq!(p.host_path(), Path::new(PYTHON));
    }

    #[test]
    fn an_image_baseline_spawns_the_images_program_itself_with_nothing_in_between() {
        let root = Path::new("/var/lib/kiln/runtimes/recipe-0123456789abcdef/rootfs");
        let p = Program {
            path: PYTHON.into(),
            image: Some(root.into()),
        };
        // the image's interpreter by its path inside the image, exec'd by the spawned process
        // after its chroot: no chroot(8) or env(1) process of its own in the measured time
        let c = p
            .command(&["main.py"], Some(&root.join("tmp/kiln-bench-b-x")))
            .unwrap();
        assert_eq!(c.get_program(), PYTHON);
        assert_eq!(args_of(&c), ["main.py"]);
        assert_eq!(c.get_current_dir(), None);
        let envs: Vec<_> = c.get_envs().collect();
        assert_eq!(
            envs,
            [(
                std::ffi::OsStr::new("PATH"),
                Some(std::ffi::OsStr::new(CLEAN_PATH))
            )]
        );
        // a directory outside the image cannot be reached from inside it
        let err = p
            .command(&["main.py"], Some(Path::new("/tmp/x")))
            .unwrap_err();
        assert!(err.to_string().contains("not inside the image"), "{err}");
        assert_eq!(p.host_path(), root.join("usr/bin/python3"));
        assert!(p.describe().contains("in a chroot of"), "{}", p.describe());
    }

    #[test]
    fn an_image_baseline_runs_in_its_root_and_starts_in_the_directory_inside_it() {
        if !nix::unistd::geteuid().is_root() {
            assert!(std::env::var_os("CI").is_none(), "chroot needs root");
            eprintln!("skipped: chroot needs root");
            return;
        }
        // the host's own root as the "image": the directory below it is where pwd starts
        let p = Program {
            path: "/bin/pwd".into(),
            image: Some("/".into()),
        };
        let d = p.tempdir("kiln-bench-chroot-").unwrap();
        let (_, out) = spawn(&p, &[], Some(d.path())).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim_end(),
            d.path().to_str().unwrap()
        );
        // a root without the program: it is looked up inside the root, not on the host
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("usr/bin")).unwrap();
        let missing = Program {
            path: "/bin/pwd".into(),
            image: Some(root.path().into()),
        };
        assert!(spawn(&missing, &[], None).is_err());
    }

    #[test]
    fn an_image_baselines_work_directories_are_below_the_images_tmp() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("tmp")).unwrap();
        let p = Program {
            path: PYTHON.into(),
            image: Some(root.path().into()),
        };
        let d = SumDir::new(&p).unwrap();
        assert!(d.dir.path().starts_with(root.path().join("tmp")));
        let host = SumDir::new(&Program::host(PYTHON)).unwrap();
        assert!(!host.dir.path().starts_with(root.path()));
    }

    #[test]
    fn spawned_processes_see_only_path() {
        let (_, out) = spawn(&Program::host("/usr/bin/env"), &[], None).unwrap();
        let env = String::from_utf8_lossy(&out.stdout);
        assert_eq!(env.trim_end(), format!("PATH={CLEAN_PATH}"));
    }

    #[test]
    fn wrong_output_and_failed_exits_are_rejected() {
        let (_, out) = spawn(&Program::host("/bin/sh"), &["-c", "echo hello"], None).unwrap();
        expect_stdout(&out, "hello").unwrap();
        let err = expect_stdout(&out, "bye").unwrap_err();
        assert!(err.to_string().contains("expected stdout \"bye\""), "{err}");
        let (_, out) = spawn(
            &Program::host("/bin/sh"),
            &["-c", "echo hello; exit 3"],
            None,
        )
        .unwrap();
        assert!(expect_stdout(&out, "hello").is_err());
    }

    #[test]
    fn analysis_script_prints_the_expected_sum_and_writes_the_plot() {
        if !python_with_pandas() {
            return;
        }
        let d = AnalysisDir::new(&Program::host(PYTHON)).unwrap();
        d.run(&Program::host(PYTHON)).unwrap();
        // a second run works too (the previous plot is replaced)
        d.run(&Program::host(PYTHON)).unwrap();
    }

    #[test]
    fn the_person_scenarios_data_run_prints_its_expected_total() {
        if !python_with_pandas() {
            return;
        }
        let d = ScriptDir::new(
            &Program::host(PYTHON),
            workload::DATA_RUN_SCRIPT,
            Some("trend.png"),
        )
        .unwrap();
        let (_, stdout) = d.run(&Program::host(PYTHON)).unwrap();
        assert_eq!(stdout.trim_end(), workload::DATA_RUN_STDOUT);
    }

    #[test]
    fn sum_program_prints_the_sum_of_the_written_numbers() {
        let d = SumDir::new(&Program::host(PYTHON)).unwrap();
        let n = workload::numbers(&mut SplitMix64::for_request(7, 0, 3, 9));
        let s = d.run(&Program::host(PYTHON), &n).unwrap();
        assert!(s.pair.unwrap() >= s.latency);
        // a different file gives a different answer, and the old one is refused
        let wrong = workload::Numbers {
            contents: n.contents.clone(),
            expected: n.expected + 1,
        };
        assert!(d.run(&Program::host(PYTHON), &wrong).is_err());
    }

    #[test]
    fn hello_baselines_verify_their_output() {
        py_hello(&Program::host(PYTHON)).unwrap();
        let node = Program::host("/usr/bin/node");
        if node.path.exists() {
            js_hello(&node).unwrap();
        } else {
            assert!(
                std::env::var_os("CI").is_none(),
                "/usr/bin/node is required"
            );
            eprintln!("skipped node: /usr/bin/node is not installed");
        }
    }
}
