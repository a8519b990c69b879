-- countlimit v0.3.0: what the schema gains after v0.2.0
-- (00001_countlimit.sql and 00002_v0_2_0.sql, frozen).
-- docs/schema.sql is the whole schema this leaves, for reading;
-- docs/ARCHITECTURE.md, "The schema", says why each change is made so.
--
--   1. Every statement of a check finds each of its rows by the whole key
--      (unique_id, use_type), whatever plan PostgreSQL caches: a call
--      reads the same few pages when its id has 20 000 use types as when
--      it has one. countlimit_lock_rows locks an id's rows so.
--   2. countlimit_apply locks or creates its rows one at a time in key
--      order, with no subtransaction.
--
-- For DBAs: run "countlimit migrate up" (or pgstore.Migrate). Functions
-- only: no table changes, no row is written, no lock is held beyond an
-- instant. A v0.1.0 or v0.2.0 binary keeps working beside a newer one
-- during a rolling upgrade: every function it calls is still here, with
-- the same arguments and results. Down returns to v0.2.0's schema exactly.

-- +goose Up

-- 1. Rows found by their whole key.

-- countlimit_lock_rows: the rows of one id's use types, locked in key
-- order; countlimit_apply's refunds and countlimit_apply_batch lock so.
-- +goose StatementBegin
CREATE FUNCTION countlimit_lock_rows(p_unique_id text, p_use_types text[], p_skip_locked boolean)
RETURNS text[] LANGUAGE plpgsql AS $fn$
DECLARE
    got text[] := '{}';
    uts text[] := p_use_types;
    ut  text;
    hit boolean;
BEGIN
    -- One statement a key, whose plan is the same for every key and every
    -- id: PostgreSQL keeps it (a statement over the array would be planned
    -- again at every call, its cached plan costed for ten keys).
    IF cardinality(uts) > 1 THEN
        uts := ARRAY(SELECT u FROM unnest(p_use_types) AS u ORDER BY u COLLATE "C");
    END IF;
    FOREACH ut IN ARRAY uts LOOP
        IF p_skip_locked THEN
            PERFORM FROM count_limit c WHERE c.use_type = ut AND c.unique_id = p_unique_id
            FOR UPDATE SKIP LOCKED;
            hit := FOUND;
            IF NOT hit AND EXISTS (SELECT FROM count_limit c WHERE c.use_type = ut AND c.unique_id = p_unique_id) THEN
                RETURN NULL;
            END IF;
        ELSE
            PERFORM FROM count_limit c WHERE c.use_type = ut AND c.unique_id = p_unique_id
            FOR UPDATE;
            hit := FOUND;
        END IF;
        IF hit THEN
            got := got || ut;
        END IF;
    END LOOP;
    RETURN got;
END
$fn$;
-- +goose StatementEnd
COMMENT ON FUNCTION countlimit_lock_rows(text, text[], boolean) IS
    'countlimit: locks (FOR UPDATE) the rows of one id''s use types that exist, one at a time in key order, each found by its whole key; returns their use types in that order. With p_skip_locked, NULL as soon as a row that exists is held by another transaction (the rows before it stay locked).';

-- countlimit_reset: Reset, one row at a time in key order.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_reset(p_unique_id text, p_use_types text[])
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
    deleted bigint := 0;
    rc      bigint;
    ut      text;
BEGIN
    FOR ut IN SELECT u FROM unnest(p_use_types) AS u ORDER BY u COLLATE "C" LOOP
        DELETE FROM count_limit c WHERE c.use_type = ut AND c.unique_id = p_unique_id;
        GET DIAGNOSTICS rc = ROW_COUNT;
        deleted := deleted + rc;
    END LOOP;
    RETURN deleted;
END
$fn$;
-- +goose StatementEnd

