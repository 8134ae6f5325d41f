//! Every language LibreChat offers, through a real server and real jails.
//!
//! One table row per language ([`Case`]) and one test per row, each proving:
//! hello world with a computed value (and that no build output leaks into
//! `files`), an alias, `args`, reading an uploaded input and writing an
//! output that comes back in `files`, a compile error (compiled languages), a
//! runtime error with a non-zero exit, and an infinite loop stopped by a
//! short request `timeout`. Then the conveniences and the data stack:
//! pandas, matplotlib's `plt.show()`, openpyxl, R's default device, the JVM
//! heap, bash as glue.
//!
//! A runtime missing on the host skips its test with a printed reason, or
//! FAILS it when `CI` is set (scripts/install-runtimes.sh installs them all).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use kiln::testing::TestServer;
use kiln_core::Language;
use serde_json::{Value, json};

/// One language's programs. Each program has one job:
/// - `hello` prints `hello 42`, computing 42 as 6 * 7;
/// - `args` prints its arguments joined by `|`;
/// - `files` reads integers (one a line) from `nums.txt` and writes
///   `sum=<total>\n` to `sum.txt`;
/// - `fail` fails at run time (`fail_status`, `fail_code`, and `fail_text`
///   somewhere in its output);
/// - `compile_error` does not compile (`compile_text` in the diagnostics);
/// - `forever` loops forever.
struct Case {
    lang: &'static str,
    alias: &'static str,
    hello: &'static str,
    args: &'static str,
    files: &'static str,
    fail: &'static str,
    fail_status: &'static str,
    /// Exit code, or `None` when the program dies by a signal (`fail_signal`).
    fail_code: Option<i64>,
    fail_signal: Option<&'static str>,
    fail_text: &'static str,
    compile_error: Option<(&'static str, &'static str)>,
    forever: &'static str,
}

const PY: Case = Case {
    lang: "py",
    alias: "python",
    hello: "print('hello', 6 * 7)",
    args: "import sys\nprint('|'.join(sys.argv[1:]))",
    files: "total = sum(int(x) for x in open('nums.txt'))\nopen('sum.txt', 'w').write(f'sum={total}\\n')",
    fail: "raise ValueError('boom')",
    fail_status: "RE",
    fail_code: Some(1),
    fail_signal: None,
    fail_text: "ValueError: boom",
    compile_error: None,
    forever: "while True:\n    pass",
};

const JS: Case = Case {
    lang: "js",
    alias: "node",
    hello: "console.log('hello', 6 * 7)",
    args: "console.log(process.argv.slice(2).join('|'))",
    files: "const fs = require('fs')\n\
            const total = fs.readFileSync('nums.txt', 'utf8').trim().split('\\n').map(Number).reduce((a, b) => a + b, 0)\n\
            fs.writeFileSync('sum.txt', `sum=${total}\\n`)",
    fail: "throw new Error('boom')",
    fail_status: "RE",
    fail_code: Some(1),
    fail_signal: None,
    fail_text: "Error: boom",
    compile_error: None,
    forever: "for (;;) {}",
};

const TS: Case = Case {
    lang: "ts",
    alias: "typescript",
    hello: "const n: number = 6 * 7;\nconsole.log('hello', n);",
    args: "const args: string[] = process.argv.slice(2);\nconsole.log(args.join('|'));",
    files: "import { readFileSync, writeFileSync } from 'fs';\n\
            const total: number = readFileSync('nums.txt', 'utf8').trim().split('\\n').map(Number).reduce((a, b) => a + b, 0);\n\
            writeFileSync('sum.txt', `sum=${total}\\n`);",
    fail: "function fail(): never {\n  throw new Error('boom');\n}\nfail();",
    fail_status: "RE",
    fail_code: Some(1),
    fail_signal: None,
    fail_text: "Error: boom",
    compile_error: Some(("const x: number = ;\nconsole.log(x);", "main.ts:1")),
    forever: "while (true) {}",
};

