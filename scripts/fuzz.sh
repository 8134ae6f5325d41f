#!/usr/bin/env bash
# scripts/fuzz.sh — build Kiln's cargo-fuzz targets (fuzz/) and run each for a bounded time.
#
# Owns: finding a toolchain that can build the fuzzers (rustup's `nightly`; without it, the
# toolchain pinned in rust-toolchain.toml with RUSTC_BOOTSTRAP=1, which accepts the same
# unstable flags), installing cargo-fuzz from crates.io when it is missing, and running every
# target (or the ones named) for N seconds with libFuzzer's -max_total_time. Each run starts
# from the committed seeds in fuzz/corpus/<target> (read-only) plus a scratch corpus under the
# fuzz target dir that grows across runs; a failing input is saved under
# fuzz/artifacts/<target>/ (git-ignored) and fails the script.
# The same properties run on stable in `cargo test` (crates/kiln-core/tests/relpath_props.rs,
# crates/kiln-api/tests/fuzz_props.rs), from the shared code in fuzz/checks/.
#
# Usage: scripts/fuzz.sh [seconds-per-target] [target...]   (default: 60, every target)
# Env:   KILN_FUZZ_TARGET_DIR  cargo target dir of the fuzz build (default: fuzz/target)
#        KILN_FUZZ_SANITIZER   address (default) or none
# Exit:  0 every target ran clean; 1 a target failed or did not build; 2 no usable toolchain
#        or cargo-fuzz.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

seconds=${1:-60}
shift || true
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: scripts/fuzz.sh [seconds-per-target] [target...]" >&2
  exit 2
fi
all_targets=(relpath exec_body multipart)
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=("${all_targets[@]}")
fi
target_dir=${KILN_FUZZ_TARGET_DIR:-$repo_root/fuzz/target}
sanitizer=${KILN_FUZZ_SANITIZER:-address}

loud() {
  printf '\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n' >&2
  printf '!!! fuzz: %s\n' "$@" >&2
  printf '!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\n' >&2
}

# A toolchain that takes -Z flags: nightly if rustup has it, else the pinned one unlocked.
if rustup run nightly rustc --version >/dev/null 2>&1; then
  toolchain=nightly
else
  toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
  if [[ -z "$toolchain" ]] || ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
    loud "no nightly toolchain and no pinned toolchain ('$toolchain') to unlock: cannot build the fuzzers"
    exit 2
  fi
  loud "no nightly toolchain: building with $toolchain and RUSTC_BOOTSTRAP=1 instead"
  export RUSTC_BOOTSTRAP=1
fi
echo "fuzz: toolchain $(rustup run "$toolchain" rustc --version)"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: cargo-fuzz missing; installing it from crates.io"
  if ! cargo install cargo-fuzz --locked; then
    loud "cargo-fuzz could not be installed (cargo install cargo-fuzz --locked failed)"
    exit 2
  fi
fi
echo "fuzz: $(cargo fuzz --version)"

# The bundled SQLite amalgamation defines two function-local statics both named `aiOff`;
# ASan's one-definition-rule check reports them as a violation at startup. It is not one.
export ASAN_OPTIONS="detect_odr_violation=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"

fuzz=(cargo "+$toolchain" fuzz)
build_args=(--release --sanitizer "$sanitizer" --target-dir "$target_dir")
started=$SECONDS
echo "fuzz: building every target (sanitizer $sanitizer, target dir $target_dir)"
if ! "${fuzz[@]}" build "${build_args[@]}"; then
  loud "the fuzz targets do not build"
  exit 1
fi
echo "fuzz: built in $((SECONDS - started)) s"

failed=()
for t in "${targets[@]}"; do
  if [[ ! -d fuzz/corpus/$t ]]; then
    loud "unknown target '$t' (targets: ${all_targets[*]})"
    failed+=("$t")
    continue
  fi
  scratch="$target_dir/corpus/$t"
  mkdir -p "$scratch"
  echo "fuzz: $t for ${seconds}s"
  log=$(mktemp)
  if "${fuzz[@]}" run "${build_args[@]}" "$t" "$scratch" "fuzz/corpus/$t" -- \
    -max_total_time="$seconds" -timeout=20 -print_final_stats=1 >"$log" 2>&1; then
    # the last status line: executions, coverage, corpus size
    grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 | sed "s/^/fuzz: $t: /" || true
  else
    tail -60 "$log" >&2
    loud "$t FAILED; the input is under fuzz/artifacts/$t/"
    failed+=("$t")
  fi
  rm -f "$log"
done

# The multipart target's store lives in /dev/shm/kiln-fuzz-<pid>-* (else $TMPDIR); libFuzzer
# exits without destructors, so remove the stores of processes that are gone.
for d in /dev/shm/kiln-fuzz-* "${TMPDIR:-/tmp}"/kiln-fuzz-*; do
  [[ -d "$d" ]] || continue
  pid=${d##*/kiln-fuzz-}
  pid=${pid%%-*}
  if [[ "$pid" =~ ^[0-9]+$ && ! -d /proc/$pid ]]; then
    rm -rf "$d"
  fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
  loud "failing targets: ${failed[*]}"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${seconds}s each without a failure"
