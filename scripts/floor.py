#!/usr/bin/env python3
"""The floor table of a `py` request: where its CPU goes, by process and kernel part.

Two modes, each sampling every CPU with `perf record -a -g -e cpu-clock` and
attributing every sample to a *role* (which process of a request it ran in) and a
*part* (what the kernel stack says it was doing: creating or tearing down a
namespace, a cgroup, a fork, an exit, page faults, ...). CPU of processes that
belong to neither Kiln nor this tool (other load on the machine) is counted
apart and left out, so the table changes little when the machine is busy.

  floor.py request --url http://127.0.0.1:PORT --server-pid PID [-n 200] [--pause-ms 0] [--workload W]
      sends N `print('hello')` runs (or --workload W, as `server` has) to a running
      `kiln serve` (a new connection each, every answer checked) while recording;
      the table is ms of CPU per request (per pair for `pair`) by role x part.

  floor.py server --url http://127.0.0.1:PORT --server-pid PID [-n 200] [--workload W] [--history N]
      the server process alone (perf -p, DWARF stacks): its ms of CPU per request
      by the Kiln function a sample passes through (cgroups, staging, store, HTTP, ...).
      W: hello (default), upload (LibreChat's multipart `POST /v1/upload` of one
      small file), exec-file (an exec reading one file, uploaded before the
      recording), pair (upload + exec: one pair of kiln-bench's scenario D).
      --history N: N uploads by the same user first (a store with history).

  floor.py wakeups --url URL --server-pid PID [--pause-ms 50] [--workload W]   (or --bare --image-root ROOT)
      thread wake-ups per request that touch its processes, waker -> wakee, and
      how many cross CPUs (an IPI each; a vCPU woken from halt on an idle VM).

  floor.py perfstat --url URL --server-pid PID [-n 300] [--warmup 20] [--workload W (pair)]
      what `perf stat -p` counts in the server per request (per pair for `pair`):
      its CPU, context switches, system calls, pread64 and futex calls, page faults.

  floor.py alone --image-root ROOT [-n 300]
      each part measured alone in a loop under the same recording: a fork +
      `_exit` of a preloaded python3 of the image (in a chroot of it), a plain
      process hop, `unshare` of each namespace (net, mnt, pid, user, ipc, uts,
      and all six as one jail's clone3 does), a jail's four v1 cgroups made and
      removed. Run it under `nsenter -t <server pid> -m` to give the mount
      namespace the server's mount table.

Needs root and perf. Prints a markdown table; `--json FILE` writes the numbers.
"""

import argparse
import ctypes
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

# What a kernel stack was doing, by the first marker found walking from the
# outermost frame inwards (so a namespace made inside clone3 is "netns create",
# not "fork"; a mount namespace torn down inside exit is "mntns teardown").
PARTS = [
    ("netns create", ("copy_net_ns",)),
    ("netns teardown (cleanup_net)", ("cleanup_net", "net_cleanup_work")),
    ("userns create", ("create_user_ns",)),
    ("userns teardown", ("free_user_ns",)),
    ("mntns create", ("copy_mnt_ns",)),
    ("mntns teardown", ("put_mnt_ns", "drop_collected_mounts", "umount_tree")),
    ("pidns create", ("copy_pid_ns", "create_pid_namespace")),
    ("pidns teardown", ("zap_pid_ns_processes", "delayed_free_pidns", "put_pid_ns")),
    ("ipcns create", ("copy_ipcs",)),
    ("ipcns teardown", ("free_ipc", "put_ipc_ns", "free_ipcs")),
    ("utsns create", ("copy_utsname",)),
    ("setns", ("__x64_sys_setns",)),
    ("mounts (mount, pivot_root, umount)", (
        "__x64_sys_mount", "__x64_sys_pivot_root", "__x64_sys_umount",
        "__x64_sys_move_mount", "__x64_sys_open_tree", "__x64_sys_fsmount",
        "__x64_sys_mount_setattr", "__x64_sys_fsconfig", "__x64_sys_fsopen")),
    ("cgroup mkdir", ("cgroup_mkdir",)),
    ("cgroup rmdir", ("cgroup_rmdir",)),
    ("cgroup deferred release", (
        "css_free_rwork_fn", "css_killed_work_fn", "css_release_work_fn",
        "cgroup_release_agent")),
    ("cgroup attach and files", ("cgroup_file_write", "cgroup_attach_task", "cgroup_procs_write")),
    ("fork (clone)", ("kernel_clone", "copy_process")),
    ("exit", ("do_exit", "do_group_exit", "release_task")),
    ("execve", ("do_execveat_common", "bprm_execve")),
    ("page faults", ("asm_exc_page_fault", "exc_page_fault", "handle_mm_fault")),
    ("wait and reap", ("kernel_waitid", "do_wait", "__x64_sys_wait4")),
    ("landlock and seccomp set-up", ("__x64_sys_landlock", "__x64_sys_seccomp", "prctl_set_seccomp")),
    ("rcu and softirq", ("rcu_core", "rcu_do_batch", "handle_softirqs", "__do_softirq")),
    ("file and pipe io", (
        "ksys_read", "ksys_write", "vfs_read", "vfs_write", "__x64_sys_sendmsg",
        "__x64_sys_recvmsg", "do_sys_openat2", "__x64_sys_close", "do_epoll_wait",
        "__x64_sys_sendto", "__x64_sys_recvfrom", "__sys_sendmsg", "__sys_recvmsg")),
    ("tcp (loopback http)", ("tcp_", "inet_", "__sys_connect", "__sys_accept")),
    ("scheduler (switches, wake-ups)", ("schedule", "try_to_wake_up", "__schedule")),
]

