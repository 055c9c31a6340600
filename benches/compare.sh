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
# Figures that reproduce (issue 37): every comparison is measured in ROUNDS rounds (default 3),
# one after the other, each pair side by side in the same round (hyperfine alternates nothing,
# so the rounds are the interleaving: a change of the machine's load shows as a spread). Each
# ratio is printed as the median of its rounds with their range; before each round the
# disk's fdatasync latency (a second of 8 kB writes, each synced) and how busy the CPUs are with other work
# (one second of /proc/stat) are taken, and a round whose fsync latency is over 3x the run's
# median or whose CPUs were over 25% busy is marked abnormal (its figures are printed, and
# left out of the medians when at least one round was normal).
#
# Usage: benches/compare.sh [RUNS [ROUNDS]]   (default 200 runs per command, 3 rounds)
#
# FENCE_BENCH_BIN_DIR=DIR uses DIR/fence and DIR/examples/pg_floor instead of building the
# release ones; FENCE_BENCH_QUICK=1 shrinks every duration and size (1-second benches, 1,000
# prefilled resources) so that the suite can check that the script still runs
# (tests/suite/packaging/bench.rs); its figures then mean nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs=${1:-200}
rounds=${2:-3}
if [[ -n ${FENCE_BENCH_QUICK:-} ]]; then
    # Light too: the suite runs it beside other tests.
    seconds=1 warmup=2 prefill=1000 hot=8 refusals=100
else
    seconds=10 warmup=20 prefill=1000000 hot=64 refusals=1000
fi
export seconds hot

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
    [[ -n ${FENCE_BENCH_BIN_DIR:-} ]] || cargo build --quiet --release --bin fence --example pg_floor
    # pg_virtualenv passes `fsync=off` to its cluster; these options come after it and win
    # (checked below, inside).
    FENCE_BENCH_INSIDE=1 exec pg_virtualenv -o fsync=on -o synchronous_commit=on "$0" "$runs" "$rounds"
fi

bin="${FENCE_BENCH_BIN_DIR:-$CARGO_TARGET_DIR/release}"
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
floor_bin="$bin/examples/pg_floor"
floor="$floor_bin $plain"
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
bouncers=()
trap 'if [[ -n $etcd_pid ]]; then kill "$etcd_pid" 2>/dev/null; fi; for pid in "${bouncers[@]}"; do kill "$pid" 2>/dev/null; done; rm -rf "$out" "$state" ${etcd_dir:+"$etcd_dir"}' EXIT

if command -v etcd >/dev/null && command -v etcdctl >/dev/null; then
    # A throwaway single-member etcd on loopback, without authentication, like the cluster.
    # Its two ports come from the kernel (both bound at once, so they differ) rather than at
    # random: a port another server of the test suite holds made etcd exit at once, and the
    # health checks below then waited out their default timeouts for minutes. Each check is
    # bounded; a member that exits is started again on new ports, three times at most.
    etcd_dir=$(mktemp -d)
    etcd_up=""
    for _ in 1 2 3; do
        read -r etcd_client etcd_peer < <(python3 -c 'import socket; s = [socket.socket() for _ in range(2)]; [x.bind(("127.0.0.1", 0)) for x in s]; print(*(x.getsockname()[1] for x in s))')
        rm -rf "$etcd_dir/data"
        etcd --name bench --data-dir "$etcd_dir/data" \
            --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
            --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
            --initial-cluster "bench=http://127.0.0.1:$etcd_peer" >"$etcd_dir/log" 2>&1 &
        etcd_pid=$!
        etcdctl=(env ETCDCTL_API=3 etcdctl --endpoints "http://127.0.0.1:$etcd_client")
        etcd_deadline=$((SECONDS + 30))
        while ((SECONDS < etcd_deadline)); do
            kill -0 "$etcd_pid" 2>/dev/null || break
            "${etcdctl[@]}" --dial-timeout=1s --command-timeout=2s endpoint health >/dev/null 2>&1 && { etcd_up=1; break; }
            sleep 0.1
        done
        [[ -n $etcd_up ]] && break
        kill "$etcd_pid" 2>/dev/null || true
        wait "$etcd_pid" 2>/dev/null || true
        echo "compare.sh: etcd did not start on 127.0.0.1:$etcd_client; its log ends:" >&2
        tail -n 5 "$etcd_dir/log" >&2
    done
    if [[ -n $etcd_up ]]; then
        echo "# etcd $(etcd --version | awk '/etcd Version/ {print $3}') on 127.0.0.1:$etcd_client, no authentication, its default fsync per commit"
    else
        etcd_pid=""
        echo "# (etcd did not start, three times: the etcdctl comparison is skipped; its log is above, on stderr)"
    fi
