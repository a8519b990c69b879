-- The fast path: one rule whose window is not sliding (rolling, fixed,
-- calendar, lifetime, CheckLimit), in plain SQL. AllowOne holds one row lock
-- at most; the batch statements take theirs in three phases, as
-- countlimit_apply does, so concurrent statements over many keys cannot
-- deadlock:
--
--   1. lock the rows that exist, in key order (unique_id, then use_type,
--      byte order; Go sorts the keys and passes them in that order),
--      skipping any that another transaction holds (see AllowBatch);
--   2. insert the rows that do not, in key order, ON CONFLICT DO NOTHING:
--      this waits only for other inserts of the same key, never for a row
--      lock. A key someone else created since the statement began is left
--      alone and reported as not applied; the caller sends it again;
--   3. update the rows locked in phase 1, which waits for nothing.
--
-- The decision is made from the latest committed version of the row (as
-- locked in phase 1, or as AllowOne's UPDATE reads it again or its ON
-- CONFLICT locks it), never from the statement's snapshot, so it is exact
-- under READ COMMITTED. A window is current when it is not empty and not
-- over (begin is not compared with now; see countlimit.Store).
--
-- Twins: that rule (current, blocked, fits, then the count, window, tally
-- and penalty written) is spelled out in AllowOne, PeekOne, AllowBatch's
-- fold step and AllowBatchDistinct's decided here, and again in
-- countlimit_apply (migrations/00002_apply_locking.sql), apply.lua (and
-- fast.lua) and memstore's Store.apply: change one, change them all. storetest.Run, in
-- pgstore's TestConformance, holds them to it, the corners in
-- RollingStartsAtFirstCountedEvent and LateClockReadJoinsWindow (fresh or
-- current window), PenaltyOutlivesWindow, LimitChangedMidWindow and
-- WindowKindChanged; the batch tests (countlimit/pgstore/batch_test.go)
-- check each batch statement against calls made one by one.
--
-- Parameters common to all: now is the caller's clock; begin_time and
-- window_end bound the window an allowed event opens (window_end NULL for a
-- lifetime window); penalty_end is now + Block (NULL when the rule has none).

