# Kiln: the one plt.show() hook of `py` runs, cold and warm.
#
# Prepended (by the language table, at compile time) to the cold runs'
# sitecustomize.py and to the warm fork-server's template, so both define the
# same two functions from the same text:
# - _kiln_patch_pyplot(plt, output_dir): makes plt.show() save every open
#   figure as plot_<n>.png in output_dir() (the directory the program started
#   in, /mnt/data), then close it, so a plot comes back as a file instead of
#   needing a display. The Agg backend comes from MPLBACKEND=Agg.
# - _kiln_seed_font_cache(): copies the font cache scripts/install-runtimes.sh
#   builds into MPLCONFIGDIR (a fresh /tmp in every jail), which saves
#   matplotlib's font scan (about a second) on every plotting run.


def _kiln_patch_pyplot(plt, output_dir):
    """Make plt.show() save each open figure as plot_<n>.png in output_dir()."""
    import os

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
