-- Concurrency limits: leases in count_limit_lease. Every statement is one
-- call of a function of migrations/ (00001_countlimit.sql; LeaseBatch, 00002_v0_2_0.sql), where the SQL,
-- its locking and its comments live.

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
-- reports whether it was live at now (countlimit_release_lease).
SELECT r.o_allowed::boolean AS allowed, r.o_used::bigint AS used, r.o_first_expiry::timestamptz AS first_expiry,
    r.o_last_expiry::timestamptz AS last_expiry, r.o_blocked_until::timestamptz AS blocked_until
FROM countlimit_release_lease(@use_type::text, @unique_id::text, @now::timestamptz, @lease_token::text) AS r;

-- name: ExtendLease :one
-- ExtendLease moves the expiry of a live lease to expires_at and reports
-- whether it did (countlimit_extend_lease).
SELECT r.o_allowed::boolean AS allowed, r.o_used::bigint AS used, r.o_first_expiry::timestamptz AS first_expiry,
    r.o_last_expiry::timestamptz AS last_expiry, r.o_blocked_until::timestamptz AS blocked_until
FROM countlimit_extend_lease(@use_type::text, @unique_id::text, @now::timestamptz, @lease_token::text,
    @expires_at::timestamptz) AS r;

-- name: PeekLeases :one
-- PeekLeases answers what AcquireLease would, writing and locking nothing
-- (countlimit_peek_leases).
SELECT r.o_allowed::boolean AS allowed, r.o_used::bigint AS used, r.o_first_expiry::timestamptz AS first_expiry,
    r.o_last_expiry::timestamptz AS last_expiry, r.o_blocked_until::timestamptz AS blocked_until
FROM countlimit_peek_leases(@use_type::text, @unique_id::text, @now::timestamptz, @limit_value::bigint) AS r;

-- name: LeaseBatch :many
-- LeaseBatch is the four above for many calls at once, group commit
-- (countlimit_lease_batch, of migrations/00002_v0_2_0.sql). A call it did
-- not decide (its key row absent or held, or its lease row held) comes back
-- as one row with done false: send it alone.
SELECT
    r.o_call::int                  AS call,
    r.o_done::boolean              AS done,
    coalesce(r.o_allowed, false)::boolean AS allowed,
    coalesce(r.o_used, 0)::bigint  AS used,
    r.o_first_expiry::timestamptz  AS first_expiry,
    r.o_last_expiry::timestamptz   AS last_expiry,
    r.o_blocked_until::timestamptz AS blocked_until
FROM countlimit_lease_batch(
    @ops::text[], @use_types::text[], @unique_ids::text[], @nows::timestamptz[], @lease_tokens::text[],
    @limits::bigint[], @expires_ats::timestamptz[], @penalty_ends::timestamptz[]
) AS r;
