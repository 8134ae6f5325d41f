#!/usr/bin/env python3
"""CPU of a fork-server's programs G by phase and system call, from a perf recording.

Record the fork-server (inherited by every fork it makes) while requests run, then:

    perf record -g -e cpu-clock -F 10000 -p ZYGOTE_PID -o g.data -- sleep 14
    perf script -i g.data -F pid,comm,ip,sym,dso > g.txt
    scripts/gphases.py g.txt ZYGOTE_PID [--freq 10000]

Each sample is the fork-server's own (FS), a fork's before its go (G-pre: the comm is
still the fork-server's, `exe`) or after it (G-run: `set_exec_identity` named it
`python3`), and is put under the system call on its kernel stack (the frame below
`do_syscall_64`), a page fault, or the user-space library it ran in. The figures are
ms of CPU per fork seen. A fork's last work in its exit (`exit_mmap`) is not sampled
by an inherited event: take the exit from `floor.py request`.
"""
import argparse
import collections
import re

HEADER = re.compile(r"^(\S+)\s+(\d+)\s*$")
FRAME = re.compile(r"^\s+[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$")
PREFIXES = ("__x64_sys_", "__do_sys_", "__se_sys_", "ksys_", "do_sys_")


def samples(path):
    cur = None
    for line in open(path):
        if not line.strip():
            if cur:
                yield cur
            cur = None
            continue
        m = HEADER.match(line)
        if m and not line[0].isspace():
            cur = (m.group(1), m.group(2), [])
            continue
        m = FRAME.match(line)
        if m and cur:
            cur[2].append((m.group(1), m.group(2).split("/")[-1]))
    if cur:
        yield cur


def part(frames):
    if not frames:
        return "?"
    if frames[0][1] != "[kernel.kallsyms]":
        return "user " + frames[0][1]
    syms = [s for s, _ in frames]
    if "exc_page_fault" in syms or "asm_exc_page_fault" in syms:
        return "page fault"
    if "do_syscall_64" in syms:
        j = syms.index("do_syscall_64") - 1
        while j > 0 and syms[j] == "x64_sys_call":
            j -= 1
        name = syms[j] if j >= 0 else "?"
        for p in PREFIXES:
            if name.startswith(p):
                name = name[len(p):]
        return "sys " + name
    return "kernel other"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("perf_script")
    ap.add_argument("zygote_pid")
    ap.add_argument("--freq", type=float, default=10000.0)
    a = ap.parse_args()
    per_ms = a.freq / 1000.0
    forks, by, total = set(), collections.Counter(), collections.Counter()
    for comm, pid, frames in samples(a.perf_script):
        role = "FS" if pid == a.zygote_pid else ("G-pre" if comm == "exe" else "G-run")
        if role != "FS":
            forks.add(pid)
        by[(role, part(frames))] += 1
        total[role] += 1
    n = max(1, len(forks))
    print(f"forks seen: {len(forks)}")
    for role in ("FS", "G-pre", "G-run"):
        print(f"== {role}: {total[role] / per_ms / n:.3f} ms per fork")
        for (r, p), k in sorted(by.items(), key=lambda kv: -kv[1]):
            if r == role and k / per_ms / n >= 0.004:
                print(f"   {k / per_ms / n:.3f} {p}")


if __name__ == "__main__":
    main()
