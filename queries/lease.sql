-- Concurrency limits: leases in count_limit_lease (migrations/00004). Each
-- statement that adds or extends leases locks the key's count_limit row
-- first, as countlimit_acquire does, and touches that one key's leases only
-- after, so the parent row is the key's one lock and lease statements cannot
-- deadlock with checks or with each other. The count(*) >= 0 conditions
-- make PostgreSQL take that lock before anything else runs. ReleaseLease,
-- which only deletes a lease, takes no row lock first (see it below);
-- nor does PurgeExpired (queries/count_limit.sql), which skips rows that
-- others hold locked.
--
-- A statement's snapshot is taken before it waits for the lock. Its
-- verdict does not depend on it: a lease row is found, and rechecked, at
-- its latest version. The state it reports besides the verdict (live
-- leases, their first and last expiry, the penalty) is read from that
-- snapshot with the statement's own change applied: exact unless another
-- call on the key committed while this one waited.

-- name: AcquireLease :one
-- AcquireLease takes a lease when a slot is free, or counts the denial and
-- sets the penalty; see countlimit_acquire for why it is a function.
SELECT
    r.o_allowed::boolean           AS allowed,
    r.o_used::bigint               AS used,
    r.o_first_expiry::timestamptz  AS first_expiry,
    r.o_last_expiry::timestamptz   AS last_expiry,
    r.o_blocked_until::timestamptz AS blocked_until
FROM countlimit_acquire(
    @use_type::text, @unique_id::text, @now::timestamptz, @lease_token::text,
    @limit_value::bigint, @expires_at::timestamptz, sqlc.narg(penalty_end)::timestamptz,
    @lazy_tally::boolean
) AS r;

-- name: ReleaseLease :one
-- ReleaseLease deletes the lease named lease_token, live or expired, and
-- reports whether it was live at now. It is the one lease statement that
-- does not lock the key's row: it only frees, so it cannot make a count
-- wrong, and Releases then never queue behind the Acquires of a busy key.
-- It waits only for another statement that holds the same lease row (an
-- Extend of it, or a Reset).
WITH gone AS (
    DELETE FROM count_limit_lease l
    WHERE l.use_type = @use_type::text AND l.unique_id = @unique_id::text AND l.lease_token = @lease_token::text
    RETURNING l.expires_at
)
SELECT
    coalesce((SELECT g.expires_at > @now::timestamptz FROM gone g), false)::boolean AS allowed,
    h.held::bigint AS used,
    h.first_expiry::timestamptz AS first_expiry,
    h.last_expiry::timestamptz AS last_expiry,
    (SELECT c.blocked_until FROM count_limit c
        WHERE c.use_type = @use_type::text AND c.unique_id = @unique_id::text AND c.blocked_until > @now::timestamptz)::timestamptz AS blocked_until
FROM (
    SELECT count(*) AS held, min(l.expires_at) AS first_expiry, max(l.expires_at) AS last_expiry
    FROM count_limit_lease l
    WHERE l.use_type = @use_type::text AND l.unique_id = @unique_id::text AND l.expires_at > @now::timestamptz
      AND l.lease_token <> @lease_token::text
) h;

-- name: ExtendLease :one
-- ExtendLease moves the expiry of the lease named lease_token to
-- expires_at when the lease is live at now, and raises the key's
-- lease_until to match so that purges keep the key; it reports whether it
-- did. It writes nothing when the lease is gone or expired.
WITH parent AS (
    SELECT c.blocked_until
    FROM count_limit c
    WHERE c.use_type = @use_type::text AND c.unique_id = @unique_id::text
    FOR NO KEY UPDATE
), extended AS (
    UPDATE count_limit_lease l SET expires_at = @expires_at::timestamptz
    WHERE l.use_type = @use_type::text AND l.unique_id = @unique_id::text AND l.lease_token = @lease_token::text
      AND l.expires_at > @now::timestamptz
      AND (SELECT count(*) FROM parent) >= 0
    RETURNING l.lease_token
), raised AS (
    UPDATE count_limit c SET
        lease_until = greatest(c.lease_until, @expires_at::timestamptz),
        updated_at  = now()
    WHERE c.use_type = @use_type::text AND c.unique_id = @unique_id::text
      AND EXISTS (SELECT FROM extended)
)
SELECT
    x.done::boolean AS allowed,
    h.held::bigint AS used,
    h.first_expiry::timestamptz AS first_expiry,
    h.last_expiry::timestamptz AS last_expiry,
    (SELECT p.blocked_until FROM parent p WHERE p.blocked_until > @now::timestamptz)::timestamptz AS blocked_until
FROM (SELECT EXISTS (SELECT FROM extended) AS done) x
CROSS JOIN LATERAL (
    SELECT count(*) AS held,
        min(CASE WHEN x.done AND l.lease_token = @lease_token::text THEN @expires_at::timestamptz ELSE l.expires_at END) AS first_expiry,
        max(CASE WHEN x.done AND l.lease_token = @lease_token::text THEN @expires_at::timestamptz ELSE l.expires_at END) AS last_expiry
    FROM count_limit_lease l
    WHERE l.use_type = @use_type::text AND l.unique_id = @unique_id::text AND l.expires_at > @now::timestamptz
) h;

-- name: PeekLeases :one
-- PeekLeases answers what AcquireLease would, writing and locking nothing.
SELECT
    (NOT b.blocked AND h.held < @limit_value::bigint)::boolean AS allowed,
    h.held::bigint AS used,
    h.first_expiry::timestamptz AS first_expiry,
    h.last_expiry::timestamptz AS last_expiry,
    (CASE WHEN b.blocked THEN c.blocked_until END)::timestamptz AS blocked_until
FROM (SELECT) AS one
LEFT JOIN count_limit c ON c.use_type = @use_type::text AND c.unique_id = @unique_id::text
CROSS JOIN LATERAL (SELECT coalesce(c.blocked_until > @now::timestamptz, false) AS blocked) b
CROSS JOIN LATERAL (
    SELECT count(*) AS held, min(l.expires_at) AS first_expiry, max(l.expires_at) AS last_expiry
    FROM count_limit_lease l
    WHERE l.use_type = @use_type::text AND l.unique_id = @unique_id::text AND l.expires_at > @now::timestamptz
) h;
