#!/usr/bin/env python3
"""Does collapsing a data template's anonymous memory into transparent huge pages make
its forks cheaper? (issue 28; BENCHMARKS.md, "A kernel create at 1,000 idle kernels").

A stand-in of the `py-data` fork-server: imports numpy, pandas and matplotlib (Agg),
gc.collect() + gc.freeze(), then with MODE `thp` asks MADV_COLLAPSE of every 2 MiB-aligned
stretch of its private writable anonymous mappings (the brk heap and the unnamed mmaps; the
kernel's own THP setting may stay `madvise`: MADV_COLLAPSE does not need it and sets no
VM_HUGEPAGE, so khugepaged leaves the children alone). MODE `base` does not. Then forks N
children one at a time; each evaluates a small pandas snippet (a kernel's start and first
evaluation, roughly), reports its private memory (smaps_rollup Private_Clean + Private_Dirty)
and VmPTE, and leaves with os._exit. Prints fork() wall p50 / p90, the children's CPU
(RUSAGE_CHILDREN, exit included) and the parent's CPU per fork (RUSAGE_SELF: the fork's
page-table copy), per child.

Run it with the runtime image's interpreter and a /proc of its own, e.g.
  R=/var/lib/kiln/runtimes/recipe-…/rootfs; cp scripts/thp-fork-probe.py $R/tmp/
  unshare -m sh -c "mount -t proc proc $R/proc && chroot $R /usr/bin/python3 -W ignore /tmp/thp-fork-probe.py base 200"
(`unshare -m` keeps that proc mount private to the command: nothing is left mounted.)
"""
import ctypes
import gc
import os
import resource
import sys
import time

import matplotlib
import numpy  # noqa: F401
import pandas  # noqa: F401

matplotlib.use("Agg")
import matplotlib.pyplot  # noqa: E402,F401

gc.collect()
gc.freeze()
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_COLLAPSE = 25
HUGE = 2 << 20


def collapse():
    """(huge pages made, stretches refused)"""
    made = refused = 0
    for line in open("/proc/self/maps"):
        f = line.split()
        if f[1] != "rw-p" or (len(f) > 5 and f[5] != "[heap]"):
            continue
        a, b = (int(x, 16) for x in f[0].split("-"))
        s, e = (a + HUGE - 1) & ~(HUGE - 1), b & ~(HUGE - 1)
        if e - s >= HUGE:
            if libc.madvise(s, e - s, MADV_COLLAPSE) == 0:
                made += (e - s) // HUGE
            else:
                refused += 1
    return made, refused


def status():
    return {k: v.strip() for k, _, v in (l.partition(":") for l in open("/proc/self/status"))
            if k in ("VmPTE", "RssAnon")}


mode, n = sys.argv[1], int(sys.argv[2])
if mode == "thp":
    t = time.perf_counter()
    made, refused = collapse()
    print(f"collapsed {made} huge pages ({refused} stretches refused) in {(time.perf_counter() - t) * 1e3:.0f} ms",
          file=sys.stderr)
print(mode, "template", status(), file=sys.stderr)
forks, reports = [], []
c0, s0 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
for _ in range(n):
    rd, wr = os.pipe()
    t = time.perf_counter_ns()
    pid = os.fork()
    if pid == 0:
        os.close(rd)
        g = {}
        exec(compile("x=[i*i for i in range(1000)]\nimport pandas as pd\ndf=pd.DataFrame({'a':x})\ny=df.a.sum()",
                     "<c>", "exec"), g)
        priv = sum(int(l.split()[1]) for l in open("/proc/self/smaps_rollup")
                   if l.startswith(("Private_Dirty", "Private_Clean")))
        pte = status()["VmPTE"].split()[0]
        os.write(wr, f"{priv} {pte}".encode())
        os._exit(0)
    forks.append(time.perf_counter_ns() - t)
    os.close(wr)
    reports.append(os.read(rd, 100).decode())
    os.close(rd)
    os.waitpid(pid, 0)
c1, s1 = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
forks.sort()
child = ((c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)) / n * 1e3
child_sys = (c1.ru_stime - c0.ru_stime) / n * 1e3
parent = ((s1.ru_utime - s0.ru_utime) + (s1.ru_stime - s0.ru_stime)) / n * 1e3
priv = sorted(int(r.split()[0]) for r in reports)
pte = sorted(int(r.split()[1]) for r in reports)
print(f"{mode}: fork() p50 {forks[n // 2] / 1e6:.2f} ms p90 {forks[int(n * .9)] / 1e6:.2f}; "
      f"child CPU {child:.2f} ms (sys {child_sys:.2f}); parent CPU/fork {parent:.2f} ms; "
      f"child private p50 {priv[n // 2]} kB, VmPTE {pte[n // 2]} kB; load {open('/proc/loadavg').read().split()[0]}")