-- countlimit_apply_batch: as v0.2.0's, locking with countlimit_lock_rows.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_apply_batch(
    p_ops        text[],
    p_unique_ids text[],
    p_nows       timestamptz[],
    p_ns         bigint[],
    p_firsts     int[],
    p_use_types  text[],
    p_limits     bigint[],
    p_begins     timestamptz[],
    p_lengths    bigint[],
    p_spans      bigint[],
    p_blocks     bigint[],
    p_kinds      text[],
    p_intervals  bigint[],
    p_bursts     bigint[]
) RETURNS TABLE (
    o_call          int,
    o_ord           int,
    o_allowed       boolean,
    o_used          bigint,
    o_begin         timestamptz,
    o_end           timestamptz,
    o_blocked_until timestamptz,
    o_free_at       timestamptz
) LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
    lo     int;
    hi     int;
    uts    text[];
    got    text[];
    ok     boolean;
    undone text[] := '{}'; -- ids with a call not decided
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ops, 1), 0) LOOP
        lo := p_firsts[i];
        hi := p_firsts[i + 1] - 1;
        uts := p_use_types[lo:hi];
        got := '{}';
        IF p_unique_ids[i] = ANY (undone) THEN
            ok := false;
        ELSIF p_ops[i] = 'peek' THEN
            ok := true;
        ELSE
            -- NULL when a row is held. A refund gives back nothing of a
            -- row that is absent, but must wait for one that is held.
            got := countlimit_lock_rows(p_unique_ids[i], uts, true);
            ok := got IS NOT NULL AND (p_ops[i] = 'refund' OR cardinality(got) = cardinality(uts));
            got := coalesce(got, '{}');
        END IF;
        IF NOT ok THEN
            undone := undone || p_unique_ids[i];
            o_call := i;
            o_ord := 0;
            RETURN NEXT;
            CONTINUE;
        END IF;
        RETURN QUERY SELECT i, r.* FROM countlimit_apply_locked(p_ops[i], p_unique_ids[i], p_nows[i], p_ns[i], uts,
            p_limits[lo:hi], p_begins[lo:hi], p_lengths[lo:hi], p_spans[lo:hi], p_blocks[lo:hi], p_kinds[lo:hi],
            p_intervals[lo:hi], p_bursts[lo:hi], got, array_fill(false, ARRAY[hi - lo + 1])) AS r;
    END LOOP;
END
$fn$;
-- +goose StatementEnd
COMMENT ON FUNCTION countlimit_apply_batch(text[], text[], timestamptz[], bigint[], int[], text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[], bigint[], bigint[]) IS
    'countlimit: many checks of countlimit_apply in one statement (pgstore''s group commit): calls whose rows all exist and are free are decided in order; the others come back with o_ord 0, nothing written, to be sent to countlimit_apply.';

-- countlimit_allow_distinct_pooled and countlimit_allow_batch_pooled: as
-- v0.2.0's, each row written found by its key alone.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_allow_distinct_pooled(
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
) LANGUAGE plpgsql SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off AS $fn$
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_allow_batch_pooled(
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
) LANGUAGE plpgsql SET enable_seqscan = off SET enable_hashjoin = off SET enable_mergejoin = off AS $fn$
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

-- 2. countlimit_apply (the overload with p_intervals and p_bursts): each
-- row locked, or created when absent, in key order; then
-- countlimit_apply_locked decides.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_apply(
    p_op        text,
    p_unique_id text,
    p_now       timestamptz,
    p_n         bigint,
    p_use_types text[],
    p_limits    bigint[],
    p_begins    timestamptz[],
    p_lengths   bigint[],
    p_spans     bigint[],
    p_blocks    bigint[],
    p_kinds     text[],
    p_intervals bigint[],
    p_bursts    bigint[]
) RETURNS TABLE (
    o_ord           int,
    o_allowed       boolean,
    o_used          bigint,
    o_begin         timestamptz,
    o_end           timestamptz,
    o_blocked_until timestamptz,
    o_free_at       timestamptz
) LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
    cnt     int := coalesce(array_length(p_use_types, 1), 0);
    us      interval := interval '1 microsecond';
    created boolean[] := array_fill(false, ARRAY[cnt]);
    rc      bigint;
    got     text[] := '{}';
    ord     int[];
    k       int;
