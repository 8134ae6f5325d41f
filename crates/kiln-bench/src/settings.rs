//! Command line and the effective settings of a run: full defaults, the
//! `--quick` smoke configuration, explicit overrides, scenario selection.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use serde::Serialize;

use crate::baseline::Program;

/// Kiln's default `runtime_dir`.
const DEFAULT_RUNTIME_DIR: &str = "/var/lib/kiln/runtimes";

/// Benchmark Kiln against direct runtime spawns on the same machine.
///
/// Starts `kiln serve` (fresh data dir, free loopback port), runs the
/// selected scenarios, prints a markdown table and writes a JSON file.
#[derive(Debug, Parser)]
#[command(name = "kiln-bench", version)]
pub struct Cli {
    /// The kiln binary to benchmark.
    #[arg(long, env = "KILN_BENCH_KILN", default_value = "target/release/kiln")]
    pub kiln: PathBuf,
    /// Scenarios to run, comma-separated: A (py hello), B (pandas + plot),
    /// B2 (seaborn, scikit-learn, statsmodels, scipy + sympy snippets), C (py hello,
    /// concurrent), D (25 users upload + exec), E (js hello), S (25 users ×
    /// 100 stateful requests through seed 004's face, next to the same
    /// requests as one-shot /v1/exec runs; not in the default set), P (the
    /// latency a person sees: pauses of 0/50/300/1000 ms, hello after a data
    /// run, js after py, a new connection per request; not in the default set),
    /// K (live-kernel density: `--k-kernels` idle py kernels, create → first
    /// output at that density, memory per idle kernel, A's hello before and
    /// while they sit; not in the default set, use `--runs 1`).
    #[arg(long, value_delimiter = ',', default_value = "A,B,B2,C,D,E")]
    pub scenarios: Vec<String>,
    /// Small counts and one run: a smoke test for CI.
    #[arg(long)]
    pub quick: bool,
    /// Repetitions of each scenario; the report shows medians (default 3, quick 1).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Unmeasured requests before a scenario's first run (default 10, quick 2).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// A: requests (default 200, quick 20).
    #[arg(long)]
    pub a_requests: Option<usize>,
    /// B: requests (default 30, quick 3).
    #[arg(long)]
    pub b_requests: Option<usize>,
    /// B2: requests per snippet (default 8, quick 2).
    #[arg(long)]
    pub b2_requests: Option<usize>,
    /// C: total requests (default 300, quick 30).
    #[arg(long)]
    pub c_requests: Option<usize>,
    /// C: concurrent clients (default 10).
    #[arg(long)]
    pub c_clients: Option<usize>,
    /// D: concurrent users (default 25, quick 5).
    #[arg(long)]
    pub d_users: Option<usize>,
    /// D: sequential requests per user (default 100, quick 4).
    #[arg(long)]
    pub d_requests: Option<usize>,
    /// E: requests (default 200, quick 20).
    #[arg(long)]
    pub e_requests: Option<usize>,
    /// S: concurrent users, each with a live kernel (default 25, quick 5).
    #[arg(long)]
    pub s_users: Option<usize>,
    /// S: sequential stateful requests per user (default 100, quick 10).
    #[arg(long)]
    pub s_requests: Option<usize>,
    /// P: measured requests per sequence and run (default 20, quick 3).
    #[arg(long)]
    pub p_requests: Option<usize>,
    /// K: idle py kernels created per run (default 1000, quick 10).
    #[arg(long)]
    pub k_kernels: Option<usize>,
    /// Python of the baselines.
    #[arg(long, default_value = "/usr/bin/python3")]
    pub python: PathBuf,
    /// Node of the baseline of E.
    #[arg(long, default_value = "/usr/bin/node")]
    pub node: PathBuf,
    /// JSON output file (default bench-results/<UTC timestamp>.json).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Extra environment for the server, KEY=VALUE (repeatable), e.g.
    /// KILN_MAX_CONCURRENCY=4.
    #[arg(long = "server-env", value_parser = parse_key_value)]
    pub server_env: Vec<(String, String)>,
    /// Seconds the server may take to answer /v1/health.
    #[arg(long, default_value_t = 60)]
    pub startup_timeout: u64,
    /// Measure the Kiln already serving at this origin (`http://host:port`,
    /// e.g. a balancer in front of several nodes) instead of starting one;
    /// the server's memory is then not reported.
    #[arg(long)]
    pub url: Option<String>,
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// A scenario of the suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Scenario {
    A,
    B,
    B2,
    C,
    D,
    E,
    S,
    P,
    K,
}

