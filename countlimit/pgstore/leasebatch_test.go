package pgstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/pgstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestLeaseGroupCommitIsExact sends 64 concurrent callers at one id of a
// Concurrent rule with 5 slots, each acquiring, extending and releasing
// over and over: never more than 5 are held at once, every denial sees the
// 5 held and is tallied once, every slot is given back, and the calls
// share statements (countlimit_lease_batch).
func TestLeaseGroupCommitIsExact(t *testing.T) {
	pool, tracer := tracedPool(t, testbackend.PoolConfig(t))
	l := countlimit.New(pgstore.New(pool))
	ctx := context.Background()
	const limit = 5
	rule := countlimit.Rule{UseType: storetest.UseType(t, "lease"), Limit: limit, Window: countlimit.Concurrent(time.Hour)}
	// The key's row exists: a new key's Acquire goes alone.
	first, _, err := l.Acquire(ctx, rule, "hot")
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	const callers, each = 64, 8
	var (
		holding, allowed, denied atomic.Int64
		wg                       sync.WaitGroup
		errs                     = make(chan error, callers)
	)
	sending := tracer.n.Load()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				ls, res, err := l.Acquire(ctx, rule, "hot")
				if err != nil {
					errs <- err
					return
				}
				if !res.Allowed {
					denied.Add(1)
					if res.Used != limit {
						errs <- fmt.Errorf("a denied Acquire saw %d held, want %d", res.Used, limit)
						return
					}
					continue
				}
				allowed.Add(1)
				if h := holding.Add(1); h > limit || res.Used < 1 || res.Used > limit {
					errs <- fmt.Errorf("%d held at once (Used %d), limit %d", h, res.Used, limit)
					return
				}
				if err := ls.Extend(ctx); err != nil {
					errs <- err
					return
				}
				holding.Add(-1)
				if err := ls.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	calls := int64(callers * each)
	if allowed.Load()+denied.Load() != calls || allowed.Load() < limit {
		t.Fatalf("%d allowed, %d denied of %d", allowed.Load(), denied.Load(), calls)
	}
	sent := tracer.n.Load() - sending
	if n := calls + 2*allowed.Load(); sent >= n {
		t.Errorf("%d calls sent %d statements: nothing was batched", n, sent)
	} else {
		t.Logf("%d calls in %d statements", n, sent)
	}
	var tally, held int64
	if err := pool.QueryRow(ctx, `SELECT denied_count, (SELECT count(*) FROM count_limit_lease l WHERE l.use_type = c.use_type AND l.unique_id = c.unique_id)
		FROM count_limit c WHERE use_type = $1 AND unique_id = 'hot'`, string(rule.UseType)).Scan(&tally, &held); err != nil {
		t.Fatal(err)
	}
	if tally != denied.Load() || held != 0 {
		t.Errorf("the row tallies %d denials and holds %d leases; callers saw %d denied and released every slot", tally, held, denied.Load())
	}
}

// TestLeaseGroupCommitIsolatesIds holds one id's row in a transaction of
// its own: Acquire, Extend, Release and Peek on other ids, which
// countlimit_lease_batch takes, are all answered while it is held, and the
// held id's Acquire is answered once it is let go.
func TestLeaseGroupCommitIsolatesIds(t *testing.T) {
	pool := testbackend.Postgres(t)
	l := countlimit.New(pgstore.New(pool))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rule := countlimit.Rule{UseType: storetest.UseType(t, "lease"), Limit: 2, Window: countlimit.Concurrent(time.Hour)}
	const ids = 32
	for i := range ids + 1 {
		id := fmt.Sprint("id", i)
		if i == ids {
			id = "held"
		}
		if _, _, err := l.Acquire(ctx, rule, id); err != nil {
			t.Fatal(err)
		}
	}
	b := lockRows(t, pool, rule.UseType, "held")
	heldDone := make(chan error, 1)
	go func() {
		_, res, err := l.Acquire(ctx, rule, "held")
		if err == nil && (!res.Allowed || res.Used != 2) {
			err = fmt.Errorf("%+v, want allowed with 2 held", res)
		}
		heldDone <- err
	}()
	var calls []func() error
	for i := range ids {
		id := fmt.Sprint("id", i)
		calls = append(calls,
			func() error {
				ls, res, err := l.Acquire(ctx, rule, id)
				if err != nil || !res.Allowed {
					return fmt.Errorf("Acquire(%s): %+v, %v", id, res, err)
				}
				if err := ls.Extend(ctx); err != nil {
					return err
				}
				return ls.Release(ctx)
			},
			func() error { _, err := l.Peek(ctx, rule, id); return err },
		)
	}
	answeredWhileHeld(t, b, heldDone, calls)
}
