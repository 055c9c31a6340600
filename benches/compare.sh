#!/usr/bin/env bash
# Measures whole `fence` invocations against their floor, side by side on one machine:
#   - `fence acquire` + `fence release` vs the minimal tokio-postgres program
#     (examples/pg_floor.rs) doing the same two statements vs two `psql -c`;
#   - one `fence acquire` (a reacquire: one UPDATE) vs the floor doing the same.
# Runs inside a throwaway cluster from pg_virtualenv (works as root); needs hyperfine
# (Debian package `hyperfine`). All clients use sslmode=disable so the comparison is like for
# like; one extra line shows fence with the default sslmode=prefer (TLS on loopback).
#
# Usage: benches/compare.sh [RUNS]      (default 200 runs per command)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs=${1:-200}

if [[ -z ${FENCE_BENCH_INSIDE:-} ]]; then
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/fence-target}"
    command -v hyperfine >/dev/null || { echo "benches/compare.sh: install hyperfine (apt-get install hyperfine)" >&2; exit 2; }
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
hyperfine --warmup 20 --runs "$runs" --export-json "$out/one.json" --style basic \
    -n "fence acquire (reacquire)" "$fence acquire one-a --owner o -q" \
    -n "tokio-postgres floor acquire" "$floor acquire one-b o"

psql -qc "CREATE TABLE IF NOT EXISTS bench_totals (id int PRIMARY KEY, n bigint); INSERT INTO bench_totals VALUES (1, 0) ON CONFLICT DO NOTHING"
hyperfine --warmup 20 --runs "$runs" --export-json "$out/write.json" --style basic \
    -n "fence write (fenced transaction)" "$fence write totals --token 1 --target $plain --sql 'UPDATE bench_totals SET n = n + 1' -q" \
    -n "unfenced transaction, same SQL (floor)" "$floor txn 'UPDATE bench_totals SET n = n + 1'"

python3 - "$out/pair.json" "$out/one.json" "$out/write.json" <<'PY'
import json, sys
pair = {r["command"]: r for r in json.load(open(sys.argv[1]))["results"]}
one = {r["command"]: r for r in json.load(open(sys.argv[2]))["results"]}
wr = {r["command"]: r for r in json.load(open(sys.argv[3]))["results"]}
def ms(r): return r["median"] * 1000
f, fl, ps, tls = (pair[k] for k in ["fence acquire + release", "tokio-postgres floor (2 processes)", "psql -c twice", "fence acquire + release, sslmode=prefer"])
a, b = one["fence acquire (reacquire)"], one["tokio-postgres floor acquire"]
print()
print("| measurement | median |")
print("|---|---|")
fw, uw = wr["fence write (fenced transaction)"], wr["unfenced transaction, same SQL (floor)"]
for name, r in [("fence write: fenced transaction, one process", fw), ("floor: unfenced transaction, same SQL", uw), ("fence acquire + release", f), ("floor: tokio-postgres, same 2 statements", fl), ("psql -c twice", ps), ("fence acquire + release, TLS (sslmode=prefer)", tls), ("fence acquire (one process)", a), ("floor acquire (one process)", b)]:
    print(f"| {name} | {ms(r):.1f} ms |")
print()
print(f"fence pair / floor pair: {ms(f)/ms(fl):.2f}x   fence pair / psql pair: {ms(f)/ms(ps):.2f}x   fence acquire / floor acquire: {ms(a)/ms(b):.2f}x   fenced / unfenced transaction: {ms(fw)/ms(uw):.2f}x")
PY
rm -rf "$out"
