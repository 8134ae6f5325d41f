//! The language table: one declarative entry per runtime.
//!
//! Adding a language means adding an entry to [`LANGUAGES`]; the executor has
//! no per-language branches. An entry says where the code is written, how it
//! is compiled and run, its environment, the support files staged next to it,
//! the host `/etc` entries it reads, how to ask for its version and how long
//! its compiler may take.
//!
//! Placeholders, filled in command lines and environment values:
//! - `{entry}`: the entry file name (relative to `/mnt/data`, the working
//!   directory of every step);
//! - `{build}`: [`BUILD_DIR`] inside the jail (`/mnt/data/.kiln-build`), a
//!   writable, executable place for build outputs and compiler caches
//!   (`/tmp` is `noexec`); it exists for every language that compiles;
//! - `{support}`: [`SUPPORT_DIR`] inside the jail (`/mnt/data/.kiln`), where
//!   the entry's [`SupportFile`]s are staged;
//! - `{memory_mb}`: the run's memory limit in MiB (for runtimes that size
//!   their heap themselves, such as the JVM).
//!
//! Both directories are hidden, so the output walker never reports them.

use std::time::Duration;

use crate::limits::Limits;

pub mod missing;
pub mod pyimports;

/// The workspace as the jail sees it (also the working directory).
pub const WORKSPACE: &str = "/mnt/data";
/// Support files, relative to the workspace.
pub const SUPPORT_DIR: &str = ".kiln";
/// Build outputs and compiler caches, relative to the workspace.
pub const BUILD_DIR: &str = ".kiln-build";

/// A file staged read-only into [`SUPPORT_DIR`] before a run.
#[derive(Debug)]
pub struct SupportFile {
    /// Path below [`SUPPORT_DIR`] (may contain `/`).
    pub name: &'static str,
    pub contents: &'static str,
    /// Stage it only when the code contains one of these strings; empty:
    /// always. Keeps the workspace as the program left it (what
    /// `os.listdir('.')` shows) for code that cannot need the file.
    pub when_code_contains: &'static [&'static str],
}

/// One runtime recipe.
#[derive(Debug)]
pub struct LanguageSpec {
    /// Canonical name, as LibreChat's enum spells it (`py`, `js`, `bash`, ...).
    pub name: &'static str,
    /// Other accepted spellings (matched case-insensitively).
    pub aliases: &'static [&'static str],
    /// File the code is written to inside `/mnt/data`.
    pub entry_file: &'static str,
    /// Optional compile step (argv). Its failure ends the run with the
    /// compiler's output on stderr.
    pub compile: Option<&'static [&'static str]>,
    /// Run step (argv); request `args` are appended.
    pub run: &'static [&'static str],
    /// Extra environment for this runtime (on top of the executor's base env).
    pub env: &'static [(&'static str, &'static str)],
    /// Version probe (argv); first line of stdout or stderr is the version.
    pub version: &'static [&'static str],
    /// Executables that must exist on the host for the runtime to be usable.
    pub requires: &'static [&'static str],
    /// Compile-step wall-time limit: compilers get their own budget, which a
    /// request's `timeout` does not lower (it applies to the run step).
    pub compile_timeout: Duration,
    /// Files staged into [`SUPPORT_DIR`] for this runtime.
    pub support_files: &'static [SupportFile],
    /// Host `/etc` entries the runtime reads (configuration its packages
    /// install there); the jail must bind them read-only.
    pub etc: &'static [&'static str],
    /// The name people write for it (`python`, `javascript`, ...): what seed
    /// 000's API lists. Resolves to this entry.
    pub common_name: &'static str,
    /// How its warm jails are prepared; `None`: generic ones.
    pub warm: Option<WarmRecipe>,
    /// Its live kernel (sessions, workers, live runtime sessions), if it
    /// has one.
    pub kernel: Option<KernelRecipe>,
    /// Programmatic tool calling (`/exec/programmatic`) runs it, if set.
    pub tools: Option<ToolSurface>,
}

/// How a language's live kernel is built (see kiln-exec's kernel host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelRecipe {
    /// A fork of the Python fork-server running `warm::PYTHON_KERNEL`.
    Python,
    /// A pre-started node running `warm::NODE_KERNEL`.
    Node,
}

/// How programmatic tool calling offers the tools to a language's program.
#[derive(Debug)]
pub struct ToolSurface {
    /// The names `/exec/programmatic` accepts for it (`language`/`lang`,
    /// exactly as spelled: the contract's own enum).
    pub names: &'static [&'static str],
    /// What the tools look like inside the program.
    pub style: ToolStyle,
}

/// The shape of the tools a program calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolStyle {
    /// Async Python functions; results arrive as Python values.
    Python,
    /// Shell functions; a string result arrives as is, anything else as JSON.
    Shell,
}

/// Budget of compilers that are quick on anything a chat produces.
const FAST_COMPILE: Duration = Duration::from_secs(15);
/// Budget of heavier toolchains (rustc, the Go tool, javac, GDC, C++ templates).
const SLOW_COMPILE: Duration = Duration::from_secs(30);

/// How warm jails of a runtime are prepared before a request arrives (see
/// kiln-sandbox's warm pool and fork-server). A runtime without a recipe
/// runs in generic warm jails ([`WARM_EXEC`]), which `execve` the program at
/// the go; so does every step of a compiled runtime.
#[derive(Debug)]
pub enum WarmRecipe {
    /// The runtime is started while the jail is parked, with the runtime's
    /// environment, and reads the go on its stdin. `argv` takes the same
    /// placeholders as `run`; `etc_files` are placed at `/etc/kiln/<name>`.
    Prestart {
        argv: &'static [&'static str],
        etc_files: &'static [(&'static str, &'static str)],
    },
    /// The program process is a fork of a fork-server: `interpreter`'s
    /// shared library, embedded, ran one of `templates`' preloads once.
    /// Which template a run forks is chosen from its code
    /// ([`Language::warm_profile_for`]).
    Embedded {
        interpreter: &'static str,
        templates: &'static [EmbeddedTemplate],
    },
}

