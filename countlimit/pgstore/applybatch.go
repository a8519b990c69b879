package pgstore

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/db"
	"github.com/countlimit/countlimit/internal/store/gather"
)

// batched reports whether r goes to the group commit of countlimit_apply
// (countlimit_apply_batch) on a pool: an allow, peek or refund the fast
// path does not take. Reset and leases do not.
func batched(r *driver.Request) bool {
	return !fast(r) && !r.OnLeases() &&
		(r.Op == driver.OpAllow || r.Op == driver.OpPeek || r.Op == driver.OpRefund)
}

// errAlone is the outcome of a call that countlimit_apply_batch did not
// decide, nothing of it written: a row of it is absent, or another
// transaction holds one. Its caller sends it alone (Store.alone), which
// creates rows and waits for locks.
var errAlone = errors.New("pgstore: not decided in its group commit: send it alone")

// alone runs r on the pool as a statement of its own, with a brief
// lock_timeout (lockTimed): errBusy when it gave up waiting for a row.
func (s *Store) alone(ctx context.Context, r *driver.Request) error {
	sent := time.Now()
	err := s.do(ctx, s.timed, r)
	if s.busy(ctx, err, sent) {
		return errBusy
	}
	return err
}

// sendApplies is the group commit of the calls that are not the fast
// path's: one countlimit_apply_batch statement for all of them. A batch of
// one is sent alone. Calls it did not decide get errAlone, and their
// callers send them alone.
func (s *Store) sendApplies(ctx context.Context, calls []*gather.Call) {
	if len(calls) == 1 {
		calls[0].Err = outcome(s.alone(ctx, &calls[0].Req))
		return
	}
	// Ids in lock order; calls of one id in arrival order, as every call
	// of an id may lock the rows of another of its calls.
	order := lockOrder(calls, func(a, b *driver.Request) int { return strings.Compare(a.ID, b.ID) })
	p := db.ApplyBatchParams{
		Ops:       make([]string, len(order)),
		UniqueIds: make([]string, len(order)),
		Nows:      make([]pgtype.Timestamptz, len(order)),
		Ns:        make([]int64, len(order)),
		Firsts:    make([]int32, len(order)+1),
	}
	var a applyChecks
	for j, i := range order {
		r := &calls[i].Req
		p.Ops[j] = r.Op.String()
		p.UniqueIds[j] = r.ID
		p.Nows[j] = timestamptz(r.Now)
		p.Ns[j] = r.N
		p.Firsts[j] = int32(len(a.useTypes) + 1)
		a.add(r)
	}
	p.Firsts[len(order)] = int32(len(a.useTypes) + 1)
	p.UseTypes, p.Limits, p.Begins, p.Lengths, p.Spans = a.useTypes, a.limits, a.begins, a.lengths, a.spans
	p.Blocks, p.Kinds, p.Intervals, p.Bursts = a.blocks, a.kinds, a.intervals, a.bursts
	sent := time.Now()
	rows, err := s.q.ApplyBatch(ctx, s.db, p)
	got := make([]int, len(calls)) // rows per call; -1: not decided
	for _, row := range rows {
		j := int(row.Call) - 1
		if j < 0 || j >= len(order) || got[order[j]] < 0 || row.Ord == 0 && got[order[j]] > 0 {
			err = fmt.Errorf("pgstore: countlimit_apply_batch returned call %d, which it was not sent or had answered", row.Call)
			break
		}
		i := order[j]
		if row.Ord == 0 {
			got[i] = -1
			continue
		}
		got[i]++
		if err = setApplied(&calls[i].Req, row.Ord, row.Allowed, row.Used, row.WindowBegin, row.WindowEnd, row.BlockedUntil, row.FreeAt); err != nil {
			break
		}
	}
	if err == nil {
		for i, c := range calls {
			if got[i] >= 0 && got[i] != len(c.Req.Checks) {
				err = fmt.Errorf("pgstore: countlimit_apply_batch returned %d rows for %d checks", got[i], len(c.Req.Checks))
			}
		}
	}
	done := make([]bool, len(calls))
	for i, c := range calls {
		if got[i] < 0 {
			c.Err = errAlone
		}
		done[i] = true
	}
	settle(calls, done, err, s.busy(ctx, err, sent))
}

