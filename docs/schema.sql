-- countlimit's PostgreSQL schema at its latest migration, for reading:
-- what the migrations in migrations/ make of an empty schema, as
-- pg_dump 15 --schema-only prints it from PostgreSQL 15, without the
-- schema's name, settings and goose's version table. Generated, never
-- edited: the migrations are the source, and a test fails when this
-- file differs from what they make. To write it again:
--
--   go test ./migrations -run TestSchemaFileIsTheMigrations -update

-- Name: count_limit; Type: TABLE

CREATE TABLE count_limit (
    use_type text NOT NULL,
    unique_id text NOT NULL,
    already_count bigint DEFAULT 0 NOT NULL,
    begin_time timestamp with time zone NOT NULL,
    end_time timestamp with time zone,
    limit_value bigint DEFAULT 0 NOT NULL,
    denied_count bigint DEFAULT 0 NOT NULL,
    blocked_until timestamp with time zone,
    events timestamp with time zone[],
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_until timestamp with time zone,
    window_kind text,
    smooth_interval interval,
    smooth_burst bigint,
    CONSTRAINT count_limit_already_count_check CHECK ((already_count >= 0))
)
WITH (fillfactor='80');

-- Name: TABLE count_limit; Type: COMMENT

COMMENT ON TABLE count_limit IS 'countlimit counters: one row per (use_type, unique_id). Written by countlimit''s statements and functions; safe to read, and to delete rows from (that resets them, leases included). Leases of concurrency limits are in count_limit_lease.';

-- Name: COLUMN count_limit.use_type; Type: COMMENT

COMMENT ON COLUMN count_limit.use_type IS 'What is limited, e.g. password.change (countlimit.UseType).';

-- Name: COLUMN count_limit.unique_id; Type: COMMENT

COMMENT ON COLUMN count_limit.unique_id IS 'Who or what is limited: user id, phone, IP, token.';

-- Name: COLUMN count_limit.already_count; Type: COMMENT

COMMENT ON COLUMN count_limit.already_count IS 'Events counted in the window [begin_time, end_time). Counts nothing once end_time has passed. For sliding windows, cardinality(events) as last written. For smooth limits (window_kind smooth), the events not yet drained when the row was last written, at most the burst. A check of another kind carries this count over while the window is current.';

-- Name: COLUMN count_limit.begin_time; Type: COMMENT

COMMENT ON COLUMN count_limit.begin_time IS 'When the current window began; for sliding windows, the oldest logged event. For smooth limits (window_kind smooth), and a window another kind joined there, the epoch: a smooth row''s window is [epoch, TAT).';

-- Name: COLUMN count_limit.end_time; Type: COMMENT

COMMENT ON COLUMN count_limit.end_time IS 'When the current window ends (exclusive); NULL for a lifetime limit. For sliding windows, the newest event plus the window length. For smooth limits (window_kind smooth), the TAT: when the key is drained.';

-- Name: COLUMN count_limit.limit_value; Type: COMMENT

COMMENT ON COLUMN count_limit.limit_value IS 'The limit applied by the last check (the rule travels with each call; this records it for audits).';

-- Name: COLUMN count_limit.denied_count; Type: COMMENT

COMMENT ON COLUMN count_limit.denied_count IS 'Denied checks since the row was created (not reset when a window rolls over).';

-- Name: COLUMN count_limit.blocked_until; Type: COMMENT

COMMENT ON COLUMN count_limit.blocked_until IS 'Penalty box: every check is denied while this is in the future. NULL when never blocked.';

-- Name: COLUMN count_limit.events; Type: COMMENT

COMMENT ON COLUMN count_limit.events IS 'Sliding windows only: the times of the counted events, oldest first, microsecond precision. NULL for other windows.';

-- Name: COLUMN count_limit.created_at; Type: COMMENT

COMMENT ON COLUMN count_limit.created_at IS 'When the row was first written (database clock).';

-- Name: COLUMN count_limit.updated_at; Type: COMMENT

COMMENT ON COLUMN count_limit.updated_at IS 'When the row was last written (database clock).';

-- Name: COLUMN count_limit.lease_until; Type: COMMENT

COMMENT ON COLUMN count_limit.lease_until IS 'Concurrency limits only: no lease of this key (count_limit_lease) expires after this. Raised by every Acquire that takes a slot and every Extend; set to the time of a denied Acquire when no lease was ever taken. Purges keep the row until then. NULL for keys never acquired.';

-- Name: COLUMN count_limit.window_kind; Type: COMMENT

COMMENT ON COLUMN count_limit.window_kind IS 'The window kind of the rule that last counted here, or created the row: rolling, fixed, calendar, sliding, lifetime or smooth; NULL for CheckLimit''s window of the caller''s own. A smooth row (window_kind smooth) keeps its TAT in end_time; otherwise for people, no check reads it.';

-- Name: COLUMN count_limit.smooth_interval; Type: COMMENT

COMMENT ON COLUMN count_limit.smooth_interval IS 'Smooth limits only (window_kind smooth): the rule''s emission interval, period / limit rounded up to the microsecond; one event drains in this long. Written by every smooth check that counts in the row or creates it; meaningful only while window_kind is smooth. For people and count_limit_status; no check reads it.';

-- Name: COLUMN count_limit.smooth_burst; Type: COMMENT

COMMENT ON COLUMN count_limit.smooth_burst IS 'Smooth limits only (window_kind smooth): the rule''s burst, how many events fit at once when the key is drained. Written by every smooth check that counts in the row or creates it; meaningful only while window_kind is smooth. For people and count_limit_status; no check reads it.';

-- Name: count_limit_lease; Type: TABLE

CREATE TABLE count_limit_lease (
    use_type text NOT NULL,
    unique_id text NOT NULL,
    lease_token text NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    taken_at timestamp with time zone NOT NULL
);

-- Name: TABLE count_limit_lease; Type: COMMENT

COMMENT ON TABLE count_limit_lease IS 'countlimit leases: one row per slot held of a concurrency limit (countlimit.Concurrent) by (use_type, unique_id); a slot is held while expires_at is in the future. Written only by countlimit''s statements, under the lock of the key''s count_limit row; safe to read. Expired rows are purged with their key, or by countlimit purge.';

-- Name: COLUMN count_limit_lease.use_type; Type: COMMENT

COMMENT ON COLUMN count_limit_lease.use_type IS 'What is limited, e.g. report.export (countlimit.UseType).';

-- Name: COLUMN count_limit_lease.unique_id; Type: COMMENT

COMMENT ON COLUMN count_limit_lease.unique_id IS 'Who or what is limited: user id, API key, tenant.';

-- Name: COLUMN count_limit_lease.lease_token; Type: COMMENT

COMMENT ON COLUMN count_limit_lease.lease_token IS 'The lease''s random name (22 base64url characters). Whoever knows it can release or extend the slot: treat it as a secret.';

-- Name: COLUMN count_limit_lease.expires_at; Type: COMMENT

COMMENT ON COLUMN count_limit_lease.expires_at IS 'When the slot frees itself unless extended: taken_at (or the last Extend) plus the rule''s ttl, on the caller''s clock.';

-- Name: COLUMN count_limit_lease.taken_at; Type: COMMENT

COMMENT ON COLUMN count_limit_lease.taken_at IS 'When the slot was taken (Acquire), on the caller''s clock; Extend does not change it.';

-- Name: count_limit_lease count_limit_lease_pkey; Type: CONSTRAINT

ALTER TABLE ONLY count_limit_lease
    ADD CONSTRAINT count_limit_lease_pkey PRIMARY KEY (use_type, unique_id, lease_token);

-- Name: count_limit count_limit_pkey; Type: CONSTRAINT

ALTER TABLE ONLY count_limit
    ADD CONSTRAINT count_limit_pkey PRIMARY KEY (unique_id, use_type);

-- Name: count_limit_blocked_until_idx; Type: INDEX