/// One preloaded template of an [`WarmRecipe::Embedded`] runtime (one
/// fork-server each).
#[derive(Debug)]
pub struct EmbeddedTemplate {
    /// Which one the import scan picks it for.
    pub kind: pyimports::PyTemplate,
    /// Its warm profile.
    pub profile: &'static str,
    /// Modules it imports on top of the common stdlib set (which every
    /// template but the min one preloads).
    pub modules: &'static [&'static str],
}

impl EmbeddedTemplate {
    /// Whether it preloads the common stdlib set (the template's `stdlib`
    /// list): all but the min one, which holds only what a cold `python3
    /// -c pass` and the template's own `run` load.
    pub fn preloads_stdlib(&self) -> bool {
        self.kind != pyimports::PyTemplate::Min
    }

    /// The source the fork-server runs once (see [`warm::python_preload`]).
    pub fn preload(&self) -> String {
        warm::python_preload(self.preloads_stdlib(), self.modules)
    }
}

/// The Python templates, smallest first: the bigger a template, the more
/// CPU a run's fork and exit cost (the min one's are cheapest: about 1.3 ms
/// of CPU less per run than the lean one's), and the more of what analysis
/// code imports is already loaded (each of the rich one's own modules takes
/// 0.2 to 2 s to import cold).
const PY_TEMPLATES: &[EmbeddedTemplate] = &[
    EmbeddedTemplate {
        kind: pyimports::PyTemplate::Min,
        profile: "py-min",
        modules: &[],
    },
    EmbeddedTemplate {
        kind: pyimports::PyTemplate::Lean,
        profile: "py-lean",
        modules: &[],
    },
    EmbeddedTemplate {
        kind: pyimports::PyTemplate::Data,
        profile: "py-data",
        modules: &["numpy", "pandas", "matplotlib", "matplotlib.pyplot"],
    },
    EmbeddedTemplate {
        kind: pyimports::PyTemplate::Rich,
        profile: "py",
        modules: &[
            "numpy",
            "pandas",
            "matplotlib",
            "matplotlib.pyplot",
            "seaborn",
            "scipy.stats",
            "scipy.optimize",
            "scipy.integrate",
            "scipy.interpolate",
            "scipy.signal",
            "scipy.linalg",
            "sympy",
            "sklearn.ensemble",
            "sklearn.linear_model",
            "sklearn.model_selection",
            "sklearn.datasets",
            "sklearn.metrics",
            "sklearn.preprocessing",
            "statsmodels.api",
            "statsmodels.formula.api",
        ],
    },
];

/// The warm profile of runtimes without a recipe of their own.
pub const WARM_EXEC: &str = "exec";

/// What warm jails run before the request arrives.
pub mod warm {
    /// Preloaded once by the Python fork-server (after the plot hook shared
    /// with cold runs); defines `_kiln_zygote.run`, which runs one program in
    /// a fresh fork exactly like `python3 -u main.py`.
    pub const PYTHON_TEMPLATE: &str = include_str!("lang/warm/python_template.py");
    /// The plot hook shared with cold runs, prepended to every template.
    pub const PYTHON_PLOT_HOOK: &str = include_str!("lang/python/kiln_plot.py");

    /// The fork-server's preload for a template that imports the common
    /// stdlib set (or, `stdlib` false, none of it) and `modules` (the hook,
    /// the module list, the switch, the programs it compiles once, the
    /// template). A template with the stdlib set compiles the `py` kernel
    /// ([`PYTHON_KERNEL`] at [`PYTHON_KERNEL_PATH`]), so a kernel's fork runs
    /// that code instead of compiling its program again (~3 ms of CPU per
    /// kernel start); kernels fork only those templates (lean, data, rich),
    /// never the min one, which stays as small as it is.
    pub fn python_preload(stdlib: bool, modules: &[&str]) -> String {
        let list: String = modules.iter().map(|m| format!("{m:?}, ")).collect();
        let programs = if stdlib {
            let hex = hex::encode(PYTHON_KERNEL);
            format!("{PYTHON_KERNEL_PATH:?}: bytes.fromhex(\"{hex}\")")
        } else {
            String::new()
        };
        let stdlib = if stdlib { "True" } else { "False" };
        format!(
            "{PYTHON_PLOT_HOOK}\n_kiln_preload = ({list})\n_kiln_stdlib = {stdlib}\n\
             _kiln_programs = {{{programs}}}\n\n{PYTHON_TEMPLATE}"
        )
    }
    /// Started in a parked `js` jail at `/etc/kiln/node_warm.js`: reads the
    /// go on stdin, then runs the user's `index.js` as node's main module.
    pub const NODE_BOOTSTRAP: &str = include_str!("lang/warm/node_warm.js");
    /// A live `py` kernel (a session's program), placed at
    /// `/etc/kiln/<PYTHON_KERNEL_NAME>` in the kernel's jail and run like a
    /// program by a fork of a template: evaluates framed requests on stdin
    /// and answers in frames on stdout (the protocol is at its top).
    pub const PYTHON_KERNEL: &str = include_str!("lang/warm/python_kernel.py");
    /// Its file name under `/etc/kiln/`.
    pub const PYTHON_KERNEL_NAME: &str = "kiln_kernel.py";
    /// Its path in the kernel's jail (the program its go runs).
    pub const PYTHON_KERNEL_PATH: &str = "/etc/kiln/kiln_kernel.py";
    /// A live `js` kernel: the pre-started program of a `js` jail, placed at
    /// `/etc/kiln/<NODE_KERNEL_NAME>`; reads the go like
    /// [`NODE_BOOTSTRAP`], then evaluates framed requests (the protocol is
    /// at its top; it is [`PYTHON_KERNEL`]'s).
    pub const NODE_KERNEL: &str = include_str!("lang/warm/node_kernel.js");
    /// Its file name under `/etc/kiln/`.
    pub const NODE_KERNEL_NAME: &str = "node_kernel.js";
}

/// The jail environment every runtime starts from; a runtime's own
/// variables ([`LanguageSpec::env`]) win over these.
const BASE_ENV: &[(&str, &str)] = &[
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("HOME", WORKSPACE),
    ("USER", "sandbox"),
    ("LOGNAME", "sandbox"),
    ("LANG", "C.UTF-8"),
    ("LC_ALL", "C.UTF-8"),
    ("TMPDIR", "/tmp"),
    ("TERM", "dumb"),
    ("OPENBLAS_NUM_THREADS", "1"),
    ("MKL_NUM_THREADS", "1"),
    ("OMP_NUM_THREADS", "1"),
];

