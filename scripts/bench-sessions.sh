#!/usr/bin/env bash
# Live sessions: how long `POST /v1/sessions` takes and what an idle kernel costs in memory
# (issue 14 §3; BENCHMARKS.md, "Live sessions"). Starts `kiln serve` (fresh data dir, free
# loopback port, embedded defaults), then for each language:
#   - latency: WARMUP unmeasured creates, then RUNS sequential create + delete pairs; the
#     create's time as curl sees it (HTTP included), p50 / p90 / min / max;
#   - memory: the PIDs on the machine are listed, IDLE kernels are created and left idle for
#     2 s, and the server's descendants that appeared are summed from /proc/<pid>/smaps_rollup
#     (Pss, Private_Clean + Private_Dirty), divided by IDLE. What appeared also includes the
#     warm pool refilling behind the kernels, so the figure is an upper bound per kernel.
# Next to it, the same machine's bare `python3 -c pass` and `node -e 0` spawn times.
# With --phases N instead: where a `py` create goes (issue 28; BENCHMARKS.md, "Live-kernel
# density"): 5 unmeasured and N measured sequential creates, each followed by a first
# evaluation (`print(6*7)`, checked) and a delete, 50 ms apart; p50 / p95 / mean, ms, of the
# create (HTTP), create -> first output, and from the server's `kernel started` log line
# `slot` (the uid slot and its workspace filesystem; older servers do not log it, it is then
# inside `rest`), `park` (the jail built, the kernel forked from the template), `ready` (the
# go -> the kernel's `ready` frame) and `rest` (create - park - ready: HTTP, the registry).
# A server that starts kernels ahead (`parked_kernels`) shows its pool's hits and misses
# instead of `rest`: a hit's park and ready happened before its create, in the background.
#
#   scripts/bench-sessions.sh [--kiln target/release/kiln] [--runs 30] [--warmup 5] [--idle 3] \
#     [--langs "py js"] [--phases 100]
# Needs curl and python3 (for the JSON and the arithmetic).
set -euo pipefail
cd "$(dirname "$0")/.."

kiln=target/release/kiln
runs=30
warmup=5
idle=3
langs="py js"
phases=
while (($#)); do
  case "$1" in
    --kiln) kiln=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --idle) idle=$2; shift 2 ;;
    --langs) langs=$2; shift 2 ;;
    --phases) phases=$2; shift 2 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $kiln ]] || { echo "no kiln binary at $kiln (cargo build --release -p kiln)" >&2; exit 1; }

