# Kiln: staged as /mnt/data/.kiln/python/sitecustomize.py for cold `py` runs
# (PYTHONPATH), after kiln_plot.py (the hook shared with warm runs).
#
# Applies kiln_plot's plt.show() patch lazily, when the program itself imports
# matplotlib.pyplot (directly or through seaborn, pandas.plot, ...): code that
# never plots pays for one tiny meta-path finder and nothing else. Seeds
# matplotlib's font cache first.
#
# This shadows Debian's sitecustomize.py, which only installs apport's crash
# hook (not present in a jail).
import os
import sys

_OUTPUT_DIR = os.getcwd()


def _patch_pyplot(plt):
    _kiln_patch_pyplot(plt, lambda: _OUTPUT_DIR)


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


_kiln_seed_font_cache()
sys.meta_path.insert(0, _PyplotFinder)
