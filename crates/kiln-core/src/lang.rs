//! The language table: one declarative entry per runtime.
//!
//! Adding a language means adding an entry to [`LANGUAGES`]; the executor has
//! no per-language branches. Placeholders in command lines: `{entry}` is the
//! entry file name (relative to `/mnt/data`), `{out}` a build output path in
//! the jail's writable space.

use std::time::Duration;

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
    /// Compile-step wall-time limit (compilers get their own budget).
    pub compile_timeout: Duration,
}

/// Every runtime Kiln knows. Order is the order `health` lists them in.
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
        ],
        version: &["/usr/bin/python3", "--version"],
        requires: &["/usr/bin/python3"],
        compile_timeout: Duration::from_secs(10),
    },
    LanguageSpec {
        name: "js",
        aliases: &["javascript", "node", "nodejs", "node-js", "node-javascript"],
        entry_file: "index.js",
        compile: None,
        run: &["/usr/bin/node", "{entry}"],
        env: &[],
        version: &["/usr/bin/node", "--version"],
        requires: &["/usr/bin/node"],
        compile_timeout: Duration::from_secs(10),
    },
    LanguageSpec {
        name: "bash",
        aliases: &["sh", "shell"],
        entry_file: "script.sh",
        compile: None,
        run: &["/bin/bash", "{entry}"],
        env: &[],
        version: &["/bin/bash", "--version"],
        requires: &["/bin/bash"],
        compile_timeout: Duration::from_secs(10),
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

    /// The run argv with placeholders filled and `args` appended.
    pub fn run_argv(&self, args: &[String]) -> Vec<String> {
        let mut v = fill(self.0.run, self.0.entry_file);
        v.extend(args.iter().cloned());
        v
    }

    /// The compile argv, if this runtime compiles.
    pub fn compile_argv(&self) -> Option<Vec<String>> {
        self.0.compile.map(|c| fill(c, self.0.entry_file))
    }
}

impl PartialEq for Language {
    fn eq(&self, other: &Self) -> bool {
        self.0.name == other.0.name
    }
}

fn fill(template: &[&str], entry: &str) -> Vec<String> {
    template
        .iter()
        .map(|a| a.replace("{entry}", entry))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_canonical_names_and_aliases_case_insensitively() {
        assert_eq!(Language::resolve("py").unwrap().name(), "py");
        assert_eq!(Language::resolve("Python").unwrap().name(), "py");
        assert_eq!(Language::resolve("node").unwrap().name(), "js");
        assert_eq!(Language::resolve("sh").unwrap().name(), "bash");
        assert!(Language::resolve("cobol").is_none());
    }

    #[test]
    fn run_argv_fills_entry_and_appends_args() {
        let py = Language::resolve("py").unwrap();
        let argv = py.run_argv(&["--flag".into(), "x y".into()]);
        assert_eq!(argv, ["/usr/bin/python3", "-u", "main.py", "--flag", "x y"]);
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
