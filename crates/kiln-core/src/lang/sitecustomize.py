# Kiln: staged as /mnt/data/.kiln/python/sitecustomize.py for `py` runs (PYTHONPATH).
#
# Makes `matplotlib.pyplot.show()` save every open figure as plot_<n>.png in
# /mnt/data, so a plot comes back as a file instead of needing a display. The
# patch is applied lazily, when the program itself imports matplotlib.pyplot
# (directly or through seaborn, pandas.plot, ...): code that never plots pays
# for one tiny meta-path finder and nothing else. The Agg backend comes from
# MPLBACKEND=Agg in the jail's environment.
#
# It also seeds matplotlib's font cache (MPLCONFIGDIR, a fresh /tmp in every
# jail) from the one scripts/install-runtimes.sh builds, which saves the
# font scan (about a second) on every plotting run.
#
# This shadows Debian's sitecustomize.py, which only installs apport's crash
# hook (not present in a jail).
import os
import sys

_OUTPUT_DIR = os.getcwd()
_FONT_CACHE = "/usr/local/share/kiln/matplotlib"


def _seed_font_cache():
    target = os.environ.get("MPLCONFIGDIR")
    if not target:
        return
    try:
        names = [n for n in os.listdir(_FONT_CACHE) if n.startswith("fontlist-")]
        if not names:
            return
        os.makedirs(target, exist_ok=True)
        for name in names:
            dest = os.path.join(target, name)
            if not os.path.exists(dest):
                with open(os.path.join(_FONT_CACHE, name), "rb") as src, open(dest, "wb") as out:
                    out.write(src.read())
    except OSError:
        pass  # no prebuilt cache: matplotlib builds its own


def _next_plot_path():
    n = 1
    while True:
        path = os.path.join(_OUTPUT_DIR, "plot_%d.png" % n)
        if not os.path.lexists(path):
            return path
        n += 1


def _patch_pyplot(plt):
    def show(*args, **kwargs):
        """Kiln: save each open figure as plot_<n>.png in /mnt/data, then close it."""
        for num in plt.get_fignums():
            plt.figure(num).savefig(_next_plot_path())
        plt.close("all")

    show.__wrapped__ = plt.show
    plt.show = show


class _PatchingLoader:
    """Runs the real loader, then patches the freshly executed module."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch_pyplot(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _PyplotFinder:
    """Meta-path finder that only ever answers for matplotlib.pyplot."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname != "matplotlib.pyplot":
            return None
        for finder in sys.meta_path:
            if finder is cls:
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


_seed_font_cache()
sys.meta_path.insert(0, _PyplotFinder)