KERNEL_WORKER_PREFIXES = ("kworker", "ksoftirqd", "rcu_", "migration", "kcompactd", "khugepaged")


def classify_stack(frames):
    """frames: (address, symbol), innermost first, as perf prints them."""
    if not frames or not frames[0][0].startswith("ffff"):
        return "user space"
    syms = [sym for _, sym in reversed(frames)]  # outermost first
    for name, markers in PARTS:
        for f in syms:
            if any(f == m or (m.endswith("_") and f.startswith(m)) for m in markers):
                return name
    for f in syms:
        if f.startswith(("__x64_sys_", "__do_sys_")):
            return "sys " + f.split("sys_", 1)[1]
    if "do_syscall_64" in syms:
        return "other syscalls"
    return "kernel other (interrupts, ...)"


def parse_perf(data_path):
    """Yields ('fork', child, parent) / ('comm', pid, comm) / ('sample', pid, tid, comm, frames)."""
    proc = subprocess.Popen(
        ["perf", "script", "-i", data_path, "--show-task-events",
         "-F", "comm,pid,tid,event,ip,sym"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, errors="replace")
    head = None
    frames = []
    for line in proc.stdout:
        line = line.rstrip("\n")
        if "PERF_RECORD_FORK(" in line:
            # comm pid/tid ts: PERF_RECORD_FORK(child:ctid):(parent:ptid)
            rest = line.split("PERF_RECORD_FORK(", 1)[1]
            child = int(rest.split(":", 1)[0])
            parent = int(rest.split("):(", 1)[1].split(":", 1)[0])
            yield ("fork", child, parent)
            continue
        if "PERF_RECORD_" in line:
            continue
        if not line.strip():
            if head is not None:
                yield ("sample",) + head + (frames,)
            head, frames = None, []
            continue
        if head is None and not line.startswith(("\t", " ")):
            # "comm pid/tid  cpu-clock:"  (comm may contain spaces)
            before = line.split(" cpu-clock", 1)[0].rstrip().rstrip(":")
            parts = before.rsplit(None, 1)
            if len(parts) != 2 or "/" not in parts[1]:
                continue
            comm = parts[0].strip()
            pid_s, tid_s = parts[1].split("/", 1)
            head = (int(pid_s), int(tid_s), comm)
            continue
        bits = line.strip().split(None, 1)
        frames.append((bits[0], bits[1] if len(bits) == 2 else "[unknown]"))
    if head is not None:
        yield ("sample",) + head + (frames,)
    proc.wait()


class Roles:
    """Which process of a request (or of this tool) a pid is, from fork events."""

    def __init__(self, known):
        self.role = dict(known)  # pid -> role
        self.parent = {}

    def fork(self, child, parent):
        self.parent[child] = parent
        if child == parent or child in self.role:
            return
        prole = self.role.get(parent)
        if prole is None:
            return
        self.role[child] = CHILD_ROLE.get(prole, prole)

    def of(self, pid, comm):
        r = self.role.get(pid)
        if r is not None:
            return r
        if pid == 0:
            return "idle"
        if comm.startswith(KERNEL_WORKER_PREFIXES):
            return "kernel workers"
        return "other load"


# a fork of a role's process takes this role (threads keep their pid's role)
CHILD_ROLE = {
    "server": "server (forks)",
    "launcher": "jail init C",  # the launcher clones each jail's init itself
    "jail helper H": "jail init C",
    "jail init C": "jail init C",
    "fork-server": "program G (fork of the template)",
    "program G (fork of the template)": "program G (fork of the template)",
    "tool": "tool children",
    "tool children": "tool children",
}


def record(cmd_fn, freq):
    """Runs cmd_fn() while perf records every CPU; returns the perf.data path."""
    fd, path = tempfile.mkstemp(prefix="floor-", suffix=".data")
    os.close(fd)
    perf = subprocess.Popen(
        ["perf", "record", "-a", "-g", "-e", "cpu-clock", "-F", str(freq), "-o", path, "--", "sleep", "3600"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)  # perf has synthesized the running processes
    try:
        result = cmd_fn()
    finally:
        time.sleep(0.5)  # deferred work (cleanup_net, css release) lands
        perf.send_signal(signal.SIGINT)
        perf.wait()
    return path, result


def tabulate(path, known, freq, also=None):
    """ms of CPU by role x part; also(role, comm, frames, ms), when given, sees every sample."""
    roles = Roles(known)
    ms = defaultdict(lambda: defaultdict(float))
    per_sample = 1000.0 / freq
    for ev in parse_perf(path):
        if ev[0] == "fork":
            roles.fork(ev[1], ev[2])
            continue
        _, pid, _tid, comm, frames = ev
        role = roles.of(pid, comm)
        if role == "idle":
            continue
        ms[role][classify_stack(frames)] += per_sample
        if also is not None:
            also(role, comm, frames, per_sample)
    os.unlink(path)
    return ms


def print_table(ms, count, title, skip=("other load", "client (this tool)")):
    roles = [r for r in sorted(ms, key=lambda r: -sum(ms[r].values())) if r not in skip]
    print(f"\n### {title}: ms of CPU per {count['what']} (n = {count['n']})\n")
    total_all = 0.0
    for role in roles:
        tot = sum(ms[role].values()) / count["n"]
        total_all += tot
        parts = sorted(ms[role].items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{p} {v / count['n']:.2f}" for p, v in parts if v / count["n"] >= 0.02)
        print(f"| {role} | {tot:.2f} | {shown} |")
    print(f"| **total** | **{total_all:.2f}** | |")
    for r in skip:
        if r in ms:
            print(f"\n(left out: {r} {sum(ms[r].values()) / count['n']:.2f} ms per {count['what']})")


def server_known(server_pid, client_pid):
    """The roles of the processes that already run when the recording starts: the
    server's children by their argv, and every deeper descendant (a kept jail's init C
    the launcher cloned before the recording, a parked program G) by its parent's role."""
    known = {server_pid: "server", client_pid: "client (this tool)"}
    parent, argv_of = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv_of[int(entry)] = f.read().split(b"\0")
        except OSError:
            continue
    for pid, ppid in parent.items():
        if ppid != server_pid:
            continue
        if b"__launcher" in argv_of[pid]:
            known[pid] = "launcher"
        elif b"__zygote" in argv_of[pid]:
            known[pid] = "fork-server"
        else:
            known[pid] = "server (forks)"
    grew = True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if pid not in known and ppid in known and ppid != client_pid:
                known[pid] = CHILD_ROLE.get(known[ppid], known[ppid])
                grew = True
    return known


def threads_of(known):
    """tid -> pid of the threads the known processes already have (a wake-up's
    trace names its wakee by tid; threads made later arrive as fork events)."""
    tids = {}
    for pid in known:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                tids[int(tid)] = pid
        except OSError:
            continue
    return tids


def hello(url, user):
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    body = json.dumps({"lang": "py", "code": "print('hello')"})
    conn.request("POST", "/v1/exec", body, {"content-type": "application/json", "User-Id": user})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    conn.close()
    if resp.status != 200 or data.get("stdout") != "hello\n":
        raise SystemExit(f"unverified answer: {resp.status} {data}")


def post(url, path, body, headers):
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", path, body, headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    try:
        return resp.status, json.loads(data)
    except ValueError:
        return resp.status, data


def upload(url, user, seq):
    """LibreChat's `POST /v1/upload` of one small file (as kiln-bench's scenario D:
    ten numbers, `kind=user`, `id=<user>`); returns (file ref, the expected sum)."""
    numbers = [(seq * 7919 + i * 104729) % 1_000_000_000 for i in range(10)]
    content = "".join(f"{n}\n" for n in numbers).encode()
    boundary = f"floor{seq:08d}{os.getpid()}"
    parts = []
    for name, value in (("kind", "user"), ("id", user)):
        parts.append(f'--{boundary}\r\ncontent-disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    parts.append(f'--{boundary}\r\ncontent-disposition: form-data; name="file"; filename="numbers.txt"\r\n'
                 f'content-type: text/plain\r\n\r\n'.encode() + content + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    status, data = post(url, "/v1/upload", b"".join(parts),
                        {"content-type": f"multipart/form-data; boundary={boundary}", "User-Id": user})
    if status != 200 or not isinstance(data, dict) or data.get("message") != "success":
        raise SystemExit(f"unverified upload: {status} {data}")
    ref = {"id": data["files"][0]["fileId"], "storage_session_id": data["storage_session_id"],
           "name": "numbers.txt", "kind": "user", "resource_id": user}
    return ref, sum(numbers)


SUM_SCRIPT = "print(sum(int(line) for line in open('numbers.txt') if line.strip()))"


def exec_file(url, user, ref, expected):
    """`POST /v1/exec` of scenario D's program over one uploaded file, checked."""
    body = json.dumps({"lang": "py", "code": SUM_SCRIPT, "files": [ref], "user_id": user})
    status, data = post(url, "/v1/exec", body, {"content-type": "application/json", "User-Id": user})
    if status != 200 or not isinstance(data, dict) or data.get("stdout", "").strip() != str(expected):
        raise SystemExit(f"unverified answer: {status} {data}")


def workload(a):
    """The request(s) `server` and `wakeups` time: returns (prepare, one), where
    prepare() runs before the recording (exec-file uploads its files there) and
    one(i) sends request i."""
    user = "floor"
    history = getattr(a, "history", 0)
    if history:
        # the user's earlier uploads (a store with history: a quota check that
        # sums every object of the owner grows with them)
        for i in range(history):
            upload(a.url, user, -1 - i)
    if a.workload == "hello":
        return (lambda: None), (lambda i: hello(a.url, user))
    if a.workload == "upload":
        return (lambda: None), (lambda i: upload(a.url, user, i))
    if a.workload == "pair":
        return (lambda: None), (lambda i: exec_file(a.url, user, *upload(a.url, user, i)))
    refs = []

    def prepare():
        refs.extend(upload(a.url, user, i) for i in range(a.n))
    return prepare, (lambda i: exec_file(a.url, user, *refs[i]))


def cmd_request(a):
    for _ in range(a.warmup):
        hello(a.url, "floor")
    known = server_known(a.server_pid, os.getpid())
    if not any(r == "launcher" for r in known.values()):
        raise SystemExit("no jail launcher among the server's children")
    prepare, one = workload(a)
    prepare()

    def loop():
        t0 = time.monotonic()
        walls = []
        for i in range(a.n):
            s = time.monotonic()
            one(i)
            walls.append((time.monotonic() - s) * 1000)
            if a.pause_ms:
                time.sleep(a.pause_ms / 1000)
        return time.monotonic() - t0, sorted(walls)

    path, (elapsed, walls) = record(loop, a.freq)
    ms = tabulate(path, known, a.freq)
    print(f"{a.n} requests in {elapsed:.1f} s, pause {a.pause_ms} ms, wall p50 {walls[len(walls) // 2]:.1f} ms")
    what = "pair" if a.workload == "pair" else "request"
    print_table(ms, {"what": what, "n": a.n}, f"A {a.workload} {what}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"n": a.n, "workload": a.workload, "pause_ms": a.pause_ms, "ms": ms, "walls": walls},
                      f, indent=1)


# What the server's own CPU does, by the Kiln function a DWARF-unwound stack passes
# through (first match wins).
SERVER_PARTS = [
    ("cgroups: create (mkdir, limits)", "CgroupDriver::create_run"),
    ("cgroups: a slot's kept set lent (limits)", "SlotGroups::take"),
    ("cgroups: wait empty, read, remove", "RunCgroups::finish"),
    ("cgroups: a slot's kept set reset (or made)", "SlotGroups::recycle"),
    ("workspace: empty and free the slot", "empty_then_free"),
    ("warm pool: refill (server side of a park)", "refill_loop"),
    ("warm pool: take a parked jail", "Jails>::acquire"),
    ("staging", "pipeline::stage"),
    ("harvest", "pipeline::harvest"),
    ("store (SQLite)", "sqlx"),
    ("store: blob write and copy (object_store; fsync, rename)", "object_store"),
    ("store: the rest", "kiln_store"),
    ("upload: multipart parsing", "multer"),
    ("upload: the handler", "codeapi::upload"),
    ("run: go, output, outcome", "Jail>::run"),
    ("pipeline: the rest", "kiln_exec::pipeline"),
    ("run registry", "kiln_exec::runs"),
    ("HTTP (hyper, axum, JSON)", "hyper"),
    ("HTTP (hyper, axum, JSON)", "axum"),
    ("tokio: scheduling, parking, wake-ups", "tokio::runtime"),
]


def cmd_server(a):
    """The server process alone, with DWARF stacks (its Rust frames need them)."""
    for _ in range(a.warmup):
        hello(a.url, "floor")
    prepare, one = workload(a)
    prepare()
    fd, path = tempfile.mkstemp(prefix="floor-server-", suffix=".data")
    os.close(fd)
    perf = subprocess.Popen(
        ["perf", "record", "-p", str(a.server_pid), "--call-graph", "dwarf,16384",
         "-e", "cpu-clock", "-F", str(a.freq), "-o", path],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(4)  # perf has attached to every thread (a short workload would finish first)
    for i in range(a.n):
        one(i)
    perf.send_signal(signal.SIGINT)
    perf.wait()
    out = subprocess.run(["perf", "script", "-i", path, "-F", "comm,tid,ip,sym"],
                         capture_output=True, text=True, errors="replace").stdout
    os.unlink(path)
    counts = defaultdict(int)
    for sample in out.split("\n\n"):
        if not sample.strip():
            continue
        name = next((n for n, marker in SERVER_PARTS if marker in sample), "other")
        counts[name] += 1
    per = 1000.0 / a.freq / a.n
    print(f"\n### The server process: ms of CPU per {a.workload} request (n = {a.n}; DWARF stacks)\n")
    print("| Part | CPU ms |")
    print("|---|---:|")
    for name, c in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {c * per:.2f} |")
    print(f"| **total** | **{sum(counts.values()) * per:.2f}** |")


def cmd_wakeups(a):
    """Thread wake-ups per request (sched_wakeup on every CPU) that touch a request's
    processes, by waker -> wakee role, and how many cross to another CPU: each of those
    is an inter-processor interrupt, and on an idle VM a vCPU woken from halt."""
    image = a.image_root
    if a.bare:
        known = {os.getpid(): "tool"}
        env = {"PATH": "/usr/bin:/bin"}

        def one():
            subprocess.run([CHROOT, image, "/usr/bin/python3", "-c", "print('hello')"],
                           env=env, stdout=subprocess.DEVNULL, check=True)
    else:
        for _ in range(a.warmup):
            hello(a.url, "floor")
        known = server_known(a.server_pid, os.getpid())
        prepare, request = workload(a)
        prepare()
        sent = iter(range(a.n))

        def one():
            request(next(sent))
    fd, path = tempfile.mkstemp(prefix="floor-wake-", suffix=".data")
    os.close(fd)
    perf = subprocess.Popen(
        ["perf", "record", "-a", "-e", "sched:sched_wakeup", "-e", "sched:sched_wakeup_new", "-o", path],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    for _ in range(a.n):
        one()
        time.sleep(a.pause_ms / 1000)
    time.sleep(0.3)
    perf.send_signal(signal.SIGINT)
    perf.wait()
    out = subprocess.run(["perf", "script", "-i", path, "--show-task-events", "-F", "comm,pid,tid,cpu,event,trace"],
                         capture_output=True, text=True, errors="replace").stdout
    os.unlink(path)
    roles, tid_pid = Roles(known), threads_of(known)
    pairs, total, cross = defaultdict(int), 0, 0
    outside = ("other load", "idle", "kernel workers")
    for line in out.splitlines():
        if "PERF_RECORD_FORK(" in line:
            rest = line.split("PERF_RECORD_FORK(", 1)[1]
            child, parent = rest.split("):(", 1)
            cpid, ctid = map(int, child.split(":"))
            ppid = int(parent.split(":", 1)[0])
            tid_pid[ctid] = cpid
            roles.fork(cpid, ppid)
            continue
        if "sched:sched_wakeup" not in line:
            continue
        head, trace = line.split("sched:sched_wakeup", 1)
        fields = head.split()
        cpu = int(fields[-1].strip("[]:"))
        pid = int(fields[-2].split("/", 1)[0])
        wakee_tid = int(trace.split(" pid=", 1)[1].split()[0])
        target = int(trace.split("target_cpu=", 1)[1].split()[0])
        waker = roles.of(pid, fields[0])
        wakee = roles.of(tid_pid.get(wakee_tid, wakee_tid), "")
        if waker in outside and wakee in outside:
            continue
        total += 1
        cross += cpu != target
        pairs[f"{waker} -> {wakee}"] += 1
    print(f"{total / a.n:.1f} wake-ups per {'spawn' if a.bare else 'request'}, "
          f"{cross / a.n:.1f} of them to another CPU (pause {a.pause_ms} ms, n = {a.n})")
    for pair, count in sorted(pairs.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {pair}: {count / a.n:.2f}")


# ---------------------------------------------------------------- alone

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
NAMESPACES = [
    ("net", CLONE_NEWNET), ("mnt", CLONE_NEWNS), ("pid", CLONE_NEWPID),
    ("user", CLONE_NEWUSER), ("ipc", CLONE_NEWIPC), ("uts", CLONE_NEWUTS),
    ("all six (one jail's clone3)", CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWUSER | CLONE_NEWIPC | CLONE_NEWUTS),
]

# The image's python3 preloads what the lean template holds, forks n children
# that print('hello') to /dev/null and leave with os._exit, as a warm run's
# program does.
PRELOADED_FORKS = r"""
import os, sys, io, json, re, math, collections, itertools, functools, datetime, random, string, textwrap
import gc; gc.freeze()
n = int(sys.argv[1])
null = os.open('/dev/null', os.O_WRONLY)
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os.dup2(null, 1)
        print('hello', flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
"""


# The same, but each child runs Kiln's warm template as a warm run's program does
# (`_kiln_zygote.run`: argv, env, __main__, the script, the CPython-like
# shutdown), without a jail: the template's own share of the program G.
# It imports nothing beyond os and sys (which every interpreter has loaded at start), so
# that the children hold what the template holds, no more: the min template's too.
TEMPLATE_FORKS = r"""
import os, sys
src = sys.stdin.read()
n = int(sys.argv[1])
exec(compile(src, "<kiln-template>", "exec"), {"__name__": "__main__"})
import _kiln_zygote


def run_as_the_fork_server_does(go):
    # The fork-server enters the preload and run() the same way (PyRun_SimpleString), so
    # run()'s frames sit as deep as the preload's did; the preload above ran one frame
    # deeper than this loop (inside exec), so run() is called one frame deeper too.
    _kiln_zygote.run(go)


work = "/tmp/kiln-floor-%d" % os.getpid()
os.mkdir(work)
with open(os.path.join(work, "main.py"), "w") as f:
    f.write("print('hello')\n")


def q(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


go = ('{"argv": ["/usr/bin/python3", "-u", "main.py"], "env": [%s]}' % ", ".join(
    "[%s, %s]" % (q(k), q(v)) for k, v in os.environ.items())).encode()
null = os.open('/dev/null', os.O_WRONLY)
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os.chdir(work)
        os.dup2(null, 1)
        if sys.argv[2] == "bare":
            print('hello', flush=True)
            os._exit(0)
        run_as_the_fork_server_does(go)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise SystemExit("the template's run failed: %d" % status)
os.unlink(os.path.join(work, "main.py"))
os.rmdir(work)
"""


CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


def lean_template(stdlib=True):
    """What the lean fork-server preloads: the plot hook, no data stack, the template
    (stdlib False: the min one's, without the common stdlib set either)."""
    here = os.path.dirname(os.path.abspath(__file__))
    warm = os.path.join(here, "..", "crates", "kiln-core", "src", "lang")
    with open(os.path.join(warm, "python", "kiln_plot.py")) as f:
        hook = f.read()
    with open(os.path.join(warm, "warm", "python_template.py")) as f:
        template = f.read()
    programs = ""
    if stdlib:  # the `py` kernel, compiled once by the templates kernels fork
        with open(os.path.join(warm, "warm", "python_kernel.py"), "rb") as f:
            programs = '"/etc/kiln/kiln_kernel.py": bytes.fromhex("%s")' % f.read().hex()
    return (
        f"{hook}\n_kiln_preload = ()\n_kiln_stdlib = {bool(stdlib)}\n"
        f"_kiln_programs = {{{programs}}}\n\n{template}"
    )


def forks_with(flags, n, libc):
    """n children, each unsharing `flags` and leaving; a pid namespace only
    comes to be with a first child in it, so the child forks once more."""
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            if flags and libc.unshare(flags) != 0:
                os._exit(3)
            if flags & CLONE_NEWPID:
                inner = os.fork()
                if inner == 0:
                    os._exit(0)
                os.waitpid(inner, 0)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise SystemExit(f"unshare({flags:#x}) failed in the child")


def cgroups_made_and_removed(n):
    base = "/sys/fs/cgroup"
    ctrls = ["memory", "pids", "cpu", "cpuacct"]
    parent = {c: os.path.join(base, c, f"floor-probe-{os.getpid()}") for c in ctrls}
    for p in parent.values():
        os.makedirs(p, exist_ok=True)
    for i in range(n):
        for c in ctrls:
            d = os.path.join(parent[c], str(i))
            os.mkdir(d)
            if c == "memory":
                with open(os.path.join(d, "memory.limit_in_bytes"), "w") as f:
                    f.write(str(512 << 20))
            elif c == "pids":
                with open(os.path.join(d, "pids.max"), "w") as f:
                    f.write("66")
            elif c == "cpu":
                with open(os.path.join(d, "cpu.cfs_quota_us"), "w") as f:
                    f.write("100000")
        for c in ctrls:
            os.rmdir(os.path.join(parent[c], str(i)))
    for p in parent.values():
        os.rmdir(p)


PERFSTAT_EVENTS = ("task-clock,context-switches,raw_syscalls:sys_enter,syscalls:sys_enter_pread64,"
                   "syscalls:sys_enter_futex,page-faults")


def cmd_perfstat(a):
    """What `perf stat -p` counts in the server process per request (per pair for `pair`): its
    CPU (task-clock, ms), context switches, system calls, pread64 and futex calls, page faults.
    The counts do not move with the machine's other load; the CPU does."""
    # the unrecorded requests are the workload's own first ones (exec-file's
    # files are all uploaded before either)
    prepare, one = workload(argparse.Namespace(**{**vars(a), "n": a.warmup + a.n}))
    prepare()
    for i in range(a.warmup):
        one(i)
    fd, path = tempfile.mkstemp(prefix="floor-stat-", suffix=".txt")
    os.close(fd)
    perf = subprocess.Popen(["perf", "stat", "-x,", "-o", path, "-e", PERFSTAT_EVENTS,
                             "-p", str(a.server_pid)])
    time.sleep(0.5)
    for i in range(a.warmup, a.warmup + a.n):
        one(i)
    perf.send_signal(signal.SIGINT)
    perf.wait()
    counted = {}
    with open(path) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) > 3 and parts[0][:1].isdigit():
                counted[parts[2]] = float(parts[0])
    os.unlink(path)
    print(" ".join(f"{k}={v / a.n:,.2f}" for k, v in counted.items()))


def cmd_alone(a):
    libc = ctypes.CDLL(None, use_errno=True)
    me = os.getpid()
    rows = []

    def measure(name, fn):
        if a.only and a.only not in name:
            return
        path, _ = record(fn, a.freq)
        ms = tabulate(path, {me: "tool"}, a.freq)
        mine = {r: v for r, v in ms.items() if r in ("tool", "tool children", "kernel workers")}
        total = sum(sum(v.values()) for v in mine.values()) / a.n
        parts = defaultdict(float)
        for v in mine.values():
            for p, x in v.items():
                parts[p] += x / a.n
        rows.append((name, total, dict(parts)))
        print(f"{name}: {total:.3f} ms per op", file=sys.stderr)

    py = os.path.join(a.image_root, "usr/bin/python3")
    if os.path.exists(py):
        measure(
            "fork + print + _exit of a preloaded python3 of the image",
            lambda: subprocess.run([CHROOT, a.image_root, "/usr/bin/python3", "-c", PRELOADED_FORKS, str(a.n)], check=True))
        env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "PYTHONUNBUFFERED": "1",
               "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"}
        measure(
            "fork + Kiln's template run of print('hello') + exit (no jail)",
            lambda: subprocess.run([CHROOT, a.image_root, "/usr/bin/python3", "-c", TEMPLATE_FORKS, str(a.n), "run"],
                                   input=lean_template(), text=True, env=env, check=True))
        measure(
            "fork + the min template's run of print('hello') + exit (no jail)",
            lambda: subprocess.run([CHROOT, a.image_root, "/usr/bin/python3", "-c", TEMPLATE_FORKS, str(a.n), "run"],
                                   input=lean_template(False), text=True, env=env, check=True))
        measure(
            "  (the min template's preload, once per loop, to subtract)",
            lambda: subprocess.run([CHROOT, a.image_root, "/usr/bin/python3", "-c", TEMPLATE_FORKS, "0", "run"],
                                   input=lean_template(False), text=True, env=env, check=True))
        measure(
            "fork + print + _exit of the same preloaded template (no run, no jail)",
            lambda: subprocess.run([CHROOT, a.image_root, "/usr/bin/python3", "-c", TEMPLATE_FORKS, str(a.n), "bare"],
                                   input=lean_template(), text=True, env=env, check=True))
        measure(
            "  (the template's preload, once per loop, to subtract)",
            lambda: subprocess.run([CHROOT, a.image_root, "/usr/bin/python3", "-c", TEMPLATE_FORKS, "0", "run"],
                                   input=lean_template(), text=True, env=env, check=True))
        measure(
            "bare spawn: chroot + the image's python3 -c print('hello') (vfork + exec, as the baselines)",
            lambda: [subprocess.run([CHROOT, a.image_root, "/usr/bin/python3", "-c", "print('hello')"],
                                    env=env, stdout=subprocess.DEVNULL, check=True) for _ in range(a.n)])
        # the interpreter's own start and imports, once, to subtract
        measure(
            "  (its start-up, once per loop, to subtract)",
            lambda: [subprocess.run([CHROOT, a.image_root, "/usr/bin/python3", "-c", PRELOADED_FORKS, "0"], check=True)
                     for _ in range(1)])
    measure("a process hop: fork + _exit of this tool (host python3)", lambda: forks_with(0, a.n, libc))
    for name, flags in NAMESPACES:
        measure(f"fork + unshare({name}) + _exit", lambda flags=flags: forks_with(flags, a.n, libc))
    measure("a jail's four v1 cgroups: mkdir + limits + rmdir", lambda: cgroups_made_and_removed(a.n))

    with open("/proc/self/mountinfo") as f:
        mounts = sum(1 for _ in f)
    print(f"\n### Each part alone: ms of CPU per operation (n = {a.n}; {mounts} mounts in this mount namespace)\n")
    print("| Operation | CPU ms | parts |")
    print("|---|---:|---|")
    for name, total, parts in rows:
        shown = ", ".join(f"{p} {v:.3f}" for p, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= 0.005)
        print(f"| {name} | {total:.3f} | {shown} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"n": a.n, "mounts": mounts, "rows": rows}, f, indent=1)


WORKLOADS = ("hello", "upload", "exec-file", "pair")
WORKLOAD_HELP = ("hello: `print('hello')`; upload: `POST /v1/upload` of one small file; "
                 "exec-file: an exec reading one file uploaded before the recording; "
                 "pair: upload + exec, one scenario-D pair (figures are per pair)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    for mode, freq in (("request", 4000), ("server", 2000)):
        m = sub.add_parser(mode)
        m.add_argument("--url", required=True)
        m.add_argument("--server-pid", type=int, required=True)
        m.add_argument("-n", type=int, default=200)
        m.add_argument("--warmup", type=int, default=10)
        m.add_argument("--freq", type=int, default=freq)
        if mode == "request":
            m.add_argument("--pause-ms", type=int, default=0)
            m.add_argument("--json")
        m.add_argument("--workload", choices=WORKLOADS, default="hello", help=WORKLOAD_HELP)
        m.add_argument("--history", type=int, default=0,
                       help="uploads by the same user before the recording")
    wk = sub.add_parser("wakeups")
    wk.add_argument("--url", default="")
    wk.add_argument("--server-pid", type=int, default=0)
    wk.add_argument("--bare", action="store_true", help="bare spawns of the image's python3 instead")
    wk.add_argument("--image-root", default="")
    wk.add_argument("-n", type=int, default=100)
    wk.add_argument("--warmup", type=int, default=10)
    wk.add_argument("--pause-ms", type=int, default=50)
    wk.add_argument("--workload", choices=WORKLOADS, default="hello", help=WORKLOAD_HELP)
    ps = sub.add_parser("perfstat")
    ps.add_argument("--url", required=True)
    ps.add_argument("--server-pid", type=int, required=True)
    ps.add_argument("-n", type=int, default=300)
    ps.add_argument("--warmup", type=int, default=20, help="requests of the workload before the count")
    ps.add_argument("--workload", choices=WORKLOADS, default="pair", help=WORKLOAD_HELP)
    al = sub.add_parser("alone")
    al.add_argument("--image-root", default="")
    al.add_argument("-n", type=int, default=300)
    al.add_argument("--freq", type=int, default=4000)
    al.add_argument("--only", help="measure only the operations whose name holds this")
    al.add_argument("--json")
    a = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("floor.py needs root (perf -a, namespaces, cgroups)")
    {"request": cmd_request, "server": cmd_server, "wakeups": cmd_wakeups, "perfstat": cmd_perfstat,
     "alone": cmd_alone}[a.mode](a)


if __name__ == "__main__":
    main()
