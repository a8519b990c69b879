-- countlimit v0.2.0: what the schema gained after v0.1.0
-- (00001_countlimit.sql, frozen), each object once, in its final form.
-- docs/schema.sql is the whole schema this leaves, for reading;
-- docs/ARCHITECTURE.md, "The schema", says why each change is made so.
--
--   1. count_limit: two columns for smooth limits (GCRA), and no index on
--      end_time.
--   2. The checks: countlimit_apply decides smooth checks; on pgstore's
--      pool, a cheaper statement runs first for rows that exist;
--      countlimit_lock_briefly in PL/pgSQL, planned once a session.
--   3. The purge sweeps the table instead of reading that index.
--   4. For people: count_limit_status and countlimit_adjust_count read
--      smooth rows.
--
-- For DBAs: run "countlimit migrate up" (or pgstore.Migrate). No row is
-- written. Adding the columns (no default) and dropping the index change
-- the catalog only, under an ACCESS EXCLUSIVE lock on count_limit held for
-- an instant; the migration waits at most 2 seconds for it, then fails and
-- changes nothing: run it again when no long transaction holds the table.
-- A v0.1.0 binary keeps working beside a newer one during a rolling
-- upgrade: every function it calls is still here. Down returns to
-- v0.1.0's schema exactly.

-- +goose Up
SET LOCAL lock_timeout = '2s';

-- 1. count_limit. A smooth key keeps its TAT in end_time; these two
-- columns record its rule, for people and count_limit_status.
-- +goose StatementBegin
ALTER TABLE count_limit
    ADD COLUMN smooth_interval interval,
    ADD COLUMN smooth_burst    bigint;
-- +goose StatementEnd

-- The purge no longer reads it, and it kept a new window's update from
-- being HOT.
DROP INDEX count_limit_end_time_idx;

COMMENT ON COLUMN count_limit.smooth_interval IS
    'Smooth limits only (window_kind smooth): the rule''s emission interval, period / limit rounded up to the microsecond; one event drains in this long. Written by every smooth check that counts in the row or creates it; meaningful only while window_kind is smooth. For people and count_limit_status; no check reads it.';
COMMENT ON COLUMN count_limit.smooth_burst IS
    'Smooth limits only (window_kind smooth): the rule''s burst, how many events fit at once when the key is drained. Written by every smooth check that counts in the row or creates it; meaningful only while window_kind is smooth. For people and count_limit_status; no check reads it.';
COMMENT ON COLUMN count_limit.window_kind IS
    'The window kind of the rule that last counted here, or created the row: rolling, fixed, calendar, sliding, lifetime or smooth; NULL for CheckLimit''s window of the caller''s own. A smooth row (window_kind smooth) keeps its TAT in end_time; otherwise for people, no check reads it.';
COMMENT ON COLUMN count_limit.already_count IS
    'Events counted in the window [begin_time, end_time). Counts nothing once end_time has passed. For sliding windows, cardinality(events) as last written. For smooth limits (window_kind smooth), the events not yet drained when the row was last written, at most the burst. A check of another kind carries this count over while the window is current.';
COMMENT ON COLUMN count_limit.begin_time IS
    'When the current window began; for sliding windows, the oldest logged event. For smooth limits (window_kind smooth), and a window another kind joined there, the epoch: a smooth row''s window is [epoch, TAT).';
COMMENT ON COLUMN count_limit.end_time IS
    'When the current window ends (exclusive); NULL for a lifetime limit. For sliding windows, the newest event plus the window length. For smooth limits (window_kind smooth), the TAT: when the key is drained.';

-- 2. The checks.

-- countlimit_apply_locked: the decision of a check (allow, peek or
-- refund, any rules) once its rows are locked, or read for a peek: what
-- countlimit_apply does after it has locked and created them, and what
-- countlimit_apply_batch does for each call whose rows all exist and were
-- free. No subtransaction: a batch of many calls takes none.
-- +goose StatementBegin
CREATE FUNCTION countlimit_apply_locked(
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
    p_bursts    bigint[],
    p_got       text[],
    p_created   boolean[]
) RETURNS TABLE (
    o_ord           int,
    o_allowed       boolean,
    o_used          bigint,
    o_begin         timestamptz,
    o_end           timestamptz,
    o_blocked_until timestamptz,
    o_free_at       timestamptz
) LANGUAGE plpgsql AS $fn$
DECLARE
    cnt     int := coalesce(array_length(p_use_types, 1), 0);
    need    bigint := CASE WHEN p_op = 'allow' THEN p_n ELSE 1 END;
    us      interval := interval '1 microsecond';
    rec     count_limit;
    found_  boolean[] := array_fill(NULL::boolean, ARRAY[cnt]);
    used    bigint[] := array_fill(NULL::bigint, ARRAY[cnt]);
    wbegin  timestamptz[] := array_fill(NULL::timestamptz, ARRAY[cnt]);
    wend    timestamptz[] := array_fill(NULL::timestamptz, ARRAY[cnt]);
    blocked timestamptz[] := array_fill(NULL::timestamptz, ARRAY[cnt]);
    fits    boolean[] := array_fill(NULL::boolean, ARRAY[cnt]);
    freeat  timestamptz[] := array_fill(NULL::timestamptz, ARRAY[cnt]);
    ahead   bigint[] := array_fill(0::bigint, ARRAY[cnt]); -- a smooth check's max(TAT, now) - now, in µs
    carried boolean[] := array_fill(false, ARRAY[cnt]); -- a sliding or smooth check reads another kind's count
    held_to timestamptz[] := array_fill(NULL::timestamptz, ARRAY[cnt]); -- the end of the window that holds it
    counts  boolean;
    t       bigint;
    b       bigint;
    live    timestamptz[];
    span    interval;
    all_ok  boolean := true;
    k       int;