impl Scenario {
    fn parse(s: &str) -> anyhow::Result<Scenario> {
        Ok(match s.trim().to_ascii_uppercase().as_str() {
            "A" => Scenario::A,
            "B" => Scenario::B,
            "B2" => Scenario::B2,
            "C" => Scenario::C,
            "D" => Scenario::D,
            "E" => Scenario::E,
            "S" => Scenario::S,
            "P" => Scenario::P,
            "K" => Scenario::K,
            other => bail!("unknown scenario {other:?} (choose from A,B,B2,C,D,E,S,P,K)"),
        })
    }
}

/// Everything a run uses, after defaults (recorded in the JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Settings {
    pub kiln: PathBuf,
    pub scenarios: Vec<Scenario>,
    pub quick: bool,
    pub runs: usize,
    pub warmup: usize,
    pub a_requests: usize,
    pub b_requests: usize,
    pub b2_requests: usize,
    pub c_requests: usize,
    pub c_clients: usize,
    pub d_users: usize,
    pub d_requests: usize,
    pub e_requests: usize,
    pub s_users: usize,
    pub s_requests: usize,
    pub p_requests: usize,
    pub k_kernels: usize,
    pub python: PathBuf,
    pub node: PathBuf,
    pub out: Option<PathBuf>,
    /// The server's environment (`--server-env`); S runs on the server's
    /// own defaults (`max_sessions` sized from memory); a binary from
    /// before that needs `KILN_MAX_SESSIONS=27` here.
    pub server_env: Vec<(String, String)>,
    #[serde(skip)]
    pub startup_timeout: Duration,
    /// An external server's origin (`--url`); `None`: one is started.
    pub url: Option<String>,
    /// The runtime image the measured server runs its `py` jails from, when it runs them on
    /// one that is on this machine (read from its `/health`): the Python baselines then spawn
    /// `python` inside it (in a chroot), not the host's. `None`: the host's.
    pub bare_python_image: Option<BareImage>,
    /// The same for its `js` jails and the Node baselines.
    pub bare_node_image: Option<BareImage>,
}

/// A runtime image the baselines run their interpreters from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BareImage {
    /// The id the server's `/health` names (`recipe-…`, `import-…`, or a root's path).
    pub id: String,
    /// Its root filesystem on this machine.
    pub root: PathBuf,
}

impl BareImage {
    /// The image a server's `/health` answer names for the language `lang` (its entry's
    /// `image`; from a server that names none per language, `runtime_image`), found on this
    /// machine: an id's root in `runtime_dir`, or a root given by path. `None` when the
    /// server runs that language on the host's `/usr` or its image is not here (a server
    /// elsewhere, `--url`).
    pub fn from_health(
        health: &serde_json::Value,
        runtime_dir: &Path,
        lang: &str,
    ) -> Option<BareImage> {
        let own = health["languages"]
            .as_array()
            .and_then(|ls| ls.iter().find(|l| l["name"] == lang))
            .and_then(|l| l.get("image"));
        let image = own.unwrap_or(&health["runtime_image"]);
        let id = image["id"].as_str()?;
        let root = if id.starts_with('/') {
            PathBuf::from(id)
        } else if (id.starts_with("recipe-") || id.starts_with("import-"))
            && !id.contains(['/', '.'])
        {
            runtime_dir.join(id).join("rootfs")
        } else {
            return None;
        };
        root.join("usr").is_dir().then(|| BareImage {
            id: id.to_owned(),
            root,
        })
    }
}

