-- Support queries a DBA runs without scanning the table: every limit of
-- one id (WHERE unique_id = ...; the primary key leads with use_type, so it
-- cannot serve them) and who is blocked now (WHERE blocked, or
-- blocked_until > now()). The view's "blocked" becomes a plain comparison
-- the planner can match to the partial index; its value is unchanged
-- (NULL blocked_until is false either way). Every column of the view gets
-- a comment, and the function's comment no longer points at a file.
-- IF NOT EXISTS: on a large live table a DBA may build the two indexes
-- CONCURRENTLY by hand first (README, "The PostgreSQL schema").

-- +goose Up
CREATE INDEX IF NOT EXISTS count_limit_unique_id_idx ON count_limit (unique_id);
CREATE INDEX IF NOT EXISTS count_limit_blocked_until_idx ON count_limit (blocked_until) WHERE blocked_until IS NOT NULL;

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
COMMENT ON COLUMN count_limit_status.use_type IS 'What is limited, e.g. password.change.';
COMMENT ON COLUMN count_limit_status.unique_id IS 'Who or what is limited: user id, phone, IP, token.';
COMMENT ON COLUMN count_limit_status.window_kind IS 'window (rolling, fixed or calendar), sliding (an exact log of events) or lifetime (never resets).';
COMMENT ON COLUMN count_limit_status.used IS 'Events counted in the current window as of now; 0 once the window has ended.';
COMMENT ON COLUMN count_limit_status.limit_value IS 'The limit the last check applied (each check carries its rule; this records it).';
COMMENT ON COLUMN count_limit_status.remaining IS 'limit_value - used, never below 0: how many more events the last applied limit allows now.';
COMMENT ON COLUMN count_limit_status.denied_count IS 'Denied checks since the row was created (not reset when a window rolls over).';
COMMENT ON COLUMN count_limit_status.window_begin IS 'When the current window began; for sliding windows, the oldest logged event.';
COMMENT ON COLUMN count_limit_status.window_end IS 'When the current window ends (exclusive); NULL for lifetime limits. For sliding windows, the newest event plus the window length.';
COMMENT ON COLUMN count_limit_status.resets_in IS 'How long until the window ends and its count goes, while something is counted; NULL otherwise and for lifetime limits.';
COMMENT ON COLUMN count_limit_status.blocked IS 'True while the id sits in the penalty box: every check is denied until blocked_until.';
COMMENT ON COLUMN count_limit_status.blocked_until IS 'When the penalty ends, while it lasts; NULL when not blocked.';
COMMENT ON COLUMN count_limit_status.blocked_for IS 'How long the penalty still lasts; NULL when not blocked.';
COMMENT ON COLUMN count_limit_status.updated_at IS 'When the row was last written (database clock).';

COMMENT ON FUNCTION countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[]) IS
    'countlimit: one atomic check of one id against one or more rules (allow, peek or refund), taking row locks in key order (existing rows, then new ones, then writes) so that concurrent checks cannot deadlock. Reset is a plain DELETE.';

-- +goose Down
COMMENT ON COLUMN count_limit_status.use_type IS NULL;
COMMENT ON COLUMN count_limit_status.unique_id IS NULL;
COMMENT ON COLUMN count_limit_status.window_kind IS NULL;
COMMENT ON COLUMN count_limit_status.used IS NULL;
COMMENT ON COLUMN count_limit_status.limit_value IS NULL;
COMMENT ON COLUMN count_limit_status.remaining IS NULL;
COMMENT ON COLUMN count_limit_status.denied_count IS NULL;
COMMENT ON COLUMN count_limit_status.window_begin IS NULL;
COMMENT ON COLUMN count_limit_status.window_end IS NULL;
COMMENT ON COLUMN count_limit_status.resets_in IS NULL;
COMMENT ON COLUMN count_limit_status.blocked IS NULL;
COMMENT ON COLUMN count_limit_status.blocked_until IS NULL;
COMMENT ON COLUMN count_limit_status.blocked_for IS NULL;
COMMENT ON COLUMN count_limit_status.updated_at IS NULL;

COMMENT ON FUNCTION countlimit_apply(text, text, timestamptz, bigint, text[], bigint[], timestamptz[], bigint[], bigint[], bigint[]) IS
    'countlimit: one atomic check of one id against one or more rules (allow, peek or refund). See migrations/00001_count_limit.sql.';

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

DROP INDEX count_limit_blocked_until_idx;
DROP INDEX count_limit_unique_id_idx;
