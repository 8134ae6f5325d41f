//! What a failed program tried to import and the runtime image lacks.
//!
//! Models write `import polars` or `library(Cairo)` whether or not the image
//! has it; the error such a program dies with names the module. Reading that
//! name out of a run's stderr lets the server count, per module, what the
//! programs it runs reach for and do not find (the
//! `kiln_missing_modules_total` series), which is how an operator measures
//! what to add to an image (docs/runtimes.md). Pure text: no IO.

/// The module system whose error named the module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ecosystem {
    /// `ModuleNotFoundError: No module named 'x'`.
    Python,
    /// `Cannot find module 'x'` (CommonJS) or `Cannot find package 'x'` (ES modules).
    Node,
    /// `there is no package called 'x'` (`library()`, `loadNamespace()`).
    R,
}

impl Ecosystem {
    /// The label value of the series.
    pub fn name(self) -> &'static str {
        match self {
            Ecosystem::Python => "python",
            Ecosystem::Node => "node",
            Ecosystem::R => "r",
        }
    }
}

/// A module a program asked for and did not get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing<'a> {
    pub ecosystem: Ecosystem,
    /// The top-level name: `sklearn` for `sklearn.ensemble`, `@scope/pkg`
    /// for `@scope/pkg/sub`.
    pub module: &'a str,
}

/// How far back from the end of stderr the error is looked for: the error
/// that ended the program is at the end, and a program's own output before
/// it can be large.
const TAIL: usize = 4096;
/// Longest module name counted; longer ones are not plausible imports.
const MAX_NAME: usize = 64;

/// The module whose absence ended the program, read from its stderr (the
/// last such error in the last [`TAIL`] bytes), or `None`.
pub fn missing_module(stderr: &str) -> Option<Missing<'_>> {
    let mut start = stderr.len().saturating_sub(TAIL);
    while !stderr.is_char_boundary(start) {
        start += 1;
    }
    stderr[start..].lines().rev().find_map(parse_line)
}

fn parse_line(line: &str) -> Option<Missing<'_>> {
    const FORMS: &[(&str, Ecosystem)] = &[
        ("ModuleNotFoundError: No module named ", Ecosystem::Python),
        ("Cannot find module ", Ecosystem::Node),
        ("Cannot find package ", Ecosystem::Node),
        ("there is no package called ", Ecosystem::R),
    ];
    FORMS.iter().find_map(|(marker, eco)| {
        let at = line.find(marker)? + marker.len();
        let name = quoted(&line[at..])?;
        let module = top_level(*eco, name)?;
        Some(Missing {
            ecosystem: *eco,
            module,
        })
    })
}

/// The text between the opening quote at the start of `s` and its closing
/// quote: `'x'`, `"x"` or R's `‘x’`.
fn quoted(s: &str) -> Option<&str> {
    let open = s.chars().next()?;
    let close = match open {
        '\'' | '"' => open,
        '‘' => '’',
        _ => return None,
    };
    let rest = &s[open.len_utf8()..];
    Some(&rest[..rest.find(close)?])
}

/// The name an image would have to add, or `None` when `name` is not a
/// package name at all (a relative path, a file, something made up of
/// characters no package name has).
fn top_level(eco: Ecosystem, name: &str) -> Option<&str> {
    let top = match eco {
        Ecosystem::Python => name.split('.').next()?,
        Ecosystem::Node => {
            let mut parts = name.splitn(3, '/');
            let first = parts.next()?;
            if let Some(scope) = first.strip_prefix('@') {
                let pkg = parts.next()?;
                if scope.is_empty() || pkg.is_empty() {
                    return None;
                }
                &name[..first.len() + 1 + pkg.len()]
            } else {
                first
            }
        }
        Ecosystem::R => name,
    };
    let ok = match eco {
        Ecosystem::Python => {
            top.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && top.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        // npm's rules: lower case, no leading dot or underscore; `node:`
        // built-ins and paths (`./x`, `/x`) are not packages (`top` holds a
        // `/` only as its scope's, as it was cut above)
        Ecosystem::Node => {
            let bare = top.strip_prefix('@').unwrap_or(top);
            bare.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && bare
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-._~/".contains(c))
        }
        Ecosystem::R => {
            top.starts_with(|c: char| c.is_ascii_alphabetic())
                && top.chars().all(|c| c.is_ascii_alphanumeric() || c == '.')
        }
    };
    (ok && top.len() <= MAX_NAME).then_some(top)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(stderr: &str) -> Option<(&'static str, &str)> {
        missing_module(stderr).map(|m| (m.ecosystem.name(), m.module))
    }

    #[test]
    fn python_import_errors_name_the_top_level_package() {
        let tb = "Traceback (most recent call last):\n  File \"/mnt/data/main.py\", line 1, in <module>\n    import polars as pl\nModuleNotFoundError: No module named 'polars'\n";
        assert_eq!(found(tb), Some(("python", "polars")));
        assert_eq!(
            found("ModuleNotFoundError: No module named 'sklearn.ensemble._forest'"),
            Some(("python", "sklearn"))
        );
    }

    #[test]
    fn node_errors_name_the_package_with_its_scope() {
        let cjs = "node:internal/modules/cjs/loader:1228\n  throw err;\n  ^\n\nError: Cannot find module 'pptxgenjs'\nRequire stack:\n- /mnt/data/main.js\n";
        assert_eq!(found(cjs), Some(("node", "pptxgenjs")));
        let esm = "Error [ERR_MODULE_NOT_FOUND]: Cannot find package '@napi-rs/canvas' imported from /mnt/data/main.mjs";
        assert_eq!(found(esm), Some(("node", "@napi-rs/canvas")));
        assert_eq!(
            found("Error: Cannot find module 'lodash/fp'"),
            Some(("node", "lodash"))
        );
    }

    #[test]
    fn r_errors_name_the_package_in_either_quote_style() {
        let r = "Error in library(Cairo) : there is no package called ‘Cairo’\nExecution halted\n";
        assert_eq!(found(r), Some(("r", "Cairo")));
        assert_eq!(
            found("Error: there is no package called 'data.table'"),
            Some(("r", "data.table"))
        );
    }

    #[test]
    fn paths_files_and_made_up_names_are_not_counted() {
        for stderr in [
            "Error: Cannot find module './helpers'",
            "Error: Cannot find module '/mnt/data/x.js'",
            "Error: Cannot find module 'node:fs'",
            "ModuleNotFoundError: No module named 'a b'",
            "ModuleNotFoundError: No module named '../etc'",
            "there is no package called ‘Cairo; rm’",
            "ModuleNotFoundError: No module named 'polars", // no closing quote
            "everything went fine",
        ] {
            assert_eq!(found(stderr), None, "{stderr}");
        }
        let long = format!("ModuleNotFoundError: No module named '{}'", "a".repeat(65));
        assert_eq!(found(&long), None);
    }

    #[test]
    fn the_last_error_counts_and_only_the_tail_is_read() {
        let two = "ModuleNotFoundError: No module named 'first'\nModuleNotFoundError: No module named 'second'\n";
        assert_eq!(found(two), Some(("python", "second")));
        let buried = format!(
            "ModuleNotFoundError: No module named 'early'\n{}",
            "é".repeat(TAIL)
        );
        assert_eq!(
            found(&buried),
            None,
            "an error 4 KiB before the end is not it"
        );
    }
}
