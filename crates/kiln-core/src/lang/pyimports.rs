//! Which warm Python template a program should be forked from, decided by a
//! static scan of its imports.
//!
//! Kiln keeps four templates, one fork-server each (see
//! `warm/python_template.py`): a min one (the interpreter with no more
//! loaded than a cold `python3 -c pass` and what the template's own `run`
//! needs), a lean one (the stdlib modules scripts use most), a data one
//! (numpy, pandas, matplotlib on top) and a rich one (seaborn, scipy,
//! scikit-learn, statsmodels too). Forking and tearing down a bigger
//! template costs more CPU per run, so a program runs in the smallest one
//! that holds what it imports (or, for min, imports it cheaply). The scan is
//! deliberately simple and errs towards rich:
//! every `import a.b` / `from a.b import c` anywhere (inside functions,
//! `try`, after `;` or `:`) counts, strings and comments are skipped, and
//! anything that imports by name at run time (`__import__`, `importlib`,
//! `exec`/`eval`, unpickling) or any module outside the standard library
//! picks the rich one. A wrong guess costs time, never behaviour: both
//! templates run any program exactly like `python3 main.py`.

use std::collections::BTreeSet;

/// The templates, smallest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PyTemplate {
    /// The interpreter alone: programs that import nothing, or only
    /// [`MIN_MODULES`].
    Min,
    /// The interpreter and common stdlib modules.
    Lean,
    /// Lean plus numpy, pandas and matplotlib ([`DATA_MODULES`]).
    Data,
    /// Data plus seaborn, scipy, scikit-learn and statsmodels: every other
    /// module, and any program the scan cannot see through.
    Rich,
}

/// Modules the min template holds or that a program forked from it imports
/// for less than the CPU the min template saves against the lean one
/// (≈ 1 ms per run: the lean one's fork and exit cost more). Measured with
/// the image's CPython 3.13 (BENCHMARKS.md, "A min `py` template"):
/// `json`, `re`, `string`, `collections`, `functools`, `random` or `array`
/// cost 2–8 ms to import in the child, more than the fork saves, so they
/// (and every other stdlib module) take the lean template.
pub const MIN_MODULES: &[&str] = &[
    "__future__",
    "_thread",
    "abc",
    "atexit",
    "bisect",
    "builtins",
    "cmath",
    "codecs",
    "datetime",
    "errno",
    "gc",
    "genericpath",
    "heapq",
    "io",
    "itertools",
    "marshal",
    "math",
    "os",
    "posix",
    "posixpath",
    "stat",
    "struct",
    "sys",
    "time",
];

/// Top-level modules the data template holds (or imports cheaply).
pub const DATA_MODULES: &[&str] = &["numpy", "pandas", "matplotlib", "mpl_toolkits", "pylab"];

/// What a scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PyImports {
    /// Top-level names of the modules imported by statement (`a` of `a.b`);
    /// relative imports are left out.
    pub modules: BTreeSet<String>,
    /// The code may import by name at run time (see the module doc).
    pub dynamic: bool,
}

impl PyImports {
    /// The smallest template that holds (or cheaply imports) everything
    /// found.
    pub fn template(&self) -> PyTemplate {
        if self.dynamic {
            return PyTemplate::Rich;
        }
        self.modules
            .iter()
            .map(|m| match m.as_str() {
                m if RUNS_IMPORTS_BY_NAME.contains(&m) => PyTemplate::Rich,
                m if MIN_MODULES.contains(&m) => PyTemplate::Min,
                m if is_stdlib(m) => PyTemplate::Lean,
                m if DATA_MODULES.contains(&m) => PyTemplate::Data,
                _ => PyTemplate::Rich,
            })
            .max()
            .unwrap_or(PyTemplate::Min)
    }
}

/// A standard library module (private ones, `_thread` say, all are).
fn is_stdlib(module: &str) -> bool {
    module.starts_with('_') || STDLIB.contains(&module)
}

/// The template for `code`.
pub fn choose_template(code: &str) -> PyTemplate {
    scan(code).template()
}

/// Stdlib modules that import other modules by name from data (a pickled
/// DataFrame imports pandas; `runpy` runs any module).
const RUNS_IMPORTS_BY_NAME: &[&str] = &[
    "importlib",
    "pickle",
    "shelve",
    "runpy",
    "pkgutil",
    "imp",
    "zipimport",
];

/// Names that import (or run code that may import) by name at run time.
const DYNAMIC_MARKERS: &[&str] = &["__import__", "importlib", "exec", "eval", "compile"];

