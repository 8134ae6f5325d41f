//! Ordinary programs still work under the seccomp allow-list and Landlock:
//! the Python data stack, node, bash pipelines, C/C++ built with gcc, and —
//! when installed — Java, Go, Rust, PHP, R, Fortran and D, each compiled
//! and run inside the jail the way the executor does it (sources and
//! binaries in the workspace, `/tmp` noexec).
//!
//! Python, node, bash and gcc are part of every Kiln host (the runtime
//! installer and the Rust toolchain need them); the other toolchains skip
//! with a printed reason when they are not installed.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use kiln_core::{ExitStatus, Limits};
use kiln_sandbox::{RunResult, Sandbox, Slot};
use tokio_util::sync::CancellationToken;

const UID_BASE: u32 = 1_400_000_000;

/// Compilers and VMs need more than the attack-sized limits.
fn roomy() -> Limits {
    Limits {
        wall_time: Duration::from_secs(180),
        cpu_time: Duration::from_secs(180),
        memory_bytes: 1536 * 1024 * 1024,
        pids: 256,
        file_size_bytes: 256 * 1024 * 1024,
        open_files: 1024,
        tmp_bytes: 256 * 1024 * 1024,
        ..limits()
    }
}

/// Writes `files` into a fresh workspace of `slot` and runs `script` with
/// `sh -c` there; returns the result after asserting exit code 0.
async fn build_and_run(
    sb: &Sandbox,
    slot: &Slot,
    files: &[(&str, &str)],
    script: &str,
    extra_env: &[(&str, &str)],
) -> RunResult {
    let ws = workspace(slot);
    for (name, text) in files {
        let path = ws.path.join(name);
        std::fs::write(&path, text).expect("write source");
        std::os::unix::fs::chown(&path, Some(slot.host_uid()), Some(slot.host_gid()))
            .expect("chown source");
    }
    let mut req = request(&ws, &["/bin/sh", "-c", script], roomy());
    req.env.extend(
        extra_env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    let r = sb
        .run(slot, req, CancellationToken::new())
        .await
        .expect("run");
    assert_eq!(
        r.exit,
        ExitStatus::Code(0),
        "script {script:?}\nstdout: {}\nstderr: {}",
        stdout(&r),
        stderr(&r)
    );
    r
}

/// `true` when every tool exists on the host; otherwise prints why the test
/// is skipped.
fn installed(tools: &[&str]) -> bool {
    let missing: Vec<&&str> = tools.iter().filter(|t| !Path::new(t).exists()).collect();
    if missing.is_empty() {
        return true;
    }
    eprintln!("SKIPPED: not installed on this host: {missing:?}");
    false
}

#[tokio::test]
async fn python_data_stack_computes_and_plots() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let code = r#"
import multiprocessing, os, subprocess, threading
import numpy as np, pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
df = pd.DataFrame({"x": np.arange(10), "y": np.arange(10) ** 2})
plt.plot(df.x, df.y); plt.savefig("plot.png")
with multiprocessing.Pool(2) as p:
    squares = p.map(abs, [-1, -2, -3])
out = subprocess.run(["echo", "sub"], capture_output=True, text=True).stdout.strip()
print(int(df.y.sum()), squares, out, os.path.getsize("plot.png") > 1000)
"#;
    let r = build_and_run(
        sb,
        &slot,
        &[("main.py", code)],
        "python3 main.py",
        &[("MPLCONFIGDIR", "/tmp")],
    )
    .await;
    assert_eq!(stdout(&r), "285 [1, 2, 3] sub True\n", "{}", stderr(&r));
}

#[tokio::test]
async fn node_runs_workers_child_processes_and_file_io() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let code = r#"
const fs = require("fs"), cp = require("child_process");
const { Worker } = require("worker_threads");
fs.writeFileSync("out.txt", "data");
const child = cp.execSync("echo child").toString().trim();
const w = new Worker("const {parentPort}=require('worker_threads');parentPort.postMessage(6*7)", { eval: true });
w.on("message", async (m) => {
  const read = await fs.promises.readFile("out.txt", "utf8");
  console.log(m, child, read);
});
"#;
    let r = build_and_run(sb, &slot, &[("main.js", code)], "node main.js", &[]).await;
    assert_eq!(stdout(&r), "42 child data\n");
}

#[tokio::test]
async fn bash_pipelines_subshells_and_coreutils_work() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let script = r#"set -euo pipefail
printf 'b\na\nb\nc\n' > in.txt
sort in.txt | uniq -c | sort -rn | head -n1 | tr -s ' '
wc -l < <(cat in.txt)
echo "$(sha256sum in.txt | cut -c1-8)" | jq -R .
( cd /tmp && mktemp -d >/dev/null && echo sub )
find . -name 'in.*' | xargs -n1 basename"#;
    let r = build_and_run(sb, &slot, &[("main.sh", script)], "bash main.sh", &[]).await;
    assert_eq!(
        stdout(&r),
        " 2 b\n4\n\"6a2e9eb4\"\nsub\nin.txt\n",
        "{}",
        stderr(&r)
    );
}

