#!/bin/sh
# Live checks beside a purge and beside a DBA's reads, over the table
# docs/scale/fill.sql filled (docs/benchmarks.md, "At scale"):
#
#   URL=postgres://.../countlimit_scale docs/scale/beside.sh
#
# 1. 16 callers of Allow (countlimit bench, over 10 000 ids of use types of
#    its own, in the same table) alone; 2. the same beside
#    `countlimit purge` of the table's 1 000 000 expired rows, timed; 3. the
#    same beside a loop of what docs/scale/dba.sql runs by hand, counting
#    the samples (every 0.2 s) in which a session of the database waits
#    for a lock. countlimit and psql must be on PATH.
set -eu
: "${URL:?set URL to a scratch database}"
: "${DURATION:=20s}"
load() { uptime | sed 's/.*load/load/'; }
bench() { countlimit bench --store "$URL" --callers 16 --ids 10000 --duration "$DURATION"; }
locks() {
	n=0 waits=0
	while [ ! -f ./beside.stop ]; do
		w=$(psql "$URL" -Atc "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
		n=$((n + 1)); waits=$((waits + w))
		sleep 0.2
	done
	echo "lock waits: $waits in $n samples"
}
rm -f ./beside.stop
echo "== alone: $(date -u +%H:%M:%S) $(load)"
bench
echo "== beside purge: $(date -u +%H:%M:%S) $(load)"
psql "$URL" -Atc "SELECT count(*) AS expired FROM count_limit WHERE end_time <= now()"
locks > ./beside.locks &
start=$(date +%s.%N)
( countlimit purge --store "$URL" --batch 1000 > ./beside.purge; echo "purge took $(echo "$(date +%s.%N) - $start" | bc) s" >> ./beside.purge ) &
purge=$!
bench
echo "bench done: $(date -u +%H:%M:%S) $(load)"
wait $purge
touch ./beside.stop; wait
cat ./beside.purge ./beside.locks
rm -f ./beside.stop
echo "== beside the DBA's reads: $(date -u +%H:%M:%S) $(load)"
locks > ./beside.locks &
( while [ ! -f ./beside.stop ]; do
	psql "$URL" -q -o /dev/null -c "SELECT count(*) FROM countlimit_most_denied()" \
		-c "SELECT * FROM count_limit_status WHERE used > 0 ORDER BY remaining, used DESC, use_type, unique_id LIMIT 20" \
		-c "SELECT * FROM count_limit_status WHERE denied_count > 0 ORDER BY denied_count DESC, use_type, unique_id LIMIT 20" \
		-c "SELECT * FROM count_limit_status WHERE blocked ORDER BY blocked_until DESC, use_type, unique_id LIMIT 20"
	echo x >> ./beside.reads
done ) &
rm -f ./beside.reads
bench
touch ./beside.stop; wait
echo "DBA read loops completed: $(wc -l < ./beside.reads)"
cat ./beside.locks
rm -f ./beside.stop ./beside.reads ./beside.locks ./beside.purge
echo "== end: $(date -u +%H:%M:%S) $(load)"