impl Settings {
    /// The server's environment: what the command line gave, and for K
    /// room for its kernels, all under one principal (`KILN_MAX_SESSIONS`,
    /// `KILN_MAX_SESSIONS_PER_USER`) unless given. S runs on the server's
    /// own sizing (a binary from before it needs
    /// `--server-env KILN_MAX_SESSIONS=27`).
    pub fn server_env(&self) -> Vec<(String, String)> {
        let mut env = self.server_env.clone();
        if self.scenarios.contains(&Scenario::K) {
            for (key, n) in [
                ("KILN_MAX_SESSIONS", self.k_kernels + 2),
                ("KILN_MAX_SESSIONS_PER_USER", self.k_kernels + 1),
            ] {
                if !env.iter().any(|(k, _)| k == key) {
                    env.push((key.to_owned(), n.to_string()));
                }
            }
        }
        env
    }

    /// The baselines' Python: `--python`, in the image of the server's `py` jails when it
    /// runs them on one.
    pub fn bare_python(&self) -> Program {
        Self::bare(&self.python, self.bare_python_image.as_ref())
    }

    /// The baselines' Node: `--node`, in the image of the server's `js` jails when it runs
    /// them on one.
    pub fn bare_node(&self) -> Program {
        Self::bare(&self.node, self.bare_node_image.as_ref())
    }

    fn bare(path: &Path, image: Option<&BareImage>) -> Program {
        Program {
            image: image.map(|i| i.root.clone()),
            ..Program::host(path)
        }
    }

    /// Where the server keeps its runtime images: its `KILN_RUNTIME_DIR`, else Kiln's default.
    pub fn runtime_dir(&self) -> PathBuf {
        self.server_env
            .iter()
            .find(|(k, _)| k == "KILN_RUNTIME_DIR")
            .map_or_else(|| PathBuf::from(DEFAULT_RUNTIME_DIR), |(_, v)| v.into())
    }

