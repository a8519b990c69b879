-- countlimit's second migration: the smooth window kind (countlimit.Smooth,
-- GCRA), the first change after v0.1.0 froze 00001_countlimit.sql.
--
-- For DBAs, in short: run "countlimit migrate up" (or pgstore.Migrate).
-- It adds two nullable columns to count_limit with no default (a change of
-- the catalog only: no table rewrite, no scan, an ACCESS EXCLUSIVE lock
-- held for an instant, once the statements in flight on the table end;
-- while it waits for a long transaction that reads count_limit, every
-- check queues behind it, as for any ALTER TABLE: run it when none is
-- open, or with a lock_timeout, and again if it times out),
-- adds a function, and replaces the view count_limit_status and the DBA's
-- countlimit_adjust_count. Its Down returns exactly to 00001's schema:
-- the two columns go, the smooth keys' rows stay (see Down below).
--
-- How a smooth key is kept. A smooth rule keeps one instant per key, the
-- TAT (theoretical arrival time): when the key's events so far are
-- drained at the rule's rate. A smooth key's row holds it as the end of a
-- window that begins at the epoch, with the units not yet drained when
-- the row was last written as its count:
--
--   window_kind = 'smooth', end_time = the TAT, begin_time = 'epoch',
--   already_count = ceil((TAT - now) / interval), at most the burst, at
--   the writing check's now; events NULL;
--   smooth_interval and smooth_burst: the rule's emission interval and
--   burst, as the last smooth check of the key had them.
--
-- The row is smooth while window_kind = 'smooth'; the key is drained once
-- end_time <= now. One count per (use type, id), whatever kind of window
-- asks (driver.Apply, countlimit/driver/model.go): every row keeps a
-- count over a window in already_count, begin_time and end_time (a
-- window's; a sliding log's length over [oldest, newest + span), as last
-- written; a smooth row's undrained units over [epoch, TAT)), and a check
-- of another kind carries that count over while the window is current:
--
--   * A check that counts in windows (fixed, rolling, calendar, lifetime:
--     00001's fast path, countlimit_allow_one and the group commit's
--     batches, and countlimit_apply) joins the window, a smooth row's as
--     any other: it sees already_count and counts on top of it, writing
--     its own window_kind and events NULL, so the TAT goes (the row is a
--     window that ends at the TAT); a denial leaves the row as it is.
--     Those statements of 00001 are right on a smooth row as they are:
--     wherever they count, they write their own window_kind.
--   * A sliding check (countlimit_apply) on a row with no log sees its
--     count as that many events logged at min(now, end_time - span): they
--     leave the log when the window that holds them ends (or a span from
--     now, when that is sooner).
--   * A smooth check (countlimit_apply) on a row that is not smooth sees
--     its count as that many units taken now, a full burst at the most.
--
-- Why not a column of its own for the TAT: a TAT there would need every
-- statement of 00001 that counts replaced, to clear it and to carry its
-- count; kept as a window, it is carried over and cleared by those
-- statements as they are. And:
--
--   * The purge (countlimit_purge, by count_limit_end_time_idx) deletes a
--     drained smooth key as it deletes an ended window: end_time <= now,
--     no penalty, no lease. No new index. (00004_purge_sweep.sql later
--     drops that index and sweeps the table instead, by the same test.)
--   * A v0.1.0 binary still running beside a newer one during a rolling
--     upgrade keeps working on the migrated database: its functions are
--     all still here (countlimit_apply's new signature is an overload, the
--     old one stays), and it never sends a smooth check. It still resets
--     what it does not know: its countlimit_apply, under a sliding rule,
--     starts a log from nothing over another kind's count (and a sliding
--     refund there sets already_count to 0). A kind changes safely only
--     once every process runs a release that carries this.
--
-- smooth_interval and smooth_burst are for people and for
-- count_limit_status, which needs them for used and remaining: no check
-- reads them (each check carries its rule). They are set by every smooth
-- check that counts in the row or creates it (a denial writes only the
-- tally and the penalty, as for every kind), and left as they are by
-- checks of other kinds: they mean something only while the row is
-- smooth. ADD COLUMN
-- without a default is instant on every PostgreSQL countlimit supports.
--
-- Smooth checks are decided only by countlimit_apply (the new overload):
-- pgstore sends a smooth check there, never to the fast path or a group
-- commit, so countlimit_allow_one, countlimit_allow_batch and
-- countlimit_allow_distinct know nothing of smooth windows and are left
-- as 00001 made them: a smooth row is a window to them.

-- +goose Up

-- +goose StatementBegin
ALTER TABLE count_limit
    ADD COLUMN smooth_interval interval,
    ADD COLUMN smooth_burst    bigint;
-- +goose StatementEnd

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

