# Kiln: the warm Python template, run ONCE by the fork-server as its preload
# (after kiln_plot.py, the plt.show() hook cold runs use too).
#
# The fork-server embeds libpython, runs this file as root on the host, then
# forks one child per execution. The child joins a fresh jail's namespaces and
# cgroups, confines itself (uid 1000, cwd /mnt/data, seccomp) and calls
#     import _kiln_zygote; _kiln_zygote.run(bytes.fromhex("<hex>"))
# with the UTF-8 JSON {"argv": ["/usr/bin/python3", "-u", "main.py", ARGS...],
# "env": [["K", "V"], ...]}. `run` never returns: it makes the process look
# like a cold `python3 -u main.py ARGS` started with that environment, runs
# main.py (in the current directory) as __main__, then shuts down the way
# CPython's Py_FinalizeEx does and ends the process with os._exit(status).
#
# What the preload does: imports common stdlib modules (unless _kiln_stdlib, set in
# front of this file by the language table, is False: the min template) and this
# template's own modules (_kiln_preload, set there too: the rich template's data
# stack, none for the lean and min ones), compiles the programs the language table
# gives it (_kiln_programs, {path: source bytes}: a live kernel's, which every kernel
# would otherwise compile again in its fork, ~3 ms of CPU and ~1.7 MiB of pages made
# private), seeds matplotlib's font cache, draws
# one throw-away figure when pyplot is preloaded (so a run's first draw and PNG save
# find their lazily built modules and caches ready), makes plt.show() save plot_<n>.png
# (like sitecustomize.py), then gc.freeze()s it all so the children share the pages.
# It never runs user code.
#
# Differences from a cold interpreter that this file cannot remove:
# - sys.modules already holds the preloaded modules (and no Kiln sitecustomize);
# - sys.flags and the str hash seed come from the host's Py_InitializeEx, so the
#   host should initialise with the jail's PYTHON* and locale variables
#   (PYTHONUNBUFFERED=1, PYTHONDONTWRITEBYTECODE=1, LC_ALL=C.UTF-8), and every
#   child shares one hash seed (set iteration order repeats across runs);
# - frames of the caller ("<string>") and of this file sit below the user's
#   module frame: tracebacks hide them and the recursion limit hides their
#   depth (sys.get/setrecursionlimit become wrappers), but sys._getframe(1) or
#   traceback.print_stack() can see them;
# - at exit, the modules the program loaded are torn down as CPython does (so
#   __del__ runs and unclosed files are flushed); preloaded modules are not, and
#   stay importable from a __del__ running then;
# - threads get the hidden frames' depth as extra recursion room; RSS and
#   ru_maxrss include the shared preloaded pages;
# - the process's parent is the fork-server, outside the jail's pid namespace,
#   so os.getppid() is 0 (1, the jail's init, in a cold run);
# - /proc/self/exe (psutil's exe()) is the fork-server's binary: the kernel lets
#   no process replace the file it runs. Its name and command line are the go's
#   (/proc/self/comm, cmdline and environ, hence ps and psutil's name() and
#   cmdline()): the fork-server sets them before it calls run().
# The fork-server must call PyOS_AfterFork_Child() in the child (threading's
# and random's at-fork hooks); the child reseeds random and numpy anyway.


def _exercise_plotting(plt):
    """Draws one throw-away figure (a mesh with a colour bar, lines, a legend and
    text) to an in-memory PNG, so the modules and caches matplotlib only builds on
    a first draw and save (Agg, PIL's PNG writer, colour bars, tick formatting,
    font look-ups) are built once here instead of in every run: ~20 ms of a
    typical seaborn or pandas plot. Leaves no figure open and no file open: the
    cached FT2Font objects hold their font file open, and a child must not
    inherit the template's descriptors, so that cache is emptied (the children
    reopen a font on first use; the font look-up cache, paths only, stays)."""
    if plt is None:
        return
    import io
    import sys

    try:
        fig, ax = plt.subplots()
        mesh = ax.pcolormesh([[0.0, 1.0], [1.0, 0.0]])
        fig.colorbar(mesh, ax=ax)
        ax.plot([0, 1], [0, 1], label="a")
        ax.legend()
        ax.text(0.5, 0.5, "0.5", ha="center", va="center")
        ax.set_title("t")
        ax.set_xlabel("x")
        fig.savefig(io.BytesIO(), format="png")
    except Exception:  # a broken optional package: the runs pay the first draw
        pass
    finally:
        plt.close("all")
        font_manager = sys.modules.get("matplotlib.font_manager")
        get_font = getattr(font_manager, "_get_font", None)
        if get_font is not None and hasattr(get_font, "cache_clear"):
            get_font.cache_clear()