else
    echo "# (etcd not installed here: the etcdctl comparison is skipped; apt-get install etcd-server etcd-client)"
fi

# fence's acquire statements on a fresh connection (pgbench -C, a new connection per
# script), from their source, as fence sends them (src/coordinator/postgres/mod.rs,
# `one_shot_fast`): ACQUIRE_FAST first, which answers a resource that has a lease row (busy,
# or granted), then ACQUIRE_NEW when it answered no row (a new resource). Parameters become
# literals (a new resource per grant), the schema `fence`.
python3 - "$out" <<'PY'
import re, sys
src = open("src/coordinator/pg_one_shot.rs").read()
macro = re.search(r'macro_rules! schema_is_current \{\s*\(\) => \{\s*"((?:[^"\\]|\\.)*)"', src, re.S).group(1)
version = re.search(r"COORDINATOR_SCHEMA: SchemaSpec = SchemaSpec \{.*?version: (\d+),", open("src/coordinator/postgres/mod.rs").read(), re.S).group(1)
answered = re.search(r'macro_rules! answered \{\s*\(\) => \{\s*concat!\(\s*"((?:[^"\\]|\\.)*)"', src, re.S).group(1) + macro
def statement(name):
    sql = re.search(r'pub const ' + name + r': &str = concat!\(\s*"\\\n(.*?)",\s*answered!\(\),\s*"(.*?)"\s*\);', src, re.S)
    sql = sql.group(1) + answered + sql.group(2)
    return sql.replace("__SCHEMA__", "fence").replace("__VERSION__", version).replace("$3", "30000::int8").replace("$4", "NULL::int8")
fast, create = statement("ACQUIRE_FAST"), statement("ACQUIRE_NEW")
new = lambda sql: sql.replace("$1", "('cold-' || :n)").replace("$2", "'o'")
grant = new(fast) + ";\n" + new(create)
regrant = fast.replace("$1", "'cold-mine'").replace("$2", "'o'")
busy = fast.replace("$1", "'cold-held'").replace("$2", "'other'")
open(f"{sys.argv[1]}/grant.sql", "w").write("\\set n random(1, 1000000000)\n" + grant + ";\n")
open(f"{sys.argv[1]}/regrant.sql", "w").write(regrant + ";\n")
open(f"{sys.argv[1]}/busy.sql", "w").write(busy + ";\n")
PY
$fence acquire cold-held --owner holder --ttl 24h -q
$fence acquire cold-mine --owner o --ttl 24h -q
printf 'SELECT 1;\n' > "$out/select1.sql"
psql -qc "CREATE TABLE IF NOT EXISTS bench_row (id int PRIMARY KEY, n bigint); INSERT INTO bench_row VALUES (1, 0) ON CONFLICT DO NOTHING"
# `fence write` is measured with a token the coordinator issued (a token it never issued is
# refused: exit 6).
totals_token=$($fence acquire totals --owner bench --ttl 24h --format env | sed -n 's/^export FENCE_TOKEN=//p')
psql -qc "CREATE TABLE IF NOT EXISTS bench_totals (id int PRIMARY KEY, n bigint); INSERT INTO bench_totals VALUES (1, 0) ON CONFLICT DO NOTHING"
printf 'UPDATE bench_row SET n = n + 1 WHERE id = 1;\n' > "$out/write1.sql"
printf '\\set n random(1, 1000000000)\nSELECT token FROM fence.acquire(%s, %s, 30000);\n' "'plpgsql-' || :n" "'o'" > "$out/plpgsql.sql"
printf "SELECT * FROM fence.leases WHERE resource = 'cold-held';\n" > "$out/read.sql"
printf 'SELECT pg_advisory_lock(1);\nSELECT pg_advisory_unlock(1);\n' > "$out/lock.sql"
mkdir -p "$out/logs"
data_dir=$(psql -Atc 'show data_directory')
# What one WAL flush costs on this disk now, in microseconds: the median of a second of
# 8 kB writes each followed by fdatasync, in the cluster's data directory (as
# wal_sync_method=fdatasync does).
fsync_us() {
    python3 - "$data_dir/fence_fsync.test" <<'PY'
import os, statistics, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
block, took, end = b"\0" * 8192, [], time.monotonic() + 1
while time.monotonic() < end:
    start = time.perf_counter()
    os.pwrite(fd, block, 0)
    os.fdatasync(fd)
    took.append(time.perf_counter() - start)
os.close(fd)
os.unlink(sys.argv[1])
print(round(statistics.median(took) * 1e6))
PY
}

