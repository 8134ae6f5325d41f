#!/usr/bin/env bash
# scripts/install-runtimes.sh — installs the language runtimes Kiln's jails execute.
#
# Owns: the list of Debian packages (and the few PyPI packages Debian 12 lacks) per runtime,
# installing only what is missing, the prebuilt matplotlib font cache the jails seed from, and
# printing one line per runtime with its version. Jails run the system binaries named in
# crates/kiln-core/src/lang.rs (/usr/bin/python3, /usr/bin/node, /usr/bin/gcc, ...) and see only
# the host's /usr (read-only), so everything lands under /usr, whatever else (pyenv, nvm, rustup)
# is on PATH.
#
# Usage: scripts/install-runtimes.sh [--with-npm] [--check]
#   --with-npm  also make sure `npm` exists (the e2e test's Node project needs it; not the jails)
#   --check     install nothing; list what is missing and exit 1 if anything is
# Idempotent and fast when everything is present: one dpkg-query call, one Python import check,
# no apt-get. A fresh Debian 12 takes a few minutes (about 1 GB of packages; see docs/languages.md).
# Needs root for installing (uses sudo when not root and sudo exists).
set -euo pipefail

# ---- what to install -------------------------------------------------------------------
# One entry per runtime: its Debian packages. To add a language, add it to LANGUAGES and
# give it a PACKAGES_<lang> list and a version_<lang> function below (and its entry in
# crates/kiln-core/src/lang.rs).
LANGUAGES=(py js ts c cpp java php rs go d f90 r bash)

# py: the interpreter plus the data stack LibreChat's models expect (plots need a font, and
# labels in Chinese, Japanese or Korean a CJK one: WenQuanYi Micro Hei, 5 MB, covers all three), and
# the shared libpython the fork-server embeds (warm py jails fork a preloaded interpreter).
PACKAGES_py=(
  python3 libpython3.11 python3-numpy python3-pandas python3-matplotlib python3-scipy python3-seaborn
  python3-sympy python3-sklearn python3-statsmodels python3-openpyxl python3-xlsxwriter
  python3-xlrd python3-docx python3-reportlab python3-pil python3-lxml python3-bs4
  python3-tabulate python3-requests python3-pip fonts-dejavu-core fonts-wqy-microhei
)
# ... and from PyPI what Debian 12 does not package, pinned (module name=requirement). pip puts
# it in /usr/local/lib/python3.11/dist-packages, which Debian's python3 searches.
PYPI_py=("pptx=python-pptx==1.0.2")
# js: the jail runs /usr/bin/node whatever its version (Debian 12 ships 18; NodeSource 20+ is fine).
PACKAGES_js=(nodejs)
# ts: esbuild strips the types (a static binary in Debian); node runs the result.
PACKAGES_ts=(esbuild nodejs)
PACKAGES_c=(gcc libc6-dev)
PACKAGES_cpp=(g++)
# java: javac + java 17; the JVM's size is set on its command line (see lang.rs).
PACKAGES_java=(openjdk-17-jdk-headless)
# php: the CLI plus the extensions scripts commonly use (ctype, iconv, ... come with php8.2-common).
PACKAGES_php=(php-cli php-mbstring php-xml php-bcmath)
PACKAGES_rs=(rustc)
PACKAGES_go=(golang-go)
# d: GDC (GCC's D front end) with Phobos.
PACKAGES_d=(gdc)
PACKAGES_f90=(gfortran)
# r: R (Debian's is built with Cairo: png() works with no X11) and the usual tidyverse pieces.
PACKAGES_r=(
  r-base-core r-cran-ggplot2 r-cran-dplyr r-cran-tidyr r-cran-readr r-cran-data.table
  r-cran-jsonlite r-cran-cairo
)
# bash: the shell plus what LibreChat runs in it (cat, sha256sum via coreutils; jq for bash PTC).
# (curl: the egress services are plain HTTP on $KILN_SERVICES_URL; ripgrep: the sandbox
# bridge's coding tools search with `rg`, see docs/bridge.md)
PACKAGES_bash=(bash coreutils jq curl ripgrep)
# Shared by all runtimes.
PACKAGES_common=(ca-certificates)
# Only with --with-npm. NodeSource's nodejs bundles npm and conflicts with Debian's npm
# package, so an existing `npm` command counts as present.
PACKAGES_npm=(npm)

# Where the prebuilt matplotlib font cache goes; the jail's sitecustomize.py copies it into
# each run's MPLCONFIGDIR (crates/kiln-core/src/lang/sitecustomize.py).
MPL_FONT_CACHE=/usr/local/share/kiln/matplotlib

first_line() { "$@" 2>&1 | head -n 1; }

