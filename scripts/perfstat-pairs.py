#!/usr/bin/env python3
"""perfstat-pairs.py URL SERVER_PID [N]: send N scenario-D pairs (floor.py's upload + exec of
a program summing the uploaded file, every answer checked) to a running Kiln server, after 20
unrecorded ones, and print what `perf stat -p SERVER_PID` counted per pair: the server's CPU
(task-clock, ms), context switches, system calls, pread64 and futex calls, page faults.

Counts of system calls and context switches do not move with the machine's other load; the
CPU does (BENCHMARKS.md, "The server's system calls per scenario-D pair")."""
import importlib.util
import os
import signal
import subprocess
import sys
import time

spec = importlib.util.spec_from_file_location(
    "floor", os.path.join(os.path.dirname(os.path.abspath(__file__)), "floor.py"))
floor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(floor)

EVENTS = ("task-clock,context-switches,raw_syscalls:sys_enter,syscalls:sys_enter_pread64,"
          "syscalls:sys_enter_futex,page-faults")


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    url, pid = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 300
    for i in range(20):
        floor.exec_file(url, "perfstat", *floor.upload(url, "perfstat", 10_000 + i))
    out = f"/tmp/perfstat-pairs-{os.getpid()}.txt"
    perf = subprocess.Popen(["perf", "stat", "-x,", "-o", out, "-e", EVENTS, "-p", pid])
    time.sleep(0.5)
    for i in range(n):
        floor.exec_file(url, "perfstat", *floor.upload(url, "perfstat", i))
    perf.send_signal(signal.SIGINT)
    perf.wait()
    counted = {}
    with open(out) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) > 3 and parts[0][:1].isdigit():
                counted[parts[2]] = float(parts[0])
    os.unlink(out)
    print(" ".join(f"{k}={v / n:,.2f}" for k, v in counted.items()))


if __name__ == "__main__":
    main()
