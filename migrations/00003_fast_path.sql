-- countlimit's third migration: a cheaper statement first for the common
-- call of the fast path, on the pool (issue 33).
--
-- For DBAs, in short: run "countlimit migrate up" (or pgstore.Migrate). It
-- adds three functions, countlimit_allow_one_pooled,
-- countlimit_allow_distinct_pooled and countlimit_allow_batch_pooled, and
-- changes nothing else: no table is touched, no lock is taken on
-- count_limit, and a v0.1.0 binary still running during the upgrade keeps
-- calling the functions it knows, which are as they were. Its Down drops
-- the three: 00002's schema exactly.
--
-- Why. On pgstore's pool, an Allow of one rule whose window is neither
-- sliding nor smooth is countlimit_allow_one, or, for concurrent calls,
-- one group commit: countlimit_allow_distinct (every call a key of its
-- own, the common case over many ids) or countlimit_allow_batch (a key
-- more than once: a hot id). Their statements decide every
-- case in one: a row that exists, one to insert, one another transaction
-- holds, one another transaction is inserting. PostgreSQL sets up the
-- whole plan of such a statement (each branch, each expression) on every
-- call before it reads a row, and on a 2-core machine that set-up cost
-- more than the work: the pool's
-- countlimit_allow_one spent about twice the CPU of a hand-written upsert
-- a call. Most calls find their row there, free: the id was counted
-- before. For them a statement of one lock and one UPDATE, decided as the
-- whole statement decides a row that exists, does the same work with a
-- fraction of the plan (docs/benchmarks.md has the measurements). A hot
-- id's batch, many calls on one key, is decided by
-- countlimit_allow_batch in a recursive fold, a step a call; when every
-- call fits, a running sum over the key's calls decides them all at once
-- (countlimit_allow_batch_pooled, below).
--
-- So pgstore's pool now calls countlimit_allow_one_pooled in place of
-- countlimit_allow_one(..., p_skip_locked true, ...), and
-- countlimit_allow_distinct_pooled in place of countlimit_allow_distinct,
-- with the same arguments; each first runs, after countlimit_lock_briefly
-- (as 00001's do: a lock on the whole table, an ALTER TABLE's or a DBA's
-- LOCK TABLE, is waited for 2 ms, then the call fails with
-- lock_not_available and pgstore routes it as before), that statement:
--
--   1. lock each call's row, FOR NO KEY UPDATE SKIP LOCKED, by its key;
--   2. only when every call's row was locked (none absent, none another
--      transaction holds): decide each call from its row as locked, and
--      write it with one UPDATE by key, counted (the window opened anew
--      when it had ended) or denied (the tally up, the penalty set), as
--      the whole statement does for a row that exists.
--
-- When it wrote nothing (some row absent or held), the whole statement of
-- 00001 runs after it, in the same transaction, on the same arguments:
-- countlimit_allow_one or countlimit_allow_distinct, unchanged. A Store on
-- the caller's connection or transaction calls countlimit_allow_one as
-- before, with no statement in front. The rows the first statement locked
-- stay locked by this transaction, which the whole statement locks again
-- without waiting; nothing else was written. So a call is decided as
-- before: by the first statement when all its rows existed and were free
-- (the values written and returned are the whole statement's for such a
-- row), by the whole one otherwise (the model harness holds both paths to
-- driver.Apply). Two races end better than they did: a row a concurrent
-- Reset deleted after the statement's snapshot, which the whole statement
-- alone reported busy, is now found absent by the first and inserted by
-- the whole one on a later snapshot; and a row whose snapshot showed it
-- full but whose latest version has room, which the whole statement alone
-- left for pgstore to send again, is decided from the version locked. When
-- the whole batch statement meets another transaction's insert of a new
-- key (lock_not_available, then countlimit_claim_keys), the rows the first
-- statement locked stay locked through its second try, a few milliseconds
-- at most (each wait there is bounded by countlimit_lock_briefly). A call
-- whose row is absent or held pays for the extra statement, about a lock
-- probe per key.
--
-- Plans: as every function of 00001, these run with enable_seqscan = off,
-- and reach count_limit only by key: the locks are nested loops over the
-- call's keys, each an index scan of count_limit_pkey on the key, and the
-- UPDATE joins its decided calls to count_limit by the key with
-- unique_id = ANY (the call's ids) beside it, an index condition whatever
-- join the planner picks (TestPlansReadOnlyTheirKeys).

-- +goose Up

-- countlimit_allow_one_pooled is countlimit_allow_one with p_skip_locked
-- (pgstore's pool), after the statement above.
-- +goose StatementBegin
CREATE FUNCTION countlimit_allow_one_pooled(
    p_use_type    text,
    p_unique_id   text,
    p_now         timestamptz,
    p_n           bigint,
    p_limit_value bigint,
    p_begin_time  timestamptz,
    p_window_end  timestamptz,
    p_penalty_end timestamptz,
    p_window_kind text
) RETURNS TABLE (
    o_busy          boolean,
    o_allowed       boolean,
    o_used          bigint,
    o_window_begin  timestamptz,
    o_window_end    timestamptz,
    o_blocked_until timestamptz
) LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
BEGIN
    PERFORM countlimit_lock_briefly();
    RETURN QUERY
        WITH l AS MATERIALIZED (
            SELECT c.already_count, c.begin_time, c.end_time, c.blocked_until
            FROM count_limit c
            WHERE c.use_type = p_use_type AND c.unique_id = p_unique_id
            FOR NO KEY UPDATE SKIP LOCKED
        ), d AS MATERIALIZED (
            -- The call applied to its row as locked: cur, the window is
            -- current; used, what it counts now.
            SELECT l.begin_time, l.end_time, l.blocked_until, s.cur, s.blocked, u.used,
                NOT s.blocked AND p_n <= p_limit_value - u.used AS fits
            FROM l
            CROSS JOIN LATERAL (SELECT
                l.begin_time < coalesce(l.end_time, 'infinity') AND coalesce(l.end_time > p_now, true) AS cur,
                coalesce(l.blocked_until > p_now, false) AS blocked) s
            CROSS JOIN LATERAL (SELECT CASE WHEN s.cur THEN l.already_count ELSE 0 END AS used) u
        ), w AS (
            UPDATE count_limit c SET
                already_count = CASE WHEN d.fits THEN d.used + p_n ELSE c.already_count END,
                begin_time    = CASE WHEN d.fits AND NOT d.cur THEN p_begin_time ELSE c.begin_time END,
                end_time      = CASE WHEN d.fits AND NOT d.cur THEN p_window_end ELSE c.end_time END,
                limit_value   = p_limit_value,
                denied_count  = c.denied_count + CASE WHEN d.fits THEN 0 ELSE 1 END,
                blocked_until = CASE WHEN d.fits OR d.blocked OR p_penalty_end IS NULL
                    THEN c.blocked_until ELSE p_penalty_end END,
                events        = CASE WHEN d.fits THEN NULL ELSE c.events END,
                window_kind   = CASE WHEN d.fits THEN p_window_kind ELSE c.window_kind END,
                updated_at    = now()
            FROM d
            WHERE c.use_type = p_use_type AND c.unique_id = p_unique_id
            RETURNING d.fits, d.cur, d.blocked, d.used, d.begin_time, d.end_time, d.blocked_until
        )
        -- A denial leaves the window as it was: the state is that window
        -- when it is current, else the fresh one an event would open.
        SELECT false, w.fits, CASE WHEN w.fits THEN w.used + p_n ELSE w.used END,
            CASE WHEN w.cur THEN w.begin_time ELSE p_begin_time END,
            CASE WHEN w.cur THEN w.end_time ELSE p_window_end END,
            CASE WHEN w.blocked THEN w.blocked_until WHEN w.fits THEN NULL ELSE p_penalty_end END
        FROM w;
    IF FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM countlimit_allow_one(p_use_type, p_unique_id, p_now, p_n, p_limit_value,
        p_begin_time, p_window_end, p_penalty_end, true, p_window_kind);
END
$fn$;
-- +goose StatementEnd

-- countlimit_allow_distinct_pooled is countlimit_allow_distinct after the
-- statement above. Its CASE WHEN random() >= 0 is 00001's: it keeps the
-- generic plan.
-- +goose StatementBegin
CREATE FUNCTION countlimit_allow_distinct_pooled(
    p_use_types    text[],
    p_unique_ids   text[],
    p_nows         timestamptz[],
    p_ns           bigint[],
    p_limits       bigint[],
    p_begins       timestamptz[],
    p_window_ends  timestamptz[],
    p_penalty_ends timestamptz[],
    p_kinds        text[]
) RETURNS TABLE (
    o_key_of        int,
    o_busy          boolean,
    o_allowed       boolean,
    o_used          bigint,
    o_window_begin  timestamptz,
    o_window_end    timestamptz,
    o_blocked_until timestamptz
) LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
BEGIN
    PERFORM countlimit_lock_briefly();
    RETURN QUERY
        WITH calls AS MATERIALIZED (
            SELECT c.ord::int AS k, c.use_type, c.unique_id, c.now, c.n, c.lim, c.b, c.e, c.pe, c.kind
            FROM ROWS FROM (unnest(CASE WHEN random() >= 0 THEN p_use_types END), unnest(p_unique_ids),
                unnest(p_nows), unnest(p_ns), unnest(p_limits),
                unnest(p_begins), unnest(p_window_ends), unnest(p_penalty_ends), unnest(p_kinds))
                WITH ORDINALITY AS c(use_type, unique_id, now, n, lim, b, e, pe, kind, ord)
        ), locked AS MATERIALIZED (
            -- Step 1, in key order, skipping the rows another transaction
            -- holds.
            SELECT c.k, r.already_count, r.begin_time, r.end_time, r.blocked_until
            FROM calls c
            CROSS JOIN LATERAL (
                SELECT x.already_count, x.begin_time, x.end_time, x.blocked_until
                FROM count_limit x
                WHERE x.use_type = c.use_type AND x.unique_id = c.unique_id
                LIMIT 1
                FOR NO KEY UPDATE SKIP LOCKED
            ) r
            ORDER BY c.k
        ), decided AS MATERIALIZED (
            -- Step 2, when every row was locked: each call applied to its
            -- row as locked (countlimit_allow_distinct's decided, for
            -- a row that exists).
            SELECT c.k, c.use_type, c.unique_id, c.lim, c.kind,
                CASE WHEN d.fits THEN d.used + c.n ELSE l.already_count END AS cnt,
                CASE WHEN d.fits AND NOT d.cur THEN c.b ELSE l.begin_time END AS wb,
                CASE WHEN d.fits AND NOT d.cur THEN c.e ELSE l.end_time END AS we,
                CASE WHEN d.fits OR d.blocked OR c.pe IS NULL THEN l.blocked_until ELSE c.pe END AS bu,
                d.fits AS allowed,
                CASE WHEN d.fits THEN d.used + c.n ELSE d.used END AS used,
                CASE WHEN d.cur THEN l.begin_time ELSE c.b END AS ob,
                CASE WHEN d.cur THEN l.end_time ELSE c.e END AS oe,
                CASE WHEN d.blocked THEN l.blocked_until WHEN d.fits THEN NULL ELSE c.pe END AS obu
            FROM calls c
            JOIN locked l ON l.k = c.k
            CROSS JOIN LATERAL (SELECT s.cur, s.blocked, u.used, NOT s.blocked AND c.n <= c.lim - u.used AS fits
                FROM (SELECT
                    l.begin_time < coalesce(l.end_time, 'infinity') AND coalesce(l.end_time > c.now, true) AS cur,
                    coalesce(l.blocked_until > c.now, false) AS blocked) s
                CROSS JOIN LATERAL (SELECT CASE WHEN s.cur THEN l.already_count ELSE 0 END AS used) u) d
            WHERE (SELECT count(*) FROM locked) = cardinality(p_unique_ids)
        ), updated AS (
            UPDATE count_limit r SET
                already_count = d.cnt,
                begin_time    = d.wb,
                end_time      = d.we,
                limit_value   = d.lim,
                denied_count  = r.denied_count + CASE WHEN d.allowed THEN 0 ELSE 1 END,
                blocked_until = d.bu,
                events        = CASE WHEN d.allowed THEN NULL ELSE r.events END,
                window_kind   = CASE WHEN d.allowed THEN d.kind ELSE r.window_kind END,
                updated_at    = now()
            FROM decided d
            WHERE r.use_type = d.use_type AND r.unique_id = d.unique_id
              AND r.unique_id = ANY (p_unique_ids)
            RETURNING d.k, d.allowed, d.used, d.ob, d.oe, d.obu
        )
        SELECT u.k::int, false, u.allowed::boolean, u.used::bigint,
            u.ob::timestamptz, u.oe::timestamptz, u.obu::timestamptz
        FROM updated u
        ORDER BY 1;
    IF FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM countlimit_allow_distinct(p_use_types, p_unique_ids, p_nows, p_ns, p_limits,
        p_begins, p_window_ends, p_penalty_ends, p_kinds);
END
$fn$;
-- +goose StatementEnd

-- countlimit_allow_batch_pooled is countlimit_allow_batch after a
-- statement of its own for the batch whose rows all exist, are free and
-- have room for every call: a hot id's calls, many to one key, which
-- countlimit_allow_batch decides one after another in a recursive fold
-- (a step a call). Here each call's count is its key's row plus a
-- running sum (sum() OVER the key's calls in order): call i of a key
-- fits when the row's window is current at its now, no penalty runs,
-- and the row's count, the calls before it and its own n are within its
-- limit, which is what the fold decides for it when every call before
-- it fitted. So only when every call of the batch fits does it write,
-- one UPDATE by key: the count, the limit of the key's last call, the
-- sliding log dropped and the kind, as the fold writes a key whose calls
-- all counted. Anything else (a row absent or held, a window over, a
-- penalty, a call without room) writes nothing, and countlimit_allow_batch
-- runs after it on the same arguments, unchanged. Its CASE WHEN random()
-- >= 0 is 00001's: it keeps the generic plan.
-- +goose StatementBegin
CREATE FUNCTION countlimit_allow_batch_pooled(
    p_use_types    text[],
    p_unique_ids   text[],
    p_key_of       int[],
    p_seq          int[],
    p_nows         timestamptz[],
    p_ns           bigint[],
    p_limits       bigint[],
    p_begins       timestamptz[],
    p_window_ends  timestamptz[],
    p_penalty_ends timestamptz[],
    p_kinds        text[]
) RETURNS TABLE (
    o_key_of        int,
    o_seq           int,
    o_busy          boolean,
    o_allowed       boolean,
    o_used          bigint,
    o_window_begin  timestamptz,
    o_window_end    timestamptz,
    o_blocked_until timestamptz
) LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
BEGIN
    PERFORM countlimit_lock_briefly();
    RETURN QUERY
        WITH keys AS MATERIALIZED (
            SELECT k.use_type, k.unique_id, k.kind, k.ord::int AS k
            FROM ROWS FROM (unnest(CASE WHEN random() >= 0 THEN p_use_types END), unnest(p_unique_ids), unnest(p_kinds))
                WITH ORDINALITY AS k(use_type, unique_id, kind, ord)
        ), locked AS MATERIALIZED (
            -- Step 1, in key order, skipping the rows another transaction
            -- holds.
            SELECT k.k, r.already_count, r.begin_time, r.end_time, r.blocked_until
            FROM keys k
            CROSS JOIN LATERAL (
                SELECT x.already_count, x.begin_time, x.end_time, x.blocked_until
                FROM count_limit x
                WHERE x.use_type = k.use_type AND x.unique_id = k.unique_id
                LIMIT 1
                FOR NO KEY UPDATE SKIP LOCKED
            ) r
            ORDER BY k.k
        ), calls AS MATERIALIZED (
            -- Step 2, when every row was locked: each call with its key's
            -- row and count once it and the calls before it are counted.
            SELECT c.k, c.seq, c.now, c.lim, l.begin_time, l.end_time, l.blocked_until,
                l.already_count + (sum(c.n) OVER (PARTITION BY c.k ORDER BY c.seq))::bigint AS used
            FROM ROWS FROM (unnest(CASE WHEN random() >= 0 THEN p_key_of END), unnest(p_seq), unnest(p_nows),
                unnest(p_ns), unnest(p_limits)) AS c(k, seq, now, n, lim)
            JOIN locked l ON l.k = c.k
            WHERE (SELECT count(*) FROM locked) = cardinality(p_unique_ids)
        ), decided AS MATERIALIZED (
            -- Every call of the batch fits (its key's window current at
            -- its now, no penalty running, room for it), or none is
            -- decided here.
            SELECT c.k, c.seq, c.lim, c.begin_time, c.end_time, c.used
            FROM calls c
            WHERE NOT EXISTS (SELECT FROM calls x WHERE NOT (
                x.begin_time < coalesce(x.end_time, 'infinity') AND coalesce(x.end_time > x.now, true)
                AND NOT coalesce(x.blocked_until > x.now, false) AND x.used <= x.lim))
        ), updated AS (
            UPDATE count_limit r SET
                already_count = f.used,
                limit_value   = f.lim,
                events        = NULL,
                window_kind   = k.kind,
                updated_at    = now()
            FROM (SELECT DISTINCT ON (d.k) d.k, d.used, d.lim FROM decided d ORDER BY d.k, d.seq DESC) f
            JOIN keys k ON k.k = f.k
            WHERE r.use_type = k.use_type AND r.unique_id = k.unique_id
              AND r.unique_id = ANY (p_unique_ids)
            RETURNING f.k
        )
        SELECT d.k::int, d.seq::int, false, true, d.used::bigint,
            d.begin_time::timestamptz, d.end_time::timestamptz, NULL::timestamptz
        FROM decided d
        JOIN updated u ON u.k = d.k
        ORDER BY 1, 2;
    IF FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM countlimit_allow_batch(p_use_types, p_unique_ids, p_key_of, p_seq, p_nows,
        p_ns, p_limits, p_begins, p_window_ends, p_penalty_ends, p_kinds);
END
$fn$;
-- +goose StatementEnd

-- +goose Down
-- Back to 00002's schema exactly.

DROP FUNCTION countlimit_allow_one_pooled(text, text, timestamptz, bigint, bigint, timestamptz, timestamptz, timestamptz, text);
DROP FUNCTION countlimit_allow_distinct_pooled(text[], text[], timestamptz[], bigint[], bigint[], timestamptz[], timestamptz[], timestamptz[], text[]);
DROP FUNCTION countlimit_allow_batch_pooled(text[], text[], int[], int[], timestamptz[], bigint[], bigint[], timestamptz[], timestamptz[], timestamptz[], text[]);
