package countlimit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// recorder keeps every event an Observer is told, in order.
type recorder struct {
	mu        sync.Mutex
	decisions []countlimit.Decision
	calls     []countlimit.StoreCall
}

func (r *recorder) observer() countlimit.Observer {
	return countlimit.Observer{
		Decided: func(d countlimit.Decision) {
			r.mu.Lock()
			r.decisions = append(r.decisions, d)
			r.mu.Unlock()
		},
		StoreCalled: func(c countlimit.StoreCall) {
			r.mu.Lock()
			r.calls = append(r.calls, c)
			r.mu.Unlock()
		},
	}
}

// take returns what was recorded since the last take, and forgets it.
func (r *recorder) take() ([]countlimit.Decision, []countlimit.StoreCall) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, c := r.decisions, r.calls
	r.decisions, r.calls = nil, nil
	return d, c
}

// TestObserverDecisions: every call that decides (Allow, AllowN,
// CheckLimit, Acquire; AllowAll once per rule, each with the call's
// verdict) is told once, with its use type, cost and verdict; calls that
// decide nothing (Peek, Refund, Reset, Release), bad input and failing
// calls are not.
func TestObserverDecisions(t *testing.T) {
	t.Parallel()
	f := newFlaky(t)
	var rec recorder
	l := countlimit.New(f, countlimit.WithObserver(rec.observer()))
	ctx := context.Background()
	two := countlimit.Rule{UseType: "sms", Limit: 2, Window: countlimit.Fixed(time.Minute)}
	day := countlimit.Rule{UseType: "day", Limit: 10, Window: countlimit.Fixed(24 * time.Hour)}
	slots := countlimit.Rule{UseType: "export", Limit: 1, Window: countlimit.Concurrent(time.Minute)}
	d := func(ut countlimit.UseType, allowed bool) countlimit.Decision {
		return countlimit.Decision{UseType: ut, Allowed: allowed}
	}
	var lease countlimit.Lease
	steps := []struct {
		name string
		call func() error
		want []countlimit.Decision
	}{
		{"Allow", func() error { _, err := l.Allow(ctx, two, "u1"); return err },
			[]countlimit.Decision{d("sms", true)}},
		{"AllowN over the limit", func() error { _, err := l.AllowN(ctx, two, "u1", 2); return err },
			[]countlimit.Decision{d("sms", false)}},
		{"Peek", func() error { _, err := l.Peek(ctx, two, "u1"); return err }, nil},
		{"Refund", func() error { _, err := l.Refund(ctx, two, "u1", 1); return err }, nil},
		{"AllowAll allowed", func() error { _, err := l.AllowAll(ctx, "u1", two, day); return err },
			[]countlimit.Decision{d("sms", true), d("day", true)}},
		{"AllowAll denied by one rule", func() error {
			if _, err := l.Allow(ctx, two, "u1"); err != nil {
				return err
			}
			_, err := l.AllowAll(ctx, "u1", day, two)
			return err
		}, []countlimit.Decision{d("sms", true), d("day", false), d("sms", false)}},
		{"CheckLimit", func() error {
			_, err := l.CheckLimit(ctx, "pin", "u1", 1, time.Hour, time.Time{})
			return err
		}, []countlimit.Decision{d("pin", true)}},
		{"Acquire", func() error { var err error; lease, _, err = l.Acquire(ctx, slots, "u1"); return err },
			[]countlimit.Decision{d("export", true)}},
		{"Acquire denied", func() error { _, _, err := l.Acquire(ctx, slots, "u1"); return err },
			[]countlimit.Decision{d("export", false)}},
		{"Release", func() error { return lease.Release(ctx) }, nil},
		{"Reset", func() error { return l.Reset(ctx, two, "u1") }, nil},
	}
	for _, s := range steps {
		if err := s.call(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		got, _ := rec.take()
		if !slices.Equal(got, s.want) {
			t.Errorf("%s: decisions %+v, want %+v", s.name, got, s.want)
		}
	}

	if _, err := l.Allow(ctx, countlimit.Rule{UseType: "sms", Limit: -1, Window: countlimit.Fixed(time.Minute)}, "u1"); !errors.Is(err, countlimit.ErrInvalid) {
		t.Fatalf("Allow of a bad rule: %v, want ErrInvalid", err)
	}
	f.down.Store(true)
	if _, err := l.Allow(ctx, two, "u2"); !errors.Is(err, countlimit.ErrUnavailable) {
		t.Fatalf("Allow on a store that is down: %v, want ErrUnavailable", err)
	}
	if got, _ := rec.take(); len(got) != 0 {
		t.Errorf("a bad rule and a failing store: decisions %+v, want none", got)
	}
}

// slowStore passes calls to a memstore after a pause.
type slowStore struct {
	mem   *memstore.Store
	pause time.Duration
}

func (s slowStore) Do(ctx context.Context, r *driver.Request) error {
	time.Sleep(s.pause)
	return s.mem.Do(ctx, r)
}

// TestObserverStoreCalls: every call to the store is told with its
// operation and how long the store took (at least the pause a slow store
// makes), and says whether the store failed it, ran out of the store
// timeout, or held the id locked; a caller giving up is no store failure.
func TestObserverStoreCalls(t *testing.T) {
	t.Parallel()
	mem := memstore.New(memstore.WithJanitorInterval(0))
	defer mem.Close()
	var rec recorder
	ctx := context.Background()

	l := countlimit.New(slowStore{mem, 2 * time.Millisecond}, countlimit.WithObserver(rec.observer()))
	if _, err := l.Allow(ctx, perMinute, "u1"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Peek(ctx, perMinute, "u1"); err != nil {
		t.Fatal(err)
	}
	if err := l.Reset(ctx, perMinute, "u1"); err != nil {
		t.Fatal(err)
	}
	_, calls := rec.take()
	if len(calls) != 3 {
		t.Fatalf("3 calls told %d store calls: %+v", len(calls), calls)
	}
	for i, op := range []driver.Op{driver.OpAllow, driver.OpPeek, driver.OpReset} {
		c := calls[i]
		if c.Op != op || c.Took < 2*time.Millisecond || c.Err != nil || c.Failed || c.TimedOut {
			t.Errorf("store call %d = %+v, want %v, that took at least the store's 2ms pause, no error", i, c, op)
		}
	}

	f := newFlaky(t)
	f.down.Store(true)
	l = countlimit.New(f, countlimit.WithObserver(rec.observer()))
	if _, err := l.Allow(ctx, perMinute, "u1"); !errors.Is(err, countlimit.ErrUnavailable) {
		t.Fatalf("Allow on a store that is down: %v", err)
	}
	f.down.Store(false)
	f.stall.Store(true)
	l = countlimit.New(f, countlimit.WithObserver(rec.observer()), countlimit.WithStoreTimeout(time.Millisecond))
	if _, err := l.Allow(ctx, perMinute, "u1"); !errors.Is(err, countlimit.ErrUnavailable) {
		t.Fatalf("Allow on a stalled store: %v", err)
	}
	gone, cancel := context.WithCancel(ctx)
	go func() { time.Sleep(time.Millisecond); cancel() }()
	l = countlimit.New(f, countlimit.WithObserver(rec.observer()))
	if _, err := l.Allow(gone, perMinute, "u1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Allow given up by its caller: %v", err)
	}
	l = countlimit.New(lockedStore{}, countlimit.WithObserver(rec.observer()), countlimit.WithStoreTimeout(time.Millisecond))
	if _, err := l.Allow(ctx, perMinute, "u1"); !errors.Is(err, countlimit.ErrLocked) {
		t.Fatalf("Allow of a locked id: %v", err)
	}
	_, calls = rec.take()
	want := []struct {
		name             string
		failed, timedOut bool
		is               error
	}{
		{"down", true, false, errDown},
		{"stalled past the store timeout", true, true, context.DeadlineExceeded},
		{"given up by the caller", false, false, context.Canceled},
		{"locked", false, false, countlimit.ErrLocked},
	}
	if len(calls) != len(want) {
		t.Fatalf("%d failing calls told %d store calls: %+v", len(want), len(calls), calls)
	}
	for i, w := range want {
		c := calls[i]
		if c.Op != driver.OpAllow || c.Failed != w.failed || c.TimedOut != w.timedOut || !errors.Is(c.Err, w.is) || !errors.Is(c.Err, countlimit.ErrUnavailable) {
			t.Errorf("%s: store call %+v, want failed %v, timed out %v, an ErrUnavailable that is %v", w.name, c, w.failed, w.timedOut, w.is)
		}
	}
}

// TestObserverBreakerAndFallback: the observer is told each store call the
// breaker let through, in step with Stats, which counts the calls the open
// breaker refused; OnChange tells the breaker's changes; a call the
// fallback store answered is a decision, counted in Stats.
func TestObserverBreakerAndFallback(t *testing.T) {
	t.Parallel()
	f := newFlaky(t)
	clock := newStubClock()
	fallback := memstore.New(memstore.WithJanitorInterval(0))
	defer fallback.Close()
	var rec recorder
	var onChange []string
	l := countlimit.New(f, countlimit.WithClock(clock.now), countlimit.WithObserver(rec.observer()),
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{
			Failures: 2, CoolDown: time.Second,
			OnChange: func(from, to countlimit.BreakerState) { onChange = append(onChange, from.String()+"→"+to.String()) },
		}))
	ctx := context.Background()
	allow := func() { _, _ = l.Allow(ctx, perMinute, "u1") }
	f.down.Store(true)
	allow()
	allow() // opens
	allow() // rejected
	clock.advance(time.Second)
	allow() // the probe fails
	allow() // rejected
	f.down.Store(false)
	clock.advance(time.Second)
	allow() // the probe closes it
	_, calls := rec.take()
	if !slices.Equal(onChange, []string{"closed→open", "open→half-open", "half-open→open", "open→half-open", "half-open→closed"}) {
		t.Errorf("OnChange saw %q", onChange)
	}
	if store, failed, rejected, fallbacks := kinds(calls); store != 4 || failed != 3 || rejected != 2 || fallbacks != 0 {
		t.Errorf("%d store calls (%d failed), %d rejected, %d fallbacks; want 4 calls, 3 failed, and 2 rejections", store, failed, rejected, fallbacks)
	}

	// The order of options does not matter: the breaker set before the
	// observer tells it its store calls too.
	l = countlimit.New(f, countlimit.WithClock(clock.now), countlimit.WithFallback(fallback),
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 1, CoolDown: time.Second}),
		countlimit.WithObserver(rec.observer()))
	f.down.Store(true)
	for range 3 {
		if res, err := l.Allow(ctx, perMinute, "u1"); err != nil || !res.Allowed {
			t.Fatalf("Allow with a fallback: %+v, %v", res, err)
		}
	}
	if _, err := l.Refund(ctx, perMinute, "u1", 1); !errors.Is(err, countlimit.ErrUnavailable) {
		t.Fatalf("Refund never falls back: %v", err)
	}
	decisions, calls := rec.take()
	if store, failed, rejected, fallbacks := kinds(calls); fallbacks != 3 || rejected != 3 || store != 1 || failed != 1 || len(decisions) != 3 {
		t.Errorf("%d store calls (%d failed), %d rejected, %d fallbacks, %d decisions; want 3 fallbacks, each a decision, 3 rejections (2 Allow, 1 Refund) and 1 failed store call",
			store, failed, rejected, fallbacks, len(decisions))
	}
}