BEGIN
    IF p_op NOT IN ('allow', 'peek', 'refund') THEN
        RAISE EXCEPTION 'countlimit_apply: unknown op %', p_op USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Every row is locked (peek: read) and, for allow, exists: see each
    -- one's window, in use_type order.
    FOR k IN SELECT i FROM generate_subscripts(p_use_types, 1) AS i ORDER BY p_use_types[i] COLLATE "C" LOOP
        SELECT * INTO rec FROM count_limit c WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id;
        -- A row that appeared after phase 1 and that this call did not
        -- create is not locked: this call runs as if before it.
        found_[k] := FOUND AND (p_op = 'peek' OR p_use_types[k] = ANY (p_got) OR p_created[k]);
        IF NOT found_[k] THEN
            rec := NULL;
        END IF;
        blocked[k] := CASE WHEN rec.blocked_until > p_now THEN rec.blocked_until END;
        -- The row's count over its window, whatever form the row is in,
        -- while that window is current: what a check of another kind
        -- carries over.
        counts := found_[k] AND rec.already_count > 0
            AND rec.begin_time < coalesce(rec.end_time, 'infinity') AND coalesce(rec.end_time > p_now, true);
        IF p_intervals[k] > 0 THEN
            -- Smooth: the TAT of a smooth row; another kind's count, as
            -- that many units taken now (a full burst at the most).
            t := p_intervals[k];
            b := p_bursts[k];
            IF found_[k] AND rec.window_kind = 'smooth' THEN
                IF rec.end_time > p_now THEN
                    ahead[k] := ((extract(epoch FROM rec.end_time) - extract(epoch FROM p_now)) * 1000000)::bigint;
                END IF;
            ELSIF counts THEN
                ahead[k] := least(rec.already_count, b) * t;
                carried[k] := true;
                held_to[k] := rec.end_time;
            END IF;
            -- A refund gives back only what a smooth row keeps.
            IF p_op = 'refund' AND ahead[k] > 0 AND NOT carried[k] THEN
                IF p_n >= (ahead[k] + t - 1) / t THEN
                    ahead[k] := 0;
                ELSE
                    ahead[k] := ahead[k] - p_n * t;
                END IF;
                UPDATE count_limit c SET
                    already_count = least(b, (ahead[k] + t - 1) / t),
                    end_time = p_now + ahead[k] * us,
                    updated_at = now()
                WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id;
            END IF;
            used[k] := least(b, (ahead[k] + t - 1) / t);
            wend[k] := CASE WHEN ahead[k] > 0 THEN p_now + ahead[k] * us END;
            -- need * t only once need <= b: CASE evaluates in order.
            fits[k] := CASE WHEN blocked[k] IS NOT NULL OR p_limits[k] <= 0 OR need > b THEN false
                ELSE ahead[k] + need * t <= b * t END;
            IF p_limits[k] > 0 AND need <= b THEN
                IF ahead[k] + need * t > b * t THEN
                    -- A carried count drains when its window ends (a
                    -- lifetime's never: NULL).
                    freeat[k] := CASE WHEN carried[k] THEN held_to[k] ELSE p_now + (ahead[k] + need * t - b * t) * us END;
                END IF;
            END IF;
            all_ok := all_ok AND fits[k];
            CONTINUE;
        END IF;
        IF p_spans[k] > 0 AND coalesce(cardinality(rec.events), 0) = 0 THEN
            -- Sliding, and no log: another kind's count, as that many
            -- events logged at the latest instant that lets them leave
            -- when its window ends, never after now. A refund gives
            -- nothing back of it.
            IF counts THEN
                span := p_spans[k] * us;
                carried[k] := true;
                held_to[k] := rec.end_time;
                used[k] := rec.already_count;
                wbegin[k] := least(p_now, rec.end_time - span);
                wend[k] := wbegin[k] + span;
                IF need > p_limits[k] - used[k] AND need <= p_limits[k] THEN
                    -- The logged time of events that leave when that
                    -- window ends (a lifetime's never: NULL).
                    freeat[k] := rec.end_time - span;
                END IF;
            ELSE
                used[k] := 0;
            END IF;
        ELSIF p_spans[k] > 0 THEN
            span := p_spans[k] * us;
            live := ARRAY(SELECT e FROM unnest(rec.events) AS e WHERE e > p_now - span ORDER BY e);
            used[k] := cardinality(live);
            wbegin[k] := live[1];
            wend[k] := live[cardinality(live)] + span;
            IF p_op = 'refund' THEN
                used[k] := greatest(used[k] - p_n, 0);
                live := live[1:used[k]];
                wbegin[k] := live[1];
                wend[k] := live[cardinality(live)] + span;
                IF found_[k] THEN
                    UPDATE count_limit c SET
                        events = live,
                        already_count = cardinality(live),
                        begin_time = coalesce(live[1], c.begin_time),
                        end_time = coalesce(wend[k], c.end_time),
                        updated_at = now()
                    WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id;
                END IF;
            END IF;
            IF need > p_limits[k] - used[k] AND need <= p_limits[k] THEN
                freeat[k] := live[used[k] + need - p_limits[k]];
            END IF;
        -- Current: not empty, not over. Begin is not compared with p_now, so
        -- a caller whose clock read is older than a window another caller
        -- just opened joins it instead of resetting it: a sliding log's
        -- window, and a smooth row's, [epoch, TAT), included.
        ELSIF found_[k] AND rec.begin_time < coalesce(rec.end_time, 'infinity') AND (rec.end_time IS NULL OR rec.end_time > p_now) THEN
            used[k] := rec.already_count;
            wbegin[k] := rec.begin_time;
            wend[k] := rec.end_time;
            IF p_op = 'refund' AND used[k] > 0 THEN
                used[k] := greatest(used[k] - p_n, 0);
                UPDATE count_limit c SET already_count = used[k], updated_at = now()
                WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id;
            END IF;
        ELSE
            used[k] := 0;
            wbegin[k] := p_begins[k];
            wend[k] := CASE WHEN p_lengths[k] > 0 THEN p_begins[k] + p_lengths[k] * us END;
        END IF;
        fits[k] := blocked[k] IS NULL AND need <= p_limits[k] - used[k];
        all_ok := all_ok AND fits[k];
    END LOOP;

    IF p_op = 'allow' THEN
        FOR k IN 1 .. cnt LOOP
            IF all_ok AND p_intervals[k] > 0 THEN
                -- Smooth: the TAT moves n intervals on; the row becomes (or
                -- stays) a smooth row, any window or log of another kind gone.
                t := p_intervals[k];
                ahead[k] := ahead[k] + p_n * t;
                used[k] := least(p_bursts[k], (ahead[k] + t - 1) / t);
                wend[k] := p_now + ahead[k] * us;
                UPDATE count_limit c SET
                    already_count = used[k],
                    begin_time = 'epoch',
                    end_time = wend[k],
                    events = NULL,
                    limit_value = p_limits[k],
                    window_kind = 'smooth',
                    smooth_interval = t * us,
                    smooth_burst = p_bursts[k],
                    updated_at = now()
                WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id;
            ELSIF all_ok THEN
                IF p_spans[k] > 0 THEN
                    span := p_spans[k] * us;
                    IF carried[k] THEN
                        live := array_fill(wbegin[k], ARRAY[used[k]]::int[]);
                    ELSE
                        SELECT c.events INTO live FROM count_limit c WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id;
                    END IF;
                    -- Sorted, so the log stays in time order when this
                    -- caller's clock read is older than the newest event.
                    live := ARRAY(SELECT e FROM unnest(array_cat(live, array_fill(p_now, ARRAY[p_n]::int[]))) AS e
                        WHERE e > p_now - span ORDER BY e);
                    used[k] := cardinality(live);
                    wbegin[k] := live[1];
                    wend[k] := live[cardinality(live)] + span;
                ELSE
                    live := NULL;
                    used[k] := used[k] + p_n;
                END IF;
                -- Over a smooth row this writes a window (or a log) in its
                -- place: its TAT goes.
                UPDATE count_limit c SET
                    already_count = used[k],
                    begin_time = wbegin[k],
                    end_time = wend[k],
                    events = live,
                    limit_value = p_limits[k],
                    window_kind = nullif(p_kinds[k], ''),
                    updated_at = now()
                WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id;
            ELSIF fits[k] THEN
                IF p_created[k] THEN
                    -- Another rule denied: this check counts nothing and
                    -- leaves no row behind.
                    DELETE FROM count_limit c WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id;
                END IF;
            ELSE
                IF blocked[k] IS NULL AND p_blocks[k] > 0 THEN
                    blocked[k] := p_now + p_blocks[k] * us;
                END IF;
                UPDATE count_limit c SET
                    denied_count = c.denied_count + 1,
                    blocked_until = coalesce(blocked[k], c.blocked_until),
                    limit_value = p_limits[k],
                    updated_at = now()
                WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id;
            END IF;
        END LOOP;
    END IF;

    FOR k IN 1 .. cnt LOOP
        o_ord := k;
        o_allowed := all_ok;
        o_used := used[k];
        o_begin := wbegin[k];
        o_end := wend[k];
        o_blocked_until := blocked[k];
        o_free_at := CASE WHEN NOT all_ok THEN freeat[k] END;
        RETURN NEXT;
    END LOOP;
END
$fn$;
-- +goose StatementEnd
COMMENT ON FUNCTION countlimit_apply_locked(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[], bigint[], bigint[], text[], boolean[]) IS
    'countlimit: the decision of countlimit_apply over rows its caller has locked (p_got: the use types of the rows it locked; p_created: which of them it inserted); called by countlimit_apply and countlimit_apply_batch, which set enable_seqscan = off for it.';

-- countlimit_apply with p_intervals and p_bursts: v0.1.0's
-- countlimit_apply, and smooth checks (p_intervals[k] > 0, the emission
-- interval in µs, and p_bursts[k]; 0 for both otherwise), and counts
-- carried over from a rule of another kind. v0.1.0's overload stays for
-- v0.1.0 binaries. It locks (or creates) the rows, then
-- countlimit_apply_locked decides.
-- +goose StatementBegin
CREATE FUNCTION countlimit_apply(
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
COMMENT ON FUNCTION countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[]) IS
    'countlimit, as v0.1.0 called it: one atomic check of one id against one or more rules (allow, peek or refund) of every kind but smooth. Kept so that a v0.1.0 binary works during a rolling upgrade; newer binaries call the overload with p_intervals and p_bursts.';

-- countlimit_lock_briefly as v0.1.0 has it, in PL/pgSQL: a session plans
-- its expressions once, where a statement that is not prepared (behind a
-- pooler) planned the SQL function's inlined body again at every call.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_lock_briefly() RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    w text := current_setting('countlimit.lock_wait', true);
BEGIN
    -- One statement, no branch of PL/pgSQL's: the model tests' coverage
    -- (internal/testkit/coverreport) has none to reach.
    RETURN set_config('lock_timeout', CASE
        WHEN coalesce(w, '') = '' OR w !~ '^\s*[0-9]{1,9}(\.[0-9]{1,6})?\s*(us|ms|s|min|h|d)?\s*$' THEN '2ms'
        ELSE least(greatest(round(coalesce(nullif(extract(epoch FROM (w
            || CASE WHEN w ~ '[0-9]\s*$' THEN 'ms' ELSE '' END)::interval), 0) * 1000, 100)), 1), 100) || 'ms'
        END, true);
END
$fn$;
-- +goose StatementEnd

-- countlimit_apply_batch: many checks of countlimit_apply's (allow, peek
-- or refund, any rules) in one statement, one transaction: pgstore's
-- group commit for every kind the fast path does not take. Call i is
-- p_ops[i], p_unique_ids[i], p_nows[i], p_ns[i], and its checks are
-- elements p_firsts[i] .. p_firsts[i + 1] - 1 of the check arrays, as
-- countlimit_apply takes them. Calls come in lock order (by id), calls
-- of one id in arrival order, and are decided in that order, each
-- seeing the writes of those before it. A call whose rows do not all
-- exist (allow), or one of whose rows another transaction holds (allow,
-- refund), is not decided: nothing of it is written, it comes back as
-- one row with o_ord 0, and so does every later call of its id, which
-- would otherwise go before it; the caller sends them to countlimit_apply,
-- which creates rows and waits for locks. Rows are locked with SKIP
-- LOCKED, so one held row never delays the other ids' calls, and no
-- subtransaction is taken.
-- +goose StatementBegin
CREATE FUNCTION countlimit_apply_batch(
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

-- countlimit_lease_batch: many calls of a concurrency limit (acquire,
-- release, extend, peek) in one statement, one transaction: pgstore's
-- group commit of leases. Call i is p_ops[i] of (p_use_types[i],
-- p_unique_ids[i]) at p_nows[i], with p_lease_tokens[i], p_limits[i],
-- p_expires_ats[i] and p_penalty_ends[i] as countlimit_acquire,
-- countlimit_release_lease, countlimit_extend_lease and
-- countlimit_peek_leases take them. Calls come in lock order (by id),
-- calls of one id in arrival order, and each is decided by that one
-- function, in that order, seeing the writes of those before it. Acquire
-- and Extend first lock the key's count_limit row, Release and Extend the
-- lease row, with SKIP LOCKED, so the functions then wait for no lock. A
-- call whose key row is absent (a new key's Acquire, an Extend of a key
-- gone) or held, or whose lease row is held, is not decided: nothing of it
-- is written, it comes back as one row with o_done false, and so does
-- every later call of its id; the caller sends them alone. No denial here
-- is a lazy tally: the batch's commit waits for its flush.
-- +goose StatementBegin
CREATE FUNCTION countlimit_lease_batch(
    p_ops          text[],
    p_use_types    text[],
    p_unique_ids   text[],
    p_nows         timestamptz[],
    p_lease_tokens text[],
    p_limits       bigint[],
    p_expires_ats  timestamptz[],
    p_penalty_ends timestamptz[]
) RETURNS TABLE (
    o_call          int,
    o_done          boolean,
    o_allowed       boolean,
    o_used          bigint,
    o_first_expiry  timestamptz,
    o_last_expiry   timestamptz,
    o_blocked_until timestamptz
) LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
    ok     boolean;
    undone text[] := '{}'; -- ids with a call not decided
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ops, 1), 0) LOOP
        ok := NOT p_unique_ids[i] = ANY (undone);
        IF ok AND p_ops[i] IN ('acquire', 'extend') THEN
            PERFORM FROM count_limit c
            WHERE c.use_type = p_use_types[i] AND c.unique_id = p_unique_ids[i]
            FOR NO KEY UPDATE SKIP LOCKED;
            ok := FOUND;
        END IF;
        IF ok AND p_ops[i] IN ('release', 'extend') THEN
            -- A lease that is gone is answered (not live); one held waits.
            PERFORM FROM count_limit_lease l
            WHERE l.use_type = p_use_types[i] AND l.unique_id = p_unique_ids[i] AND l.lease_token = p_lease_tokens[i]
            FOR UPDATE SKIP LOCKED;
            ok := FOUND OR NOT EXISTS (SELECT FROM count_limit_lease l
                WHERE l.use_type = p_use_types[i] AND l.unique_id = p_unique_ids[i] AND l.lease_token = p_lease_tokens[i]);
        END IF;
        IF NOT ok THEN
            undone := undone || p_unique_ids[i];
            o_call := i;
            o_done := false;
            RETURN NEXT;
        ELSIF p_ops[i] = 'acquire' THEN
            RETURN QUERY SELECT i, true, r.* FROM countlimit_acquire(p_use_types[i], p_unique_ids[i], p_nows[i],
                p_lease_tokens[i], p_limits[i], p_expires_ats[i], p_penalty_ends[i], false) AS r;
        ELSIF p_ops[i] = 'release' THEN
            RETURN QUERY SELECT i, true, r.* FROM countlimit_release_lease(p_use_types[i], p_unique_ids[i], p_nows[i],
                p_lease_tokens[i]) AS r;
        ELSIF p_ops[i] = 'extend' THEN
            RETURN QUERY SELECT i, true, r.* FROM countlimit_extend_lease(p_use_types[i], p_unique_ids[i], p_nows[i],
                p_lease_tokens[i], p_expires_ats[i]) AS r;
        ELSE
            RETURN QUERY SELECT i, true, r.* FROM countlimit_peek_leases(p_use_types[i], p_unique_ids[i], p_nows[i],
                p_limits[i]) AS r;
        END IF;
    END LOOP;
