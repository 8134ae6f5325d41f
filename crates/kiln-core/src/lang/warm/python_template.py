# Kiln: the Python fork-server's template (kiln-sandbox `zygote.rs`).
#
# Run ONCE by an embedded interpreter on the host, before any user code
# exists: it imports the data stack so that no run pays for it. Each warm `py`
# jail is then a fork of this never-used process; inside its jail (uid 1000,
# cwd /mnt/data, seccomp), Kiln calls `_kiln_zygote.run(go)` where `go` is
# JSON {"argv": ["/usr/bin/python3", "-u", "main.py", ARGS...], "env": [[k, v], ...]}.
# `run` makes the process look like a cold `python3 -u main.py ARGS` and never
# returns: it ends the process with the program's exit status.
import gc
import os
import sys
import types

_FONT_CACHE = "/usr/local/share/kiln/matplotlib"


def _seed_font_cache(target):
    try:
        os.makedirs(target, exist_ok=True)
        for name in os.listdir(_FONT_CACHE):
            if name.startswith("fontlist-") and not os.path.exists(os.path.join(target, name)):
                with open(os.path.join(_FONT_CACHE, name), "rb") as src, open(
                    os.path.join(target, name), "wb"
                ) as out:
                    out.write(src.read())
    except OSError:
        pass  # no prebuilt cache: matplotlib builds its own


def _preload():
    import atexit, collections, csv, dataclasses, datetime, decimal, fractions  # noqa: F401,E401
    import functools, io, itertools, json, math, pathlib, random, re, runpy  # noqa: F401,E401
    import signal, statistics, string, subprocess, textwrap, threading  # noqa: F401,E401
    import traceback, typing, unittest, urllib.parse, uuid  # noqa: F401,E401
    for name in ("numpy", "pandas"):
        try:
            __import__(name)
        except Exception:
            pass
    if os.environ.get("MPLCONFIGDIR"):
        _seed_font_cache(os.environ["MPLCONFIGDIR"])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        _patch_pyplot(plt)
    except Exception:
        pass


def _patch_pyplot(plt):
    def show(*args, **kwargs):
        """Kiln: save each open figure as plot_<n>.png in the working directory, then close it."""
        for num in plt.get_fignums():
            n = 1
            while os.path.lexists(os.path.join(os.getcwd(), "plot_%d.png" % n)):
                n += 1
            plt.figure(num).savefig(os.path.join(os.getcwd(), "plot_%d.png" % n))
        plt.close("all")

    show.__wrapped__ = plt.show
    plt.show = show


def _repoint_matplotlib(confdir):
    """matplotlib cached the template's (host) config dir: use the jail's."""
    mpl = sys.modules.get("matplotlib")
    if mpl is None or not confdir:
        return
    try:
        os.makedirs(confdir, exist_ok=True)
    except OSError:
        return
    mpl.get_configdir = lambda: confdir
    mpl.get_cachedir = lambda: confdir


def _exit_code(e):
    """What a cold interpreter does with an uncaught SystemExit."""
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:
        pass
    return 1


def _print_exception(e, script):
    """Like the default hook at top level: the user's frames only."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    # the hook prints the exception's own traceback when it has one
    e.__traceback__ = tb
    sys.excepthook(type(e), e, tb)


def _flush():
    ok = True
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            ok = False
    return ok


def run(go):
    import json
    import signal
    import threading

    go = json.loads(go)
    argv = go["argv"]
    os.environ.clear()
    os.environ.update(dict(go["env"]))
    _repoint_matplotlib(os.environ.get("MPLCONFIGDIR"))
    # a cold interpreter's signal dispositions (the jail reset them all)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)

    # argv[0] is the interpreter, then -u, then the script and its arguments
    rest = argv[1:]
    while rest and rest[0].startswith("-") and rest[0] != "-":
        rest = rest[1:]
    script_arg = rest[0] if rest else "main.py"
    script = os.path.join(os.getcwd(), script_arg)
    sys.argv = [script_arg] + rest[1:]
    sys.orig_argv = list(argv)
    sys.executable = sys._base_executable = "/usr/bin/python3"
    if sys.path and sys.path[0] in ("", "."):
        sys.path[0] = os.path.dirname(script)
    else:
        sys.path.insert(0, os.path.dirname(script))

    # the user's module becomes __main__, as with `python3 main.py`
    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__builtins__ = __builtins__
    main.__loader__ = None
    main.__spec__ = None
    sys.modules["__main__"] = main
    code = 0
    try:
        with open(script, "rb") as f:
            source = f.read()
        exec(compile(source, script, "exec"), main.__dict__)
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException as e:  # noqa: BLE001 - reported like the interpreter does
        _print_exception(e, script)
        code = 130 if isinstance(e, KeyboardInterrupt) else 1
    # interpreter shutdown: non-daemon threads, atexit handlers, flush
    try:
        threading._shutdown()
    except Exception:
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except SystemExit as e:
        code = _exit_code(e)
    except BaseException:
        pass
    if not _flush() and code == 0:
        code = 120
    os._exit(code)


_module = types.ModuleType("_kiln_zygote")
_module.run = run
sys.modules["_kiln_zygote"] = _module
_preload()
# Imported objects never change again: keep the collector off their pages,
# so forks share them copy-on-write instead of touching every one.
gc.collect()
gc.freeze()
