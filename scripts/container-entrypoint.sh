#!/bin/bash
# scripts/container-entrypoint.sh — the Kiln image's entrypoint (tini runs it as its child).
#
# Owns the two container-only steps before `exec /opt/kiln/kiln "$@"`. First: container runtimes
# mount the cgroup filesystem read-only unless the container is privileged, and Kiln's sandbox cannot limit
# a run's memory and processes without writing cgroups. A container given CAP_SYS_ADMIN (the
# narrow privilege set of docs/container.md) may remount its own cgroup mounts read-write: they
# show only the container's own cgroup subtree. Only the controllers Kiln limits runs with are
# remounted (cgroup v1: memory, pids, cpu, cpuacct; cgroup v2: its one hierarchy) — never the
# v1 `devices` controller, whose writable root would let the container widen its own device
# access. Each remount is logged; where it is refused, Kiln starts anyway, and its own check
# refuses an unenforceable sandbox with a clear message. KILN_CGROUP_REMOUNT=off skips the step.
# Second, before `serve` on the default runtime image (KILN_RUNTIME_IMAGE unset or `default`):
# `kiln runtime build`, the one build of the one recipe (docs/runtimes.md), into the runtime
# volume: the first start builds it (about 15 minutes, its progress in the log), later ones find
# it at once. A failed build stops the container with the build's own message.
set -uo pipefail

if [[ "${KILN_CGROUP_REMOUNT:-auto}" != off ]]; then
  # /proc/self/mountinfo: ... <mount point> <mount options> ... - <fs type> <source> <super options>
  while read -r _ _ _ _ point opts rest; do
    # optional fields may precede the " - " separator, or not
    fstype=" $rest"
    fstype=${fstype#* - }
    fstype=${fstype%% *}
    [[ "$fstype" == cgroup || "$fstype" == cgroup2 ]] || continue
    [[ "$point" == /sys/fs/cgroup || "$point" == /sys/fs/cgroup/* ]] || continue
    [[ ",$opts," == *,ro,* ]] || continue
    if [[ "$fstype" == cgroup ]]; then
      # v1: one mount per controller (or co-mounted ones, named after them)
      wanted=0
      IFS=, read -ra controllers <<<"${point##*/}"
      for c in "${controllers[@]}"; do
        case "$c" in
          memory | pids | cpu | cpuacct) wanted=1 ;;
          *) wanted=0; break ;;
        esac
      done
      ((wanted)) || continue
    fi
    if mount -o remount,rw,bind "$point" 2>/dev/null; then
      echo "kiln-entrypoint: made $point writable (the container's own cgroups, for per-run limits)" >&2
    else
      echo "kiln-entrypoint: $point is read-only and cannot be remounted (no CAP_SYS_ADMIN?)" >&2
    fi
  done </proc/self/mountinfo
fi
if [[ "${1:-}" == serve && "${KILN_RUNTIME_IMAGE:-default}" == default ]]; then
  # stdout (the image's path) joins the log too: nothing else reads it
  if ! /opt/kiln/kiln runtime build >&2; then
    echo "kiln-entrypoint: the runtime image could not be built (above); not serving" >&2
    exit 1
  fi
fi
exec /opt/kiln/kiln "$@"