END
$fn$;
-- +goose StatementEnd
COMMENT ON FUNCTION countlimit_lease_batch(text[], text[], text[], timestamptz[], text[], bigint[], timestamptz[], timestamptz[]) IS
    'countlimit: many calls of concurrency limits (acquire, release, extend, peek) in one statement (pgstore''s group commit): calls whose rows exist (acquire, extend) and are free are decided in order by the function each would call alone; the others come back with o_done false, nothing written, to be sent alone.';

-- countlimit_allow_one_pooled: countlimit_allow_one with p_skip_locked
-- (pgstore's pool), after one statement that decides a call whose row
-- exists and is free.
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

-- countlimit_allow_distinct_pooled: countlimit_allow_distinct, after one
-- statement that decides a batch whose rows all exist and are free.
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

-- countlimit_allow_batch_pooled: countlimit_allow_batch, after a running
-- sum that decides a batch whose rows all exist, are free and have room
-- for every call (a hot id's).
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

-- 3. The purge.

-- countlimit_purge_leases deletes at most batch_size expired leases,
-- oldest first, and returns how many.
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

-- countlimit_purge_rows deletes at most batch_size expired rows in pages
-- [from, from + 1024) and returns where the next statement goes on (NULL
-- once the sweep is done).
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

-- countlimit_purge, for DBAs and pg_cron: expired leases, then the sweep
-- from where this session's last call stopped (countlimit.purge_at), up to
-- batch_size rows or the table's end.
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

-- 4. For people.

-- count_limit_status: smooth rows read as used (events not yet drained,
-- in whole microseconds as the checks count them), remaining (burst less
-- used; none at limit 0) and window_end (the TAT); a sliding log's window
-- begins at its oldest event still in it.
-- +goose StatementBegin
CREATE OR REPLACE VIEW count_limit_status AS
SELECT
    s.use_type,
    s.unique_id,
    s.window_kind::text AS window_kind,
    s.used::bigint AS used,
    s.limit_value,
    greatest(s.cap - s.used, 0)::bigint AS remaining,
    s.denied_count,
    s.window_begin::timestamptz AS window_begin,
    s.window_end::timestamptz AS window_end,
    (CASE WHEN s.used > 0 AND s.window_end IS NOT NULL THEN s.window_end - now() END)::interval AS resets_in,
    (s.blocked_until IS NOT NULL AND s.blocked_until > now())::boolean AS blocked,
    (CASE WHEN s.blocked_until > now() THEN s.blocked_until END)::timestamptz AS blocked_until,
    (CASE WHEN s.blocked_until > now() THEN s.blocked_until - now() END)::interval AS blocked_for,
    s.updated_at
FROM (
    SELECT
        c.use_type,
        c.unique_id,
        c.limit_value,
        c.denied_count,
        c.blocked_until,
        c.updated_at,
        CASE
            WHEN k.concurrent THEN 'concurrent'
            WHEN m.smooth THEN 'smooth'
            WHEN c.events IS NOT NULL THEN 'sliding'
            WHEN c.end_time IS NULL THEN 'lifetime'
            ELSE coalesce(c.window_kind, 'window')
        END AS window_kind,
        CASE WHEN k.concurrent THEN h.held ELSE n.counted END AS used,
        -- A smooth limit of 0 lets nothing through, burst or not.
        CASE WHEN NOT k.concurrent AND m.smooth AND c.limit_value > 0 THEN coalesce(c.smooth_burst, c.limit_value)
            WHEN NOT k.concurrent AND m.smooth THEN 0 ELSE c.limit_value END AS cap,
        -- A sliding log is time-ordered: its last n.counted events are the
        -- ones still in the window.
        CASE WHEN k.concurrent THEN h.first_taken WHEN m.smooth THEN NULL
            WHEN c.events IS NOT NULL AND n.counted > 0 THEN c.events[cardinality(c.events) - n.counted::int + 1]
            ELSE nullif(c.begin_time, 'epoch') END AS window_begin,
        CASE WHEN k.concurrent THEN h.last_expiry WHEN m.smooth THEN CASE WHEN c.end_time > now() THEN c.end_time END
            ELSE c.end_time END AS window_end
    FROM count_limit c
    CROSS JOIN LATERAL (
        -- No lease outlives lease_until, so keys without one skip the probe,
        -- which reads the key's leases by the primary key (see "Plans").
        SELECT count(*) AS held, min(l.taken_at) AS first_taken, max(l.expires_at) AS last_expiry
        FROM count_limit_lease l
        WHERE c.lease_until > now()
          AND l.use_type = c.use_type AND l.unique_id = c.unique_id AND (l.expires_at > now()) IS TRUE
    ) h
    CROSS JOIN LATERAL (
        -- A smooth row keeps its TAT in end_time.
        SELECT coalesce(c.window_kind = 'smooth', false) AS smooth
    ) m
    CROSS JOIN LATERAL (
        -- A smooth row's TAT - now() and its interval in whole microseconds,
        -- as the checks count them (model.Apply); epoch arithmetic keeps
        -- DST out of it.
        SELECT CASE WHEN m.smooth THEN ((extract(epoch FROM c.end_time) - extract(epoch FROM now())) * 1000000)::bigint END AS ahead,
               CASE WHEN m.smooth THEN (extract(epoch FROM c.smooth_interval) * 1000000)::bigint END AS t
    ) u
    CROSS JOIN LATERAL (
        SELECT CASE
            -- Smooth: the events not yet drained, ceil(ahead / t) in
            -- integers, at most the burst.
            WHEN m.smooth THEN CASE
                WHEN u.ahead <= 0 THEN 0
                WHEN u.t IS NULL OR u.t <= 0 THEN NULL
                ELSE least(coalesce(c.smooth_burst, c.limit_value), (u.ahead + u.t - 1) / u.t)
                END
            -- The log is time-ordered and end_time is its newest event plus
            -- the window's length; epoch arithmetic keeps DST out of it.
            WHEN c.events IS NOT NULL THEN (
                SELECT count(*) FROM unnest(c.events) AS e
                WHERE extract(epoch FROM e) > extract(epoch FROM now())
                    - (extract(epoch FROM c.end_time) - extract(epoch FROM c.events[cardinality(c.events)])))
            -- Current: not empty and not over; its begin is not compared with
            -- now (a check whose clock runs ahead of the database's opens
            -- a window that begins later than now() and is current all the
            -- same).
            WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > now(), true) THEN c.already_count
            ELSE 0
        END AS counted
    ) n
    CROSS JOIN LATERAL (
        SELECT c.lease_until IS NOT NULL AND (h.held > 0 OR n.counted = 0) AS concurrent
    ) k
) s;
-- +goose StatementEnd

COMMENT ON VIEW count_limit_status IS
    'count_limit as of the database clock, for people: what each id has used of its limit now (for concurrency limits, the slots it holds; for smooth limits, the events not yet drained), what remains, whether it is blocked and for how long.';
COMMENT ON COLUMN count_limit_status.window_kind IS 'rolling, fixed or calendar (the rule that last counted in the window; window for CheckLimit''s window of the caller''s own), sliding (an exact log of events), lifetime (never resets), concurrent (slots held at once, as leases in count_limit_lease) or smooth (a rate with bursts, GCRA: one instant per key, the TAT, in count_limit.end_time).';
COMMENT ON COLUMN count_limit_status.used IS 'Events counted in the current window as of now; 0 once the window has ended. For concurrent limits, the leases live now (slots held). For smooth limits, the events not yet drained at now, ceil((TAT - now) / smooth_interval), at most smooth_burst; 0 once drained.';
COMMENT ON COLUMN count_limit_status.remaining IS 'limit_value - used, never below 0: how many more events (for concurrent limits, slots) the last applied limit allows now. For smooth limits, smooth_burst - used: how many fit at once now (one more drains every smooth_interval); 0 while limit_value is 0.';
COMMENT ON COLUMN count_limit_status.window_begin IS 'When the current window began; for sliding windows, the oldest logged event still in the window (while none is, the oldest logged); for concurrent limits, when the oldest live lease was taken (NULL when none is held); NULL for smooth limits, and for a window another kind joined from a smooth limit''s (it began at the epoch).';
COMMENT ON COLUMN count_limit_status.window_end IS 'When the current window ends (exclusive); NULL for lifetime limits. For sliding windows, the newest event plus the window length; for concurrent limits, when the last live lease expires unless extended or released (NULL when none is held); for smooth limits, when the id is fully drained (its TAT), NULL once it is.';
COMMENT ON COLUMN count_limit_status.resets_in IS 'How long until the window ends and its count goes, while something is counted; NULL otherwise and for lifetime limits. For concurrent limits, until the last live lease expires; for smooth limits, until the id is fully drained.';

-- countlimit_adjust_count: on a smooth row, delta moves the TAT by delta
-- intervals, between now() and a full burst, in whole microseconds as the
-- checks count (a drained row lowered stays as it is); a row of a sliding
-- rule is refused whether or not it keeps a log.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_adjust_count(unique_id text, use_type text, delta bigint)
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
    id      text := unique_id;
    ut      text := use_type;
    rec     count_limit;
    counted bigint;
    t       bigint; -- a smooth row's interval, in µs
    b       bigint; -- its burst
    ahead   bigint; -- its max(TAT, now()) - now(), in µs
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
    IF rec.window_kind = 'smooth' THEN
        t := (extract(epoch FROM rec.smooth_interval) * 1000000)::bigint;
        b := rec.smooth_burst;
        IF t IS NULL OR t <= 0 OR b IS NULL OR b < 1 THEN
            RAISE EXCEPTION 'countlimit_adjust_count: (%, %) is a smooth limit with no interval or burst recorded (smooth_interval %, smooth_burst %)',
                ut, id, rec.smooth_interval, rec.smooth_burst
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'The next smooth check of the id records them; countlimit_reset_id forgets the id.';
        END IF;
        ahead := greatest(((extract(epoch FROM rec.end_time) - extract(epoch FROM now())) * 1000000)::bigint, 0);
        IF ahead = 0 AND delta <= 0 THEN
            -- Drained: nothing to give back, and nothing is written.
            RETURN 0;
        END IF;
        -- Past a burst and one either way a bound is met anyway; so clamped,
        -- delta * t does not overflow.
        ahead := least(greatest(ahead + greatest(least(delta, b + 1), -b - 1) * t, 0), b * t);
        counted := least(b, (ahead + t - 1) / t);
        UPDATE count_limit c SET
            already_count = counted,
            begin_time    = 'epoch',
            end_time      = now() + ahead * interval '1 microsecond',
            updated_at    = now()
        WHERE c.use_type = ut AND c.unique_id = id;
        RETURN counted;
    END IF;
    -- A sliding rule's row, even one that only denials made (no log yet),
    -- as count_limit_status shows it: window_kind sliding.
    IF rec.events IS NOT NULL OR rec.window_kind = 'sliding' THEN
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
    'countlimit, for DBAs: add delta (negative to lower) to the count of one id''s current window for one use type, never below 0; returns the new count, or NULL (and a notice) when there is no current window to change. Refuses sliding windows. On a smooth limit, moves its TAT by delta intervals (never before now, never past a full burst; a drained limit lowered is left as it is) and returns the new used. Safe beside live checks: the row is locked and the count changed in place. See docs/operations.md.';

-- +goose Down
-- Back to v0.1.0's schema exactly: what the Up added goes, what it
-- changed takes 00001's text again. Rows stay: a smooth key's row reads
-- to v0.1.0's statements as a window from the epoch to its TAT holding
-- its undrained events, purged once the TAT passes. Building the index
-- again scans the table under a SHARE lock, which holds off every check
-- that writes while it runs. The binary that runs after it must send no
-- smooth check, which v0.1.0's schema cannot decide (v0.1.0's sends none).
SET LOCAL lock_timeout = '2s';

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

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_lock_briefly() RETURNS text LANGUAGE sql AS $fn$
    SELECT set_config('lock_timeout', CASE
        WHEN coalesce(current_setting('countlimit.lock_wait', true), '') = '' THEN '2ms'
        WHEN current_setting('countlimit.lock_wait', true) !~ '^\s*[0-9]{1,9}(\.[0-9]{1,6})?\s*(us|ms|s|min|h|d)?\s*$' THEN '2ms'
        ELSE least(greatest(round(coalesce(nullif(extract(epoch FROM (current_setting('countlimit.lock_wait', true)
            || CASE WHEN current_setting('countlimit.lock_wait', true) ~ '[0-9]\s*$' THEN 'ms' ELSE '' END)::interval), 0) * 1000, 100)), 1), 100) || 'ms'
        END, true)
