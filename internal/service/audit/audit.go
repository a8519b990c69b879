// Package audit reads the count_limit_status view for `countlimit top`:
// the counters nearest their limits, the most denied and those in the
// penalty box, as of the database's clock.
package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/db"
)

// Status is one row of the count_limit_status view: a counter as of the
// database's clock, for audits and support.
type Status struct {
	UseType      string
	UniqueID     string
	WindowKind   string // "window", "sliding", "lifetime", "concurrent" or "smooth"
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

// maxRows bounds n, as pgstore.MaxBatchSize bounds a purge's batch.
const maxRows = 1 << 20

var q = db.New()

// NearestLimit returns up to n counters with the least room left now.
// It scans the whole table: an audit tool, not a hot path.
func NearestLimit(ctx context.Context, d db.DBTX, n int) ([]Status, error) {
	return statuses(q.StatusNearestLimit(ctx, d, db.StatusNearestLimitParams{MaxRows: rows(n)}))
}

// MostDenied returns up to n counters with the most denials.
func MostDenied(ctx context.Context, d db.DBTX, n int) ([]Status, error) {
	return statuses(q.StatusMostDenied(ctx, d, db.StatusMostDeniedParams{MaxRows: rows(n)}))
}

// Blocked returns up to n counters in the penalty box now.
func Blocked(ctx context.Context, d db.DBTX, n int) ([]Status, error) {
	return statuses(q.StatusBlocked(ctx, d, db.StatusBlockedParams{MaxRows: rows(n)}))
}

func statuses(rows []db.CountLimitStatus, err error) ([]Status, error) {
	if err != nil {
		return nil, fmt.Errorf("status: %w", driver.Unavailable(err))
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

// timeOf is t, or the zero time for NULL, infinity and the epoch (the
// view's "none").
func timeOf(t pgtype.Timestamptz) time.Time {
	if !t.Valid || t.InfinityModifier != pgtype.Finite || t.Time.Equal(time.Unix(0, 0)) {
		return time.Time{}
	}
	return t.Time
}

func duration(iv pgtype.Interval) time.Duration {
	if !iv.Valid {
		return 0
	}
	return time.Duration(iv.Microseconds)*time.Microsecond +
		time.Duration(iv.Days)*24*time.Hour + time.Duration(iv.Months)*30*24*time.Hour
}

// rows clamps a row count to what a query takes.
func rows(n int) int32 { return int32(min(max(n, 0), maxRows)) }