const C: Case = Case {
    lang: "c",
    alias: "C",
    hello: "#include <stdio.h>\nint main(void) { printf(\"hello %d\\n\", 6 * 7); return 0; }",
    args: "#include <stdio.h>\n\
           int main(int argc, char **argv) {\n\
             for (int i = 1; i < argc; i++) printf(\"%s%s\", i > 1 ? \"|\" : \"\", argv[i]);\n\
             printf(\"\\n\");\n\
             return 0;\n\
           }",
    files: "#include <stdio.h>\n\
            int main(void) {\n\
              FILE *in = fopen(\"nums.txt\", \"r\"); long n, total = 0;\n\
              while (fscanf(in, \"%ld\", &n) == 1) total += n;\n\
              FILE *out = fopen(\"sum.txt\", \"w\"); fprintf(out, \"sum=%ld\\n\", total);\n\
              return fclose(out) != 0;\n\
            }",
    fail: "#include <stdio.h>\nint main(void) { fprintf(stderr, \"boom\\n\"); return 3; }",
    fail_status: "RE",
    fail_code: Some(3),
    fail_signal: None,
    fail_text: "boom",
    compile_error: Some((
        "int main(void) { return undefined_variable; }",
        "undefined_variable",
    )),
    forever: "int main(void) { volatile unsigned long x = 0; for (;;) x++; }",
};

const CPP: Case = Case {
    lang: "cpp",
    alias: "c++",
    hello: "#include <iostream>\nint main() { std::cout << \"hello \" << 6 * 7 << \"\\n\"; }",
    args: "#include <iostream>\n#include <string>\n\
           int main(int argc, char **argv) {\n\
             std::string out;\n\
             for (int i = 1; i < argc; i++) out += (i > 1 ? \"|\" : \"\") + std::string(argv[i]);\n\
             std::cout << out << \"\\n\";\n\
           }",
    files: "#include <fstream>\n#include <numeric>\n#include <iterator>\n\
            int main() {\n\
              std::ifstream in(\"nums.txt\");\n\
              long total = std::accumulate(std::istream_iterator<long>(in), std::istream_iterator<long>(), 0L);\n\
              std::ofstream(\"sum.txt\") << \"sum=\" << total << \"\\n\";\n\
            }",
    // an uncaught exception ends in std::terminate → abort
    fail: "#include <stdexcept>\nint main() { throw std::runtime_error(\"boom\"); }",
    fail_status: "SG",
    fail_code: None,
    fail_signal: Some("SIGABRT"),
    fail_text: "boom",
    compile_error: Some((
        "#include <string>\nint main() { int x = std::string(\"s\"); return x; }",
        "error",
    )),
    forever: "int main() { volatile unsigned long x = 0; for (;;) x++; }",
};

const JAVA: Case = Case {
    lang: "java",
    alias: "Java",
    hello: "public class Main {\n  public static void main(String[] args) {\n    System.out.println(\"hello \" + (6 * 7));\n  }\n}",
    args: "public class Main {\n  public static void main(String[] args) {\n    System.out.println(String.join(\"|\", args));\n  }\n}",
    files: "import java.nio.file.*;\n\
            public class Main {\n\
              public static void main(String[] args) throws Exception {\n\
                long total = Files.readAllLines(Path.of(\"nums.txt\")).stream().mapToLong(Long::parseLong).sum();\n\
                Files.writeString(Path.of(\"sum.txt\"), \"sum=\" + total + \"\\n\");\n\
              }\n\
            }",
    fail: "public class Main {\n  public static void main(String[] args) {\n    throw new IllegalStateException(\"boom\");\n  }\n}",
    fail_status: "RE",
    fail_code: Some(1),
    fail_signal: None,
    fail_text: "IllegalStateException: boom",
    compile_error: Some((
        "public class Main {\n  public static void main(String[] args) {\n    int x = \"s\";\n  }\n}",
        "incompatible types",
    )),
    forever: "public class Main {\n  public static void main(String[] args) {\n    while (true) {}\n  }\n}",
};

const PHP: Case = Case {
    lang: "php",
    alias: "PHP",
    hello: "<?php\necho 'hello ', 6 * 7, \"\\n\";",
    args: "<?php\necho implode('|', array_slice($argv, 1)), \"\\n\";",
    files: "<?php\n$total = array_sum(array_map('intval', file('nums.txt')));\nfile_put_contents('sum.txt', \"sum=$total\\n\");",
    fail: "<?php\nthrow new Exception('boom');",
    fail_status: "RE",
    fail_code: Some(255),
    fail_signal: None,
    fail_text: "boom",
    compile_error: None,
    forever: "<?php\nwhile (true) {}",
};