BEGIN
    IF p_op NOT IN ('allow', 'peek', 'refund') THEN
        RAISE EXCEPTION 'countlimit_apply: unknown op %', p_op USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Each row in key order, whose lock (or creation) every other
    -- statement takes in that order too: for a refund, locked where it
    -- exists; for an allow, locked, or created when absent. A peek locks
    -- nothing. No subtransaction: a row created by another transaction
    -- since this statement began, which ON CONFLICT waited for, is
    -- locked at the next attempt.
    IF p_op = 'refund' THEN
        got := countlimit_lock_rows(p_unique_id, p_use_types, false);
    ELSIF p_op = 'allow' THEN
        IF cnt = 1 THEN
            ord := '{1}';
        ELSE
            ord := ARRAY(SELECT i FROM generate_subscripts(p_use_types, 1) AS i ORDER BY p_use_types[i] COLLATE "C");
        END IF;
        FOREACH k IN ARRAY ord LOOP
            FOR attempt IN 1 .. 8 LOOP
                PERFORM FROM count_limit c WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id
                FOR UPDATE;
                IF FOUND THEN
                    got := got || p_use_types[k];
                    EXIT;
                END IF;
                -- An empty window (begin = end) that only a counted
                -- event opens; for a smooth check, a TAT drained
                -- before any clock reading (the epoch), not at p_now:
                -- a check whose clock reads earlier than this one's
                -- would find one event there that was never counted,
                -- should this check be denied and leave the row.
                INSERT INTO count_limit (use_type, unique_id, begin_time, end_time, limit_value, window_kind,
                    smooth_interval, smooth_burst)
                VALUES (p_use_types[k], p_unique_id,
                    CASE WHEN p_intervals[k] > 0 THEN 'epoch' ELSE p_now END,
                    CASE WHEN p_intervals[k] > 0 THEN 'epoch' ELSE p_now END,
                    p_limits[k], nullif(p_kinds[k], ''),
                    CASE WHEN p_intervals[k] > 0 THEN p_intervals[k] * us END,
                    CASE WHEN p_intervals[k] > 0 THEN p_bursts[k] END)
                ON CONFLICT DO NOTHING;
                GET DIAGNOSTICS rc = ROW_COUNT;
                IF rc > 0 THEN
                    created[k] := true;
                    EXIT;
                END IF;
            END LOOP;
            IF NOT (created[k] OR p_use_types[k] = ANY (got)) THEN
                -- Under REPEATABLE READ or SERIALIZABLE the rows created
                -- since this transaction's snapshot stay invisible to it.
                RAISE EXCEPTION 'countlimit_apply: rows of % were created concurrently 8 times over', p_unique_id
                    USING ERRCODE = 'serialization_failure';
            END IF;
        END LOOP;
    END IF;

    RETURN QUERY SELECT * FROM countlimit_apply_locked(p_op, p_unique_id, p_now, p_n, p_use_types, p_limits, p_begins,
        p_lengths, p_spans, p_blocks, p_kinds, p_intervals, p_bursts, got, created);
END
$fn$;
-- +goose StatementEnd
COMMENT ON FUNCTION countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[], bigint[], bigint[]) IS
    'countlimit: one atomic check of one id against one or more rules (allow, peek or refund), smooth rules (GCRA) included, locking (or creating) its rows one at a time in key order, then writing them, so that concurrent checks cannot deadlock. Reset is a plain DELETE.';

-- +goose Down
-- Back to v0.2.0's schema exactly: what the Up changed takes the released
-- text again (00002_v0_2_0.sql; countlimit_reset, 00001_countlimit.sql).

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_apply(
    p_op        text,
    p_unique_id text,
    p_now       timestamptz,
    p_n         bigint,
    p_use_types text[],
    p_limits    bigint[],
    p_begins    timestamptz[],
    p_lengths   bigint[],
    p_spans     bigint[],
    p_blocks    bigint[],
    p_kinds     text[],
    p_intervals bigint[],
    p_bursts    bigint[]
) RETURNS TABLE (
    o_ord           int,
    o_allowed       boolean,
    o_used          bigint,
    o_begin         timestamptz,
    o_end           timestamptz,
    o_blocked_until timestamptz,
    o_free_at       timestamptz
) LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
    cnt     int := coalesce(array_length(p_use_types, 1), 0);
    us      interval := interval '1 microsecond';
    created boolean[] := array_fill(false, ARRAY[cnt]);
    rc      bigint;
    locked  boolean := false;
    got     text[] := '{}';
    k       int;
