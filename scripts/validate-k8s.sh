#!/usr/bin/env bash
# scripts/validate-k8s.sh — render every kustomization under deploy/kubernetes/ and check it
# offline: no cluster, no network once the validator is installed.
#
# For each directory with a kustomization.yaml (the base and each overlay):
#   1. `kubectl kustomize DIR` renders it. Works with Debian 12's kubectl 1.20 (package
#      kubernetes-client, kustomize v2.0.3 inside) and with current kubectl (kustomize v5);
#   2. kubernetes-validate (PyPI) checks every rendered object against the Kubernetes API's
#      JSON schemas, strictly (an unknown field is an error), for each version in
#      KILN_K8S_VERSIONS (default "1.30.0 1.35.0": the oldest Kubernetes the docs claim, and a
#      recent one);
#   3. the manifests keep the promises docs/deploy.md makes: startup, readiness and liveness
#      probes on /v1/health, a grace period that covers Kiln's drain (preStop pause +
#      KILN_SHUTDOWN_GRACE_SECS + 10 s), an emptyDir data dir, a PodDisruptionBudget, one
#      replica in the base; the shared-storage overlay has several replicas, takes its
#      database URL, S3 settings and node secret from a Secret, advertises the pod IP (for
#      forwarding between pods) and counts rate limits in Postgres.
# Any failure fails the script (exit 1).
#
# kubernetes-validate is installed from PyPI into a directory of its own when missing
# ($KILN_K8S_TOOLS, default ~/.cache/kiln/k8s-validate: ~120 MB, mostly schemas, ~6 s once here; kept
# between runs), never into python3's site-packages, which the jails see. kubectl is not
# installed here: scripts/test.sh installs Debian's kubernetes-client when it is missing.
# Usage: scripts/validate-k8s.sh
set -euo pipefail
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

command -v kubectl >/dev/null || {
  echo "validate-k8s: kubectl not found (Debian: apt-get install kubernetes-client)" >&2
  exit 1
}
tools="${KILN_K8S_TOOLS:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/kiln/k8s-validate}"
if ! PYTHONPATH="$tools" python3 -c 'import kubernetes_validate' 2>/dev/null; then
  t0=$SECONDS
  mkdir -p "$tools"
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location --root-user-action=ignore \
    --target "$tools" "kubernetes-validate>=1.35,<2"
  echo "validate-k8s: kubernetes-validate installed in $tools in $((SECONDS - t0)) s"
fi
validate() { PYTHONPATH="$tools" python3 -m kubernetes_validate "$@"; }
echo "validate-k8s: $({ kubectl version --client --short 2>/dev/null || kubectl version --client 2>/dev/null; } | head -n1); kubernetes-validate $(validate --version 2>&1 | tail -n1)"

versions=${KILN_K8S_VERSIONS:-"1.30.0 1.35.0"}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail=0
n=0
while IFS= read -r k; do
  n=$((n + 1))
  dir=$(dirname "$k")
  name=${dir#deploy/kubernetes/}
  rendered="$out/${name//\//_}.yaml"
  # newer kustomize notes that `bases`/`patchesStrategicMerge` are deprecated; they are kept on
  # purpose (kubectl 1.20's kustomize knows nothing newer), so those notes are dropped
  if ! kubectl kustomize "$dir" >"$rendered" 2>"$out/err"; then
    cat "$out/err" >&2
    echo "validate-k8s: FAILED: kubectl kustomize $dir" >&2
    fail=1
    continue
  fi
  grep -v "^# Warning: '\(bases\|patchesStrategicMerge\)' is deprecated" "$out/err" >&2 || true
  for v in $versions; do
    if validate --strict --quiet -k "$v" "$rendered"; then
      echo "validate-k8s: ok: $name against Kubernetes $v ($(grep -c '^kind:' "$rendered") objects)"
    else
      echo "validate-k8s: FAILED: $name against Kubernetes $v (schema errors above)" >&2
      fail=1
    fi
  done
  if PYTHONPATH="$tools" python3 - "$rendered" "$name" <<'PY'; then
import sys, yaml
path, name = sys.argv[1], sys.argv[2]
docs = [d for d in yaml.safe_load_all(open(path)) if d]
kinds = {d["kind"]: d for d in docs}
problems = []
for want in ("Deployment", "Service", "ConfigMap", "PodDisruptionBudget"):
    if want not in kinds:
        problems.append(f"no {want}")
dep = kinds.get("Deployment", {})
pod = dep.get("spec", {}).get("template", {}).get("spec", {})
c = (pod.get("containers") or [{}])[0]
for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
    if c.get(probe, {}).get("httpGet", {}).get("path") != "/v1/health":
        problems.append(f"{probe} is not GET /v1/health")
cfg = kinds.get("ConfigMap", {}).get("data", {})
grace = int(cfg.get("KILN_SHUTDOWN_GRACE_SECS", "20"))
pause = 0
cmd = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
if cmd[:1] == ["sleep"]:
    pause = int(cmd[1])
need = pause + grace + 10
if pod.get("terminationGracePeriodSeconds", 30) < need:
    problems.append(f"terminationGracePeriodSeconds {pod.get('terminationGracePeriodSeconds', 30)} < {need} (preStop {pause} + drain {grace} + 10)")
data = [m for m in c.get("volumeMounts", []) if m.get("mountPath") == cfg.get("KILN_DATA_DIR")]
vols = {v["name"]: v for v in pod.get("volumes", [])}
if not data or "emptyDir" not in vols.get(data[0]["name"], {}):
    problems.append("the data dir is not an emptyDir")
env = {e["name"]: e for e in c.get("env", [])}
if name.startswith("overlays/shared-storage"):
    if dep.get("spec", {}).get("replicas", 1) < 2:
        problems.append("shared-storage runs fewer than 2 replicas")
    for key in ("KILN_DATABASE_URL", "KILN_S3_BUCKET", "KILN_S3_SECRET_ACCESS_KEY", "KILN_NODE_SECRET"):
        if "secretKeyRef" not in env.get(key, {}).get("valueFrom", {}):
            problems.append(f"{key} does not come from a Secret")
    if "$(POD_IP)" not in env.get("KILN_ADVERTISE_URL", {}).get("value", ""):
        problems.append("KILN_ADVERTISE_URL is not the pod IP (forwarding between pods)")
    if env.get("KILN_RATE_LIMIT_BACKEND", {}).get("value") != "postgres":
        problems.append("rate limits are not shared (KILN_RATE_LIMIT_BACKEND=postgres)")
elif dep.get("spec", {}).get("replicas", 1) != 1:
    problems.append("a store in the pod (no shared storage) with more than one replica")
for p in problems:
    print(f"validate-k8s: FAILED: {name}: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
    echo "validate-k8s: ok: $name keeps docs/deploy.md's promises"
  else
    fail=1
  fi
done < <(find deploy/kubernetes -name kustomization.yaml | sort)

if ((n == 0)); then
  echo "validate-k8s: FAILED: no kustomization under deploy/kubernetes" >&2
  exit 1
fi
if ((fail)); then
  echo "validate-k8s: FAILED" >&2
  exit 1
fi
echo "validate-k8s: passed ($n kustomizations)"