def _kiln_template():
    # Everything lives in this function's scope so that the namespace the
    # template is executed in (the host's __main__) keeps no names.
    import gc
    import os
    import sys

    font_cache = "/usr/local/share/kiln/matplotlib"
    # The common stdlib set, or (_kiln_stdlib False: the min template) none: only what
    # run() itself needs, which is what a cold `python3 -c pass` has loaded anyway
    stdlib = (
        "abc argparse array ast atexit base64 bisect calendar codecs collections "
        "collections.abc contextlib copy csv dataclasses datetime decimal enum "
        "fractions functools glob gzip hashlib heapq html importlib.machinery io "
        "itertools json locale logging math operator os pathlib pickle pprint "
        "queue random re runpy shutil signal site statistics string struct "
        "subprocess sys tempfile textwrap threading time traceback types typing "
        "unicodedata urllib.parse uuid warnings weakref zipfile"
    ).split() if _kiln_stdlib else ()
    data_stack = _kiln_preload  # this template's own modules, set in front of this file

    # The jail's values, read once at import by numpy's BLAS and matplotlib. A
    # BLAS thread started here would not survive the fork.
    for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    os.environ.setdefault("MPLBACKEND", "Agg")

    _kiln_seed_font_cache(font_cache)
    for name in stdlib:
        try:
            __import__(name)
        except ImportError:
            pass
    for name in data_stack:
        try:
            __import__(name)
        except Exception:  # a missing or broken optional package: preload without it
            pass
    _exercise_plotting(sys.modules.get("matplotlib.pyplot"))

    # What run() uses, the C and always-loaded layers where they do the same: the min
    # template holds no more than this and what a cold `python3 -c pass` loads.
    import atexit
    import codecs
    import io
    import _json
    import _locale
    import _signal
    import site
    import _weakref
    from _frozen_importlib_external import SourceFileLoader  # importlib.machinery's

    ModuleType = type(sys)

    # plt.show() saves every open figure as plot_<n>.png in the directory the
    # execution started in (kiln_plot.py, the hook cold runs use too).
    output_dir = [os.getcwd()]
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None:
        _kiln_patch_pyplot(plt, lambda: output_dir[0])
    else:  # a template without pyplot patches it when a program imports it, as cold runs do
        _kiln_hook_pyplot(lambda: output_dir[0])

    # sys.unraisablehook takes only this struct type; it is not exported, so
    # catch one instance of it.
    caught = []
    hook, sys.unraisablehook = sys.unraisablehook, caught.append

    class _Unraisable:
        def __del__(self):
            raise RuntimeError

    _Unraisable()
    sys.unraisablehook = hook
    unraisable_args = type(caught[0]) if caught else None
    del caught

    # sys.path without the host's own entries; run() puts the script dir,
    # PYTHONPATH and the user site in front of / between these, as site.py does.
    host_pythonpath = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    site_dirs = set(site.getsitepackages())
    base_path = [
        p
        for p in sys.path
        if p and p not in host_pythonpath and p != site.getusersitepackages()
    ]
    split = next((i for i, p in enumerate(base_path) if p in site_dirs), len(base_path))
    stdlib_path, site_path = base_path[:split], base_path[split:]
    # site's user base and user site for this environment, computed once here: they
    # depend only on PYTHONUSERBASE and HOME (expanduser reads HOME when it is set;
    # without it, the password entry of the child's uid, so then a run computes them).
    site.USER_BASE = site.USER_SITE = None
    user_site_cached = (site.getuserbase(), site.getusersitepackages())
    user_site_key = (os.environ.get("PYTHONUSERBASE"), os.environ.get("HOME"))
    if (not user_site_key[0] and user_site_key[1] is None) or None in user_site_cached:
        user_site_key = None
    preloaded = set(sys.modules)
    template_globals = globals()  # every frame of this file runs with these

    class _JsonSettings:
        strict = True
        object_hook = object_pairs_hook = None
        parse_float, parse_int = float, int
        parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__

    WRAPPER_ASSIGNMENTS = "__module__ __name__ __qualname__ __doc__ __annotations__ __type_params__"

    def wraps(wrapped):
        """functools.wraps (without importing functools and what it imports)."""

        def update(wrapper):
            for name in WRAPPER_ASSIGNMENTS.split():
                try:
                    setattr(wrapper, name, getattr(wrapped, name))
                except AttributeError:
                    pass
            wrapper.__dict__.update(getattr(wrapped, "__dict__", {}))
            wrapper.__wrapped__ = wrapped
            return wrapper

        return update

    def write_stderr(text):
        try:
            sys.stderr.write(text)
        except Exception:
            pass

    def strip(exc):
        """Drop this file's frames from the head of exc's traceback."""
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_globals is template_globals:
            tb = tb.tb_next
        return exc.with_traceback(tb)

    def report_unraisable(exc, obj):
        """PyErr_WriteUnraisable(obj) for exc, through sys.unraisablehook."""
        exc = strip(exc)
        try:
            if unraisable_args is None:
                raise TypeError("no UnraisableHookArgs")
            sys.unraisablehook(unraisable_args((type(exc), exc, exc.__traceback__, None, obj)))
        except Exception:
            write_stderr("Exception ignored in: %r\n%s: %s\n" % (obj, type(exc).__name__, exc))

    def std_stream(fd, name, mode, encoding, errors, unbuffered):
        """A sys.std* stream built the way CPython's create_stdio builds it."""
        try:
            os.fstat(fd)
        except OSError:
            return None
        write = mode == "w"
        buffering = 0 if unbuffered and write else -1
        buf = io.open(fd, mode + "b", buffering, closefd=False)
        raw = buf if buffering == 0 else buf.raw
        raw.name = name
        line_buffering = not unbuffered and (raw.isatty() or fd == 2)
        stream = io.TextIOWrapper(
            buf,
            encoding,
            errors,
            newline="\n",
            line_buffering=line_buffering,
            write_through=unbuffered,
        )
        stream.mode = mode
        return stream

    def setup_stdio(env, unbuffered):
        io_encoding, _, io_errors = env.get("PYTHONIOENCODING", "").partition(":")
        getencoding = getattr(_locale, "getencoding", None)  # 3.11+
        if getencoding is None:
            import locale

            encoding = io_encoding or locale.getpreferredencoding(False)
        else:
            encoding = io_encoding or codecs.lookup(getencoding()).name
        if io_errors:
            errors = io_errors
        elif _locale.setlocale(_locale.LC_CTYPE) in ("C", "POSIX", "C.UTF-8", "C.utf8", "UTF-8"):
            errors = "surrogateescape"  # what CPython picks for the C locale and its coercions
        else:
            errors = "strict"
        sys.stdin = sys.__stdin__ = std_stream(0, "<stdin>", "r", encoding, errors, unbuffered)
        sys.stdout = sys.__stdout__ = std_stream(1, "<stdout>", "w", encoding, errors, unbuffered)
        sys.stderr = sys.__stderr__ = std_stream(
            2, "<stderr>", "w", encoding, "backslashreplace", unbuffered
        )

    def setup_signals():
        """The dispositions and mask a cold interpreter starts with. Through _signal, with
        plain ints: signal.py's enum conversions would touch (and so copy) shared pages."""
        try:
            _signal.set_wakeup_fd(-1)
        except (ValueError, OSError):
            pass
        for sig in _signal.valid_signals():
            if sig in (_signal.SIGKILL, _signal.SIGSTOP):
                continue
            try:
                _signal.signal(sig, _signal.SIG_DFL)
            except (OSError, ValueError, RuntimeError):
                pass  # glibc's reserved real-time signals
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        _signal.signal(_signal.SIGPIPE, _signal.SIG_IGN)
        _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())

    def setup_sys(argv, script, env, script_dir):
        sys.argv = argv[script:]
        sys.orig_argv = list(argv)
        sys.executable = sys._base_executable = argv[0]
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE")) or "-B" in argv[1:script]
        for name in ("last_type", "last_value", "last_traceback", "last_exc"):
            sys.__dict__.pop(name, None)
        sys.excepthook = sys.__excepthook__
        sys.displayhook = sys.__displayhook__
        sys.unraisablehook = sys.__unraisablehook__
        sys.breakpointhook = sys.__breakpointhook__
        pythonpath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path = [script_dir] + pythonpath + stdlib_path
        if user_site_key == (env.get("PYTHONUSERBASE"), env.get("HOME")):
            site.USER_BASE, site.USER_SITE = user_site_cached
            user_site = site.USER_SITE
        else:
            site.USER_BASE = site.USER_SITE = None
            user_site = site.getusersitepackages()  # from the new HOME
        if site.ENABLE_USER_SITE and os.path.isdir(user_site):
            site.addsitedir(user_site)
        sys.path.extend(site_path)
        # Finders the host cached for the new leading entries (a fresh jail's /mnt/data is
        # not the host's); the others stay: they revalidate by directory mtime, and
        # freeing them all would copy-on-write a large part of the heap.
        for entry in [script_dir] + pythonpath:
            sys.path_importer_cache.pop(entry, None)

    def setup_libraries():
        """Per-process state the preloaded libraries took from the host."""
        import time

        time.tzset()  # TZ or the jail's /etc/localtime, not the host's
        random = sys.modules.get("random")
        if random is not None:  # (a program that imports it later seeds it then)
            random.seed()
        platform = sys.modules.get("platform")
        if platform is not None:  # uname() (the host's name) and os-release are cached
            platform._uname_cache = platform._os_release_cache = None
        logging = sys.modules.get("logging")
        if logging is not None:  # base of LogRecord.relativeCreated: "import time"
            ns = isinstance(logging._startTime, int)  # 3.13+
            logging._startTime = time.time_ns() if ns else time.time()
        np_random = sys.modules.get("numpy.random")
        if np_random is not None:
            np_random.seed()
        mpl = sys.modules.get("matplotlib")
        if mpl is not None:
            # matplotlib cached the host's config and cache dirs: compute them again, from
            # the new MPLCONFIGDIR, on first use (a cold import makes the directory)
            for name in ("get_configdir", "get_cachedir"):
                inner = getattr(getattr(mpl, name, None), "__wrapped__", None)
                if inner is not None:
                    setattr(mpl, name, cache_once(inner))
            config_dir = os.environ.get("MPLCONFIGDIR")
            if config_dir:
                try:
                    os.makedirs(config_dir, exist_ok=True)
                except OSError:
                    pass
                style = sys.modules.get("matplotlib.style.core")
                if style is not None and hasattr(style, "USER_LIBRARY_PATHS"):
                    style.USER_LIBRARY_PATHS = [os.path.join(config_dir, "stylelib")]

    def cache_once(fn):
        cache = []

        @wraps(fn)
        def cached():
            if not cache:
                cache.append(fn())
            return cache[0]

        return cached

    def main_module(path):
        """The __main__ module exactly as pymain creates it for a script."""
        main = ModuleType("__main__")
        main.__loader__ = SourceFileLoader("__main__", path)
        main.__annotations__ = {}
        main.__builtins__ = sys.modules["builtins"]
        main.__file__ = path
        main.__cached__ = None
        return main

    def source_code(source, path):
        """compile() of main.py with the file tokenizer's quirks: a NUL byte ends its line, and
        undecodable bytes are reported as for a file."""
        if b"\0" in source:
            source = b"".join(line.split(b"\0", 1)[0] for line in source.splitlines(True))
        if not source.startswith(codecs.BOM_UTF8) and b"coding" not in b"\n".join(
            source.split(b"\n", 2)[:2]
        ):
            try:
                source.decode("utf-8")
            except UnicodeDecodeError as e:
                raise SyntaxError(
                    "Non-UTF-8 code starting with '\\x%.2x' in file %s on line %d, but no "
                    "encoding declared; see https://peps.python.org/pep-0263/ for details"
                    % (source[e.start], path, source.count(b"\n", 0, e.start) + 1)
                ) from None
        return compile(source, path, "exec", dont_inherit=True)

    # Programs compiled once here: a run whose main.py is one of these paths with the same
    # bytes executes this code object (what source_code() would build again) instead.
    compiled = {}
    for program_path, program_source in _kiln_programs.items():
        try:
            compiled[program_path] = (program_source, source_code(program_source, program_path))
        except Exception:  # compiled, and reported, by each run as a cold one does
            pass

    def program_code(source, path):
        """source_code(source, path), or the one compiled here for that path and bytes."""
        known = compiled.get(path)
        if known is not None and known[0] == source:
            return known[1]
        return source_code(source, path)

    def system_exit_status(exc):
        """_Py_HandleSystemExit: the exit status of SystemExit, printing a non-int code."""
        code = getattr(exc, "code", exc)
        if code is None:
            return 0
        if isinstance(code, int):
            # C: (int)PyLong_AsLong(code), then exit() keeps the low byte
            return code & 0xFF if -(2**63) <= code < 2**63 else 0xFF
        try:
            text = str(code)
        except Exception:
            text = object.__repr__(code)
        write_stderr(text)
        write_stderr("\n")
        return 1

    def print_exception(exc):
        """PyErr_Print for a non-SystemExit exception; returns the exit status."""
        exc = strip(exc)
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
        if sys.version_info >= (3, 12):
            sys.last_exc = exc
        if not hasattr(sys, "excepthook"):
            write_stderr("sys.excepthook is missing\n")
            sys.__excepthook__(type(exc), exc, exc.__traceback__)
            return 1
        try:
            sys.excepthook(type(exc), exc, exc.__traceback__)
        except SystemExit as hook_exit:
            return system_exit_status(hook_exit)
        except BaseException as hook_error:
            hook_error = strip(hook_error)
            write_stderr("Error in sys.excepthook:\n")
            sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
            write_stderr("\nOriginal exception was:\n")
            sys.__excepthook__(type(exc), exc, exc.__traceback__)
        return 1

    def flush_std_files():
        """Py_FinalizeEx's flush of sys.stdout and sys.stderr; False if one failed."""
        ok = True
        for stream, report in ((sys.stdout, True), (sys.stderr, False)):
            if stream is None:
                continue
            try:
                if getattr(stream, "closed"):
                    continue
            except Exception:
                pass
            try:
                stream.flush()
            except BaseException as e:
                if report:
                    report_unraisable(e, stream)
                ok = False
        return ok

    def clear_module_dict(d):
        """_PyModule_ClearDict: _private names first, then all but __builtins__."""
        for key in list(d):
            private = isinstance(key, str) and key[:1] == "_" and key[1:2] != "_"
            if private and d.get(key) is not None:
                d[key] = None
        for key in list(d):
            if isinstance(key, str) and key != "__builtins__" and d.get(key) is not None:
                d[key] = None

    def teardown():
        """CPython's finalize_modules for the modules the program loaded (and __main__), so
        that __del__ methods run and unclosed files get flushed: reset sys's special names,
        drop the modules, collect, clear the dicts of those still alive (newest first),
        collect again. Preloaded modules are left alone (and a preloaded module that the
        program deleted and imported again hides the program's modules imported before it)."""
        sys.modules["builtins"]._ = None
        # (sys.path_importer_cache is kept: freeing the host's finders would copy-on-write
        # much of the heap. With meta_path None, importing what is not loaded yet fails
        # as in CPython's teardown; preloaded modules still import.)
        for name in (
            "path argv ps1 ps2 last_type last_value last_traceback path_hooks "
            "meta_path __interactivehook__"
        ).split() + (["last_exc"] if sys.version_info >= (3, 12) else []):
            setattr(sys, name, None)
        sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
        # The program's modules are the newest entries of sys.modules (walking all of them
        # would touch every preloaded module's refcount, again copy-on-write).
        names = []
        for name in reversed(sys.modules):  # newest first
            if name in preloaded:
                break
            names.append(name)
        names.append("__main__")  # an early entry: cleared last
        refs = []
        for name in names:
            module = sys.modules.pop(name, None)
            if isinstance(module, ModuleType):
                refs.append(_weakref.ref(module))
            module = None
        gc.collect()
        for ref in refs:
            module = ref()
            if module is not None:
                clear_module_dict(module.__dict__)
            module = None
        gc.collect()

    def finalize(status):
        """Py_FinalizeEx as a script observes it; returns the process exit status."""
        threading_module = sys.modules.get("threading")
        if threading_module is not None:
            try:
                threading_module._shutdown()  # waits for non-daemon threads
            except BaseException as e:
                report_unraisable(e, threading_module)
        threading_module = None
        atexit._run_exitfuncs()
        if not flush_std_files():
            status = 120
        try:
            gc.collect()
            teardown()
            for stream in (sys.__stdout__, sys.__stderr__):
                if stream is not None:
                    stream.flush()
        except BaseException:
            pass  # as in CPython, errors this late are not reported
        return status

    # Module code that recurses until RecursionError; in a cold `python3 main.py` it
    # reaches a depth of limit - 1.
    probe = compile(
        "def p():\n    global n\n    n += 1\n    p()\nn = 0\n"
        "try:\n    p()\nexcept RecursionError:\n    pass\n",
        "<kiln-recursion-probe>",
        "exec",
    )

    def hide_frames_from_recursion_limit(offset):
        """Raise the limit by offset, and make sys's getter and setter pretend it was not
        (the template's pair when offset is its calibration's)."""
        if calibration and calibration[0] == offset:
            wrappers = calibration[1]
        else:
            wrappers = recursion_limit_wrappers(offset)
        sys.setrecursionlimit(sys.getrecursionlimit() + offset)
        sys.getrecursionlimit, sys.setrecursionlimit = wrappers

    def recursion_limit_wrappers(offset):
        """sys.getrecursionlimit and sys.setrecursionlimit as seen by a program below which
        frames take offset levels of the limit."""
        real_get, real_set = sys.getrecursionlimit, sys.setrecursionlimit

        @wraps(real_get)
        def getrecursionlimit():
            return real_get() - offset

        @wraps(real_set)
        def setrecursionlimit(limit):
            if isinstance(limit, int) and limit >= 1:
                limit += offset
            real_set(limit)

        return getrecursionlimit, setrecursionlimit

    def exec_module_code(code, namespace):
        """exec() of module code, one frame above the caller's: the program runs here."""
        exec(code, namespace)

    def levels_below_module_code():
        """How much of the recursion limit the frames below module code run by the
        caller's exec_module_code() take (0 in a cold `python3 main.py`): the probe, run
        one frame above the caller as that code will be, recurses until RecursionError
        under a limit just above that. The template measures it once (calibrate(), from
        as deep as execute() runs in the fork-server, where both enter through
        PyRun_SimpleString), and a run then starts its probe a few levels above the
        template's answer: it recurses a few frames instead of dozens. The run still
        measures (a stack entered differently gets its own answer)."""
        limit, space = sys.getrecursionlimit(), {}
        low = calibration[0] + 4 if calibration else 16
        while True:
            try:
                sys.setrecursionlimit(low)
                break
            except RecursionError:
                low *= 2
        exec(probe, space)  # one frame above the caller, as exec_module_code's exec
        sys.setrecursionlimit(limit)
        return low - 1 - space["n"]

    def calibrate():
        """Called from _kiln_template() as execute() is from run(): as deep."""
        room = levels_below_module_code()
        calibration[:] = [room, recursion_limit_wrappers(room)]

    calibration = []
    calibrate()

    def execute(path):
        """Run main.py as __main__ and shut down; returns the exit status (or dies by SIGINT).
        Holds no reference to the __main__ module (teardown must be able to free it)."""
        interrupted = False
        try:
            with open(path, "rb") as f:
                source = f.read()
        except OSError as e:
            write_stderr(
                "%s: can't open file %r: [Errno %d] %s\n"
                % (sys.orig_argv[0], path, e.errno, e.strerror)
            )
            return finalize(2)
        room = levels_below_module_code()
        if room:
            hide_frames_from_recursion_limit(room)
        error = None
        try:
            exec_module_code(program_code(source, path), sys.modules["__main__"].__dict__)
            status = 0
        except SystemExit as e:
            status = system_exit_status(e)
        except BaseException as e:
            error = e
        if error is not None:
            # outside the except block, as PyErr_Print runs: the hook sees no exception
            # being handled, and one it raises gets no __context__
            status = print_exception(error)
            interrupted = isinstance(error, KeyboardInterrupt)
            error = None
        status = finalize(status)
        if interrupted:
            # CPython's exit_sigint(): die by SIGINT so that the parent sees it
            _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
            os.kill(os.getpid(), _signal.SIGINT)
            return 130
        return status

    def run(go):
        """Become `python3 [-u|-B] SCRIPT ARGS...` as described by go (JSON argv and env), with
        the script in the current directory, run it and os._exit(). Never returns."""
        try:
            text = bytes(go).decode("utf-8")
            request, end = scan_json(text, 0)
            if end != len(text):
                raise ValueError("data after the go's JSON")
            argv = [str(a) for a in request["argv"]]
            env = {str(k): str(v) for k, v in request["env"]}
            script = 1
            while script < len(argv) and argv[script] in ("-u", "-B"):
                script += 1
            if script >= len(argv) or argv[script].startswith("-"):
                raise ValueError("unsupported interpreter options in argv %r" % (argv,))
            unbuffered = "-u" in argv[1:script] or bool(env.get("PYTHONUNBUFFERED"))
            cwd = os.getcwd()
            path = os.path.join(cwd, argv[script])
            if list(os.environ) == list(env):
                # the fork-server's own environment is the jail's: change only what
                # differs (every putenv or unsetenv copies shared pages)
                for key, value in env.items():
                    if os.environ[key] != value:
                        os.environ[key] = value
            else:
                os.environ.clear()
                os.environ.update(env)
            try:  # a cold interpreter sets LC_CTYPE from the environment, nothing else
                _locale.setlocale(_locale.LC_ALL, "C")  # locale.setlocale for a str
                _locale.setlocale(_locale.LC_CTYPE, "")
            except _locale.Error:
                pass
            setup_signals()
            setup_stdio(env, unbuffered)
            setup_sys(argv, script, env, os.path.dirname(path))
            setup_libraries()
            output_dir[0] = cwd
            sys.modules["__main__"] = main_module(path)
            sys.modules.pop("_kiln_zygote", None)
        except BaseException as e:
            os.write(2, ("kiln-zygote: cannot start: %r\n" % (e,)).encode("utf-8", "replace"))
            os._exit(70)
        try:
            status = execute(path)
        except BaseException as e:  # an error inside this template's own shutdown
            os.write(2, ("kiln-zygote: %r\n" % (e,)).encode("utf-8", "replace"))
            status = 70
        os._exit(status)

    # json.loads without its Python layers (decode, raw_decode, the whitespace regex):
    # the C scanner it ends in, which the go (serde_json's output) needs alone, made
    # with json.JSONDecoder()'s settings
    scan_json = _json.make_scanner(_JsonSettings())
    zygote = ModuleType("_kiln_zygote", "Kiln's warm Python template: run(go) never returns.")
    zygote.run = run
    sys.modules["_kiln_zygote"] = zygote
    sys.stdout.flush()
    sys.stderr.flush()
    gc.collect()
    gc.freeze()


_kiln_template()
del _kiln_template, _exercise_plotting, _kiln_patch_pyplot, _kiln_seed_font_cache, _kiln_hook_pyplot, _kiln_preload, _kiln_stdlib, _kiln_programs
