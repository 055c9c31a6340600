#!/usr/bin/env bash
# Measures whole `fence` invocations against their floor and their peers, side by side on one
# machine:
#   - `fence acquire` + `fence release` vs the minimal tokio-postgres program
#     (examples/pg_floor.rs) doing the same two statements vs two `psql -c`;
#   - one `fence acquire` (a reacquire: one UPDATE) vs the floor doing the same;
#   - `fence write` (a fenced transaction) vs the same transaction unfenced;
#   - `fence run R -- true` vs `flock /tmp/x true` (embedded store) and on PostgreSQL;
#   - the WAL written by 1,000 refused acquires (should be 0);
#   - `fence bench` on one hot resource (64 workers) vs a pg_advisory_lock loop (pgbench),
#     and hand-off latency with --wait-style blocking.
#   - `fence run R -- true` (PostgreSQL) vs `etcdctl lock R -- true` on a throwaway etcd
#     (Debian packages etcd-server, etcd-client);
#   - acquire p50 with 100 and with 1,000,000 prefilled resources (`fence bench --prefill`).
# Runs inside a throwaway cluster from pg_virtualenv (works as root); installs hyperfine,
# etcd-server and etcd-client with apt-get when they are missing. All clients use sslmode=disable so the comparison is like for
# like; one extra line shows fence with the default sslmode=prefer (TLS on loopback).
#
# Usage: benches/compare.sh [RUNS]      (default 200 runs per command)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs=${1:-200}