# PgBouncer in transaction mode in front of the cluster (docs/run.md, "PgBouncer"), twice:
# with the role's SCRAM verifier in its userlist (as the docs advise), and with the plaintext
# password (the trap: PgBouncer then derives the verifier itself, 4,096 rounds of PBKDF2 on
# every connection). Clients authenticate with SCRAM to PgBouncer; PgBouncer to the server
# with the trust rule above. It refuses to run as root: as root, it runs as postgres. (The
# throwaway cluster's generated password is in these clients' arguments while the script
# runs: pg_floor reads no PGPASSWORD. It dies with the cluster.)
bouncer_bin=$(command -v pgbouncer 2>/dev/null || echo /usr/sbin/pgbouncer)
bouncers=()
start_bouncer() { # NAME SECRET: starts one (its pid file in $out/bouncer-NAME), prints its port
    local dir="$out/bouncer-$1" port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    mkdir -p "$dir"
    printf '"%s" "%s"\n' "$PGUSER" "$2" > "$dir/userlist.txt"
    cat > "$dir/pgbouncer.ini" <<EOF
[databases]
$PGDATABASE = host=127.0.0.1 port=$PGPORT dbname=$PGDATABASE
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = scram-sha-256
auth_file = $dir/userlist.txt
pool_mode = transaction
default_pool_size = 10
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
    chmod 0600 "$dir/userlist.txt"
    if ((EUID == 0)); then
        chown -R postgres: "$dir"
        runuser -u postgres -- "$bouncer_bin" -d "$dir/pgbouncer.ini" >/dev/null
    else
        "$bouncer_bin" -d "$dir/pgbouncer.ini" >/dev/null
    fi
    for _ in $(seq 1 100); do
        [[ -s $dir/pgbouncer.pid ]] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        sleep 0.05
    done
    [[ -s $dir/pgbouncer.pid ]] || { cat "$dir/pgbouncer.log" >&2 2>/dev/null; return 1; }
    echo "$port"
}
bounced=""
if [[ -x $bouncer_bin && -n ${PGPASSWORD:-} ]]; then
    verifier=$(psql -Atc "select rolpassword from pg_authid where rolname = current_user")
    if [[ $verifier == SCRAM-SHA-256* ]]; then
        # PgBouncer (as postgres, when root) reads its files under $out.
        chmod o+x "$out"
        scram_port=$(start_bouncer scram "$verifier") && plain_port=$(start_bouncer plaintext "$PGPASSWORD") &&
        bounced="postgresql://$PGUSER:$PGPASSWORD@127.0.0.1:$scram_port/$PGDATABASE?sslmode=disable"
        bounced_plain="postgresql://$PGUSER:$PGPASSWORD@127.0.0.1:$plain_port/$PGDATABASE?sslmode=disable"
        for name in scram plaintext; do
            [[ -s $out/bouncer-$name/pgbouncer.pid ]] && bouncers+=("$(cat "$out/bouncer-$name/pgbouncer.pid")")
        done
        echo "# PgBouncer $("$bouncer_bin" --version | head -n 1 | awk '{print $2}'), transaction pooling, clients authenticated by SCRAM"
    fi
