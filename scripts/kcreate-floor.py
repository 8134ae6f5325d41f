#!/usr/bin/env python3
"""Where the CPU and the wall time of a `py` kernel create go, alone and at density
(issue 28; BENCHMARKS.md, "A kernel create at 1,000 idle kernels").

Starts `kiln serve` (fresh data dir, free loopback port, JSON log), creates BEFORE idle
`py` kernels back to back (not recorded), waits SETTLE seconds, then N more back to back while `perf record -a -g`
samples every CPU: each create (`POST /v1/sessions`) followed by its first evaluation
(`print(6*7)`, checked), the kernel left idle, as kiln-bench's scenario K does. Prints:
  - the creates' walls (create alone, create -> first output) p50 / p95;
  - `park` (jail built + kernel forked from the template) and `ready` (the kernel's start in
    the forked child) p50 / p95 from the server's `kernel started` lines logged in the window
    (the pool's refills: with the pool outrun, each create waits for one);
  - ms of CPU per create by process role x kernel part (scripts/floor.py's attribution);
  - the fork-server's ms per create under `copy_page_range` / `dup_mmap` and the zap at exit.

  scripts/kcreate-floor.py --kiln BIN [--before 0] [-n 100] [--freq 499] [--settle 20] [--json FILE]
Needs root and perf. Every kernel is deleted and the server stopped at the end.
"""
import argparse, json, os, signal, socket, subprocess, sys, tempfile, time, urllib.request
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import floor  # noqa: E402

MM_MARKERS = {  # the first entry with a marker on the stack wins
    "fork: copy_page_range": ("copy_page_range",),
    "fork: dup_mmap (rest)": ("dup_mmap",),
    "page faults: copy-on-write": ("wp_page_copy", "do_wp_page", "do_huge_pmd_wp_page"),
    "page faults: file pages mapped": ("filemap_map_pages", "filemap_fault", "do_read_fault"),
    "page faults: fresh anonymous": ("do_anonymous_page",),
    "page faults: other": ("exc_page_fault",),
    "exit: unmap (zap)": ("unmap_vmas", "zap_pte_range", "exit_mmap"),
}


def req(base, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(base + path, data=data, method=method,
                               headers={"content-type": "application/json", "User-Id": "kpark"})
    with urllib.request.urlopen(r, timeout=120) as resp:
        return json.loads(resp.read() or b"null")


def create(base):
    t0 = time.perf_counter()
    sid = req(base, "POST", "/sessions", {"lang": "py"})["session_id"]
    t1 = time.perf_counter()
    out = req(base, "POST", f"/sessions/{sid}/exec", {"code": "print(6*7)"})
    t2 = time.perf_counter()
    if out.get("stdout", "").strip() != "42":
        raise SystemExit(f"first evaluation printed {out!r}")
    return sid, (t1 - t0) * 1000, (t2 - t0) * 1000


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * p))] if v else float("nan")


def started_lines(log, offset):
    rows = []
    with open(log) as f:
        f.seek(offset)
        for line in f:
            if '"kernel started"' not in line:
                continue
            try:
                j = json.loads(line)
            except ValueError:
                continue
            fl = j.get("fields", j)
            rows.append((float(fl.get("park_ms", "nan")), float(fl.get("ready_ms", "nan"))))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--before", type=int, default=0)
    ap.add_argument("-n", type=int, default=100)
    ap.add_argument("--freq", type=int, default=499)
    ap.add_argument("--settle", type=float, default=20.0,
                    help="seconds between the unrecorded creates and the recording (default 20)")
    ap.add_argument("--json")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kcreate-")
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    base = f"http://127.0.0.1:{port}/v1"
    env = dict(os.environ, KILN_LOG_FORMAT="json", KILN_LISTEN=f"127.0.0.1:{port}",
               KILN_DATA_DIR=f"{work}/data", KILN_MAX_SESSIONS=str(a.before + a.n + 50),
               KILN_MAX_SESSIONS_PER_USER=str(a.before + a.n + 50))
    log = f"{work}/kiln.log"
    server = subprocess.Popen([a.kiln, "serve"], stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    sids = []
    try:
        for _ in range(1200):
            try:
                sid, _, _ = create(base)
                sids.append(sid)
                break
            except Exception:
                time.sleep(0.2)
        else:
            raise SystemExit("no py kernel after 4 minutes")
        for _ in range(max(0, a.before - 1)):
            sids.append(create(base)[0])
        time.sleep(a.settle)  # the other templates' fork-servers finish their preloads
        known = floor.server_known(server.pid, os.getpid())
        offset = os.path.getsize(log)
        load0 = open("/proc/loadavg").read().split()[0]

        def loop():
            walls = []
            for _ in range(a.n):
                sid, c, f = create(base)
                sids.append(sid)
                walls.append((c, f))
            return walls

        path, walls = floor.record(loop, a.freq)
        load1 = open("/proc/loadavg").read().split()[0]
        phases = started_lines(log, offset)
        mm = defaultdict(float)
        comms = defaultdict(float)

        def note(role, comm, frames, per):
            comms[f"{role} [{comm}]"] += per
            syms = [sym for _, sym in frames]
            for name, marks in MM_MARKERS.items():
                if any(sym.startswith(marks) for sym in syms):
                    mm[f"{role}: {name}"] += per
                    break

        ms = floor.tabulate(path, known, a.freq, also=note)
        n = a.n
        print(f"kiln {a.kiln}; {a.before} idle kernels before, {n} creates recorded; load {load0} -> {load1}")
        c = [w[0] for w in walls]; f = [w[1] for w in walls]
        print(f"create alone p50 {pct(c, .5):.1f} p95 {pct(c, .95):.1f} ms; "
              f"create -> first output p50 {pct(f, .5):.1f} p95 {pct(f, .95):.1f} ms")
        pk = [p for p, _ in phases]; rd = [r for _, r in phases]
        print(f"{len(phases)} kernels started in the window: park p50 {pct(pk, .5):.1f} p95 {pct(pk, .95):.1f} ms, "
              f"ready p50 {pct(rd, .5):.1f} p95 {pct(rd, .95):.1f} ms")
        floor.print_table(ms, {"what": "create", "n": n}, "kernel create + first evaluation")
        print("\nby role [process name] (ms of CPU per create):")
        for k, v in sorted(comms.items(), key=lambda kv: -kv[1]):
            if v / n >= 0.2 and not k.startswith("other load"):
                print(f"  {k}: {v / n:.2f}")
        print("\nmemory-management parts (ms of CPU per create):")
        for k, v in sorted(mm.items(), key=lambda kv: -kv[1]):
            if v / n >= 0.05:
                print(f"  {k}: {v / n:.2f}")
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"kiln": a.kiln, "before": a.before, "n": n, "load": [load0, load1],
                           "walls": walls, "phases": phases, "ms": ms, "mm": mm, "comms": comms}, fh, indent=1)
    finally:
        for sid in sids:
            try:
                req(base, "DELETE", f"/sessions/{sid}")
            except Exception:
                pass
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
