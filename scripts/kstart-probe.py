#!/usr/bin/env python3
"""What a `py` kernel does from its fork to its first output, in a stand-in of the
`py-data` fork-server (issue 28; BENCHMARKS.md, "A kernel's own start").

Run with the runtime image's interpreter in a chroot (see thp-fork-probe.py), with
TEMPLATE (kiln_plot.py + the `_kiln_preload`/`_kiln_stdlib` lines + python_template.py, as
the fork-server's preload) and KERNEL (python_kernel.py) copied in:
  unshare -m sh -c "mount -t proc proc $R/proc && chroot $R /usr/bin/python3 -W ignore \
      /tmp/kstart-probe.py /tmp/preload.py /tmp/kernel.py N [profile]"
Executes the preload as the fork-server does (in __main__), then forks N kernels one at a
time. Each child stops itself right after the fork, then runs
`_kiln_zygote.run(go)` of `python3 -u KERNEL` with stdin/stdout pipes, as a jail's program
does; the parent reads its `ready` frame, sends `print(6*7)` and reads the reply. At three
points (after the fork, at ready, after the first reply) the parent reads the child's CPU
(every thread's /proc schedstat, ns), minor faults and smaps_rollup Private_Dirty, and prints
the medians of the differences, and (first kernel) which mappings' private dirty pages grew
from the fork to `ready`. With `profile`, one more child runs under cProfile (every thread, from
run() to its reply) and the top functions by own time are printed. With KP=1 in the
environment each child defines builtins._kp(label), which appends "label minflt thread-CPU-ns"
to /tmp/kp.<pid>; copies of TEMPLATE and KERNEL with `_kp("step")` lines inserted between the
steps to time (BENCHMARKS.md's table: after each setup_* call of run(), around the compile in
execute(), between the kernel's parts) then give the per-step medians. The stand-in's
environment is not a jail's (no namespaces, seccomp or cgroups): it shows the Python side only.
"""
import json
import os
import signal
import statistics
import struct
import sys
import tempfile

HEADER = struct.Struct(">cI")


def cpu_ns(pid):
    total = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total


def minflt(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def dirty_kib(pid):
    with open("/proc/%d/smaps_rollup" % pid) as f:
        return sum(int(l.split()[1]) for l in f if l.startswith(("Private_Dirty", "Private_Clean")))


def smaps(pid):
    """{mapping: Private_Dirty KiB}"""
    out, name = {}, None
    with open("/proc/%d/smaps" % pid) as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and ":" not in fields[0]:
                name = fields[0] + " " + (fields[5] if len(fields) > 5 else "[anon]")
            elif fields[0] == "Private_Dirty:":
                out[name] = int(fields[1])
    return out


def sample(pid):
    return cpu_ns(pid), minflt(pid), dirty_kib(pid)


def read_exact(fd, n):
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def read_frame(fd):
    kind, length = HEADER.unpack(read_exact(fd, HEADER.size))
    return kind, read_exact(fd, length) if length else b""


def main():
    preload, kernel, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    profile = len(sys.argv) > 4 and sys.argv[4] == "profile"
    os.environ.update({"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8",
                       "HOME": "/tmp", "MPLCONFIGDIR": "/tmp/mpl"})
    main_globals = sys.modules["__main__"].__dict__
    with open(preload) as f:
        code = compile(f.read(), "<string>", "exec")
    exec(code, main_globals)
    go = json.dumps({"argv": ["/usr/bin/python3", "-u", kernel], "env": list(os.environ.items())}).encode()
    work = tempfile.mkdtemp()
    rows = []
    kp = []
    for i in range(n + (1 if profile else 0)):
        prof = profile and i == n
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.chdir(work)
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            for fd in (in_r, in_w, out_r, out_w):
                os.close(fd)
            os.kill(os.getpid(), signal.SIGSTOP)
            if prof:
                import cProfile
                p = cProfile.Profile()
                real_exit = os._exit

                def leave(status):
                    p.disable()
                    p.dump_stats("/tmp/kstart.prof")
                    real_exit(status)

                os._exit = leave
                p.enable()
            if os.environ.get("KP"):
                import builtins, resource, time
                kpfd = os.open("/tmp/kp.%d" % os.getpid(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                _ru, _ck, _w = resource.getrusage, time.clock_gettime_ns, os.write
                def _kp(label):
                    _w(kpfd, b"%s %d %d\n" % (label.encode(), _ru(0).ru_minflt, _ck(3)))
                builtins._kp = _kp
                _kp("forked")
            import _kiln_zygote
            _kiln_zygote.run(go)
        os.close(in_r)
        os.close(out_w)
        os.waitpid(pid, os.WUNTRACED)
        a = sample(pid)
        ma = smaps(pid) if i == 0 else None
        os.kill(pid, signal.SIGCONT)
        kind, payload = read_frame(out_r)
        assert kind == b"r" and json.loads(payload)["ready"], payload
        b = sample(pid)
        if i == 0:
            mb = smaps(pid)
            grew = {}
            for k, v in mb.items():
                label = k.split(" ", 1)[1]
                grew[label] = grew.get(label, 0) + v - ma.get(k, 0)
            print("private dirty grown, fork -> ready, by mapping (KiB):")
            for label, kib in sorted(grew.items(), key=lambda kv: -kv[1])[:15]:
                print("  %6d  %s" % (kib, label))
        cell = json.dumps({"code": "print(6*7)"}).encode()
        os.write(in_w, HEADER.pack(b"x", len(cell)) + cell)
        out = b""
        while True:
            kind, payload = read_frame(out_r)
            if kind == b"o":
                out += payload
            elif kind == b"r":
                break
        assert out == b"42\n" and json.loads(payload)["error"] is None, (out, payload)
        c = sample(pid)
        os.close(in_w)  # the kernel leaves on its stdin's end
        os.close(out_r)
        os.waitpid(pid, 0)
        if os.environ.get("KP"):
            kp.append(open("/tmp/kp.%d" % pid).read().split("\n")[:-1])
            os.unlink("/tmp/kp.%d" % pid)
        if not prof:
            rows.append((b[0] - a[0], b[1] - a[1], b[2] - a[2], c[0] - b[0], c[1] - b[1], c[2] - b[2], a[2]))
    med = [statistics.median(col) for col in zip(*rows)]
    print("n=%d  start (fork -> ready): cpu %.2f ms, %d minor faults, private +%d KiB" % (n, med[0] / 1e6, med[1], med[2]))
    print("       first eval (ready -> reply): cpu %.2f ms, %d minor faults, private +%d KiB" % (med[3] / 1e6, med[4], med[5]))
    print("       private right after the fork: %d KiB" % med[6])
    if kp:
        full = max(len(r) for r in kp)
        kp = [r for r in kp if len(r) == full]  # (a kernel may leave before its last line)
        print("step                 minor faults   cpu us (medians of the step's own)")
        for j in range(1, len(kp[0])):
            label = kp[0][j].split()[0]
            df = statistics.median(int(r[j].split()[-2]) - int(r[j - 1].split()[-2]) for r in kp)
            dc = statistics.median(int(r[j].split()[-1]) - int(r[j - 1].split()[-1]) for r in kp)
            print("  %-20s %6d   %8.0f" % (label, df, dc / 1e3))
    if profile:
        import pstats
        pstats.Stats("/tmp/kstart.prof").sort_stats("tottime").print_stats(25)


main()