fi
[[ -n $bounced ]] || echo "# (PgBouncer not installed, or the role has no SCRAM password: its comparison is skipped; apt-get install pgbouncer)"

# How busy the CPUs are in one second of nothing of ours running (/proc/stat), in percent:
# what else the machine is doing. (The load average is printed too, but the previous round's
# 64 workers keep it up for minutes.)
busy_percent() {
    python3 - <<'PY'
import time
def sample():
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return fields[3] + fields[4], sum(fields)
idle1, total1 = sample()
time.sleep(1)
idle2, total2 = sample()
print(round(100 * (1 - (idle2 - idle1) / max(total2 - total1, 1))))
PY
}

for round in $(seq 1 "$rounds"); do
    fsync=$(fsync_us)
    load=$(cut -d' ' -f1 /proc/loadavg)
    busy=$(busy_percent)
    echo "$round $fsync $load $busy" >> "$out/conditions.txt"
    echo "# round $round of $rounds: fdatasync ${fsync} us, load average $load, CPU ${busy}% busy" >&2
    hyperfine --warmup "$warmup" --runs "$runs" --export-json "$out/pair-$round.json" --style none \
        -n "fence acquire + release" "eval \"\$($fence acquire pair-a --owner o --format env)\" && $fence release" \
        -n "floor twice (2 processes)" "$floor && $floor" \
        -n "fence acquire + release, sslmode=prefer" "eval \"\$($bin/fence --store $prefer acquire pair-d --owner o --format env)\" && $bin/fence --store $prefer release"
    # Single commands run without a shell (-N), here and below: at a few milliseconds
    # hyperfine's shell-start correction is noise. The pairs above need a shell (eval, $(...)).
    hyperfine -N --warmup "$warmup" --runs "$runs" --export-json "$out/one-$round.json" --style none \
        -n "fence acquire (reacquire)" "$fence acquire one-a --owner o -q" \
        -n "floor (connect + SELECT 1)" "$floor"
    hyperfine -N --warmup "$warmup" --runs "$runs" --export-json "$out/write-$round.json" --style none \
        -n "fence write (fenced transaction)" "$fence write totals --token $totals_token --target $plain --sql 'UPDATE bench_totals SET n = n + 1' -q" \
        -n "unfenced transaction, same SQL (floor)" "$floor txn 'UPDATE bench_totals SET n = n + 1'"
    hyperfine -N --warmup "$warmup" --runs "$runs" --export-json "$out/run-$round.json" --style none \
        -n "fence run R -- true (embedded store)" "$bin/fence --store file://$state run r -- true" \
        -n "flock /tmp/x true" "flock $state/x true" \
        -n "true (one process start)" "true" \
        -n "fence --version (fence's own start)" "$bin/fence --version" \
        -n "fence run R -- true (PostgreSQL)" "$fence run r -- true"
    if [[ -n $etcd_pid ]]; then
        hyperfine -N --warmup "$warmup" --runs "$runs" --export-json "$out/etcd-$round.json" --style none \
            -n "fence run R -- true (PostgreSQL)" "$fence run r -- true" \
            -n "etcdctl lock R -- true" "${etcdctl[*]} lock r -- true"
    fi
    if [[ -n $bounced ]]; then
        hyperfine -N --warmup "$warmup" --runs "$runs" --export-json "$out/bouncer-$round.json" --style none \
            -n "fence acquire (reacquire) through PgBouncer" "$bin/fence --store $bounced acquire one-b --owner o -q" \
            -n "floor through PgBouncer" "$floor_bin $bounced" \
            -n "fence acquire through PgBouncer, plaintext userlist" "$bin/fence --store $bounced_plain acquire one-b --owner o -q"
    fi
    # Each transaction's own time too (pgbench -l: the statement alone, without the
    # connection): what the statement costs on a new backend.
    for case in select1 read busy write1 regrant grant plpgsql; do
        latency=$(cd "$out/logs" && pgbench -n -C -c 1 -T "$((seconds < 3 ? seconds : 3))" -l --log-prefix="$case-$round" -f "$out/$case.sql" "$plain" 2>/dev/null | awk '/^latency average/ {print $4}')
        echo "$round $case $latency" >> "$out/cold.txt"
    done
    # One hot resource, 64 workers: fence bench (blocking) against the durability floor (each
    # critical section of fence commits durably at least once, as each of these updates does)
    # and a pg_advisory_lock loop; then the --wait hand-off of 2 workers.
    # The sessions the server opened meanwhile: far waiters reconnect for each poll.
    sessions0=$(psql -Atc "SELECT sum(sessions) FROM pg_stat_database")
    $fence bench --workers "$hot" --duration "${seconds}s" --mode contend --format json > "$out/bench64-$round.json"
    sessions1=$(psql -Atc "SELECT sum(sessions) FROM pg_stat_database")
    echo "$round $((sessions1 - sessions0 - 1))" >> "$out/sessions.txt"  # less the second psql
    # The same with every waiter allowed to keep its connection (`fence init --held-waiters`).
    $fence bench --workers "$hot" --duration "${seconds}s" --mode contend --held-waiters "$hot" --format json > "$out/bench64held-$round.json"
    $fence bench --workers 8 --duration "${seconds}s" --mode contend --format json > "$out/bench8-$round.json"
    pgbench -n -c "$hot" -j 2 -T "$seconds" -f "$out/write1.sql" "$plain" 2>/dev/null | grep -E '^tps' > "$out/durable-$round.txt"
    pgbench -n -c "$hot" -j 2 -T "$seconds" -f "$out/lock.sql" "$plain" 2>/dev/null | grep -E '^tps' > "$out/lock-$round.txt"
    $fence bench --workers 2 --duration "${seconds}s" --mode handoff --format json > "$out/handoff-$round.json"