-- name: AllowOne :one
-- AllowOne counts n events of one rule for one id, or tallies the denial and
-- sets the penalty, in one statement of two steps:
--
--   a. the common case, a row that exists and has room: a plain UPDATE whose
--      WHERE is the decision. Under READ COMMITTED, when the row as the
--      statement's snapshot shows it passes that WHERE but another
--      transaction has changed it since, the UPDATE waits for it and
--      evaluates WHERE and SET again on the latest version, so a count is
--      never taken from a stale row. Uncontended it writes one WAL record
--      and takes no separate row lock (an upsert, or a SELECT ... FOR
--      UPDATE before it, WAL-logs a lock first); contended, PostgreSQL
--      locks the latest version before it checks again;
--   i. everything else, only when a counted nothing: a row that is absent is
--      inserted (allowed when n fits the limit, else denied with a tally of
--      1 and the penalty); a row that exists is locked by ON CONFLICT, at
--      its latest version, and, if it is full or blocked, gets the denial:
--      limit recorded, tally up, penalty set. A row the snapshot showed full
--      or blocked is passed by in a without a look at its latest version, so
--      i decides it. If it has room after all (it changed since the
--      snapshot), i writes nothing and no row is returned: send the call
--      again, as for a row another transaction created after the statement
--      began.
--
-- A statement holds at most one row lock, so it cannot deadlock with any
-- other. The verdict: a's rows are allowed; i's row is allowed only when it
-- was inserted with no denial (a denial of an existing row leaves its tally
-- at 1 or more; the tally is never negative but by a hand-made edit).
--
-- In a caller's REPEATABLE READ or SERIALIZABLE transaction, a row that a
-- concurrent Reset deleted after the snapshot fails the call with a
-- serialization error when the snapshot showed it with room (a's UPDATE
-- meets the deletion), and is counted afresh, as the row now is, when the
-- snapshot showed it full (a passes it by; i finds no row to conflict with).
--
-- "cur" below is spelled out where it is used: the window is current when
-- it is not empty and not over (begin_time < coalesce(end_time, infinity)
-- AND coalesce(end_time > now, true)); "used" is already_count when it is,
-- else 0; "blocked" is blocked_until > now. Parameters stand in
-- parentheses because sqlc (v1.31) misreads a bare @name::type compared with
-- a column in an UPDATE; a CTE of the parameters would avoid that but costs
-- about 6 µs a call.
WITH a AS (
    UPDATE count_limit c SET
        already_count = CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > (@now::timestamptz), true)
            THEN c.already_count ELSE 0 END + (@n::bigint),
        begin_time    = CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > (@now::timestamptz), true)
            THEN c.begin_time ELSE (@begin_time::timestamptz) END,
        end_time      = CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > (@now::timestamptz), true)
            THEN c.end_time ELSE (@window_end::timestamptz) END,
        limit_value   = (@limit_value::bigint),
        events        = NULL,
        updated_at    = now()
    WHERE c.use_type = (@use_type::text) AND c.unique_id = (@unique_id::text)
      AND NOT coalesce(c.blocked_until > (@now::timestamptz), false)
      AND (@n::bigint) <= (@limit_value::bigint) - CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > (@now::timestamptz), true)
            THEN c.already_count ELSE 0 END
    RETURNING true AS allowed, c.already_count, c.begin_time, c.end_time, c.blocked_until
), i AS (
    INSERT INTO count_limit AS c (use_type, unique_id, already_count, begin_time, end_time, limit_value, denied_count, blocked_until)
    SELECT (@use_type::text), (@unique_id::text),
        CASE WHEN f.fits THEN (@n::bigint) ELSE 0 END,
        CASE WHEN f.fits THEN (@begin_time::timestamptz) ELSE (@now::timestamptz) END,
        CASE WHEN f.fits THEN (@window_end::timestamptz) ELSE (@now::timestamptz) END,
        (@limit_value::bigint),
        CASE WHEN f.fits THEN 0 ELSE 1 END,
        CASE WHEN f.fits THEN NULL ELSE (@penalty_end::timestamptz) END
    FROM (SELECT (@n::bigint) <= (@limit_value::bigint) AS fits) f
    WHERE NOT EXISTS (SELECT FROM a)
    ON CONFLICT (use_type, unique_id) DO UPDATE SET
        limit_value   = excluded.limit_value,
        denied_count  = c.denied_count + 1,
        blocked_until = CASE WHEN coalesce(c.blocked_until > (@now::timestamptz), false) OR (@penalty_end::timestamptz) IS NULL
            THEN c.blocked_until ELSE (@penalty_end::timestamptz) END,
        updated_at    = now()
    WHERE coalesce(c.blocked_until > (@now::timestamptz), false)
       OR (@n::bigint) > excluded.limit_value - CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > (@now::timestamptz), true)
            THEN c.already_count ELSE 0 END
    RETURNING c.denied_count = 0 AS allowed, c.already_count, c.begin_time, c.end_time, c.blocked_until
)
SELECT a.allowed::boolean AS allowed, a.already_count::bigint AS already_count, a.begin_time::timestamptz AS begin_time,
    a.end_time::timestamptz AS end_time, a.blocked_until::timestamptz AS blocked_until
FROM a
UNION ALL
SELECT i.allowed, i.already_count, i.begin_time, i.end_time, i.blocked_until
FROM i;

-- name: PeekOne :one
-- PeekOne answers what AllowOne would for one event, writing and locking
-- nothing.
SELECT
    (NOT s.blocked AND u.used < @limit_value::bigint)::boolean AS allowed,
    u.used::bigint AS used,
    (CASE WHEN s.cur THEN y.begin_time ELSE @begin_time::timestamptz END)::timestamptz AS window_begin,
    (CASE WHEN s.cur THEN y.end_time ELSE @window_end::timestamptz END)::timestamptz AS window_end,
    (CASE WHEN s.blocked THEN y.blocked_until END)::timestamptz AS blocked_until
FROM (SELECT) AS one
LEFT JOIN count_limit y ON y.use_type = @use_type::text AND y.unique_id = @unique_id::text
CROSS JOIN LATERAL (SELECT
    coalesce(y.begin_time < coalesce(y.end_time, 'infinity') AND coalesce(y.end_time > @now::timestamptz, true), false) AS cur,
    coalesce(y.blocked_until > @now::timestamptz, false) AS blocked) s
CROSS JOIN LATERAL (SELECT CASE WHEN s.cur THEN y.already_count ELSE 0 END AS used) u;

