package countlimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// countingStore counts the calls that reach a store.
type countingStore struct {
	driver.Store
	calls atomic.Int64
}

func (s *countingStore) Do(ctx context.Context, r *driver.Request) error {
	s.calls.Add(1)
	return s.Store.Do(ctx, r)
}

// herd is what a herd of waiters did: the events admitted, the store calls
// it took, the Limiter's clock read before the first call and after the
// last, and the first error other than the end of the run.
type herd struct {
	admitted, calls int64
	start, end      time.Time
	err             error
}

// runHerd has waiters goroutines wait for one id of r, each over and over,
// until events have been admitted between them; the waits then queued end
// with the run's context and count nothing.
func runHerd(l *countlimit.Limiter, store *countingStore, r countlimit.Rule, waiters int, events int64,
	wait func(context.Context, *countlimit.Limiter, countlimit.Rule, string) (countlimit.Result, error)) herd {
	ctx, stop := context.WithTimeout(context.Background(), 5*time.Minute)
	defer stop()
	var (
		admitted atomic.Int64
		errOnce  sync.Once
		h        herd
	)
	calls := store.calls.Load()
	h.start = expose.Now(l)
	var wg sync.WaitGroup
	for range waiters {
		wg.Go(func() {
			for ctx.Err() == nil {
				res, err := wait(ctx, l, r, "partner")
				switch {
				case err == nil && res.Allowed:
					if admitted.Add(1) >= events {
						stop()
					}
				case err == nil:
					errOnce.Do(func() { h.err = fmt.Errorf("Wait returned a denial without an error: %+v", res) })
				case !errors.Is(err, context.Canceled):
					errOnce.Do(func() { h.err = err })
					return
				}
			}
		})
	}
	wg.Wait()
	h.end = expose.Now(l)
	h.admitted, h.calls = admitted.Load(), store.calls.Load()-calls
	if h.err == nil && h.admitted < events {
		h.err = fmt.Errorf("the run ended with %d of %d events admitted: %w", h.admitted, events, ctx.Err())
	}
	return h
}

// limiterWait is Limiter.Wait, as runHerd takes it.
func limiterWait(ctx context.Context, l *countlimit.Limiter, r countlimit.Rule, id string) (countlimit.Result, error) {
	return l.Wait(ctx, r, id)
}

// herdRule admits rate events a second, one at a time (burst 1).
func herdRule(t testing.TB, rate int64) countlimit.Rule {
	return countlimit.Rule{UseType: storetest.UseType(t, "wait.herd"), Limit: rate, Window: countlimit.Smooth(time.Second, 1)}
}

// TestWaitWithoutAHerd: 100 goroutines of one process that Wait on one id
// of a smooth rule, on each store, take at most 10 store calls per event
// admitted (each waiter used to wake at the same RetryAfter and try with
// all the others), and the rule's rate is kept: a burst of 1 admits at
// most one event per interval of the Limiter's clock, plus the first.
func TestWaitWithoutAHerd(t *testing.T) {
	const (
		waiters = 100
		events  = 40
		rate    = 20 // a second: 50 ms apart
	)
	for _, b := range testbackend.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			store := &countingStore{Store: b.Open(t)}
			l := countlimit.New(store)
			h := runHerd(l, store, herdRule(t, rate), waiters, events, limiterWait)
			if h.err != nil {
				t.Fatal(h.err)
			}
			t.Logf("%d store calls for %d events admitted in %v", h.calls, h.admitted, h.end.Sub(h.start))
			if most := int64(h.end.Sub(h.start)/(time.Second/rate)) + 1; h.admitted > most {
				t.Errorf("%d events admitted in %v, at most %d fit a rate of %d/s with a burst of 1", h.admitted, h.end.Sub(h.start), most, rate)
			}
			if per := float64(h.calls) / float64(h.admitted); per > 10 {
				t.Errorf("%d store calls for %d events admitted: %.1f an event, want at most 10", h.calls, h.admitted, per)
			}
		})
	}
}

// retryWait is how Wait waited before its waiters queued: try, sleep the
// RetryAfter told (a millisecond at least), try again. It is the baseline
// of BenchmarkWaitStoreCalls.
func retryWait(ctx context.Context, l *countlimit.Limiter, r countlimit.Rule, id string) (countlimit.Result, error) {
	for {
		res, err := l.Allow(ctx, r, id)
		if err != nil || res.Allowed || res.RetryAfter < 0 {
			return res, err
		}
		t := time.NewTimer(max(res.RetryAfter, time.Millisecond))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return res, ctx.Err()
		}
	}
}

// BenchmarkWaitStoreCalls: 100 goroutines of one process wait on one id
// of a rule of 20 events a second, one at a time (Smooth, burst 1), on
// each store, until b.N events are admitted; calls/event is the store
// calls per event admitted. Side retry is the loop Wait was before its
// waiters queued, side wait is Limiter.Wait. ns/op is about the rule's
// 50 ms. docs/benchmarks.md has the figures.
func BenchmarkWaitStoreCalls(b *testing.B) {
	for _, be := range testbackend.Backends() {
		for _, side := range []struct {
			name string
			wait func(context.Context, *countlimit.Limiter, countlimit.Rule, string) (countlimit.Result, error)
		}{{"retry", retryWait}, {"wait", limiterWait}} {
			b.Run("store="+be.Name+"/side="+side.name, func(b *testing.B) {
				store := &countingStore{Store: be.Open(b)}
				l := countlimit.New(store)
				r := herdRule(b, 20)
				b.ResetTimer()
				h := runHerd(l, store, r, 100, int64(b.N), side.wait)
				b.StopTimer()
				if h.err != nil {
					b.Fatal(h.err)
				}
				b.ReportMetric(float64(h.calls)/float64(h.admitted), "calls/event")
			})
		}
	}
}
