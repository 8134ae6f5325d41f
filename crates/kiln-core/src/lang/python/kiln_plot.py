# Kiln: the one plt.show() hook of `py` runs, cold and warm.
#
# Prepended (by the language table, at compile time) to the cold runs'
# sitecustomize.py and to the warm fork-server's template, so both define the
# same two functions from the same text:
# - _kiln_patch_pyplot(plt, output_dir): makes plt.show() save every open
#   figure as plot_<n>.png in output_dir() (the directory the program started
#   in, /mnt/data), then close it, so a plot comes back as a file instead of
#   needing a display. The Agg backend comes from MPLBACKEND=Agg.
#   It also makes matplotlib fall back to a CJK font (cjk_fallback) for
#   glyphs the plot's own fonts lack, whatever font.family a style sets.
# - _kiln_hook_pyplot(output_dir): applies that patch lazily, when the program
#   imports matplotlib.pyplot (directly or through seaborn, pandas.plot, ...),
#   and seeds the font cache when it imports matplotlib: a meta-path finder,
#   installed by cold runs' sitecustomize.py and by a warm template that did
#   not preload pyplot.
# - _kiln_seed_font_cache(): copies the font cache scripts/install-runtimes.sh
#   builds into MPLCONFIGDIR (a fresh /tmp in every jail), which saves
#   matplotlib's font scan (about a second) on every plotting run.


def _kiln_patch_pyplot(plt, output_dir):
    """Make plt.show() save each open figure as plot_<n>.png in output_dir()."""
    import os
    import sys

    def next_plot_path():
        n = 1
        while True:
            path = os.path.join(output_dir(), "plot_%d.png" % n)
            if not os.path.lexists(path):
                return path
            n += 1

    def show(*args, **kwargs):
        """Kiln: save each open figure as plot_<n>.png in /mnt/data, then close it."""
        for num in plt.get_fignums():
            plt.figure(num).savefig(next_plot_path())
        plt.close("all")

    show.__wrapped__ = plt.show
    plt.show = show

    def cjk_fallback(font_manager, families=("WenQuanYi Micro Hei", "Noto Sans CJK JP")):
        """Append a CJK font (scripts/install-runtimes.sh installs one) to every list of fonts
        matplotlib draws text with: Chinese, Japanese and Korean labels get real glyphs instead of
        boxes, and nothing else changes (each glyph comes from the first font that has it)."""
        cls = font_manager.FontManager
        original = getattr(cls, "_find_fonts_by_props", None)  # matplotlib >= 3.6
        if original is None or getattr(original, "_kiln_cjk", False):
            return
        found = []

        def find_fonts(self, prop, *args, **kwargs):
            paths = original(self, prop, *args, **kwargs)
            if not found:
                path = None
                for family in families:
                    try:
                        path = self.findfont(
                            font_manager.FontProperties(family=family), fallback_to_default=False
                        )
                        break
                    except Exception:
                        pass
                found.append(path)
            if found[0] and found[0] not in paths:
                paths = list(paths) + [found[0]]
            return paths

        find_fonts._kiln_cjk = True
        find_fonts.__wrapped__ = original
        cls._find_fonts_by_props = find_fonts

    font_manager = sys.modules.get("matplotlib.font_manager")
    if font_manager is not None:
        cjk_fallback(font_manager)


def _kiln_seed_font_cache(font_cache="/usr/local/share/kiln/matplotlib"):
    """Copy the prebuilt fontlist-*.json into MPLCONFIGDIR (saves the font scan)."""
    import os

    target = os.environ.get("MPLCONFIGDIR")
    if not target:
        return
    try:
        names = [n for n in os.listdir(font_cache) if n.startswith("fontlist-")]
        if not names:
            return
        os.makedirs(target, exist_ok=True)
        for name in names:
            dest = os.path.join(target, name)
            if not os.path.exists(dest):
                with open(os.path.join(font_cache, name), "rb") as src:
                    with open(dest, "wb") as out:
                        out.write(src.read())
    except OSError:
        pass  # no prebuilt cache: matplotlib builds its own


def _kiln_hook_pyplot(output_dir):
    """Seed the font cache when matplotlib is imported and patch pyplot when it is."""
    import sys

    # bound now: the warm template deletes these module-level names after its preload
    patch, seed_font_cache = _kiln_patch_pyplot, _kiln_seed_font_cache

    class _PatchingLoader:
        """Runs the real loader, then patches the freshly executed module."""

        def __init__(self, loader):
            self._loader = loader

        def create_module(self, spec):
            return self._loader.create_module(spec)

        def exec_module(self, module):
            self._loader.exec_module(module)
            patch(module, output_dir)

        def __getattr__(self, name):
            return getattr(self._loader, name)

    class _PyplotFinder:
        """Meta-path finder that only ever answers for matplotlib.pyplot."""

        @classmethod
        def find_spec(cls, fullname, path=None, target=None):
            if fullname == "matplotlib":
                seed_font_cache()
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

    sys.meta_path.insert(0, _PyplotFinder)
