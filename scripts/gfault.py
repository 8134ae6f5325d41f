#!/usr/bin/env python3
"""What the program G of a `py` hello request spends on memory: its page faults by
kind, and the kernel work of its exit and of the fork-server's fork that made it.

  gfault.py --url http://127.0.0.1:PORT --server-pid PID [-n 200] [--zygote-pid Z]

against a running `kiln serve` (release build, `KILN_RATE_EXEC=off`). The fork-server
is the server's `kiln __zygote` child with the smallest resident set (`py-lean`)
unless --zygote-pid names one. Two passes, each sending N `print('hello')` runs (a new
connection each, every answer checked) after 20 unrecorded ones (the warm pool's
jails parked before the first pass are used up):

1. faults: `perf record -e exceptions:page_fault_user -p Z` (inherited by every fork
   made while it records), each fault classified by the fork-server's own mapping
   that holds its address (/proc/Z/maps, read before the pass) and its error code:
   a write to a present page is copy-on-write of the template's page, a write to an
   absent one a new page, a read or instruction fetch of an absent page in a file
   mapping a re-fault of a page the template has mapped (a fork copies no page
   table of a file mapping without anonymous pages), an address outside every
   template mapping a mapping the program made itself.
2. cpu: `perf record -a -g -e cpu-clock` with `sched:sched_process_fork`, the
   samples of the fork-server's children (G) and of the fork-server itself,
   attributed by kernel function: the exit's `exit_mmap` parts, the fork's
   `dup_mmap` parts, the fault paths.

Needs root and perf. Prints markdown tables; `--json FILE` writes the numbers.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

sys.dont_write_bytecode = True  # no __pycache__ left in scripts/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from floor import hello, server_known  # noqa: E402  (the checked request, the server's children)

WARMUP = 20

# Kernel functions a sample's stack may pass through, outermost part first, and
# the inner functions that split it; the first outer marker found names the part.
CPU_PARTS = [
    ("exit: exit_mmap", "exit_mmap", ("unmap_vmas", "tlb_finish_mmu", "free_pgtables", "remove_vma", "unlink_anon_vmas")),
    ("exit: rest of do_exit", "do_exit", ()),
    ("fork: dup_mmap", "dup_mmap", ("copy_page_range", "anon_vma_fork", "vm_area_dup", "mas_store", "__mt_dup")),
    ("fork: rest of copy_process", "copy_process", ()),
    ("page fault", "exc_page_fault", ("do_wp_page", "filemap_map_pages", "do_anonymous_page", "do_read_fault", "do_cow_fault")),
]


def requests(url, n):
    for i in range(n):
        hello(url, f"gfault{i % 5}")


def fork_server(server_pid):
    """The server's `kiln __zygote` child with the smallest resident set."""
    best = None
    for pid, role in server_known(server_pid, os.getpid()).items():
        if role != "fork-server":
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ValueError, IndexError):
            continue
        if best is None or rss < best[0]:
            best = (rss, pid)
    if best is None:
        raise SystemExit(f"no fork-server (kiln __zygote) is a child of {server_pid}")
    return best[1]


def read_maps(pid):
    maps = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            p = line.split()
            start, end = (int(x, 16) for x in p[0].split("-"))
            maps.append((start, end, p[1], p[5] if len(p) > 5 else ""))
    return maps


def mapping_of(maps, addr):
    for start, end, perms, name in maps:
        if start <= addr < end:
            return start, end, perms, name
    return None