-- name: AllowBatch :many
-- AllowBatch is AllowOne for many calls at once: group commit. Keys are
-- given once each, sorted; calls refer to their key by its 1-based position
-- (key_of) and are numbered 1, 2, ... within a key in arrival order (seq).
-- Calls for one key are decided one after another, in that order, by one
-- row update: each gets the result it would have had alone. The statement
-- returns one row per call it applied; a key created by a concurrent
-- transaction after the statement began is left alone and its calls are
-- not returned: send them again.
--
-- A row another transaction holds locked (a check inside a caller's
-- transaction that has not committed, a DBA's hand edit) is skipped, never
-- waited for: the statement would hold every other call of the batch
-- behind that lock. Its calls come back with busy set and nothing of them
-- applied; the caller sends them again later, alone or in another batch.
-- A key that no committed row holds is inserted, which waits only when
-- another transaction has inserted the same key and not yet committed.
--
-- CASE WHEN random() >= 0 THEN ... END is the array itself, but the planner
-- cannot see through it: it estimates the batch at 10 calls whatever its
-- size, as it must for the generic plan, so PostgreSQL keeps the generic
-- plan instead of planning this statement anew for every small batch.
WITH RECURSIVE keys AS (
    SELECT k.use_type, k.unique_id, k.ord::int AS k
    FROM ROWS FROM (unnest(CASE WHEN random() >= 0 THEN @use_types::text[] END), unnest(@unique_ids::text[]))
        WITH ORDINALITY AS k(use_type, unique_id, ord)
), calls AS MATERIALIZED (
    SELECT *
    FROM ROWS FROM (unnest(CASE WHEN random() >= 0 THEN @key_of::int[] END), unnest(@seq::int[]), unnest(@nows::timestamptz[]),
        unnest(@ns::bigint[]), unnest(@limits::bigint[]), unnest(@begins::timestamptz[]),
        unnest(@window_ends::timestamptz[]), unnest(@penalty_ends::timestamptz[]))
        AS c(k, seq, now, n, lim, b, e, pe)
), locked AS MATERIALIZED (
    -- Phase 1, skipping the rows another transaction holds.
    SELECT k.k, c.already_count, c.begin_time, c.end_time, c.blocked_until
    FROM keys k
    JOIN count_limit c ON c.use_type = k.use_type AND c.unique_id = k.unique_id
    ORDER BY k.k
    FOR NO KEY UPDATE OF c SKIP LOCKED
), busy AS MATERIALIZED (
    -- Rows the statement's snapshot shows that phase 1 did not lock.
    SELECT k.k
    FROM keys k
    JOIN count_limit c ON c.use_type = k.use_type AND c.unique_id = k.unique_id
    WHERE NOT EXISTS (SELECT FROM locked l WHERE l.k = k.k)
), fold (k, seq, existed, ex, cnt, wb, we, bu, den, counted, lim, allowed, used, ob, oe, obu) AS (
    -- Step 0 is each key's state as locked (or absent); step i applies
    -- call i to the state after step i-1.
    SELECT k.k, 0, l.k IS NOT NULL, l.k IS NOT NULL, coalesce(l.already_count, 0),
        l.begin_time, l.end_time, l.blocked_until, 0::bigint, false, 0::bigint,
        false, 0::bigint, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz
    FROM keys k
    LEFT JOIN locked l ON l.k = k.k
    WHERE NOT EXISTS (SELECT FROM busy y WHERE y.k = k.k)
    UNION ALL
    SELECT f.k, c.seq, f.existed, true,
        CASE WHEN d.fits THEN d.used + c.n ELSE f.cnt END,
        CASE WHEN d.fits AND NOT d.cur THEN c.b WHEN f.ex THEN f.wb ELSE c.now END,
        CASE WHEN d.fits AND NOT d.cur THEN c.e WHEN f.ex THEN f.we ELSE c.now END,
        CASE WHEN d.fits OR d.blocked OR c.pe IS NULL THEN f.bu ELSE c.pe END,
        f.den + CASE WHEN d.fits THEN 0 ELSE 1 END,
        f.counted OR d.fits,
        c.lim,
        d.fits,
        CASE WHEN d.fits THEN d.used + c.n ELSE d.used END,
        CASE WHEN d.cur THEN f.wb ELSE c.b END,
        CASE WHEN d.cur THEN f.we ELSE c.e END,
        CASE WHEN d.blocked THEN f.bu WHEN d.fits THEN NULL ELSE c.pe END
    FROM fold f
    JOIN calls c ON c.k = f.k AND c.seq = f.seq + 1
    CROSS JOIN LATERAL (SELECT s.cur, s.blocked, u.used, NOT s.blocked AND c.n <= c.lim - u.used AS fits
        FROM (SELECT
            f.ex AND f.wb < coalesce(f.we, 'infinity') AND coalesce(f.we > c.now, true) AS cur,
            coalesce(f.bu > c.now, false) AS blocked) s
        CROSS JOIN LATERAL (SELECT CASE WHEN s.cur THEN f.cnt ELSE 0 END AS used) u) d
), final AS (
    SELECT DISTINCT ON (f.k) f.k, f.existed, f.cnt, f.wb, f.we, f.bu, f.den, f.counted, f.lim
    FROM fold f
    WHERE f.seq > 0
    ORDER BY f.k, f.seq DESC
), inserted AS (
    -- Phase 2.
    INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value, denied_count, blocked_until)
    SELECT k.use_type, k.unique_id, f.cnt, f.wb, f.we, f.lim, f.den, f.bu
    FROM final f
    JOIN keys k ON k.k = f.k
    WHERE NOT f.existed
    ORDER BY f.k
    ON CONFLICT DO NOTHING
    RETURNING use_type, unique_id
), updated AS (
    -- Phase 3: the count(*) makes every insert happen first.
    UPDATE count_limit c SET
        already_count = f.cnt,
        begin_time    = f.wb,
        end_time      = f.we,
        limit_value   = f.lim,
        denied_count  = c.denied_count + f.den,
        blocked_until = f.bu,
        events        = CASE WHEN f.counted THEN NULL ELSE c.events END,
        updated_at    = now()
    FROM final f
    JOIN keys k ON k.k = f.k
    WHERE f.existed AND c.use_type = k.use_type AND c.unique_id = k.unique_id
      AND (SELECT count(*) FROM inserted) >= 0
    RETURNING f.k
), applied AS (
    SELECT u.k FROM updated u
    UNION ALL
    SELECT k.k FROM inserted i JOIN keys k ON k.use_type = i.use_type AND k.unique_id = i.unique_id
)
SELECT f.k::int AS key_of, f.seq::int AS seq, false AS busy, f.allowed::boolean AS allowed, f.used::bigint AS used,
    f.ob::timestamptz AS window_begin, f.oe::timestamptz AS window_end, f.obu::timestamptz AS blocked_until