version_py() {
  # Imports the core three (proves they load); the rest by installed metadata and module
  # location (importing all of them costs seconds).
  /usr/bin/python3 - <<'PY'
import importlib.metadata as md
import importlib.util
import platform
import sys
mods, ok = [], True
for name in ("numpy", "pandas", "matplotlib"):
    try:
        mods.append(f"{name} {__import__(name).__version__}")
    except Exception as e:  # report, never hide, a broken module
        mods.append(f"{name} MISSING ({type(e).__name__})")
        ok = False
for module, dist in (("scipy", "scipy"), ("sklearn", "scikit-learn"), ("openpyxl", "openpyxl"),
                     ("docx", "python-docx"), ("pptx", "python-pptx"), ("reportlab", "reportlab"),
                     ("PIL", "Pillow"), ("seaborn", "seaborn"), ("sympy", "sympy"),
                     ("statsmodels", "statsmodels")):
    try:
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(module)
        mods.append(f"{module} {md.version(dist)}")
    except Exception as e:
        mods.append(f"{module} MISSING ({type(e).__name__})")
        ok = False
print(f"Python {platform.python_version()} ({', '.join(mods)})")
sys.exit(0 if ok else 1)
PY
}
version_js() { echo "node $(/usr/bin/node --version)"; }
version_ts() { echo "esbuild $(/usr/bin/esbuild --version) on node $(/usr/bin/node --version)"; }
version_c() { first_line /usr/bin/gcc --version; }
version_cpp() { first_line /usr/bin/g++ --version; }
version_java() { echo "$(first_line /usr/bin/java --version), $(/usr/bin/javac --version 2>&1)"; }
version_php() {
  local v
  v=$(first_line /usr/bin/php --version)
  /usr/bin/php -r 'exit(extension_loaded("mbstring") && extension_loaded("dom") ? 0 : 1);' ||
    { echo "${v}: mbstring or dom extension not loaded"; return 1; }
  echo "$v"
}
version_rs() { first_line /usr/bin/rustc --version; }
version_go() { first_line /usr/bin/go version; }
version_d() { first_line /usr/bin/gdc --version; }
version_f90() { first_line /usr/bin/gfortran --version; }
version_r() {
  /usr/bin/Rscript -e 'stopifnot(capabilities("cairo")); v <- sapply(c("ggplot2", "dplyr", "tidyr", "readr", "data.table", "jsonlite"), function(p) as.character(packageVersion(p))); cat(R.version.string, "(cairo;", paste(names(v), v, collapse = ", "), ")\n")'
}
version_bash() {
  local b c j
  b=$(/bin/bash --version | head -n1)
  c=$(cat --version | head -n1)
  j=$(jq --version)
  echo "${b} (${c}, ${j})"
}

# ---- arguments ---------------------------------------------------------------------------
with_npm=0
check_only=0
for arg in "$@"; do
  case "$arg" in
    --with-npm) with_npm=1 ;;
    --check) check_only=1 ;;
    -h | --help)
      sed -n '2,17p' "$0"
      exit 0
      ;;
    *)
      echo "install-runtimes: unknown argument: $arg (see --help)" >&2
      exit 2
      ;;
  esac
