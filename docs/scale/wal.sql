-- What a first touch (a new id's row) writes to the WAL, on each side, over
-- the tables docs/scale/fill.sql filled (docs/benchmarks.md, "At scale"):
--
--   psql "$URL" -f docs/scale/wal.sql
--
-- EXPLAIN (ANALYZE, WAL) counts the records, full-page images and bytes a
-- statement writes, its functions' statements included, and nothing of the
-- other sessions of the server (pg_stat_wal counts them all); the commit
-- record, the same on both sides, is not in it. 1 000 new ids a statement,
-- in transactions rolled back: once with ids that sort after every row (a
-- new user appended), once with ids spread between the existing rows, each
-- on a leaf page of its own; each side twice, alternated, since a page's
-- first change after a checkpoint writes the whole page (fpi) and the next
-- ones do not.
\pset pager off
\set allow 'SELECT (countlimit_allow_one(''scale'', id, now(), 1, 100, date_trunc(''minute'', now()), date_trunc(''minute'', now()) + interval ''1 minute'', NULL, true, ''fixed'')).o_allowed FROM '
\set upsert 'INSERT INTO count_limit_baseline AS c (key, count, window_begin, window_end) SELECT id, 1, date_trunc(''minute'', now()), date_trunc(''minute'', now()) + interval ''1 minute'' FROM '
\set conflict ' ON CONFLICT (key) DO UPDATE SET count = CASE WHEN c.window_end <= now() THEN 1 ELSE c.count + 1 END, window_begin = CASE WHEN c.window_end <= now() THEN excluded.window_begin ELSE c.window_begin END, window_end = CASE WHEN c.window_end <= now() THEN excluded.window_end ELSE c.window_end END WHERE c.count < 100 OR c.window_end <= now() RETURNING count'
\set appended '(SELECT ''zz-'' || lpad(i::text, 8, ''0'') FROM generate_series(1, 1000) AS i) AS n (id)'
\set spread '(SELECT ''scale-'' || lpad((i * 9973)::text, 8, ''0'') || ''x'' FROM generate_series(1, 1000) AS i) AS n (id)'
\echo 'appended ids: Allow, upsert, Allow, upsert'
BEGIN; EXPLAIN (ANALYZE, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) :allow :appended; ROLLBACK;
BEGIN; EXPLAIN (ANALYZE, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) :upsert :appended :conflict; ROLLBACK;
BEGIN; EXPLAIN (ANALYZE, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) :allow :appended; ROLLBACK;
BEGIN; EXPLAIN (ANALYZE, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) :upsert :appended :conflict; ROLLBACK;
\echo 'spread ids: Allow, upsert, Allow, upsert'
BEGIN; EXPLAIN (ANALYZE, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) :allow :spread; ROLLBACK;
BEGIN; EXPLAIN (ANALYZE, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) :upsert :spread :conflict; ROLLBACK;
BEGIN; EXPLAIN (ANALYZE, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) :allow :spread; ROLLBACK;
BEGIN; EXPLAIN (ANALYZE, WAL, COSTS OFF, TIMING OFF, SUMMARY OFF) :upsert :spread :conflict; ROLLBACK;