CREATE INDEX count_limit_blocked_until_idx ON count_limit USING btree (blocked_until) WHERE (blocked_until IS NOT NULL);

-- Name: count_limit_lease_expires_at_idx; Type: INDEX

CREATE INDEX count_limit_lease_expires_at_idx ON count_limit_lease USING btree (expires_at);

-- Name: count_limit_lease count_limit_lease_use_type_unique_id_fkey; Type: FK CONSTRAINT

ALTER TABLE ONLY count_limit_lease
    ADD CONSTRAINT count_limit_lease_use_type_unique_id_fkey FOREIGN KEY (use_type, unique_id) REFERENCES count_limit(use_type, unique_id) ON DELETE CASCADE;

-- Name: count_limit_status; Type: VIEW

CREATE VIEW count_limit_status AS
 SELECT s.use_type,
    s.unique_id,
    s.window_kind,
    s.used,
    s.limit_value,
    GREATEST((s.cap - s.used), (0)::bigint) AS remaining,
    s.denied_count,
    s.window_begin,
    s.window_end,
        CASE
            WHEN ((s.used > 0) AND (s.window_end IS NOT NULL)) THEN (s.window_end - now())
            ELSE NULL::interval
        END AS resets_in,
    ((s.blocked_until IS NOT NULL) AND (s.blocked_until > now())) AS blocked,
        CASE
            WHEN (s.blocked_until > now()) THEN s.blocked_until
            ELSE NULL::timestamp with time zone
        END AS blocked_until,
        CASE
            WHEN (s.blocked_until > now()) THEN (s.blocked_until - now())
            ELSE NULL::interval
        END AS blocked_for,
    s.updated_at
   FROM ( SELECT c.use_type,
            c.unique_id,
            c.limit_value,
            c.denied_count,
            c.blocked_until,
            c.updated_at,
                CASE
                    WHEN k.concurrent THEN 'concurrent'::text
                    WHEN m.smooth THEN 'smooth'::text
                    WHEN (c.events IS NOT NULL) THEN 'sliding'::text
                    WHEN (c.end_time IS NULL) THEN 'lifetime'::text
                    ELSE COALESCE(c.window_kind, 'window'::text)
                END AS window_kind,
                CASE
                    WHEN k.concurrent THEN h.held
                    ELSE n.counted
                END AS used,
                CASE
                    WHEN ((NOT k.concurrent) AND m.smooth AND (c.limit_value > 0)) THEN COALESCE(c.smooth_burst, c.limit_value)
                    WHEN ((NOT k.concurrent) AND m.smooth) THEN (0)::bigint
                    ELSE c.limit_value
                END AS cap,
                CASE
                    WHEN k.concurrent THEN h.first_taken
                    WHEN m.smooth THEN NULL::timestamp with time zone
                    WHEN ((c.events IS NOT NULL) AND (n.counted > 0)) THEN c.events[((cardinality(c.events) - (n.counted)::integer) + 1)]
                    ELSE NULLIF(c.begin_time, '1970-01-01 00:00:00+00'::timestamp with time zone)
                END AS window_begin,
                CASE
                    WHEN k.concurrent THEN h.last_expiry
                    WHEN m.smooth THEN
                    CASE
                        WHEN (c.end_time > now()) THEN c.end_time
                        ELSE NULL::timestamp with time zone
                    END
                    ELSE c.end_time
                END AS window_end
           FROM (((((count_limit c
             CROSS JOIN LATERAL ( SELECT count(*) AS held,
                    min(l.taken_at) AS first_taken,
                    max(l.expires_at) AS last_expiry
                   FROM count_limit_lease l
                  WHERE ((c.lease_until > now()) AND (l.use_type = c.use_type) AND (l.unique_id = c.unique_id) AND ((l.expires_at > now()) IS TRUE))) h)
             CROSS JOIN LATERAL ( SELECT COALESCE((c.window_kind = 'smooth'::text), false) AS smooth) m)
             CROSS JOIN LATERAL ( SELECT
                        CASE
                            WHEN m.smooth THEN (((EXTRACT(epoch FROM c.end_time) - EXTRACT(epoch FROM now())) * (1000000)::numeric))::bigint
                            ELSE NULL::bigint
                        END AS ahead,
                        CASE
                            WHEN m.smooth THEN ((EXTRACT(epoch FROM c.smooth_interval) * (1000000)::numeric))::bigint
                            ELSE NULL::bigint
                        END AS t) u)
             CROSS JOIN LATERAL ( SELECT
                        CASE
                            WHEN m.smooth THEN
                            CASE
                                WHEN (u.ahead <= 0) THEN (0)::bigint
                                WHEN ((u.t IS NULL) OR (u.t <= 0)) THEN NULL::bigint
                                ELSE LEAST(COALESCE(c.smooth_burst, c.limit_value), (((u.ahead + u.t) - 1) / u.t))
                            END
                            WHEN (c.events IS NOT NULL) THEN ( SELECT count(*) AS count
                               FROM unnest(c.events) e(e)
                              WHERE (EXTRACT(epoch FROM e.e) > (EXTRACT(epoch FROM now()) - (EXTRACT(epoch FROM c.end_time) - EXTRACT(epoch FROM c.events[cardinality(c.events)])))))
                            WHEN ((c.begin_time < COALESCE(c.end_time, 'infinity'::timestamp with time zone)) AND COALESCE((c.end_time > now()), true)) THEN c.already_count
                            ELSE (0)::bigint
                        END AS counted) n)
             CROSS JOIN LATERAL ( SELECT ((c.lease_until IS NOT NULL) AND ((h.held > 0) OR (n.counted = 0))) AS concurrent) k)) s;

-- Name: VIEW count_limit_status; Type: COMMENT

COMMENT ON VIEW count_limit_status IS 'count_limit as of the database clock, for people: what each id has used of its limit now (for concurrency limits, the slots it holds; for smooth limits, the events not yet drained), what remains, whether it is blocked and for how long.';

-- Name: COLUMN count_limit_status.use_type; Type: COMMENT

COMMENT ON COLUMN count_limit_status.use_type IS 'What is limited, e.g. password.change.';

-- Name: COLUMN count_limit_status.unique_id; Type: COMMENT

COMMENT ON COLUMN count_limit_status.unique_id IS 'Who or what is limited: user id, phone, IP, token.';

-- Name: COLUMN count_limit_status.window_kind; Type: COMMENT

COMMENT ON COLUMN count_limit_status.window_kind IS 'rolling, fixed or calendar (the rule that last counted in the window; window for CheckLimit''s window of the caller''s own), sliding (an exact log of events), lifetime (never resets), concurrent (slots held at once, as leases in count_limit_lease) or smooth (a rate with bursts, GCRA: one instant per key, the TAT, in count_limit.end_time).';

-- Name: COLUMN count_limit_status.used; Type: COMMENT

COMMENT ON COLUMN count_limit_status.used IS 'Events counted in the current window as of now; 0 once the window has ended. For concurrent limits, the leases live now (slots held). For smooth limits, the events not yet drained at now, ceil((TAT - now) / smooth_interval), at most smooth_burst; 0 once drained.';

-- Name: COLUMN count_limit_status.limit_value; Type: COMMENT

COMMENT ON COLUMN count_limit_status.limit_value IS 'The limit the last check applied (each check carries its rule; this records it).';

-- Name: COLUMN count_limit_status.remaining; Type: COMMENT

COMMENT ON COLUMN count_limit_status.remaining IS 'limit_value - used, never below 0: how many more events (for concurrent limits, slots) the last applied limit allows now. For smooth limits, smooth_burst - used: how many fit at once now (one more drains every smooth_interval); 0 while limit_value is 0.';

-- Name: COLUMN count_limit_status.denied_count; Type: COMMENT

COMMENT ON COLUMN count_limit_status.denied_count IS 'Denied checks since the row was created (not reset when a window rolls over).';

-- Name: COLUMN count_limit_status.window_begin; Type: COMMENT