done

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-runtimes: dpkg-query not found: this script installs Debian packages (Debian 12 or" >&2
  echo "a derivative); install the runtimes listed at the top of this script by hand." >&2
  exit 1
fi

wanted=("${PACKAGES_common[@]}")
for lang in "${LANGUAGES[@]}"; do
  list="PACKAGES_${lang}[@]"
  wanted+=("${!list}")
done

# ---- what is missing ---------------------------------------------------------------------
# One dpkg-query for everything; packages dpkg has never heard of print nothing.
declare -A installed=()
while read -r pkg status; do
  [[ "$status" == "install ok installed" ]] && installed["${pkg%%:*}"]=1
done < <(dpkg-query -W -f='${Package} ${Status}\n' "${wanted[@]}" 2>/dev/null || true)

missing=()
for pkg in "${wanted[@]}"; do
  [[ -n "${installed[$pkg]:-}" ]] || missing+=("$pkg")
done
if ((with_npm)) && ! command -v npm >/dev/null 2>&1; then
  missing+=("${PACKAGES_npm[@]}")
fi
# deduplicate (nodejs is wanted by js and ts), keeping the order
declare -A seen=()
unique=()
for pkg in "${missing[@]}"; do
  [[ -n "${seen[$pkg]:-}" ]] || unique+=("$pkg")
  seen[$pkg]=1
done
missing=("${unique[@]}")

# PyPI packages whose module does not import (checked once Debian's are in place).
pypi_missing() {
  local entry module
  [[ -x /usr/bin/python3 ]] || { printf '%s\n' "${PYPI_py[@]#*=}"; return; }
  for entry in "${PYPI_py[@]}"; do
    module=${entry%%=*}
    /usr/bin/python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$module') is None)" \
      2>/dev/null || printf '%s\n' "${entry#*=}"
  done
}
mapfile -t pip_missing < <(pypi_missing)
font_cache_missing=0
compgen -G "$MPL_FONT_CACHE/fontlist-*.json" >/dev/null || font_cache_missing=1
# a cache built before the CJK font was installed lacks it (kiln_plot.py falls back to it)
((font_cache_missing)) || grep -qs "WenQuanYi" "$MPL_FONT_CACHE"/fontlist-*.json || font_cache_missing=1

# ---- install -----------------------------------------------------------------------------
if ((${#missing[@]} + ${#pip_missing[@]} + font_cache_missing > 0)); then
  if ((check_only)); then
    ((${#missing[@]} == 0)) || echo "install-runtimes: missing Debian packages: ${missing[*]}" >&2
    ((${#pip_missing[@]} == 0)) || echo "install-runtimes: missing PyPI packages: ${pip_missing[*]}" >&2
    ((font_cache_missing == 0)) || echo "install-runtimes: missing matplotlib font cache in $MPL_FONT_CACHE" >&2
    exit 1
  fi
  as_root=()
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
      as_root=(sudo)
    else
      echo "install-runtimes: need root to install: ${missing[*]} ${pip_missing[*]}" >&2
      echo "  run this script as root, or install those packages with your package manager." >&2
      exit 1
    fi
  fi
fi
if ((${#missing[@]} > 0)); then
  echo "install-runtimes: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt_opts=(-o DPkg::Lock::Timeout=300 -o Dpkg::Use-Pty=0)
  # Slim images drop man pages, and openjdk's postinst fails without this directory.
  "${as_root[@]}" mkdir -p /usr/share/man/man1
  "${as_root[@]}" apt-get "${apt_opts[@]}" update -qq
  # -q prints a line per package downloaded and per package set up: shown as a running count
  # (every 25 and at the end), so a fresh machine's few minutes are not silent.
  "${as_root[@]}" apt-get "${apt_opts[@]}" install -y -q --no-install-recommends "${missing[@]}" 2>&1 |
    awk '
      function say(m) { printf "install-runtimes: %s\n", m; fflush() }
      / newly installed, / { total = $0; sub(/ newly installed.*/, "", total); sub(/.* /, "", total)
                             say(total " packages to install (the ones asked for and their dependencies)"); next }
      /^Get:[0-9]+ / { got++; if (got % 25 == 0) say("downloaded " got "/" total); next }
      /^Fetched / { say("downloaded " got " packages (" $2 " " $3 ")"); next }
      /^Setting up / { set++; if (set % 25 == 0) say("set up " set "/" total); next }
      /^(E|W|dpkg): |rror/ { print; fflush(); next }
      END { if (set) say("set up " set " packages") }' >&2
  # new packages may bring new fonts or a new matplotlib: rebuild the font cache
  font_cache_missing=1
  mapfile -t pip_missing < <(pypi_missing)
fi
if ((${#pip_missing[@]} > 0)); then
  echo "install-runtimes: installing from PyPI: ${pip_missing[*]}" >&2
  # Debian's pip installs into /usr/local/lib/python3.11/dist-packages as root; its
  # dependencies that Debian already provides (lxml, Pillow, XlsxWriter) are reused.
  "${as_root[@]}" /usr/bin/python3 -m pip install --quiet --break-system-packages \
    --root-user-action=ignore --no-warn-script-location --disable-pip-version-check \
    "${pip_missing[@]}"
fi
if ((font_cache_missing)); then
  "${as_root[@]}" rm -rf "$MPL_FONT_CACHE"
  "${as_root[@]}" mkdir -p "$MPL_FONT_CACHE"
  "${as_root[@]}" env MPLCONFIGDIR="$MPL_FONT_CACHE" /usr/bin/python3 -c 'import matplotlib.font_manager'
  "${as_root[@]}" chmod -R a+rX "$(dirname "$MPL_FONT_CACHE")"
fi

# ---- report ------------------------------------------------------------------------------
status=0
for lang in "${LANGUAGES[@]}"; do
  if line=$("version_${lang}" 2>&1); then
    printf 'runtime %-5s %s\n' "$lang" "$line"
  else
    printf 'runtime %-5s BROKEN: %s\n' "$lang" "${line//$'\n'/ }"
    status=1
  fi
done
if ((with_npm)); then
  printf 'tool    %-5s %s (node %s)\n' npm "$(npm --version)" "$(node --version)"
fi
exit "$status"