// idSeed keys idHash.
var idSeed = maphash.MakeSeed()

// idHash is the hash of a call's id, for the batcher of
// countlimit_apply_batch: every row a call locks is of its id, so two
// batches in flight that share no id share no row.
func idHash(r *driver.Request) uint64 {
	return maphash.String(idSeed, r.ID)
}

// leaseBatched reports whether r goes to the group commit of leases
// (countlimit_lease_batch) on a pool: an Acquire, Release, Extend or Peek
// of one Concurrent rule.
func leaseBatched(r *driver.Request) bool {
	return r.OnLeases() && len(r.Checks) == 1 &&
		(r.Op == driver.OpAcquire || r.Op == driver.OpRelease || r.Op == driver.OpExtend || r.Op == driver.OpPeek)
}

// sendLeases is the group commit of leases: one countlimit_lease_batch
// statement for all the calls. A batch of one is sent alone. Calls it did
// not decide get errAlone, and their callers send them alone.
func (s *Store) sendLeases(ctx context.Context, calls []*gather.Call) {
	if len(calls) == 1 {
		calls[0].Err = outcome(s.alone(ctx, &calls[0].Req))
		return
	}
	s.leaseBatch(ctx, calls)
}

// leaseBatch sends calls as one countlimit_lease_batch statement, however
// many they are.
func (s *Store) leaseBatch(ctx context.Context, calls []*gather.Call) {
	// Ids in lock order; calls of one id in arrival order.
	order := lockOrder(calls, func(a, b *driver.Request) int { return strings.Compare(a.ID, b.ID) })
	n := len(order)
	p := db.LeaseBatchParams{
		Ops:         make([]string, n),
		UseTypes:    make([]string, n),
		UniqueIds:   make([]string, n),
		Nows:        make([]pgtype.Timestamptz, n),
		LeaseTokens: make([]string, n),
		Limits:      make([]int64, n),
		ExpiresAts:  make([]pgtype.Timestamptz, n),
		PenaltyEnds: make([]pgtype.Timestamptz, n),
	}
	for j, i := range order {
		r := &calls[i].Req
		c := &r.Checks[0]
		p.Ops[j] = r.Op.String()
		p.UseTypes[j] = string(c.UseType)
		p.UniqueIds[j] = r.ID
		p.Nows[j] = timestamptz(r.Now)
		p.LeaseTokens[j] = r.Lease
		p.Limits[j] = c.Limit
		p.ExpiresAts[j] = timestamptz(r.Now.Add(c.TTL))
		p.PenaltyEnds[j] = penaltyEnd(r, c)
	}
	sent := time.Now()
	rows, err := s.q.LeaseBatch(ctx, s.db, p)
	got := make([]int, len(calls)) // rows per call; -1: not decided
	for _, row := range rows {
		j := int(row.Call) - 1
		if j < 0 || j >= n || got[order[j]] != 0 {
			err = fmt.Errorf("pgstore: countlimit_lease_batch returned call %d, which it was not sent or had answered", row.Call)
			break
		}
		i := order[j]
		if !row.Done {
			got[i] = -1
			continue
		}
		got[i] = 1
		calls[i].Req.Checks[0].State = state(row.Allowed, row.Used, row.FirstExpiry, row.LastExpiry, row.BlockedUntil)
	}
	done := make([]bool, len(calls))
	for i, c := range calls {
		if err == nil && got[i] == 0 {
			err = fmt.Errorf("pgstore: countlimit_lease_batch did not answer call %d", i+1)
		}
		if got[i] < 0 {
			c.Err = errAlone
		}
		done[i] = true
	}
	settle(calls, done, err, s.busy(ctx, err, sent))
}