done

echo
echo "## A refused acquire leaves the lease row untouched (its attempt is recorded apart)"
$fence acquire held --owner holder --ttl 10m -q
# Keep background work out of the measurement (this cluster is throwaway): autovacuum off for
# the whole cluster while it runs, and a checkpoint first.
psql -qc "alter system set autovacuum = off" -c "select pg_reload_conf()" -c "checkpoint" >/dev/null
before=$(psql -Atc "select pg_current_wal_insert_lsn()")
xid_before=$(psql -Atc "select txid_snapshot_xmax(txid_current_snapshot())")
row_before=$(psql -Atc "select xmin::text || '/' || xmax::text from fence.leases where resource = 'held'")
for _ in $(seq 1 "$refusals"); do $fence acquire held --owner other -q 2>/dev/null || true; done
after=$(psql -Atc "select pg_current_wal_insert_lsn()")
xid_after=$(psql -Atc "select txid_snapshot_xmax(txid_current_snapshot())")
row_after=$(psql -Atc "select xmin::text || '/' || xmax::text from fence.leases where resource = 'held'")
attempts=$(psql -Atc "select coalesce(sum(count), 0) from fence.attempts where resource = 'held'")
echo "$refusals refused acquires: lease row xmin/xmax $row_before before, $row_after after; $attempts attempts recorded; $(psql -Atc "select pg_wal_lsn_diff('$after', '$before')") bytes of WAL, $((xid_after - xid_before)) transaction ids assigned" | tee "$out/wal.txt"
psql -qc "alter system reset autovacuum" -c "select pg_reload_conf()" >/dev/null

echo
echo "## Acquire latency with 100 and with $prefill resources (prefilled, one worker, spread)"
$fence bench --workers 1 --duration "${seconds}s" --mode spread --resources 100 --prefill --format json > "$out/spread100.json"
$fence bench --workers 1 --duration "${seconds}s" --mode spread --resources "$prefill" --prefill --format json > "$out/spread1m.json"
python3 - "$out/spread100.json" "$out/spread1m.json" <<'PY'
import json, sys
a = json.load(open(sys.argv[1])); b = json.load(open(sys.argv[2]))
print(f"acquire p50 with 100 resources: {a['acquire_p50_ms']} ms (p99 {a['acquire_p99_ms']} ms)")
print(f"acquire p50 with {b['resources']:,} resources: {b['acquire_p50_ms']} ms (p99 {b['acquire_p99_ms']} ms)  (ratio {b['acquire_p50_ms']/a['acquire_p50_ms']:.2f}x)")
PY
echo "# load after: $(uptime | sed 's/.*load average/load average/')"
echo