#[tokio::test]
async fn gcc_and_gxx_build_threaded_programs_that_run_from_the_workspace() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let c = r#"#include <pthread.h>
#include <stdio.h>
static void *work(void *a) { *(int *)a *= 2; return 0; }
int main(void) { pthread_t t; int v = 21; pthread_create(&t, 0, work, &v); pthread_join(t, 0); printf("%d\n", v); return 0; }
"#;
    let cpp = r#"#include <iostream>
#include <thread>
#include <vector>
int main() { std::vector<int> v{1, 2, 3}; int s = 0; std::thread t([&] { for (int x : v) s += x; }); t.join(); std::cout << s << std::endl; }
"#;
    let r = build_and_run(
        sb,
        &slot,
        &[("main.c", c), ("main.cpp", cpp)],
        "gcc -O1 -pthread -o c main.c && ./c && g++ -O1 -pthread -o cpp main.cpp && ./cpp",
        &[("TMPDIR", "/tmp")],
    )
    .await;
    assert_eq!(stdout(&r), "42\n6\n");
}

#[tokio::test]
async fn java_compiles_and_runs_threads() {
    if !installed(&["/usr/bin/javac", "/usr/bin/java"]) {
        return;
    }
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let code = r#"
public class Main {
    public static void main(String[] a) throws Exception {
        int[] v = {0};
        Thread t = new Thread(() -> v[0] = java.util.stream.IntStream.rangeClosed(1, 10).parallel().sum());
        t.start(); t.join();
        java.nio.file.Files.writeString(java.nio.file.Path.of("out.txt"), "x");
        System.out.println(v[0]);
    }
}
"#;
    let r = build_and_run(
        sb,
        &slot,
        &[("Main.java", code)],
        "javac -J-Xmx256m Main.java && java -Xmx256m -XX:+UseSerialGC Main",
        &[],
    )
    .await;
    assert_eq!(stdout(&r), "55\n", "{}", stderr(&r));
}

#[tokio::test]
async fn go_builds_and_runs_goroutines() {
    if !installed(&["/usr/bin/go"]) {
        return;
    }
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let code = r#"package main

import (
	"fmt"
	"os/exec"
	"sync"
)

func main() {
	var wg sync.WaitGroup
	sum := make(chan int, 4)
	for i := 1; i <= 4; i++ {
		wg.Add(1)
		go func(n int) { defer wg.Done(); sum <- n * n }(i)
	}
	wg.Wait()
	close(sum)
	t := 0
	for v := range sum {
		t += v
	}
	out, err := exec.Command("echo", "child").Output()
	fmt.Println(t, string(out[:len(out)-1]), err)
}
"#;
    let r = build_and_run(
        sb,
        &slot,
        &[("main.go", code)],
        "go build -o main main.go && ./main",
        &[
            ("GOCACHE", "/mnt/data/.cache"),
            ("GOPATH", "/mnt/data/.go"),
            ("GOTMPDIR", "/mnt/data"),
            ("CGO_ENABLED", "0"),
        ],
    )
    .await;
    assert_eq!(stdout(&r), "30 child <nil>\n", "{}", stderr(&r));
}

#[tokio::test]
async fn rust_php_r_fortran_and_d_build_and_run() {
    let Some(sb) = sandbox(UID_BASE) else { return };
    let slot = sb.acquire_slot().await;
    let cases: &[(&[&str], &str, &str, &str, &str)] = &[
        (
            &["/usr/bin/rustc"],
            "main.rs",
            "fn main() { let h = std::thread::spawn(|| 6 * 7); println!(\"{}\", h.join().unwrap()); }\n",
            "rustc -O -o rs main.rs && ./rs",
            "42\n",
        ),
        (
            &["/usr/bin/php"],
            "main.php",
            "<?php file_put_contents('o.txt', 'x'); echo array_sum([1, 2, 3]), \"\\n\";\n",
            "php main.php",
            "6\n",
        ),
        (
            &["/usr/bin/Rscript"],
            "main.R",
            "x <- c(1, 2, 3)\ncat(sum(x * 2), \"\\n\")\n",
            "Rscript main.R",
            "12 \n",
        ),
        (
            &["/usr/bin/gfortran"],
            "main.f90",
            "program main\n  print '(I0)', 6 * 7\nend program main\n",
            "gfortran -o f main.f90 && ./f",
            "42\n",
        ),
        (
            &["/usr/bin/ldc2"],
            "main.d",
            "import std.stdio; void main() { writeln(6 * 7); }\n",
            "ldc2 -of=d main.d && ./d",
            "42\n",
        ),
        (
            &["/usr/bin/gdc"],
            "main.d",
            "import std.stdio; void main() { writeln(6 * 7); }\n",
            "gdc -o d main.d && ./d",
            "42\n",
        ),
    ];
    for (tools, file, code, script, expect) in cases {
        if !installed(tools) {
            continue;
        }
        let r = build_and_run(
            sb,
            &slot,
            &[(file, code)],
            script,
            &[("HOME", "/mnt/data"), ("TMPDIR", "/tmp")],
        )
        .await;
        assert_eq!(&stdout(&r), expect, "{script}: {}", stderr(&r));
    }
}