-- countlimit_apply, the overload with p_intervals and p_bursts: 00001's
-- countlimit_apply (read its comment there: the three phases of locks, the
-- retries, a sliding check's log), smooth checks, and the counts another
-- kind keeps, carried over. A smooth check has p_intervals[k] > 0, its
-- emission interval in microseconds, and p_bursts[k], its burst; its
-- p_begins is NULL and its p_lengths and p_spans 0. Every other check has
-- 0 for both and is decided as 00001's countlimit_apply decides it, but a
-- sliding check on a row with no log (below).
--
-- A row carries a count over to a check of another kind while it is
-- "counting": found, already_count > 0 and its window current (begin_time
-- < end_time, or end_time NULL, and end_time > now), which for a smooth
-- row is [epoch, TAT).
--
-- A smooth check is decided by GCRA, as driver.Apply (the contract as
-- code, countlimit/driver/model.go) spells it, in whole microseconds: T =
-- p_intervals[k], B = p_bursts[k]; for a smooth row ahead = max(TAT, now)
-- - now, its TAT in end_time; for a counting row of another kind ahead =
-- min(already_count, B)*T, that many units taken now (carried); 0
-- otherwise.
--
--   * It fits when not blocked, its limit is above 0, need <= B and
--     ahead + need*T <= B*T (need*T is taken only once need <= B, so
--     nothing overflows: B*T is at most 100 years).
--   * Allowed: TAT = now + ahead + n*T, written as the smooth row above:
--     already_count ceil((TAT - now)/T) (at most B), begin_time the epoch,
--     events NULL (the window and the log of another kind go).
--   * Refund, on a smooth row only: TAT goes back n*T, never before now (a
--     drained key stays), and already_count follows it.
--   * Denied: the tally and the penalty, as for every kind.
--   * Its state: used = ceil(ahead/T) (at most B), no begin, end = now +
--     ahead while ahead > 0, free_at (when not allowed, and it could fit)
--     now + ahead + need*T - B*T, the instant need more fit; for a count
--     carried over, when the window that holds it ends (NULL for a
--     lifetime's: no wait helps).
--
-- A sliding check on a row with no log (events NULL or empty) that is
-- counting sees already_count events logged at at = min(now, end_time -
-- span), never after now, so that they leave the log when that window
-- ends: used already_count, its window [at, at + span). Allowed, the log
-- becomes those events and n at now; denied (need fits the limit but not
-- beside them), free_at is end_time - span (NULL for a lifetime's). A
-- sliding refund gives nothing back of a row with no log.
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
    need    bigint := CASE WHEN p_op = 'allow' THEN p_n ELSE 1 END;
    us      interval := interval '1 microsecond';
    rec     count_limit;
    found_  boolean[] := array_fill(NULL::boolean, ARRAY[cnt]);
    created boolean[] := array_fill(false, ARRAY[cnt]);
    rc      bigint;
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

    -- Every row is now locked (peek: read) and, for allow, exists: see
    -- each one's window, in use_type order.
    FOR k IN SELECT i FROM generate_subscripts(p_use_types, 1) AS i ORDER BY p_use_types[i] COLLATE "C" LOOP
        SELECT * INTO rec FROM count_limit c WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id;
        -- A row that appeared after phase 1 and that this call did not
        -- create is not locked: this call runs as if before it.
        found_[k] := FOUND AND (p_op = 'peek' OR p_use_types[k] = ANY (got) OR created[k]);
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
                IF created[k] THEN
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
COMMENT ON FUNCTION countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[], bigint[], bigint[]) IS
    'countlimit: one atomic check of one id against one or more rules (allow, peek or refund), smooth rules (GCRA) included, taking row locks in key order (existing rows, then new ones, then writes) so that concurrent checks cannot deadlock. Reset is a plain DELETE.';
COMMENT ON FUNCTION countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[]) IS
    'countlimit, as v0.1.0 called it: one atomic check of one id against one or more rules (allow, peek or refund) of every kind but smooth. Kept so that a v0.1.0 binary works during a rolling upgrade; newer binaries call the overload with p_intervals and p_bursts.';

-- count_limit_status, with smooth rows: window_kind 'smooth'; used is the
-- events not yet drained at now(), ceil((TAT - now()) / smooth_interval),
-- at most smooth_burst (0 once drained); remaining is smooth_burst - used,
-- how many fit at once now (limit_value stays the rule's limit, its events
-- per period); window_begin is NULL, window_end the TAT (when the key is
-- drained) and resets_in the time until then, while something is
-- undrained. Every other kind reads as 00001's view reads it, but a window
-- another kind joined from a smooth row's (it begins at the epoch) has no
-- window_begin either. The columns are 00001's, in its order.
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
        CASE WHEN NOT k.concurrent AND m.smooth THEN coalesce(c.smooth_burst, c.limit_value) ELSE c.limit_value END AS cap,
        CASE WHEN k.concurrent THEN h.first_taken WHEN m.smooth THEN NULL ELSE nullif(c.begin_time, 'epoch') END AS window_begin,
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
        SELECT CASE
            -- Smooth: the events not yet drained, rounded up, at most the
            -- burst; epoch arithmetic keeps DST out of it.
            WHEN m.smooth THEN CASE
                WHEN c.end_time <= now() THEN 0
                WHEN c.smooth_interval IS NULL OR c.smooth_interval <= interval '0' THEN NULL
                ELSE least(coalesce(c.smooth_burst, c.limit_value),
                    ceil((extract(epoch FROM c.end_time) - extract(epoch FROM now())) / extract(epoch FROM c.smooth_interval)))
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
COMMENT ON COLUMN count_limit_status.remaining IS 'limit_value - used, never below 0: how many more events (for concurrent limits, slots) the last applied limit allows now. For smooth limits, smooth_burst - used: how many fit at once now (one more drains every smooth_interval).';
COMMENT ON COLUMN count_limit_status.window_begin IS 'When the current window began; for sliding windows, the oldest logged event; for concurrent limits, when the oldest live lease was taken (NULL when none is held); NULL for smooth limits, and for a window another kind joined from a smooth limit''s (it began at the epoch).';
COMMENT ON COLUMN count_limit_status.window_end IS 'When the current window ends (exclusive); NULL for lifetime limits. For sliding windows, the newest event plus the window length; for concurrent limits, when the last live lease expires unless extended or released (NULL when none is held); for smooth limits, when the id is fully drained (its TAT), NULL once it is.';
COMMENT ON COLUMN count_limit_status.resets_in IS 'How long until the window ends and its count goes, while something is counted; NULL otherwise and for lifetime limits. For concurrent limits, until the last live lease expires; for smooth limits, until the id is fully drained.';

-- countlimit_adjust_count, with smooth rows: delta (negative to lower)
-- moves the TAT by delta smooth_intervals, as if delta more events had
-- been counted (or refunded): never before now() (a drained id stays
-- drained, a negative delta on it changes nothing) and never past a full
-- burst (now() + smooth_burst intervals: used at most smooth_burst, which
-- denies what follows until an interval drains). It returns the new used,
-- as count_limit_status computes it, and writes it in already_count, the
-- count a check of another kind carries over, as a smooth check does. A
-- drained smooth row takes a positive delta too: its interval is known, so
-- the undrained events start from 0. Every other kind is adjusted as
-- 00001's function does (a window joined from a smooth key's included).
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION countlimit_adjust_count(unique_id text, use_type text, delta bigint)
RETURNS bigint LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
DECLARE
    id      text := unique_id;
    ut      text := use_type;
    rec     count_limit;
    counted bigint;
    t       numeric; -- a smooth row's interval, in µs
    ahead   numeric; -- its max(TAT, now()) - now(), in µs
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
        t := extract(epoch FROM rec.smooth_interval) * 1000000;
        IF t IS NULL OR t <= 0 OR rec.smooth_burst IS NULL OR rec.smooth_burst < 1 THEN
            RAISE EXCEPTION 'countlimit_adjust_count: (%, %) is a smooth limit with no interval or burst recorded (smooth_interval %, smooth_burst %)',
                ut, id, rec.smooth_interval, rec.smooth_burst
                USING ERRCODE = 'feature_not_supported',
                      HINT = 'The next smooth check of the id records them; countlimit_reset_id forgets the id.';
        END IF;
        ahead := greatest(extract(epoch FROM rec.end_time) - extract(epoch FROM now()), 0) * 1000000;
        ahead := least(greatest(ahead + delta * t, 0), rec.smooth_burst * t);
        counted := least(rec.smooth_burst, ceil(ahead / t))::bigint;
        UPDATE count_limit c SET
            already_count = counted,
            begin_time    = 'epoch',
            end_time      = now() + ahead::bigint * interval '1 microsecond',
            updated_at    = now()
        WHERE c.use_type = ut AND c.unique_id = id;
        RETURN counted;
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
    'countlimit, for DBAs: add delta (negative to lower) to the count of one id''s current window for one use type, never below 0; returns the new count, or NULL (and a notice) when there is no current window to change. Refuses sliding windows. On a smooth limit, moves its TAT by delta intervals (never before now, never past a full burst) and returns the new used. Safe beside live checks: the row is locked and the count changed in place. See docs/operations.md.';

-- +goose Down
-- Back to 00001's schema exactly: its countlimit_adjust_count, its
-- count_limit_status and their comments, countlimit_apply without smooth
-- checks, and count_limit without the two columns (DROP COLUMN, like ADD
-- COLUMN, changes the catalog only). The rows of smooth keys stay: to
-- 00001's statements each is a window from the epoch to its TAT that
-- holds the units undrained when it was last written, which a check that
-- counts there joins (and the TAT goes) and which the purge deletes once
-- end_time (the TAT) has passed. The binary that runs on
-- the database after the Down must be one that never sends smooth checks
-- (v0.1.0), as 00001's schema cannot decide them.
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
