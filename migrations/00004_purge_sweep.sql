-- countlimit's fourth migration: the purge sweeps count_limit a range of
-- pages at a time, and count_limit_end_time_idx goes (issue 33).
--
-- For DBAs, in short: run "countlimit migrate up" (or pgstore.Migrate). It
-- drops the index count_limit_end_time_idx (an ACCESS EXCLUSIVE lock on
-- count_limit for an instant; the migration waits at most 2 seconds for
-- it, then fails and changes nothing: run it again when no long
-- transaction holds the table), adds two functions,
-- countlimit_purge_leases and countlimit_purge_rows, and makes
-- countlimit_purge, which keeps its signature and its meaning (at most
-- batch_size expired leases and rows a call, the number deleted
-- returned), sweep the table instead of reading the index. Its Down
-- returns exactly to 00003's schema: the index is built again (a scan of
-- the table, under a SHARE lock that holds off every check while it runs).
--
-- Why. A new window changes a row's end_time. While an index covers
-- end_time, PostgreSQL cannot make that update in place on the row's page
-- (a HOT update): it writes a new row version and a new entry in every
-- index, the primary key's and end_time's, and their WAL. Over ids spread
-- across a large table most checks are their row's first in a new window,
-- and at 10 million rows 8-9% of count_limit's updates were HOT with the
-- index against 100% without it; Allow's throughput at 64 callers went from
-- 1.5-2.0x a hand-written upsert's to 2.8-2.9x (docs/benchmarks.md, "The
-- end_time index at 10 million rows"). The purge was the index's only
-- reader. No other index can find expired rows without naming end_time
-- (PostgreSQL 15 gives up HOT for any index of a column that changes,
-- even a partial one the row is not in), so the purge reads the table
-- itself instead, in order of the rows' places on disk.
--
-- How it sweeps. countlimit_purge_rows deletes, among the rows in pages
-- [from, from + 1024) at or after the item it is told, the first
-- batch_size whose window, penalty and leases are over, skipping rows live
-- checks hold locked, and says where the next statement goes on: after the
-- last row it locked when it stopped at batch_size, else the next range
-- of pages, or nowhere (NULL) once the range was the table's last. The
-- caller carries that place from statement to statement: pgstore's Purge
-- and PurgeEvery sweep the leases first (countlimit_purge_leases, by their
-- expiry index, as before), then the rows from page 0 to the end, so a
-- pass reads the whole table, 1024 pages (8 MB) a statement at most,
-- whatever it finds: about a second of one core at 10 million rows when
-- the table is in memory, 0.1 s a million. Deleting is about as fast as
-- by the index (a million expired rows among 10 million: 120 000 rows a
-- second through countlimit_purge against 124 000 by the index).
-- A row that moved since the sweep passed its place (an update that was
-- not HOT), or that a check held locked, goes in the next pass, as one
-- whose leases a pass deletes did before in the next batch.
--
-- countlimit_purge(now, batch_size), which a DBA, pg_cron or a v0.1.0
-- binary calls, has no place to carry: it keeps its place in a setting of
-- the session (countlimit.purge_at, "page,item"), starts where the
-- session's previous call stopped, and sweeps ranges until it has deleted
-- batch_size rows or reached the table's end (then the next call starts
-- over at page 0): a loop that calls it until it returns fewer than
-- batch_size sweeps the table once. It reads as many ranges as it takes.
--
-- Plans: the sweep's statement is a Tid Range Scan of its pages, its
-- conditions checked on each row there and the lease probe one per row
-- that passes them, by key, under a LIMIT; it reads the range and nothing
-- else (TestPlansReadOnlyTheirKeys holds it to the range's size). The
-- sweep returns the rows of a range in their order on disk (a TID range
-- scan is never synchronized with other scans), which is what "after the
-- last row it locked" relies on; were it not so, rows would only wait for
-- the next pass.

-- +goose Up
SET LOCAL lock_timeout = '2s';

DROP INDEX count_limit_end_time_idx;

-- countlimit_purge_leases deletes at most batch_size expired leases, by
-- their expiry index, oldest first, skipping leases others hold locked, and
-- returns how many it deleted: 00001's countlimit_purge's first half.
-- +goose StatementBegin
CREATE FUNCTION countlimit_purge_leases(p_now timestamptz, p_batch_size int)
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off SET enable_bitmapscan = off AS $fn$
DECLARE
    deleted bigint;
BEGIN
    WITH leases AS (
        SELECT l.ctid AS tid
        FROM count_limit_lease l
        WHERE l.expires_at <= p_now
        ORDER BY l.expires_at
        LIMIT p_batch_size
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM count_limit_lease l
        WHERE l.ctid = ANY (ARRAY(SELECT d.tid FROM leases d))
        RETURNING 1
    )
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$fn$;
-- +goose StatementEnd

-- countlimit_purge_rows: see "How it sweeps" above. p_from_page and
-- p_from_item are where the sweep goes on (0, 0 at the start); deleted is
-- how many rows it deleted, next_page and next_item where the next
-- statement goes on, both NULL once the sweep is done. A row's lease_until
-- is read at its latest version, so a row whose key an Acquire or Extend
-- has just written is kept; a row changed since the statement's snapshot
-- is locked at a version the snapshot cannot see, and is left for the
-- next pass.
-- +goose StatementBegin
CREATE FUNCTION countlimit_purge_rows(p_now timestamptz, p_batch_size int, p_from_page bigint, p_from_item int,
    OUT deleted bigint, OUT next_page bigint, OUT next_item int)
LANGUAGE plpgsql SET enable_seqscan = off SET enable_bitmapscan = off AS $fn$
DECLARE
    pages bigint := pg_relation_size('count_limit'::regclass) / current_setting('block_size')::bigint;
    upto bigint := p_from_page + 1024;
    n_locked bigint;
    last_tid tid;
BEGIN
    IF p_batch_size IS NULL OR p_batch_size < 1 THEN
        RAISE EXCEPTION 'countlimit_purge_rows: batch_size must be at least 1, got %', p_batch_size
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    deleted := 0;
    IF p_from_page IS NULL OR p_from_page >= pages THEN
        RETURN; -- the sweep is done: next_page NULL
    END IF;
    WITH doomed AS (
        SELECT c.ctid AS tid
        FROM count_limit c
        WHERE c.ctid >= format('(%s,%s)', p_from_page, coalesce(p_from_item, 0))::tid
          AND c.ctid < format('(%s,0)', upto)::tid
          AND c.end_time <= p_now
          AND (c.blocked_until IS NULL OR c.blocked_until <= p_now)
          AND (c.lease_until IS NULL OR c.lease_until <= p_now)
          -- A row goes once its leases have (see 00001's countlimit_purge);
          -- OFFSET 0 keeps the probe one per row, by key.
          AND NOT EXISTS (SELECT FROM count_limit_lease l
              WHERE l.use_type = c.use_type AND l.unique_id = c.unique_id OFFSET 0)
        LIMIT p_batch_size
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM count_limit c
        WHERE c.ctid = ANY (ARRAY(SELECT d.tid FROM doomed d))
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM doomed), (SELECT max(d.tid) FROM doomed d)
    INTO deleted, n_locked, last_tid;
    IF n_locked >= p_batch_size AND last_tid < format('(%s,0)', upto)::tid THEN
        next_page := (last_tid::text::point)[0]::bigint;
        next_item := (last_tid::text::point)[1]::int + 1;
    ELSIF upto < pages THEN
        next_page := upto;
        next_item := 0;
    END IF;
END
$fn$;
-- +goose StatementEnd

-- countlimit_purge: see above. Expired leases first, at most batch_size,
-- then rows from where this session's last call stopped.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_purge(p_now timestamptz, p_batch_size int)
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off SET enable_bitmapscan = off AS $fn$
DECLARE
    leases bigint;
    deleted bigint := 0;
    at text[] := string_to_array(nullif(current_setting('countlimit.purge_at', true), ''), ',');
    page bigint := coalesce(at[1]::bigint, 0);
    item int := coalesce(at[2]::int, 0);
    r record;
BEGIN
    IF p_batch_size IS NULL OR p_batch_size < 1 THEN
        RAISE EXCEPTION 'countlimit_purge: batch_size must be at least 1, got %', p_batch_size
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    leases := countlimit_purge_leases(p_now, p_batch_size);
    LOOP
        SELECT * INTO r FROM countlimit_purge_rows(p_now, p_batch_size - deleted::int, page, item);
        deleted := deleted + r.deleted;
        page := r.next_page;
        item := r.next_item;
        EXIT WHEN page IS NULL OR deleted >= p_batch_size;
    END LOOP;
    PERFORM set_config('countlimit.purge_at', coalesce(page || ',' || item, ''), false);
    RETURN leases + deleted;
END
$fn$;
-- +goose StatementEnd

-- +goose Down
-- Back to 00003's schema exactly: 00001's index and countlimit_purge.

DROP FUNCTION countlimit_purge_rows(timestamptz, int, bigint, int);
DROP FUNCTION countlimit_purge_leases(timestamptz, int);
CREATE INDEX count_limit_end_time_idx ON count_limit (end_time) WHERE end_time IS NOT NULL;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_purge(p_now timestamptz, p_batch_size int)
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off SET enable_bitmapscan = off AS $fn$
DECLARE
    deleted bigint;
BEGIN
    WITH leases AS (
        SELECT l.ctid AS tid
        FROM count_limit_lease l
        WHERE l.expires_at <= p_now
        ORDER BY l.expires_at
        LIMIT p_batch_size
        FOR UPDATE SKIP LOCKED
    ), gone_leases AS (
        DELETE FROM count_limit_lease l
        WHERE l.ctid = ANY (ARRAY(SELECT d.tid FROM leases d))
        RETURNING 1
    ), doomed AS (
        SELECT c.ctid AS tid
        FROM count_limit c
        WHERE c.end_time <= p_now
          AND (c.blocked_until IS NULL OR c.blocked_until <= p_now)
          AND (c.lease_until IS NULL OR c.lease_until <= p_now)
          -- A row goes once its leases have: its cascade then waits for no
          -- lease another purge (or an open Release) holds, so purges running
          -- at once cannot deadlock. A lease taken since the snapshot raised
          -- lease_until, which is checked again on the locked row. OFFSET 0
          -- keeps the probe one per row (see "Plans" above).
          AND NOT EXISTS (SELECT FROM count_limit_lease l
              WHERE l.use_type = c.use_type AND l.unique_id = c.unique_id OFFSET 0)
        ORDER BY c.end_time
        LIMIT p_batch_size
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM count_limit c
        WHERE c.ctid = ANY (ARRAY(SELECT d.tid FROM doomed d))
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM gone_leases) + (SELECT count(*) FROM gone) INTO deleted;
    RETURN deleted;
END
$fn$;
-- +goose StatementEnd
