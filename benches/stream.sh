#!/usr/bin/env bash
# Issue 37: what the answers that grow with the history cost at full size — a directory
# store whose resource has a log of 2,000,000 events (as benches/history.sh writes it), and a
# PostgreSQL coordinator (a throwaway cluster from pg_virtualenv, fsync on) whose resource has
# 1,000,000 events — timed by /usr/bin/time (wall clock and peak RSS), output to /dev/null:
#   fence inspect r --history N --format json     (N: every event)
#   fence log r --limit N --format ndjson
#   fence log r --limit N --format json
#   fence metrics                                  (directory store: it reads every log)
# A benchmark, not a check: it prints figures and asserts nothing about time.
# Usage: benches/stream.sh [directory-store events, default 2000000] [PostgreSQL events, default 1000000]
# FENCE_BENCH_BIN measures another fence binary (e.g. one built from an older commit).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
file_events=${1:-2000000}
pg_events=${2:-1000000}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

if [[ -z ${FENCE_BENCH_INSIDE:-} ]]; then
    if [[ -z ${FENCE_BENCH_BIN:-} ]]; then
        cargo build --quiet --release --bin fence
        export FENCE_BENCH_BIN="$CARGO_TARGET_DIR/release/fence"
    fi
    fence=$FENCE_BENCH_BIN
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    store="file://$dir/store"
    mkdir "$dir/store"
    token=$("$fence" --store "$store" acquire r --owner bench --format json | sed -n 's/.*"token":\([0-9]*\).*/\1/p')
    "$fence" --store "$store" release r --owner bench --token "$token" >/dev/null
    awk -v n="$file_events" 'BEGIN {
        for (t = 1; t <= n; t++)
            printf "{\"at_ms\":%d,\"kind\":\"%s\",\"owner\":\"cron/%d\",\"token\":%d}\n",
                1700000000000 + t, (t % 2 ? "acquired" : "released"), t, t
    }' >"$dir/store/events/r.jsonl"
    echo "directory store: $file_events events, $(($(stat -c %s "$dir/store/events/r.jsonl") >> 20)) MiB of log"
    measure() {
        local label=$1; shift
        /usr/bin/time -f '%e s %M KB' "$fence" --store "$store" "$@" 2>"$dir/time" >/dev/null
        printf '  %-44s %s\n' "$label" "$(tail -n1 "$dir/time")"
    }
    measure "inspect r --history N --format json" inspect r --history "$file_events" --format json
    measure "log r --limit N --format ndjson" log r --limit "$file_events" --format ndjson
    measure "log r --limit N --format json" log r --limit "$file_events" --format json
    measure "metrics" metrics
    FENCE_BENCH_INSIDE=1 exec pg_virtualenv -o fsync=on "$0" "$file_events" "$pg_events"
fi

fence=$FENCE_BENCH_BIN
store="postgresql://$PGUSER:$PGPASSWORD@$PGHOST:$PGPORT/$PGDATABASE"
token=$("$fence" --store "$store" acquire r --owner bench --format json | sed -n 's/.*"token":\([0-9]*\).*/\1/p')
"$fence" --store "$store" release r --owner bench --token "$token" >/dev/null
# Oldest first, a second apart, before the acquire and release above; each renewal's lease
# runs 2 s, so each is renewed in time but the last.
psql -X -q -v ON_ERROR_STOP=1 <<SQL
INSERT INTO fence.events (resource, at, kind, owner, token, ttl_ms, expires_at)
SELECT 'r', now() - interval '1 day' - ($pg_events - i) * interval '1 second', 'renewed', 'holder', i,
       2000, now() - interval '1 day' - ($pg_events - i) * interval '1 second' + interval '2 seconds'
FROM generate_series(1, $pg_events) AS i;
ANALYZE;
SQL
echo "PostgreSQL: $(psql -XAtqc "SELECT count(*) FROM fence.events WHERE resource = 'r'") events (fsync=$(psql -XAtqc 'show fsync'))"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
measure() {
    local label=$1; shift
    /usr/bin/time -f '%e s %M KB' "$fence" --store "$store" "$@" 2>"$out" >/dev/null
    printf '  %-44s %s\n' "$label" "$(tail -n1 "$out")"
}
measure "inspect r --history N --format json" inspect r --history "$pg_events" --format json
measure "log r --limit N --format ndjson" log r --limit "$pg_events" --format ndjson
measure "log r --limit N --format json" log r --limit "$pg_events" --format json
echo "  psql reading the same rows:"
/usr/bin/time -f '%e s %M KB' psql -XAtqc "SELECT * FROM fence.events WHERE resource = 'r' ORDER BY id" 2>"$out" >/dev/null
printf '  %-44s %s\n' "psql SELECT * … ORDER BY id" "$(tail -n1 "$out")"
