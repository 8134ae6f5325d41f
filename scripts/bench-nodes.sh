#!/usr/bin/env bash
# Benchmark several Kiln nodes behind HAProxy next to one node, on this machine
# (BENCHMARKS.md, "Several nodes"). Starts a throwaway Postgres cluster (initdb, as nobody
# when run as root), moto's S3 server, NODES `kiln serve` processes on them and HAProxy
# (round-robin) in front, then runs kiln-bench with --url against the balancer and against
# the first node alone; everything is stopped on exit.
#
#   scripts/bench-nodes.sh [--nodes 3] [--kiln target/debug/kiln] [--bench target/debug/kiln-bench] \
#     [--env KEY=VALUE]... -- [kiln-bench arguments, e.g. --scenarios D --runs 2]
#
# Needs: postgresql (initdb, postgres, psql), python3 with moto[server] (or KILN_MOTO_PYTHONPATH),
# haproxy — what scripts/test.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."

nodes=3
kiln=target/debug/kiln
bench=target/debug/kiln-bench
extra_env=()
while (($#)); do
  case "$1" in
    --nodes) nodes=$2; shift 2 ;;
    --kiln) kiln=$2; shift 2 ;;
    --bench) bench=$2; shift 2 ;;
    --env) extra_env+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
bench_args=("$@")

work=$(mktemp -d /tmp/kiln-bench-nodes.XXXXXX)
chmod 755 "$work"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() {
  for _ in $(seq 1 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on $1" >&2; return 1
}

# Postgres
pgbin=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
as=()
if [[ $(id -u) -eq 0 ]]; then chown nobody:nogroup "$work"; as=(setpriv --reuid=65534 --regid=65534 --clear-groups); fi
"${as[@]}" "$pgbin/initdb" -D "$work/pg" -U kiln --auth=trust -E UTF8 --locale=C.UTF-8 --no-sync >/dev/null
pg_port=$(free_port)
"${as[@]}" "$pgbin/postgres" -D "$work/pg" -p "$pg_port" -c listen_addresses=127.0.0.1 \
  -c unix_socket_directories='' -c max_connections=200 \
  -c shared_preload_libraries=pg_stat_statements >"$work/pg.log" 2>&1 &
pids+=($!)
wait_port "$pg_port"
for _ in $(seq 1 50); do psql -h 127.0.0.1 -p "$pg_port" -U kiln -d postgres -qc 'CREATE DATABASE bench' 2>/dev/null && break; sleep 0.2; done
psql -h 127.0.0.1 -p "$pg_port" -U kiln -d bench -qc 'CREATE EXTENSION pg_stat_statements'

# S3
s3_port=$(free_port)
PYTHONPATH="${KILN_MOTO_PYTHONPATH:-}" python3 -m moto.server -H 127.0.0.1 -p "$s3_port" >"$work/moto.log" 2>&1 &
pids+=($!)
wait_port "$s3_port"
curl -fsS -X PUT "http://127.0.0.1:$s3_port/bench" >/dev/null

shared_env=(
  KILN_DATABASE_URL="postgres://kiln@127.0.0.1:$pg_port/bench"
  KILN_S3_BUCKET=bench KILN_S3_ENDPOINT="http://127.0.0.1:$s3_port" KILN_S3_REGION=us-east-1
  KILN_S3_PATH_STYLE=true KILN_S3_ACCESS_KEY_ID=bench KILN_S3_SECRET_ACCESS_KEY=bench
  KILN_NODE_SECRET=bench-node-secret-0123456789 KILN_RATE_LIMIT_BACKEND=postgres
  KILN_AUDIT_LOG=off
)

ports=()
node_pids=()
for i in $(seq 1 "$nodes"); do
  port=$(free_port)
  ports+=("$port")
  mkdir -p "$work/n$i"
  env "${shared_env[@]}" "${extra_env[@]}" KILN_LISTEN="127.0.0.1:$port" KILN_DATA_DIR="$work/n$i" \
    KILN_NODE_ID="n$i" KILN_ADVERTISE_URL="http://127.0.0.1:$port" \
    KILN_UID_BASE=$((300000000 + i * 40000000)) \
    "$kiln" serve >"$work/n$i.log" 2>&1 &
  pids+=($!)
  node_pids+=($!)
done
for p in "${ports[@]}"; do
  for _ in $(seq 1 600); do curl -fsS "http://127.0.0.1:$p/v1/health" >/dev/null 2>&1 && break; sleep 0.2; done
done

lb_port=$(free_port)
{
  printf 'global\n  maxconn 1024\ndefaults\n  mode http\n  timeout connect 2s\n  timeout client 300s\n  timeout server 300s\n'
  printf '  retries 2\n  option redispatch 1\nfrontend kiln\n  bind 127.0.0.1:%s\n  default_backend nodes\n' "$lb_port"
  printf 'backend nodes\n  balance roundrobin\n  option httpchk GET /v1/health\n  http-check expect status 200\n'
  for i in $(seq 1 "$nodes"); do printf '  server n%s 127.0.0.1:%s check inter 1s\n' "$i" "${ports[$((i - 1))]}"; done
} >"$work/haproxy.cfg"
haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
pids+=($!)
wait_port "$lb_port"
sleep 5 # the fork-servers' preload

echo "== $nodes nodes behind HAProxy (http://127.0.0.1:$lb_port)"
"$bench" --url "http://127.0.0.1:$lb_port" --out "$work/../bench-nodes-$nodes.json" "${bench_args[@]}"
# the other nodes stop (drain, leave): one node on the same Postgres and bucket
for p in "${node_pids[@]:1}"; do kill -TERM "$p"; done
for p in "${node_pids[@]:1}"; do wait "$p" || true; done
echo "== node n1 alone (http://127.0.0.1:${ports[0]})"
"$bench" --url "http://127.0.0.1:${ports[0]}" --out "$work/../bench-nodes-1.json" "${bench_args[@]}"

# what each statement cost the database over both runs (server time, without the round trip)
echo "== Postgres statements (pg_stat_statements, over both measurements)"
psql -h 127.0.0.1 -p "$pg_port" -U kiln -d bench -P pager=off -c "
  SELECT calls, round(mean_exec_time::numeric, 3) AS mean_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 90) AS statement
  FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = 'bench') AND calls > 20
  ORDER BY calls DESC LIMIT 15"
