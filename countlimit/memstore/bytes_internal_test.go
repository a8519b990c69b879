package memstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
)

// TestBytesFollowEntries drives a store through seeded random calls of
// every kind, sweeps and resets, and checks after each that every shard
// accounts exactly what its counters hold (no path forgets to count a
// change or to give back what it dropped) and, in a store so small that it
// is often full, that no shard goes past its share: what a call reckons it
// will add is what it adds.
func TestBytesFollowEntries(t *testing.T) {
	for _, max := range []int64{0, 16 << 10} {
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) { testBytesFollowEntries(t, max) })
	}
}

func testBytesFollowEntries(t *testing.T, max int64) {
	s := New(WithShards(4), WithMaxBytes(max), WithJanitorInterval(0))
	defer s.Close()
	now := time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)
	l := countlimit.New(s, countlimit.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	rules := []countlimit.Rule{
		{UseType: "fixed", Limit: 5, Window: countlimit.Fixed(time.Minute)},
		{UseType: "sliding", Limit: 50, Window: countlimit.Sliding(time.Minute), Block: time.Minute},
		{UseType: "lifetime", Limit: 3, Window: countlimit.Lifetime()},
		{UseType: "job", Limit: 20, Window: countlimit.Concurrent(30 * time.Second)},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var leases []countlimit.Lease
	full := 0
	for step := range 5000 {
		r := rules[rng.IntN(len(rules))]
		id := fmt.Sprint("id-", rng.IntN(40))
		var err error
		op := rng.IntN(10)
		switch {
		case op == 9:
			advance := time.Duration(rng.IntN(20)) * time.Second
			now = now.Add(advance)
			s.start = s.start.Add(-advance) // the janitor's clock moves too
			s.sweep(runtime.Gosched)
		case r.UseType == "job" && op < 5:
			var ls countlimit.Lease
			if ls, _, err = l.Acquire(ctx, r, id); ls.String() != "" {
				leases = append(leases, ls)
			}
		case r.UseType == "job" && len(leases) > 0:
			i := rng.IntN(len(leases))
			if op < 7 {
				err = leases[i].Extend(ctx)
			} else {
				err = leases[i].Release(ctx)
				leases = append(leases[:i], leases[i+1:]...)
			}
			if errors.Is(err, countlimit.ErrLeaseExpired) {
				err = nil
			}
		case r.UseType == "job":
			_, err = l.Peek(ctx, r, id)
		case op < 5:
			_, err = l.AllowN(ctx, r, id, int64(1+rng.IntN(3)))
		case op < 6:
			_, err = l.AllowAll(ctx, id, rules[0], rules[1])
		case op < 7:
			_, err = l.Peek(ctx, r, id)
		case op < 8:
			_, err = l.Refund(ctx, r, id, 1)
		default:
			err = l.Reset(ctx, r, id)
		}
		if errors.Is(err, ErrFull) {
			full++
		} else if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		for i := range s.shards {
			sh := &s.shards[i]
			var sum int64
			for _, m := range [...]map[uint64]*entry{sh.m, sh.old} {
				for _, head := range m {
					for e := head; e != nil; e = e.next {
						if e.size != e.heap() {
							t.Fatalf("step %d: counter (%s, %s) accounts %d bytes, holds %d", step, e.useType, e.id, e.size, e.heap())
						}
						sum += e.size
					}
				}
			}
			if sum != sh.bytes {
				t.Fatalf("step %d: shard %d accounts %d bytes, its counters hold %d", step, i, sh.bytes, sum)
			}
			if max > 0 && sh.used() > s.perBytes {
				t.Fatalf("step %d: shard %d accounts %d bytes, past its share of %d", step, i, sh.used(), s.perBytes)
			}
		}
	}
	if s.Bytes() == 0 {
		t.Fatal("no bytes accounted at the end")
	}
	if max > 0 && full == 0 {
		t.Errorf("the store of %d bytes was never full", max)
	}
	t.Logf("%d calls refused with ErrFull", full)
}
