-- name: Apply :many
-- Apply runs one countlimit.Request (allow, peek or refund) as one statement.
SELECT
    r.o_ord::int                   AS ord,
    r.o_allowed::boolean           AS allowed,
    r.o_used::bigint               AS used,
    r.o_begin::timestamptz         AS window_begin,
    r.o_end::timestamptz           AS window_end,
    r.o_blocked_until::timestamptz AS blocked_until,
    r.o_free_at::timestamptz       AS free_at
FROM countlimit_apply(
    @op::text, @unique_id::text, @now::timestamptz, @n::bigint,
    @use_types::text[], @limits::bigint[], @begins::timestamptz[],
    @lengths::bigint[], @spans::bigint[], @blocks::bigint[]
) AS r;

-- name: Reset :exec
-- Reset deletes one id's rows, locking them first in key order as every
-- statement does, so that resetting several rules cannot deadlock.
DELETE FROM count_limit c
USING (
    SELECT l.use_type, l.unique_id
    FROM count_limit l
    WHERE l.unique_id = @unique_id::text AND l.use_type = ANY(@use_types::text[])
    ORDER BY l.use_type COLLATE "C"
    FOR UPDATE
) d
WHERE c.use_type = d.use_type AND c.unique_id = d.unique_id;

-- name: PurgeExpired :one
-- PurgeExpired deletes at most batch_size expired leases and at most
-- batch_size rows whose window, penalty and leases are over, skipping rows
-- that live checks hold locked, and returns how many of both it deleted
-- (a row whose leases this batch deletes goes in the next). A row's
-- lease_until is read at its latest version, so a row whose key an Acquire
-- or Extend has just written is kept.
WITH leases AS (
    SELECT l.use_type, l.unique_id, l.lease_token
    FROM count_limit_lease l
    WHERE l.expires_at <= @now::timestamptz
    ORDER BY l.expires_at
    LIMIT @batch_size::int
    FOR UPDATE SKIP LOCKED
), gone_leases AS (
    DELETE FROM count_limit_lease l
    USING leases d
    WHERE l.use_type = d.use_type AND l.unique_id = d.unique_id AND l.lease_token = d.lease_token
    RETURNING 1
), doomed AS (
    SELECT c.use_type, c.unique_id
    FROM count_limit c
    WHERE c.end_time <= @now::timestamptz
      AND (c.blocked_until IS NULL OR c.blocked_until <= @now::timestamptz)
      AND (c.lease_until IS NULL OR c.lease_until <= @now::timestamptz)
      -- A row goes once its leases have: its cascade then waits for no
      -- lease another purge (or an open Release) holds, so purges running
      -- at once cannot deadlock. A lease taken since the snapshot raised
      -- lease_until, which is checked again on the locked row.
      AND NOT EXISTS (SELECT FROM count_limit_lease l
          WHERE l.use_type = c.use_type AND l.unique_id = c.unique_id)
    ORDER BY c.end_time
    LIMIT @batch_size::int
    FOR UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM count_limit c
    USING doomed d
    WHERE c.use_type = d.use_type AND c.unique_id = d.unique_id
    RETURNING 1
)
SELECT ((SELECT count(*) FROM gone_leases) + (SELECT count(*) FROM gone))::bigint AS deleted;

-- name: StatusNearestLimit :many
-- The ids nearest their limits now (a full scan of the view: an audit tool).
SELECT * FROM count_limit_status
WHERE used > 0
ORDER BY remaining, used DESC, use_type, unique_id
LIMIT @max_rows::int;

-- name: StatusMostDenied :many
SELECT * FROM count_limit_status
WHERE denied_count > 0
ORDER BY denied_count DESC, use_type, unique_id
LIMIT @max_rows::int;

-- name: StatusBlocked :many
SELECT * FROM count_limit_status
WHERE blocked
ORDER BY blocked_until DESC, use_type, unique_id
LIMIT @max_rows::int;

-- name: SchemaReady :one
-- SchemaReady reports whether countlimit's table and function are on the
-- search path.
SELECT (to_regclass('count_limit') IS NOT NULL AND EXISTS (
    SELECT 1 FROM pg_catalog.pg_proc p
    JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
    WHERE p.proname = 'countlimit_apply' AND n.nspname = ANY(current_schemas(false))
))::boolean AS ready;

-- name: StoreTime :one
-- StoreTime is the server's clock, for Limiters that take "now" from the
-- store (countlimit.WithStoreClock). clock_timestamp(), not now(): inside a
-- caller's transaction now() is the transaction's start.
SELECT clock_timestamp()::timestamptz AS now;