COMMENT ON COLUMN count_limit_status.window_begin IS 'When the current window began; for sliding windows, the oldest logged event still in the window (while none is, the oldest logged); for concurrent limits, when the oldest live lease was taken (NULL when none is held); NULL for smooth limits, and for a window another kind joined from a smooth limit''s (it began at the epoch).';

-- Name: COLUMN count_limit_status.window_end; Type: COMMENT

COMMENT ON COLUMN count_limit_status.window_end IS 'When the current window ends (exclusive); NULL for lifetime limits. For sliding windows, the newest event plus the window length; for concurrent limits, when the last live lease expires unless extended or released (NULL when none is held); for smooth limits, when the id is fully drained (its TAT), NULL once it is.';

-- Name: COLUMN count_limit_status.resets_in; Type: COMMENT

COMMENT ON COLUMN count_limit_status.resets_in IS 'How long until the window ends and its count goes, while something is counted; NULL otherwise and for lifetime limits. For concurrent limits, until the last live lease expires; for smooth limits, until the id is fully drained.';

-- Name: COLUMN count_limit_status.blocked; Type: COMMENT

COMMENT ON COLUMN count_limit_status.blocked IS 'True while the id sits in the penalty box: every check is denied until blocked_until.';

-- Name: COLUMN count_limit_status.blocked_until; Type: COMMENT

COMMENT ON COLUMN count_limit_status.blocked_until IS 'When the penalty ends, while it lasts; NULL when not blocked.';

-- Name: COLUMN count_limit_status.blocked_for; Type: COMMENT

COMMENT ON COLUMN count_limit_status.blocked_for IS 'How long the penalty still lasts; NULL when not blocked.';

-- Name: COLUMN count_limit_status.updated_at; Type: COMMENT

COMMENT ON COLUMN count_limit_status.updated_at IS 'When the row was last written (database clock).';

-- Name: countlimit_acquire(text, text, timestamp with time zone, text, bigint, timestamp with time zone, timestamp with time zone, boolean); Type: FUNCTION

CREATE FUNCTION countlimit_acquire(p_use_type text, p_unique_id text, p_now timestamp with time zone, p_lease_token text, p_limit bigint, p_expires_at timestamp with time zone, p_penalty_end timestamp with time zone, p_lazy_tally boolean) RETURNS TABLE(o_allowed boolean, o_used bigint, o_first_expiry timestamp with time zone, o_last_expiry timestamp with time zone, o_blocked_until timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    locked  boolean := false;
    bu      timestamptz;
    rc      bigint;
    held    bigint;
    blocked timestamptz;
    fits    boolean;
BEGIN
    -- Phase 1 locks the row if it exists; phase 2 inserts it if not, which
    -- waits only for a concurrent insert of the same key. A row created (or
    -- deleted) concurrently in between sends the call back to phase 1.
    FOR attempt IN 1 .. 8 LOOP
        SELECT c.blocked_until INTO bu FROM count_limit c
        WHERE c.use_type = p_use_type AND c.unique_id = p_unique_id
        FOR NO KEY UPDATE;
        IF FOUND THEN
            locked := true;
            EXIT;
        END IF;
        INSERT INTO count_limit (use_type, unique_id, begin_time, end_time, limit_value)
        VALUES (p_use_type, p_unique_id, p_now, p_now, p_limit)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS rc = ROW_COUNT;
        IF rc = 1 THEN
            locked := true;
            bu := NULL;
            EXIT;
        END IF;
    END LOOP;
    IF NOT locked THEN
        -- Under REPEATABLE READ or SERIALIZABLE the row another
        -- transaction created is not in this one's snapshot.
        RAISE EXCEPTION 'countlimit_acquire: row (%, %) created concurrently', p_use_type, p_unique_id
            USING ERRCODE = 'serialization_failure';
    END IF;

    -- Expired leases go, but for those a Release or Extend holds (which
    -- Acquire does not wait for): they are not counted either way. The
    -- statements read the key's leases by the primary key alone (see
    -- "Plans" above for why the expiry is written IS TRUE).
    DELETE FROM count_limit_lease l
    WHERE l.use_type = p_use_type AND l.unique_id = p_unique_id
      AND l.lease_token = ANY (ARRAY(
        SELECT x.lease_token FROM count_limit_lease x
        WHERE x.use_type = p_use_type AND x.unique_id = p_unique_id AND (x.expires_at <= p_now) IS TRUE
        FOR UPDATE SKIP LOCKED));
    SELECT count(*) INTO held FROM count_limit_lease l
    WHERE l.use_type = p_use_type AND l.unique_id = p_unique_id AND (l.expires_at > p_now) IS TRUE;

    blocked := CASE WHEN bu > p_now THEN bu END;
    fits := blocked IS NULL AND held < p_limit;
    IF fits THEN
        INSERT INTO count_limit_lease (use_type, unique_id, lease_token, expires_at, taken_at)
        VALUES (p_use_type, p_unique_id, p_lease_token, p_expires_at, p_now);
        UPDATE count_limit c SET
            limit_value = p_limit,
            lease_until = greatest(c.lease_until, p_expires_at),
            updated_at  = now()
        WHERE c.use_type = p_use_type AND c.unique_id = p_unique_id;
    ELSE
        IF blocked IS NULL AND p_penalty_end IS NOT NULL THEN
            blocked := p_penalty_end;
        ELSIF p_lazy_tally THEN
            -- Every write to a busy key holds its row lock until its commit
            -- is flushed, so callers that keep being denied (the common
            -- case of a full concurrency limit) would queue one flush each
            -- ahead of every Acquire and Extend. A denial that sets no
            -- penalty writes an audit tally only: its commit does not wait
            -- for the flush, and a crash may lose the last few tallies,
            -- never a lease or a penalty.
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        UPDATE count_limit c SET
            denied_count  = c.denied_count + 1,
            blocked_until = coalesce(blocked, c.blocked_until),
            limit_value   = p_limit,
            lease_until   = coalesce(c.lease_until, p_now),
            updated_at    = now()
        WHERE c.use_type = p_use_type AND c.unique_id = p_unique_id;
    END IF;

    RETURN QUERY
    SELECT fits, count(*), min(l.expires_at), max(l.expires_at), blocked
    FROM count_limit_lease l
    WHERE l.use_type = p_use_type AND l.unique_id = p_unique_id AND (l.expires_at > p_now) IS TRUE;
END
$$;

-- Name: FUNCTION countlimit_acquire(p_use_type text, p_unique_id text, p_now timestamp with time zone, p_lease_token text, p_limit bigint, p_expires_at timestamp with time zone, p_penalty_end timestamp with time zone, p_lazy_tally boolean); Type: COMMENT

COMMENT ON FUNCTION countlimit_acquire(p_use_type text, p_unique_id text, p_now timestamp with time zone, p_lease_token text, p_limit bigint, p_expires_at timestamp with time zone, p_penalty_end timestamp with time zone, p_lazy_tally boolean) IS 'countlimit: one atomic Acquire of a concurrency limit: takes a lease (count_limit_lease) when fewer than p_limit are live, else counts the denial. Locks the key''s count_limit row first.';

-- Name: countlimit_adjust_count(text, text, bigint); Type: FUNCTION

CREATE FUNCTION countlimit_adjust_count(unique_id text, use_type text, delta bigint) RETURNS bigint
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
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
$$;

-- Name: FUNCTION countlimit_adjust_count(unique_id text, use_type text, delta bigint); Type: COMMENT

COMMENT ON FUNCTION countlimit_adjust_count(unique_id text, use_type text, delta bigint) IS 'countlimit, for DBAs: add delta (negative to lower) to the count of one id''s current window for one use type, never below 0; returns the new count, or NULL (and a notice) when there is no current window to change. Refuses sliding windows. On a smooth limit, moves its TAT by delta intervals (never before now, never past a full burst; a drained limit lowered is left as it is) and returns the new used. Safe beside live checks: the row is locked and the count changed in place. See docs/operations.md.';

