#!/bin/sh
# The side-by-side benchmark of docs/benchmarks.md, "At scale": Allow beside
# the hand-written upsert over tables of 10 000, 1 000 000 and 10 000 000
# rows (both filled alike, VACUUM ANALYZE, ids drawn at random from the
# whole table), one run each, with the load average and the disk's flush
# rate (pg_test_fsync, one 8 kB write, fdatasync) before and after each:
#
#   URL=postgres://.../countlimit_scale docs/scale/bench.sh
#
# countlimit, pg_test_fsync and uptime must be on PATH; pg_test_fsync
# writes its file in the current directory (put it on the database's disk).
set -eu
: "${URL:?set URL to a scratch database}"
: "${ROWS:=10000 1000000 10000000}"
: "${CALLERS:=1,16,64}"
: "${DURATION:=5s}"
fsync() { pg_test_fsync -s 2 -f ./pg_test_fsync.tmp | sed -n 's/^ *fdatasync  */fdatasync: /p' | head -1; rm -f ./pg_test_fsync.tmp; }
for n in $ROWS; do
	echo "== $n rows: $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')"
	fsync
	countlimit bench --baseline --store "$URL" --rows existing --table-rows "$n" --callers "$CALLERS" --duration "$DURATION" --json > "scale-$n.json"
	echo "== done: $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')"
	fsync
done