python3 - "$out" <<'PY'
import glob, json, os, re, statistics, sys
out = sys.argv[1]
conditions = {}
for line in open(f"{out}/conditions.txt"):
    r, fs, load, busy = line.split()
    conditions[int(r)] = (float(fs), float(load), float(busy))
rounds = sorted(conditions)
fs_median = statistics.median(c[0] for c in conditions.values())
BUSY_MAX = 25
abnormal = {r for r, (fs, load, busy) in conditions.items() if fs > 3 * fs_median or busy > BUSY_MAX}
normal = [r for r in rounds if r not in abnormal] or rounds
print("## Rounds")
print()
print("| round | fdatasync (8 kB) | CPU busy before it (1 s, nothing of ours running) | load average | |")
print("|---|---|---|---|---|")
for r in rounds:
    fs, load, busy = conditions[r]
    why = []
    if fs > 3 * fs_median:
        why.append(f"fsync over 3x the median ({fs_median:.0f} us)")
    if busy > BUSY_MAX:
        why.append(f"CPU over {BUSY_MAX}% busy with other work")
    print(f"| {r} | {fs:.0f} us | {busy:.0f}% | {load:.2f} | {'**abnormal**: ' + ', '.join(why) if why else 'normal'} |")
print()
if len(normal) < len(rounds):
    print(f"Medians below are of the normal rounds ({', '.join(map(str, normal))}); abnormal rounds are shown in brackets.")
else:
    print("Medians below are of all rounds.")
print()

def hyper(name):
    per = {}
    for r in rounds:
        path = f"{out}/{name}-{r}.json"
        if os.path.exists(path):
            per[r] = {x["command"]: x["median"] * 1000 for x in json.load(open(path))["results"]}
    return per
def tps(name, r):
    return float(re.search(r"tps = ([0-9.]+)", open(f"{out}/{name}-{r}.txt").read()).group(1))
def bench(name, r):
    return json.load(open(f"{out}/{name}-{r}.json"))
pair, one, wr, rn, et, bo = (hyper(n) for n in ["pair", "one", "write", "run", "etcd", "bouncer"])
cold = {}
for line in open(f"{out}/cold.txt"):
    r, case, ms = line.split()
    cold.setdefault(case, {})[int(r)] = float(ms)

def fmt(v, unit):
    return f"{v:.2f}{unit}" if unit == "x" else f"{v:.1f}{unit}" if unit == " ms" else f"{v:.0f}{unit}"
def series(values, unit):
    """values: {round: v}. The median of the normal rounds, their range, and each round."""
    use = [values[r] for r in normal if r in values]
    if not use:
        return None, "not measured"
    med = statistics.median(use)
    each = ", ".join((f"[{fmt(values[r], unit)}]" if r in abnormal else fmt(values[r], unit))
                     for r in rounds if r in values)
    return med, f"{fmt(med, unit)} ({fmt(min(use), unit)}–{fmt(max(use), unit)}; rounds: {each})"

