#!/usr/bin/env bash
# Measures whole `fence` invocations against their floors and their peers, side by side on one
# machine, on a DURABLE cluster (fsync on, synchronous_commit on: the server defaults that
# matter; pg_virtualenv's own default is fsync=off, which hides the cost of every commit):
#   - one `fence acquire` (a reacquire: one UPDATE) and `fence acquire` + `fence release` vs
#     the floor, examples/pg_floor.rs: a minimal tokio-postgres program doing connect +
#     `SELECT 1`, touching no fence object (so "× the floor" is fence's own cost);
#   - fence's acquire statement on a fresh connection (pgbench -C, the statement text taken
#     from src/coordinator/pg_one_shot.rs) vs a trivial statement: granting vs a trivial durable
#     write, refused (busy) vs `SELECT 1`; and the schema's PL/pgSQL `acquire()` beside them;
#   - `fence write` (a fenced transaction) vs the same transaction unfenced;
#   - `fence run R -- true` vs `flock /tmp/x true` (embedded store) and vs
#     `etcdctl lock R -- true` on a throwaway etcd (Debian packages etcd-server, etcd-client);
#   - what 1,000 refused acquires write: the lease row untouched (same xmin/xmax), and the
#     WAL and transaction ids of their coalesced attempt records;
#   - acquire p50 with 100 and with 1,000,000 prefilled resources (`fence bench --prefill`);
#   - `fence bench` on one hot resource (64 workers) vs the durability floor (a pgbench loop of
#     durable single-row updates of one row) and vs a pg_advisory_lock loop, and the --wait
#     hand-off latency.
# Like for like: every PostgreSQL client connects over TCP loopback with `trust`
# authentication (the script makes it the first rule for 127.0.0.1) and sslmode=disable, and
# etcd runs without authentication; one extra line shows fence with the default
# sslmode=prefer. The cluster's settings and the machine's load are printed first, and each
# target of issue 22 is marked met / not met at the end.
#
# Runs inside a throwaway cluster from pg_virtualenv (works as root); installs hyperfine,
# etcd-server and etcd-client with apt-get when they are missing.
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
    # pg_virtualenv passes `fsync=off` to its cluster; these options come after it and win
    # (checked below, inside).
    FENCE_BENCH_INSIDE=1 exec pg_virtualenv -o fsync=on -o synchronous_commit=on "$0" "$runs"
fi

bin="$CARGO_TARGET_DIR/release"
for setting in fsync synchronous_commit; do
    if [[ $(psql -Atc "show $setting") != on ]]; then
        echo "benches/compare.sh: the cluster runs with $setting = $(psql -Atc "show $setting"), not on: its figures would not be durable ones" >&2
        exit 1
    fi
done
# trust for TCP loopback, first of the rules, so that no client pays a SCRAM exchange (etcd
# runs without authentication).
hba=$(psql -Atc "show hba_file")
{ printf 'host all all 127.0.0.1/32 trust\n'; cat "$hba"; } > "$hba.new" && mv "$hba.new" "$hba"
psql -qAtc "select pg_reload_conf()" >/dev/null
plain="postgresql://$PGUSER@127.0.0.1:$PGPORT/$PGDATABASE?sslmode=disable"
prefer="postgresql://$PGUSER@127.0.0.1:$PGPORT/$PGDATABASE"
auth=$(psql "$plain" -Atc "select auth_method from pg_hba_file_rules where type = 'host' and address = '127.0.0.1' order by line_number limit 1")
fence="$bin/fence --store $plain"
floor="$bin/examples/pg_floor $plain"
$fence init -q
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit + uncommitted changes"

echo "# $(date -u +%Y-%m-%dT%H:%MZ), commit $commit, $(nproc) cores, $(uname -r)"
echo "# load before: $(uptime | sed 's/.*load average/load average/')"
echo "# PostgreSQL $(psql -Atc 'show server_version'): fsync=$(psql -Atc 'show fsync')," \
    "synchronous_commit=$(psql -Atc 'show synchronous_commit'), wal_sync_method=$(psql -Atc 'show wal_sync_method')," \
    "full_page_writes=$(psql -Atc 'show full_page_writes'); clients: TCP loopback, auth $auth, sslmode=disable"
