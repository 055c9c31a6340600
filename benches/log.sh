#!/usr/bin/env bash
# `fence log` at scale (issue 19): a PostgreSQL coordinator with 1,000,000 events of one
# resource spread over the last 30 days (about 1,400 in the last hour), and 100,000 other
# resources with one event each; times and peak memory of
#   fence log --resource hot --since 1h
#   fence log --resource 'res-00001*' --since 1h
#   fence log --since 1h                          (every resource: one index probe each)
# Runs in a throwaway cluster from pg_virtualenv (fsync as the server's default, on) with the
# release binary. Usage: benches/log.sh [runs per command, default 5]
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
SELECT format('res-%s', lpad(i::text, 6, '0')), NULL, 1, now(), now(), NULL, 3600000, 'released'
FROM generate_series(1, 100000) AS i;
INSERT INTO fence.events (resource, at, kind, owner, token, ttl_ms, expires_at)
SELECT format('res-%s', lpad(i::text, 6, '0')), now() - (i % 720) * interval '1 hour', 'acquired',
       'holder', 1, 3600000, now()
FROM generate_series(1, 100000) AS i;
INSERT INTO fence.leases (resource, owner, token, acquired_at, renewed_at, expires_at, ttl_ms, last_event)
VALUES ('hot', 'holder', 1000000, now(), now(), now() + interval '1 hour', 3600000, 'acquired');
-- Oldest first, as a store writes them: event i of 1,000,000 at 30 days × (1 − i/1,000,000) ago.
INSERT INTO fence.events (resource, at, kind, owner, token, ttl_ms, expires_at)
SELECT 'hot', now() - (1000000 - i) * interval '2592 milliseconds', 'renewed', 'holder', i,
       60000, now()
FROM generate_series(1, 1000000) AS i;
ANALYZE;
SQL
echo "cluster: fsync=$(psql -XAtqc 'show fsync'), synchronous_commit=$(psql -XAtqc 'show synchronous_commit')"
echo "events of hot in the last hour: $(psql -XAtqc "SELECT count(*) FROM fence.events WHERE resource = 'hot' AND at >= now() - interval '1 hour'")"
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
    printf '%-52s best %6.1f ms   peak RSS %6d KB\n' "$label" "$(bc -l <<<"$best_us / 1000")" "$best_kb"
}
measure "log --resource hot --since 1h (1,000,000 events)" log --resource hot --since 1h --format json
measure "log --resource 'res-00001*' --since 1h" log --resource 'res-00001*' --since 1h --format json
measure "log --since 1h (100,001 resources)" log --since 1h --format json
