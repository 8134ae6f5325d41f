#!/usr/bin/env python3
"""Kiln: checks that warm runs are indistinguishable from cold ones, without the Rust side.

For every case of crates/kiln-core/src/lang/warm/fidelity.json it runs the program
- cold: `/usr/bin/python3 -u main.py ARGS` / `/usr/bin/node index.js ARGS` in a fresh
  temporary workspace, with the jail's environment (kiln_exec::environment) minus the
  host paths, and
- warm: py — a simulated fork-server: one `/usr/bin/python3` process runs
  python_template.py once (as PyRun_SimpleString would), then forks per case; the child
  chdirs into a fresh workspace, gets fresh pipes as fd 1/2 and /dev/null as fd 0, resets
  every signal to SIG_DFL and calls `_kiln_zygote.run(go)`. js — `node node_warm.js`
  (or `node --require node_warm.js index.js`, --node-mode preload) with the go JSON on
  its stdin,
and compares stdout, stderr, exit status and the files the program created (names and
contents, hidden paths skipped like Kiln's walker), after replacing each run's own
workspace and MPLCONFIGDIR paths by /mnt/data and /tmp/.mpl. Prints a table and exits 1
on any difference. --bench N measures start-up latencies instead. Stdlib only.
"""

import argparse
import difflib
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LANG_DIR = os.path.join(ROOT, "crates", "kiln-core", "src", "lang")
WARM_DIR = os.path.join(LANG_DIR, "warm")
PYTHON = "/usr/bin/python3"
NODE = "/usr/bin/node"
# the template's own modules (--template): the data template's, or none (lean)
PRELOAD_MODULES = ("numpy", "pandas", "matplotlib", "matplotlib.pyplot")
# kiln_core::lang: sitecustomize.py is staged for code that mentions these
SITECUSTOMIZE_WHEN = ("matplotlib", "seaborn", "pylab")


def jail_env(lang, ws, mpl):
    """kiln_exec::environment(lang) with the workspace (/mnt/data) at ws."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": ws,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TMPDIR": "/tmp",
        "TERM": "dumb",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "SANDBOX_LANGUAGE": lang,
    }
    if lang == "py":
        env.update(
            {
                "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
                "MPLBACKEND": "Agg",
                "MPLCONFIGDIR": mpl,
                "PYTHONPATH": os.path.join(ws, ".kiln", "python"),
            }
        )
    return env


ENTRY = {"py": "main.py", "js": "index.js"}


def argv_for(lang, args):
    if lang == "py":
        return [PYTHON, "-u", "main.py", *args]
    return [NODE, "index.js", *args]


class Workspace:
    """A temporary /mnt/data (and MPLCONFIGDIR) for one run."""

    def __init__(self, case):
        self.ws = tempfile.mkdtemp(prefix="kiln-fid-ws-")
        self.mpl = tempfile.mkdtemp(prefix="kiln-fid-mpl-")
        os.rmdir(self.mpl)  # /tmp/.mpl does not exist in a fresh jail
        with open(os.path.join(self.ws, ENTRY[case["lang"]]), "w") as f:
            f.write(case["code"])
        if case["lang"] == "py" and any(w in case["code"] for w in SITECUSTOMIZE_WHEN):
            os.makedirs(os.path.join(self.ws, ".kiln", "python"))
            # as the language table stages it: the plot hook, then sitecustomize.py
            with open(os.path.join(self.ws, ".kiln", "python", "sitecustomize.py"), "w") as out:
                for name in ("kiln_plot.py", "sitecustomize.py"):
                    with open(os.path.join(LANG_DIR, "python", name)) as f:
                        out.write(f.read())
        self.before = {ENTRY[case["lang"]]}

    def env(self, lang):
        return jail_env(lang, self.ws, self.mpl)

    def normalize(self, data):
        text = data.decode("utf-8", "backslashreplace")
        return text.replace(self.ws, "/mnt/data").replace(self.mpl, "/tmp/.mpl")

    def files(self):
        """Visible files the program created: relative path -> sha256 (Kiln skips dot paths)."""
        found = {}
        for dirpath, dirnames, filenames in os.walk(self.ws):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith("."):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, self.ws)
                if rel in self.before:
                    continue
                with open(path, "rb") as f:
                    found[rel] = hashlib.sha256(f.read()).hexdigest()[:12]
        return found

    def close(self):
        shutil.rmtree(self.ws, ignore_errors=True)
        shutil.rmtree(self.mpl, ignore_errors=True)


class Outcome:
    def __init__(self, wsp, stdout, stderr, status, ms, start_ns=0):
        self.stdout = wsp.normalize(stdout)
        self.stderr = wsp.normalize(stderr)
        self.status = status  # exit code, or -N for death by signal N
        self.files = wsp.files()
        self.ms = ms
        self.start_ns = start_ns  # wall clock when the run was started (spawn, fork or go)

    def user_start_ms(self):
        """Start → the program's first statement, which printed the wall clock (ns or ms)."""
        stamp = float(self.stdout.split()[0])
        return (stamp - self.start_ns) / 1e6 if stamp > 1e15 else stamp - self.start_ns / 1e6