// kinds sorts the store calls an Observer was told: calls to the store
// (and how many failed), calls the open breaker refused, and calls the
// fallback store answered.
func kinds(calls []countlimit.StoreCall) (store, failed, rejected, fallbacks int) {
	for _, c := range calls {
		switch {
		case c.Fallback:
			if c.Err == nil {
				fallbacks++
			}
		case errors.Is(c.Err, countlimit.ErrCircuitOpen):
			rejected++
		default:
			store++
			if c.Failed {
				failed++
			}
		}
	}
	return store, failed, rejected, fallbacks
}

// TestObserverManyGoroutines: 64 goroutines on one key of a limit of 100
// are told exactly 100 allowed and the rest denied, and one store call
// each, under -race.
func TestObserverManyGoroutines(t *testing.T) {
	t.Parallel()
	mem := memstore.New(memstore.WithJanitorInterval(0))
	defer mem.Close()
	var allowed, denied, calls, breaker atomic.Int64
	l := countlimit.New(mem, countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{
		OnChange: func(_, _ countlimit.BreakerState) { breaker.Add(1) },
	}), countlimit.WithObserver(countlimit.Observer{
		Decided: func(d countlimit.Decision) {
			if d.Allowed {
				allowed.Add(1)
			} else {
				denied.Add(1)
			}
		},
		StoreCalled: func(countlimit.StoreCall) { calls.Add(1) },
	}))
	const goroutines, each, limit = 64, 50, 100
	rule := countlimit.Rule{UseType: "api", Limit: limit, Window: countlimit.Fixed(time.Hour)}
	var wg sync.WaitGroup
	var errs atomic.Int64
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				var err error
				if i%2 == 0 {
					_, err = l.Allow(context.Background(), rule, "shared")
				} else {
					_, err = l.Allow(context.Background(), rule, fmt.Sprintf("own-%d", g))
				}
				if err != nil {
					errs.Add(1)
				}
			}
		})
	}
	wg.Wait()
	shared := goroutines * each / 2
	own := goroutines * min(each/2, limit)
	if errs.Load() != 0 || allowed.Load() != int64(limit+own) || denied.Load() != int64(shared-limit) ||
		calls.Load() != goroutines*each || breaker.Load() != 0 {
		t.Errorf("%d errors, %d allowed, %d denied, %d store calls, %d breaker changes; want 0, %d, %d, %d, 0",
			errs.Load(), allowed.Load(), denied.Load(), calls.Load(), breaker.Load(), limit+own, shared-limit, goroutines*each)
	}
}