print("## Whole invocations (hyperfine medians, ms)")
print()
print("| measurement | median of rounds (range; each round) |")
print("|---|---|")
rows = [
    ("`fence acquire` + `fence release` (two processes)", pair, "fence acquire + release"),
    ("floor twice: connect + `SELECT 1`, two processes", pair, "floor twice (2 processes)"),
    ("`fence acquire` + `fence release`, TLS (`sslmode=prefer`)", pair, "fence acquire + release, sslmode=prefer"),
    ("one `fence acquire` (a reacquire)", one, "fence acquire (reacquire)"),
    ("floor: connect + `SELECT 1`", one, "floor (connect + SELECT 1)"),
    ("`fence write` (fenced transaction)", wr, "fence write (fenced transaction)"),
    ("the same transaction unfenced", wr, "unfenced transaction, same SQL (floor)"),
    ("`fence run R -- true`, embedded store", rn, "fence run R -- true (embedded store)"),
    ("`flock /tmp/x true`", rn, "flock /tmp/x true"),
    ("`true` (one process start)", rn, "true (one process start)"),
    ("`fence --version` (fence's own start)", rn, "fence --version (fence's own start)"),
    ("`fence run R -- true`, PostgreSQL", rn, "fence run R -- true (PostgreSQL)"),
    ("`fence run R -- true`, PostgreSQL (beside etcd)", et, "fence run R -- true (PostgreSQL)"),
    ("`etcdctl lock R -- true`", et, "etcdctl lock R -- true"),
    ("one `fence acquire` through PgBouncer (SCRAM verifier in its userlist)", bo, "fence acquire (reacquire) through PgBouncer"),
    ("floor through PgBouncer", bo, "floor through PgBouncer"),
    ("one `fence acquire` through PgBouncer, plaintext password in its userlist", bo, "fence acquire through PgBouncer, plaintext userlist"),
]
for label, table, key in rows:
    values = {r: t[key] for r, t in table.items() if key in t}
    if values:
        print(f"| {label} | {series(values, ' ms')[1]} |")
print()
print("On a fresh connection (`pgbench -C`), ms per connection + statement:")
print()
names = {
    "select1": "`SELECT 1` (trivial statement)",
    "read": "`SELECT` of one lease row (no change)",
    "busy": "fence's acquire statement, refused (busy)",
    "write1": "a one-row `UPDATE` (a trivial durable write)",
    "regrant": "fence's acquire statement, granting a resource it knows (a reacquire)",
    "grant": "fence's acquire statements, granting a new resource (the short one, then the one that creates it)",
    "plpgsql": "the PL/pgSQL `acquire()` (version 4's one-shot path), granting",
}
print("| statement | connection + statement | statement alone (median, `pgbench -l`) |")
print("|---|---|---|")
for case, label in names.items():
    alone = [int(l.split()[2]) / 1000 for r in normal for f in glob.glob(f"{out}/logs/{case}-{r}*") for l in open(f)]
    print(f"| {label} | {series(cold[case], ' ms')[1]} | {statistics.median(alone):.2f} ms |")
print()

def ratio(a, ka, b, kb):
    return {r: a[r][ka] / b[r][kb] for r in rounds if r in a and r in b and ka in a[r] and kb in b[r]}
b64 = {r: bench("bench64", r)["critical_sections_per_s"] for r in rounds}
b8 = {r: bench("bench8", r)["critical_sections_per_s"] for r in rounds}
b64held = {r: bench("bench64held", r)["critical_sections_per_s"] for r in rounds}
s64 = {}
for line in open(f"{out}/sessions.txt"):
    r, n = line.split()
    r = int(r)
    s64[r] = int(n) / (bench("bench64", r)["duration_ms"] / 1000)
h50 = {r: bench("handoff", r)["handoff_p50_ms"] for r in rounds}
h99 = {r: bench("handoff", r)["handoff_p99_ms"] for r in rounds}
durable = {r: tps("durable", r) for r in rounds}
lock = {r: tps("lock", r) for r in rounds}
print(f"## Hot resource and hand-off (`fence bench`, {os.environ.get('seconds', '10')} s each)")
print()
print("| measurement | median of rounds (range; each round) |")
print("|---|---|")
hot = os.environ.get("hot", "64")
print(f"| {hot} workers on one resource, critical sections/s | {series(b64, '/s')[1]} |")
print(f"| {hot} workers on one resource, `--held-waiters {hot}`, critical sections/s | {series(b64held, '/s')[1]} |")
print(f"| 8 workers on one resource, critical sections/s | {series(b8, '/s')[1]} |")
print(f"| {hot} workers on one resource, new PostgreSQL sessions/s (far waiters reconnect to poll) | {series(s64, '/s')[1]} |")
print(f"| durable one-row `UPDATE` loop, {hot} clients, updates/s | {series(durable, '/s')[1]} |")
print(f"| `pg_advisory_lock` loop, {hot} clients, lock+unlock/s | {series(lock, '/s')[1]} |")
print(f"| `--wait` hand-off, 2 workers, p50 | {series(h50, ' ms')[1]} |")
print(f"| `--wait` hand-off, 2 workers, p99 | {series(h99, ' ms')[1]} |")
print()