/// Every runtime Kiln knows. Order is the order `health` lists them in
/// (py and js first: other crates' tests rely on it).
pub static LANGUAGES: &[LanguageSpec] = &[
    LanguageSpec {
        name: "py",
        aliases: &["python", "python3"],
        entry_file: "main.py",
        compile: None,
        run: &["/usr/bin/python3", "-u", "{entry}"],
        env: &[
            ("PYTHONUNBUFFERED", "1"),
            ("PYTHONDONTWRITEBYTECODE", "1"),
            ("MPLBACKEND", "Agg"),
            ("MPLCONFIGDIR", "/tmp/.mpl"),
            // pyarrow (which pandas 2 imports when installed) otherwise starts
            // jemalloc's background thread at import: a template that
            // imports pandas could not fork (the fork-server needs one thread)
            ("JE_ARROW_MALLOC_CONF", "background_thread:false"),
            // sitecustomize.py: plt.show() saves plot_<n>.png
            ("PYTHONPATH", "{support}/python"),
        ],
        version: &["/usr/bin/python3", "--version"],
        requires: &["/usr/bin/python3"],
        compile_timeout: FAST_COMPILE,
        support_files: &[SupportFile {
            name: "python/sitecustomize.py",
            contents: concat!(
                include_str!("lang/python/kiln_plot.py"),
                include_str!("lang/python/sitecustomize.py")
            ),
            // plt.show() needs pyplot, imported by name, via seaborn or pylab
            when_code_contains: &["matplotlib", "seaborn", "pylab"],
        }],
        etc: &["python3", "python3.11", "matplotlibrc"],
        common_name: "python",
        warm: Some(WarmRecipe::Embedded {
            interpreter: "/usr/bin/python3",
            templates: PY_TEMPLATES,
        }),
        kernel: Some(KernelRecipe::Python),
        tools: Some(ToolSurface {
            names: &["python", "py"],
            style: ToolStyle::Python,
        }),
    },
    LanguageSpec {
        name: "js",
        aliases: &[
            "javascript",
            "node",
            "nodejs",
            "node-js",
            "node-javascript",
            "bun",
            "bun-js",
        ],
        entry_file: "index.js",
        compile: None,
        run: &["/usr/bin/node", "{entry}"],
        env: &[],
        version: &["/usr/bin/node", "--version"],
        requires: &["/usr/bin/node"],
        compile_timeout: FAST_COMPILE,
        support_files: &[],
        etc: &[],
        common_name: "javascript",
        warm: Some(WarmRecipe::Prestart {
            // node runs index.js itself once the preloaded bootstrap has
            // read the go: same main module and stack as a cold run
            argv: &[
                "/usr/bin/node",
                "--require",
                "/etc/kiln/node_warm.js",
                "{entry}",
            ],
            etc_files: &[("node_warm.js", warm::NODE_BOOTSTRAP)],
        }),
        kernel: Some(KernelRecipe::Node),
        tools: None,
    },
    LanguageSpec {
        name: "ts",
        aliases: &["typescript", "bun-ts", "bun-typescript"],
        entry_file: "main.ts",
        // esbuild strips the types (no type checking, like Bun, which the
        // hosted API runs TypeScript with) into an ES module. The banner gives
        // the module CommonJS's `require`, `__filename` and `__dirname` as
        // globals, so both `import` and `require` styles run; globals, not
        // declarations, so code that defines its own does not clash.
        compile: Some(&[
            "/usr/bin/esbuild",
            "{entry}",
            "--outfile={build}/main.mjs",
            "--format=esm",
            "--platform=node",
            "--target=node18",
            "--sourcemap",
            "--log-level=warning",
            "--color=false",
            "--banner:js=import { createRequire as __kilnCreateRequire } from 'node:module'; \
             globalThis.require = __kilnCreateRequire('/mnt/data/main.ts'); \
             globalThis.__filename = '/mnt/data/main.ts'; globalThis.__dirname = '/mnt/data';",
        ]),
        run: &["/usr/bin/node", "--enable-source-maps", "{build}/main.mjs"],
        env: &[],
        version: &[
            "/bin/sh",
            "-c",
            "echo \"esbuild $(/usr/bin/esbuild --version) on node $(/usr/bin/node --version)\"",
        ],
        requires: &["/usr/bin/esbuild", "/usr/bin/node"],
        compile_timeout: FAST_COMPILE,
        support_files: &[],
        etc: &[],
        common_name: "typescript",
        warm: None,
        kernel: None,
        tools: None,
    },
    LanguageSpec {
        name: "c",
        aliases: &["gcc"],
        entry_file: "main.c",
        compile: Some(&[
            "/usr/bin/gcc",
            "-std=gnu17",
            "-O2",
            "-o",
            "{build}/main",
            "{entry}",
            "-lm",
        ]),
        run: &["{build}/main"],
        env: &[],
        version: &["/usr/bin/gcc", "--version"],
        requires: &["/usr/bin/gcc"],
        compile_timeout: FAST_COMPILE,
        support_files: &[],
        etc: &[],
        common_name: "c",
        warm: None,
        kernel: None,
        tools: None,
    },
    LanguageSpec {
        name: "cpp",
        aliases: &["c++", "cxx", "g++"],
        entry_file: "main.cpp",
        compile: Some(&[
            "/usr/bin/g++",
            "-std=gnu++20",
            "-O2",
            "-o",
            "{build}/main",
            "{entry}",
        ]),
        run: &["{build}/main"],
        env: &[],
        version: &["/usr/bin/g++", "--version"],
        requires: &["/usr/bin/g++"],
        compile_timeout: SLOW_COMPILE,
        support_files: &[],
        etc: &[],
        common_name: "cpp",
        warm: None,
        kernel: None,
        tools: None,
    },
    LanguageSpec {
        name: "java",
        aliases: &[],
        entry_file: "Main.java",
        // javac.sh compiles Main.java whatever its public class is called and
        // records the class to run in {build}/main-class. Both JVMs are sized
        // from the memory limit (a jail has no /sys, so the JVM cannot see its
        // cgroup and would size its heap from the host's RAM) and use the
        // serial collector (few threads: the pids limit counts threads).
        compile: Some(&[
            "/bin/bash",
            "{support}/javac.sh",
            "-J-XX:+UseSerialGC",
            "-J-XX:TieredStopAtLevel=1",
            "-J-XX:-UsePerfData",
            "-J-XX:MaxRAM={memory_mb}m",
            "-J-XX:MaxRAMPercentage=60",
        ]),
        run: &[
            "/usr/bin/java",
            "-XX:+UseSerialGC",
            "-XX:-UsePerfData",
            "-XX:MaxRAM={memory_mb}m",
            "-XX:MaxRAMPercentage=60",
            "-cp",
            "{build}/classes",
            "@{build}/main-class",
        ],
        env: &[],
        version: &["/usr/bin/java", "--version"],
        requires: &[
            "/usr/bin/java",
            "/usr/bin/javac",
            "/bin/bash",
            "/usr/bin/sed",
        ],
        compile_timeout: SLOW_COMPILE,
        support_files: &[SupportFile {
            name: "javac.sh",
            contents: include_str!("lang/javac.sh"),
            when_code_contains: &[],
        }],
        etc: &["java-17-openjdk"],
        common_name: "java",
        warm: None,
        kernel: None,
        tools: None,
    },
    LanguageSpec {
        name: "php",
        aliases: &[],
        entry_file: "index.php",
        compile: None,
        run: &["/usr/bin/php", "{entry}"],
        env: &[],
        version: &["/usr/bin/php", "--version"],
        requires: &["/usr/bin/php"],
        compile_timeout: FAST_COMPILE,
        support_files: &[],
        // php.ini and conf.d, which load the extensions (mbstring, xml, ...)
        etc: &["php"],
        common_name: "php",
        warm: None,
        kernel: None,
        tools: None,
    },
    LanguageSpec {
        name: "rs",
        aliases: &["rust", "rustc"],
        entry_file: "main.rs",
        compile: Some(&[
            "/usr/bin/rustc",
            "--edition=2021",
            "-C",
            "opt-level=2",
            "-o",
            "{build}/main",
            "{entry}",
        ]),
        run: &["{build}/main"],
        env: &[],
        version: &["/usr/bin/rustc", "--version"],
        requires: &["/usr/bin/rustc", "/usr/bin/cc"],
        compile_timeout: SLOW_COMPILE,
        support_files: &[],
        etc: &[],
        common_name: "rust",
        warm: None,
        kernel: None,
        tools: None,
    },
    LanguageSpec {
        name: "go",
        aliases: &["golang"],
        entry_file: "main.go",
        // A runtime image's prebuilt standard-library cache (docs/runtimes.md) seeds the
        // run's own cache when there is one: Go 1.20+ ships the library uncompiled.
        compile: Some(&[
            "/bin/sh",
            "-c",
            "if [ -d /usr/local/share/kiln/go-cache ] && [ ! -e {build}/go-cache ]; then \
             cp -r /usr/local/share/kiln/go-cache {build}/go-cache; fi; \
             exec /usr/bin/go build -o {build}/main {entry}",
        ]),
        run: &["{build}/main"],
        // The build cache lives in the run's own workspace (never shared
        // between users) and dies with it. No module proxy: there is no
        // network. Parallelism is bounded so a many-core host cannot run the
        // build into the pids limit.
        env: &[
            ("GOCACHE", "{build}/go-cache"),
            ("GOPATH", "{build}/go"),
            ("GOPROXY", "off"),
            ("GOTOOLCHAIN", "local"),
            ("GOFLAGS", "-p=2"),
            ("GOMAXPROCS", "4"),
        ],
        version: &["/usr/bin/go", "version"],
        requires: &["/usr/bin/go"],
        compile_timeout: SLOW_COMPILE,
        support_files: &[],
        etc: &[],
        common_name: "go",
        warm: None,
        kernel: None,
        tools: None,
    },
    LanguageSpec {
        name: "d",
        aliases: &["dlang", "gdc"],
        entry_file: "main.d",
        // GDC (GCC's D front end) finds Phobos beside itself; LDC would need
        // /etc/ldc2.conf inside the jail.
        compile: Some(&["/usr/bin/gdc", "-O2", "-o", "{build}/main", "{entry}"]),
        run: &["{build}/main"],
        env: &[],
        version: &["/usr/bin/gdc", "--version"],
        requires: &["/usr/bin/gdc"],
        compile_timeout: SLOW_COMPILE,
        support_files: &[],
        etc: &[],
        common_name: "d",
        warm: None,
        kernel: None,
        tools: None,
    },
    LanguageSpec {
        name: "f90",
        aliases: &["fortran", "gfortran", "f95"],
        entry_file: "main.f90",
        compile: Some(&[
            "/usr/bin/gfortran",
            "-O2",
            "-J",
            "{build}",
            "-o",
            "{build}/main",
            "{entry}",
        ]),
        run: &["{build}/main"],
        env: &[],
        version: &["/usr/bin/gfortran", "--version"],
        requires: &["/usr/bin/gfortran"],
        compile_timeout: FAST_COMPILE,
        support_files: &[],
        etc: &[],
        common_name: "fortran",
        warm: None,
        kernel: None,
        tools: None,
    },
    LanguageSpec {
        name: "r",
        aliases: &["rscript"],
        entry_file: "main.r",
        compile: None,
        run: &["/usr/bin/Rscript", "{entry}"],
        // Rprofile: the default graphics device writes plot_<n>.png (Cairo)
        env: &[("R_PROFILE_USER", "{support}/Rprofile")],
        version: &["/usr/bin/Rscript", "--version"],
        requires: &["/usr/bin/Rscript"],
        compile_timeout: FAST_COMPILE,
        support_files: &[SupportFile {
            name: "Rprofile",
            contents: include_str!("lang/Rprofile"),
            when_code_contains: &[],
        }],
        etc: &["R"],
        common_name: "r",
        warm: None,
        kernel: None,
        tools: None,
    },
    LanguageSpec {
        name: "bash",
        aliases: &["sh", "shell"],
        entry_file: "script.sh",
        compile: None,
        run: &["/bin/bash", "{entry}"],
        // Bash is the glue: every other runtime is on PATH (python3, node,
        // gcc, java, go, Rscript, ...). Their caches default to $HOME (the
        // workspace); matplotlib falls back to Agg without a display.
        env: &[],
        version: &["/bin/bash", "--version"],
        requires: &["/bin/bash"],
        compile_timeout: FAST_COMPILE,
        support_files: &[],
        etc: &[],
        common_name: "bash",
        warm: None,
        kernel: None,
        tools: Some(ToolSurface {
            names: &["bash"],
            style: ToolStyle::Shell,
        }),
    },
];