FROM fold f
JOIN applied a ON a.k = f.k
WHERE f.seq > 0
UNION ALL
SELECT c.k, c.seq, true, false, 0, NULL, NULL, NULL
FROM calls c
JOIN busy y ON y.k = c.k;

-- name: AllowBatchDistinct :many
-- AllowBatchDistinct is AllowBatch for a batch whose calls all have keys of
-- their own, the common case over many ids. No call then waits on another's
-- outcome, so each is decided from its row as locked, as AllowOne decides,
-- without AllowBatch's recursive fold: a smaller plan and less work per
-- call. Calls are given sorted by key, one per key; a call is named by its
-- 1-based position (key_of). The statement returns one row per call it
-- applied, and one with busy set per call whose row another transaction
-- holds locked (see AllowBatch); a call whose key a concurrent transaction
-- created after the statement began is left alone and not returned: send
-- it again.
--
-- The CASE WHEN random() >= 0 is AllowBatch's: it keeps the generic plan.
WITH calls AS MATERIALIZED (
    SELECT c.ord::int AS k, c.use_type, c.unique_id, c.now, c.n, c.lim, c.b, c.e, c.pe
    FROM ROWS FROM (unnest(CASE WHEN random() >= 0 THEN @use_types::text[] END), unnest(@unique_ids::text[]),
        unnest(@nows::timestamptz[]), unnest(@ns::bigint[]), unnest(@limits::bigint[]),
        unnest(@begins::timestamptz[]), unnest(@window_ends::timestamptz[]), unnest(@penalty_ends::timestamptz[]))
        WITH ORDINALITY AS c(use_type, unique_id, now, n, lim, b, e, pe, ord)
), locked AS MATERIALIZED (
    -- Phase 1, skipping the rows another transaction holds.
    SELECT c.k, r.already_count, r.begin_time, r.end_time, r.blocked_until
    FROM calls c
    JOIN count_limit r ON r.use_type = c.use_type AND r.unique_id = c.unique_id
    ORDER BY c.k
    FOR NO KEY UPDATE OF r SKIP LOCKED
), busy AS MATERIALIZED (
    -- Rows the statement's snapshot shows that phase 1 did not lock.
    SELECT c.k
    FROM calls c
    JOIN count_limit r ON r.use_type = c.use_type AND r.unique_id = c.unique_id
    WHERE NOT EXISTS (SELECT FROM locked l WHERE l.k = c.k)
), decided AS MATERIALIZED (
    -- Each call applied to its row as locked (or absent): AllowBatch's
    -- fold step 1, from its step 0.
    SELECT c.k, c.use_type, c.unique_id, c.lim, l.k IS NOT NULL AS existed,
        CASE WHEN d.fits THEN d.used + c.n ELSE coalesce(l.already_count, 0) END AS cnt,
        CASE WHEN d.fits AND NOT d.cur THEN c.b WHEN l.k IS NOT NULL THEN l.begin_time ELSE c.now END AS wb,
        CASE WHEN d.fits AND NOT d.cur THEN c.e WHEN l.k IS NOT NULL THEN l.end_time ELSE c.now END AS we,
        CASE WHEN d.fits OR d.blocked OR c.pe IS NULL THEN l.blocked_until ELSE c.pe END AS bu,
        d.fits AS allowed,
        CASE WHEN d.fits THEN d.used + c.n ELSE d.used END AS used,
        CASE WHEN d.cur THEN l.begin_time ELSE c.b END AS ob,
        CASE WHEN d.cur THEN l.end_time ELSE c.e END AS oe,
        CASE WHEN d.blocked THEN l.blocked_until WHEN d.fits THEN NULL ELSE c.pe END AS obu
    FROM calls c
    LEFT JOIN locked l ON l.k = c.k
    CROSS JOIN LATERAL (SELECT s.cur, s.blocked, u.used, NOT s.blocked AND c.n <= c.lim - u.used AS fits
        FROM (SELECT
            coalesce(l.begin_time < coalesce(l.end_time, 'infinity') AND coalesce(l.end_time > c.now, true), false) AS cur,
            coalesce(l.blocked_until > c.now, false) AS blocked) s
        CROSS JOIN LATERAL (SELECT CASE WHEN s.cur THEN l.already_count ELSE 0 END AS used) u) d
    WHERE NOT EXISTS (SELECT FROM busy y WHERE y.k = c.k)
), inserted AS (
    -- Phase 2: the count(*) makes every lock of phase 1 be taken first.
    INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value, denied_count, blocked_until)
    SELECT d.use_type, d.unique_id, d.cnt, d.wb, d.we, d.lim, CASE WHEN d.allowed THEN 0 ELSE 1 END, d.bu
    FROM decided d
    WHERE NOT d.existed AND (SELECT count(*) FROM locked) >= 0
    ORDER BY d.k
    ON CONFLICT DO NOTHING
    RETURNING use_type, unique_id
), updated AS (
    -- Phase 3: the count(*) makes every insert happen first.
    UPDATE count_limit r SET
        already_count = d.cnt,
        begin_time    = d.wb,
        end_time      = d.we,
        limit_value   = d.lim,
        denied_count  = r.denied_count + CASE WHEN d.allowed THEN 0 ELSE 1 END,
        blocked_until = d.bu,
        events        = CASE WHEN d.allowed THEN NULL ELSE r.events END,
        updated_at    = now()
    FROM decided d
    WHERE d.existed AND r.use_type = d.use_type AND r.unique_id = d.unique_id
      AND (SELECT count(*) FROM inserted) >= 0
    RETURNING d.k
), applied AS (
    SELECT u.k FROM updated u
    UNION ALL
    SELECT d.k FROM inserted i JOIN decided d ON d.use_type = i.use_type AND d.unique_id = i.unique_id
)
SELECT d.k::int AS key_of, false AS busy, d.allowed::boolean AS allowed, d.used::bigint AS used,
    d.ob::timestamptz AS window_begin, d.oe::timestamptz AS window_end, d.obu::timestamptz AS blocked_until
FROM decided d
JOIN applied a ON a.k = d.k
UNION ALL
SELECT y.k, true, false, 0, NULL, NULL, NULL
FROM busy y;