-- Name: countlimit_allow_batch(text[], text[], integer[], integer[], timestamp with time zone[], bigint[], bigint[], timestamp with time zone[], timestamp with time zone[], timestamp with time zone[], text[]); Type: FUNCTION

CREATE FUNCTION countlimit_allow_batch(p_use_types text[], p_unique_ids text[], p_key_of integer[], p_seq integer[], p_nows timestamp with time zone[], p_ns bigint[], p_limits bigint[], p_begins timestamp with time zone[], p_window_ends timestamp with time zone[], p_penalty_ends timestamp with time zone[], p_kinds text[]) RETURNS TABLE(o_key_of integer, o_seq integer, o_busy boolean, o_allowed boolean, o_used bigint, o_window_begin timestamp with time zone, o_window_end timestamp with time zone, o_blocked_until timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    v_held int[] := '{}'; -- the keys another transaction is inserting, left out
BEGIN
    PERFORM countlimit_lock_briefly();
    FOR v_try IN 1 .. 2 LOOP
        BEGIN
            RETURN QUERY
                WITH RECURSIVE keys AS (
                    SELECT k.use_type, k.unique_id, k.kind, k.ord::int AS k
                    FROM ROWS FROM (unnest(CASE WHEN random() >= 0 THEN p_use_types END), unnest(p_unique_ids), unnest(p_kinds))
                        WITH ORDINALITY AS k(use_type, unique_id, kind, ord)
                ), calls AS MATERIALIZED (
                    SELECT *
                    FROM ROWS FROM (unnest(CASE WHEN random() >= 0 THEN p_key_of END), unnest(p_seq), unnest(p_nows),
                        unnest(p_ns), unnest(p_limits), unnest(p_begins),
                        unnest(p_window_ends), unnest(p_penalty_ends))
                        AS c(k, seq, now, n, lim, b, e, pe)
                ), locked AS MATERIALIZED (
                    -- Phase 1, skipping the rows another transaction holds:
                    -- one probe of the key per key, in key order (see "Plans"
                    -- above).
                    SELECT k.k, c.already_count, c.begin_time, c.end_time, c.blocked_until
                    FROM keys k
                    CROSS JOIN LATERAL (
                        SELECT r.already_count, r.begin_time, r.end_time, r.blocked_until
                        FROM count_limit r
                        WHERE r.use_type = k.use_type AND r.unique_id = k.unique_id
                        LIMIT 1
                        FOR NO KEY UPDATE SKIP LOCKED
                    ) c
                    ORDER BY k.k
                ), busy AS MATERIALIZED (
                    -- Rows the statement's snapshot shows that phase 1 did not lock.
                    SELECT k.k
                    FROM keys k
                    CROSS JOIN LATERAL (
                        SELECT FROM count_limit r
                        WHERE r.use_type = k.use_type AND r.unique_id = k.unique_id
                        LIMIT 1
                    ) c
                    WHERE NOT EXISTS (SELECT FROM locked l WHERE l.k = k.k)
                ), fold (k, seq, existed, ex, cnt, wb, we, bu, den, counted, lim, allowed, used, ob, oe, obu) AS (
                    -- Step 0 is each key's state as locked (or absent); step i applies
                    -- call i to the state after step i-1.
                    SELECT k.k, 0, l.k IS NOT NULL, l.k IS NOT NULL, coalesce(l.already_count, 0),
                        l.begin_time, l.end_time, l.blocked_until, 0::bigint, false, 0::bigint,
                        false, 0::bigint, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz
                    FROM keys k
                    LEFT JOIN locked l ON l.k = k.k
                    WHERE NOT EXISTS (SELECT FROM busy y WHERE y.k = k.k) AND k.k <> ALL (v_held)
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
                    INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value, denied_count, blocked_until, window_kind)
                    SELECT k.use_type, k.unique_id, f.cnt, f.wb, f.we, f.lim, f.den, f.bu, k.kind
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
                        window_kind   = CASE WHEN f.counted THEN k.kind ELSE c.window_kind END,
                        updated_at    = now()
                    FROM final f
                    JOIN keys k ON k.k = f.k
                    WHERE f.existed AND c.use_type = k.use_type AND c.unique_id = k.unique_id
                      AND c.unique_id = ANY (p_unique_ids)
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
                WHERE EXISTS (SELECT FROM busy y WHERE y.k = c.k) OR c.k = ANY (v_held)
                ORDER BY 1, 2;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            IF v_try = 2 THEN
                RAISE;
            END IF;
            v_held := countlimit_claim_keys(p_use_types, p_unique_ids,
                ARRAY(SELECT p_nows[i] FROM generate_subscripts(p_key_of, 1) AS i WHERE p_seq[i] = 1 ORDER BY p_key_of[i]),
                p_kinds);
        END;
    END LOOP;
END
$$;

-- Name: countlimit_allow_batch_pooled(text[], text[], integer[], integer[], timestamp with time zone[], bigint[], bigint[], timestamp with time zone[], timestamp with time zone[], timestamp with time zone[], text[]); Type: FUNCTION

CREATE FUNCTION countlimit_allow_batch_pooled(p_use_types text[], p_unique_ids text[], p_key_of integer[], p_seq integer[], p_nows timestamp with time zone[], p_ns bigint[], p_limits bigint[], p_begins timestamp with time zone[], p_window_ends timestamp with time zone[], p_penalty_ends timestamp with time zone[], p_kinds text[]) RETURNS TABLE(o_key_of integer, o_seq integer, o_busy boolean, o_allowed boolean, o_used bigint, o_window_begin timestamp with time zone, o_window_end timestamp with time zone, o_blocked_until timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
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
$$;

-- Name: countlimit_allow_distinct(text[], text[], timestamp with time zone[], bigint[], bigint[], timestamp with time zone[], timestamp with time zone[], timestamp with time zone[], text[]); Type: FUNCTION

CREATE FUNCTION countlimit_allow_distinct(p_use_types text[], p_unique_ids text[], p_nows timestamp with time zone[], p_ns bigint[], p_limits bigint[], p_begins timestamp with time zone[], p_window_ends timestamp with time zone[], p_penalty_ends timestamp with time zone[], p_kinds text[]) RETURNS TABLE(o_key_of integer, o_busy boolean, o_allowed boolean, o_used bigint, o_window_begin timestamp with time zone, o_window_end timestamp with time zone, o_blocked_until timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    v_held int[] := '{}'; -- the keys another transaction is inserting, left out
BEGIN
    PERFORM countlimit_lock_briefly();
    FOR v_try IN 1 .. 2 LOOP
        BEGIN
            RETURN QUERY
                WITH calls AS MATERIALIZED (
                    SELECT c.ord::int AS k, c.use_type, c.unique_id, c.now, c.n, c.lim, c.b, c.e, c.pe, c.kind
                    FROM ROWS FROM (unnest(CASE WHEN random() >= 0 THEN p_use_types END), unnest(p_unique_ids),
                        unnest(p_nows), unnest(p_ns), unnest(p_limits),
                        unnest(p_begins), unnest(p_window_ends), unnest(p_penalty_ends), unnest(p_kinds))
                        WITH ORDINALITY AS c(use_type, unique_id, now, n, lim, b, e, pe, kind, ord)
                ), locked AS MATERIALIZED (
                    -- Phase 1, skipping the rows another transaction holds:
                    -- one probe of the key per call, in key order (see
                    -- "Plans" above).
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
                ), busy AS MATERIALIZED (
                    -- Rows the statement's snapshot shows that phase 1 did not lock.
                    SELECT c.k
                    FROM calls c
                    CROSS JOIN LATERAL (
                        SELECT FROM count_limit x
                        WHERE x.use_type = c.use_type AND x.unique_id = c.unique_id
                        LIMIT 1
                    ) r
                    WHERE NOT EXISTS (SELECT FROM locked l WHERE l.k = c.k)
                ), decided AS MATERIALIZED (
                    -- Each call applied to its row as locked (or absent):
                    -- countlimit_allow_batch's fold step 1, from its step 0.
                    SELECT c.k, c.use_type, c.unique_id, c.lim, c.kind, l.k IS NOT NULL AS existed,
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
                    WHERE NOT EXISTS (SELECT FROM busy y WHERE y.k = c.k) AND c.k <> ALL (v_held)
                ), inserted AS (
                    -- Phase 2: the count(*) makes every lock of phase 1 be taken first.
                    INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value, denied_count, blocked_until, window_kind)
                    SELECT d.use_type, d.unique_id, d.cnt, d.wb, d.we, d.lim, CASE WHEN d.allowed THEN 0 ELSE 1 END, d.bu, d.kind
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
                        window_kind   = CASE WHEN d.allowed THEN d.kind ELSE r.window_kind END,
                        updated_at    = now()
                    FROM decided d
                    WHERE d.existed AND r.use_type = d.use_type AND r.unique_id = d.unique_id
                      AND r.unique_id = ANY (p_unique_ids)
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
                FROM busy y
                UNION ALL
                SELECT h, true, false, 0, NULL, NULL, NULL
                FROM unnest(v_held) AS h
                ORDER BY 1;
            RETURN;
        EXCEPTION WHEN lock_not_available THEN
            IF v_try = 2 THEN
                RAISE;
            END IF;
            v_held := countlimit_claim_keys(p_use_types, p_unique_ids, p_nows, p_kinds);
        END;
    END LOOP;
END
$$;

-- Name: countlimit_allow_distinct_pooled(text[], text[], timestamp with time zone[], bigint[], bigint[], timestamp with time zone[], timestamp with time zone[], timestamp with time zone[], text[]); Type: FUNCTION

CREATE FUNCTION countlimit_allow_distinct_pooled(p_use_types text[], p_unique_ids text[], p_nows timestamp with time zone[], p_ns bigint[], p_limits bigint[], p_begins timestamp with time zone[], p_window_ends timestamp with time zone[], p_penalty_ends timestamp with time zone[], p_kinds text[]) RETURNS TABLE(o_key_of integer, o_busy boolean, o_allowed boolean, o_used bigint, o_window_begin timestamp with time zone, o_window_end timestamp with time zone, o_blocked_until timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET enable_hashjoin TO 'off'
    SET enable_mergejoin TO 'off'
    AS $$
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
$$;

-- Name: countlimit_allow_one(text, text, timestamp with time zone, bigint, bigint, timestamp with time zone, timestamp with time zone, timestamp with time zone, boolean, text); Type: FUNCTION

CREATE FUNCTION countlimit_allow_one(p_use_type text, p_unique_id text, p_now timestamp with time zone, p_n bigint, p_limit_value bigint, p_begin_time timestamp with time zone, p_window_end timestamp with time zone, p_penalty_end timestamp with time zone, p_skip_locked boolean, p_window_kind text) RETURNS TABLE(o_busy boolean, o_allowed boolean, o_used bigint, o_window_begin timestamp with time zone, o_window_end timestamp with time zone, o_blocked_until timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    IF p_skip_locked THEN
        -- Nor waits long for another transaction's insert of a new id, not
        -- yet committed (the id's first check inside a caller's
        -- transaction): the statement fails with lock_not_available,
        -- nothing written (countlimit_lock_briefly), and pgstore sends the
        -- call again later, as it does a busy one.
        PERFORM countlimit_lock_briefly();
        RETURN QUERY
        WITH l AS MATERIALIZED (
            -- The row, locked unless another transaction holds it.
            SELECT FROM count_limit c
            WHERE c.use_type = p_use_type AND c.unique_id = p_unique_id
            FOR NO KEY UPDATE SKIP LOCKED
        ), p AS MATERIALIZED (
            SELECT EXISTS (SELECT FROM l) AS mine,
                EXISTS (SELECT FROM count_limit c WHERE c.use_type = p_use_type AND c.unique_id = p_unique_id) AS present
        ), a AS (
            UPDATE count_limit c SET
                already_count = CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > p_now, true)
                    THEN c.already_count ELSE 0 END + p_n,
                begin_time    = CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > p_now, true)
                    THEN c.begin_time ELSE p_begin_time END,
                end_time      = CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > p_now, true)
                    THEN c.end_time ELSE p_window_end END,
                limit_value   = p_limit_value,
                events        = NULL,
                window_kind   = p_window_kind,
                updated_at    = now()
            WHERE c.use_type = p_use_type AND c.unique_id = p_unique_id AND (SELECT mine FROM p)
              AND NOT coalesce(c.blocked_until > p_now, false)
              AND p_n <= p_limit_value - CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > p_now, true)
                    THEN c.already_count ELSE 0 END
            RETURNING true AS allowed, c.already_count, c.begin_time, c.end_time, c.blocked_until
        ), i AS (
            INSERT INTO count_limit AS c (use_type, unique_id, already_count, begin_time, end_time, limit_value, denied_count, blocked_until, window_kind)
            SELECT p_use_type, p_unique_id,
                CASE WHEN f.fits THEN p_n ELSE 0 END,
                CASE WHEN f.fits THEN p_begin_time ELSE p_now END,
                CASE WHEN f.fits THEN p_window_end ELSE p_now END,
                p_limit_value,
                CASE WHEN f.fits THEN 0 ELSE 1 END,
                CASE WHEN f.fits THEN NULL ELSE p_penalty_end END,
                p_window_kind
            FROM (SELECT p_n <= p_limit_value AS fits) f
            WHERE NOT EXISTS (SELECT FROM a) AND (SELECT mine OR NOT present FROM p)
            ON CONFLICT (use_type, unique_id) DO UPDATE SET
                limit_value   = excluded.limit_value,
                denied_count  = c.denied_count + 1,
                blocked_until = CASE WHEN coalesce(c.blocked_until > p_now, false) OR p_penalty_end IS NULL
                    THEN c.blocked_until ELSE p_penalty_end END,
                updated_at    = now()
            WHERE coalesce(c.blocked_until > p_now, false)
               OR p_n > excluded.limit_value - CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > p_now, true)
                    THEN c.already_count ELSE 0 END
            RETURNING c.denied_count = 0 AS allowed, c.already_count, c.begin_time, c.end_time, c.blocked_until
        )
        SELECT false, a.allowed::boolean, a.already_count::bigint, a.begin_time::timestamptz, a.end_time::timestamptz,
            (CASE WHEN a.blocked_until > p_now THEN a.blocked_until END)::timestamptz
        FROM a
        UNION ALL
        -- A denial leaves the window as it was: the state is that window
        -- when it is current, else the fresh one an event would open.
        SELECT false, i.allowed,
            CASE WHEN x.shown THEN i.already_count ELSE 0 END,
            CASE WHEN x.shown THEN i.begin_time ELSE p_begin_time END,
            CASE WHEN x.shown THEN i.end_time ELSE p_window_end END,
            CASE WHEN i.blocked_until > p_now THEN i.blocked_until END
        FROM i
        CROSS JOIN LATERAL (SELECT i.allowed OR i.begin_time < coalesce(i.end_time, 'infinity')
            AND coalesce(i.end_time > p_now, true) AS shown) x
        UNION ALL
        SELECT true, false, 0, NULL, NULL, NULL
        FROM p
        WHERE p.present AND NOT p.mine;
    ELSE
        RETURN QUERY
        WITH a AS (
            UPDATE count_limit c SET
                already_count = CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > p_now, true)
                    THEN c.already_count ELSE 0 END + p_n,
                begin_time    = CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > p_now, true)
                    THEN c.begin_time ELSE p_begin_time END,
                end_time      = CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > p_now, true)
                    THEN c.end_time ELSE p_window_end END,
                limit_value   = p_limit_value,
                events        = NULL,
                window_kind   = p_window_kind,
                updated_at    = now()
            WHERE c.use_type = p_use_type AND c.unique_id = p_unique_id
              AND NOT coalesce(c.blocked_until > p_now, false)
              AND p_n <= p_limit_value - CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > p_now, true)
                    THEN c.already_count ELSE 0 END
            RETURNING true AS allowed, c.already_count, c.begin_time, c.end_time, c.blocked_until
        ), i AS (
            INSERT INTO count_limit AS c (use_type, unique_id, already_count, begin_time, end_time, limit_value, denied_count, blocked_until, window_kind)
            SELECT p_use_type, p_unique_id,
                CASE WHEN f.fits THEN p_n ELSE 0 END,
                CASE WHEN f.fits THEN p_begin_time ELSE p_now END,
                CASE WHEN f.fits THEN p_window_end ELSE p_now END,
                p_limit_value,
                CASE WHEN f.fits THEN 0 ELSE 1 END,
                CASE WHEN f.fits THEN NULL ELSE p_penalty_end END,
                p_window_kind
            FROM (SELECT p_n <= p_limit_value AS fits) f
            WHERE NOT EXISTS (SELECT FROM a)
            ON CONFLICT (use_type, unique_id) DO UPDATE SET
                limit_value   = excluded.limit_value,
                denied_count  = c.denied_count + 1,
                blocked_until = CASE WHEN coalesce(c.blocked_until > p_now, false) OR p_penalty_end IS NULL
                    THEN c.blocked_until ELSE p_penalty_end END,
                updated_at    = now()
            WHERE coalesce(c.blocked_until > p_now, false)
               OR p_n > excluded.limit_value - CASE WHEN c.begin_time < coalesce(c.end_time, 'infinity') AND coalesce(c.end_time > p_now, true)
                    THEN c.already_count ELSE 0 END
            RETURNING c.denied_count = 0 AS allowed, c.already_count, c.begin_time, c.end_time, c.blocked_until
        )
        SELECT false, a.allowed::boolean, a.already_count::bigint, a.begin_time::timestamptz, a.end_time::timestamptz,
            (CASE WHEN a.blocked_until > p_now THEN a.blocked_until END)::timestamptz
        FROM a
        UNION ALL
        -- A denial leaves the window as it was: the state is that window
        -- when it is current, else the fresh one an event would open.
        SELECT false, i.allowed,
            CASE WHEN x.shown THEN i.already_count ELSE 0 END,
            CASE WHEN x.shown THEN i.begin_time ELSE p_begin_time END,
            CASE WHEN x.shown THEN i.end_time ELSE p_window_end END,
            CASE WHEN i.blocked_until > p_now THEN i.blocked_until END
        FROM i
        CROSS JOIN LATERAL (SELECT i.allowed OR i.begin_time < coalesce(i.end_time, 'infinity')
            AND coalesce(i.end_time > p_now, true) AS shown) x;
    END IF;
