#!/usr/bin/env bash
# Builds the web console's code editor: CodeMirror 6 from npm (versions
# pinned by console/package-lock.json), bundled by esbuild into
# console/dist/editor.js, and copies Swagger UI's prebuilt bundle and
# stylesheet (npm's swagger-ui-dist) to console/dist/swagger-ui.{js,css} for
# the API reference page; kiln-api embeds them at cargo build time
# (crates/kiln-api/build.rs). Without npm, or when the install fails, the
# console still works with a plain <textarea> (and the API reference page
# says it was not built): this script then says so and exits 0, unless
# KILN_CONSOLE_EDITOR_REQUIRED=1 (CI), where it fails.
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
if [[ dist/editor.js -nt package-lock.json && dist/editor.js -nt src/editor.js \
      && dist/swagger-ui.js -nt package-lock.json && -s dist/swagger-ui.css ]]; then
  echo "build-console: dist/editor.js is up to date"
  exit 0
fi
start=$(date +%s)
if [[ ! -d node_modules || package-lock.json -nt node_modules ]]; then
  echo "build-console: npm ci (CodeMirror 6 + esbuild, pinned by package-lock.json)..."
  # no install scripts: esbuild works without its own (its binary is an
  # optional dependency), and swagger-ui-dist's dependency @scarf/scarf
  # would only report the install to its vendor
  npm ci --no-audit --no-fund --ignore-scripts --loglevel=error || need "npm ci failed"
fi
echo "build-console: bundling src/editor.js..."
npm run --silent build || need "esbuild failed"
cp node_modules/swagger-ui-dist/swagger-ui-bundle.js dist/swagger-ui.js || need "swagger-ui-dist missing"
cp node_modules/swagger-ui-dist/swagger-ui.css dist/swagger-ui.css || need "swagger-ui-dist missing"
echo "build-console: dist/editor.js ($(du -k dist/editor.js | cut -f1) KiB), dist/swagger-ui.js ($(du -k dist/swagger-ui.js | cut -f1) KiB) in $(( $(date +%s) - start )) s"
