-- Concurrency limits (countlimit.Concurrent): at most N slots held at once
-- per (use_type, unique_id), each slot a lease that expires by itself.
--
-- Leases live in count_limit_lease, one row per held slot, beside the
-- key's count_limit row, which keeps what every kind of limit shares: the
-- denial tally, the penalty and the limit last applied. The count and
-- window of the other kinds stay as they are: a key's leases and its count
-- never see each other.
--
-- Every statement that writes a key's leases first locks the key's
-- count_limit row (Acquire creates it when it is absent, in the three
-- phases of queries/fast.sql), and only then touches lease rows: the
-- parent row is the key's one lock, so Acquire counts leases exactly and
-- lease statements cannot deadlock with each other or with checks.
-- Deleting a count_limit row (Reset, purge, a DBA's DELETE) deletes its
-- leases with it.

-- +goose Up
ALTER TABLE count_limit ADD COLUMN lease_until timestamptz;

COMMENT ON COLUMN count_limit.lease_until IS
    'Concurrency limits only: no lease of this key (count_limit_lease) expires after this. Raised by every Acquire that takes a slot and every Extend; set to the time of a denied Acquire when no lease was ever taken. Purges keep the row until then. NULL for keys never acquired.';
COMMENT ON TABLE count_limit IS
    'countlimit counters: one row per (use_type, unique_id). Written by countlimit''s statements and functions; safe to read, and to delete rows from (that resets them, leases included). Leases of concurrency limits are in count_limit_lease.';

-- +goose StatementBegin
CREATE TABLE count_limit_lease (
    use_type    text        NOT NULL,
    unique_id   text        NOT NULL,
    lease_token text        NOT NULL,
    expires_at  timestamptz NOT NULL,
    taken_at    timestamptz NOT NULL,
    PRIMARY KEY (use_type, unique_id, lease_token),
    FOREIGN KEY (use_type, unique_id) REFERENCES count_limit (use_type, unique_id) ON DELETE CASCADE
);
-- +goose StatementEnd

COMMENT ON TABLE count_limit_lease IS
    'countlimit leases: one row per slot held of a concurrency limit (countlimit.Concurrent) by (use_type, unique_id); a slot is held while expires_at is in the future. Written only by countlimit''s statements, under the lock of the key''s count_limit row; safe to read. Expired rows are purged with their key, or by countlimit purge.';
COMMENT ON COLUMN count_limit_lease.use_type IS 'What is limited, e.g. report.export (countlimit.UseType).';
COMMENT ON COLUMN count_limit_lease.unique_id IS 'Who or what is limited: user id, API key, tenant.';
COMMENT ON COLUMN count_limit_lease.lease_token IS 'The lease''s random name (22 base64url characters). Whoever knows it can release or extend the slot: treat it as a secret.';
COMMENT ON COLUMN count_limit_lease.expires_at IS 'When the slot frees itself unless extended: taken_at (or the last Extend) plus the rule''s ttl, on the caller''s clock.';
COMMENT ON COLUMN count_limit_lease.taken_at IS 'When the slot was taken (Acquire), on the caller''s clock; Extend does not change it.';

-- Serves purges of expired leases, oldest first.
CREATE INDEX count_limit_lease_expires_at_idx ON count_limit_lease (expires_at);

-- countlimit_acquire carries out one Acquire of a concurrency limit: it
-- locks the key's count_limit row (inserting it when absent), drops the
-- key's expired leases, counts the live ones and either adds the lease or
-- counts the denial and sets the penalty, as an Allow does. It is a
-- function, not a statement, because the count must be read after the
-- lock is granted: a statement's snapshot is taken before it waits for
-- the lock and misses leases the previous holder committed, while under
-- READ COMMITTED each statement here reads the latest committed leases.
--
-- p_now:         the caller's clock; the database clock decides nothing
-- p_expires_at:  p_now + the rule's ttl
-- p_penalty_end: p_now + the rule's Block, NULL when it has none
-- p_lazy_tally:  the call is a transaction of its own (autocommit), whose
--                commit may then skip waiting for the WAL flush when all
--                it wrote is a denial's tally (see below)
-- +goose StatementBegin
CREATE FUNCTION countlimit_acquire(
    p_use_type    text,
    p_unique_id   text,
    p_now         timestamptz,
    p_lease_token text,
    p_limit       bigint,
    p_expires_at  timestamptz,
    p_penalty_end timestamptz,
    p_lazy_tally  boolean
) RETURNS TABLE (
    o_allowed       boolean,
    o_used          bigint,
    o_first_expiry  timestamptz,
    o_last_expiry   timestamptz,
    o_blocked_until timestamptz
) LANGUAGE plpgsql AS $fn$
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
    -- "Plans" in 00005_plans.sql for why the expiry is written IS TRUE).
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
$fn$;
-- +goose StatementEnd