def run_cold(case, timeout):
    wsp = Workspace(case)
    try:
        t0, start_ns = time.monotonic(), time.time_ns()
        p = subprocess.run(
            argv_for(case["lang"], case["args"]),
            cwd=wsp.ws,
            env=wsp.env(case["lang"]),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )
        ms = (time.monotonic() - t0) * 1000
        return Outcome(wsp, p.stdout, p.stderr, p.returncode, ms, start_ns)
    finally:
        wsp.close()


# The simulated fork-server: runs in its own /usr/bin/python3, reads one JSON request
# per line on stdin, answers one JSON line per finished child on stdout (fd 3 copy).
SIMULATOR = r"""
import json, os, signal, sys, time
reply = os.fdopen(os.dup(1), "w")
with open(sys.argv[1]) as f:
    template = f.read()
import __main__
t0 = time.monotonic()
exec(compile(template, "<string>", "exec"), __main__.__dict__)  # as PyRun_SimpleString does
preload_ms = (time.monotonic() - t0) * 1000
rss_kib = int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0])
reply.write(json.dumps({"preload_ms": preload_ms, "rss_kib": rss_kib}) + "\n")
reply.flush()
for line in sys.stdin:
    req = json.loads(line)
    out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    fork_ns, fork_wall_ns = time.monotonic_ns(), time.time_ns()
    pid = os.fork()
    if pid == 0:
        os.chdir(req["cwd"])
        null = os.open("/dev/null", os.O_RDONLY)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        for s in signal.valid_signals():
            if s not in (signal.SIGKILL, signal.SIGSTOP):
                try:
                    signal.signal(s, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass
        call = "import _kiln_zygote; _kiln_zygote.run(bytes.fromhex('%s'))" % req["go"]
        exec(call, __main__.__dict__)  # what the Rust side runs with PyRun_SimpleString
        os._exit(99)  # run returned: a template bug
    os.close(out)
    os.close(err)
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    ms = (time.monotonic_ns() - fork_ns) / 1e6
    reply.write(json.dumps({"status": code, "ms": ms, "fork_ns": fork_wall_ns}) + "\n")
    reply.flush()
"""


def kernel_program():
    """The `py` kernel's entry of a stdlib template's _kiln_programs, as python_preload writes it."""
    with open(os.path.join(WARM_DIR, "python_kernel.py"), "rb") as f:
        return '"/etc/kiln/kiln_kernel.py": bytes.fromhex("%s")' % f.read().hex()


