#!/usr/bin/env python3
# prepared-root-probe.py [N [EXTRA]]: can a kernel jail be made from a root prepared once, with no
# pivot_root of its own, and keep the jail's properties? A stand-in of the design that
# BENCHMARKS.md's "pivot_root's walk, weighed" recommends, run on the real kernel:
#   template: a process pivoted once into a tmpfs root (/usr read-only, the merged-/usr links,
#             empty mount points), its old root detached, / read-only; optionally with a procfs
#             of an empty, dead pid namespace on /proc (see below);
#   a jail:   a single-threaded launcher setns()es into the template's mount namespace, forks,
#             goes home; the child unshares CLONE_NEWUSER|CLONE_NEWNS (a copy of the template,
#             every mount locked), gets its id maps from the launcher, unshares CLONE_NEWPID and
#             its pid 1 adds only its own mounts: /tmp (noexec), /proc, the /proc masks.
# Then pid 1 checks, as uid 0 of its user namespace with every capability there (stronger than a
# program, which has seccomp and no capabilities): which mounts it sees, whether .., /proc/1/root
# and the locked mounts let it out, and what an unmount of its own /proc would reveal.
# Times N jails of each kind by the CPU of the processes that make them (thread CPU, medians):
# "pivot": today's per-jail root (copy of the host's table, tmpfs root, pivot_root, detach);
# "prepared": setns + unshare from the template; with EXTRA idle threads added to the host first
# (pivot_root's chroot_fs_refs walks every thread of the host). Needs root.
import ctypes, json, os, statistics, subprocess, sys, time

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x20000, 0x10000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 0x4000, 1 << 18
MNT_DETACH = 2
SYS_pivot_root = 155
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]


def ck(r, what):
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def mount(src, dst, fstype, flags, data=None):
    ck(libc.mount(src, dst, fstype, flags, data), f"mount {dst!r}")


def cpu():
    return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)