$fn$;
-- +goose StatementEnd
DROP FUNCTION countlimit_allow_one_pooled(text, text, timestamptz, bigint, bigint, timestamptz, timestamptz, timestamptz, text);
DROP FUNCTION countlimit_allow_distinct_pooled(text[], text[], timestamptz[], bigint[], bigint[], timestamptz[], timestamptz[], timestamptz[], text[]);
DROP FUNCTION countlimit_allow_batch_pooled(text[], text[], int[], int[], timestamptz[], bigint[], bigint[], timestamptz[], timestamptz[], timestamptz[], text[]);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_adjust_count(unique_id text, use_type text, delta bigint)
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

-- +goose StatementBegin
CREATE OR REPLACE VIEW count_limit_status AS
SELECT
    s.use_type,
    s.unique_id,
    s.window_kind::text AS window_kind,
    s.used::bigint AS used,
    s.limit_value,
    greatest(s.limit_value - s.used, 0)::bigint AS remaining,
    s.denied_count,
    s.window_begin::timestamptz AS window_begin,
    s.window_end::timestamptz AS window_end,
    (CASE WHEN s.used > 0 AND s.window_end IS NOT NULL THEN s.window_end - now() END)::interval AS resets_in,
    (s.blocked_until IS NOT NULL AND s.blocked_until > now())::boolean AS blocked,
    (CASE WHEN s.blocked_until > now() THEN s.blocked_until END)::timestamptz AS blocked_until,
    (CASE WHEN s.blocked_until > now() THEN s.blocked_until - now() END)::interval AS blocked_for,
    s.updated_at
