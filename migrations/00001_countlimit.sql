-- countlimit's PostgreSQL schema, whole: the tables that keep every
-- counter, the functions that are the store's statements, the view DBAs
-- read and the functions they call by hand, in the order a reader needs
-- them.
--
--   1. count_limit, one row per (use_type, unique_id): the count and window,
--      the sliding log, the denial tally, the penalty; its indexes.
--   2. count_limit_lease, one row per held slot of a concurrency limit.
--   3. How every statement reaches the tables ("Plans").
--   4. The checks: the fast path of one rule (countlimit_allow_one and the
--      group commit's batches), countlimit_apply for everything else that
--      counts, Reset and the purge.
--   5. The leases' statements.
--   6. count_limit_status, the view for people.
--   7. The DBA's functions.
--
-- Released in v0.1.0 and frozen from then on: this file is never edited (a
-- test holds it to its checksum, migrations/released.txt). A change is a
-- new migration, numbered after it (docs/RELEASING.md).
--
-- Before v0.1.0 the schema grew through six migrations (00001 to 00006)
-- on untagged commits of main; this file is where they ended, with one
-- change made before the freeze: countlimit_apply, which AllowAll, sliding
-- windows, Peek and Refund go through, takes each rule's window kind and
-- writes count_limit.window_kind as the single-rule statements do. A
-- database migrated by an untagged main is at goose version 6 and is not
-- this schema: drop countlimit's objects there (its "migrate down", six
-- times, with that main's binary) and migrate again.

-- +goose Up

-- 1. count_limit. The primary key is ordered (unique_id, use_type): it
-- serves every lookup of one id by itself (a DBA's "every limit of this
-- user", Reset, the DBA's functions) and every key of a check, so no other
-- index is written on a new row or on an update that cannot stay on its
-- page (a new window, a penalty). fillfactor 80 leaves room on each page
-- for updates to stay there (HOT updates write no index).
--
-- A key's window is [begin_time, end_time): current while it is not empty
-- (begin_time < end_time, or end_time NULL for a lifetime) and not over
-- (end_time > now); begin_time = end_time is an empty window, which a
-- denial of a new key leaves. "now" is the calling Limiter's clock, never
-- the database's: the database clock decides nothing (the view and the
-- DBA's functions, for people, use now()).
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
    lease_until   timestamptz,
    window_kind   text,
    CONSTRAINT count_limit_pkey PRIMARY KEY (unique_id, use_type)
) WITH (fillfactor = 80);
-- +goose StatementEnd

COMMENT ON TABLE count_limit IS
    'countlimit counters: one row per (use_type, unique_id). Written by countlimit''s statements and functions; safe to read, and to delete rows from (that resets them, leases included). Leases of concurrency limits are in count_limit_lease.';

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
COMMENT ON COLUMN count_limit.lease_until IS
    'Concurrency limits only: no lease of this key (count_limit_lease) expires after this. Raised by every Acquire that takes a slot and every Extend; set to the time of a denied Acquire when no lease was ever taken. Purges keep the row until then. NULL for keys never acquired.';
COMMENT ON COLUMN count_limit.window_kind IS
    'The window kind of the rule that last counted here, or created the row: rolling, fixed, calendar, sliding or lifetime; NULL for CheckLimit''s window of the caller''s own. For people; no check reads it.';

-- Serve bounded expiry purges, oldest first: rows whose window ended
-- (lifetime rows, end_time NULL, are never purged by it), and rows whose
-- penalty ended, which a DBA's "who is blocked now" (WHERE blocked_until >
-- now()) reads too.
CREATE INDEX count_limit_end_time_idx ON count_limit (end_time) WHERE end_time IS NOT NULL;
CREATE INDEX count_limit_blocked_until_idx ON count_limit (blocked_until) WHERE blocked_until IS NOT NULL;