/// A resolved language: a reference into [`LANGUAGES`].
#[derive(Debug, Clone, Copy)]
pub struct Language(&'static LanguageSpec);

impl Language {
    /// Resolve a client-supplied name or alias, case-insensitively.
    pub fn resolve(name: &str) -> Option<Language> {
        let name = name.trim();
        LANGUAGES
            .iter()
            .find(|l| {
                l.name.eq_ignore_ascii_case(name)
                    || l.aliases.iter().any(|a| a.eq_ignore_ascii_case(name))
            })
            .map(Language)
    }

    pub fn spec(&self) -> &'static LanguageSpec {
        self.0
    }

    pub fn name(&self) -> &'static str {
        self.0.name
    }

    pub fn all() -> impl Iterator<Item = Language> {
        LANGUAGES.iter().map(Language)
    }

    /// Its live kernel's recipe, if it has a kernel.
    pub fn kernel(&self) -> Option<KernelRecipe> {
        self.0.kernel
    }

    /// The languages that have a live kernel, in table order.
    pub fn with_kernels() -> impl Iterator<Item = Language> {
        Language::all().filter(|l| l.kernel().is_some())
    }

    /// The kernel language of faces whose kernels name no language (seed
    /// 003's runtime sessions, seed 004's workers, LibreChat's live runtime
    /// sessions): the table's first language with a kernel, Python.
    pub fn default_kernel() -> Language {
        Language::with_kernels()
            .next()
            .unwrap_or(Language(&LANGUAGES[0]))
    }

    /// How programmatic tool calling offers tools to it, if it does.
    pub fn tools(&self) -> Option<&'static ToolSurface> {
        self.0.tools.as_ref()
    }

    /// The language `/exec/programmatic` means by `name` (exactly as
    /// spelled, see [`ToolSurface::names`]); `None`: it runs no such one.
    pub fn for_tools(name: &str) -> Option<Language> {
        Language::all().find(|l| l.tools().is_some_and(|t| t.names.contains(&name)))
    }

    /// What `/exec/programmatic` runs when the request names no language:
    /// the table's first language with tools, Python.
    pub fn default_for_tools() -> Language {
        Language::all()
            .find(|l| l.tools().is_some())
            .unwrap_or(Language(&LANGUAGES[0]))
    }

    /// The POSIX shell (`bash`): what the sandbox bridge runs its launcher
    /// with.
    pub fn shell() -> Option<Language> {
        Language::all().find(|l| l.tools().is_some_and(|t| t.style == ToolStyle::Shell))
    }

    /// The run argv with placeholders filled and `args` appended.
    pub fn run_argv(&self, args: &[String], limits: &Limits) -> Vec<String> {
        let mut v = self.fill_all(self.0.run, limits);
        v.extend(args.iter().cloned());
        v
    }

    /// The compile argv, if this runtime compiles.
    pub fn compile_argv(&self, limits: &Limits) -> Option<Vec<String>> {
        self.0.compile.map(|c| self.fill_all(c, limits))
    }

    /// This runtime's own environment with placeholders filled.
    pub fn env(&self, limits: &Limits) -> Vec<(String, String)> {
        self.0
            .env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), self.fill(v, limits)))
            .collect()
    }

    /// The complete environment of a jailed process of this runtime: the
    /// base every runtime shares, then this runtime's own variables
    /// (placeholders filled from `limits`), which win. Nothing from the host.
    pub fn environment(&self, limits: &Limits) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = BASE_ENV
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        env.push(("SANDBOX_LANGUAGE".into(), self.name().into()));
        for (k, v) in self.env(limits) {
            env.retain(|(ek, _)| *ek != k);
            env.push((k, v));
        }
        env
    }

    /// The warm profile an execution of this runtime takes: its own when it
    /// has a recipe and runs in one step, else [`WARM_EXEC`].
    pub fn warm_profile(&self) -> &'static str {
        if self.0.warm.is_some() && self.0.compile.is_none() {
            self.0.name
        } else {
            WARM_EXEC
        }
    }

    /// The warm profile an execution of `code` takes: [`Self::warm_profile`],
    /// or for a runtime with several embedded templates the one its imports
    /// need (see [`pyimports`]).
    pub fn warm_profile_for(&self, code: &str) -> &'static str {
        match &self.0.warm {
            Some(WarmRecipe::Embedded { templates, .. }) if templates.len() > 1 => {
                let kind = pyimports::choose_template(code);
                templates
                    .iter()
                    .find(|t| t.kind == kind)
                    .map_or_else(|| self.warm_profile(), |t| t.profile)
            }
            _ => self.warm_profile(),
        }
    }

    /// The other embedded templates' profiles of the runtime whose template
    /// `profile` is, in the order a run should take them when its own
    /// template is not up: the bigger ones from the nearest (they hold what
    /// it imports), then the smaller ones from the nearest (any template
    /// runs any program; only its speed differs).
    pub fn sibling_profiles(profile: &str) -> Vec<&'static str> {
        let Some(ts) = Language::all()
            .filter_map(|l| match &l.0.warm {
                Some(WarmRecipe::Embedded { templates, .. }) => Some(*templates),
                _ => None,
            })
            .find(|ts| ts.iter().any(|t| t.profile == profile))
        else {
            return Vec::new();
        };
        let own = ts.iter().find(|t| t.profile == profile).map(|t| t.kind);
        let mut bigger: Vec<&EmbeddedTemplate> = ts.iter().filter(|t| Some(t.kind) > own).collect();
        let mut smaller: Vec<&EmbeddedTemplate> =
            ts.iter().filter(|t| Some(t.kind) < own).collect();
        bigger.sort_by_key(|t| t.kind);
        smaller.sort_by_key(|t| std::cmp::Reverse(t.kind));
        bigger
            .into_iter()
            .chain(smaller)
            .map(|t| t.profile)
            .collect()
    }

    /// The prestart argv of its warm recipe, placeholders filled.
    pub fn prestart_argv(&self, limits: &Limits) -> Option<Vec<String>> {
        match &self.0.warm {
            Some(WarmRecipe::Prestart { argv, .. }) => Some(self.fill_all(argv, limits)),
            _ => None,
        }
    }

    /// The support files to stage for `code`.
    pub fn support_files_for<'c>(
        &self,
        code: &'c str,
    ) -> impl Iterator<Item = &'static SupportFile> + 'c {
        self.0.support_files.iter().filter(move |f| {
            f.when_code_contains.is_empty() || f.when_code_contains.iter().any(|w| code.contains(w))
        })
    }

    /// Does the run need [`BUILD_DIR`]? (Every compiled runtime does.)
    pub fn needs_build_dir(&self) -> bool {
        self.0.compile.is_some()
    }

    fn fill_all(&self, template: &[&str], limits: &Limits) -> Vec<String> {
        template.iter().map(|a| self.fill(a, limits)).collect()
    }

    fn fill(&self, template: &str, limits: &Limits) -> String {
        if !template.contains('{') {
            return template.to_owned();
        }
        template
            .replace("{entry}", self.0.entry_file)
            .replace("{build}", &format!("{WORKSPACE}/{BUILD_DIR}"))
            .replace("{support}", &format!("{WORKSPACE}/{SUPPORT_DIR}"))
            .replace(
                "{memory_mb}",
                &(limits.memory_bytes / (1024 * 1024)).to_string(),
            )
    }
}