FROM (
    SELECT
        c.use_type,
        c.unique_id,
        c.limit_value,
        c.denied_count,
        c.blocked_until,
        c.updated_at,
        CASE
            WHEN k.concurrent THEN 'concurrent'
            WHEN c.events IS NOT NULL THEN 'sliding'
            WHEN c.end_time IS NULL THEN 'lifetime'
            ELSE coalesce(c.window_kind, 'window')
        END AS window_kind,
        CASE WHEN k.concurrent THEN h.held ELSE n.counted END AS used,
        CASE WHEN k.concurrent THEN h.first_taken ELSE c.begin_time END AS window_begin,
        CASE WHEN k.concurrent THEN h.last_expiry ELSE c.end_time END AS window_end
    FROM count_limit c
    CROSS JOIN LATERAL (
        -- No lease outlives lease_until, so keys without one skip the probe,
        -- which reads the key's leases by the primary key (see "Plans").
        SELECT count(*) AS held, min(l.taken_at) AS first_taken, max(l.expires_at) AS last_expiry
        FROM count_limit_lease l
        WHERE c.lease_until > now()
          AND l.use_type = c.use_type AND l.unique_id = c.unique_id AND (l.expires_at > now()) IS TRUE
    ) h
    CROSS JOIN LATERAL (
        SELECT CASE
            -- The log is time-ordered and end_time is its newest event plus
            -- the window's length; epoch arithmetic keeps DST out of it.
            WHEN c.events IS NOT NULL THEN (
                SELECT count(*) FROM unnest(c.events) AS e
                WHERE extract(epoch FROM e) > extract(epoch FROM now())
                    - (extract(epoch FROM c.end_time) - extract(epoch FROM c.events[cardinality(c.events)])))
            -- Current: not empty and not over; its begin is not compared with
            -- now (a check whose clock runs ahead of the database's opens
            -- a window that begins later than now() and is current all the
            -- same).
            WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > now(), true) THEN c.already_count
            ELSE 0
        END AS counted
    ) n
    CROSS JOIN LATERAL (
        SELECT c.lease_until IS NOT NULL AND (h.held > 0 OR n.counted = 0) AS concurrent
    ) k
) s;
-- +goose StatementEnd

