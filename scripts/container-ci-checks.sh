#!/usr/bin/env bash
# scripts/container-ci-checks.sh — the part of the container proof that fits CI's time (seconds;
# `scripts/container-test.sh --ci` runs it, and scripts/test.sh under CI). The full proof (image
# built with podman, LibreChat's client against it, the compose example) is
# scripts/container-test.sh without --ci: it takes the better part of an hour here.
#
# Checks, each failing the run:
#   1. the Dockerfile keeps its promises: tini as PID 1 in front of the entrypoint, `kiln health`
#      as the health check, the runtime images in a volume of their own, and no runtime installed
#      into the container itself (jails run from the runtime image: docs/runtimes.md);
#   2. docker-compose.example.yml's kiln service asks for the documented narrow set: no
#      privileged mode, CAP_SYS_ADMIN as the only added capability, a private cgroup namespace,
#      `kiln health` as its health check, and a volume for the runtime images;
#   3. the entrypoint, run as root in a private mount namespace with a stand-in kiln binary,
#      remounts a read-only v1 `memory` cgroup mount read-write, leaves a read-only `devices`
#      mount read-only, runs `kiln runtime build` (the one build of the one recipe) before
#      `serve` and not before another command, and execs the binary with its arguments.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fail=0
check() { if "$@"; then echo "container-ci: ok: $*"; else echo "container-ci: FAILED: $*"; fail=1; fi; }

bash -n scripts/container-entrypoint.sh
bash -n scripts/container-test.sh

check grep -Eq '^ENTRYPOINT \["/usr/bin/tini", *"-s", *"--", *"/opt/kiln/entrypoint.sh"\]' Dockerfile
check grep -Eq '^ +CMD \["/opt/kiln/kiln", *"health"\]' Dockerfile
check grep -Eq '^VOLUME /var/lib/kiln/runtimes$' Dockerfile
check grep -Eq '^ +KILN_RUNTIME_DIR=/var/lib/kiln/runtimes$' Dockerfile
check bash -c '! grep -q install-runtimes Dockerfile'

python3 -c "import yaml" 2>/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-yaml >/dev/null
check python3 - <<'PY'
import sys, yaml
kiln = yaml.safe_load(open("docker-compose.example.yml"))["services"]["kiln"]
problems = []
if kiln.get("privileged"):
    problems.append("privileged")
if sorted(kiln.get("cap_add", [])) != ["SYS_ADMIN"]:
    problems.append(f"cap_add {kiln.get('cap_add')} is not the documented [SYS_ADMIN]")
if kiln.get("cgroup") != "private":
    problems.append("cgroup namespace not private")
if "kiln health" not in " ".join(kiln.get("healthcheck", {}).get("test", [])):
    problems.append("health check is not `kiln health`")
if not any(str(v).endswith(":/var/lib/kiln/runtimes") for v in kiln.get("volumes", [])):
    problems.append("no volume for the runtime images (/var/lib/kiln/runtimes)")
for p in problems:
    print("compose:", p)
sys.exit(1 if problems else 0)
PY

if [[ $(id -u) != 0 ]] || [[ ! -d /sys/fs/cgroup/memory || ! -d /sys/fs/cgroup/devices ]]; then
  if [[ -n "${CI:-}" && -d /sys/fs/cgroup/memory ]]; then
    echo "container-ci: FAILED: the entrypoint check needs root"; fail=1
  else
    echo "container-ci: entrypoint check not run (needs root and a cgroup v1 host with memory and devices)"
  fi
else
  out=$(unshare --mount --propagation private bash -euc '
    mount -o remount,ro,bind /sys/fs/cgroup/memory
    mount -o remount,ro,bind /sys/fs/cgroup/devices
    stand_in=$(mktemp -d)
    printf "#!/bin/bash\necho ARGS \"\$*\"\nawk \"\\\$2 ~ /^\\/sys\\/fs\\/cgroup\\/(memory|devices)\\$/ {print \\\$2, substr(\\\$4,1,2)}\" /proc/self/mounts\n" > "$stand_in/kiln"
    chmod +x "$stand_in/kiln"
    mkdir -p /opt/kiln
    mount --bind "$stand_in" /opt/kiln
    scripts/container-entrypoint.sh serve --listen 0.0.0.0:8000 2>&1
    echo "-- doctor"
    scripts/container-entrypoint.sh doctor 2>&1
    rm -rf "$stand_in"
  ' 2>&1) || true
  echo "$out" | sed 's/^/  entrypoint: /'
  check grep -q "^ARGS serve --listen 0.0.0.0:8000$" <<<"$out"
  # serve: the image build first, then serve; doctor: no build
  args=$(grep -E "^(ARGS|-- )" <<<"$out" | tr '\n' '|')
  check test "$args" = "ARGS runtime build|ARGS serve --listen 0.0.0.0:8000|-- doctor|ARGS doctor|"
  check grep -q "^/sys/fs/cgroup/memory rw$" <<<"$out"
  check grep -q "^/sys/fs/cgroup/devices ro$" <<<"$out"
fi
exit $fail
