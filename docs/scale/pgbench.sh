#!/bin/sh
# One caller's time per call: the statement a lone Allow on the pool runs
# for a row that exists and is free (countlimit_allow_one_pooled), the one
# a lone smooth and a lone sliding Allow run (countlimit_apply, on use types
# of their own, whose rows the first calls create), and the hand-written
# upsert, over the tables docs/scale/fill.sql filled, ids drawn at random
# from the whole table; three rounds of 5 s alternated (docs/benchmarks.md,
# "PostgreSQL at one caller"):
#
#   URL=postgres://.../countlimit_scale ROWS=10000 SYNC=off docs/scale/pgbench.sh
#
# SYNC=off (the default) takes the disk out: what a call costs the
# database's CPU. SYNC=on adds each commit's flush, as a lone Allow and
# the upsert wait for it. pgbench must be on PATH.
set -eu
: "${URL:?set URL to a scratch database}"
: "${ROWS:=10000000}"
: "${SYNC:=off}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/allow.sql" <<SQL
\set i random(0, $ROWS - 1)
SELECT o_allowed FROM countlimit_allow_one_pooled('scale', 'scale-' || lpad(:i::text, 8, '0'), now(), 1, 1000000000,
    date_trunc('minute', now()), date_trunc('minute', now()) + interval '1 minute', NULL, 'fixed');
SQL
cat > "$dir/smooth.sql" <<SQL
\set i random(0, $ROWS - 1)
SELECT o_allowed FROM countlimit_apply('allow', 'scale-' || lpad(:i::text, 8, '0'), now(), 1, ARRAY['scale.smooth'],
    ARRAY[1000000000::bigint], ARRAY[NULL::timestamptz], ARRAY[0::bigint], ARRAY[0::bigint], ARRAY[0::bigint],
    ARRAY['smooth'], ARRAY[1::bigint], ARRAY[1000000000::bigint]);
SQL
cat > "$dir/sliding.sql" <<SQL
\set i random(0, $ROWS - 1)
SELECT o_allowed FROM countlimit_apply('allow', 'scale-' || lpad(:i::text, 8, '0'), now(), 1, ARRAY['scale.sliding'],
    ARRAY[10000::bigint], ARRAY[NULL::timestamptz], ARRAY[0::bigint], ARRAY[1000000::bigint], ARRAY[0::bigint],
    ARRAY['sliding'], ARRAY[0::bigint], ARRAY[0::bigint]);
SQL
cat > "$dir/upsert.sql" <<SQL
\set i random(0, $ROWS - 1)
INSERT INTO count_limit_baseline AS c (key, count, window_begin, window_end)
VALUES ('scale-' || lpad(:i::text, 8, '0'), 1, date_trunc('minute', now()), date_trunc('minute', now()) + interval '1 minute')
ON CONFLICT (key) DO UPDATE SET
    count        = CASE WHEN c.window_end <= now() THEN 1 ELSE c.count + 1 END,
    window_begin = CASE WHEN c.window_end <= now() THEN excluded.window_begin ELSE c.window_begin END,
    window_end   = CASE WHEN c.window_end <= now() THEN excluded.window_end ELSE c.window_end END
WHERE c.count < 1000000000 OR c.window_end <= now()
RETURNING count;
SQL
for round in 1 2 3; do
	for side in allow smooth sliding upsert; do
		printf '%s round %s (%s): ' "$side" "$round" "$(uptime | sed 's/.*load/load/')"
		PGOPTIONS="-c synchronous_commit=$SYNC" pgbench -n -M prepared -c 1 -T 5 -f "$dir/$side.sql" "$URL" 2>&1 |
			sed -n 's/^latency average = /latency /p'
	done
done
