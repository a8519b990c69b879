package pgstore_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/pgstore"
)

// Classes of calls, in the order a mixed step sends them: the fast path's
// group commit, countlimit_apply_batch's, countlimit_lease_batch's, and
// the calls sent alone (Reset).
const (
	classFast = iota
	classApply
	classLease
	classAlone
)

func classOf(r *driver.Request) int {
	switch {
	case fast(r):
		return classFast
	case pgstore.Batched(r):
		return classApply
	case pgstore.LeaseBatched(r):
		return classLease
	}
	return classAlone
}

// separable reports whether a step's calls can go as the pool sends them
// when they come at once, each class in a batch of its own, one class
// after another (fast, apply, lease, alone), and still be decided in the step's
// order wherever it matters: no call goes before an earlier call of its
// id.
func separable(reqs []*driver.Request) bool {
	for i, a := range reqs {
		for _, b := range reqs[i+1:] {
			if a.ID == b.ID && classOf(b) < classOf(a) {
				return false
			}
		}
	}
	return true
}

// mixedSends returns a Path.Do that sends a step's calls as concurrent
// callers reach the pool: the fast ones as one group commit, then the
// others that countlimit_apply_batch takes as one group commit, and those
// it did not decide alone, in the step's order, then the leases as one
// group commit of countlimit_lease_batch likewise, then the rest alone.
// The path skips the steps that are not separable.
func mixedSends(s *pgstore.Store) func(context.Context, []*driver.Request) error {
	return func(ctx context.Context, reqs []*driver.Request) error {
		var by [4][]*driver.Request
		for _, r := range reqs {
			by[classOf(r)] = append(by[classOf(r)], r)
		}
		if len(by[classFast]) > 0 {
			if err := s.AllowBatchForTest(ctx, by[classFast]); err != nil {
				return err
			}
		}
		for _, g := range []struct {
			class int
			name  string
			send  func(context.Context, []*driver.Request) []error
		}{
			{classApply, "countlimit_apply_batch", s.ApplyBatchEachForTest},
			{classLease, "countlimit_lease_batch", s.LeaseBatchEachForTest},
		} {
			if len(by[g.class]) == 0 {
				continue
			}
			for i, err := range g.send(ctx, by[g.class]) {
				if errors.Is(err, pgstore.ErrAlone) {
					err = s.AloneForTest(ctx, by[g.class][i])
				}
				if err != nil {
					return fmt.Errorf("call %d of %s: %w", i, g.name, err)
				}
			}
		}
		for _, r := range by[classAlone] {
			if err := s.Do(ctx, r); err != nil {
				return err
			}
		}
		return nil
	}
}