const RS: Case = Case {
    lang: "rs",
    alias: "rust",
    hello: "fn main() {\n    println!(\"hello {}\", 6 * 7);\n}",
    args: "fn main() {\n    let args: Vec<String> = std::env::args().skip(1).collect();\n    println!(\"{}\", args.join(\"|\"));\n}",
    files: "fn main() {\n\
            let total: i64 = std::fs::read_to_string(\"nums.txt\").unwrap().lines().map(|l| l.parse::<i64>().unwrap()).sum();\n\
            std::fs::write(\"sum.txt\", format!(\"sum={total}\\n\")).unwrap();\n\
            }",
    fail: "fn main() {\n    panic!(\"boom\");\n}",
    fail_status: "RE",
    fail_code: Some(101),
    fail_signal: None,
    fail_text: "boom",
    compile_error: Some((
        "fn main() {\n    let x: i32 = \"s\";\n}",
        "mismatched types",
    )),
    forever: "fn main() {\n    loop {}\n}",
};

const GO: Case = Case {
    lang: "go",
    alias: "golang",
    hello: "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello\", 6*7)\n}",
    args: "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n\t\"strings\"\n)\n\nfunc main() {\n\tfmt.Println(strings.Join(os.Args[1:], \"|\"))\n}",
    files: "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n\t\"strconv\"\n\t\"strings\"\n)\n\n\
            func main() {\n\
            \tdata, _ := os.ReadFile(\"nums.txt\")\n\
            \ttotal := 0\n\
            \tfor _, f := range strings.Fields(string(data)) {\n\
            \t\tn, _ := strconv.Atoi(f)\n\
            \t\ttotal += n\n\
            \t}\n\
            \tos.WriteFile(\"sum.txt\", []byte(fmt.Sprintf(\"sum=%d\\n\", total)), 0o644)\n\
            }",
    fail: "package main\n\nfunc main() {\n\tpanic(\"boom\")\n}",
    fail_status: "RE",
    fail_code: Some(2),
    fail_signal: None,
    fail_text: "panic: boom",
    compile_error: Some(("package main\n\nfunc main() {\n\tx := 1\n}", "not used")),
    forever: "package main\n\nfunc main() {\n\tfor {\n\t}\n}",
};

const D: Case = Case {
    lang: "d",
    alias: "dlang",
    hello: "import std.stdio;\nvoid main() { writeln(\"hello \", 6 * 7); }",
    args: "import std.stdio, std.array;\nvoid main(string[] args) { writeln(args[1 .. $].join(\"|\")); }",
    files: "import std.file, std.string, std.conv, std.algorithm;\n\
            void main() {\n\
              auto total = readText(\"nums.txt\").splitLines.map!(to!long).sum;\n\
              write(\"sum.txt\", \"sum=\" ~ total.to!string ~ \"\\n\");\n\
            }",
    fail: "void main() { throw new Exception(\"boom\"); }",
    fail_status: "RE",
    fail_code: Some(1),
    fail_signal: None,
    fail_text: "boom",
    compile_error: Some((
        "void main() { int x = \"s\"; }",
        "cannot implicitly convert",
    )),
    forever: "void main() { for (;;) {} }",
};

const F90: Case = Case {
    lang: "f90",
    alias: "fortran",
    hello: "program main\n  print '(a,i0)', 'hello ', 6 * 7\nend program main",
    args: "program main\n\
           \x20 integer :: i\n\
           \x20 character(len=256) :: a\n\
           \x20 character(len=1024) :: line\n\
           \x20 line = ''\n\
           \x20 do i = 1, command_argument_count()\n\
           \x20   call get_command_argument(i, a)\n\
           \x20   if (i > 1) line = trim(line) // '|'\n\
           \x20   line = trim(line) // trim(a)\n\
           \x20 end do\n\
           \x20 print '(a)', trim(line)\n\
           end program main",
    files: "program main\n\
            \x20 integer :: n, total, ios\n\
            \x20 total = 0\n\
            \x20 open(unit=10, file='nums.txt', status='old')\n\
            \x20 do\n\
            \x20   read(10, *, iostat=ios) n\n\
            \x20   if (ios /= 0) exit\n\
            \x20   total = total + n\n\
            \x20 end do\n\
            \x20 close(10)\n\
            \x20 open(unit=11, file='sum.txt', status='replace')\n\
            \x20 write(11, '(a,i0)') 'sum=', total\n\
            \x20 close(11)\n\
            end program main",
    fail: "program main\n  error stop 3\nend program main",
    fail_status: "RE",
    fail_code: Some(3),
    fail_signal: None,
    fail_text: "ERROR STOP 3",
    compile_error: Some((
        "program main\n  integer :: x\n  x = 'a'\nend program main",
        "Error",
    )),
    forever: "program main\n  integer, volatile :: x\n  x = 0\n  do\n    x = mod(x + 1, 7)\n  end do\nend program main",
};

