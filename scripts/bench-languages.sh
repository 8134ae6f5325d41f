#!/usr/bin/env bash
# scripts/bench-languages.sh — per-language hello world: through Kiln's API, and the same
# toolchain invoked directly on the host, in the same run.
#
# Owns: building the release `kiln`, starting `kiln serve` on a free loopback port with a fresh
# data dir and a clean environment, timing `POST /v1/exec` of a hello world per language
# (compile + run, as a client sees it) against the same compile and run commands spawned
# directly in a temp dir (clean environment, same flags as crates/kiln-core/src/lang.rs), and
# printing a markdown table of medians (the rows of BENCHMARKS.md's language section).
#
# Usage: scripts/bench-languages.sh [--runs N] [--langs "py js c ..."]
#   --runs N     timed runs per language and side, after one warm-up (default 7)
#   --langs L    space-separated subset (default: all thirteen)
# Needs root (the sandbox) and the runtimes of scripts/install-runtimes.sh.
set -euo pipefail

runs=7
langs="py js ts c cpp java php rs go d f90 r bash"
while (($# > 0)); do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --langs) langs=$2; shift 2 ;;
    -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "bench-languages: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --locked -p kiln >&2
kiln="${CARGO_TARGET_DIR:-target}/release/kiln"

work=$(mktemp -d /tmp/kiln-bench-langs.XXXXXX)
chmod 755 "$work"
server_pid=
cleanup() {
  if [[ -n "$server_pid" ]]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# A clean environment; a uid range far from the test suites' (they start at 200 000).
env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$work" \
  KILN_LISTEN="127.0.0.1:$port" KILN_DATA_DIR="$work/data" KILN_UID_BASE=4000000000 \
  KILN_MAX_CONCURRENCY=2 KILN_LOG_FORMAT=json RUST_LOG=warn \
  "$kiln" serve >"$work/server.log" 2>&1 &
server_pid=$!

export KILN_BENCH_URL="http://127.0.0.1:$port/v1" KILN_BENCH_RUNS="$runs" KILN_BENCH_LANGS="$langs"
export KILN_BENCH_WORK="$work" KILN_BENCH_JAVAC_SH="$PWD/crates/kiln-core/src/lang/javac.sh"
/usr/bin/python3 - <<'PY'
import json, os, shutil, statistics, subprocess, sys, time, urllib.request

URL = os.environ["KILN_BENCH_URL"]
RUNS = int(os.environ["KILN_BENCH_RUNS"])
LANGS = os.environ["KILN_BENCH_LANGS"].split()
WORK = os.environ["KILN_BENCH_WORK"]

# The hello worlds of crates/kiln/tests/languages.rs: print "hello 42", 42 computed.
HELLO = {
    "py": ("main.py", "print('hello', 6 * 7)"),
    "js": ("index.js", "console.log('hello', 6 * 7)"),
    "ts": ("main.ts", "const n: number = 6 * 7;\nconsole.log('hello', n);"),
    "c": ("main.c", '#include <stdio.h>\nint main(void) { printf("hello %d\\n", 6 * 7); return 0; }'),
    "cpp": ("main.cpp", '#include <iostream>\nint main() { std::cout << "hello " << 6 * 7 << "\\n"; }'),
    "java": ("Main.java", 'public class Main {\n  public static void main(String[] args) {\n    System.out.println("hello " + (6 * 7));\n  }\n}'),
    "php": ("index.php", "<?php\necho 'hello ', 6 * 7, \"\\n\";"),
    "rs": ("main.rs", 'fn main() {\n    println!("hello {}", 6 * 7);\n}'),
    "go": ("main.go", 'package main\n\nimport "fmt"\n\nfunc main() {\n\tfmt.Println("hello", 6*7)\n}'),
    "d": ("main.d", 'import std.stdio;\nvoid main() { writeln("hello ", 6 * 7); }'),
    "f90": ("main.f90", "program main\n  print '(a,i0)', 'hello ', 6 * 7\nend program main"),
    "r": ("main.r", "cat('hello ', 6 * 7, '\\n', sep = '')"),
    "bash": ("script.sh", 'echo "hello $((6 * 7))"'),
}

# The same commands as the language table, with {build} a hidden dir of the temp workspace.
JVM = ["-XX:+UseSerialGC", "-XX:-UsePerfData", "-XX:MaxRAM=512m", "-XX:MaxRAMPercentage=60"]
def commands(lang, build):
    b = build
    return {
        "py": (None, ["/usr/bin/python3", "-u", "main.py"]),
        "js": (None, ["/usr/bin/node", "index.js"]),
        "ts": (["/usr/bin/esbuild", "main.ts", f"--outfile={b}/main.mjs", "--format=esm",
                "--platform=node", "--target=node18", "--sourcemap", "--log-level=warning"],
               ["/usr/bin/node", "--enable-source-maps", f"{b}/main.mjs"]),
        "c": (["/usr/bin/gcc", "-std=gnu17", "-O2", "-o", f"{b}/main", "main.c", "-lm"], [f"{b}/main"]),
        "cpp": (["/usr/bin/g++", "-std=gnu++20", "-O2", "-o", f"{b}/main", "main.cpp"], [f"{b}/main"]),
        "java": (["/bin/bash", f"{b}/../javac.sh", "-J-XX:+UseSerialGC", "-J-XX:TieredStopAtLevel=1",
                  "-J-XX:-UsePerfData", "-J-XX:MaxRAM=512m", "-J-XX:MaxRAMPercentage=60"],
                 ["/usr/bin/java", *JVM, "-cp", f"{b}/classes", f"@{b}/main-class"]),
        "php": (None, ["/usr/bin/php", "index.php"]),
        "rs": (["/usr/bin/rustc", "--edition=2021", "-C", "opt-level=2", "-o", f"{b}/main", "main.rs"], [f"{b}/main"]),
        "go": (["/usr/bin/go", "build", "-o", f"{b}/main", "main.go"], [f"{b}/main"]),
        "d": (["/usr/bin/gdc", "-O2", "-o", f"{b}/main", "main.d"], [f"{b}/main"]),
        "f90": (["/usr/bin/gfortran", "-O2", "-J", b, "-o", f"{b}/main", "main.f90"], [f"{b}/main"]),
        "r": (None, ["/usr/bin/Rscript", "main.r"]),
        "bash": (None, ["/bin/bash", "script.sh"]),
    }[lang]

def wait_for_server():
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(URL + "/health", timeout=2) as r:
                return json.load(r)
        except OSError:
            time.sleep(0.2)
    sys.exit("bench-languages: the server did not come up (see its log)")

def via_api(lang, code):
    body = json.dumps({"lang": lang, "code": code}).encode()
    req = urllib.request.Request(URL + "/exec", body, {"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.load(r)
    elapsed = time.perf_counter() - t
    if out.get("stdout") != "hello 42\n":
        sys.exit(f"bench-languages: {lang} via the API answered {out}")
    return elapsed

def direct(lang, entry, code, n):
    ws = os.path.join(WORK, f"direct-{lang}-{n}")
    build = os.path.join(ws, ".kiln-build")
    os.makedirs(build)
    with open(os.path.join(ws, entry), "w") as f:
        f.write(code)
    if lang == "java":
        script = open(os.environ["KILN_BENCH_JAVAC_SH"]).read().replace("/mnt/data", ws)
        with open(os.path.join(ws, ".kiln-build", "..", "javac.sh"), "w") as f:
            f.write(script)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": ws, "LANG": "C.UTF-8", "TMPDIR": "/tmp",
           "GOCACHE": f"{build}/go-cache", "GOPATH": f"{build}/go", "GOPROXY": "off",
           "GOFLAGS": "-p=2", "PYTHONDONTWRITEBYTECODE": "1"}
    compile_cmd, run_cmd = commands(lang, build)
    t = time.perf_counter()
    if compile_cmd:
        subprocess.run(compile_cmd, cwd=ws, env=env, check=True, capture_output=True)
    out = subprocess.run(run_cmd, cwd=ws, env=env, check=True, capture_output=True, text=True).stdout
    elapsed = time.perf_counter() - t
    shutil.rmtree(ws)
    if out != "hello 42\n":
        sys.exit(f"bench-languages: {lang} directly printed {out!r}")
    return elapsed

health = wait_for_server()
versions = {l["name"]: l.get("version") or "unavailable" for l in health["languages"]}
rows = []
for lang in LANGS:
    entry, code = HELLO[lang]
    api, host = [], []
    for n in range(RUNS + 1):  # the first of each is a warm-up
        a = via_api(lang, code)
        d = direct(lang, entry, code, n)
        if n:
            api.append(a)
            host.append(d)
    ma, md = statistics.median(api) * 1000, statistics.median(host) * 1000
    rows.append((lang, versions.get(lang, "?"), ma, md))
    print(f"bench-languages: {lang}: api {ma:.0f} ms, direct {md:.0f} ms", file=sys.stderr)

load = os.getloadavg()
print(f"Median of {RUNS} runs each after one warm-up, alternating API and direct; "
      f"load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min).\n")
print("| Language | Toolchain | Kiln API (compile + run) | Direct on the host | Kiln − direct | Ratio |")
print("|---|---|---:|---:|---:|---:|")
for lang, version, ma, md in rows:
    print(f"| `{lang}` | {version} | {ma:.0f} ms | {md:.0f} ms | {ma - md:+.0f} ms | {ma / md:.2f}× |")
PY