class ForkServer:
    """The simulator process, started with the environment the Rust side gives the template."""

    def __init__(self, modules=PRELOAD_MODULES, stdlib=True):
        self.home = tempfile.mkdtemp(prefix="kiln-fid-zygote-")
        env = jail_env("py", "/mnt/data", os.path.join(self.home, "mpl"))
        del env["PYTHONPATH"]
        # the preload as kiln_core::lang::warm::python_preload composes it
        preload = os.path.join(self.home, "preload.py")
        with open(preload, "w") as out:
            with open(os.path.join(LANG_DIR, "python", "kiln_plot.py")) as f:
                out.write(f.read())
            out.write("\n_kiln_preload = (%s)\n" % "".join("%r, " % m for m in modules))
            out.write("_kiln_stdlib = %s\n" % bool(stdlib))
            out.write("_kiln_programs = {%s}\n\n" % (kernel_program() if stdlib else ""))
            with open(os.path.join(WARM_DIR, "python_template.py")) as f:
                out.write(f.read())
        self.proc = subprocess.Popen(
            [PYTHON, "-u", "-c", SIMULATOR, preload],
            cwd=self.home,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("check-warm-fidelity: the template failed to preload")
        self.info = json.loads(line)

    def run(self, go, cwd, stdout, stderr):
        req = {"go": json.dumps(go).encode().hex(), "cwd": cwd, "stdout": stdout, "stderr": stderr}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("check-warm-fidelity: the simulated fork-server died")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()
        shutil.rmtree(self.home, ignore_errors=True)


def go_message(case, wsp):
    env = wsp.env(case["lang"])
    return {"argv": argv_for(case["lang"], case["args"]), "env": [[k, v] for k, v in env.items()]}


def run_warm_py(case, server):
    wsp = Workspace(case)
    io_dir = tempfile.mkdtemp(prefix="kiln-fid-io-")
    try:
        out, err = os.path.join(io_dir, "out"), os.path.join(io_dir, "err")
        r = server.run(go_message(case, wsp), wsp.ws, out, err)
        with open(out, "rb") as f1, open(err, "rb") as f2:
            return Outcome(wsp, f1.read(), f2.read(), r["status"], r["ms"], r["fork_ns"])
    finally:
        shutil.rmtree(io_dir, ignore_errors=True)
        wsp.close()


def node_argv(mode):
    bootstrap = os.path.join(WARM_DIR, "node_warm.js")
    if mode == "preload":
        return [NODE, "--require", bootstrap, "index.js"]
    return [NODE, bootstrap]


def start_parked_node(case, wsp, mode):
    return subprocess.Popen(
        node_argv(mode),
        cwd=wsp.ws,
        env=wsp.env("js"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def run_warm_js(case, mode, timeout, park_s=0.0):
    wsp = Workspace(case)
    try:
        p = start_parked_node(case, wsp, mode)
        if park_s:
            time.sleep(park_s)
        t0, start_ns = time.monotonic(), time.time_ns()
        stdout, stderr = p.communicate(json.dumps(go_message(case, wsp)).encode(), timeout=timeout)
        ms = (time.monotonic() - t0) * 1000
        return Outcome(wsp, stdout, stderr, p.returncode, ms, start_ns)
    finally:
        wsp.close()


def compare(cold, warm):
    diffs = []
    for what in ("stdout", "stderr", "status", "files"):
        if getattr(cold, what) != getattr(warm, what):
            diffs.append(what)
    return diffs


def show_diff(name, cold, warm, diffs):
    print("--- %s" % name)
    for what in diffs:
        a, b = getattr(cold, what), getattr(warm, what)
        if isinstance(a, str):
            lines = difflib.unified_diff(
                a.splitlines(True), b.splitlines(True), "cold " + what, "warm " + what
            )
            sys.stdout.write("".join(lines) + "\n")
        else:
            print("  %s: cold %r, warm %r" % (what, a, b))


RESEED = {
    "name": "warm_runs_reseed_random",
    "lang": "py",
    "code": "import random\ntry:\n    import numpy\n"
    "    print(random.random(), numpy.random.rand())\n"
    "except ImportError:\n    print(random.random(), random.random())\n",
    "args": [],
}


def reseeded(server):
    """Two forks of one template must not share random's or numpy's generator state."""
    a, b = run_warm_py(RESEED, server), run_warm_py(RESEED, server)
    if a.status or b.status or len(a.stdout.split()) != 2:
        return False
    return all(x != y for x, y in zip(a.stdout.split(), b.stdout.split()))


def check(args):
    with open(args.cases) as f:
        cases = json.load(f)
    if args.only:
        cases = [c for c in cases if any(o in c["name"] for o in args.only)]
    modules = () if args.template in ("lean", "min") else PRELOAD_MODULES
    py = any(c["lang"] == "py" for c in cases)
    server = ForkServer(modules, args.template != "min") if py else None
    if server:
        print(
            "template preload %.0f ms, fork-server RSS %.1f MiB"
            % (server.info["preload_ms"], server.info["rss_kib"] / 1024)
        )
    failures = 0
    rows = []
    try:
        for case in cases:
            cold = run_cold(case, args.timeout)
            if case["lang"] == "py":
                warm = run_warm_py(case, server)
            else:
                warm = run_warm_js(case, args.node_mode, args.timeout)
            diffs = compare(cold, warm)
            failures += bool(diffs)
            rows.append((case["name"], cold, warm, diffs))
            if diffs and args.verbose:
                show_diff(case["name"], cold, warm, diffs)
        if server:
            ok = reseeded(server)
            failures += not ok
            extra = "ok" if ok else "DIFF: two warm runs printed the same random numbers"
    finally:
        if server:
            server.close()
    width = max(len(r[0]) for r in rows) if rows else 4
    print("%-*s  %-6s  %8s  %8s  %s" % (width, "case", "status", "cold ms", "warm ms", "result"))
    for name, cold, warm, diffs in rows:
        result = "ok" if not diffs else "DIFF: " + ", ".join(diffs)
        print("%-*s  %-6s  %8.1f  %8.1f  %s" % (width, name, cold.status, cold.ms, warm.ms, result))
    if server:
        print("%-*s  %s" % (width, RESEED["name"], extra))
        rows.append(RESEED)
    print("%d of %d checks failed" % (failures, len(rows)))
    return 1 if failures else 0


def bench(args):
    """Start-up latencies (medians of N): start → the program's first statement, and → exit.
    Start is the fork (warm py), the spawn (cold) or the go write to a parked node (warm js)."""
    n = args.bench
    py_stamp = "import time\nprint(time.time_ns())\n"
    js_stamp = "console.log(performance.timeOrigin + performance.now());\n"

    def report(label, outcomes):
        outcomes = list(outcomes)
        if any(o.status for o in outcomes):
            raise SystemExit("check-warm-fidelity: %s failed: %s" % (label, outcomes[0].stderr))
        print("%-44s start -> program %7.2f ms   start -> exit %7.2f ms" % (
            label,
            statistics.median(o.user_start_ms() for o in outcomes),
            statistics.median(o.ms for o in outcomes),
        ))

    server = ForkServer()
    try:
        print("template preload %.0f ms, fork-server RSS %.1f MiB" % (
            server.info["preload_ms"], server.info["rss_kib"] / 1024))
        case = {"lang": "py", "code": py_stamp, "args": []}
        report("py warm (fork of the template)", (run_warm_py(case, server) for _ in range(n)))
    finally:
        server.close()
    report("py cold", (run_cold({"lang": "py", "code": py_stamp, "args": []}, args.timeout)
                       for _ in range(n)))
    heavy = "import numpy, pandas, matplotlib.pyplot\n" + py_stamp
    report("py cold, importing numpy+pandas+pyplot", (
        run_cold({"lang": "py", "code": heavy, "args": []}, args.timeout) for _ in range(n)))
    case = {"lang": "js", "code": js_stamp, "args": []}
    for mode in ("preload", "main"):
        report("js warm (%s, parked 0.3 s)" % mode,
               (run_warm_js(case, mode, args.timeout, park_s=0.3) for _ in range(n)))
    report("js cold", (run_cold(case, args.timeout) for _ in range(n)))
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=os.path.join(WARM_DIR, "fidelity.json"))
    parser.add_argument("--only", nargs="*", help="run the cases whose name contains one of these")
    parser.add_argument("--node-mode", choices=("main", "preload"), default="preload",
                        help="start node_warm.js as the main module or as a --require preload")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--template", choices=("data", "lean", "min"), default="data",
                        help="the simulated fork-server's template (numpy, pandas, matplotlib; none; or not even the common stdlib set)")
    parser.add_argument("--bench", type=int, metavar="N", help="measure latencies over N runs")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every difference")
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(bench(args) if args.bench else check(args))


if __name__ == "__main__":
    main()