/// Scans `code` for import statements and dynamic imports.
pub fn scan(code: &str) -> PyImports {
    let tokens = tokens(code);
    let mut out = PyImports {
        // also inside strings: an f-string's expression is code
        dynamic: code.contains("__import__") || code.contains("importlib"),
        ..PyImports::default()
    };
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i] {
            Token::Word(w) if DYNAMIC_MARKERS.contains(&w) => {
                // `x.exec(...)` is someone's method (re's compile, say, is also a
                // builtin: only the bare names count)
                let attribute = i > 0 && tokens[i - 1] == Token::Punct('.');
                if !attribute || w == "__import__" || w == "importlib" {
                    out.dynamic = true;
                }
                i += 1;
            }
            Token::Word("import") => {
                // import a.b [as c], d ...
                i += 1;
                loop {
                    let (name, next) = dotted(&tokens, i);
                    if let Some(name) = name {
                        out.modules.insert(name.to_owned());
                    }
                    i = next;
                    if tokens.get(i) == Some(&Token::Word("as")) {
                        i += 2;
                    }
                    if tokens.get(i) == Some(&Token::Punct(',')) {
                        i += 1;
                    } else {
                        break;
                    }
                }
            }
            Token::Word("from") => {
                // from a.b import c (but not `raise E from e`, `yield from g`)
                i += 1;
                let relative = tokens.get(i) == Some(&Token::Punct('.'));
                let (name, next) = dotted(&tokens, i);
                i = next;
                if tokens.get(next) == Some(&Token::Word("import")) {
                    if let (Some(name), false) = (name, relative) {
                        out.modules.insert(name.to_owned());
                    }
                    // the names after `import` are not modules, and none is a keyword
                    // the scan acts on: scanning on after `import` is enough
                    i = next + 1;
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// A dotted name starting at `i` (leading dots skipped): its first part and
/// the index after it.
fn dotted<'a>(tokens: &[Token<'a>], mut i: usize) -> (Option<&'a str>, usize) {
    while tokens.get(i) == Some(&Token::Punct('.')) {
        i += 1;
    }
    let first = match tokens.get(i) {
        Some(Token::Word(w)) if *w != "import" => *w,
        _ => return (None, i),
    };
    i += 1;
    while tokens.get(i) == Some(&Token::Punct('.')) {
        match tokens.get(i + 1) {
            Some(Token::Word(_)) => i += 2,
            _ => break,
        }
    }
    (Some(first), i)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    Word(&'a str),
    Punct(char),
}

/// Python's identifiers and punctuation, without comments and string
/// literals (whatever their prefix or quoting). Newlines are not kept: an
/// import statement's shape does not need them.
fn tokens(code: &str) -> Vec<Token<'_>> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'#' {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if b == b'\'' || b == b'"' {
            i = skip_string(bytes, i);
        } else if b.is_ascii_alphabetic() || b == b'_' || b >= 0x80 {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] >= 0x80)
            {
                i += 1;
            }
            // a string prefix (r, b, f, rb, ...) glued to its quote
            if i < bytes.len() && (bytes[i] == b'\'' || bytes[i] == b'"') && i - start <= 2 {
                continue;
            }
            // `start..i` ends on an ASCII byte or at the end: a char boundary
            out.push(Token::Word(&code[start..i]));
        } else if b.is_ascii_digit() {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
        } else {
            if !b.is_ascii_whitespace() && b != b'\\' {
                out.push(Token::Punct(b as char));
            }
            i += 1;
        }
    }
    out
}

/// The index after the string literal opening at `i`.
fn skip_string(bytes: &[u8], i: usize) -> usize {
    let q = bytes[i];
    let triple = bytes.len() >= i + 3 && bytes[i + 1] == q && bytes[i + 2] == q;
    let mut j = if triple { i + 3 } else { i + 1 };
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 2,
            c if c == q => {
                if !triple {
                    return j + 1;
                }
                if bytes.len() >= j + 3 && bytes[j + 1] == q && bytes[j + 2] == q {
                    return j + 3;
                }
                j += 1;
            }
            b'\n' if !triple => return j + 1, // unterminated: the line ends it
            _ => j += 1,
        }
    }
    bytes.len()
}