print("## Targets")
print()
print("Each ratio is taken within a round (both sides measured side by side), then the median of the rounds.")
print()
print("| target | measured: median (range; each round) | |")
print("|---|---|---|")
def target(name, values, unit, ok):
    med, text = series(values, unit)
    if med is None:
        print(f"| {name} | {text} | |")
    else:
        print(f"| {name} | {text} | {'met' if ok(med) else '**not met**'} |")
target("`--wait` hand-off p50 ≤ 1 ms, 2 workers (issue 37)", h50, " ms", lambda m: m <= 1)
target(f"{hot} workers on one resource ≥ 10× issue 37's 17–26/s (≥ 260/s) and ≥ the 8-worker rate",
       b64, "/s", lambda m: m >= 260 and m >= statistics.median(b8[r] for r in normal))
target(f"the same with `--held-waiters {hot}` ({hot} + 2 connections for the resource)",
       b64held, "/s", lambda m: m >= 260 and m >= statistics.median(b8[r] for r in normal))
target("`fence run` (embedded store) ≤ 2.0× `flock x true` (issue 37; goal 1.5×)",
       ratio(rn, "fence run R -- true (embedded store)", rn, "flock /tmp/x true"), "x", lambda m: m <= 2.0)
target("one `fence acquire` ≤ 1.4× the floor, direct connection (issue 37)",
       ratio(one, "fence acquire (reacquire)", one, "floor (connect + SELECT 1)"), "x", lambda m: m <= 1.4)
target("one `fence acquire` ≤ 1.1× the floor through PgBouncer, SCRAM verifier in its userlist (issue 37)",
       ratio(bo, "fence acquire (reacquire) through PgBouncer", bo, "floor through PgBouncer"), "x", lambda m: m <= 1.1)
plain_ratio = ratio(bo, "fence acquire through PgBouncer, plaintext userlist", bo, "floor through PgBouncer")
if plain_ratio:
    print(f"| (the trap) the same with the plaintext password in its userlist | {series(plain_ratio, 'x')[1]} | |")
target("`fence run` (PostgreSQL, trust) ≤ 0.5× `etcdctl lock` (no auth) (issue 22)",
       ratio(et, "fence run R -- true (PostgreSQL)", et, "etcdctl lock R -- true"), "x", lambda m: m <= 0.5)
target(f"hot resource, {hot} workers ≥ 0.5× durable one-row updates (issue 22)",
       {r: b64[r] / durable[r] for r in rounds}, "x", lambda m: m >= 0.5)
target("acquire statement on a fresh connection ≤ 1.2× `SELECT 1`, refused (issue 22)",
       {r: cold["busy"][r] / cold["select1"][r] for r in rounds}, "x", lambda m: m <= 1.2)
target("the same, granting a resource it knows vs a one-row `UPDATE` (issue 22)",
       {r: cold["regrant"][r] / cold["write1"][r] for r in rounds}, "x", lambda m: m <= 1.2)
target("the same, granting a new resource (two statements) vs a one-row `UPDATE` (issue 22)",
       {r: cold["grant"][r] / cold["write1"][r] for r in rounds}, "x", lambda m: m <= 1.2)
wal = open(f"{out}/wal.txt").read()
m = re.search(r"(\d+) refused acquires: lease row xmin/xmax (\S+) before, (\S+) after; (\d+) attempts recorded; (\d+) bytes of WAL, (\d+) transaction ids", wal)
print(f"| a refused acquire leaves the lease row untouched (issue 22) | {int(m.group(1)):,} refused: lease row {m.group(2)} before and {m.group(3)} after; {m.group(4)} attempts recorded ({m.group(5)} bytes of WAL, {m.group(6)} transaction ids) | {'met' if m.group(2) == m.group(3) else '**not met**'} |")
PY