// TestObserverAllocatesNothing: an observer whose funcs allocate nothing
// adds no allocation to a call through a memstore, allowed or denied, with
// or without the failure options that need no per-call context.
func TestObserverAllocatesNothing(t *testing.T) {
	var n atomic.Int64
	o := countlimit.Observer{
		Decided:     func(countlimit.Decision) { n.Add(1) },
		StoreCalled: func(countlimit.StoreCall) { n.Add(1) },
	}
	fallback := memstore.New(memstore.WithJanitorInterval(0))
	defer fallback.Close()
	for _, tt := range []struct {
		name  string
		limit int64
		opts  []countlimit.Option
	}{
		{"allowed", expose.MaxLimit, nil},
		{"denied", 0, nil},
		{"breaker and fallback", expose.MaxLimit, []countlimit.Option{
			countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{}), countlimit.WithFallback(fallback)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := memstore.New(memstore.WithJanitorInterval(0))
			defer s.Close()
			l := countlimit.New(s, append(tt.opts, countlimit.WithObserver(o))...)
			r := countlimit.Rule{UseType: "api", Limit: tt.limit, Window: countlimit.Fixed(time.Hour)}
			ctx := context.Background()
			if _, err := l.Allow(ctx, r, "user-1"); err != nil {
				t.Fatal(err)
			}
			before := n.Load()
			allocs := testing.AllocsPerRun(1000, func() {
				if _, err := l.Allow(ctx, r, "user-1"); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 || n.Load() == before {
				t.Errorf("%v allocations per call (the observer was told %d events), want 0", allocs, n.Load()-before)
			}
		})
	}
}
