package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/db"
)

// lease runs a request of a Concurrent check as one statement (see
// queries/lease.sql) on the pool, connection or transaction d: a call
// alone, or one countlimit_lease_batch did not decide (sendLeases).
func (s *Store) lease(ctx context.Context, d DBTX, r *driver.Request) error {
	if len(r.Checks) != 1 {
		return fmt.Errorf("pgstore: %s of a Concurrent rule takes 1 check, got %d", r.Op, len(r.Checks))
	}
	c := &r.Checks[0]
	var (
		st  driver.State
		err error
	)
	switch r.Op {
	case driver.OpAcquire:
		var row db.AcquireLeaseRow
		row, err = s.q.AcquireLease(ctx, d, db.AcquireLeaseParams{
			UseType:    string(c.UseType),
			UniqueID:   r.ID,
			Now:        timestamptz(r.Now),
			LeaseToken: r.Lease,
			LimitValue: c.Limit,
			ExpiresAt:  timestamptz(r.Now.Add(c.TTL)),
			PenaltyEnd: penaltyEnd(r, c),
			LazyTally:  autocommit(d),
		})
		st = state(row.Allowed, row.Used, row.FirstExpiry, row.LastExpiry, row.BlockedUntil)
	case driver.OpRelease:
		var row db.ReleaseLeaseRow
		row, err = s.q.ReleaseLease(ctx, d, db.ReleaseLeaseParams{
			UseType:    string(c.UseType),
			UniqueID:   r.ID,
			LeaseToken: r.Lease,
			Now:        timestamptz(r.Now),
		})
		st = state(row.Allowed, row.Used, row.FirstExpiry, row.LastExpiry, row.BlockedUntil)
	case driver.OpExtend:
		var row db.ExtendLeaseRow
		row, err = s.q.ExtendLease(ctx, d, db.ExtendLeaseParams{
			UseType:    string(c.UseType),
			UniqueID:   r.ID,
			LeaseToken: r.Lease,
			Now:        timestamptz(r.Now),
			ExpiresAt:  timestamptz(r.Now.Add(c.TTL)),
		})
		st = state(row.Allowed, row.Used, row.FirstExpiry, row.LastExpiry, row.BlockedUntil)
	case driver.OpPeek:
		var row db.PeekLeasesRow
		row, err = s.q.PeekLeases(ctx, d, db.PeekLeasesParams{
			UseType:    string(c.UseType),
			UniqueID:   r.ID,
			LimitValue: c.Limit,
			Now:        timestamptz(r.Now),
		})
		st = state(row.Allowed, row.Used, row.FirstExpiry, row.LastExpiry, row.BlockedUntil)
	default:
		return fmt.Errorf("pgstore: %s of a Concurrent rule is not a store operation", r.Op)
	}
	if err != nil {
		return err
	}
	c.State = st
	return nil
}

// autocommit reports whether every statement sent on d is a transaction of
// its own: d is a pool. A *pgx.Conn may be inside a transaction its owner
// began with Exec.
func autocommit(d DBTX) bool {
	switch d := d.(type) {
	case *stmts:
		return autocommit(d.d)
	case *pgxpool.Pool, *lockTimed:
		return true
	}
	return false
}
