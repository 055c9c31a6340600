#!/usr/bin/env bash
# The directory store's history at scale: one resource's log with 2,000,000 events (153 MB, as
# an old busy resource may have had before retention), and `fence inspect r --history 5` on it,
# timed by /usr/bin/time -v (wall clock and peak memory). A benchmark, not a check: it prints
# figures and asserts nothing about time.
# Usage: benches/history.sh [events, default 2000000]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
events=${1:-2000000}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --quiet --release --bin fence
fence="$CARGO_TARGET_DIR/release/fence"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
store="file://$dir/store"
mkdir "$dir/store"
owner=$("$fence" --store "$store" acquire r --owner bench --format json | sed -n 's/.*"token":\([0-9]*\).*/\1/p')
"$fence" --store "$store" release r --owner bench --token "$owner" >/dev/null
# The log as fence writes it: one JSON object per line, oldest first.
awk -v n="$events" 'BEGIN {
    for (t = 1; t <= n; t++)
        printf "{\"at_ms\":%d,\"kind\":\"%s\",\"owner\":\"cron/%d\",\"token\":%d}\n",
            1700000000000 + t, (t % 2 ? "acquired" : "released"), t, t
}' >"$dir/store/events/r.jsonl"
size=$(($(stat -c %s "$dir/store/events/r.jsonl") >> 20))
/usr/bin/time -v "$fence" --store "$store" inspect r --history 5 --format json 2>"$dir/time" >/dev/null
grep -E 'Elapsed \(wall clock\)|Maximum resident set size' "$dir/time" | sed "s/^\s*/$size MB log: /"