COMMENT ON VIEW count_limit_status IS
    'count_limit as of the database clock, for people: what each id has used of its limit now (for concurrency limits, the slots it holds), what remains, whether it is blocked and for how long.';
COMMENT ON COLUMN count_limit_status.window_kind IS 'rolling, fixed or calendar (the rule that last counted in the window; window for CheckLimit''s window of the caller''s own), sliding (an exact log of events), lifetime (never resets) or concurrent (slots held at once, as leases in count_limit_lease).';
COMMENT ON COLUMN count_limit_status.used IS 'Events counted in the current window as of now; 0 once the window has ended. For concurrent limits, the leases live now (slots held).';
COMMENT ON COLUMN count_limit_status.remaining IS 'limit_value - used, never below 0: how many more events (for concurrent limits, slots) the last applied limit allows now.';
COMMENT ON COLUMN count_limit_status.window_begin IS 'When the current window began; for sliding windows, the oldest logged event; for concurrent limits, when the oldest live lease was taken (NULL when none is held).';
COMMENT ON COLUMN count_limit_status.window_end IS 'When the current window ends (exclusive); NULL for lifetime limits. For sliding windows, the newest event plus the window length; for concurrent limits, when the last live lease expires unless extended or released (NULL when none is held).';
COMMENT ON COLUMN count_limit_status.resets_in IS 'How long until the window ends and its count goes, while something is counted; NULL otherwise and for lifetime limits. For concurrent limits, until the last live lease expires.';

