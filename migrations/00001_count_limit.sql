-- +goose Up
-- +goose StatementBegin
CREATE TABLE count_limit (
    use_type      text        NOT NULL,
    unique_id     text        NOT NULL,
    already_count bigint      NOT NULL DEFAULT 0 CHECK (already_count >= 0),
    begin_time    timestamptz NOT NULL,
    end_time      timestamptz,
    limit_value   bigint      NOT NULL DEFAULT 0,
    denied_count  bigint      NOT NULL DEFAULT 0,
    blocked_until timestamptz,
    events        timestamptz[],
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (use_type, unique_id)
) WITH (fillfactor = 80);
-- +goose StatementEnd

COMMENT ON TABLE count_limit IS
    'countlimit counters: one row per (use_type, unique_id). Written only through countlimit_apply; safe to read, and to delete rows from (that resets them).';
COMMENT ON COLUMN count_limit.use_type IS 'What is limited, e.g. password.change (countlimit.UseType).';
COMMENT ON COLUMN count_limit.unique_id IS 'Who or what is limited: user id, phone, IP, token.';
COMMENT ON COLUMN count_limit.already_count IS 'Events counted in the window [begin_time, end_time). Counts nothing once end_time has passed. For sliding windows, cardinality(events).';
COMMENT ON COLUMN count_limit.begin_time IS 'When the current window began; for sliding windows, the oldest logged event.';
COMMENT ON COLUMN count_limit.end_time IS 'When the current window ends (exclusive); NULL for a lifetime limit. For sliding windows, the newest event plus the window length.';
COMMENT ON COLUMN count_limit.limit_value IS 'The limit applied by the last check (the rule travels with each call; this records it for audits).';
COMMENT ON COLUMN count_limit.denied_count IS 'Denied checks since the row was created (not reset when a window rolls over).';
COMMENT ON COLUMN count_limit.blocked_until IS 'Penalty box: every check is denied while this is in the future. NULL when never blocked.';
COMMENT ON COLUMN count_limit.events IS 'Sliding windows only: the times of the counted events, oldest first, microsecond precision. NULL for other windows.';
COMMENT ON COLUMN count_limit.created_at IS 'When the row was first written (database clock).';
COMMENT ON COLUMN count_limit.updated_at IS 'When the row was last written (database clock).';

-- Serves bounded expiry purges: rows whose window ended, oldest first.
-- Lifetime rows (end_time NULL) are never purged.
CREATE INDEX count_limit_end_time_idx ON count_limit (end_time) WHERE end_time IS NOT NULL;

-- +goose StatementBegin
CREATE VIEW count_limit_status AS
SELECT
    s.use_type,
    s.unique_id,
    s.window_kind::text AS window_kind,
    s.used::bigint AS used,
    s.limit_value,
    greatest(s.limit_value - s.used, 0)::bigint AS remaining,
    s.denied_count,
    s.begin_time AS window_begin,
    s.end_time AS window_end,
    (CASE WHEN s.used > 0 AND s.end_time IS NOT NULL THEN s.end_time - now() END)::interval AS resets_in,
    coalesce(s.blocked_until > now(), false)::boolean AS blocked,
    (CASE WHEN s.blocked_until > now() THEN s.blocked_until END)::timestamptz AS blocked_until,
    (CASE WHEN s.blocked_until > now() THEN s.blocked_until - now() END)::interval AS blocked_for,
    s.updated_at
FROM (
    SELECT
        c.*,
        CASE
            WHEN c.events IS NOT NULL THEN 'sliding'
            WHEN c.end_time IS NULL THEN 'lifetime'
            ELSE 'window'
        END AS window_kind,
        CASE
            -- The log is time-ordered and end_time is its newest event plus
            -- the window's length; epoch arithmetic keeps DST out of it.
            WHEN c.events IS NOT NULL THEN (
                SELECT count(*) FROM unnest(c.events) AS e
                WHERE extract(epoch FROM e) > extract(epoch FROM now())
                    - (extract(epoch FROM c.end_time) - extract(epoch FROM c.events[cardinality(c.events)])))
            WHEN c.begin_time <= now() AND (c.end_time IS NULL OR c.end_time > now()) THEN c.already_count
            ELSE 0
        END AS used
    FROM count_limit c
) s;
-- +goose StatementEnd

