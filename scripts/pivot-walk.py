#!/usr/bin/env python3
# pivot-walk.py EXTRA N: what a jail's pivot_root costs as the host's threads grow (its
# chroot_fs_refs walks every thread on the host), against entering a root prepared once
# (setns into the mount namespace of a process already pivoted into it, then
# unshare(CLONE_NEWNS): no pivot_root). Adds EXTRA idle threads to the host, then times N of
# each in forked children by their own thread CPU time (the kernel's included), medians.
# Needs root. BENCHMARKS.md, "Kernels started ahead at idle priority; pivot_root's walk".
import ctypes, os, sys, threading, time, statistics
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x20000; MS_REC = 0x4000; MS_PRIVATE = 1 << 18; MNT_DETACH = 2
SYS_pivot_root = 155
def ck(r, what):
    if r != 0: raise OSError(ctypes.get_errno(), what)
def cpu(): return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)
def child_pivot(w):
    ck(libc.unshare(CLONE_NEWNS), "unshare")
    ck(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "private")
    d = b"/tmp/kiln-pivot-walk"; os.makedirs(d, exist_ok=True)  # mounted on in its own namespace only
    ck(libc.mount(b"t", d, b"tmpfs", 0, b"size=1m"), "tmpfs")
    os.chdir(d)
    t = cpu(); ck(libc.syscall(SYS_pivot_root, b".", b"."), "pivot_root")
    ck(libc.umount2(b".", MNT_DETACH), "detach"); os.chdir("/"); e = cpu() - t
    os.write(w, b"%f\n" % (e * 1e6)); os._exit(0)
def child_setns(w, nsfd):
    t = cpu()
    ck(libc.setns(nsfd, CLONE_NEWNS), "setns"); ck(libc.unshare(CLONE_NEWNS), "unshare")
    e = cpu() - t
    os.write(w, b"%f\n" % (e * 1e6)); os._exit(0)
def holder():
    # a process pivoted once into a root of its own; its namespace is the prepared one
    r, w = os.pipe(); pid = os.fork()
    if pid == 0:
        ck(libc.unshare(CLONE_NEWNS), "unshare")
        ck(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "private")
        d = b"/tmp/kiln-pivot-walk"; os.makedirs(d, exist_ok=True)
        ck(libc.mount(b"t", d, b"tmpfs", 0, b"size=1m"), "tmpfs"); os.chdir(d)
        ck(libc.syscall(SYS_pivot_root, b".", b"."), "pivot"); ck(libc.umount2(b".", MNT_DETACH), "d")
        os.write(w, b"x"); time.sleep(3600); os._exit(0)
    os.read(r, 1); return pid
def run(kind, n, nsfd=None):
    out = []
    for _ in range(n):
        r, w = os.pipe(); pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                child_pivot(w) if kind == "pivot" else child_setns(w, nsfd)
            except Exception as e:
                sys.stderr.write(f"{e}\n"); os._exit(1)
        os.close(w); v = os.read(r, 64); os.close(r); os.waitpid(pid, 0)
        if v: out.append(float(v))
    return statistics.median(out), len(out)
extra = int(sys.argv[1]); n = int(sys.argv[2])
ev = threading.Event()
ts = [threading.Thread(target=ev.wait, daemon=True) for _ in range(extra)]
threading.stack_size(64 * 1024)
for t in ts: t.start()
hosts = len(os.listdir("/proc/self/task"))
total = sum(len(os.listdir(f"/proc/{p}/task")) for p in os.listdir("/proc") if p.isdigit() and os.path.exists(f"/proc/{p}/task"))
h = holder(); nsfd = os.open(f"/proc/{h}/ns/mnt", os.O_RDONLY)
p = run("pivot", n); s = run("setns", n, nsfd)
os.kill(h, 9); os.waitpid(h, 0)
print(f"host threads {total}: pivot_root {p[0]:.0f} us CPU (n={p[1]}), setns+unshare {s[0]:.0f} us CPU (n={s[1]})")