DROP FUNCTION countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[], bigint[], bigint[]);
DROP FUNCTION countlimit_lease_batch(text[], text[], text[], timestamptz[], text[], bigint[], timestamptz[], timestamptz[]);
DROP FUNCTION countlimit_apply_batch(text[], text[], timestamptz[], bigint[], int[], text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[], bigint[], bigint[]);
DROP FUNCTION countlimit_apply_locked(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[], bigint[], bigint[], text[], boolean[]);
COMMENT ON FUNCTION countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[]) IS
    'countlimit: one atomic check of one id against one or more rules (allow, peek or refund), taking row locks in key order (existing rows, then new ones, then writes) so that concurrent checks cannot deadlock. Reset is a plain DELETE.';

COMMENT ON COLUMN count_limit.already_count IS 'Events counted in the window [begin_time, end_time). Counts nothing once end_time has passed. For sliding windows, cardinality(events).';
COMMENT ON COLUMN count_limit.begin_time IS 'When the current window began; for sliding windows, the oldest logged event.';
COMMENT ON COLUMN count_limit.end_time IS 'When the current window ends (exclusive); NULL for a lifetime limit. For sliding windows, the newest event plus the window length.';
COMMENT ON COLUMN count_limit.window_kind IS
    'The window kind of the rule that last counted here, or created the row: rolling, fixed, calendar, sliding or lifetime; NULL for CheckLimit''s window of the caller''s own. For people; no check reads it.';

-- +goose StatementBegin
ALTER TABLE count_limit
    DROP COLUMN smooth_burst,
    DROP COLUMN smooth_interval;
-- +goose StatementEnd