END
$$;

-- Name: countlimit_allow_one_pooled(text, text, timestamp with time zone, bigint, bigint, timestamp with time zone, timestamp with time zone, timestamp with time zone, text); Type: FUNCTION

CREATE FUNCTION countlimit_allow_one_pooled(p_use_type text, p_unique_id text, p_now timestamp with time zone, p_n bigint, p_limit_value bigint, p_begin_time timestamp with time zone, p_window_end timestamp with time zone, p_penalty_end timestamp with time zone, p_window_kind text) RETURNS TABLE(o_busy boolean, o_allowed boolean, o_used bigint, o_window_begin timestamp with time zone, o_window_end timestamp with time zone, o_blocked_until timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
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
$$;

-- Name: countlimit_apply(text, text, timestamp with time zone, bigint, text[], bigint[], timestamp with time zone[], bigint[], bigint[], bigint[], text[]); Type: FUNCTION

CREATE FUNCTION countlimit_apply(p_op text, p_unique_id text, p_now timestamp with time zone, p_n bigint, p_use_types text[], p_limits bigint[], p_begins timestamp with time zone[], p_lengths bigint[], p_spans bigint[], p_blocks bigint[], p_kinds text[]) RETURNS TABLE(o_ord integer, o_allowed boolean, o_used bigint, o_begin timestamp with time zone, o_end timestamp with time zone, o_blocked_until timestamp with time zone, o_free_at timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
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
    locked  boolean := false;
    got     text[] := '{}';
    k       int;
BEGIN
    IF p_op NOT IN ('allow', 'peek', 'refund') THEN
        RAISE EXCEPTION 'countlimit_apply: unknown op %', p_op USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Phases 1 and 2 (see above), for allow and refund; peek locks nothing.
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
                    -- An empty window (begin = end) that only a counted event opens.
                    INSERT INTO count_limit (use_type, unique_id, begin_time, end_time, limit_value, window_kind)
                    VALUES (p_use_types[k], p_unique_id, p_now, p_now, p_limits[k], nullif(p_kinds[k], ''))
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
$$;

-- Name: FUNCTION countlimit_apply(p_op text, p_unique_id text, p_now timestamp with time zone, p_n bigint, p_use_types text[], p_limits bigint[], p_begins timestamp with time zone[], p_lengths bigint[], p_spans bigint[], p_blocks bigint[], p_kinds text[]); Type: COMMENT

COMMENT ON FUNCTION countlimit_apply(p_op text, p_unique_id text, p_now timestamp with time zone, p_n bigint, p_use_types text[], p_limits bigint[], p_begins timestamp with time zone[], p_lengths bigint[], p_spans bigint[], p_blocks bigint[], p_kinds text[]) IS 'countlimit, as v0.1.0 called it: one atomic check of one id against one or more rules (allow, peek or refund) of every kind but smooth. Kept so that a v0.1.0 binary works during a rolling upgrade; newer binaries call the overload with p_intervals and p_bursts.';

-- Name: countlimit_apply(text, text, timestamp with time zone, bigint, text[], bigint[], timestamp with time zone[], bigint[], bigint[], bigint[], text[], bigint[], bigint[]); Type: FUNCTION

CREATE FUNCTION countlimit_apply(p_op text, p_unique_id text, p_now timestamp with time zone, p_n bigint, p_use_types text[], p_limits bigint[], p_begins timestamp with time zone[], p_lengths bigint[], p_spans bigint[], p_blocks bigint[], p_kinds text[], p_intervals bigint[], p_bursts bigint[]) RETURNS TABLE(o_ord integer, o_allowed boolean, o_used bigint, o_begin timestamp with time zone, o_end timestamp with time zone, o_blocked_until timestamp with time zone, o_free_at timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
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
$$;

-- Name: FUNCTION countlimit_apply(p_op text, p_unique_id text, p_now timestamp with time zone, p_n bigint, p_use_types text[], p_limits bigint[], p_begins timestamp with time zone[], p_lengths bigint[], p_spans bigint[], p_blocks bigint[], p_kinds text[], p_intervals bigint[], p_bursts bigint[]); Type: COMMENT

COMMENT ON FUNCTION countlimit_apply(p_op text, p_unique_id text, p_now timestamp with time zone, p_n bigint, p_use_types text[], p_limits bigint[], p_begins timestamp with time zone[], p_lengths bigint[], p_spans bigint[], p_blocks bigint[], p_kinds text[], p_intervals bigint[], p_bursts bigint[]) IS 'countlimit: one atomic check of one id against one or more rules (allow, peek or refund), smooth rules (GCRA) included, locking (or creating) its rows one at a time in key order, then writing them, so that concurrent checks cannot deadlock. Reset is a plain DELETE.';

-- Name: countlimit_apply_batch(text[], text[], timestamp with time zone[], bigint[], integer[], text[], bigint[], timestamp with time zone[], bigint[], bigint[], bigint[], text[], bigint[], bigint[]); Type: FUNCTION

CREATE FUNCTION countlimit_apply_batch(p_ops text[], p_unique_ids text[], p_nows timestamp with time zone[], p_ns bigint[], p_firsts integer[], p_use_types text[], p_limits bigint[], p_begins timestamp with time zone[], p_lengths bigint[], p_spans bigint[], p_blocks bigint[], p_kinds text[], p_intervals bigint[], p_bursts bigint[]) RETURNS TABLE(o_call integer, o_ord integer, o_allowed boolean, o_used bigint, o_begin timestamp with time zone, o_end timestamp with time zone, o_blocked_until timestamp with time zone, o_free_at timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
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
$$;

-- Name: FUNCTION countlimit_apply_batch(p_ops text[], p_unique_ids text[], p_nows timestamp with time zone[], p_ns bigint[], p_firsts integer[], p_use_types text[], p_limits bigint[], p_begins timestamp with time zone[], p_lengths bigint[], p_spans bigint[], p_blocks bigint[], p_kinds text[], p_intervals bigint[], p_bursts bigint[]); Type: COMMENT

COMMENT ON FUNCTION countlimit_apply_batch(p_ops text[], p_unique_ids text[], p_nows timestamp with time zone[], p_ns bigint[], p_firsts integer[], p_use_types text[], p_limits bigint[], p_begins timestamp with time zone[], p_lengths bigint[], p_spans bigint[], p_blocks bigint[], p_kinds text[], p_intervals bigint[], p_bursts bigint[]) IS 'countlimit: many checks of countlimit_apply in one statement (pgstore''s group commit): calls whose rows all exist and are free are decided in order; the others come back with o_ord 0, nothing written, to be sent to countlimit_apply.';

-- Name: countlimit_apply_locked(text, text, timestamp with time zone, bigint, text[], bigint[], timestamp with time zone[], bigint[], bigint[], bigint[], text[], bigint[], bigint[], text[], boolean[]); Type: FUNCTION

CREATE FUNCTION countlimit_apply_locked(p_op text, p_unique_id text, p_now timestamp with time zone, p_n bigint, p_use_types text[], p_limits bigint[], p_begins timestamp with time zone[], p_lengths bigint[], p_spans bigint[], p_blocks bigint[], p_kinds text[], p_intervals bigint[], p_bursts bigint[], p_got text[], p_created boolean[]) RETURNS TABLE(o_ord integer, o_allowed boolean, o_used bigint, o_begin timestamp with time zone, o_end timestamp with time zone, o_blocked_until timestamp with time zone, o_free_at timestamp with time zone)
    LANGUAGE plpgsql
    AS $$
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
$$;

-- Name: FUNCTION countlimit_apply_locked(p_op text, p_unique_id text, p_now timestamp with time zone, p_n bigint, p_use_types text[], p_limits bigint[], p_begins timestamp with time zone[], p_lengths bigint[], p_spans bigint[], p_blocks bigint[], p_kinds text[], p_intervals bigint[], p_bursts bigint[], p_got text[], p_created boolean[]); Type: COMMENT

COMMENT ON FUNCTION countlimit_apply_locked(p_op text, p_unique_id text, p_now timestamp with time zone, p_n bigint, p_use_types text[], p_limits bigint[], p_begins timestamp with time zone[], p_lengths bigint[], p_spans bigint[], p_blocks bigint[], p_kinds text[], p_intervals bigint[], p_bursts bigint[], p_got text[], p_created boolean[]) IS 'countlimit: the decision of countlimit_apply over rows its caller has locked (p_got: the use types of the rows it locked; p_created: which of them it inserted); called by countlimit_apply and countlimit_apply_batch, which set enable_seqscan = off for it.';

-- Name: countlimit_claim_keys(text[], text[], timestamp with time zone[], text[]); Type: FUNCTION

CREATE FUNCTION countlimit_claim_keys(p_use_types text[], p_unique_ids text[], p_nows timestamp with time zone[], p_kinds text[]) RETURNS integer[]
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    v_held int[] := '{}';
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_use_types, 1), 0) LOOP
        CONTINUE WHEN EXISTS (SELECT FROM count_limit c WHERE c.use_type = p_use_types[i] AND c.unique_id = p_unique_ids[i]);
        BEGIN
            INSERT INTO count_limit (use_type, unique_id, already_count, begin_time, end_time, limit_value, window_kind)
            VALUES (p_use_types[i], p_unique_ids[i], 0, p_nows[i], p_nows[i], 0, p_kinds[i])
            ON CONFLICT DO NOTHING;
        EXCEPTION WHEN lock_not_available THEN
            v_held := v_held || i;
        END;
    END LOOP;
    RETURN v_held;
END
$$;

-- Name: countlimit_extend_lease(text, text, timestamp with time zone, text, timestamp with time zone); Type: FUNCTION

CREATE FUNCTION countlimit_extend_lease(p_use_type text, p_unique_id text, p_now timestamp with time zone, p_lease_token text, p_expires_at timestamp with time zone) RETURNS TABLE(o_allowed boolean, o_used bigint, o_first_expiry timestamp with time zone, o_last_expiry timestamp with time zone, o_blocked_until timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    RETURN QUERY
        WITH parent AS (
            SELECT c.blocked_until
            FROM count_limit c
            WHERE c.use_type = p_use_type AND c.unique_id = p_unique_id
            FOR NO KEY UPDATE
        ), extended AS (
            UPDATE count_limit_lease l SET expires_at = p_expires_at
            WHERE l.use_type = p_use_type AND l.unique_id = p_unique_id AND l.lease_token = p_lease_token
              AND (l.expires_at > p_now) IS TRUE
              AND (SELECT count(*) FROM parent) >= 0
            RETURNING l.lease_token
        ), raised AS (
            UPDATE count_limit c SET
                lease_until = greatest(c.lease_until, p_expires_at),
                updated_at  = now()
            WHERE c.use_type = p_use_type AND c.unique_id = p_unique_id
              AND EXISTS (SELECT FROM extended)
        )
        SELECT
            x.done::boolean AS allowed,
            h.held::bigint AS used,
            h.first_expiry::timestamptz AS first_expiry,
            h.last_expiry::timestamptz AS last_expiry,
            (SELECT p.blocked_until FROM parent p WHERE p.blocked_until > p_now)::timestamptz AS blocked_until
        FROM (SELECT EXISTS (SELECT FROM extended) AS done) x
        CROSS JOIN LATERAL (
            SELECT count(*) AS held,
                min(CASE WHEN x.done AND l.lease_token = p_lease_token THEN p_expires_at ELSE l.expires_at END) AS first_expiry,
                max(CASE WHEN x.done AND l.lease_token = p_lease_token THEN p_expires_at ELSE l.expires_at END) AS last_expiry
            FROM count_limit_lease l
            WHERE l.use_type = p_use_type AND l.unique_id = p_unique_id AND (l.expires_at > p_now) IS TRUE
        ) h;
END
$$;

-- Name: countlimit_lease_batch(text[], text[], text[], timestamp with time zone[], text[], bigint[], timestamp with time zone[], timestamp with time zone[]); Type: FUNCTION

CREATE FUNCTION countlimit_lease_batch(p_ops text[], p_use_types text[], p_unique_ids text[], p_nows timestamp with time zone[], p_lease_tokens text[], p_limits bigint[], p_expires_ats timestamp with time zone[], p_penalty_ends timestamp with time zone[]) RETURNS TABLE(o_call integer, o_done boolean, o_allowed boolean, o_used bigint, o_first_expiry timestamp with time zone, o_last_expiry timestamp with time zone, o_blocked_until timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
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
$$;

-- Name: FUNCTION countlimit_lease_batch(p_ops text[], p_use_types text[], p_unique_ids text[], p_nows timestamp with time zone[], p_lease_tokens text[], p_limits bigint[], p_expires_ats timestamp with time zone[], p_penalty_ends timestamp with time zone[]); Type: COMMENT

COMMENT ON FUNCTION countlimit_lease_batch(p_ops text[], p_use_types text[], p_unique_ids text[], p_nows timestamp with time zone[], p_lease_tokens text[], p_limits bigint[], p_expires_ats timestamp with time zone[], p_penalty_ends timestamp with time zone[]) IS 'countlimit: many calls of concurrency limits (acquire, release, extend, peek) in one statement (pgstore''s group commit): calls whose rows exist (acquire, extend) and are free are decided in order by the function each would call alone; the others come back with o_done false, nothing written, to be sent alone.';

-- Name: countlimit_lift_penalty(text, text); Type: FUNCTION

CREATE FUNCTION countlimit_lift_penalty(unique_id text, use_type text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
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
$$;

-- Name: FUNCTION countlimit_lift_penalty(unique_id text, use_type text); Type: COMMENT

COMMENT ON FUNCTION countlimit_lift_penalty(unique_id text, use_type text) IS 'countlimit, for DBAs: end the penalty of one id (one use type, or all when use_type is NULL): clears blocked_until, keeps the count and the denial tally; returns how many rows were blocked. A window still full denies the next check again. See docs/operations.md.';

-- Name: countlimit_lock_briefly(); Type: FUNCTION

CREATE FUNCTION countlimit_lock_briefly() RETURNS text
    LANGUAGE plpgsql
    AS $_$
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
$_$;

-- Name: countlimit_lock_rows(text, text[], boolean); Type: FUNCTION

CREATE FUNCTION countlimit_lock_rows(p_unique_id text, p_use_types text[], p_skip_locked boolean) RETURNS text[]
    LANGUAGE plpgsql
    AS $$
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
$$;

-- Name: FUNCTION countlimit_lock_rows(p_unique_id text, p_use_types text[], p_skip_locked boolean); Type: COMMENT

COMMENT ON FUNCTION countlimit_lock_rows(p_unique_id text, p_use_types text[], p_skip_locked boolean) IS 'countlimit: locks (FOR UPDATE) the rows of one id''s use types that exist, one at a time in key order, each found by its whole key; returns their use types in that order. With p_skip_locked, NULL as soon as a row that exists is held by another transaction (the rows before it stay locked).';

-- Name: countlimit_most_denied(interval, integer); Type: FUNCTION

CREATE FUNCTION countlimit_most_denied(written_within interval DEFAULT '01:00:00'::interval, max_rows integer DEFAULT 20) RETURNS TABLE(use_type text, unique_id text, denied_count bigint, window_kind text, used bigint, limit_value bigint, blocked_until timestamp with time zone, updated_at timestamp with time zone)
    LANGUAGE sql STABLE
    AS $$
    SELECT s.use_type, s.unique_id, s.denied_count, s.window_kind, s.used, s.limit_value,
        s.blocked_until, s.updated_at
    FROM count_limit_status s
    WHERE s.denied_count > 0 AND s.updated_at >= now() - written_within
    ORDER BY s.denied_count DESC, s.updated_at DESC, s.use_type, s.unique_id
    LIMIT max_rows
$$;

-- Name: FUNCTION countlimit_most_denied(written_within interval, max_rows integer); Type: COMMENT

COMMENT ON FUNCTION countlimit_most_denied(written_within interval, max_rows integer) IS 'countlimit, for DBAs: rows written within the period (default 1 hour) that were ever denied, most denied first. denied_count counts denials since the row was created, so it bounds the period''s denials from above; every row denied in the period is listed. Reads the whole table. See docs/operations.md.';

-- Name: countlimit_peek_leases(text, text, timestamp with time zone, bigint); Type: FUNCTION

CREATE FUNCTION countlimit_peek_leases(p_use_type text, p_unique_id text, p_now timestamp with time zone, p_limit_value bigint) RETURNS TABLE(o_allowed boolean, o_used bigint, o_first_expiry timestamp with time zone, o_last_expiry timestamp with time zone, o_blocked_until timestamp with time zone)
    LANGUAGE plpgsql STABLE
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    RETURN QUERY
        SELECT
            (NOT b.blocked AND h.held < p_limit_value)::boolean AS allowed,
            h.held::bigint AS used,
            h.first_expiry::timestamptz AS first_expiry,
            h.last_expiry::timestamptz AS last_expiry,
            (CASE WHEN b.blocked THEN c.blocked_until END)::timestamptz AS blocked_until
        FROM (SELECT) AS one
        LEFT JOIN count_limit c ON c.use_type = p_use_type AND c.unique_id = p_unique_id
        CROSS JOIN LATERAL (SELECT coalesce(c.blocked_until > p_now, false) AS blocked) b
        CROSS JOIN LATERAL (
            SELECT count(*) AS held, min(l.expires_at) AS first_expiry, max(l.expires_at) AS last_expiry
            FROM count_limit_lease l
            WHERE l.use_type = p_use_type AND l.unique_id = p_unique_id AND (l.expires_at > p_now) IS TRUE
        ) h;
END
$$;

-- Name: countlimit_purge(timestamp with time zone, integer); Type: FUNCTION

CREATE FUNCTION countlimit_purge(p_now timestamp with time zone, p_batch_size integer) RETURNS bigint
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    AS $$
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
$$;

-- Name: countlimit_purge_leases(timestamp with time zone, integer); Type: FUNCTION

CREATE FUNCTION countlimit_purge_leases(p_now timestamp with time zone, p_batch_size integer) RETURNS bigint
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    AS $$
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
$$;

-- Name: countlimit_purge_rows(timestamp with time zone, integer, bigint, integer); Type: FUNCTION

CREATE FUNCTION countlimit_purge_rows(p_now timestamp with time zone, p_batch_size integer, p_from_page bigint, p_from_item integer, OUT deleted bigint, OUT next_page bigint, OUT next_item integer) RETURNS record
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
    AS $$
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
$$;

-- Name: countlimit_release_lease(text, text, timestamp with time zone, text); Type: FUNCTION

CREATE FUNCTION countlimit_release_lease(p_use_type text, p_unique_id text, p_now timestamp with time zone, p_lease_token text) RETURNS TABLE(o_allowed boolean, o_used bigint, o_first_expiry timestamp with time zone, o_last_expiry timestamp with time zone, o_blocked_until timestamp with time zone)
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    RETURN QUERY
        WITH gone AS (
            DELETE FROM count_limit_lease l
            WHERE l.use_type = p_use_type AND l.unique_id = p_unique_id AND l.lease_token = p_lease_token
            RETURNING l.expires_at
        )
        SELECT
            coalesce((SELECT g.expires_at > p_now FROM gone g), false)::boolean AS allowed,
            h.held::bigint AS used,
            h.first_expiry::timestamptz AS first_expiry,
            h.last_expiry::timestamptz AS last_expiry,
            (SELECT c.blocked_until FROM count_limit c
                WHERE c.use_type = p_use_type AND c.unique_id = p_unique_id AND (c.blocked_until > p_now) IS TRUE)::timestamptz AS blocked_until
        FROM (
            SELECT count(*) AS held, min(l.expires_at) AS first_expiry, max(l.expires_at) AS last_expiry
            FROM count_limit_lease l
            WHERE l.use_type = p_use_type AND l.unique_id = p_unique_id AND (l.expires_at > p_now) IS TRUE
              AND l.lease_token <> p_lease_token
        ) h;
END
$$;

-- Name: countlimit_reset(text, text[]); Type: FUNCTION

CREATE FUNCTION countlimit_reset(p_unique_id text, p_use_types text[]) RETURNS bigint
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
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
$$;

-- Name: countlimit_reset_id(text, text); Type: FUNCTION

CREATE FUNCTION countlimit_reset_id(unique_id text, use_type text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql
    SET enable_seqscan TO 'off'
    AS $$
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
$$;

-- Name: FUNCTION countlimit_reset_id(unique_id text, use_type text); Type: COMMENT

COMMENT ON FUNCTION countlimit_reset_id(unique_id text, use_type text) IS 'countlimit, for DBAs: forget one id: delete its rows (one use type, or all when use_type is NULL) and their leases, locked in key order like every check; returns how many rows it deleted. The next check starts afresh. See docs/operations.md.';
