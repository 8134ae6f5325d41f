#!/usr/bin/env bash
# scripts/bench.sh — the one command that benchmarks Kiln.
#
# Owns: building the release `kiln` and `kiln-bench` binaries and running the benchmark
# suite (crates/kiln-bench) against them. All arguments go to kiln-bench, e.g.
#   scripts/bench.sh                     # full run (scenarios A–E, 3 runs each)
#   scripts/bench.sh --quick             # smoke configuration (seconds, CI)
#   scripts/bench.sh --scenarios A,C --runs 5
#   scripts/bench.sh --help
# Prints a markdown table on stdout and writes bench-results/<UTC timestamp>.json.
# Needs root (the server's sandbox uses namespaces and cgroups) and the runtime image the server
# runs on (`kiln runtime build`): the baselines spawn that image's /usr/bin/python3 and
# /usr/bin/node in a chroot of it. With KILN_RUNTIME_IMAGE=host passed to the server
# (--server-env), the host's, from scripts/install-runtimes.sh.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --locked -p kiln -p kiln-bench
target_dir="${CARGO_TARGET_DIR:-target}"
export KILN_BENCH_KILN="${KILN_BENCH_KILN:-${target_dir}/release/kiln}"
exec "${target_dir}/release/kiln-bench" "$@"