def record(args, fn):
    """Runs fn() while `perf record args` records; returns the perf.data path."""
    fd, path = tempfile.mkstemp(prefix="gfault-", suffix=".data")
    os.close(fd)
    perf = subprocess.Popen(["perf", "record", "-q", "-o", path, *args, "--", "sleep", "3600"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)  # perf attached
    try:
        fn()
    except BaseException:
        perf.send_signal(signal.SIGINT)
        perf.wait()
        os.unlink(path)
        raise
    perf.send_signal(signal.SIGINT)
    perf.wait()
    return path


FAULT = re.compile(r"^\s*(\d+)\s+address=0x([0-9a-f]+)\s+ip=0x([0-9a-f]+)\s+error_code=0x([0-9a-f]+)")


def fault_kind(m, write, present, ifetch):
    if m is None:
        return "a mapping the program made (not in the template)"
    _, _, perms, name = m
    if name == "[stack]":
        return "stack"
    anon = name in ("", "[heap]")
    where = "[heap]" if name == "[heap]" else ("anonymous" if anon else ("file data (rw-p)" if "w" in perms else None))
    if where is not None:
        if write and present:
            return f"{where}: copy-on-write of the template's page"
        if write:
            return f"{where}: new page (absent in the template)"
        return f"{where}: read of an absent page"
    if ifetch:
        return "file text: re-fault (instruction fetch)"
    return "file read (not an instruction fetch): re-fault"


def faults_pass(url, zpid, n):
    maps = read_maps(zpid)
    path = record(["-e", "exceptions:page_fault_user", "-p", str(zpid)], lambda: requests(url, n))
    out = subprocess.run(["perf", "script", "-i", path, "-F", "pid,trace"],
                         capture_output=True, text=True, check=True).stdout
    os.unlink(path)
    kinds, regions, children = Counter(), Counter(), set()
    zygote_faults = 0
    for line in out.splitlines():
        m = FAULT.match(line)
        if not m:
            continue
        pid = int(m.group(1))
        addr, code = int(m.group(2), 16), int(m.group(4), 16)
        if pid == zpid:
            zygote_faults += 1
            continue
        children.add(pid)
        where = mapping_of(maps, addr)
        kinds[fault_kind(where, bool(code & 2), bool(code & 1), bool(code & 0x10))] += 1
        if where is not None:
            start, end, perms, name = where
            label = os.path.basename(name) if name.startswith("/") else (name or "anonymous")
            regions[f"{label} {perms} {(end - start) // 1024} KiB"] += 1
    return {"children": len(children), "zygote_faults": zygote_faults, "kinds": kinds, "regions": regions}


def cpu_pass(url, zpid, n, freq):
    path = record(["-a", "-g", "-F", str(freq), "-e", "cpu-clock", "-e", "sched:sched_process_fork"],
                  lambda: requests(url, n))
    out = subprocess.run(["perf", "script", "-i", path, "-F", "pid,event,trace,ip,sym"],
                         capture_output=True, text=True).stdout
    os.unlink(path)
    kids = set()
    fork_rx = re.compile(r"\bpid=(\d+) child_comm=.*? child_pid=(\d+)")
    samples = []
    for block in out.split("\n\n"):
        lines = block.strip().splitlines()
        if not lines:
            continue
        head = lines[0].split()
        if not head or not head[0].isdigit():
            continue
        pid = int(head[0])
        if "sched:sched_process_fork" in lines[0]:
            m = fork_rx.search(lines[0])
            if m and int(m.group(1)) == zpid:
                kids.add(int(m.group(2)))
            continue
        syms = [l.split()[1] if len(l.split()) > 1 else "?" for l in lines[1:]]
        samples.append((pid, syms))
    per_ms = 1000.0 / freq
    table = {"program G": Counter(), "fork-server": Counter()}
    for pid, syms in samples:
        role = "fork-server" if pid == zpid else ("program G" if pid in kids else None)
        if role is None:
            continue
        table[role]["all"] += 1
        for part, outer, inner in CPU_PARTS:
            if outer in syms:
                table[role][part] += 1
                i = syms.index(outer)
                below = set(syms[:i])
                for fn in inner:
                    if fn in below:
                        table[role][f"{part} · {fn}"] += 1
                break
    runs = max(len(kids), 1)
    return {"children": len(kids),
            "ms": {role: {k: v * per_ms / runs for k, v in c.items()} for role, c in table.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--server-pid", type=int, required=True)
    ap.add_argument("--zygote-pid", type=int)
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--freq", type=int, default=4000)
    ap.add_argument("--json")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (perf on every CPU, /proc of the fork-server)")
    zpid = a.zygote_pid or fork_server(a.server_pid)
    requests(a.url, WARMUP)
    faults = faults_pass(a.url, zpid, a.n)
    requests(a.url, WARMUP)
    cpu = cpu_pass(a.url, zpid, a.n, a.freq)
    kids = max(faults["children"], 1)
    print(f"fork-server {zpid}; {faults['children']} programs in the fault pass, {cpu['children']} in the cpu pass\n")
    print("| page faults per program G, by kind | per run |\n|---|---:|")
    for kind, c in sorted(faults["kinds"].items(), key=lambda kv: -kv[1]):
        print(f"| {kind} | {c / kids:.1f} |")
    print(f"| **all** | **{sum(faults['kinds'].values()) / kids:.1f}** |")
    print(f"| (the fork-server's own faults per fork) | {faults['zygote_faults'] / kids:.1f} |")
    print("\n| page faults per program G, by the template's mapping | per run |\n|---|---:|")
    for region, c in faults["regions"].most_common(15):
        print(f"| {region} | {c / kids:.1f} |")
    print("\n| ms of CPU per run (cpu-clock samples) | program G | fork-server |\n|---|---:|---:|")
    g, z = cpu["ms"]["program G"], cpu["ms"]["fork-server"]
    for key in ["all"] + [k for part, _, inner in CPU_PARTS for k in [part] + [f"{part} · {fn}" for fn in inner]]:
        if g.get(key, 0) >= 0.005 or z.get(key, 0) >= 0.005:
            print(f"| {key} | {g.get(key, 0):.2f} | {z.get(key, 0):.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"zygote_pid": zpid, "n": a.n, "faults": {
                "children": faults["children"], "zygote_faults": faults["zygote_faults"],
                "kinds": dict(faults["kinds"]), "regions": dict(faults["regions"])}, "cpu": cpu}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