work=$(mktemp -d /tmp/kiln-bench-sessions.XXXXXX)
server=
cleanup() {
  if [[ -n $server ]]; then kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
base="http://127.0.0.1:$port/v1"
KILN_LOG_FORMAT=json KILN_LISTEN="127.0.0.1:$port" KILN_DATA_DIR="$work/data" KILN_MAX_SESSIONS=$((idle + 2)) \
  KILN_MAX_SESSIONS_PER_USER=$((idle + 1)) "$kiln" serve >"$work/kiln.log" 2>&1 &
server=$!
for _ in $(seq 1 600); do
  curl -fsS "$base/health" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "$base/health" >/dev/null || { cat "$work/kiln.log" >&2; exit 1; }

if [[ -n $phases ]]; then
  echo "kiln $kiln, $phases creates; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
  python3 - "$base" "$phases" "$work/kiln.log" <<'PY'
import json, math, sys, time, urllib.request

base, n, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def req(method, url, body=None):
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(url, data=data, method=method,
                               headers={"content-type": "application/json"})
    with urllib.request.urlopen(r, timeout=60) as resp:
        return resp.read()

# the first create waits for the fork-server (503 until it runs)
for _ in range(600):
    try:
        first = json.loads(req("POST", base + "/sessions", {"lang": "py"}))
        break
    except Exception:
        time.sleep(0.2)
else:
    sys.exit("no py kernel after 2 minutes")
req("DELETE", base + "/sessions/" + first["session_id"])
rows = []
for i in range(n + 5):
    t0 = time.perf_counter()
    sid = json.loads(req("POST", base + "/sessions", {"lang": "py"}))["session_id"]
    t1 = time.perf_counter()
    out = json.loads(req("POST", base + f"/sessions/{sid}/exec", {"code": "print(6*7)"}))
    t2 = time.perf_counter()
    if out.get("stdout", "").strip() != "42":
        sys.exit(f"first evaluation printed {out!r}")
    req("DELETE", base + "/sessions/" + sid)
    time.sleep(0.05)
    if i >= 5:
        rows.append(((t1 - t0) * 1000, (t2 - t0) * 1000))
time.sleep(0.5)
started = [json.loads(l)["fields"] for l in open(log) if '"kernel started"' in l][-n:]

def show(name, v):
    s = sorted(v)
    q = lambda p: s[max(0, math.ceil(p / 100 * len(s)) - 1)]
    print(f"| {name} | {q(50):.1f} | {q(95):.1f} | {sum(s) / len(s):.1f} |")

print("| phase (ms) | p50 | p95 | mean |\n|---|---:|---:|---:|")
show("create (HTTP)", [c for c, _ in rows])
show("create -> first output", [f for _, f in rows])
if started and "slot_ms" in started[0]:
    show("slot", [s["slot_ms"] for s in started])
show("park", [s["park_ms"] for s in started])
show("ready", [s["ready_ms"] for s in started])
metrics = urllib.request.urlopen(base.rsplit("/v1", 1)[0] + "/metrics", timeout=10).read().decode()
takes = {r: sum(float(l.split()[-1]) for l in metrics.splitlines()
                if l.startswith('kiln_kernel_pool_takes_total{lang="py",result="%s"}' % r))
         for r in ("hit", "miss")}
if takes["hit"] > 0:
    # parked kernels: park and ready happened ahead, off the create
    print(f"\nkernels started ahead, all creates: {takes['hit']:.0f} hits, {takes['miss']:.0f} misses"
          " (park and ready above are of kernels started ahead for hits, in the background)")
else:
    show("rest", [c - s["park_ms"] - s["ready_ms"] for (c, _), s in zip(rows, started)])
PY
  echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
  exit 0
fi

# POST /v1/sessions, retried while the server's fork-servers start; prints "<seconds> <id>"
create() {
  local lang=$1 out code
  for _ in $(seq 1 600); do
    out=$(curl -sS -o "$work/c.json" -w '%{http_code} %{time_total}' -X POST "$base/sessions" \
      -H 'content-type: application/json' -d "{\"lang\":\"$lang\"}")
    code=${out%% *}
    if [[ $code == 201 ]]; then
      echo "${out#* } $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["session_id"])' "$work/c.json")"
      return
    fi
    [[ $code == 503 ]] || { echo "create $lang: HTTP $code: $(cat "$work/c.json")" >&2; exit 1; }
    sleep 0.2
  done
  echo "create $lang: still 503 after 2 minutes" >&2
  exit 1
}
delete() { curl -fsS -o /dev/null -X DELETE "$base/sessions/$1"; }

stats() {  # seconds on stdin -> "p50 … ms, p90 …, min …, max … (n=…)"
  python3 -c '
import sys
v = sorted(float(x) * 1000 for x in sys.stdin.read().split())
q = lambda p: v[min(len(v) - 1, int(p * (len(v) - 1) + 0.5))]
print("p50 %.1f ms, p90 %.1f, min %.1f, max %.1f (n=%d)" % (q(0.5), q(0.9), v[0], v[-1], len(v)))'
}

memory_of_new() {  # pids before (file) -> Pss and private memory of the server's new descendants / idle
  python3 - "$1" "$idle" "$server" <<'EOF'
import os, sys
before = set(open(sys.argv[1]).read().split())
n, server = int(sys.argv[2]), sys.argv[3]
parent = {}
for pid in os.listdir("/proc"):
    try:
        parent[pid] = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        pass
def under_server(pid):
    while pid in parent and pid != "1":
        if pid == server:
            return True
        pid = parent[pid]
    return False
pss = priv = 0
procs = 0
for pid in parent:
    if pid in before or not under_server(pid):
        continue
    try:
        fields = dict(l.split(":", 1) for l in open(f"/proc/{pid}/smaps_rollup") if ":" in l and not l.startswith("0"))
    except OSError:
        continue
    kb = lambda k: int(fields.get(k, "0 kB").split()[0])
    pss += kb("Pss")
    priv += kb("Private_Clean") + kb("Private_Dirty")
    procs += 1
print("per kernel: Pss %.1f MiB, private %.1f MiB (%d new processes for %d kernels)"
      % (pss / 1024 / n, priv / 1024 / n, procs, n))
EOF
}

bare() {  # a command -> its spawn time over 20 runs (clean environment)
  python3 -c '
import subprocess, sys, time
for _ in range(20):
    t = time.perf_counter()
    subprocess.run(sys.argv[1:], env={}, stdout=subprocess.DEVNULL, check=True)
    print(time.perf_counter() - t)' "$@" | stats
}

echo "kiln $("$kiln" --version 2>/dev/null || echo "$kiln"), $(nproc) vCPU, load $(cut -d' ' -f1-3 /proc/loadavg)"
for lang in $langs; do
  for _ in $(seq 1 "$warmup"); do read -r _ id < <(create "$lang"); delete "$id"; done
  : >"$work/t"
  for _ in $(seq 1 "$runs"); do
    read -r t id < <(create "$lang")
    echo "$t" >>"$work/t"
    delete "$id"
  done
  echo "$lang create: $(stats <"$work/t")"
  ls /proc | grep -E '^[0-9]+$' >"$work/pids"
  ids=()
  for _ in $(seq 1 "$idle"); do read -r _ id < <(create "$lang"); ids+=("$id"); done
  sleep 2
  echo "$lang idle kernel $(memory_of_new "$work/pids")"
  for id in "${ids[@]}"; do delete "$id"; done
done
echo "bare python3 -c pass: $(bare /usr/bin/python3 -c pass)"
echo "bare node -e 0: $(bare /usr/bin/node -e 0)"