impl PartialEq for Language {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for Language {}

/// Every host `/etc` entry some runtime reads, each once, in table order.
/// The sandbox binds these read-only into jails.
pub fn etc_binds() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for e in LANGUAGES.iter().flat_map(|l| l.etc.iter().copied()) {
        if !out.contains(&e) {
            out.push(e);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_says_which_languages_have_kernels_and_tools() {
        let names = |it: &mut dyn Iterator<Item = Language>| -> Vec<&str> {
            it.map(|l| l.name()).collect()
        };
        assert_eq!(names(&mut Language::with_kernels()), ["py", "js"]);
        assert_eq!(Language::default_kernel().name(), "py");
        assert_eq!(
            Language::resolve("py").and_then(|l| l.kernel()),
            Some(KernelRecipe::Python)
        );
        assert_eq!(
            Language::resolve("node").and_then(|l| l.kernel()),
            Some(KernelRecipe::Node)
        );
        assert!(Language::resolve("bash").unwrap().kernel().is_none());
        let tools: Vec<&str> = Language::all()
            .filter(|l| l.tools().is_some())
            .map(|l| l.name())
            .collect();
        assert_eq!(tools, ["py", "bash"]);
        assert_eq!(Language::default_for_tools().name(), "py");
        // programmatic names are the contract's, exactly as spelled
        assert_eq!(Language::for_tools("python").map(|l| l.name()), Some("py"));
        assert_eq!(Language::for_tools("py").map(|l| l.name()), Some("py"));
        assert_eq!(Language::for_tools("bash").map(|l| l.name()), Some("bash"));
        for refused in ["python3", "Python", "js", "sh", ""] {
            assert!(Language::for_tools(refused).is_none(), "{refused}");
        }
        assert_eq!(Language::shell().map(|l| l.name()), Some("bash"));
    }

    use super::*;

    fn limits() -> Limits {
        Limits::default()
    }

    /// Everything a table entry expands to, for checks over all entries.
    fn expanded(l: Language) -> Vec<String> {
        let lim = limits();
        let mut all = l.run_argv(&[], &lim);
        all.extend(l.compile_argv(&lim).unwrap_or_default());
        all.extend(l.env(&lim).into_iter().map(|(_, v)| v));
        all
    }

    #[test]
    fn resolves_canonical_names_and_aliases_case_insensitively() {
        assert_eq!(Language::resolve("py").unwrap().name(), "py");
        assert_eq!(Language::resolve("Python").unwrap().name(), "py");
        assert_eq!(Language::resolve("node").unwrap().name(), "js");
        assert_eq!(Language::resolve("sh").unwrap().name(), "bash");
        assert_eq!(Language::resolve("TypeScript").unwrap().name(), "ts");
        assert_eq!(Language::resolve("bun").unwrap().name(), "js");
        assert_eq!(Language::resolve("rust").unwrap().name(), "rs");
        assert_eq!(Language::resolve("golang").unwrap().name(), "go");
        assert_eq!(Language::resolve("fortran").unwrap().name(), "f90");
        assert_eq!(Language::resolve("c++").unwrap().name(), "cpp");
        assert!(Language::resolve("cobol").is_none());
    }

    #[test]
    fn every_language_the_client_offers_is_in_the_table() {
        // @librechat/agents' enum, in its order
        let client = [
            "py", "js", "ts", "c", "cpp", "java", "php", "rs", "go", "d", "f90", "r", "bash",
        ];
        for name in client {
            let l = Language::resolve(name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(l.name(), name);
        }
        assert_eq!(LANGUAGES.len(), client.len());
        // the spec's aliases (§5.4)
        for (alias, name) in [
            ("python", "py"),
            ("javascript", "js"),
            ("bun-js", "js"),
            ("nodejs", "js"),
            ("node-js", "js"),
            ("node-javascript", "js"),
            ("bun-ts", "ts"),
            ("bun-typescript", "ts"),
            ("bash", "bash"),
        ] {
            assert_eq!(Language::resolve(alias).unwrap().name(), name, "{alias}");
        }
    }

    #[test]
    fn run_argv_fills_entry_and_appends_args() {
        let py = Language::resolve("py").unwrap();
        let argv = py.run_argv(&["--flag".into(), "x y".into()], &limits());
        assert_eq!(argv, ["/usr/bin/python3", "-u", "main.py", "--flag", "x y"]);
    }

    #[test]
    fn compiled_languages_build_into_the_hidden_build_dir_and_run_from_it() {
        let lim = limits();
        for l in Language::all().filter(Language::needs_build_dir) {
            let run = l.run_argv(&[], &lim).join(" ");
            assert!(
                run.contains("/mnt/data/.kiln-build/"),
                "{}: run {run}",
                l.name()
            );
            let compile = l.compile_argv(&lim).unwrap().join(" ");
            // directly, or through a staged build script
            assert!(
                compile.contains("/mnt/data/.kiln-build") || compile.contains("/mnt/data/.kiln/"),
                "{}: compile {compile}",
                l.name()
            );
        }
        let c = Language::resolve("c").unwrap();
        assert_eq!(
            c.run_argv(&["a".into()], &lim),
            ["/mnt/data/.kiln-build/main", "a"]
        );
    }

    #[test]
    fn jvm_heap_follows_the_memory_limit() {
        let java = Language::resolve("java").unwrap();
        let lim = Limits {
            memory_bytes: 300 * 1024 * 1024,
            ..Limits::default()
        };
        assert!(
            java.run_argv(&[], &lim)
                .contains(&"-XX:MaxRAM=300m".to_owned())
        );
        assert!(
            java.compile_argv(&lim)
                .unwrap()
                .contains(&"-J-XX:MaxRAM=300m".to_owned())
        );
    }

    #[test]
    fn every_placeholder_is_filled() {
        for l in Language::all() {
            for s in expanded(l) {
                for p in ["{entry}", "{build}", "{support}", "{memory_mb}"] {
                    assert!(!s.contains(p), "{}: {s}", l.name());
                }
            }
        }
    }

    #[test]
    fn caches_and_config_dirs_are_per_run_space() {
        // Anything a runtime writes (caches, outputs) must be per-run space.
        for l in Language::all() {
            for (k, v) in l.env(&limits()) {
                if v.starts_with('/') && (k.ends_with("DIR") || k.starts_with("GO")) {
                    assert!(
                        v.starts_with("/mnt/data/") || v.starts_with("/tmp/"),
                        "{}: {k}={v}",
                        l.name()
                    );
                }
            }
        }
    }

    #[test]
    fn support_files_are_referenced_and_named_safely() {
        for l in LANGUAGES {
            for f in l.support_files {
                assert!(
                    crate::RelPath::parse(f.name).is_ok(),
                    "{}: {}",
                    l.name,
                    f.name
                );
                assert!(!f.contents.is_empty());
                let expanded = expanded(Language(l)).join(" ");
                let dir = f.name.split('/').next().unwrap_or(f.name);
                assert!(
                    expanded.contains(&format!("/mnt/data/.kiln/{dir}")),
                    "{}: support file {} is never used",
                    l.name,
                    f.name
                );
            }
        }
    }

    #[test]
    fn plotting_support_is_staged_only_for_code_that_plots() {
        let py = Language::resolve("py").unwrap();
        assert_eq!(py.support_files_for("print(1)").count(), 0);
        for code in [
            "import matplotlib.pyplot as plt",
            "import seaborn as sns",
            "from pylab import *",
        ] {
            let names: Vec<_> = py.support_files_for(code).map(|f| f.name).collect();
            assert_eq!(names, ["python/sitecustomize.py"], "{code}");
        }
        // unconditional files are always staged
        let r = Language::resolve("r").unwrap();
        assert_eq!(r.support_files_for("cat(1)").count(), 1);
    }

    #[test]
    fn entry_files_are_distinct_plain_names() {
        let mut seen = std::collections::HashSet::new();
        for l in LANGUAGES {
            assert!(crate::RelPath::parse(l.entry_file).is_ok(), "{}", l.name);
            assert!(!l.entry_file.contains('/') && !l.entry_file.starts_with('.'));
            assert!(seen.insert(l.entry_file), "{}", l.entry_file);
        }
    }

    #[test]
    fn programs_and_probes_are_absolute() {
        for l in Language::all() {
            let spec = l.spec();
            assert!(spec.version[0].starts_with('/'), "{}", spec.name);
            assert!(spec.requires.iter().all(|r| r.starts_with('/')));
            assert!(l.run_argv(&[], &limits())[0].starts_with('/'));
            if let Some(c) = l.compile_argv(&limits()) {
                assert!(c[0].starts_with('/'), "{}", spec.name);
            }
        }
    }

    #[test]
    fn etc_binds_are_single_names_listed_once() {
        let binds = etc_binds();
        assert!(binds.contains(&"php") && binds.contains(&"R"));
        for b in &binds {
            assert!(!b.is_empty() && !b.contains('/') && *b != "." && *b != "..");
            assert_eq!(binds.iter().filter(|x| x == &b).count(), 1);
        }
    }

    #[test]
    fn common_names_resolve_to_their_entry() {
        // seed 000 names these six
        for (name, canonical) in [
            ("python", "py"),
            ("javascript", "js"),
            ("java", "java"),
            ("cpp", "cpp"),
            ("go", "go"),
            ("r", "r"),
        ] {
            let l = Language::resolve(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!((l.name(), l.spec().common_name), (canonical, name));
        }
        for l in Language::all() {
            let back = Language::resolve(l.spec().common_name).map(|b| b.name());
            assert_eq!(back, Some(l.name()));
        }
    }

    #[test]
    fn environment_is_the_base_then_the_runtimes_own_values() {
        let py = Language::resolve("py").unwrap();
        let env = py.environment(&limits());
        let get = |k: &str| env.iter().find(|(ek, _)| ek == k).map(|(_, v)| v.as_str());
        assert_eq!(get("HOME"), Some("/mnt/data"));
        assert_eq!(get("SANDBOX_LANGUAGE"), Some("py"));
        assert_eq!(get("PYTHONPATH"), Some("/mnt/data/.kiln/python"));
        // each variable once
        let mut keys: Vec<_> = env.iter().map(|(k, _)| k).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), env.len());
    }

    #[test]
    fn warm_profiles_follow_the_recipes() {
        assert_eq!(Language::resolve("py").unwrap().warm_profile(), "py");
        assert_eq!(Language::resolve("js").unwrap().warm_profile(), "js");
        assert_eq!(Language::resolve("bash").unwrap().warm_profile(), WARM_EXEC);
        // a compiled runtime's steps run in generic jails
        assert_eq!(Language::resolve("c").unwrap().warm_profile(), WARM_EXEC);
        let js = Language::resolve("js").unwrap();
        assert_eq!(
            js.prestart_argv(&limits()).unwrap(),
            [
                "/usr/bin/node",
                "--require",
                "/etc/kiln/node_warm.js",
                "index.js"
            ]
        );
    }

    #[test]
    fn cold_and_warm_python_share_one_plot_hook() {
        let hook = include_str!("lang/python/kiln_plot.py");
        let py = Language::resolve("py").unwrap();
        let cold = py
            .support_files_for("import matplotlib.pyplot")
            .next()
            .unwrap()
            .contents;
        let warm: Vec<String> = PY_TEMPLATES.iter().map(EmbeddedTemplate::preload).collect();
        assert!(cold.starts_with(hook) && warm.iter().all(|w| w.starts_with(hook)));
        // neither file defines a show() of its own
        for text in
            std::iter::once(&cold[hook.len()..]).chain(warm.iter().map(|w| &w[hook.len()..]))
        {
            assert!(!text.contains("def show("), "a second plt.show() hook");
            assert!(text.contains("_kiln_patch_pyplot(") || text.contains("_kiln_hook_pyplot("));
        }
    }

    #[test]
    fn python_runs_take_the_template_their_imports_need() {
        let py = Language::resolve("py").unwrap();
        assert_eq!(py.warm_profile_for("print('hello')"), "py-min");
        assert_eq!(
            py.warm_profile_for("import math\nprint(math.sqrt(2))"),
            "py-min"
        );
        assert_eq!(
            py.warm_profile_for("import json\nprint(json.dumps(1))"),
            "py-lean"
        );
        assert_eq!(py.warm_profile_for("import pandas as pd"), "py-data");
        assert_eq!(py.warm_profile_for("import seaborn"), "py");
        assert_eq!(py.warm_profile_for("__import__('os')"), "py");
        // the rich template is the runtime's own profile (the default)
        assert_eq!(py.warm_profile(), "py");
        // other runtimes ignore the code
        let js = Language::resolve("js").unwrap();
        assert_eq!(js.warm_profile_for("require('fs')"), "js");
        for (profile, siblings) in [
            ("py-min", ["py-lean", "py-data", "py"]),
            ("py-lean", ["py-data", "py", "py-min"]),
            ("py-data", ["py", "py-lean", "py-min"]),
            ("py", ["py-data", "py-lean", "py-min"]),
        ] {
            assert_eq!(Language::sibling_profiles(profile), siblings, "{profile}");
        }
        assert!(Language::sibling_profiles("js").is_empty());
    }

    #[test]
    fn the_templates_kernels_fork_carry_the_kernel_program_to_compile_once_and_the_min_one_none() {
        assert_eq!(
            warm::PYTHON_KERNEL_PATH,
            format!("/etc/kiln/{}", warm::PYTHON_KERNEL_NAME)
        );
        let hex = hex::encode(warm::PYTHON_KERNEL);
        let programs = format!(
            "\n_kiln_programs = {{\"/etc/kiln/kiln_kernel.py\": bytes.fromhex(\"{hex}\")}}\n"
        );
        for t in PY_TEMPLATES {
            let preload = t.preload();
            if t.kind == pyimports::PyTemplate::Min {
                assert!(preload.contains("\n_kiln_programs = {}\n"), "{}", t.profile);
            } else {
                assert!(preload.contains(&programs), "{}", t.profile);
            }
        }
    }

    #[test]
    fn each_template_preloads_its_modules_and_the_lean_and_min_ones_none() {
        let get = |p: &str| PY_TEMPLATES.iter().find(|t| t.profile == p).unwrap();
        let (min, lean, data, rich) = (get("py-min"), get("py-lean"), get("py-data"), get("py"));
        assert!(
            rich.preload()
                .contains("_kiln_preload = (\"numpy\", \"pandas\"")
        );
        assert!(rich.preload().contains("\"statsmodels.api\""));
        assert!(data.preload().contains(
            "\n_kiln_preload = (\"numpy\", \"pandas\", \"matplotlib\", \"matplotlib.pyplot\", )\n"
        ));
        assert!(
            lean.preload()
                .contains("\n_kiln_preload = ()\n_kiln_stdlib = True\n")
        );
        // the min one not even the common stdlib set; every other one does
        assert!(
            min.preload()
                .contains("\n_kiln_preload = ()\n_kiln_stdlib = False\n")
        );
        for t in PY_TEMPLATES {
            assert_eq!(
                t.preload().contains("\n_kiln_stdlib = True\n"),
                t.kind != pyimports::PyTemplate::Min,
                "{}",
                t.profile
            );
        }
        // smallest first
        assert!(PY_TEMPLATES.windows(2).all(|w| w[0].kind < w[1].kind));
        // a bigger template holds everything a smaller one does
        for m in data.modules {
            assert!(rich.modules.contains(m), "{m}");
        }
        // the scan sends every module a template preloads to that template or a smaller one
        for t in PY_TEMPLATES {
            for m in t.modules {
                let chosen = pyimports::choose_template(&format!("import {m}"));
                assert!(chosen <= t.kind, "{m}: {chosen:?} for {:?}", t.kind);
            }
        }
        for m in data.modules {
            assert_eq!(
                pyimports::choose_template(&format!("import {m}")),
                data.kind,
                "{m}"
            );
        }
    }

    #[test]
    fn names_and_aliases_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for l in LANGUAGES {
            assert!(seen.insert(l.name.to_ascii_lowercase()), "{}", l.name);
            for a in l.aliases {
                assert!(seen.insert(a.to_ascii_lowercase()), "{a}");
            }
        }
    }
}