out=$(mktemp -d)
state=$(mktemp -d)
etcd_pid=""
etcd_dir=""
trap 'if [[ -n $etcd_pid ]]; then kill "$etcd_pid" 2>/dev/null; fi; rm -rf "$out" "$state" ${etcd_dir:+"$etcd_dir"}' EXIT

hyperfine --warmup 20 --runs "$runs" --export-json "$out/pair.json" --style basic \
    -n "fence acquire + release" "eval \"\$($fence acquire pair-a --owner o --format env)\" && $fence release" \
    -n "floor twice (2 processes)" "$floor && $floor" \
    -n "fence acquire + release, sslmode=prefer" "eval \"\$($bin/fence --store $prefer acquire pair-d --owner o --format env)\" && $bin/fence --store $prefer release"
# Single commands run without a shell (-N), here and below: at a few milliseconds hyperfine's
# shell-start correction is noise. The pairs above need a shell (eval, $(...)).
hyperfine -N --warmup 20 --runs "$runs" --export-json "$out/one.json" --style basic \
    -n "fence acquire (reacquire)" "$fence acquire one-a --owner o -q" \
    -n "floor (connect + SELECT 1)" "$floor"

psql -qc "CREATE TABLE IF NOT EXISTS bench_totals (id int PRIMARY KEY, n bigint); INSERT INTO bench_totals VALUES (1, 0) ON CONFLICT DO NOTHING"
hyperfine -N --warmup 20 --runs "$runs" --export-json "$out/write.json" --style basic \
    -n "fence write (fenced transaction)" "$fence write totals --token 1 --target $plain --sql 'UPDATE bench_totals SET n = n + 1' -q" \
    -n "unfenced transaction, same SQL (floor)" "$floor txn 'UPDATE bench_totals SET n = n + 1'"

hyperfine -N --warmup 20 --runs "$runs" --export-json "$out/run.json" --style basic \
    -n "fence run R -- true (embedded store)" "$bin/fence --store file://$state run r -- true" \
    -n "flock /tmp/x true" "flock $state/x true" \
    -n "true (one process start)" "true" \
    -n "fence --version (fence's own start)" "$bin/fence --version" \
    -n "fence run R -- true (PostgreSQL)" "$fence run r -- true"