COMMENT ON FUNCTION countlimit_acquire(text, text, timestamptz, text, bigint, timestamptz, timestamptz, boolean) IS
    'countlimit: one atomic Acquire of a concurrency limit: takes a lease (count_limit_lease) when fewer than p_limit are live, else counts the denial. Locks the key''s count_limit row first.';

-- The view shows a key of a concurrency limit (one with lease_until set,
-- while it holds live leases or counts nothing of another kind) as
-- window_kind 'concurrent', with its live leases as used.
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
            ELSE 'window'
        END AS window_kind,
        CASE WHEN k.concurrent THEN h.held ELSE n.counted END AS used,
        CASE WHEN k.concurrent THEN h.first_taken ELSE c.begin_time END AS window_begin,
        CASE WHEN k.concurrent THEN h.last_expiry ELSE c.end_time END AS window_end
    FROM count_limit c
    CROSS JOIN LATERAL (
        -- No lease outlives lease_until, so keys without one skip the probe.
        SELECT count(*) AS held, min(l.taken_at) AS first_taken, max(l.expires_at) AS last_expiry
        FROM count_limit_lease l
        WHERE c.lease_until > now()
          AND l.use_type = c.use_type AND l.unique_id = c.unique_id AND l.expires_at > now()
    ) h
    CROSS JOIN LATERAL (
        SELECT CASE
            -- The log is time-ordered and end_time is its newest event plus
            -- the window's length; epoch arithmetic keeps DST out of it.
            WHEN c.events IS NOT NULL THEN (
                SELECT count(*) FROM unnest(c.events) AS e
                WHERE extract(epoch FROM e) > extract(epoch FROM now())
                    - (extract(epoch FROM c.end_time) - extract(epoch FROM c.events[cardinality(c.events)])))
            WHEN c.begin_time <= now() AND (c.end_time IS NULL OR c.end_time > now()) THEN c.already_count
            ELSE 0
        END AS counted
    ) n
    CROSS JOIN LATERAL (
        SELECT c.lease_until IS NOT NULL AND (h.held > 0 OR n.counted = 0) AS concurrent
    ) k
) s;
-- +goose StatementEnd

-- Comments of 00003, repeated so that every column keeps one whatever
-- reads this schema (sqlc forgets them when a view is replaced).
COMMENT ON VIEW count_limit_status IS
    'count_limit as of the database clock, for people: what each id has used of its limit now (for concurrency limits, the slots it holds), what remains, whether it is blocked and for how long.';