const R: Case = Case {
    lang: "r",
    alias: "R",
    hello: "cat('hello ', 6 * 7, '\\n', sep = '')",
    args: "cat(paste(commandArgs(trailingOnly = TRUE), collapse = '|'), '\\n', sep = '')",
    files: "total <- sum(as.integer(readLines('nums.txt')))\nwriteLines(paste0('sum=', total), 'sum.txt')",
    fail: "stop('boom')",
    fail_status: "RE",
    fail_code: Some(1),
    fail_signal: None,
    fail_text: "Error: boom",
    compile_error: None,
    forever: "repeat {}",
};

const BASH: Case = Case {
    lang: "bash",
    alias: "sh",
    hello: "echo \"hello $((6 * 7))\"",
    args: "IFS='|'\necho \"$*\"",
    files: "total=0\nwhile read -r n; do total=$((total + n)); done < nums.txt\necho \"sum=$total\" > sum.txt",
    fail: "echo boom >&2\nexit 3",
    fail_status: "RE",
    fail_code: Some(3),
    fail_signal: None,
    fail_text: "boom",
    compile_error: None,
    forever: "while :; do :; done",
};

/// Is `lang`'s runtime on this host? Missing: skip (printed) — or fail
/// under CI, where the installer must have provided it.
fn runtime_present(lang: &str) -> bool {
    let spec = Language::resolve(lang)
        .unwrap_or_else(|| panic!("{lang} is not in the language table"))
        .spec();
    let missing: Vec<&str> = spec
        .requires
        .iter()
        .copied()
        .filter(|p| !Path::new(p).exists())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "runtime {lang} not installed (missing {}); run scripts/install-runtimes.sh",
        missing.join(", ")
    );
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("SKIP: {why}");
    false
}

