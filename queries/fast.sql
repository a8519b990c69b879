-- The fast path: one rule whose window is not sliding (rolling, fixed,
-- calendar, lifetime, CheckLimit). Each statement is one call of a
-- function the migrations create (countlimit_allow_one and the batches;
-- on the pool, the _pooled statements in front of them; docs/schema.sql
-- has them all): functions plan their statements with the key whatever
-- the table's statistics say.

-- name: AllowOne :one
-- AllowOne counts n events of one rule for one id, or tallies the denial
-- and sets the penalty (countlimit_allow_one). With skip_locked, a row
-- another transaction holds locked comes back busy, nothing written. No
-- row means: send it again (its row was created concurrently). window_kind
-- is the rule's kind for count_limit_status, empty when unknown (CheckLimit).
SELECT r.o_busy::boolean AS busy, r.o_allowed::boolean AS allowed, r.o_used::bigint AS used,
    r.o_window_begin::timestamptz AS window_begin, r.o_window_end::timestamptz AS window_end,
    r.o_blocked_until::timestamptz AS blocked_until
FROM countlimit_allow_one(@use_type::text, @unique_id::text, @now::timestamptz, @n::bigint, @limit_value::bigint,
    @begin_time::timestamptz, sqlc.narg(window_end)::timestamptz, sqlc.narg(penalty_end)::timestamptz, @skip_locked::boolean,
    nullif(@window_kind::text, '')) AS r;

-- name: AllowOnePooled :one
-- AllowOnePooled is AllowOne with skip_locked, as pgstore's pool sends it
-- (countlimit_allow_one_pooled): a row that exists and is free is decided
-- by a statement of its own, smaller than countlimit_allow_one's.
SELECT r.o_busy::boolean AS busy, r.o_allowed::boolean AS allowed, r.o_used::bigint AS used,
    r.o_window_begin::timestamptz AS window_begin, r.o_window_end::timestamptz AS window_end,
    r.o_blocked_until::timestamptz AS blocked_until
FROM countlimit_allow_one_pooled(@use_type::text, @unique_id::text, @now::timestamptz, @n::bigint, @limit_value::bigint,
    @begin_time::timestamptz, sqlc.narg(window_end)::timestamptz, sqlc.narg(penalty_end)::timestamptz,
    nullif(@window_kind::text, '')) AS r;

-- name: AllowBatch :many
-- AllowBatch is AllowOne for many calls at once, group commit
-- (countlimit_allow_batch_pooled: countlimit_allow_batch after a statement
-- of its own for rows that all exist, are free and have room for every
-- call): keys given once each, sorted; calls refer to
-- their key by its 1-based position (key_of) and are numbered within a key
-- in arrival order (seq). One row per call it applied, or found busy; the
-- calls of a key created concurrently are not returned: send them again.
SELECT r.o_key_of::int AS key_of, r.o_seq::int AS seq, r.o_busy::boolean AS busy, r.o_allowed::boolean AS allowed,
    r.o_used::bigint AS used, r.o_window_begin::timestamptz AS window_begin, r.o_window_end::timestamptz AS window_end,
    r.o_blocked_until::timestamptz AS blocked_until
FROM countlimit_allow_batch_pooled(@use_types::text[], @unique_ids::text[], @key_of::int[], @seq::int[], @nows::timestamptz[],
    @ns::bigint[], @limits::bigint[], @begins::timestamptz[], @window_ends::timestamptz[], @penalty_ends::timestamptz[],
    array_replace(@kinds::text[], '', NULL)) AS r;

-- name: AllowBatchDistinct :many
-- AllowBatchDistinct is AllowBatch for calls whose keys are all different
-- (countlimit_allow_distinct_pooled: countlimit_allow_distinct after a
-- statement of its own for rows that all exist and are free), sorted by
-- key; a call is named by its 1-based position (key_of).
SELECT r.o_key_of::int AS key_of, r.o_busy::boolean AS busy, r.o_allowed::boolean AS allowed,
    r.o_used::bigint AS used, r.o_window_begin::timestamptz AS window_begin, r.o_window_end::timestamptz AS window_end,
    r.o_blocked_until::timestamptz AS blocked_until
FROM countlimit_allow_distinct_pooled(@use_types::text[], @unique_ids::text[], @nows::timestamptz[], @ns::bigint[],
    @limits::bigint[], @begins::timestamptz[], @window_ends::timestamptz[], @penalty_ends::timestamptz[],
    array_replace(@kinds::text[], '', NULL)) AS r;