COMMENT ON COLUMN count_limit_status.use_type IS 'What is limited, e.g. password.change.';
COMMENT ON COLUMN count_limit_status.unique_id IS 'Who or what is limited: user id, phone, IP, token.';
COMMENT ON COLUMN count_limit_status.limit_value IS 'The limit the last check applied (each check carries its rule; this records it).';
COMMENT ON COLUMN count_limit_status.denied_count IS 'Denied checks since the row was created (not reset when a window rolls over).';
COMMENT ON COLUMN count_limit_status.blocked IS 'True while the id sits in the penalty box: every check is denied until blocked_until.';
COMMENT ON COLUMN count_limit_status.blocked_until IS 'When the penalty ends, while it lasts; NULL when not blocked.';
COMMENT ON COLUMN count_limit_status.blocked_for IS 'How long the penalty still lasts; NULL when not blocked.';
COMMENT ON COLUMN count_limit_status.updated_at IS 'When the row was last written (database clock).';
COMMENT ON COLUMN count_limit_status.window_kind IS 'window (rolling, fixed or calendar), sliding (an exact log of events), lifetime (never resets) or concurrent (slots held at once, as leases in count_limit_lease).';
COMMENT ON COLUMN count_limit_status.used IS 'Events counted in the current window as of now; 0 once the window has ended. For concurrent limits, the leases live now (slots held).';
COMMENT ON COLUMN count_limit_status.remaining IS 'limit_value - used, never below 0: how many more events (for concurrent limits, slots) the last applied limit allows now.';
COMMENT ON COLUMN count_limit_status.window_begin IS 'When the current window began; for sliding windows, the oldest logged event; for concurrent limits, when the oldest live lease was taken (NULL when none is held).';
COMMENT ON COLUMN count_limit_status.window_end IS 'When the current window ends (exclusive); NULL for lifetime limits. For sliding windows, the newest event plus the window length; for concurrent limits, when the last live lease expires unless extended or released (NULL when none is held).';
COMMENT ON COLUMN count_limit_status.resets_in IS 'How long until the window ends and its count goes, while something is counted; NULL otherwise and for lifetime limits. For concurrent limits, until the last live lease expires.';

-- +goose Down
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
    s.begin_time AS window_begin,
    s.end_time AS window_end,
    (CASE WHEN s.used > 0 AND s.end_time IS NOT NULL THEN s.end_time - now() END)::interval AS resets_in,
    (s.blocked_until IS NOT NULL AND s.blocked_until > now())::boolean AS blocked,
    (CASE WHEN s.blocked_until > now() THEN s.blocked_until END)::timestamptz AS blocked_until,
    (CASE WHEN s.blocked_until > now() THEN s.blocked_until - now() END)::interval AS blocked_for,
    s.updated_at
FROM (
    SELECT
        c.use_type, c.unique_id, c.already_count, c.begin_time, c.end_time, c.limit_value,
        c.denied_count, c.blocked_until, c.events, c.created_at, c.updated_at,
        CASE
            WHEN c.events IS NOT NULL THEN 'sliding'
            WHEN c.end_time IS NULL THEN 'lifetime'
            ELSE 'window'
        END AS window_kind,
        CASE
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
COMMENT ON COLUMN count_limit_status.window_kind IS 'window (rolling, fixed or calendar), sliding (an exact log of events) or lifetime (never resets).';
COMMENT ON COLUMN count_limit_status.used IS 'Events counted in the current window as of now; 0 once the window has ended.';
COMMENT ON COLUMN count_limit_status.remaining IS 'limit_value - used, never below 0: how many more events the last applied limit allows now.';
COMMENT ON COLUMN count_limit_status.window_begin IS 'When the current window began; for sliding windows, the oldest logged event.';
COMMENT ON COLUMN count_limit_status.window_end IS 'When the current window ends (exclusive); NULL for lifetime limits. For sliding windows, the newest event plus the window length.';
COMMENT ON COLUMN count_limit_status.resets_in IS 'How long until the window ends and its count goes, while something is counted; NULL otherwise and for lifetime limits.';

DROP FUNCTION countlimit_acquire(text, text, timestamptz, text, bigint, timestamptz, timestamptz, boolean);
DROP TABLE count_limit_lease;
ALTER TABLE count_limit DROP COLUMN lease_until;
COMMENT ON TABLE count_limit IS
    'countlimit counters: one row per (use_type, unique_id). Written by countlimit''s statements and countlimit_apply; safe to read, and to delete rows from (that resets them).';
