#!/usr/bin/env bash
# scripts/serve.sh — the README's first command: start Kiln from a checkout.
#
# Owns: building the web console's editor bundle when npm is there (scripts/build-console.sh),
# building Kiln in release mode (the first build takes tens of minutes, and it says so first),
# building the default runtime image the jails run from (`kiln runtime build`, with its
# progress; found built in well under a second later), then running `kiln serve`. With
# KILN_RUNTIME_IMAGE=host (jails on the host's /usr: development, or a host where no image can
# be built) it installs the missing runtimes on the host instead (root, or sudo); with another
# image id or path it builds nothing. Arguments go to `kiln serve`
# (e.g. scripts/serve.sh --listen 0.0.0.0:8000 --data-dir /var/lib/kiln).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

image=${KILN_RUNTIME_IMAGE:-default}
# on a runtime image the jails need nothing of the host's /usr
if [[ "$image" == host ]] && ! scripts/install-runtimes.sh; then
  echo "serve: could not install every runtime (see above); starting anyway —" >&2
  echo "       languages whose runtime is missing will be unavailable (check: kiln doctor)." >&2
fi
# the console's CodeMirror editor (npm + esbuild); without npm the console uses a textarea
scripts/build-console.sh || echo "serve: the console's editor bundle was not built; the console uses a textarea" >&2
# the first release build compiles every dependency with optimisations: say so before the wait
target_dir=${CARGO_TARGET_DIR:-$repo_root/target}
if [[ ! -x "$target_dir/release/kiln" ]]; then
  echo "serve: building Kiln in release mode for the first time; this takes tens of minutes on a" >&2
  echo "       small machine (later starts reuse the build)." >&2
fi
# Jails run from the default runtime image (docs/runtimes.md): built here by the same
# `kiln runtime build` as test.sh and the container use, with its progress on the terminal
# (about 15 minutes the first time; later starts find it built). `kiln serve` itself refuses
# to start without it, naming this command.
if [[ "$image" == default ]]; then
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
  cargo run --release --locked -p kiln -- runtime build >/dev/null
fi
exec cargo run --release --locked -p kiln -- serve "$@"
