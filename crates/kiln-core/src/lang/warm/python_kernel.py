# Kiln's Python kernel: a long-lived interpreter that evaluates framed requests.
#
# It runs as the program of a jail (a fork of the fork-server's template, so it
# starts with the template's modules imported) and speaks one protocol:
#
#   stdin  (from the server): frames  kind(1) + length(4, big-endian) + payload
#            b"x" {"code": "..."}   evaluate
#            b"i" (empty)           interrupt the evaluation running now (SIGINT)
#   stdout (to the server):   frames of the same shape
#            b"o" bytes             the evaluation's stdout, as written
#            b"e" bytes             its stderr
#            b"r" {...}             "ready" once, then one reply per evaluation
#
# A reply is {"value", "png", "error", "files"}: the repr() of a final
# expression's value, that value as a base64 PNG when it is a matplotlib
# figure (or axes: its figure, then closed, as Jupyter's inline backend does)
# or has _repr_png_, the error, and the files under /mnt/data the evaluation
# created or changed (plt.show() writes plot_<n>.png there: the template's
# hook, kiln_plot.py, which cold runs use too).
#
# The user's code writes to fd 1 and 2, which are pipes this kernel drains into
# frames (subprocesses inherit them too); every byte written before the code
# returned is framed before the reply. The user's namespace is a module of its
# own named __main__; this file's frames are cut from tracebacks.

import ast
import base64
import builtins
import io
import json
import linecache
import os
import select
import signal
import struct
import sys
import threading
import traceback
import types

KERNEL_FILE = sys._getframe().f_code.co_filename
MAX_VALUE_CHARS = 64 * 1024
MAX_PNG_BYTES = 4 * 1024 * 1024
MAX_FILES = 1000
MAX_TRACEBACK_LINES = 400
HEADER = struct.Struct(">cI")

# the real stdout becomes the protocol channel; fd 1 and 2 become pipes we read
proto = os.dup(1)
os.set_inheritable(proto, False)
out_r, out_w = os.pipe()
err_r, err_w = os.pipe()
os.dup2(out_w, 1)
os.dup2(err_w, 2)
os.close(out_w)
os.close(err_w)
os.set_blocking(out_r, False)
os.set_blocking(err_r, False)
proto_lock = threading.Lock()


def send(kind, payload):
    data = HEADER.pack(kind, len(payload)) + payload
    view = memoryview(data)
    while view:
        view = view[os.write(proto, view):]


