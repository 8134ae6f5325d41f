#!/usr/bin/env bash
# scripts/install-runtimes.sh — installs the language runtimes Kiln's jails execute.
#
# Owns: the list of Debian packages per runtime, installing only what is missing, and
# printing one line per runtime with its version. Jails run the system binaries
# (/usr/bin/python3, /usr/bin/node, /bin/bash — see crates/kiln-core/src/lang.rs), so these
# come from Debian packages, whatever else (pyenv, nvm...) is on PATH.
#
# Usage: scripts/install-runtimes.sh [--with-npm] [--check]
#   --with-npm  also make sure `npm` exists (the e2e test's Node project needs it; not the jails)
#   --check     install nothing; list what is missing and exit 1 if anything is
# Idempotent and fast when everything is present: one dpkg-query call, no apt-get.
# Needs root for installing (uses sudo when not root and sudo exists).
set -euo pipefail

# ---- what to install -------------------------------------------------------------------
# One entry per runtime: its Debian packages. To add a language, add it to LANGUAGES and
# give it a PACKAGES_<lang> list and a version_<lang> function below.
LANGUAGES=(py js bash)

# py: the interpreter plus the data stack LibreChat's models expect (plots need a font).
PACKAGES_py=(python3 python3-numpy python3-pandas python3-matplotlib fonts-dejavu-core)
# js: the jail runs /usr/bin/node whatever its version (Debian 12 ships 18; NodeSource 20+ is fine).
PACKAGES_js=(nodejs)
# bash: the shell plus what LibreChat runs in it (cat, sha256sum via coreutils; jq for bash PTC).
PACKAGES_bash=(bash coreutils jq)
# Shared by all runtimes.
PACKAGES_common=(ca-certificates)
# Only with --with-npm. NodeSource's nodejs bundles npm and conflicts with Debian's npm
# package, so an existing `npm` command counts as present.
PACKAGES_npm=(npm)

version_py() {
  /usr/bin/python3 - <<'PY'
import platform
import sys
mods, ok = [], True
for name in ("numpy", "pandas", "matplotlib"):
    try:
        mods.append(f"{name} {__import__(name).__version__}")
    except Exception as e:  # report, never hide, a broken module
        mods.append(f"{name} MISSING ({type(e).__name__})")
        ok = False
print(f"Python {platform.python_version()} ({', '.join(mods)})")
sys.exit(0 if ok else 1)
PY
}
version_js() { echo "node $(/usr/bin/node --version)"; }
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
      sed -n '2,13p' "$0"
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
  echo "a derivative); install python3 (+numpy, pandas, matplotlib), nodejs, bash, coreutils, jq by hand." >&2
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

# ---- install -----------------------------------------------------------------------------
if ((${#missing[@]} > 0)); then
  if ((check_only)); then
    echo "install-runtimes: missing Debian packages: ${missing[*]}" >&2
    exit 1
  fi
  as_root=()
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
      as_root=(sudo)
    else
      echo "install-runtimes: need root to install: ${missing[*]}" >&2
      echo "  run this script as root, or install those packages with your package manager." >&2
      exit 1
    fi
  fi
  echo "install-runtimes: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt_opts=(-o DPkg::Lock::Timeout=300 -o Dpkg::Use-Pty=0)
  "${as_root[@]}" apt-get "${apt_opts[@]}" update -qq
  "${as_root[@]}" apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${missing[@]}"
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