    /// Apply the defaults (full or quick) to what the command line left open.
    pub fn resolve(cli: Cli) -> anyhow::Result<Settings> {
        let q = cli.quick;
        let pick =
            |v: Option<usize>, full: usize, quick: usize| v.unwrap_or(if q { quick } else { full });
        let mut scenarios = Vec::new();
        for s in cli.scenarios.iter().filter(|s| !s.trim().is_empty()) {
            let sc = Scenario::parse(s)?;
            if !scenarios.contains(&sc) {
                scenarios.push(sc);
            }
        }
        if scenarios.is_empty() {
            bail!("--scenarios selects nothing");
        }
        scenarios.sort();
        let s = Settings {
            kiln: cli.kiln,
            scenarios,
            quick: q,
            runs: pick(cli.runs, 3, 1),
            warmup: pick(cli.warmup, 10, 2),
            a_requests: pick(cli.a_requests, 200, 20),
            b_requests: pick(cli.b_requests, 30, 3),
            b2_requests: pick(cli.b2_requests, 8, 2),
            c_requests: pick(cli.c_requests, 300, 30),
            c_clients: pick(cli.c_clients, 10, 10),
            d_users: pick(cli.d_users, 25, 5),
            d_requests: pick(cli.d_requests, 100, 4),
            e_requests: pick(cli.e_requests, 200, 20),
            s_users: pick(cli.s_users, 25, 5),
            s_requests: pick(cli.s_requests, 100, 10),
            p_requests: pick(cli.p_requests, 20, 3),
            k_kernels: pick(cli.k_kernels, 1000, 10),
            python: cli.python,
            node: cli.node,
            out: cli.out,
            server_env: cli.server_env,
            startup_timeout: Duration::from_secs(cli.startup_timeout),
            url: cli.url.map(|u| {
                u.trim()
                    .trim_end_matches('/')
                    .trim_end_matches("/v1")
                    .to_owned()
            }),
            bare_python_image: None,
            bare_node_image: None,
        };
        if let Some(u) = &s.url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            bail!("--url must be http://host:port, not {u:?}");
        }
        for (name, v) in [
            ("--runs", s.runs),
            ("--a-requests", s.a_requests),
            ("--b-requests", s.b_requests),
            ("--b2-requests", s.b2_requests),
            ("--c-requests", s.c_requests),
            ("--c-clients", s.c_clients),
            ("--d-users", s.d_users),
            ("--d-requests", s.d_requests),
            ("--e-requests", s.e_requests),
            ("--s-users", s.s_users),
            ("--s-requests", s.s_requests),
            ("--p-requests", s.p_requests),
            ("--k-kernels", s.k_kernels),
        ] {
            if v == 0 {
                bail!("{name} must be at least 1");
            }
        }
        Ok(s)
    }

    /// As JSON for the report.
    pub fn to_json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::to_value(self).context("serialize settings")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> anyhow::Result<Settings> {
        let mut v = vec!["kiln-bench"];
        v.extend_from_slice(args);
        Settings::resolve(Cli::try_parse_from(v)?)
    }

    #[test]
    fn the_baselines_image_is_the_one_the_servers_health_names_when_it_is_here() {
        let dir = tempfile::tempdir().unwrap();
        let id = "recipe-0123456789abcdef";
        std::fs::create_dir_all(dir.path().join(id).join("rootfs/usr")).unwrap();
        let health = serde_json::json!({"runtime_image": {"id": id, "digest": "x"}});
        let img = BareImage::from_health(&health, dir.path(), "py").unwrap();
        assert_eq!(img.root, dir.path().join(id).join("rootfs"));
        // a root given by path is used as it is
        let by_path = serde_json::json!({"runtime_image": {"id": img.root}});
        assert_eq!(
            BareImage::from_health(&by_path, Path::new("/nowhere"), "py")
                .unwrap()
                .root,
            img.root
        );
        // the host's /usr, an image not on this machine, or an id that is a path: the host's
        for other in [
            serde_json::json!({"status": "ok"}),
            serde_json::json!({"runtime_image": null}),
            serde_json::json!({"runtime_image": {"id": "recipe-fedcba9876543210"}}),
            serde_json::json!({"runtime_image": {"id": "recipe-../../etc"}}),
        ] {
            assert_eq!(
                BareImage::from_health(&other, dir.path(), "py"),
                None,
                "{other}"
            );
        }
        let mut s = parse(&[]).unwrap();
        assert_eq!(s.bare_python(), Program::host("/usr/bin/python3"));
        s.bare_node_image = Some(img.clone());
        assert_eq!(s.bare_node().image.as_deref(), Some(img.root.as_path()));
        assert_eq!(s.bare_python(), Program::host("/usr/bin/python3"));
        assert_eq!(
            parse(&["--server-env", "KILN_RUNTIME_DIR=/srv/images"])
                .unwrap()
                .runtime_dir(),
            Path::new("/srv/images")
        );
    }

    #[test]
    fn each_baseline_takes_the_image_of_the_language_it_times() {
        let dir = tempfile::tempdir().unwrap();
        let (default, own) = ("recipe-0123456789abcdef", "import-fedcba9876543210");
        for id in [default, own] {
            std::fs::create_dir_all(dir.path().join(id).join("rootfs/usr")).unwrap();
        }
        let health = serde_json::json!({
            "runtime_image": {"id": default},
            "languages": [
                {"name": "py", "image": {"id": own}},
                {"name": "js", "image": {"id": default}},
                {"name": "r", "image": null},
            ],
        });
        let of = |lang| BareImage::from_health(&health, dir.path(), lang).map(|i| i.id);
        assert_eq!(of("py").as_deref(), Some(own));
        assert_eq!(of("js").as_deref(), Some(default));
        // a language on the host's /usr: the host's interpreter
        assert_eq!(of("r"), None);
    }

    #[test]
    fn defaults_are_the_full_configuration() {
        let s = parse(&[]).unwrap();
        assert_eq!(
            s.scenarios,
            vec![
                Scenario::A,
                Scenario::B,
                Scenario::B2,
                Scenario::C,
                Scenario::D,
                Scenario::E
            ]
        );
        assert_eq!((s.runs, s.warmup), (3, 10));
        assert_eq!(
            (s.a_requests, s.b_requests, s.c_requests, s.c_clients),
            (200, 30, 300, 10)
        );
        assert_eq!((s.d_users, s.d_requests, s.e_requests), (25, 100, 200));
        assert_eq!(s.python, PathBuf::from("/usr/bin/python3"));
    }

    #[test]
    fn quick_shrinks_counts_but_explicit_values_win() {
        let s = parse(&["--quick", "--a-requests", "7"]).unwrap();
        assert!(s.quick);
        assert_eq!(s.runs, 1);
        assert_eq!(s.a_requests, 7);
        assert_eq!(
            (s.b_requests, s.c_requests, s.d_users, s.d_requests),
            (3, 30, 5, 4)
        );
    }

    #[test]
    fn scenarios_are_case_insensitive_deduplicated_and_ordered() {
        let s = parse(&["--scenarios", "e,a,A, c"]).unwrap();
        assert_eq!(s.scenarios, vec![Scenario::A, Scenario::C, Scenario::E]);
        assert!(parse(&["--scenarios", "A,Z"]).is_err());
        let s = parse(&["--scenarios", "s,a"]).unwrap();
        assert_eq!(s.scenarios, vec![Scenario::A, Scenario::S]);
        assert_eq!((s.s_users, s.s_requests), (25, 100));
        assert!(parse(&["--scenarios", ""]).is_err());
    }

    #[test]
    fn k_makes_room_for_its_kernels_under_one_principal_unless_told() {
        let s = parse(&["--scenarios", "K", "--k-kernels", "300"]).unwrap();
        let env = s.server_env();
        assert!(env.contains(&("KILN_MAX_SESSIONS".into(), "302".into())));
        assert!(env.contains(&("KILN_MAX_SESSIONS_PER_USER".into(), "301".into())));
        assert_eq!(parse(&["--scenarios", "k"]).unwrap().k_kernels, 1000);
        let told = parse(&["--scenarios", "K,S", "--server-env", "KILN_MAX_SESSIONS=50"])
            .unwrap()
            .server_env();
        assert_eq!(
            told.iter()
                .filter(|(k, _)| k == "KILN_MAX_SESSIONS")
                .count(),
            1
        );
        assert!(told.contains(&("KILN_MAX_SESSIONS_PER_USER".into(), "1001".into())));
        assert!(parse(&["--k-kernels", "0"]).is_err());
        // S runs on the server's own sizing
        assert!(
            parse(&["--scenarios", "S"])
                .unwrap()
                .server_env()
                .is_empty()
        );
    }

    #[test]
    fn zero_counts_and_bad_server_env_are_rejected() {
        assert!(parse(&["--runs", "0"]).is_err());
        assert!(parse(&["--d-users", "0"]).is_err());
        assert!(parse(&["--server-env", "NOEQUALS"]).is_err());
        let s = parse(&[
            "--server-env",
            "KILN_MAX_CONCURRENCY=4",
            "--server-env",
            "A=b=c",
        ])
        .unwrap();
        assert_eq!(
            s.server_env,
            vec![
                ("KILN_MAX_CONCURRENCY".into(), "4".into()),
                ("A".into(), "b=c".into())
            ]
        );
    }

    #[test]
    fn settings_serialize_for_the_report() {
        let v = parse(&["--quick"]).unwrap().to_json().unwrap();
        assert_eq!(v["runs"], 1);
        assert_eq!(v["scenarios"][0], "A");
        assert_eq!(v["kiln"], "target/release/kiln");
    }
}