def drain(fd, kind):
    """Frames whatever fd holds now; call with proto_lock held."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not chunk:
            return
        send(kind, chunk)


def only_main_gets_interrupts():
    # a process-directed SIGINT then goes to the main thread, waking it from a
    # blocking call (pthread_kill is no use: the fork's thread ids are the
    # fork-server's)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def forward():
    only_main_gets_interrupts()
    streams = {out_r: b"o", err_r: b"e"}
    while True:
        ready, _, _ = select.select(list(streams), [], [])
        with proto_lock:
            for fd in ready:
                drain(fd, streams[fd])


def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            os._exit(0)  # the server closed our stdin: the session is over
        data += chunk
    return data


requests = []
requests_ready = threading.Condition()
running = [False]


def receive():
    only_main_gets_interrupts()
    while True:
        kind, length = HEADER.unpack(read_exact(HEADER.size))
        payload = read_exact(length) if length else b""
        if kind == b"i":
            with requests_ready:
                if running[0]:
                    os.kill(os.getpid(), signal.SIGINT)
            continue
        with requests_ready:
            requests.append(payload)
            requests_ready.notify()


def snapshot():
    """{relative path: (mtime_ns, size)} of the regular files under /mnt/data."""
    seen = {}
    stack = [""]
    while stack and len(seen) < MAX_FILES * 10:
        rel = stack.pop()
        try:
            entries = list(os.scandir(os.path.join("/mnt/data", rel)))
        except OSError:
            continue
        for entry in entries:
            path = entry.name if not rel else rel + "/" + entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(path)
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    seen[path] = (st.st_mtime_ns, st.st_size)
            except OSError:
                continue
    return seen


def user_frames(tb):
    while tb is not None and tb.tb_frame.f_code.co_filename == KERNEL_FILE:
        tb = tb.tb_next
    return tb


def describe(exc):
    tb = user_frames(exc.__traceback__)
    if isinstance(exc, SyntaxError):
        lines = traceback.format_exception_only(type(exc), exc)
    else:
        lines = traceback.format_exception(type(exc), exc, tb)
    lines = [line for chunk in lines for line in chunk.rstrip("\n").split("\n")]
    if len(lines) > MAX_TRACEBACK_LINES:
        cut = len(lines) - MAX_TRACEBACK_LINES
        lines = lines[:50] + ["... %d lines cut ..." % cut] + lines[-(MAX_TRACEBACK_LINES - 50):]
    try:
        evalue = str(exc)
    except BaseException:
        evalue = "<str() failed>"
    return {
        "ename": type(exc).__name__,
        "evalue": evalue[:MAX_VALUE_CHARS],
        "traceback": [line[:4096] for line in lines],
    }


def ignore_interrupt(signum, frame):
    pass


user = types.ModuleType("__main__")
user.__dict__["__builtins__"] = builtins
sys.modules["__main__"] = user
cells = [0]


def evaluate(code):
    cells[0] += 1
    name = "<cell %d>" % cells[0]
    lines = code.splitlines(True)
    linecache.cache[name] = (len(code), None, lines, name)
    value = None
    error = None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with requests_ready:
            running[0] = True
        tree = ast.parse(code, name, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, name, "exec"), user.__dict__)
        if last is not None:
            value = eval(compile(last, name, "eval"), user.__dict__)
    except BaseException as exc:  # KeyboardInterrupt and SystemExit too: the kernel lives on
        error = describe(exc)
    finally:
        with requests_ready:
            running[0] = False
        signal.signal(signal.SIGINT, ignore_interrupt)
    return value, error


def figure_of(value):
    """The matplotlib figure `value` is (or whose axes it is), if any."""
    figure = sys.modules.get("matplotlib.figure")
    if figure is None:
        return None
    if isinstance(value, figure.Figure):
        return value
    axes = sys.modules.get("matplotlib.axes")
    if axes is not None and isinstance(value, axes.Axes):
        return value.figure
    return None


def png_of(value):
    """`value` as PNG bytes: a figure rendered (and closed), or its _repr_png_()."""
    fig = figure_of(value)
    if fig is not None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is not None:
            plt.close(fig)
        return buf.getvalue()
    # looked up on the type: an object answering every attribute is no image
    if getattr(type(value), "_repr_png_", None) is None:
        return None
    data = value._repr_png_()
    if isinstance(data, tuple) and data:
        data = data[0]  # (data, metadata), as IPython allows
    if isinstance(data, str):
        data = base64.b64decode(data)
    return data if isinstance(data, (bytes, bytearray)) else None


def reply_for(value, error, before):
    reply = {"error": error, "value": None, "png": None}
    if value is not None and error is None:
        builtins._ = value
        try:
            text = repr(value)
        except BaseException as exc:
            text = "<repr failed: %s>" % (describe(exc)["evalue"],)
        reply["value"] = text[:MAX_VALUE_CHARS]
        try:
            png = png_of(value)
        except BaseException as exc:
            png = None
            os.write(2, ("Kiln: the value could not be drawn: %s\n" % (describe(exc)["evalue"],)).encode())
        if png and len(png) <= MAX_PNG_BYTES:
            reply["png"] = base64.b64encode(png).decode("ascii")
    after = snapshot()
    files = [
        {"path": path, "size": meta[1]}
        for path, meta in sorted(after.items())
        if before.get(path) != meta
    ]
    reply["files"] = files[:MAX_FILES]
    return reply


def flush():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass


def main():
    signal.signal(signal.SIGINT, ignore_interrupt)
    threading.Thread(target=forward, name="kiln-output", daemon=True).start()
    threading.Thread(target=receive, name="kiln-requests", daemon=True).start()
    with proto_lock:
        send(b"r", json.dumps({"ready": True, "pid": os.getpid()}).encode())
    while True:
        with requests_ready:
            while not requests:
                requests_ready.wait()
            payload = requests.pop(0)
        try:
            code = json.loads(payload)["code"]
        except (ValueError, KeyError, TypeError) as exc:
            with proto_lock:
                send(b"r", json.dumps({"error": describe(exc), "value": None, "files": []}).encode())
            continue
        before = snapshot()
        value, error = evaluate(code)
        flush()
        reply = reply_for(value, error, before)
        value = None
        data = json.dumps(reply).encode()
        with proto_lock:
            drain(out_r, b"o")
            drain(err_r, b"e")
            send(b"r", data)


main()
