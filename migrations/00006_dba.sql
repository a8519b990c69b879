-- SQL for DBAs: the writes a DBA makes by hand, and one audit, as
-- functions (docs/operations.md, "SQL for DBAs", shows each call):
--
--   countlimit_reset_id(unique_id, use_type DEFAULT NULL)
--       forget an id, every use type or one, leases included (what
--       Limiter.Reset does);
--   countlimit_lift_penalty(unique_id, use_type DEFAULT NULL)
--       end its penalty, keeping its count and its denial tally;
--   countlimit_adjust_count(unique_id, use_type, delta)
--       raise or lower the count of its current window;
--   countlimit_most_denied(written_within DEFAULT 1 hour, max_rows DEFAULT 20)
--       the rows written lately that were denied most.
--
-- They are functions rather than recipes so that each takes its row locks
-- the way countlimit's own statements do, and may run beside live checks:
--
--   * Every row is locked before it is written, one id's rows in use_type
--     order (byte order, COLLATE "C"), the key order of every statement of
--     the store (00002, 00005). A function that writes several rows of one
--     id locks them all first, in that order, then writes only the rows it
--     locked: an UPDATE or DELETE left to find its rows would lock them in
--     the order its scan meets them, and could deadlock with an AllowAll or
--     a batch on the same id.
--   * Rows to update are locked FOR NO KEY UPDATE, as the checks lock them
--     (a lease insert's foreign-key check does not wait for it); rows to
--     delete FOR UPDATE, which a DELETE needs and would otherwise have to
--     strengthen while holding the weaker lock.
--   * A count is changed by an expression over the locked row, which under
--     READ COMMITTED is its latest committed version, never by writing back
--     a value read before the lock: a check that commits while the function
--     waits for the row stays counted. (The store's pooled checks do not
--     wait for a row a DBA holds: they skip it and are sent again.)
--
-- "Now", for these functions, is the database's clock, now() (the start of
-- the DBA's transaction), as in count_limit_status; checks use their
-- Limiter's clock. A window is current, as for a check, when it is not
-- empty (begin_time < end_time, or end_time NULL for a lifetime) and not
-- over (end_time > now); an id is blocked while blocked_until > now.
--
-- The writers plan with enable_seqscan off, as the functions of 00005 do,
-- so that their statements read the key whatever the table's statistics
-- say, and write a condition on blocked_until beside the key (...) IS
-- TRUE, as 00005 explains ("Plans"): no plan then finds one id's blocked
-- rows by reading every blocked id (count_limit_blocked_until_idx).
-- countlimit_most_denied does not: it reads the whole table by design (no
-- index serves it; see it below).
--
-- Names: countlimit_reset(text, text[]) is the store's Reset (00005). An
-- overload countlimit_reset(text, text) would not even be ambiguous: for an
-- untyped literal PostgreSQL prefers the string type, so it would take over
-- countlimit_reset('u', '{a,b}') too, a call meant for the store's Reset.
-- These functions have names of their own, one signature each.

-- +goose Up

-- countlimit_reset_id deletes the rows of one id (for one use type, or for
-- all when use_type is NULL), and their leases with them, and returns how
-- many rows it deleted. The id's next check starts afresh: nothing counted,
-- no penalty, a denial tally of 0.
-- +goose StatementBegin
CREATE FUNCTION countlimit_reset_id(unique_id text, use_type text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
    -- The parameters are named for calls in named notation; in the
    -- statements below those names are count_limit's columns.
    id      text := unique_id;
    ut      text := use_type;
    got     text[];
    deleted bigint;
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'countlimit_reset_id: unique_id is NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    got := ARRAY(SELECT c.use_type FROM count_limit c
        WHERE c.unique_id = id AND (ut IS NULL OR c.use_type = ut)
        ORDER BY c.use_type COLLATE "C"
        FOR UPDATE);
    DELETE FROM count_limit c WHERE c.unique_id = id AND c.use_type = ANY (got);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN deleted;
END
$fn$;
-- +goose StatementEnd

COMMENT ON FUNCTION countlimit_reset_id(text, text) IS
    'countlimit, for DBAs: forget one id: delete its rows (one use type, or all when use_type is NULL) and their leases, locked in key order like every check; returns how many rows it deleted. The next check starts afresh. See docs/operations.md.';

-- countlimit_lift_penalty ends the penalty of one id (one use type, or all
-- when use_type is NULL): it clears blocked_until, so the id is blocked on
-- no clock, and leaves its count, window and denial tally as they are. It
-- returns how many of the rows were blocked at now(). A row whose window is
-- still full denies its next check again, which sets a new penalty when
-- its rule has one: lower the count too (countlimit_adjust_count), or
-- reset the id.
-- +goose StatementBegin
CREATE FUNCTION countlimit_lift_penalty(unique_id text, use_type text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
    id     text := unique_id;
    ut     text := use_type;
    got    text[];
    lifted bigint;
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'countlimit_lift_penalty: unique_id is NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    got := ARRAY(SELECT c.use_type FROM count_limit c
        WHERE c.unique_id = id AND (ut IS NULL OR c.use_type = ut) AND (c.blocked_until IS NOT NULL) IS TRUE
        ORDER BY c.use_type COLLATE "C"
        FOR NO KEY UPDATE);
    SELECT count(*) INTO lifted FROM count_limit c
    WHERE c.unique_id = id AND c.use_type = ANY (got) AND (c.blocked_until > now()) IS TRUE;
    UPDATE count_limit c SET blocked_until = NULL, updated_at = now()
    WHERE c.unique_id = id AND c.use_type = ANY (got);
    RETURN lifted;
END
$fn$;
-- +goose StatementEnd

COMMENT ON FUNCTION countlimit_lift_penalty(text, text) IS
    'countlimit, for DBAs: end the penalty of one id (one use type, or all when use_type is NULL): clears blocked_until, keeps the count and the denial tally; returns how many rows were blocked. A window still full denies the next check again. See docs/operations.md.';

-- countlimit_adjust_count adds delta (negative to lower) to the count of
-- one id's current window for one use type, never below 0 and with no
-- upper bound (a count at or over the limit denies the checks that follow,
-- until the window ends), and returns the new count. Its window, penalty
-- and tally stay as they are.
--
-- A window that is over, or empty (a row that only ever saw denials or
-- leases), or a row that does not exist, has no count to change: the next
-- check opens a new window from 0 whatever the row says, so a hand edit
-- of it would change nothing. The function then writes nothing, says why
-- in a notice, and returns NULL.
--
-- A sliding window keeps no single count: its count is its log of event
-- times (column events), each of which leaves the window at its own time.
-- The function refuses it with an error; Limiter.Refund gives events back
-- (the newest first), countlimit_reset_id forgets them all.
-- +goose StatementBegin
CREATE FUNCTION countlimit_adjust_count(unique_id text, use_type text, delta bigint)
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
    id      text := unique_id;
    ut      text := use_type;
    rec     count_limit;
    counted bigint;
BEGIN
    IF id IS NULL OR ut IS NULL OR delta IS NULL THEN
        RAISE EXCEPTION 'countlimit_adjust_count: unique_id, use_type and delta must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO rec FROM count_limit c
    WHERE c.use_type = ut AND c.unique_id = id
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE NOTICE 'countlimit_adjust_count: no row for (%, %): nothing is counted, nothing changed', ut, id;
        RETURN NULL;
    END IF;
    IF rec.events IS NOT NULL THEN
        RAISE EXCEPTION 'countlimit_adjust_count: (%, %) is a sliding window: its count is its log of events (column events), not already_count', ut, id
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Limiter.Refund gives events back; countlimit_reset_id forgets them all.';
    END IF;
    IF NOT (rec.begin_time < coalesce(rec.end_time, 'infinity') AND coalesce(rec.end_time > now(), true)) THEN
        RAISE NOTICE 'countlimit_adjust_count: (%, %) has no current window (the row''s is [%, %)): the next check starts a new one from 0; nothing changed',
            ut, id, rec.begin_time, rec.end_time;
        RETURN NULL;
    END IF;
    UPDATE count_limit c SET
        already_count = greatest(c.already_count + delta, 0),
        updated_at    = now()
    WHERE c.use_type = ut AND c.unique_id = id
    RETURNING c.already_count INTO counted;
    RETURN counted;
END
$fn$;
-- +goose StatementEnd

COMMENT ON FUNCTION countlimit_adjust_count(text, text, bigint) IS
    'countlimit, for DBAs: add delta (negative to lower) to the count of one id''s current window for one use type, never below 0; returns the new count, or NULL (and a notice) when there is no current window to change. Refuses sliding windows. Safe beside live checks: the row is locked and the count changed in place. See docs/operations.md.';

-- countlimit_most_denied lists the rows (one use type of one id each)
-- written in the last written_within that have been denied at least once,
-- most denied first, at most max_rows of them (NULL for all).
--
-- What it measures: count_limit keeps no time per denial, only
-- denied_count, the denials since the row was created, and updated_at, its
-- last write of any kind (a check allowed or denied, a refund, a DBA's
-- edit). Every denial writes its row, so every row denied within the
-- period is listed (but for those past max_rows), with every denial of
-- that period counted; but denied_count also counts the row's older
-- denials, and a row denied long ago but allowed once lately is listed
-- with its old denials. denied_count is then an upper bound of a row's
-- denials in the period, not their number. A row deleted (Reset, purge)
-- and created again starts its tally from 0. For an exact count over a
-- period to come, keep a copy of denied_count and compare it later
-- (docs/operations.md).
--
-- It reads the whole table: no index serves updated_at or denied_count,
-- and one would cost every check, which writes both, its HOT update.
-- +goose StatementBegin
CREATE FUNCTION countlimit_most_denied(written_within interval DEFAULT interval '1 hour', max_rows int DEFAULT 20)
RETURNS TABLE (
    use_type      text,
    unique_id     text,
    denied_count  bigint,
    window_kind   text,
    used          bigint,
    limit_value   bigint,
    blocked_until timestamptz,
    updated_at    timestamptz
) LANGUAGE sql STABLE AS $fn$
    SELECT s.use_type, s.unique_id, s.denied_count, s.window_kind, s.used, s.limit_value,
        s.blocked_until, s.updated_at
    FROM count_limit_status s
    WHERE s.denied_count > 0 AND s.updated_at >= now() - written_within
    ORDER BY s.denied_count DESC, s.updated_at DESC, s.use_type, s.unique_id
    LIMIT max_rows
$fn$;
-- +goose StatementEnd

COMMENT ON FUNCTION countlimit_most_denied(interval, int) IS
    'countlimit, for DBAs: rows written within the period (default 1 hour) that were ever denied, most denied first. denied_count counts denials since the row was created, so it bounds the period''s denials from above; every row denied in the period is listed. Reads the whole table. See docs/operations.md.';

-- +goose Down
DROP FUNCTION countlimit_most_denied(interval, int);
DROP FUNCTION countlimit_adjust_count(text, text, bigint);
DROP FUNCTION countlimit_lift_penalty(text, text);
DROP FUNCTION countlimit_reset_id(text, text);
