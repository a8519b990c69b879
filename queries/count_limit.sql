-- name: Apply :many
-- Apply runs one driver.Request (allow, peek or refund) as one statement
-- (countlimit_apply, the overload that decides smooth checks too:
-- intervals in microseconds and bursts, 0 for every other kind).
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
    @lengths::bigint[], @spans::bigint[], @blocks::bigint[], @kinds::text[],
    @intervals::bigint[], @bursts::bigint[]
) AS r;

-- name: ApplyBatch :many
-- ApplyBatch is Apply for many calls at once, group commit
-- (countlimit_apply_batch): call i's checks are elements firsts[i] ..
-- firsts[i+1]-1 of the check arrays. A call it did not decide (its rows
-- absent or held) comes back as one row with ord 0: send it to Apply.
SELECT
    r.o_call::int                  AS call,
    r.o_ord::int                   AS ord,
    coalesce(r.o_allowed, false)::boolean AS allowed,
    coalesce(r.o_used, 0)::bigint  AS used,
    r.o_begin::timestamptz         AS window_begin,
    r.o_end::timestamptz           AS window_end,
    r.o_blocked_until::timestamptz AS blocked_until,
    r.o_free_at::timestamptz       AS free_at
FROM countlimit_apply_batch(
    @ops::text[], @unique_ids::text[], @nows::timestamptz[], @ns::bigint[], @firsts::int[],
    @use_types::text[], @limits::bigint[], @begins::timestamptz[],
    @lengths::bigint[], @spans::bigint[], @blocks::bigint[], @kinds::text[],
    @intervals::bigint[], @bursts::bigint[]
) AS r;

-- name: Reset :exec
-- Reset deletes one id's rows for the given use types, leases with them
-- (countlimit_reset).
SELECT countlimit_reset(@unique_id::text, @use_types::text[]);

-- name: PurgeLeases :one
-- PurgeLeases is one batch of a purge's leases (countlimit_purge_leases):
-- at most batch_size expired leases, oldest first, skipping those others
-- hold locked. It returns how many it deleted.
SELECT countlimit_purge_leases(@now::timestamptz, @batch_size::int)::bigint AS deleted;

-- name: PurgeRows :one
-- PurgeRows is one statement of a purge's sweep of count_limit
-- (countlimit_purge_rows): at most batch_size rows whose window, penalty
-- and leases are over, among the 1024 pages from (from_page, from_item),
-- skipping rows live checks hold locked. It returns how many it deleted
-- and where the next statement goes on (next_page -1: the sweep is done).
SELECT r.deleted::bigint AS deleted, coalesce(r.next_page, -1)::bigint AS next_page, coalesce(r.next_item, 0)::int AS next_item
FROM countlimit_purge_rows(@now::timestamptz, @batch_size::int, @from_page::bigint, @from_item::int) AS r;

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
-- SchemaReady reports whether countlimit's schema, at its latest migration,
-- is on the search path: its tables and a function that only the newest
-- migration makes (update it with every migration, docs/RELEASING.md).
-- For 00003_v0_3_0.sql, countlimit_lock_rows, which v0.2.0's schema lacks.
SELECT (to_regclass('count_limit') IS NOT NULL AND to_regclass('count_limit_lease') IS NOT NULL
    AND to_regprocedure('countlimit_lock_rows(text, text[], boolean)') IS NOT NULL
)::boolean AS ready;

-- name: StoreTime :one
-- StoreTime is the server's clock, for Limiters that take "now" from the
-- store (countlimit.WithStoreClock). clock_timestamp(), not now(): inside a
-- caller's transaction now() is the transaction's start.
SELECT clock_timestamp()::timestamptz AS now;
