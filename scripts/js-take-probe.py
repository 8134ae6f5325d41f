#!/usr/bin/env python3
"""Which parked js jail each back-to-back request took (scenario E, issue 28): starts
`kiln serve` (clean environment, a fresh data dir), sends N js (or py) hellos over one
connection, and before each one lists the parked warm nodes (`node_warm.js` in their
command line): whether each is blocked reading the go on stdin (started) and its CPU so far
(schedstat of its threads); only this server's nodes count. The node a request took is the one gone before the next; with
the server's per-run phases (its debug log) and `kiln_warm_takes_total` it prints latency
and `run` for requests that took a started node, one still starting, or neither (a miss).
Needs root (other users' /proc entries); `--scan` turns the listing on."""
import argparse, http.client, json, os, re, shutil, signal, socket, subprocess, tempfile, time
from collections import Counter

ap = argparse.ArgumentParser()
ap.add_argument("--kiln", required=True)
ap.add_argument("-n", type=int, default=200)
ap.add_argument("--warmup", type=int, default=10)
ap.add_argument("--pause-ms", type=float, default=0)
ap.add_argument("--lang", default="js")
ap.add_argument("--json")
ap.add_argument("--scan", action="store_true")
ap.add_argument("--env", action="append", default=[])
a = ap.parse_args()

s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
d = tempfile.mkdtemp(prefix="eprobe-")
log = open(os.path.join(d, "kiln.log"), "w")
env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "RUST_LOG": "info,kiln_exec::pipeline=debug", "NO_COLOR": "1"}
for c in ["EXEC", "UPLOAD", "DOWNLOAD", "LIST", "DELETE", "CANCEL"]:
    env[f"KILN_RATE_{c}"] = "off"
for kv in a.env:
    k, v = kv.split("=", 1); env[k] = v
srv = subprocess.Popen([a.kiln, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", os.path.join(d, "data")],
                       env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
try:
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2); c.request("GET", "/v1/health")
            if c.getresponse().status == 200: break
        except Exception: pass
        time.sleep(0.05)
    time.sleep(3)
    code = "console.log('hello')" if a.lang == "js" else "print('hello')"
    body = json.dumps({"code": code, "lang": a.lang})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    def one():
        t = time.perf_counter()
        conn.request("POST", "/v1/exec", body, {"Content-Type": "application/json"})
        r = conn.getresponse(); out = json.loads(r.read())
        dt = time.perf_counter() - t
        assert r.status == 200 and out.get("stdout", "").strip() == "hello", out
        return dt
    def ours(p):
        # a descendant of this server (node <- the jail's init <- the launcher <- the server),
        # not a node of another server on the same host
        for _ in range(8):
            st = open(f"/proc/{p}/status").read()
            p = int(re.search(r"^PPid:\s+(\d+)", st, re.M).group(1))
            if p == srv.pid: return True
            if p <= 1: return False
        return False
    def nodes():
        r = []
        for p in os.listdir("/proc"):
            if not p.isdigit(): continue
            try:
                cl = open(f"/proc/{p}/cmdline","rb").read()
                if b"node_warm.js" not in cl or not ours(p): continue
                sc = open(f"/proc/{p}/syscall").read().split()
                cpu = sum(int(open(f"/proc/{p}/task/{t}/schedstat").read().split()[0]) for t in os.listdir(f"/proc/{p}/task")) / 1e6
                blocked = sc[0] == "0" and int(sc[1], 16) == 0
                r.append((blocked, cpu, int(p)))
            except Exception: pass
        return r
    def metrics():
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5); c.request("GET", "/metrics")
        return c.getresponse().read().decode()
    for _ in range(a.warmup): one()
    m0 = metrics()
    log.flush(); off = os.path.getsize(os.path.join(d, "kiln.log"))
    lat = []
    load0 = os.getloadavg()[0]
    seen = []
    for _ in range(a.n):
        seen.append(nodes() if a.scan else [])
        lat.append(one() * 1000)
        if a.pause_ms: time.sleep(a.pause_ms / 1000)
    load1 = os.getloadavg()[0]
    time.sleep(0.3)
    m1 = metrics()
finally:
    srv.send_signal(signal.SIGTERM); srv.wait(30)
text = open(os.path.join(d, "kiln.log")).read()[off:]
ph = {}
for line in text.splitlines():
    m = re.search(r'phase="?(\w+)"? us=(\d+)', line)
    if m: ph.setdefault(m.group(1), []).append(int(m.group(2)) / 1000)
def takes(m):
    r = {}
    for line in m.splitlines():
        mm = re.match(r'kiln_warm_takes_total\{(.*)\} (\S+)', line)
        if mm: r[mm.group(1)] = float(mm.group(2))
    return r
t0, t1 = takes(m0), takes(m1)
dt = {k: t1.get(k, 0) - t0.get(k, 0) for k in t1 if t1.get(k, 0) - t0.get(k, 0)}
def pct(v, p):
    v = sorted(v); return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]
print(f"load {load0:.2f}->{load1:.2f}  n={len(lat)} pause={a.pause_ms}")
print("latency p50/p95/p99 %.1f / %.1f / %.1f ms" % (pct(lat, 50), pct(lat, 95), pct(lat, 99)))
for k, v in ph.items():
    print(f"phase {k}: n={len(v)} mean {sum(v)/len(v):.2f} p50 {pct(v,50):.2f} p95 {pct(v,95):.2f} max {max(v):.2f}")
print("takes", dt)
if a.scan:
    # the node taken by request i: seen before it, gone before request i+1
    taken = []
    for i in range(len(lat)):
        nxt = {x[2] for x in seen[i + 1]} if i + 1 < len(seen) else None
        gone = [x for x in seen[i] if nxt is not None and x[2] not in nxt]
        taken.append(gone[0] if len(gone) == 1 else None)
    rdy = [i for i in range(len(lat)) if taken[i] and taken[i][0]]
    nrd = [i for i in range(len(lat)) if taken[i] and not taken[i][0]]
    unk = [i for i in range(len(lat)) if not taken[i]]
    print("taken node unknown (none or several gone):", len(unk), "; not bootstrapped when taken: CPU so far", sorted(round(taken[i][1],1) for i in nrd))
    runs = ph.get("run", [])
    for name, idx in (("took a bootstrapped node", rdy), ("took a node still booting", nrd), ("unknown (a miss?)", unk)):
        if not idx: print(name, 0); continue
        L = [lat[i] for i in idx]; R = [runs[i] for i in idx if i < len(runs)]
        print(f"{name}: n={len(idx)} latency p50 {pct(L,50):.1f} p95 {pct(L,95):.1f} max {max(L):.1f}; run p50 {pct(R,50):.1f} p95 {pct(R,95):.1f}")
    print("took a node still booting while one that had started was parked:",
          sum(1 for i in nrd if any(x[0] for x in seen[i])),
          "; no parked node had started:", sum(1 for i in nrd if not any(x[0] for x in seen[i])))
    print("parked node processes seen before a request:", Counter(len(x) for x in seen))
if a.json:
    json.dump({"seen": seen, "lat": lat, "phases": ph, "takes": dt, "load": [load0, load1]}, open(a.json, "w"))
shutil.rmtree(d, ignore_errors=True)
