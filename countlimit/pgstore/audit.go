package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/countlimit/countlimit/internal/db"
)

// Status is one row of the count_limit_status view: a counter as of the
// database's clock, for audits and support.
type Status struct {
	UseType      string
	UniqueID     string
	WindowKind   string // "window", "sliding", "lifetime" or "concurrent"
	Used         int64
	Limit        int64 // the limit last applied
	Remaining    int64
	Denied       int64
	WindowBegin  time.Time
	WindowEnd    time.Time     // zero for lifetime counters
	ResetsIn     time.Duration // 0 when nothing is counted or for lifetime
	Blocked      bool
	BlockedUntil time.Time
	BlockedFor   time.Duration
	UpdatedAt    time.Time
}

// NearestLimit returns up to n counters with the least room left now.
// It scans the whole table: an audit tool, not a hot path.
func (s *Store) NearestLimit(ctx context.Context, n int) ([]Status, error) {
	return statuses(s.q.StatusNearestLimit(ctx, s.db, db.StatusNearestLimitParams{MaxRows: rows(n)}))
}

// MostDenied returns up to n counters with the most denials.
func (s *Store) MostDenied(ctx context.Context, n int) ([]Status, error) {
	return statuses(s.q.StatusMostDenied(ctx, s.db, db.StatusMostDeniedParams{MaxRows: rows(n)}))
}

// Blocked returns up to n counters in the penalty box now.
func (s *Store) Blocked(ctx context.Context, n int) ([]Status, error) {
	return statuses(s.q.StatusBlocked(ctx, s.db, db.StatusBlockedParams{MaxRows: rows(n)}))
}

func statuses(rows []db.CountLimitStatus, err error) ([]Status, error) {
	if err != nil {
		return nil, fmt.Errorf("pgstore: status: %w", interpretError(err))
	}
	out := make([]Status, len(rows))
	for i, r := range rows {
		out[i] = Status{
			UseType: r.UseType, UniqueID: r.UniqueID, WindowKind: r.WindowKind,
			Used: r.Used, Limit: r.LimitValue, Remaining: r.Remaining, Denied: r.DeniedCount,
			WindowBegin: timeOf(r.WindowBegin), WindowEnd: timeOf(r.WindowEnd), ResetsIn: duration(r.ResetsIn),
			Blocked: r.Blocked, BlockedUntil: timeOf(r.BlockedUntil), BlockedFor: duration(r.BlockedFor),
			UpdatedAt: timeOf(r.UpdatedAt),
		}
	}
	return out, nil
}

func duration(iv pgtype.Interval) time.Duration {
	if !iv.Valid {
		return 0
	}
	return time.Duration(iv.Microseconds)*time.Microsecond +
		time.Duration(iv.Days)*24*time.Hour + time.Duration(iv.Months)*30*24*time.Hour
}

// rows clamps a row count to what a query takes.
func rows(n int) int32 { return int32(min(max(n, 0), MaxBatchSize)) }