if [[ -z ${FENCE_BENCH_INSIDE:-} ]]; then
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/fence-target}"
    # What the comparison needs beyond the test suite's packages (Debian names).
    missing=()
    command -v hyperfine >/dev/null || missing+=(hyperfine)
    command -v etcd >/dev/null || missing+=(etcd-server)
    command -v etcdctl >/dev/null || missing+=(etcd-client)
    command -v pg_virtualenv >/dev/null || missing+=(postgresql-common)
    command -v pgbench >/dev/null || missing+=(postgresql-contrib)
    if ((${#missing[@]})); then
        echo "benches/compare.sh: installing ${missing[*]}" >&2
        sudo=()
        ((EUID == 0)) || sudo=(sudo)
        "${sudo[@]}" apt-get update -qq
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null ||
            { echo "benches/compare.sh: could not install ${missing[*]}; install them and run again" >&2; exit 2; }
    fi
    cargo build --quiet --release --bin fence --example pg_floor
    FENCE_BENCH_INSIDE=1 exec pg_virtualenv "$0" "$runs"
fi

bin="$CARGO_TARGET_DIR/release"
url="postgresql://$PGUSER:$PGPASSWORD@$PGHOST:$PGPORT/$PGDATABASE"
plain="$url?sslmode=disable"
fence="$bin/fence --store $plain"
floor="$bin/examples/pg_floor $plain"
$fence init -q

echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -r), PostgreSQL $(psql -Atc 'show server_version'), TCP loopback"
out=$(mktemp -d)
hyperfine --warmup 20 --runs "$runs" --export-json "$out/pair.json" --style basic \
    -n "fence acquire + release" "eval \"\$($fence acquire pair-a --owner o --format env)\" && $fence release" \
    -n "tokio-postgres floor (2 processes)" "t=\$($floor acquire pair-b o) && $floor release pair-b o \$t" \
    -n "psql -c twice" "t=\$(psql '$plain' -Atqc \"select token from fence.acquire('pair-c','o',30000)\") && psql '$plain' -Atqc \"select token from fence.release('pair-c','o',\$t)\"" \
    -n "fence acquire + release, sslmode=prefer" "eval \"\$($bin/fence --store $url acquire pair-d --owner o --format env)\" && $bin/fence --store $url release"
# Single commands run without a shell (-N), here and below: at a few milliseconds hyperfine's
# shell-start correction is noise. The pairs above need a shell (eval, $(...)).
hyperfine -N --warmup 20 --runs "$runs" --export-json "$out/one.json" --style basic \
    -n "fence acquire (reacquire)" "$fence acquire one-a --owner o -q" \
    -n "tokio-postgres floor acquire" "$floor acquire one-b o"

psql -qc "CREATE TABLE IF NOT EXISTS bench_totals (id int PRIMARY KEY, n bigint); INSERT INTO bench_totals VALUES (1, 0) ON CONFLICT DO NOTHING"
hyperfine -N --warmup 20 --runs "$runs" --export-json "$out/write.json" --style basic \
    -n "fence write (fenced transaction)" "$fence write totals --token 1 --target $plain --sql 'UPDATE bench_totals SET n = n + 1' -q" \
    -n "unfenced transaction, same SQL (floor)" "$floor txn 'UPDATE bench_totals SET n = n + 1'"

state=$(mktemp -d)
hyperfine -N --warmup 20 --runs "$runs" --export-json "$out/run.json" --style basic \
    -n "fence run R -- true (embedded store)" "$bin/fence --store file://$state run r -- true" \
    -n "flock /tmp/x true" "flock $state/x true" \
    -n "fence run R -- true (PostgreSQL)" "$fence run r -- true"
if command -v etcd >/dev/null && command -v etcdctl >/dev/null; then
    # A throwaway single-member etcd on loopback, like the PostgreSQL cluster.
    etcd_dir=$(mktemp -d)
    etcd_client=$((20000 + RANDOM % 20000))
    etcd_peer=$((etcd_client + 1))
    etcd --name bench --data-dir "$etcd_dir/data" \
        --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
        --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
        --initial-cluster "bench=http://127.0.0.1:$etcd_peer" >"$etcd_dir/log" 2>&1 &
    etcd_pid=$!
    trap 'kill $etcd_pid 2>/dev/null; rm -rf "$etcd_dir"' EXIT
    etcdctl=(env ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$etcd_client")
    for _ in $(seq 1 100); do "${etcdctl[@]}" endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
    hyperfine -N --warmup 20 --runs "$runs" --export-json "$out/etcd.json" --style basic \
        -n "fence run R -- true (PostgreSQL)" "$fence run r -- true" \
        -n "etcdctl lock R -- true" "${etcdctl[*]} lock r -- true"
    echo "etcd $(etcd --version | awk '/etcd Version/ {print $3}') on 127.0.0.1:$etcd_client"
else
    echo "(etcd not installed here: the etcdctl comparison is skipped; apt-get install etcd-server etcd-client)"
fi

echo
echo "## A refused acquire writes no WAL"
$fence acquire held --owner holder --ttl 10m -q
# Keep background work out of the measurement (this cluster is throwaway): autovacuum off for
# the whole cluster while it runs, and a checkpoint first.
psql -qc "alter system set autovacuum = off" -c "select pg_reload_conf()" -c "checkpoint" >/dev/null
before=$(psql -Atc "select pg_current_wal_insert_lsn()")
xid_before=$(psql -Atc "select txid_snapshot_xmax(txid_current_snapshot())")
for _ in $(seq 1 1000); do $fence acquire held --owner other -q 2>/dev/null || true; done
after=$(psql -Atc "select pg_current_wal_insert_lsn()")
xid_after=$(psql -Atc "select txid_snapshot_xmax(txid_current_snapshot())")
echo "1000 refused acquires: $(psql -Atc "select pg_wal_lsn_diff('$after', '$before')") bytes of WAL, $((xid_after - xid_before)) transaction ids assigned"
psql -qc "alter system reset autovacuum" -c "select pg_reload_conf()" >/dev/null

echo
echo "## Acquire latency with 100 and with 1,000,000 resources (prefilled, one worker, spread)"
$fence bench --workers 1 --duration 10s --mode spread --resources 100 --prefill --format json > "$out/spread100.json"
$fence bench --workers 1 --duration 10s --mode spread --resources 1000000 --prefill --format json > "$out/spread1m.json"
python3 - "$out/spread100.json" "$out/spread1m.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
print(f"acquire p50 with 100 resources: {a['acquire_p50_ms']} ms (p99 {a['acquire_p99_ms']} ms)")
print(f"acquire p50 with 1,000,000 resources: {b['acquire_p50_ms']} ms (p99 {b['acquire_p99_ms']} ms)  (ratio {b['acquire_p50_ms']/a['acquire_p50_ms']:.2f}x)")
PY

echo
echo "## One hot resource, 64 workers: fence bench (blocking) vs a pg_advisory_lock loop"
$fence bench --workers 64 --duration 10s --mode contend --format json > "$out/bench64.json"
printf 'SELECT pg_advisory_lock(1);\nSELECT pg_advisory_unlock(1);\n' > "$out/lock.sql"
pgbench -n -c 64 -j 2 -T 10 -f "$out/lock.sql" "$plain" 2>/dev/null | grep -E '^tps' | tee "$out/pgbench.txt"
$fence bench --workers 2 --duration 10s --mode handoff --format json > "$out/handoff.json"
python3 - "$out/bench64.json" "$out/pgbench.txt" "$out/handoff.json" <<'PY'
import json, re, sys
b = json.load(open(sys.argv[1])); h = json.load(open(sys.argv[3]))
tps = float(re.search(r"tps = ([0-9.]+)", open(sys.argv[2]).read()).group(1))
print(f"fence bench contend, 64 workers: {b['critical_sections_per_s']:.0f} critical sections/s, hand-off p50 {b['handoff_p50_ms']} ms / p99 {b['handoff_p99_ms']} ms")
print(f"pg_advisory_lock loop, 64 clients: {tps:.0f} lock+unlock/s  (ratio {b['critical_sections_per_s']/tps:.2f}x)")
print(f"fence bench handoff, 2 workers: hand-off p50 {h['handoff_p50_ms']} ms / p99 {h['handoff_p99_ms']} ms")
PY

python3 - "$out/pair.json" "$out/one.json" "$out/write.json" "$out/run.json" "$out/etcd.json" <<'PY'
import json, os, sys
pair = {r["command"]: r for r in json.load(open(sys.argv[1]))["results"]}
one = {r["command"]: r for r in json.load(open(sys.argv[2]))["results"]}
wr = {r["command"]: r for r in json.load(open(sys.argv[3]))["results"]}
rn = {r["command"]: r for r in json.load(open(sys.argv[4]))["results"]}
def ms(r): return r["median"] * 1000
f, fl, ps, tls = (pair[k] for k in ["fence acquire + release", "tokio-postgres floor (2 processes)", "psql -c twice", "fence acquire + release, sslmode=prefer"])
a, b = one["fence acquire (reacquire)"], one["tokio-postgres floor acquire"]
print()
print("| measurement | median |")
print("|---|---|")
fw, uw = wr["fence write (fenced transaction)"], wr["unfenced transaction, same SQL (floor)"]
re_, fl_, rp = rn["fence run R -- true (embedded store)"], rn["flock /tmp/x true"], rn["fence run R -- true (PostgreSQL)"]
for name, r in [("fence write: fenced transaction, one process", fw), ("floor: unfenced transaction, same SQL", uw), ("fence acquire + release", f), ("floor: tokio-postgres, same 2 statements", fl), ("psql -c twice", ps), ("fence acquire + release, TLS (sslmode=prefer)", tls), ("fence acquire (one process)", a), ("floor acquire (one process)", b), ("fence run R -- true, embedded store", re_), ("flock /tmp/x true", fl_), ("fence run R -- true, PostgreSQL", rp)]:
    print(f"| {name} | {ms(r):.1f} ms |")
etcd = None
if os.path.exists(sys.argv[5]):
    et = {r["command"]: r for r in json.load(open(sys.argv[5]))["results"]}
    etcd = et["fence run R -- true (PostgreSQL)"], et["etcdctl lock R -- true"]
    print(f"| fence run R -- true, PostgreSQL (run beside etcd) | {ms(etcd[0]):.1f} ms |")
    print(f"| etcdctl lock R -- true | {ms(etcd[1]):.1f} ms |")
print()
print(f"fence pair / floor pair: {ms(f)/ms(fl):.2f}x   fence pair / psql pair: {ms(f)/ms(ps):.2f}x   fence acquire / floor acquire: {ms(a)/ms(b):.2f}x   fenced / unfenced transaction: {ms(fw)/ms(uw):.2f}x   fence run (embedded) / flock: {ms(re_)/ms(fl_):.2f}x")
if etcd:
    print(f"fence run (PostgreSQL) / etcdctl lock: {ms(etcd[0])/ms(etcd[1]):.2f}x")
PY
rm -rf "$out" "$state"
