package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
)

// TestCallsWithoutADeadlineShareOneBound: a Store sends the calls whose
// context has neither a deadline nor a cancel (context.Background, a
// worker's) with a deadline shared by those sent within BoundFresh of each
// other, each at most MaxCall and at least MaxCall - BoundFresh after its
// send, instead of a context.WithDeadline a call (a timer set and stopped
// each time: BenchmarkSmoothCPUVersusRedisRate). A call with a deadline
// of its own is sent with it (TestCallsEndBeforeTheirRepliesExpire).
func TestCallsWithoutADeadlineShareOneBound(t *testing.T) {
	t.Parallel()
	h, l := deadlineLimiter(t)
	rule := countlimit.Rule{UseType: storetest.UseType(t, "bound"), Limit: 1 << 30, Window: countlimit.Smooth(time.Hour, 1<<30)}
	const calls = 200
	start := time.Now()
	for i := range calls {
		if _, err := l.Allow(context.Background(), rule, versusIDs[i]); err != nil {
			t.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	h.mu.Lock()
	deadlines, sent := h.deadlines, h.sent
	h.mu.Unlock()
	if len(deadlines) < calls {
		t.Fatalf("the hook saw %d commands for %d calls", len(deadlines), calls)
	}
	distinct := map[time.Time]bool{}
	for i, d := range deadlines {
		if d.IsZero() {
			t.Fatalf("command %d was sent without a deadline", i)
		}
		// The hook reads the clock after the Store's send did: a second
		// of slack below (the exact bounds are bound.go's own test's).
		if ahead := d.Sub(sent[i]); ahead > redisstore.MaxCall || ahead < redisstore.MaxCall-redisstore.BoundFresh-time.Second {
			t.Fatalf("command %d: deadline %v after its send, want within [%v, %v]", i, ahead, redisstore.MaxCall-redisstore.BoundFresh, redisstore.MaxCall)
		}
		distinct[d] = true
	}
	// A new bound at most every BoundFresh, and one more where the calls
	// began partway through one.
	if most := 2 + int(elapsed/redisstore.BoundFresh); len(distinct) > most {
		t.Errorf("%d calls in %v were sent with %d deadlines, want at most %d: one shared a BoundFresh (%v)", calls, elapsed, len(distinct), most, redisstore.BoundFresh)
	}
}