if command -v etcd >/dev/null && command -v etcdctl >/dev/null; then
    # A throwaway single-member etcd on loopback, without authentication, like the cluster.
    etcd_dir=$(mktemp -d)
    etcd_client=$((20000 + RANDOM % 20000))
    etcd_peer=$((etcd_client + 1))
    etcd --name bench --data-dir "$etcd_dir/data" \
        --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
        --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
        --initial-cluster "bench=http://127.0.0.1:$etcd_peer" >"$etcd_dir/log" 2>&1 &
    etcd_pid=$!
    etcdctl=(env ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$etcd_client")
    for _ in $(seq 1 100); do "${etcdctl[@]}" endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
    hyperfine -N --warmup 20 --runs "$runs" --export-json "$out/etcd.json" --style basic \
        -n "fence run R -- true (PostgreSQL)" "$fence run r -- true" \
        -n "etcdctl lock R -- true" "${etcdctl[*]} lock r -- true"
    echo "etcd $(etcd --version | awk '/etcd Version/ {print $3}') on 127.0.0.1:$etcd_client, no authentication, its default fsync per commit"
else
    echo "(etcd not installed here: the etcdctl comparison is skipped; apt-get install etcd-server etcd-client)"
fi

echo
echo "## fence's acquire statement on a fresh connection (pgbench -C: a new connection per statement)"
# The statement fence sends, from its source: parameters become literals (a new resource per
# grant), the schema `fence`.
python3 - "$out" <<'PY'
import re, sys
src = open("src/coordinator/pg_one_shot.rs").read()
sql = re.search(r'pub const ACQUIRE: &str = "\\\n(.*?)";', src, re.S).group(1)
sql = sql.replace("__SCHEMA__", "fence").replace("$3", "30000::int8")
grant = sql.replace("$1", "('cold-' || :n)").replace("$2", "'o'")
busy = sql.replace("$1", "'cold-held'").replace("$2", "'other'")
open(f"{sys.argv[1]}/grant.sql", "w").write("\\set n random(1, 1000000000)\n" + grant + ";\n")
open(f"{sys.argv[1]}/busy.sql", "w").write(busy + ";\n")
PY
$fence acquire cold-held --owner holder --ttl 1h -q
printf 'SELECT 1;\n' > "$out/select1.sql"
psql -qc "CREATE TABLE IF NOT EXISTS bench_row (id int PRIMARY KEY, n bigint); INSERT INTO bench_row VALUES (1, 0) ON CONFLICT DO NOTHING"
printf 'UPDATE bench_row SET n = n + 1 WHERE id = 1;\n' > "$out/write1.sql"
printf '\\set n random(1, 1000000000)\nSELECT token FROM fence.acquire(%s, %s, 30000);\n' "'plpgsql-' || :n" "'o'" > "$out/plpgsql.sql"
printf "SELECT * FROM fence.leases WHERE resource = 'cold-held';\n" > "$out/read.sql"
# Alternated, twice, so that a change in the machine's load shows as a spread. Each
# transaction's own time (pgbench -l: the statement alone, without the connection) is logged
# too: what the statement costs on a new backend.
mkdir -p "$out/logs"
for round in 1 2; do
    for case in select1 read busy write1 grant plpgsql; do
        latency=$(cd "$out/logs" && pgbench -n -C -c 1 -T 5 -l --log-prefix="$case-$round" -f "$out/$case.sql" "$plain" 2>/dev/null | awk '/^latency average/ {print $4}')
        echo "$case $latency" >> "$out/cold.txt"
    done
done
python3 - "$out/cold.txt" "$out/logs" <<'PY'
import glob, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    case, ms = line.split()
    rows.setdefault(case, []).append(float(ms))
names = {
    "select1": "SELECT 1 (trivial statement)",
    "read": "SELECT of one lease row (fence's table, no change)",
    "busy": "fence acquire statement, refused (busy)",
    "write1": "UPDATE of one row (trivial durable write)",
    "grant": "fence acquire statement, granting a new resource",
    "plpgsql": "the schema's PL/pgSQL acquire(), granting (version 4's one-shot path)",
}
for case, name in names.items():
    alone = [int(l.split()[2]) / 1000 for f in glob.glob(f"{sys.argv[2]}/{case}-*") for l in open(f)]
    print(f"{name}: {' / '.join(f'{v:.2f}' for v in rows[case])} ms per connection + statement;"
          f" the statement alone {statistics.median(alone):.2f} ms (median of {len(alone)})")
PY

echo
echo "## A refused acquire leaves the lease row untouched (its attempt is recorded apart)"
$fence acquire held --owner holder --ttl 10m -q
# Keep background work out of the measurement (this cluster is throwaway): autovacuum off for
# the whole cluster while it runs, and a checkpoint first.
psql -qc "alter system set autovacuum = off" -c "select pg_reload_conf()" -c "checkpoint" >/dev/null
before=$(psql -Atc "select pg_current_wal_insert_lsn()")
xid_before=$(psql -Atc "select txid_snapshot_xmax(txid_current_snapshot())")
row_before=$(psql -Atc "select xmin::text || '/' || xmax::text from fence.leases where resource = 'held'")
for _ in $(seq 1 1000); do $fence acquire held --owner other -q 2>/dev/null || true; done
after=$(psql -Atc "select pg_current_wal_insert_lsn()")
xid_after=$(psql -Atc "select txid_snapshot_xmax(txid_current_snapshot())")
row_after=$(psql -Atc "select xmin::text || '/' || xmax::text from fence.leases where resource = 'held'")
attempts=$(psql -Atc "select coalesce(sum(count), 0) from fence.attempts where resource = 'held'")
echo "1000 refused acquires: lease row xmin/xmax $row_before before, $row_after after; $attempts attempts recorded; $(psql -Atc "select pg_wal_lsn_diff('$after', '$before')") bytes of WAL, $((xid_after - xid_before)) transaction ids assigned" | tee "$out/wal.txt"
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
echo "## One hot resource, 64 workers: fence bench (blocking) vs durable single-row updates vs a pg_advisory_lock loop"
$fence bench --workers 64 --duration 10s --mode contend --format json > "$out/bench64.json"
# The durability floor: each critical section of fence commits durably at least once, as
# each of these updates does (synchronous_commit is on for the cluster).
pgbench -n -c 64 -j 2 -T 10 -f "$out/write1.sql" "$plain" 2>/dev/null | grep -E '^tps' > "$out/durable.txt"
printf 'SELECT pg_advisory_lock(1);\nSELECT pg_advisory_unlock(1);\n' > "$out/lock.sql"
pgbench -n -c 64 -j 2 -T 10 -f "$out/lock.sql" "$plain" 2>/dev/null | grep -E '^tps' > "$out/lock.txt"
$fence bench --workers 2 --duration 10s --mode handoff --format json > "$out/handoff.json"
# What one WAL flush costs on this disk: a hand-off commits twice in series (the release, then
# the grant), and neither can wait for the other's flush.
"$(pg_config --bindir)/pg_test_fsync" -s 2 -f "$(psql -Atc 'show data_directory')/fence_fsync.test" 2>/dev/null | awk '$1 == "fdatasync" {print "one fdatasync of an 8 kB write on this disk (pg_test_fsync, as wal_sync_method=fdatasync does): " $4 " us"; exit}' > "$out/fsync.txt"
rm -f "$(psql -Atc 'show data_directory')/fence_fsync.test"
echo "# load after: $(uptime | sed 's/.*load average/load average/')"

python3 - "$out" <<'PY'
import json, os, re, sys
out = sys.argv[1]
def results(name):
    path = f"{out}/{name}.json"
    if not os.path.exists(path):
        return None
    return {r["command"]: r["median"] * 1000 for r in json.load(open(path))["results"]}
pair, one, wr, rn, et = (results(n) for n in ["pair", "one", "write", "run", "etcd"])
tps = lambda name: float(re.search(r"tps = ([0-9.]+)", open(f"{out}/{name}.txt").read()).group(1))
b64 = json.load(open(f"{out}/bench64.json")); h = json.load(open(f"{out}/handoff.json"))
durable, lock = tps("durable"), tps("lock")
cold = {}
for line in open(f"{out}/cold.txt"):
    case, ms = line.split()
    cold.setdefault(case, []).append(float(ms))
cold = {case: sum(v) / len(v) for case, v in cold.items()}

print(f"fence bench contend, 64 workers: {b64['critical_sections_per_s']:.0f} critical sections/s, hand-off p50 {b64['handoff_p50_ms']} ms / p99 {b64['handoff_p99_ms']} ms")
print(f"durable single-row update loop, 64 clients: {durable:.0f} updates/s")
print(f"pg_advisory_lock loop, 64 clients: {lock:.0f} lock+unlock/s")
print(f"fence bench handoff, 2 workers: hand-off p50 {h['handoff_p50_ms']} ms / p99 {h['handoff_p99_ms']} ms")
print(open(f"{out}/fsync.txt").read().strip())
print()
print("| measurement | median |")
print("|---|---|")
rows = [
    ("fence acquire + release (two processes)", pair["fence acquire + release"]),
    ("floor twice: connect + SELECT 1, two processes", pair["floor twice (2 processes)"]),
    ("fence acquire + release, TLS (sslmode=prefer)", pair["fence acquire + release, sslmode=prefer"]),
    ("one fence acquire (reacquire)", one["fence acquire (reacquire)"]),
    ("floor: connect + SELECT 1", one["floor (connect + SELECT 1)"]),
    ("fence write (fenced transaction)", wr["fence write (fenced transaction)"]),
    ("floor: the same transaction unfenced", wr["unfenced transaction, same SQL (floor)"]),
    ("fence run R -- true, embedded store", rn["fence run R -- true (embedded store)"]),
    ("flock /tmp/x true", rn["flock /tmp/x true"]),
    ("true (one process start)", rn["true (one process start)"]),
    ("fence --version (fence's own start)", rn["fence --version (fence's own start)"]),
    ("fence run R -- true, PostgreSQL", rn["fence run R -- true (PostgreSQL)"]),
]
if et:
    rows += [("fence run R -- true, PostgreSQL (beside etcd)", et["fence run R -- true (PostgreSQL)"]),
             ("etcdctl lock R -- true", et["etcdctl lock R -- true"])]
for name, ms in rows:
    print(f"| {name} | {ms:.1f} ms |")
print()
print(f"fence pair / floor pair: {pair['fence acquire + release'] / pair['floor twice (2 processes)']:.2f}x   "
      f"fenced / unfenced transaction: {wr['fence write (fenced transaction)'] / wr['unfenced transaction, same SQL (floor)']:.2f}x")
print()
print("Targets (issue 22; one run, fsync on):")
print()
print("| target | measured | |")
print("|---|---|---|")
def target(name, measured, ok):
    print(f"| {name} | {measured} | {'met' if ok else '**not met**'} |")
if et:
    r = et["fence run R -- true (PostgreSQL)"] / et["etcdctl lock R -- true"]
    target("`fence run` (PostgreSQL, trust) <= 0.5x `etcdctl lock` (no auth)", f"{r:.2f}x", r <= 0.5)
else:
    print("| `fence run` (PostgreSQL) <= 0.5x `etcdctl lock` | not measured (no etcd) | |")
r = rn["fence run R -- true (embedded store)"] / rn["flock /tmp/x true"]
target("`fence run` (embedded) <= 1.5x `flock x true`", f"{r:.2f}x", r <= 1.5)
r = b64["critical_sections_per_s"] / durable
target("hot resource, 64 workers >= 0.5x durable single-row updates",
       f"{b64['critical_sections_per_s']:.0f}/s against {durable:.0f}/s: {r:.2f}x (advisory-lock loop {lock:.0f}/s: {b64['critical_sections_per_s'] / lock:.2f}x)", r >= 0.5)
target("`--wait` hand-off p50 <= 1 ms, p99 <= 2 ms", f"2 workers: {h['handoff_p50_ms']} / {h['handoff_p99_ms']} ms",
       h["handoff_p50_ms"] <= 1 and h["handoff_p99_ms"] <= 2)
r = one["fence acquire (reacquire)"] / one["floor (connect + SELECT 1)"]
target("one `fence acquire` <= 1.15x the floor (connect + SELECT 1)", f"{r:.2f}x", r <= 1.15)
r = cold["busy"] / cold["select1"]
target("acquire statement on a fresh connection <= 1.2x a trivial statement: refused vs SELECT 1",
       f"{cold['busy']:.2f} / {cold['select1']:.2f} ms: {r:.2f}x", r <= 1.2)
r = cold["grant"] / cold["write1"]
target("the same, granting vs a trivial durable write (UPDATE of one row)",
       f"{cold['grant']:.2f} / {cold['write1']:.2f} ms: {r:.2f}x (PL/pgSQL acquire(): {cold['plpgsql']:.2f} ms)", r <= 1.2)
wal = open(f"{out}/wal.txt").read()
m = re.search(r"xmin/xmax (\S+) before, (\S+) after; (\d+) attempts recorded; (\d+) bytes of WAL, (\d+) transaction ids", wal)
target("a refused acquire leaves the lease row untouched", f"1,000 refused: lease row {m.group(1)} before and {m.group(2)} after; {m.group(3)} attempts recorded ({m.group(4)} bytes of WAL, {m.group(5)} transaction ids)", m.group(1) == m.group(2))
PY
