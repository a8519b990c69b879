-- Times what a DBA runs by hand, and what `countlimit top` runs, over the
-- table docs/scale/fill.sql filled (docs/benchmarks.md, "At scale"):
--
--   psql "$URL" -f docs/scale/dba.sql
--
-- Each read is shown with EXPLAIN (ANALYZE, BUFFERS): a Seq Scan of
-- count_limit reads the whole table, an Index Scan with an Index Cond on
-- the key answers by index. The functions' own statements are shown by
-- auto_explain (nested statements, sent to the client). The writes run in
-- a transaction rolled back, so the table stays as filled.
\timing on
\pset pager off
-- One id, by the view: the view's conditions reach count_limit's key.
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT used, limit_value, remaining, window_end FROM count_limit_status
WHERE unique_id = 'scale-05000001' AND use_type = 'scale';
-- countlimit top: its three reads.
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT * FROM count_limit_status WHERE used > 0
ORDER BY remaining, used DESC, use_type, unique_id LIMIT 20;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT * FROM count_limit_status WHERE denied_count > 0
ORDER BY denied_count DESC, use_type, unique_id LIMIT 20;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT * FROM count_limit_status WHERE blocked
ORDER BY blocked_until DESC, use_type, unique_id LIMIT 20;
-- Who is blocked now, from the table (docs/operations.md).
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT use_type, unique_id, blocked_until FROM count_limit WHERE blocked_until > now();
-- The DBA functions, each statement of each shown by auto_explain.
LOAD 'auto_explain';
SET auto_explain.log_min_duration = 0;
SET auto_explain.log_analyze = on;
SET auto_explain.log_buffers = on;
SET auto_explain.log_timing = off;
SET auto_explain.log_nested_statements = on;
SET client_min_messages = log;
SELECT count(*) FROM countlimit_most_denied();
BEGIN;
SELECT countlimit_reset_id('scale-05000001');
SELECT countlimit_reset_id('scale-05000011', 'scale');
SELECT countlimit_lift_penalty('scale-00010003');
SELECT countlimit_lift_penalty('scale-00010003', 'scale');
SELECT countlimit_adjust_count('scale-05000002', 'scale', 2);
ROLLBACK;
