#!/usr/bin/env bash
# Builds the web console's code editor: CodeMirror 6 from npm (versions
# pinned by console/package-lock.json), bundled by esbuild into
# console/dist/editor.js, which kiln-api embeds at cargo build time
# (crates/kiln-api/build.rs). Without npm, or when the install fails, the
# console still works with a plain <textarea>: this script then says so and
# exits 0, unless KILN_CONSOLE_EDITOR_REQUIRED=1 (CI), where it fails.
set -euo pipefail
cd "$(dirname "$0")/../console"

need() {
  if [[ "${KILN_CONSOLE_EDITOR_REQUIRED:-0}" == 1 ]]; then
    echo "build-console: $1" >&2
    exit 1
  fi
  echo "build-console: $1; the console will use a plain textarea" >&2
  exit 0
}

command -v npm >/dev/null || need "npm not found (scripts/install-runtimes.sh --with-npm installs it)"
if [[ dist/editor.js -nt package-lock.json && dist/editor.js -nt src/editor.js ]]; then
  echo "build-console: dist/editor.js is up to date"
  exit 0
fi
start=$(date +%s)
if [[ ! -d node_modules || package-lock.json -nt node_modules ]]; then
  echo "build-console: npm ci (CodeMirror 6 + esbuild, pinned by package-lock.json)..."
  npm ci --no-audit --no-fund --loglevel=error || need "npm ci failed"
fi
echo "build-console: bundling src/editor.js..."
npm run --silent build || need "esbuild failed"
echo "build-console: dist/editor.js ($(du -k dist/editor.js | cut -f1) KiB) in $(( $(date +%s) - start )) s"