/// Upload `name` for `user` (kind=user) and return its by-reference input.
async fn user_file(s: &TestServer, user: &str, name: &str, bytes: &[u8]) -> Value {
    let (st, v) = upload(
        s,
        user,
        &[("kind", "user"), ("id", user)],
        name,
        bytes.to_vec(),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    json!({
        "id": v["files"][0]["fileId"],
        "storage_session_id": v["storage_session_id"],
        "resource_id": user,
        "kind": "user",
        "name": name,
    })
}

fn names(r: &Value) -> Vec<String> {
    r["files"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn check_language(c: &Case) {
    if !runtime_present(c.lang) {
        return;
    }
    let s = server().await;
    let lang = c.lang;

    // hello world: computed value, clean stderr, nothing leaks into files
    let r = run(&s, lang, c.hello).await;
    assert_eq!(r["stdout"], "hello 42\n", "{lang} hello: {r}");
    assert_eq!(r["code"], 0, "{lang} hello: {r}");
    assert!(r["status"].is_null(), "{lang} hello: {r}");
    assert_eq!(
        r["files"],
        json!([]),
        "{lang}: build outputs must stay hidden"
    );
    assert!(
        r["stderr"].as_str().unwrap_or("").is_empty(),
        "{lang} hello stderr: {r}"
    );

    // an alias resolves to the same runtime
    let r = run(&s, c.alias, c.hello).await;
    assert_eq!(r["stdout"], "hello 42\n", "{lang} as {}: {r}", c.alias);

    // args are appended to the run command, spaces intact
    let r = exec(
        &s,
        json!({"lang": lang, "code": c.args, "args": ["a b", "c"]}),
    )
    .await;
    assert_eq!(r["stdout"], "a b|c\n", "{lang} args: {r}");

    // an uploaded input is readable; a written file comes back
    let nums = user_file(&s, "lang-user", "nums.txt", b"1\n2\n3\n4\n").await;
    let r = exec(
        &s,
        json!({"lang": lang, "code": c.files, "files": [nums], "user_id": "lang-user"}),
    )
    .await;
    assert_eq!(r["code"], 0, "{lang} files: {r}");
    assert_eq!(
        output_bytes(&s, &r, "sum.txt").await,
        b"sum=10\n",
        "{lang} files: {r}"
    );
    assert_eq!(file(&r, "nums.txt")["inherited"], true, "{lang}: {r}");
    let mut produced = names(&r);
    produced.sort();
    assert_eq!(produced, ["nums.txt", "sum.txt"], "{lang} files: {r}");

    // a runtime error is a completed run with a non-zero exit
    let r = run(&s, lang, c.fail).await;
    assert_eq!(r["status"], c.fail_status, "{lang} fail: {r}");
    match c.fail_code {
        Some(code) => assert_eq!(r["code"], code, "{lang} fail: {r}"),
        None => {
            assert!(r["code"].is_null(), "{lang} fail: {r}");
            assert_eq!(r["signal"], c.fail_signal.unwrap_or(""), "{lang} fail: {r}");
        }
    }
    let output = format!(
        "{}{}",
        r["stdout"].as_str().unwrap_or(""),
        r["stderr"].as_str().unwrap_or("")
    );
    assert!(output.contains(c.fail_text), "{lang} fail: {r}");

    // a compile error comes back as a completed run with the diagnostics
    if let Some((code, text)) = c.compile_error {
        let r = run(&s, lang, code).await;
        assert_eq!(r["status"], "RE", "{lang} compile error: {r}");
        assert_eq!(
            r["message"], "Compilation failed",
            "{lang} compile error: {r}"
        );
        assert_ne!(r["code"], 0, "{lang} compile error: {r}");
        assert!(
            r["stderr"].as_str().unwrap_or("").contains(text),
            "{lang} compile error: {r}"
        );
        assert_eq!(r["stdout"], "", "{lang} compile error: {r}");
        assert_eq!(r["files"], json!([]), "{lang} compile error: {r}");
    }

    // an infinite loop is stopped by the request's timeout (a compile step
    // has its own budget and does not count against it)
    let started = Instant::now();
    let r = exec(
        &s,
        json!({"lang": lang, "code": c.forever, "timeout": 2000}),
    )
    .await;
    assert_eq!(r["status"], "TO", "{lang} forever: {r}");
    assert_eq!(r["message"], "Time limit exceeded", "{lang} forever: {r}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{lang} forever took {:?}",
        started.elapsed()
    );
}

macro_rules! language_tests {
    ($($test:ident => $case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $test() {
                check_language(&$case).await;
            }
        )*
    };
}

language_tests! {
    python_runs_reads_writes_fails_and_times_out => PY,
    javascript_runs_reads_writes_fails_and_times_out => JS,
    typescript_compiles_runs_reads_writes_fails_and_times_out => TS,
    c_compiles_runs_reads_writes_fails_and_times_out => C,
    cpp_compiles_runs_reads_writes_fails_and_times_out => CPP,
    java_compiles_runs_reads_writes_fails_and_times_out => JAVA,
    php_runs_reads_writes_fails_and_times_out => PHP,
    rust_compiles_runs_reads_writes_fails_and_times_out => RS,
    go_compiles_runs_reads_writes_fails_and_times_out => GO,
    d_compiles_runs_reads_writes_fails_and_times_out => D,
    fortran_compiles_runs_reads_writes_fails_and_times_out => F90,
    r_runs_reads_writes_fails_and_times_out => R,
    bash_runs_reads_writes_fails_and_times_out => BASH,
}

#[tokio::test]
async fn health_lists_all_thirteen_languages_with_versions() {
    let s = server().await;
    let h: Value = client()
        .get(format!("{}/health", s.v1()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let langs = h["languages"].as_array().expect("languages");
    let listed: Vec<&str> = langs.iter().filter_map(|l| l["name"].as_str()).collect();
    assert_eq!(
        listed,
        [
            "py", "js", "ts", "c", "cpp", "java", "php", "rs", "go", "d", "f90", "r", "bash"
        ]
    );
    for l in langs {
        let name = l["name"].as_str().unwrap_or("");
        if l["available"] == true {
            assert!(l["version"].is_string(), "{l}");
        } else {
            assert!(
                !runtime_present(name),
                "{name} installed but unavailable: {l}"
            );
        }
    }
}

#[tokio::test]
async fn python_plt_show_saves_each_figure_as_a_numbered_png() {
    if !runtime_present("py") {
        return;
    }
    let s = server().await;
    let r = run(
        &s,
        "py",
        "import matplotlib\nimport matplotlib.pyplot as plt\n\
         plt.plot([1, 2, 3], [4, 1, 9])\nplt.title('first')\nplt.show()\n\
         fig, ax = plt.subplots()\nax.bar(['a', 'b'], [3, 5])\nplt.figure()\nplt.plot([0, 1])\nplt.show()\n\
         plt.show()\n\
         print(matplotlib.get_backend().lower(), len(plt.get_fignums()))",
    )
    .await;
    assert_eq!(r["stdout"], "agg 0\n", "{r}");
    assert_eq!(r["stderr"], "", "{r}");
    let mut produced = names(&r);
    produced.sort();
    assert_eq!(produced, ["plot_1.png", "plot_2.png", "plot_3.png"], "{r}");
    for name in &produced {
        let png = output_bytes(&s, &r, name).await;
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}");
        assert!(png.len() > 1000, "{name} is {} bytes", png.len());
    }
}

#[tokio::test]
async fn python_plt_show_does_not_overwrite_existing_plots_and_seaborn_is_covered() {
    if !runtime_present("py") {
        return;
    }
    let s = server().await;
    let r = run(
        &s,
        "py",
        "import seaborn as sns\nimport matplotlib.pyplot as plt\n\
         open('plot_1.png', 'wb').write(b'mine')\n\
         sns.histplot([1, 2, 2, 3, 3, 3])\nplt.show()",
    )
    .await;
    assert_eq!(r["code"], 0, "{r}");
    assert_eq!(output_bytes(&s, &r, "plot_1.png").await, b"mine");
    let png = output_bytes(&s, &r, "plot_2.png").await;
    assert_eq!(&png[..4], b"\x89PNG");
}

#[tokio::test]
async fn python_code_that_cannot_plot_gets_an_untouched_workspace() {
    if !runtime_present("py") {
        return;
    }
    let s = server().await;
    let r = run(&s, "py", "import os, sys\nprint(sorted(os.listdir('.')))").await;
    assert_eq!(r["stdout"], "['main.py']\n", "{r}");
}

#[tokio::test]
async fn python_data_stack_reads_csv_and_writes_office_files() {
    if !runtime_present("py") {
        return;
    }
    let s = server().await;
    let csv = user_file(
        &s,
        "ds",
        "sales.csv",
        b"region,amount\nnorth,10\nsouth,20\nnorth,5\n",
    )
    .await;
    let code = "import pandas as pd\n\
        df = pd.read_csv('sales.csv')\n\
        totals = df.groupby('region')['amount'].sum()\n\
        print(totals.to_dict())\n\
        import openpyxl\n\
        wb = openpyxl.Workbook(); ws = wb.active\n\
        ws.append(['region', 'amount'])\n\
        for k, v in totals.items(): ws.append([k, int(v)])\n\
        wb.save('totals.xlsx')\n\
        df.to_excel('sales.xlsx', index=False)\n\
        import docx\n\
        d = docx.Document(); d.add_paragraph('report'); d.save('report.docx')\n\
        import pptx\n\
        p = pptx.Presentation(); p.slides.add_slide(p.slide_layouts[0]); p.save('deck.pptx')\n\
        from reportlab.pdfgen import canvas\n\
        c = canvas.Canvas('report.pdf'); c.drawString(100, 750, 'report'); c.save()";
    let r = exec(
        &s,
        json!({"lang": "py", "code": code, "files": [csv], "user_id": "ds"}),
    )
    .await;
    assert_eq!(r["stdout"], "{'north': 15, 'south': 20}\n", "{r}");
    for (name, magic) in [
        ("totals.xlsx", &b"PK"[..]),
        ("sales.xlsx", b"PK"),
        ("report.docx", b"PK"),
        ("deck.pptx", b"PK"),
        ("report.pdf", b"%PDF"),
    ] {
        let bytes = output_bytes(&s, &r, name).await;
        assert!(bytes.starts_with(magic), "{name}");
    }
    // the xlsx really holds the totals
    let r2 = exec(
        &s,
        json!({"lang": "py", "user_id": "ds", "files": [{
            "id": file(&r, "totals.xlsx")["id"], "storage_session_id": r["session_id"],
            "name": "totals.xlsx", "kind": "user", "resource_id": "ds"}],
            "code": "import openpyxl\nprint(list(openpyxl.load_workbook('totals.xlsx').active.values))"}),
    )
    .await;
    assert_eq!(
        r2["stdout"], "[('region', 'amount'), ('north', 15), ('south', 20)]\n",
        "{r2}"
    );
}

#[tokio::test]
async fn python_scientific_libraries_import() {
    if !runtime_present("py") {
        return;
    }
    let s = server().await;
    let r = run(
        &s,
        "py",
        "import numpy, scipy, sympy, sklearn, seaborn, PIL, statsmodels\n\
         from scipy import optimize\n\
         from sklearn.linear_model import LinearRegression\n\
         x = sympy.symbols('x')\n\
         print(sympy.integrate(2 * x, x), round(optimize.brentq(lambda v: v * v - 4, 0, 5), 6))\n\
         m = LinearRegression().fit([[0], [1], [2]], [1, 3, 5])\n\
         print(round(float(m.coef_[0]), 6))",
    )
    .await;
    assert_eq!(r["stdout"], "x**2 2.0\n2.0\n", "{r}");
}

#[tokio::test]
async fn r_plots_go_to_png_files_through_cairo() {
    if !runtime_present("r") {
        return;
    }
    let s = server().await;
    let r = run(
        &s,
        "r",
        "cat(capabilities('cairo'), getOption('bitmapType'), '\\n')\n\
         plot(1:10, main = 'first')\n\
         hist(rnorm(50))\n\
         suppressMessages(library(ggplot2))\n\
         ggsave('gg.png', ggplot(data.frame(a = 1:3, b = c(2, 4, 3)), aes(a, b)) + geom_line(), width = 4, height = 3)\n\
         png('explicit.png'); plot(3:1); invisible(dev.off())",
    )
    .await;
    assert_eq!(r["stdout"], "TRUE cairo \n", "{r}");
    let mut produced = names(&r);
    produced.sort();
    assert_eq!(
        produced,
        ["explicit.png", "gg.png", "plot_1.png", "plot_2.png"],
        "{r}"
    );
    for name in &produced {
        let png = output_bytes(&s, &r, name).await;
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}");
    }
}

/// R's Cairo devices take their fonts from fontconfig: inside a jail it
/// resolves Chinese, Japanese and Korean text to the CJK font of the runtime
/// set, and a plot titled in all three renders without a warning.
#[tokio::test]
async fn r_plots_find_a_cjk_font_through_fontconfig() {
    if !runtime_present("r") {
        return;
    }
    let s = server().await;
    let fc = run(
        &s,
        "bash",
        "for lang in zh-cn ja ko; do fc-match -f '%{family[0]}\\n' \"sans:lang=$lang\"; done",
    )
    .await;
    assert_eq!(
        fc["stdout"], "WenQuanYi Micro Hei\nWenQuanYi Micro Hei\nWenQuanYi Micro Hei\n",
        "{fc}"
    );
    let r = run(
        &s,
        "r",
        "png('cjk.png', width = 480, height = 240)\n\
         plot(1:3, main = '中文标题 日本語のラベル 한국어 라벨')\n\
         invisible(dev.off())",
    )
    .await;
    assert_eq!(r["stderr"], "", "{r}");
    assert_eq!(names(&r), ["cjk.png"], "{r}");
}

#[tokio::test]
async fn java_runs_whatever_the_public_class_is_called() {
    if !runtime_present("java") {
        return;
    }
    let s = server().await;
    let r = exec(
        &s,
        json!({"lang": "java", "args": ["x"], "code": "import java.util.*;\n\
            public final class HelloWorld {\n\
              public static void main(String[] args) { System.out.println(\"hi \" + List.of(args)); }\n\
            }"}),
    )
    .await;
    assert_eq!(r["stdout"], "hi [x]\n", "{r}");
    // no public class: the first top-level class runs
    let r = run(
        &s,
        "java",
        "class Solution {\n  public static void main(String[] a) { System.out.println(new Helper().v()); }\n}\n\
         class Helper { int v() { return 7; } }",
    )
    .await;
    assert_eq!(r["stdout"], "7\n", "{r}");
}

#[tokio::test]
async fn java_heap_follows_the_memory_limit_and_fails_cleanly() {
    if !runtime_present("java") {
        return;
    }
    let s = server_with(|c| c.memory_mb = 256).await;
    let r = run(
        &s,
        "java",
        "import java.util.*;\n\
         public class Main {\n\
           public static void main(String[] a) {\n\
             System.out.println(Runtime.getRuntime().maxMemory() / (1024 * 1024) < 256);\n\
             List<long[]> keep = new ArrayList<>();\n\
             while (true) keep.add(new long[1 << 20]);\n\
           }\n\
         }",
    )
    .await;
    assert_eq!(r["stdout"], "true\n", "{r}");
    // the JVM's own OutOfMemoryError, not the cgroup's kill
    assert_eq!(r["status"], "RE", "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("java.lang.OutOfMemoryError"),
        "{r}"
    );
}

#[tokio::test]
async fn typescript_accepts_import_require_and_top_level_await() {
    if !runtime_present("ts") {
        return;
    }
    let s = server().await;
    let r = run(
        &s,
        "ts",
        "import * as path from 'path';\n\
         const os = require('os');\n\
         interface Point { x: number; y: number }\n\
         enum Color { Red, Green }\n\
         const p: Point = await Promise.resolve({ x: 1, y: 2 });\n\
         console.log(p.x + p.y, Color.Green, path.basename(__filename), __dirname, typeof os.cpus);",
    )
    .await;
    assert_eq!(r["stdout"], "3 1 main.ts /mnt/data function\n", "{r}");
    // stack traces point into main.ts, not the generated JavaScript
    let r = run(
        &s,
        "ts",
        "const f = (): void => {\n  throw new Error('where');\n};\nf();",
    )
    .await;
    assert!(
        r["stderr"].as_str().unwrap_or("").contains("main.ts:2"),
        "{r}"
    );
}

#[tokio::test]
async fn go_builds_offline_with_a_private_cache() {
    if !runtime_present("go") {
        return;
    }
    let s = server().await;
    let r = run(
        &s,
        "go",
        "package main\n\nimport (\n\t\"encoding/json\"\n\t\"fmt\"\n\t\"os\"\n)\n\n\
         func main() {\n\tb, _ := json.Marshal(map[string]int{\"a\": 1})\n\
         \tfmt.Println(string(b), os.Getenv(\"GOCACHE\"))\n}",
    )
    .await;
    assert_eq!(
        r["stdout"], "{\"a\":1} /mnt/data/.kiln-build/go-cache\n",
        "{r}"
    );
    assert_eq!(r["files"], json!([]), "{r}");
}

#[tokio::test]
async fn bash_is_glue_with_every_runtime_on_path() {
    if !Language::all().all(|l| runtime_present(l.name())) {
        return;
    }
    let s = server().await;
    let r = run(
        &s,
        "bash",
        "set -e\n\
         python3 -c 'print(6 * 7)'\n\
         node -e 'console.log(6 * 7)'\n\
         cat > t.c <<'EOF'\n#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 6 * 7); return 0; }\nEOF\n\
         gcc -o t t.c && ./t\n\
         rm t t.c\n\
         for tool in java javac go rustc gdc gfortran Rscript php esbuild jq sha256sum; do\n\
           command -v \"$tool\" >/dev/null || echo \"missing $tool\"\n\
         done",
    )
    .await;
    assert_eq!(r["stdout"], "42\n42\n42\n", "{r}");
    assert_eq!(r["code"], 0, "{r}");
}

#[tokio::test]
async fn a_compiler_out_of_memory_is_reported_as_such() {
    if !runtime_present("c") {
        return;
    }
    let s = server_with(|c| c.memory_mb = 128).await;
    // the preprocessor reads /dev/zero until the memory limit stops it
    let r = run(
        &s,
        "c",
        "#include \"/dev/zero\"\nint main(void) { return 0; }",
    )
    .await;
    assert_eq!(r["status"], "SG", "{r}");
    assert_eq!(r["message"], "Out of memory during compilation", "{r}");
    assert_eq!(r["files"], json!([]), "{r}");
}

#[tokio::test]
async fn a_compiler_past_its_own_budget_is_a_compile_timeout() {
    if !runtime_present("d") {
        return;
    }
    // CTFE that never ends: GDC loops until the compile budget (30 s for
    // `d`, whatever the request's timeout); the CPU limit is raised so the
    // wall-clock budget is what stops it
    let s = server_with(|c| c.cpu_secs = 120).await;
    let started = Instant::now();
    let r = exec(
        &s,
        json!({"lang": "d", "timeout": 1000,
               "code": "int forever() { while (true) {} return 0; }\nenum x = forever();\nvoid main() {}"}),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(r["status"], "TO", "{r}");
    assert_eq!(r["message"], "Compilation time limit exceeded", "{r}");
    let budget = Language::resolve("d").unwrap().spec().compile_timeout;
    assert!(
        took >= budget && took < budget + Duration::from_secs(20),
        "took {took:?} for a budget of {budget:?}"
    );
}

#[tokio::test]
async fn php_loads_the_extensions_debian_enables() {
    if !runtime_present("php") {
        return;
    }
    let s = server().await;
    let r = run(
        &s,
        "php",
        "<?php\necho mb_strlen('héllo'), ' ', ctype_digit('42') ? 'y' : 'n', ' ', class_exists('DOMDocument') ? 'dom' : '-', \"\\n\";",
    )
    .await;
    assert_eq!(r["stdout"], "5 y dom\n", "{r}");
}