/// `sys.stdlib_module_names` of CPython 3.11 (public names; private ones
/// start with `_` and are accepted by that rule).
const STDLIB: &[&str] = &[
    "__future__",
    "abc",
    "aifc",
    "antigravity",
    "argparse",
    "array",
    "ast",
    "asynchat",
    "asyncio",
    "asyncore",
    "atexit",
    "audioop",
    "base64",
    "bdb",
    "binascii",
    "bisect",
    "builtins",
    "bz2",
    "cProfile",
    "calendar",
    "cgi",
    "cgitb",
    "chunk",
    "cmath",
    "cmd",
    "code",
    "codecs",
    "codeop",
    "collections",
    "colorsys",
    "compileall",
    "concurrent",
    "configparser",
    "contextlib",
    "contextvars",
    "copy",
    "copyreg",
    "crypt",
    "csv",
    "ctypes",
    "curses",
    "dataclasses",
    "datetime",
    "dbm",
    "decimal",
    "difflib",
    "dis",
    "distutils",
    "doctest",
    "email",
    "encodings",
    "ensurepip",
    "enum",
    "errno",
    "faulthandler",
    "fcntl",
    "filecmp",
    "fileinput",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "gc",
    "genericpath",
    "getopt",
    "getpass",
    "gettext",
    "glob",
    "graphlib",
    "grp",
    "gzip",
    "hashlib",
    "heapq",
    "hmac",
    "html",
    "http",
    "idlelib",
    "imaplib",
    "imghdr",
    "imp",
    "importlib",
    "inspect",
    "io",
    "ipaddress",
    "itertools",
    "json",
    "keyword",
    "lib2to3",
    "linecache",
    "locale",
    "logging",
    "lzma",
    "mailbox",
    "mailcap",
    "marshal",
    "math",
    "mimetypes",
    "mmap",
    "modulefinder",
    "multiprocessing",
    "netrc",
    "nis",
    "nntplib",
    "numbers",
    "opcode",
    "operator",
    "optparse",
    "os",
    "ossaudiodev",
    "pathlib",
    "pdb",
    "pickle",
    "pickletools",
    "pipes",
    "pkgutil",
    "platform",
    "plistlib",
    "poplib",
    "posix",
    "posixpath",
    "pprint",
    "profile",
    "pstats",
    "pty",
    "pwd",
    "py_compile",
    "pyclbr",
    "pydoc",
    "pydoc_data",
    "pyexpat",
    "queue",
    "quopri",
    "random",
    "re",
    "readline",
    "reprlib",
    "resource",
    "rlcompleter",
    "runpy",
    "sched",
    "secrets",
    "select",
    "selectors",
    "shelve",
    "shlex",
    "shutil",
    "signal",
    "site",
    "smtpd",
    "smtplib",
    "sndhdr",
    "socket",
    "socketserver",
    "spwd",
    "sqlite3",
    "sre_compile",
    "sre_constants",
    "sre_parse",
    "ssl",
    "stat",
    "statistics",
    "string",
    "stringprep",
    "struct",
    "subprocess",
    "sunau",
    "symtable",
    "sys",
    "sysconfig",
    "syslog",
    "tabnanny",
    "tarfile",
    "telnetlib",
    "tempfile",
    "termios",
    "textwrap",
    "this",
    "threading",
    "time",
    "timeit",
    "tkinter",
    "token",
    "tokenize",
    "tomllib",
    "trace",
    "traceback",
    "tracemalloc",
    "tty",
    "turtle",
    "turtledemo",
    "types",
    "typing",
    "unicodedata",
    "unittest",
    "urllib",
    "uu",
    "uuid",
    "venv",
    "warnings",
    "wave",
    "weakref",
    "webbrowser",
    "wsgiref",
    "xdrlib",
    "xml",
    "xmlrpc",
    "zipapp",
    "zipfile",
    "zipimport",
    "zlib",
    "zoneinfo",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn modules(code: &str) -> Vec<String> {
        scan(code).modules.into_iter().collect()
    }

    #[test]
    fn finds_import_and_from_import_statements_with_dotted_names_and_aliases() {
        assert_eq!(
            modules(
                "import os, sys as system\nimport numpy.linalg as la\nfrom matplotlib import pyplot as plt\nfrom sklearn.ensemble import RandomForestClassifier"
            ),
            ["matplotlib", "numpy", "os", "sklearn", "sys"]
        );
    }

    #[test]
    fn finds_imports_inside_functions_try_blocks_and_compound_lines() {
        let code = "def f():\n    import pandas as pd\n    return pd\ntry: import scipy.stats\nexcept ImportError: pass\nif True: x = 1; import json\nclass C:\n    from seaborn import heatmap\n";
        assert_eq!(modules(code), ["json", "pandas", "scipy", "seaborn"]);
    }

    #[test]
    fn parenthesised_and_continued_from_imports_do_not_leak_names() {
        let code = "from collections import (\n    OrderedDict,\n    defaultdict,\n)\nfrom os.path import \\\n    join, exists\nprint(OrderedDict)";
        assert_eq!(modules(code), ["collections", "os"]);
        assert_eq!(choose_template(code), PyTemplate::Lean);
        // (os alone is in the min template)
        assert_eq!(
            choose_template("from os.path import \\\n    join\nprint(join('a', 'b'))"),
            PyTemplate::Min
        );
    }

    #[test]
    fn relative_imports_and_raise_or_yield_from_are_not_modules() {
        let code = "from . import sibling\nfrom .pkg import x\ntry:\n    pass\nexcept KeyError as e:\n    raise ValueError('x') from e\ndef g():\n    yield from range(3)\n";
        assert!(modules(code).is_empty());
    }

    #[test]
    fn strings_and_comments_are_not_code() {
        let code = "# import pandas\nprint('import numpy')\ns = \"\"\"\nfrom sklearn import svm\n\"\"\"\nt = r'import scipy'\nimport math\n";
        assert_eq!(modules(code), ["math"]);
        assert_eq!(choose_template(code), PyTemplate::Min);
    }

    #[test]
    fn stdlib_programs_take_min_unless_a_module_imports_slowly_then_lean() {
        use PyTemplate::{Lean, Min};
        for (code, template) in [
            ("print('hello')", Min),
            ("", Min),
            ("print(sum(map(float, open('n.txt'))))", Min),
            (
                "import math, sys, os\nfrom time import time\nprint(math.pi, time())",
                Min,
            ),
            (
                "from __future__ import annotations\nimport itertools, datetime, heapq, bisect, struct",
                Min,
            ),
            ("import os.path\nfrom _thread import get_ident", Min),
            (
                "import json, math, os, sys, re\nfrom datetime import datetime\nprint(json.dumps({}))",
                Lean,
            ),
            (
                "import csv\nfrom collections import Counter\nimport statistics\nimport _thread",
                Lean,
            ),
            ("from __future__ import annotations\nimport typing", Lean),
            ("import math\nimport re", Lean),
            ("import random", Lean),
            ("import sys\nfrom collections import Counter", Lean),
            ("import _csv", Lean),
        ] {
            assert_eq!(choose_template(code), template, "{code}");
        }
    }

    #[test]
    fn numpy_pandas_and_matplotlib_take_the_data_template() {
        for code in [
            "import pandas as pd",
            "import os\nfrom matplotlib import pyplot",
            "import numpy as np\nimport json\nfrom mpl_toolkits.mplot3d import Axes3D",
        ] {
            assert_eq!(choose_template(code), PyTemplate::Data, "{code}");
        }
    }

    #[test]
    fn other_third_party_or_unknown_modules_take_the_rich_template() {
        for code in [
            "import pandas as pd\nimport seaborn as sns",
            "import statsmodels.api as sm",
            "def f():\n    import sklearn",
            "import my_helper_module",
            "import requests",
        ] {
            assert_eq!(choose_template(code), PyTemplate::Rich, "{code}");
        }
    }

    #[test]
    fn imports_by_name_at_run_time_take_the_rich_template() {
        for code in [
            "m = __import__('pandas')",
            "import importlib\nnp = importlib.import_module('numpy')",
            "from importlib import import_module",
            "exec('import pandas')",
            "x = eval(input())",
            "import pickle\ndf = pickle.load(open('df.pkl', 'rb'))",
            "code = compile('import numpy', 'x', 'exec')",
            "print(f\"{__import__('numpy').pi}\")",
        ] {
            assert!(
                scan(code).dynamic || choose_template(code) == PyTemplate::Rich,
                "{code}"
            );
            assert_eq!(choose_template(code), PyTemplate::Rich, "{code}");
        }
    }

    #[test]
    fn methods_named_like_builtins_do_not_count_as_dynamic() {
        let code = "import re\np = re.compile('a+')\ncur.execute('x')\nprint(p.match('aa'))";
        assert!(!scan(code).dynamic);
        assert_eq!(choose_template(code), PyTemplate::Lean);
    }

    #[test]
    fn non_ascii_identifiers_and_unterminated_strings_do_not_break_the_scan() {
        let code = "données = 1\nprint('unterminated\nimport numpy\nπ = 3";
        assert_eq!(modules(code), ["numpy"]);
    }
}