-- 2. count_limit_lease. Concurrency limits (countlimit.Concurrent): at most
-- N slots held at once per (use_type, unique_id), each slot a lease that
-- expires by itself. Leases live here, one row per held slot, beside the
-- key's count_limit row, which keeps what every kind of limit shares: the
-- denial tally, the penalty and the limit last applied. The count and
-- window of the other kinds stay as they are: a key's leases and its count
-- never see each other.
--
-- Every statement that writes a key's leases first locks the key's
-- count_limit row (Acquire creates it when it is absent), and only then
-- touches lease rows: the parent row is the key's one lock, so Acquire
-- counts leases exactly and lease statements cannot deadlock with each
-- other or with checks. Deleting a count_limit row (Reset, purge, a DBA's
-- DELETE) deletes its leases with it.

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

-- 3. Plans. Every statement is a PL/pgSQL function: PostgreSQL plans a
-- prepared statement once for all ("generic plan") after a few runs and
-- keeps that plan as long as the session, and a statement planned while
-- count_limit looked empty (a new deployment, a TRUNCATE, a VACUUM ANALYZE
-- of an empty table) got a plan that reads the whole table, cheapest on an
-- empty table, and kept it while the table grew. Each function plans with
-- enable_seqscan off, set for its run only (the caller's session is left
-- alone). (A function's statements keep their plans for the session, as
-- prepared statements do: the call costs a few microseconds more than the
-- bare statement.) enable_seqscan off was not enough: under the statistics of an
-- empty table (a new deployment's first ANALYZE, a TRUNCATE and ANALYZE)
-- the planner found the next cheapest way to read the whole table, and a
-- function's generic plan lives as long as its pooled session, reading
-- more with every row. A batch joined its calls to a full Index Scan of
-- count_limit_pkey (the outer side of a nested loop with the calls as a
-- join filter, or a merge join's ordered input: 5 422 index entries for a
-- batch of 8, issue 33), a lease statement read every live lease through
-- count_limit_lease_expires_at_idx, and the purge joined its batch to
-- full scans of both primary keys. Turning the other ways off does not
-- close them: with enable_mergejoin, enable_hashjoin and
-- enable_bitmapscan off beside enable_seqscan, countlimit_allow_distinct
-- still locked, looked for busy rows and updated through a nested loop
-- whose outer side was the whole primary key, since no setting disables
-- an index scan without a condition. So the statements are shaped to
-- leave the planner one way to each table, by key, whatever the
-- statistics say:
--
--   * A batch reaches count_limit through a LATERAL subquery per key, with
--     LIMIT 1 (and FOR NO KEY UPDATE SKIP LOCKED where it locks).
--     PostgreSQL never flattens a subquery with a LIMIT or a locking
--     clause into the join around it, nor pushes a condition into it, so
--     the subquery's one way to the table is the primary key with its key
--     as the index condition, probed once per key in a nested loop over
--     the calls. The loop takes the calls in their order, key order, so
--     the locks are still taken in key order.
--   * A statement that writes the rows a batch locked (UPDATE ... FROM)
--     names them by the batch's ids as well, unique_id = ANY (the ids),
--     the primary key's leading column: whatever join the planner makes,
--     its scan of count_limit has an index condition on the key. (By
--     ctid, the address the lock returned, it would miss a row another
--     transaction changed between the statement's snapshot and its lock:
--     the lock returns the latest version, which the snapshot cannot see.)
--   * A condition on a column another index serves (end_time,
--     blocked_until, count_limit_lease.expires_at) is written (...) IS TRUE
--     beside a key: no index matches it and it implies no partial index's
--     predicate, so no plan reads every expired lease or every blocked id
--     to find one key's.
--   * A NOT EXISTS probe per row keeps OFFSET 0: PostgreSQL drops a LIMIT
--     from an EXISTS and makes it an anti-join, which may hash or merge
--     the other table whole; OFFSET 0, the traditional fence, it keeps,
--     and the probe stays one per row, by key.
--   * The purge reads by its own index: expired rows and leases in expiry
--     order, with an index condition on the expiry column, stopped by
--     LIMIT batch_size; enable_bitmapscan off leaves it no plan that reads
--     every expired row and sorts them. It then deletes the rows it locked
--     by their address (ctid): the deletes read nothing else. A row changed
--     since the statement's snapshot is locked at a version the snapshot
--     cannot see, and is left for the next batch.
--
-- enable_seqscan off stays on every function: it keeps a statement of one
-- key off a Seq Scan of a table that looks empty. TestPlansReadOnlyTheirKeys
-- (countlimit/pgstore) holds every statement to the rule under four states
-- of the statistics. The audits that list rows across ids
-- (count_limit_status's most denied and nearest their limit, and
-- countlimit_most_denied, below) read the whole table by design.

-- 4. The checks. The fast path: one rule whose window is not sliding
-- (rolling, fixed, calendar, lifetime, CheckLimit), one statement each.
-- countlimit_allow_one holds one row lock at most; the batch statements
-- take theirs in three phases, as countlimit_apply does, so concurrent
-- statements over many keys cannot deadlock:
--
--   1. lock the rows that exist, in key order (unique_id, then use_type, byte
--      order; Go sorts the keys and passes them in that order), skipping any
--      that another transaction holds (see countlimit_allow_batch);
--   2. insert the rows that do not, in key order, ON CONFLICT DO NOTHING:
--      this waits only for other inserts of the same key, never for a row
--      lock. A key someone else created since the statement began is left
--      alone and reported as not applied; the caller sends it again;
--   3. update the rows locked in phase 1, which waits for nothing.
--
-- The decision is made from the latest committed version of the row (as
-- locked in phase 1, or as countlimit_allow_one's UPDATE reads it again or
-- its ON CONFLICT locks it), never from the statement's snapshot, so it is
-- exact under READ COMMITTED. A window is current when it is not empty and
-- not over (begin is not compared with now; see driver.Store).
--
-- That rule (current, blocked, fits, then the count, window, tally and
-- penalty written) is spelled out in countlimit_allow_one,
-- countlimit_allow_batch's fold step, countlimit_allow_distinct's decided
-- and countlimit_apply below, as in the Redis scripts and memstore:
-- driver.Apply is the contract as code, and docs/ARCHITECTURE.md ("The
-- copies") lists every copy and the test that holds it to Apply (the
-- seeded harness, TestModel, names the copy that drifted).
--
-- Parameters common to all: p_now is the caller's clock; p_begin_time and
-- p_window_end bound the window an allowed event opens (p_window_end NULL
-- for a lifetime window); p_penalty_end is now + Block (NULL when the rule
-- has none); p_window_kind and p_kinds name the rule's window for
-- count_limit.window_kind (rolling, fixed, calendar, sliding, lifetime;
-- empty for CheckLimit's), which no decision reads.

-- countlimit_lock_briefly sets, for the rest of the transaction, how long
-- a statement of pgstore's pool waits for a lock before it gives up with
-- lock_not_available (SQLSTATE 55P03), nothing written: the setting
-- countlimit.lock_wait when set (ALTER ROLE ... SET countlimit.lock_wait =
-- '10ms', or a connection's options), else 2 ms. That is longer than the
-- pool's own statements hold a row, and shorter than a wait for another
-- transaction (a check inside a caller's transaction, a DBA's UPDATE) is
-- worth a connection: pgstore then waits in the process and sends the call
-- again. Only a pool's statements call it, each its own transaction;
-- never a caller's transaction.
--
-- The setting is taken within 1 ms to 100 ms, written as lock_timeout is
-- (a number and us, ms, s, min, h or d; ms when none): 0, which would be
-- lock_timeout's "wait for ever", and anything longer count as 100 ms,
-- anything shorter as 1 ms. A statement that waits long for a held row
-- holds a connection, and a batch its every call, for as long: at 0 or a
-- minute a row another transaction holds stalled the other ids again, and
-- opened the circuit breaker (TestLockWaitOutOfRangeHoldsNoIDHostage). A
-- value lock_timeout would not read (a typo, a negative number) counts as
-- unset, 2 ms, rather than fail every statement of the pool. Unset, it
-- costs no parsing.
-- +goose StatementBegin
CREATE FUNCTION countlimit_lock_briefly() RETURNS text LANGUAGE sql AS $fn$
    SELECT set_config('lock_timeout', CASE
        WHEN coalesce(current_setting('countlimit.lock_wait', true), '') = '' THEN '2ms'
        WHEN current_setting('countlimit.lock_wait', true) !~ '^\s*[0-9]{1,9}(\.[0-9]{1,6})?\s*(us|ms|s|min|h|d)?\s*$' THEN '2ms'
        ELSE least(greatest(round(coalesce(nullif(extract(epoch FROM (current_setting('countlimit.lock_wait', true)
            || CASE WHEN current_setting('countlimit.lock_wait', true) ~ '[0-9]\s*$' THEN 'ms' ELSE '' END)::interval), 0) * 1000, 100)), 1), 100) || 'ms'
        END, true)
$fn$;
-- +goose StatementEnd

-- countlimit_allow_one counts n events of one rule for one id, or tallies the
-- denial and sets the penalty, in one statement of two steps:
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
-- else 0; "blocked" is blocked_until > now.
--
-- With p_skip_locked (pgstore's pool, whose other calls must not wait
-- behind a lock held elsewhere) the row is locked first, FOR NO KEY UPDATE
-- SKIP LOCKED: a row the statement's snapshot shows that it could not lock
-- is another transaction's, and the call writes nothing and returns one row
-- with o_busy set; a new id's row that another transaction has inserted
-- and not committed fails the statement with lock_not_available after a
-- brief wait (countlimit_lock_briefly), nothing written. Without it (a
-- Store on the caller's own connection or transaction) the statement waits
-- for such a lock, as the caller's other statements do.
-- +goose StatementBegin
CREATE FUNCTION countlimit_allow_one(
    p_use_type    text,
    p_unique_id   text,
    p_now         timestamptz,
    p_n           bigint,
    p_limit_value bigint,
    p_begin_time  timestamptz,
    p_window_end  timestamptz,
    p_penalty_end timestamptz,
    p_skip_locked boolean,
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
$fn$;
-- +goose StatementEnd

-- countlimit_claim_keys is how a batch gets past a key that another
-- transaction has inserted and not yet committed (a check of a new id
-- inside a caller's transaction), whose insert would hold the batch's
-- every call until that transaction ends. countlimit_allow_batch and
-- countlimit_allow_distinct insert their new keys with a brief
-- lock_timeout (countlimit_lock_briefly); when one times out
-- (lock_not_available), the batch has written
-- nothing and calls this, which inserts, one key at a time, an empty row
-- for each key (p_use_types[i], p_unique_ids[i]) no committed row holds:
-- count 0 and an empty window at p_nows[i] (the time of the key's first
-- call), the row a new key's denial leaves. It returns the positions of
-- the keys whose insert timed out. The batch then runs again: it finds the
-- other new keys' rows, its own, and decides their calls as it would have
-- on inserting them, and reports the held keys' calls busy.
-- +goose StatementBegin
CREATE FUNCTION countlimit_claim_keys(p_use_types text[], p_unique_ids text[], p_nows timestamptz[], p_kinds text[])
RETURNS int[] LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
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
$fn$;
-- +goose StatementEnd

-- countlimit_allow_batch is countlimit_allow_one for many calls at once:
-- group commit. Keys are given once each, sorted; calls refer to their key by
-- its 1-based position (key_of) and are numbered 1, 2, ... within a key in
-- arrival order (seq). Calls for one key are decided one after another, in
-- that order, by one row update: each gets the result it would have had
-- alone. The statement returns one row per call it applied; a key created by
-- a concurrent transaction after the statement began is left alone and its
-- calls are not returned: send them again.
--
-- A row another transaction holds locked (a check inside a caller's
-- transaction that has not committed, a DBA's hand edit) is skipped, never
-- waited for: the statement would hold every other call of the batch
-- behind that lock. Its calls come back with busy set and nothing of them
-- applied; the caller sends them again later, alone or in another batch.
-- A key that no committed row holds is inserted; when another transaction
-- has inserted the same key and not yet committed, the insert gives up
-- after a brief wait and the statement runs again past that key, whose
-- calls come back busy (countlimit_claim_keys). The rows come back sorted: a sort
-- reads all its input before it returns a row, so none is returned before
-- every insert is done, and a run that gives up has returned nothing.
--
-- CASE WHEN random() >= 0 THEN ... END is the array itself, but the planner
-- cannot see through it: it estimates the batch at 10 calls whatever its
-- size, as it must for the generic plan, so PostgreSQL keeps the generic
-- plan instead of planning this statement anew for every small batch.
-- +goose StatementBegin
CREATE FUNCTION countlimit_allow_batch(
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
$fn$;
-- +goose StatementEnd

-- countlimit_allow_distinct is countlimit_allow_batch for a batch whose calls
-- all have keys of their own, the common case over many ids. No call then
-- waits on another's outcome, so each is decided from its row as locked, as
-- countlimit_allow_one decides, without countlimit_allow_batch's recursive
-- fold: a smaller plan and less work per call. Calls are given sorted by key,
-- one per key; a call is named by its 1-based position (key_of). The
-- statement returns one row per call it applied, and one with busy set per
-- call whose row another transaction holds locked (see
-- countlimit_allow_batch); a call whose key a concurrent transaction created
-- after the statement began is left alone and not returned: send it again.
--
-- The CASE WHEN random() >= 0 is countlimit_allow_batch's: it keeps the
-- generic plan.
-- +goose StatementBegin
CREATE FUNCTION countlimit_allow_distinct(
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
$fn$;
-- +goose StatementEnd

-- countlimit_apply carries out one check of one id against one or more
-- rules (allow, peek or refund), for what the fast path does not take:
-- sliding windows, AllowAll over several rules, Peek and Refund. A
-- set-based statement updates a row once, and each rule's decision here
-- depends on the others' (all or nothing). It takes its row locks in the
-- fast path's three phases, so that it and the batches, which run side by
-- side, cannot deadlock:
--
--   1. lock the rows that exist, in use_type order (byte order);
--   2. (allow only) insert the rows that do not, in the same order, ON
--      CONFLICT DO NOTHING; a row someone created since phase 1 undoes the
--      attempt (locks and inserts, in a subtransaction) and starts again,
--      8 times at most (gather.MaxAttempts, TestMaxAttemptsIsTheMigrations);
--   3. decide and write the rows locked in phases 1 and 2, waiting for
--      nothing.
--
-- Retrying instead of re-reading also means a concurrent Reset (a DELETE)
-- does not make an Allow fail with a serialization error under READ
-- COMMITTED. A sliding check's p_begins is NULL and its p_lengths 0: its
-- log is its window. p_kinds names each rule's window for
-- count_limit.window_kind, written where the check counts.

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
    p_kinds     text[]
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
$fn$;
-- +goose StatementEnd
COMMENT ON FUNCTION countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[]) IS
    'countlimit: one atomic check of one id against one or more rules (allow, peek or refund), taking row locks in key order (existing rows, then new ones, then writes) so that concurrent checks cannot deadlock. Reset is a plain DELETE.';

-- countlimit_reset deletes the rows of one id for the given use types,
-- leases with them (Limiter.Reset), locking them first in key order as
-- every statement does, so that resetting several rules cannot deadlock;
-- it returns how many rows it deleted.
-- The DELETE names the id and its use types beside the rows it locked, so
-- that it reads them by key (see "Plans" above).
-- +goose StatementBegin
CREATE FUNCTION countlimit_reset(p_unique_id text, p_use_types text[])
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

-- countlimit_purge deletes at most batch_size expired leases and at most
-- batch_size rows whose window, penalty and leases are over, skipping rows
-- that live checks hold locked, and returns how many of both it deleted
-- (a row whose leases this batch deletes goes in the next). A row's
-- lease_until is read at its latest version, so a row whose key an Acquire
-- or Extend has just written is kept. It reads by the expiry indexes, in
-- expiry order, and stops at batch_size (see "Plans" above): what a batch
-- reads beyond its batch is the expired rows it passes over, those live
-- checks hold and those a penalty or a lease keeps, read again by each
-- batch until they can go.
-- +goose StatementBegin
CREATE FUNCTION countlimit_purge(p_now timestamptz, p_batch_size int)
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

-- 5. The leases. countlimit_acquire carries out an Acquire under the key's
-- row lock. Each statement that adds or extends leases locks the key's
-- count_limit row first, as countlimit_acquire does, and touches that one
-- key's leases only after, so the parent row is the key's one lock and
-- lease statements cannot deadlock with checks or with each other. The
-- count(*) >= 0 conditions make PostgreSQL take that lock before anything
-- else runs. countlimit_release_lease, which only deletes a lease, takes no
-- row lock first (see it below); nor does countlimit_purge, which skips
-- rows that others hold locked.
--
-- A statement's snapshot is taken before it waits for the lock. Its
-- verdict does not depend on it: a lease row is found, and rechecked, at
-- its latest version. The state it reports besides the verdict (live
-- leases, their first and last expiry, the penalty) is read from that
-- snapshot with the statement's own change applied: exact unless another
-- call on the key committed while this one waited.

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
) LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
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
$fn$;
-- +goose StatementEnd
COMMENT ON FUNCTION countlimit_acquire(text, text, timestamptz, text, bigint, timestamptz, timestamptz, boolean) IS
    'countlimit: one atomic Acquire of a concurrency limit: takes a lease (count_limit_lease) when fewer than p_limit are live, else counts the denial. Locks the key''s count_limit row first.';

-- countlimit_release_lease deletes the lease named lease_token, live or
-- expired, and reports whether it was live at now. It is the one lease
-- statement that does not lock the key's row: it only frees, so it cannot
-- make a count wrong, and Releases then never queue behind the Acquires of a
-- busy key. It waits only for another statement that holds the same lease row
-- (an Extend of it, or a Reset).
-- +goose StatementBegin
CREATE FUNCTION countlimit_release_lease(p_use_type text, p_unique_id text, p_now timestamptz, p_lease_token text)
RETURNS TABLE (
    o_allowed       boolean,
    o_used          bigint,
    o_first_expiry  timestamptz,
    o_last_expiry   timestamptz,
    o_blocked_until timestamptz
) LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
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
$fn$;
-- +goose StatementEnd

-- countlimit_extend_lease moves the expiry of the lease named lease_token to
-- expires_at when the lease is live at now, and raises the key's
-- lease_until to match so that purges keep the key; it reports whether it
-- did. It writes nothing when the lease is gone or expired.
-- +goose StatementBegin
CREATE FUNCTION countlimit_extend_lease(p_use_type text, p_unique_id text, p_now timestamptz, p_lease_token text, p_expires_at timestamptz)
RETURNS TABLE (
    o_allowed       boolean,
    o_used          bigint,
    o_first_expiry  timestamptz,
    o_last_expiry   timestamptz,
    o_blocked_until timestamptz
) LANGUAGE plpgsql SET enable_seqscan = off AS $fn$
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
$fn$;
-- +goose StatementEnd

-- countlimit_peek_leases answers what countlimit_acquire would, writing and
-- locking nothing.
-- +goose StatementBegin
CREATE FUNCTION countlimit_peek_leases(p_use_type text, p_unique_id text, p_now timestamptz, p_limit_value bigint)
RETURNS TABLE (
    o_allowed       boolean,
    o_used          bigint,
    o_first_expiry  timestamptz,
    o_last_expiry   timestamptz,
    o_blocked_until timestamptz
) LANGUAGE plpgsql STABLE SET enable_seqscan = off AS $fn$
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
$fn$;
-- +goose StatementEnd

-- 6. count_limit_status, for people: count_limit as of the database clock,
-- one row per key. It counts a window's events while the window is current
-- as every check decides it: not empty, not over (not whether it has begun
-- by now(): a Limiter whose clock runs ahead of the database's opens
-- windows that begin later than now(), current all the same). A sliding
-- window counts its logged events within the span; a concurrency limit the
-- leases live now.

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

COMMENT ON COLUMN count_limit_status.use_type IS 'What is limited, e.g. password.change.';
COMMENT ON COLUMN count_limit_status.unique_id IS 'Who or what is limited: user id, phone, IP, token.';
COMMENT ON COLUMN count_limit_status.limit_value IS 'The limit the last check applied (each check carries its rule; this records it).';
COMMENT ON COLUMN count_limit_status.denied_count IS 'Denied checks since the row was created (not reset when a window rolls over).';
COMMENT ON COLUMN count_limit_status.blocked IS 'True while the id sits in the penalty box: every check is denied until blocked_until.';
COMMENT ON COLUMN count_limit_status.blocked_until IS 'When the penalty ends, while it lasts; NULL when not blocked.';
COMMENT ON COLUMN count_limit_status.blocked_for IS 'How long the penalty still lasts; NULL when not blocked.';
COMMENT ON COLUMN count_limit_status.updated_at IS 'When the row was last written (database clock).';
COMMENT ON COLUMN count_limit_status.window_kind IS 'rolling, fixed or calendar (the rule that last counted in the window; window for CheckLimit''s window of the caller''s own), sliding (an exact log of events), lifetime (never resets) or concurrent (slots held at once, as leases in count_limit_lease).';
COMMENT ON COLUMN count_limit_status.used IS 'Events counted in the current window as of now; 0 once the window has ended. For concurrent limits, the leases live now (slots held).';
COMMENT ON COLUMN count_limit_status.remaining IS 'limit_value - used, never below 0: how many more events (for concurrent limits, slots) the last applied limit allows now.';
COMMENT ON COLUMN count_limit_status.window_begin IS 'When the current window began; for sliding windows, the oldest logged event; for concurrent limits, when the oldest live lease was taken (NULL when none is held).';
COMMENT ON COLUMN count_limit_status.window_end IS 'When the current window ends (exclusive); NULL for lifetime limits. For sliding windows, the newest event plus the window length; for concurrent limits, when the last live lease expires unless extended or released (NULL when none is held).';
COMMENT ON COLUMN count_limit_status.resets_in IS 'How long until the window ends and its count goes, while something is counted; NULL otherwise and for lifetime limits. For concurrent limits, until the last live lease expires.';

-- 7. SQL for DBAs: the writes a DBA makes by hand, and one audit, as
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
--     the store. A function that writes several rows of one
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
-- The writers plan with enable_seqscan off, as the store's functions do,
-- so that their statements read the key whatever the table's statistics
-- say, and write a condition on blocked_until beside the key (...) IS
-- TRUE, as "Plans" explains: no plan then finds one id's blocked
-- rows by reading every blocked id (count_limit_blocked_until_idx).
-- countlimit_most_denied does not: it reads the whole table by design (no
-- index serves it; see it below).
--
-- Names: countlimit_reset(text, text[]) is the store's Reset. An
-- overload countlimit_reset(text, text) would not even be ambiguous: for an
-- untyped literal PostgreSQL prefers the string type, so it would take over
-- countlimit_reset('u', '{a,b}') too, a call meant for the store's Reset.
-- These functions have names of their own, one signature each.

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
-- Everything of countlimit's goes, its counters and leases with it; goose's
-- version table stays goose's.
DROP FUNCTION countlimit_most_denied(interval, int);
DROP FUNCTION countlimit_adjust_count(text, text, bigint);
DROP FUNCTION countlimit_lift_penalty(text, text);
DROP FUNCTION countlimit_reset_id(text, text);
DROP VIEW count_limit_status;
DROP FUNCTION countlimit_peek_leases(text, text, timestamptz, bigint);
DROP FUNCTION countlimit_extend_lease(text, text, timestamptz, text, timestamptz);
DROP FUNCTION countlimit_release_lease(text, text, timestamptz, text);
DROP FUNCTION countlimit_acquire(text, text, timestamptz, text, bigint, timestamptz, timestamptz, boolean);
DROP FUNCTION countlimit_purge(timestamptz, int);
DROP FUNCTION countlimit_reset(text, text[]);
DROP FUNCTION countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[], text[]);
DROP FUNCTION countlimit_allow_distinct(text[], text[], timestamptz[], bigint[], bigint[], timestamptz[], timestamptz[], timestamptz[], text[]);
DROP FUNCTION countlimit_allow_batch(text[], text[], int[], int[], timestamptz[], bigint[], bigint[], timestamptz[], timestamptz[], timestamptz[], text[]);
DROP FUNCTION countlimit_claim_keys(text[], text[], timestamptz[], text[]);
DROP FUNCTION countlimit_allow_one(text, text, timestamptz, bigint, bigint, timestamptz, timestamptz, timestamptz, boolean, text);
DROP FUNCTION countlimit_lock_briefly();
DROP TABLE count_limit_lease;
DROP TABLE count_limit;