BEGIN
    IF p_op NOT IN ('allow', 'peek', 'refund') THEN
        RAISE EXCEPTION 'countlimit_apply: unknown op %', p_op USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Phases 1 and 2, for allow and refund; peek locks nothing.
    IF p_op = 'refund' THEN
        got := ARRAY(SELECT c.use_type FROM count_limit c
            WHERE c.use_type = ANY (p_use_types) AND c.unique_id = p_unique_id
            ORDER BY c.use_type COLLATE "C"
            FOR UPDATE);
    ELSIF p_op = 'allow' THEN
        FOR attempt IN 1 .. 8 LOOP
            BEGIN
                got := ARRAY(SELECT c.use_type FROM count_limit c
                    WHERE c.use_type = ANY (p_use_types) AND c.unique_id = p_unique_id
                    ORDER BY c.use_type COLLATE "C"
                    FOR UPDATE);
                FOR k IN SELECT i FROM generate_subscripts(p_use_types, 1) AS i ORDER BY p_use_types[i] COLLATE "C" LOOP
                    CONTINUE WHEN p_use_types[k] = ANY (got);
                    -- An empty window (begin = end) that only a counted
                    -- event opens; for a smooth check, a TAT drained
                    -- before any clock reading (the epoch), not at p_now:
                    -- a check whose clock reads earlier than this one's
                    -- would find one event there that was never counted,
                    -- should this check be denied and leave the row.
                    INSERT INTO count_limit (use_type, unique_id, begin_time, end_time, limit_value, window_kind,
                        smooth_interval, smooth_burst)
                    VALUES (p_use_types[k], p_unique_id,
                        CASE WHEN p_intervals[k] > 0 THEN 'epoch' ELSE p_now END,
                        CASE WHEN p_intervals[k] > 0 THEN 'epoch' ELSE p_now END,
                        p_limits[k], nullif(p_kinds[k], ''),
                        CASE WHEN p_intervals[k] > 0 THEN p_intervals[k] * us END,
                        CASE WHEN p_intervals[k] > 0 THEN p_bursts[k] END)
                    ON CONFLICT DO NOTHING;
                    GET DIAGNOSTICS rc = ROW_COUNT;
                    IF rc = 0 THEN
                        -- Created concurrently: undo this attempt (its locks
                        -- and inserts) and start again.
                        RAISE EXCEPTION USING ERRCODE = 'CL001';
                    END IF;
                    created[k] := true;
                END LOOP;
                locked := true;
            EXCEPTION WHEN SQLSTATE 'CL001' THEN
                created := array_fill(false, ARRAY[cnt]);
                got := '{}';
            END;
            EXIT WHEN locked;
        END LOOP;
        IF NOT locked THEN
            -- Under REPEATABLE READ or SERIALIZABLE the rows created since
            -- this transaction's snapshot stay invisible to it.
            RAISE EXCEPTION 'countlimit_apply: rows of % were created concurrently 8 times over', p_unique_id
                USING ERRCODE = 'serialization_failure';
        END IF;
    END IF;

    RETURN QUERY SELECT * FROM countlimit_apply_locked(p_op, p_unique_id, p_now, p_n, p_use_types, p_limits, p_begins,
        p_lengths, p_spans, p_blocks, p_kinds, p_intervals, p_bursts, got, created);
