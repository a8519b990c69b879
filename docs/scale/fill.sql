-- Fills count_limit (migrated by `countlimit migrate up`) with :rows rows of
-- one use type, 'scale', as many fixed 1m windows would leave them, for the
-- measurements at scale in docs/benchmarks.md ("At scale"):
--
--   psql "$URL" -v rows=10000000 -f docs/scale/fill.sql
--
-- Every 10th row's window ended an hour ago (what a purge deletes: a tenth
-- of the table), the others end in a day; every 1 000th row was denied
-- (denied_count 1 to 97, written now, for countlimit_most_denied and
-- countlimit top); every 10 000th is blocked for an hour. Ids are
-- 'scale-' and eight digits, so that rows go in in key order and an id
-- names its row: scale-00000000 ... scale-09999999. Beside it,
-- count_limit_baseline, the hand-written upsert's table of `countlimit bench
-- --baseline`, with a row for each id too.
\timing on
CREATE TABLE IF NOT EXISTS count_limit_baseline (
    key          text PRIMARY KEY,
    count        bigint NOT NULL,
    window_begin timestamptz NOT NULL,
    window_end   timestamptz NOT NULL);
TRUNCATE count_limit, count_limit_lease, count_limit_baseline;
INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time,
        limit_value, denied_count, blocked_until, created_at, updated_at, window_kind)
SELECT 'scale', 'scale-' || lpad(i::text, 8, '0'), 1,
    CASE WHEN i % 10 = 0 THEN now() - interval '61 minutes' ELSE now() END,
    CASE WHEN i % 10 = 0 THEN now() - interval '60 minutes' ELSE now() + interval '1 day' END,
    100,
    CASE WHEN i % 1000 = 7 THEN 1 + i % 97 ELSE 0 END,
    CASE WHEN i % 10000 = 3 THEN now() + interval '1 hour' END,
    now(),
    CASE WHEN i % 1000 = 7 THEN now() ELSE now() - interval '2 hours' END,
    'fixed'
FROM generate_series(0, :rows - 1) AS i;
INSERT INTO count_limit_baseline (key, count, window_begin, window_end)
SELECT unique_id, already_count, begin_time, end_time FROM count_limit;
VACUUM ANALYZE count_limit, count_limit_baseline;
SELECT t AS "table", n AS rows,
    pg_size_pretty(pg_table_size(t)) AS heap,
    pg_size_pretty(pg_indexes_size(t)) AS indexes,
    round(pg_total_relation_size(t)::numeric / n, 1) AS bytes_per_row
FROM (VALUES ('count_limit'::regclass, (SELECT count(*) FROM count_limit)),
    ('count_limit_baseline'::regclass, (SELECT count(*) FROM count_limit_baseline))) AS v (t, n);