COMMENT ON VIEW count_limit_status IS
    'count_limit as of the database clock, for people: what each id has used of its limit now, what remains, whether it is blocked and for how long.';

-- countlimit_apply carries out one countlimit.Request (Allow, Peek or
-- Refund; Reset is a plain DELETE) as one statement. It takes one id and one
-- or more rules, locks their rows in use_type order (creating missing rows
-- first, so existing and new rows are locked in that one order and
-- concurrent multi-rule checks cannot deadlock), decides all-or-nothing, and
-- writes. A set-based upsert cannot do that for several rows, because
-- PostgreSQL updates a row at most once per statement and each row's
-- decision depends on the others.
--
-- p_op:      'allow', 'peek' or 'refund'
-- p_now:     the caller's clock; this function never reads the database clock to decide
-- p_lengths: window lengths in microseconds from p_begins; 0 = lifetime (end_time NULL)
-- p_spans:   sliding window lengths in microseconds; 0 = not sliding
-- p_blocks:  penalty lengths in microseconds; 0 = none
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
    p_blocks    bigint[]
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
    created boolean[] := array_fill(false, ARRAY[cnt]);
    rc      bigint;
    used    bigint[] := array_fill(NULL::bigint, ARRAY[cnt]);
    wbegin  timestamptz[] := array_fill(NULL::timestamptz, ARRAY[cnt]);
    wend    timestamptz[] := array_fill(NULL::timestamptz, ARRAY[cnt]);
    blocked timestamptz[] := array_fill(NULL::timestamptz, ARRAY[cnt]);
    fits    boolean[] := array_fill(NULL::boolean, ARRAY[cnt]);
    freeat  timestamptz[] := array_fill(NULL::timestamptz, ARRAY[cnt]);
    live    timestamptz[];
    span    interval;
    all_ok  boolean := true;
    k       int;
BEGIN
    IF p_op NOT IN ('allow', 'peek', 'refund') THEN
        RAISE EXCEPTION 'countlimit_apply: unknown op %', p_op USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Lock (or, for peek, read) every row in use_type order and see its window.
    FOR k IN SELECT i FROM generate_subscripts(p_use_types, 1) AS i ORDER BY p_use_types[i] COLLATE "C" LOOP
        IF p_op = 'peek' THEN
            SELECT * INTO rec FROM count_limit c WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id;
        ELSE
            SELECT * INTO rec FROM count_limit c WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id FOR UPDATE;
            IF NOT FOUND AND p_op = 'allow' THEN
                -- An empty window (begin = end) that only a counted event opens.
                INSERT INTO count_limit (use_type, unique_id, begin_time, end_time, limit_value)
                VALUES (p_use_types[k], p_unique_id, p_now, p_now, p_limits[k])
                ON CONFLICT DO NOTHING;
                GET DIAGNOSTICS rc = ROW_COUNT;
                created[k] := rc = 1;
                SELECT * INTO rec FROM count_limit c WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id FOR UPDATE;
                IF NOT FOUND THEN
                    -- Only under REPEATABLE READ or SERIALIZABLE: the row was
                    -- created after this transaction's snapshot.
                    RAISE EXCEPTION 'countlimit_apply: row (%, %) created concurrently', p_use_types[k], p_unique_id
                        USING ERRCODE = 'serialization_failure';
                END IF;
            END IF;
        END IF;
        found_[k] := FOUND;
        blocked[k] := CASE WHEN rec.blocked_until > p_now THEN rec.blocked_until END;
        IF p_spans[k] > 0 THEN
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
        -- just opened joins it instead of resetting it.
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
            IF all_ok THEN
                IF p_spans[k] > 0 THEN
                    span := p_spans[k] * us;
                    SELECT c.events INTO live FROM count_limit c WHERE c.use_type = p_use_types[k] AND c.unique_id = p_unique_id;
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
                UPDATE count_limit c SET
                    already_count = used[k],
                    begin_time = wbegin[k],
                    end_time = wend[k],
                    events = live,
                    limit_value = p_limits[k],
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

COMMENT ON FUNCTION countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[]) IS
    'countlimit: one atomic check of one id against one or more rules (allow, peek or refund). See migrations/00001_count_limit.sql.';

-- +goose Down
-- +goose StatementBegin
DROP FUNCTION countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[]);
DROP VIEW count_limit_status;
DROP TABLE count_limit;
-- +goose StatementEnd
