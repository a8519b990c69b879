package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/gather"
)

// AllowBatchForTest sends reqs, in this order, as one group commit and
// writes the state of each request it applied: what a batch of concurrent
// calls does. Its error names each call that failed, was busy (ErrBusy)
// or was left for a retry.
func (s *Store) AllowBatchForTest(ctx context.Context, reqs []*driver.Request) error {
	var errs []error
	for i, err := range s.AllowBatchEachForTest(ctx, reqs) {
		if err != nil {
			errs = append(errs, fmt.Errorf("call %d: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// AllowBatchEachForTest is AllowBatchForTest with each call's outcome:
// nil for a call applied (its state written), ErrBusy for one whose row
// another transaction holds, an error saying so for one left for a
// retry, or the batch's error.
func (s *Store) AllowBatchEachForTest(ctx context.Context, reqs []*driver.Request) []error {
	return eachForTest(ctx, reqs, s.sendBatch)
}

// eachForTest sends reqs as one batch with send and returns each call's
// outcome, writing the states of those it decided.
func eachForTest(ctx context.Context, reqs []*driver.Request, send gather.Send) []error {
	calls := make([]*gather.Call, len(reqs))
	for i, r := range reqs {
		calls[i] = &gather.Call{Req: *r}
		calls[i].Req.Checks = append([]driver.Check(nil), r.Checks...)
	}
	send(ctx, calls)
	errs := make([]error, len(reqs))
	for i, c := range calls {
		switch {
		case c.Err != nil:
			errs[i] = c.Err
		case c.Retried():
			errs[i] = errors.New("left for a retry")
		default:
			copy(reqs[i].Checks, c.Req.Checks)
		}
	}
	return errs
}

// AllowOneSkippingLockedForTest runs r, which takes the fast path, as
// countlimit_allow_one with skip_locked, alone (oneSkips): the statement
// the pool sends after countlimit_allow_one_pooled's first one found the
// row absent or held, here for every row, free ones included.
func (s *Store) AllowOneSkippingLockedForTest(ctx context.Context, r *driver.Request) error {
	return s.allowOne(ctx, s.db, r, oneSkips)
}

// ErrBusy is the outcome of a batched call whose row another transaction
// holds locked.
var ErrBusy = errBusy

// QueuedForTest reports how many calls wait for a group commit.
func (s *Store) QueuedForTest() int { return s.gather.Queued() }

// ApplyForTest runs r through countlimit_apply, as sliding windows and
// AllowAll do, whatever its rule.
func (s *Store) ApplyForTest(ctx context.Context, r *driver.Request) error {
	return interpretError(s.apply(ctx, s.db, r))
}

// UnpreparedForTest returns a Store on pool that sends its statements as
// it does behind a pooler (cache_describe, and its pipelines on pgconn),
// wherever pool's connections go: for benchmarks to compare with the
// prepared statements of a direct connection.
func UnpreparedForTest(pool *pgxpool.Pool) *Store {
	s := New(pool)
	s.db.mode.Store(int32(pgx.QueryExecModeCacheDescribe))
	return s
}

// StatementModeForTest says how s sends its statements, once decided:
// "own" (the connections' mode), or pgx's mode's name.
func (s *Store) StatementModeForTest() string {
	switch m := s.db.mode.Load(); m {
	case modeUndecided:
		return "undecided"
	case modeOwn:
		return "own"
	default:
		return pgx.QueryExecMode(m).String()
	}
}

// ApplyBatchEachForTest sends reqs, in this order, as one group commit of
// countlimit_apply_batch and writes the state of each request it decided:
// nil for those, ErrAlone for one it left to be sent alone, or the batch's
// error.
func (s *Store) ApplyBatchEachForTest(ctx context.Context, reqs []*driver.Request) []error {
	return eachForTest(ctx, reqs, s.sendApplies)
}

// ErrAlone is the outcome of a call countlimit_apply_batch did not decide.
var ErrAlone = errAlone

// AloneForTest sends r on the pool as a statement of its own, as the
// pool sends a call its group commit did not decide.
func (s *Store) AloneForTest(ctx context.Context, r *driver.Request) error {
	return interpretError(s.alone(ctx, r))
}

// Batched reports whether the pool sends r to countlimit_apply_batch.
func Batched(r *driver.Request) bool { return batched(r) }

// LeaseBatchEachForTest sends reqs, in this order, as one
// countlimit_lease_batch statement (one call too, which the pool sends
// alone), as ApplyBatchEachForTest does.
func (s *Store) LeaseBatchEachForTest(ctx context.Context, reqs []*driver.Request) []error {
	return eachForTest(ctx, reqs, s.leaseBatch)
}

// LeaseBatched reports whether the pool sends r to countlimit_lease_batch.
func LeaseBatched(r *driver.Request) bool { return leaseBatched(r) }