def errno_of(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return os.strerror(e.errno)


def build_root(d, with_proc):
    """In the caller's own (private) mount namespace: a jail-like root on d."""
    mount(b"tmpfs", d, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=755")
    for sub in [b"usr", b"proc", b"tmp", b"dev", b"etc", b"mnt/data"]:
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    mount(b"/usr", os.path.join(d, b"usr"), None, MS_BIND | MS_REC)
    mount(None, os.path.join(d, b"usr"), None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for name in ["bin", "sbin", "lib", "lib64"]:
        if os.path.islink(f"/{name}"):
            os.symlink(os.readlink(f"/{name}"), os.path.join(d, name.encode()))
    open(os.path.join(d, b"dev/null"), "w").close()
    mount(b"/dev/null", os.path.join(d, b"dev/null"), None, MS_BIND)
    if with_proc:
        # a procfs of a pid namespace of its own that is empty and dead once its pid 1 exits:
        # the kernel lets a user namespace mount proc only where a fully visible one is in its
        # mount namespace already (mount_too_revealing); this one shows no process
        ck(libc.unshare(CLONE_NEWPID), "unshare pid")
        pid = os.fork()
        if pid == 0:
            try:
                mount(b"proc", os.path.join(d, b"proc"), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                os._exit(0)
            except Exception as e:
                sys.stderr.write(f"{e}\n")
                os._exit(1)
        _, st = os.waitpid(pid, 0)
        if st != 0:
            raise OSError(1, "mount the template's proc")


def pivot_into(d):
    os.chdir(d)
    ck(libc.syscall(SYS_pivot_root, b".", b"."), "pivot_root")
    ck(libc.umount2(b".", MNT_DETACH), "detach old root")
    os.chdir("/")


def template(with_proc):
    """A process pivoted once into a prepared root; returns (pid, fd of its mount namespace)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            ck(libc.unshare(CLONE_NEWNS), "unshare")
            mount(None, b"/", None, MS_REC | MS_PRIVATE)
            d = b"/tmp/kiln-prepared-root"
            os.makedirs(d, exist_ok=True)  # mounted on in this namespace only
            build_root(d, with_proc)
            pivot_into(d)
            mount(None, b"/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
            os.write(w, b"r")
            time.sleep(3600)
        except Exception as e:
            sys.stderr.write(f"template: {e}\n")
        os._exit(1)
    os.close(w)
    if os.read(r, 1) != b"r":
        raise OSError(1, "template failed")
    return pid, os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)


def write_maps(pid, base=200000):
    with open(f"/proc/{pid}/setgroups", "w") as f:
        f.write("deny")
    for m in ["uid_map", "gid_map"]:
        with open(f"/proc/{pid}/{m}", "w") as f:
            f.write(f"0 {base} 65536\n")


def jail_checks():
    """Pid 1 of the jail, after its own mounts: what it sees and can reach."""
    out = {}
    mi = open("/proc/self/mountinfo").read().splitlines()
    out["mounts"] = [l.split(" ")[4] for l in mi]
    out["host_paths_seen"] = [p for p in ("/work", "/root", "/var", "/run", "/home") if os.path.exists(p)]
    root = os.stat("/")
    out["dotdot_is_root"] = os.stat("/..").st_ino == root.st_ino
    out["proc1_root"] = os.readlink("/proc/1/root")
    out["write_usr"] = errno_of(lambda: open("/usr/kiln-probe", "w"))
    out["write_root"] = errno_of(lambda: open("/kiln-probe", "w"))
    out["umount_usr"] = errno_of(lambda: ck(libc.umount2(b"/usr", MNT_DETACH), "umount /usr"))
    out["umount_root"] = errno_of(lambda: ck(libc.umount2(b"/", MNT_DETACH), "umount /"))
    out["remount_usr_rw"] = errno_of(lambda: mount(None, b"/usr", None, MS_BIND | MS_REMOUNT))
    out["exec_tmp_noexec"] = "noexec" in next(l for l in mi if l.split(" ")[4] == "/tmp")
    # what an unmount of the jail's own /proc would show (a program cannot: no capability,
    # seccomp denies umount; pid 1 here has every capability of its user namespace)
    out["umount_own_proc"] = errno_of(lambda: ck(libc.umount2(b"/proc", MNT_DETACH), "umount /proc"))
    if out["umount_own_proc"] == "ok":
        out["pids_under_it"] = [p for p in os.listdir("/proc") if p.isdigit()]
        out["umount_template_proc"] = errno_of(lambda: ck(libc.umount2(b"/proc", MNT_DETACH), "umount /proc"))
    return out


def jail_pid1(kind, check):
    t = cpu()
    at = b""
    if kind == "pivot":
        # today's jail: its own tmpfs root in a copy of the host's table, then pivot_root
        mount(None, b"/", None, MS_REC | MS_PRIVATE)
        at = b"/tmp/kiln-prepared-root"
        build_root(at, False)
    mount(b"tmpfs", at + b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=1m,mode=1777")
    mount(b"proc", at + b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for m in [b"kcore", b"sysrq-trigger", b"kallsyms"]:
        if os.path.exists(at + b"/proc/" + m):
            mount(b"/dev/null", at + b"/proc/" + m, None, MS_BIND)
    if kind == "pivot":
        pivot_into(at)
    e = cpu() - t
    return jail_checks() if check else {"cpu_us": e * 1e6}


def jail(kind, nsfd, check, w):
    """The launcher's fork for one jail (single-threaded). Writes a JSON line to w."""
    home = os.open("/proc/self/ns/mnt", os.O_RDONLY)
    r2, w2 = os.pipe()
    go_r, go_w = os.pipe()
    t = cpu()
    if kind == "prepared":
        ck(libc.setns(nsfd, CLONE_NEWNS), "setns template")
    pid = os.fork()
    if pid == 0:
        try:
            t1 = cpu()
            ck(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare user+mnt")
            os.write(w2, b"u")
            os.read(go_r, 1)
            os.setresgid(0, 0, 0)
            os.setresuid(0, 0, 0)
            setup = cpu() - t1
            ck(libc.unshare(CLONE_NEWPID), "unshare pid")
            r3, w3 = os.pipe()
            p1 = os.fork()
            if p1 == 0:
                try:
                    res = jail_pid1(kind, check)
                except Exception as e:
                    res = {"error": str(e)}
                os.write(w3, json.dumps(res).encode())
                os._exit(0)
            os.close(w3)
            res = json.loads(os.read(r3, 1 << 16) or b"{}")
            os.waitpid(p1, 0)
            res["setup_us"] = setup * 1e6
            os.write(w, (json.dumps(res) + "\n").encode())
            os._exit(0)
        except Exception as e:
            os.write(w, (json.dumps({"error": str(e)}) + "\n").encode())
            os._exit(1)
    if kind == "prepared":
        ck(libc.setns(home, CLONE_NEWNS), "setns home")
    launcher = cpu() - t
    os.read(r2, 1)
    write_maps(pid)
    os.write(go_w, b"g")
    os.waitpid(pid, 0)
    os.write(w, (json.dumps({"launcher_us": launcher * 1e6}) + "\n").encode())


def one(kind, nsfd, check):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            jail(kind, nsfd, check, w)
        except Exception as e:
            os.write(w, (json.dumps({"error": str(e)}) + "\n").encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    merged = {}
    for line in data.splitlines():
        merged.update(json.loads(line))
    return merged


HOLD_THREADS = """
import sys, threading
idle = threading.Event()
threading.stack_size(64 * 1024)
for _ in range(int(sys.argv[1])):
    threading.Thread(target=idle.wait, daemon=True).start()
print("ready", flush=True)
idle.wait()
"""


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    extra = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    # the idle threads live in a process of their own: the launcher stand-in is a fork of this
    # one, whose fork must not copy them
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THREADS, str(extra)], stdout=subprocess.PIPE
    )
    holder.stdout.readline()
    try:
        probe(n)
    finally:
        holder.kill()
        holder.wait()
        try:
            os.rmdir("/tmp/kiln-prepared-root")  # the mount point the roots were built on
        except OSError:
            pass


def probe(n):
    threads = sum(
        len(os.listdir(f"/proc/{p}/task"))
        for p in os.listdir("/proc")
        if p.isdigit() and os.path.exists(f"/proc/{p}/task")
    )
    print(f"host threads: {threads}")
    for with_proc in (False, True):
        tpid, nsfd = template(with_proc)
        try:
            res = one("prepared", nsfd, True)
            print(f"prepared root, with a dead pid namespace's proc on /proc: {with_proc}")
            print(json.dumps(res))
        finally:
            os.kill(tpid, 9)
            os.waitpid(tpid, 0)
            os.close(nsfd)
    tpid, nsfd = template(True)
    try:
        print("today's root (pivot_root), for comparison:")
        print(json.dumps(one("pivot", nsfd, True)))
        for kind in ("pivot", "prepared"):
            runs = [one(kind, nsfd, False) for _ in range(n)]
            bad = [r for r in runs if "error" in r]
            ok = [r for r in runs if "error" not in r]
            if bad:
                print(f"{kind}: first failure: {bad[0]['error']}")
                continue
            med = lambda k: statistics.median(r[k] for r in ok)
            print(
                f"{kind}: n={len(ok)} (failed {len(bad)}) launcher {med('launcher_us'):.0f} us, "
                f"the jail's unshare {med('setup_us'):.0f} us, "
                f"pid 1's mounts (and root) {med('cpu_us'):.0f} us (CPU, medians)"
            )
    finally:
        os.kill(tpid, 9)
        os.waitpid(tpid, 0)


main()
