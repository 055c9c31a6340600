#!/usr/bin/env bash
# `fence inspect` at scale (issue 25): a PostgreSQL coordinator with 100,000 resources (a tenth
# of them held) and one resource with 1,000,000 events; times and peak memory of
#   fence inspect --state held
#   fence inspect --history 1 --limit 100
#   fence inspect hot --history 5
#   fence inspect --history 1            (every resource: an answer printed page by page)
#   fence prune --older-than 0s --keep 1 (every resource; after the inspections)
# Runs in a throwaway cluster from pg_virtualenv (fsync as the server's default, on) with the
# release binary. Usage: benches/inspect.sh [runs per command, default 5]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs=${1:-5}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

if [[ -z ${FENCE_BENCH_INSIDE:-} ]]; then
    cargo build --quiet --release --bin fence
    FENCE_BENCH_INSIDE=1 exec pg_virtualenv -o fsync=on "$0" "$runs"
fi

fence="$CARGO_TARGET_DIR/release/fence"
store="postgresql://$PGUSER:$PGPASSWORD@$PGHOST:$PGPORT/$PGDATABASE"
"$fence" --store "$store" init >/dev/null
psql -X -q -v ON_ERROR_STOP=1 <<'SQL'
INSERT INTO fence.leases (resource, owner, token, acquired_at, renewed_at, expires_at, ttl_ms, last_event)
SELECT format('res-%s', lpad(i::text, 6, '0')), CASE WHEN i % 10 = 0 THEN 'holder' END, 1,
       now(), now(), CASE WHEN i % 10 = 0 THEN now() + interval '1 hour' END, 3600000,
       CASE WHEN i % 10 = 0 THEN 'acquired' ELSE 'released' END
FROM generate_series(1, 100000) AS i;
INSERT INTO fence.events (resource, at, kind, owner, token)
SELECT format('res-%s', lpad(i::text, 6, '0')), now(), 'acquired', 'holder', 1
FROM generate_series(1, 100000) AS i;
INSERT INTO fence.leases (resource, owner, token, acquired_at, renewed_at, expires_at, ttl_ms, last_event)
VALUES ('hot', 'holder', 1000000, now(), now(), now() + interval '1 hour', 3600000, 'acquired');
INSERT INTO fence.events (resource, at, kind, owner, token)
SELECT 'hot', now(), 'acquired', 'holder', i FROM generate_series(1, 1000000) AS i;
ANALYZE;
SQL
echo "cluster: fsync=$(psql -XAtqc 'show fsync'), synchronous_commit=$(psql -XAtqc 'show synchronous_commit')"
measure() {
    local label=$1; shift
    local best_us="" best_kb=""
    for _ in $(seq "$runs"); do
        local start=$EPOCHREALTIME kb
        kb=$( { /usr/bin/time -f '%M' "$fence" --store "$store" "$@" >/dev/null; } 2>&1 | tail -n1)
        local us=$(( (${EPOCHREALTIME/./} - ${start/./}) ))
        if [[ -z $best_us || $us -lt $best_us ]]; then best_us=$us; fi
        if [[ -z $best_kb || $kb -gt $best_kb ]]; then best_kb=$kb; fi
    done
    printf '%-45s best %6.1f ms   peak RSS %6d KB\n' "$label" "$(bc -l <<<"$best_us / 1000")" "$best_kb"
}
measure "inspect --state held (10,000 of 100,000)" inspect --state held --format json
measure "inspect --history 1 --limit 100" inspect --history 1 --limit 100 --format json
measure "inspect hot --history 5 (1,000,000 events)" inspect hot --history 5 --format json
measure "inspect --history 1 (all 100,001)" inspect --history 1 --format json
# Once: the first run deletes 999,999 events of `hot`; later runs would find nothing to do.
runs=1 measure "prune --older-than 0s --keep 1 (once)" prune --older-than 0s --keep 1 --format json
