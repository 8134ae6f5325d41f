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

_OUTPUT_DIR = os.getcwd()


_kiln_seed_font_cache()
_kiln_hook_pyplot(lambda: _OUTPUT_DIR)
