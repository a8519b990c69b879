#!/bin/sh
# What count_limit_end_time_idx costs at scale (docs/benchmarks.md, "The
# end_time index at 10 million rows"): the --table-rows benchmark at
# 10 000 000 rows, alternately as the schema has it and with the index
# dropped (in the benchmark's own schema, once its fill has committed), each
# run's share of HOT updates of count_limit sampled from pg_stat_user_tables
# while it runs (the benchmark drops its schema, and the counts, at its end):
#
#   URL=postgres://.../countlimit_scale docs/scale/noindex.sh
#
# countlimit and psql must be on PATH: a build of v0.1.0, before v0.2.0's
# migration drops the index for good (this is the measurement that led to it).
set -eu
: "${URL:?set URL to a scratch database}"
: "${ROWS:=10000000}"
: "${MODES:=drop keep drop keep}"
hot() {
	psql "$URL" -Atc "SELECT n_tup_upd || ' updates, ' || n_tup_hot_upd || ' HOT' FROM pg_stat_user_tables
		WHERE relname = 'count_limit' AND schemaname LIKE 'countlimit_bench_%' AND n_tup_ins >= $ROWS"
}
for mode in $MODES; do
	echo "== $mode: $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')"
	(
		while :; do # the fill committed: the index goes (drop), the counts are read
			s=$(psql "$URL" -Atc "SELECT schemaname FROM pg_stat_user_tables WHERE relname = 'count_limit'
				AND schemaname LIKE 'countlimit_bench_%' AND n_tup_ins >= $ROWS")
			[ -n "$s" ] && break
			sleep 0.2
		done
		[ "$mode" = drop ] && psql "$URL" -qc "DROP INDEX $s.count_limit_end_time_idx"
		last=
		while h=$(hot) && [ -n "$h" ]; do last=$h; sleep 0.5; done
		echo "count_limit: $last"
	) &
	countlimit bench --baseline --store "$URL" --rows existing --table-rows "$ROWS" --callers 16,64 --duration 5s
	wait
done