END
$fn$;
-- +goose StatementEnd
COMMENT ON FUNCTION countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[], bigint[], bigint[]) IS
    'countlimit: one atomic check of one id against one or more rules (allow, peek or refund), smooth rules (GCRA) included, taking row locks in key order (existing rows, then new ones, then writes) so that concurrent checks cannot deadlock. Reset is a plain DELETE.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_allow_distinct_pooled(
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_allow_batch_pooled(
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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_apply_batch(
    p_ops        text[],
    p_unique_ids text[],
    p_nows       timestamptz[],
    p_ns         bigint[],
    p_firsts     int[],
    p_use_types  text[],
    p_limits     bigint[],
    p_begins     timestamptz[],
    p_lengths    bigint[],
    p_spans      bigint[],
    p_blocks     bigint[],
    p_kinds      text[],
    p_intervals  bigint[],
    p_bursts     bigint[]
) RETURNS TABLE (
    o_call          int,
    o_ord           int,
    o_allowed       boolean,
    o_used          bigint,
    o_begin         timestamptz,
    o_end           timestamptz,
    o_blocked_until timestamptz,
    o_free_at       timestamptz
) LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
    lo     int;
    hi     int;
    uts    text[];
    got    text[];
    ok     boolean;
    undone text[] := '{}'; -- ids with a call not decided
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ops, 1), 0) LOOP
        lo := p_firsts[i];
        hi := p_firsts[i + 1] - 1;
        uts := p_use_types[lo:hi];
        got := '{}';
        IF p_unique_ids[i] = ANY (undone) THEN
            ok := false;
        ELSIF p_ops[i] = 'peek' THEN
            ok := true;
        ELSE
            got := ARRAY(SELECT c.use_type FROM count_limit c
                WHERE c.use_type = ANY (uts) AND c.unique_id = p_unique_ids[i]
                ORDER BY c.use_type COLLATE "C"
                FOR UPDATE SKIP LOCKED);
            IF p_ops[i] = 'allow' THEN
                ok := cardinality(got) = cardinality(uts);
            ELSE
                -- A refund gives back nothing of a row that is absent,
                -- but must wait for one that is held.
                ok := NOT EXISTS (SELECT FROM count_limit c
                    WHERE c.use_type = ANY (uts) AND c.unique_id = p_unique_ids[i] AND c.use_type <> ALL (got));
            END IF;
        END IF;
        IF NOT ok THEN
            undone := undone || p_unique_ids[i];
            o_call := i;
            o_ord := 0;
            RETURN NEXT;
            CONTINUE;
        END IF;
        RETURN QUERY SELECT i, r.* FROM countlimit_apply_locked(p_ops[i], p_unique_ids[i], p_nows[i], p_ns[i], uts,
            p_limits[lo:hi], p_begins[lo:hi], p_lengths[lo:hi], p_spans[lo:hi], p_blocks[lo:hi], p_kinds[lo:hi],
            p_intervals[lo:hi], p_bursts[lo:hi], got, array_fill(false, ARRAY[hi - lo + 1])) AS r;
    END LOOP;
END
$fn$;
-- +goose StatementEnd
COMMENT ON FUNCTION countlimit_apply_batch(text[], text[], timestamptz[], bigint[], int[], text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[], bigint[], bigint[]) IS
    'countlimit: many checks of countlimit_apply in one statement (pgstore''s group commit): calls whose rows all exist and are free are decided in order; the others come back with o_ord 0, nothing written, to be sent to countlimit_apply.';

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_reset(p_unique_id text, p_use_types text[])
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
    deleted bigint;
BEGIN
    WITH gone AS (
        DELETE FROM count_limit c
        USING (
            SELECT l.use_type, l.unique_id
            FROM count_limit l
            WHERE l.unique_id = p_unique_id AND l.use_type = ANY(p_use_types)
            ORDER BY l.use_type COLLATE "C"
            FOR UPDATE
        ) d
        WHERE c.use_type = d.use_type AND c.unique_id = d.unique_id
          AND c.unique_id = p_unique_id AND c.use_type = ANY (p_use_types)
        RETURNING 1
    )
    SELECT count(*) INTO deleted FROM gone;
    RETURN deleted;
END
$fn$;
-- +goose StatementEnd

DROP FUNCTION countlimit_lock_rows(text, text[], boolean);
