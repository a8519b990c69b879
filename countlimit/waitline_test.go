package countlimit_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// gatedTime is a clock whose sleepers wake only when the test moves it,
// so that tests of waiters in line are told in steps, not in durations.
type gatedTime struct {
	mu       sync.Mutex
	now      time.Time
	sleepers map[*time.Time]chan struct{} // by the instant each wakes at
}

func newGatedTime() *gatedTime {
	return &gatedTime{now: time.Date(2026, 11, 27, 10, 0, 30, 0, time.UTC), sleepers: map[*time.Time]chan struct{}{}}
}

func (g *gatedTime) Now() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.now
}

func (g *gatedTime) sleep(ctx context.Context, d time.Duration) error {
	g.mu.Lock()
	until, wake := g.now.Add(d), make(chan struct{})
	g.sleepers[&until] = wake
	g.mu.Unlock()
	select {
	case <-wake:
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		delete(g.sleepers, &until)
		g.mu.Unlock()
		return ctx.Err()
	}
}

// advance moves the clock by d and wakes the sleepers whose sleep it ends.
func (g *gatedTime) advance(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.now = g.now.Add(d)
	for until, wake := range g.sleepers {
		if !until.After(g.now) {
			close(wake)
			delete(g.sleepers, until)
		}
	}
}

// asleep is how many sleep.
func (g *gatedTime) asleep() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.sleepers)
}

// lineLimiter is a Limiter over a counting memstore on a gated clock,
// without jitter, so that a sleep ends when the clock reaches RetryAfter.
func lineLimiter(t *testing.T) (*countlimit.Limiter, *tryCounter, *gatedTime) {
	t.Helper()
	store := &tryCounter{Store: memstore.New(memstore.WithJanitorInterval(0))}
	g := newGatedTime()
	l := countlimit.New(store, countlimit.WithClock(g.Now))
	countlimit.SetSleep(l, g.sleep)
	countlimit.SetJitter(l, nil)
	return l, store, g
}

// lineRule allows one event a minute, in fixed windows.
var lineRule = countlimit.Rule{UseType: "partner.api", Limit: 1, Window: countlimit.Fixed(time.Minute)}

// asleepFirst fills lineRule's window for u1 at 10:00:30 and starts a Wait
// on ctx that stands first in line, asleep until the window ends at 10:01
// (2 store calls so far).
func asleepFirst(t *testing.T, ctx context.Context, l *countlimit.Limiter, g *gatedTime) <-chan waitOutcome {
	t.Helper()
	if res, err := l.Allow(context.Background(), lineRule, "u1"); err != nil || !res.Allowed {
		t.Fatalf("Allow: %+v, %v", res, err)
	}
	w := goWait(t, ctx, l, lineRule, 1, 1)
	eventually(t, "the first waiter asleep", func() bool { return g.asleep() == 1 })
	return w
}

// eventually waits for cond, which the goroutines of a test bring about,
// and fails t if it never holds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never came about: %s", what)
		}
	}
}

// waitOutcome is what a Wait started by goWait returned.
type waitOutcome struct {
	res countlimit.Result
	err error
}

// goWait starts a WaitN and waits until it stands in the line for r and
// id as its waiters-th waiter.
func goWait(t *testing.T, ctx context.Context, l *countlimit.Limiter, r countlimit.Rule, n int64, waiters int) <-chan waitOutcome {
	t.Helper()
	out := make(chan waitOutcome, 1)
	go func() {
		res, err := l.WaitN(ctx, r, "u1", n)
		out <- waitOutcome{res, err}
	}()
	eventually(t, "a waiter in line", func() bool { _, in := countlimit.WaitLines(l, r, "u1"); return in == waiters })
	return out
}

// receive is what a wait sent, or fails t when it sends nothing for long:
// a line that stalls.
func receive(t *testing.T, w <-chan waitOutcome) waitOutcome {
	t.Helper()
	select {
	case o := <-w:
		return o
	case <-time.After(30 * time.Second):
		t.Fatal("a wait never ended: the line stalled")
		return waitOutcome{}
	}
}

// Waiters take their turns in the order they came, whatever their weight
// (one of weight 1 behind one of 3 waits, though it would fit the room the
// 3 does not), and only the first asks the store: each asks once when its
// turn comes (denied, the room gone to the one before) and once when it
// wakes. The line goes with its last waiter.
func TestWaitersWaitInLine(t *testing.T) {
	ctx := context.Background()
	l, store, g := lineLimiter(t)
	r := countlimit.Rule{UseType: "partner.api", Limit: 3, Window: countlimit.Fixed(time.Minute)}
	if res, err := l.AllowN(ctx, r, "u1", 3); err != nil || !res.Allowed {
		t.Fatalf("AllowN(3): %+v, %v", res, err)
	}
	weights := []int64{1, 3, 1, 3, 2} // no two in a row fit one window of 3
	var waits []<-chan waitOutcome
	for i, n := range weights {
		waits = append(waits, goWait(t, ctx, l, r, n, i+1))
		if i == 0 {
			eventually(t, "the first waiter asleep", func() bool { return g.asleep() == 1 })
		}
	}
	var order []int
	for range weights {
		g.advance(time.Minute) // the window in which the first waiter sleeps ends
		var done int
		eventually(t, "a wait to end", func() bool {
			for i, w := range waits {
				if !slices.Contains(order, i) && len(w) == 1 {
					done = i
					return true
				}
			}
			return false
		})
		order = append(order, done)
		if o := <-waits[done]; o.err != nil || !o.res.Allowed || o.res.Used != weights[done] {
			t.Fatalf("waiter %d (n=%d): %+v, %v; want allowed, alone in its window", done, weights[done], o.res, o.err)
		}
		if len(order) < len(weights) {
			eventually(t, "the next waiter asleep", func() bool { return g.asleep() == 1 })
		}
	}
	if want := []int{0, 1, 2, 3, 4}; !slices.Equal(order, want) {
		t.Errorf("waiters allowed in the order %v, want %v", order, want)
	}
	// The AllowN, then 2 calls a waiter: the denial that put it to sleep
	// and the try that was allowed when it woke.
	if calls, want := store.tries.Load(), int64(1+2*len(weights)); calls != want {
		t.Errorf("%d store calls, want %d", calls, want)
	}
	if lines, _ := countlimit.WaitLines(l, r, "u1"); lines != 0 {
		t.Errorf("%d lines left after the last waiter", lines)
	}
}

// A waiter whose context ends in line counts nothing, asks nothing and
// leaves: the waiter behind it takes its turn in its place. One whose
// context ends as it sleeps, first in line, hands its turn on at once.
func TestCancelledWaiterDoesNotStallTheLine(t *testing.T) {
	ctx := context.Background()
	for _, cancelFirst := range []bool{false, true} {
		name := "in line"
		if cancelFirst {
			name = "first, asleep"
		}
		t.Run(name, func(t *testing.T) {
			l, store, g := lineLimiter(t)
			r := lineRule
			bctx, cancelB := context.WithCancel(ctx)
			defer cancelB()
			b := asleepFirst(t, bctx, l, g)
			cctx, cancelC := context.WithCancel(ctx)
			defer cancelC()
			c := goWait(t, cctx, l, r, 1, 2)
			d := goWait(t, ctx, l, r, 1, 3)
			gone, left := cancelC, c
			if cancelFirst {
				gone, left = cancelB, b
			}
			gone()
			o := <-left
			if !errors.Is(o.err, context.Canceled) || o.res.Allowed || o.res.RetryAfter != 30*time.Second {
				t.Fatalf("the cancelled wait: %+v, %v; want the first waiter's denial (RetryAfter 30s) and context.Canceled", o.res, o.err)
			}
			// The Allow and the first waiter's denial; when the first is
			// cancelled, c's turn comes at once: it asks, and sleeps.
			calls, rest := int64(2), []<-chan waitOutcome{b, d}
			if cancelFirst {
				calls, rest = 3, []<-chan waitOutcome{c, d}
				eventually(t, "the next waiter asleep", func() bool { return g.asleep() == 1 })
			}
			if got, _ := countlimit.WaitLines(l, r, "u1"); got != 1 || store.tries.Load() != calls {
				t.Errorf("after the cancel: %d lines, %d store calls; want 1 and %d", got, store.tries.Load(), calls)
			}
			// The two left are allowed one per window: the first when it
			// wakes, the next when it wakes after its denial.
			for i, w := range rest {
				g.advance(time.Minute)
				if o := receive(t, w); o.err != nil || !o.res.Allowed || o.res.Used != 1 {
					t.Fatalf("waiter %d behind the cancelled one: %+v, %v; want allowed", i, o.res, o.err)
				}
				if i == 0 {
					eventually(t, "the last waiter asleep", func() bool { return g.asleep() == 1 })
				}
			}
			if got := store.tries.Load(); got != calls+3 {
				t.Errorf("%d store calls, want %d: the cancelled waiter asked after it left", got, calls+3)
			}
			if lines, _ := countlimit.WaitLines(l, r, "u1"); lines != 0 {
				t.Errorf("%d lines left after the last waiter", lines)
			}
		})
	}
}

// A deadline that comes before the sleep of the waiter first in line ends
// a wait at once, without a store call: on arrival, or as the first goes
// to sleep. A deadline that it does not pass waits in line.
func TestWaitBehindASleepPastTheDeadline(t *testing.T) {
	ctx := context.Background()
	l, store, g := lineLimiter(t)
	r := lineRule
	b := asleepFirst(t, ctx, l, g)
	soon, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := l.Wait(soon, r, "u1")
	if !errors.Is(err, context.DeadlineExceeded) || res.Allowed || res.RetryAfter != 30*time.Second {
		t.Fatalf("Wait with 10 s left behind a 30 s sleep: %+v, %v; want the first waiter's denial and DeadlineExceeded", res, err)
	}
	c := goWait(t, ctx, l, r, 1, 2)
	later, cancel2 := context.WithTimeout(ctx, 45*time.Second)
	defer cancel2()
	d := goWait(t, later, l, r, 1, 3) // fits the first sleep, not the next
	if calls := store.tries.Load(); calls != 2 {
		t.Errorf("%d store calls, want 2 (the Allow, the first waiter's denial)", calls)
	}
	g.advance(30 * time.Second) // b is allowed at 10:01; c is denied and sleeps 60 s, past d's deadline
	if o := receive(t, b); o.err != nil || !o.res.Allowed {
		t.Fatalf("the first waiter: %+v, %v", o.res, o.err)
	}
	o := receive(t, d)
	if !errors.Is(o.err, context.DeadlineExceeded) || o.res.Allowed || o.res.RetryAfter != time.Minute {
		t.Errorf("the waiter whose deadline the second sleep passes: %+v, %v; want c's denial and DeadlineExceeded", o.res, o.err)
	}
	g.advance(time.Minute)
	if o := receive(t, c); o.err != nil || !o.res.Allowed {
		t.Errorf("the second waiter: %+v, %v", o.res, o.err)
	}
	if calls := store.tries.Load(); calls != 5 {
		t.Errorf("%d store calls, want 5: a waiter gone past its deadline asked", calls)
	}
}

// The store failing the try of the first in line ends the waits behind it
// with the same error, at once: they would each have waited for the same
// failure in turn. Waits that come after start a line afresh.
func TestStoreFailureEndsTheLine(t *testing.T) {
	ctx := context.Background()
	l, store, g := lineLimiter(t)
	r := lineRule
	b := asleepFirst(t, ctx, l, g)
	c, d := goWait(t, ctx, l, r, 1, 2), goWait(t, ctx, l, r, 1, 3)
	store.failing.Store(true)
	g.advance(time.Minute)
	var first error
	for i, w := range []<-chan waitOutcome{b, c, d} {
		o := receive(t, w)
		if !errors.Is(o.err, countlimit.ErrUnavailable) || o.res.Allowed {
			t.Errorf("waiter %d: %+v, %v; want ErrUnavailable", i, o.res, o.err)
		}
		if i == 0 {
			first = o.err
		} else if o.err != first {
			t.Errorf("waiter %d: %v; want the first waiter's error, %v", i, o.err, first)
		}
	}
	if calls := store.tries.Load(); calls != 3 {
		t.Errorf("%d store calls, want 3: the waiters behind the failure asked", calls)
	}
	if lines, _ := countlimit.WaitLines(l, r, "u1"); lines != 0 {
		t.Errorf("%d lines left after the failure", lines)
	}
	store.failing.Store(false)
	if res, err := l.Wait(ctx, r, "u1"); err != nil || !res.Allowed {
		t.Errorf("a Wait once the store is back: %+v, %v", res, err)
	}
}

// WaitAcquire calls wait in a line of their own, as WaitN calls do: one
// takes the slot when the lease expires, the next asks then and sleeps to
// the expiry of the lease just taken.
func TestWaitAcquireWaitsInLine(t *testing.T) {
	ctx := context.Background()
	l, store, g := lineLimiter(t)
	r := countlimit.Rule{UseType: "export.slot", Limit: 1, Window: countlimit.Concurrent(time.Minute)}
	if _, res, err := l.Acquire(ctx, r, "u1"); err != nil || !res.Allowed {
		t.Fatalf("Acquire: %+v, %v", res, err)
	}
	type acquired struct {
		ls  countlimit.Lease
		err error
	}
	var outs []chan acquired
	for i := range 3 {
		out := make(chan acquired, 1)
		go func() {
			ls, _, err := l.WaitAcquire(ctx, r, "u1")
			out <- acquired{ls, err}
		}()
		eventually(t, "a waiter in line", func() bool { _, in := countlimit.WaitLines(l, r, "u1"); return in == i+1 })
		if i == 0 {
			eventually(t, "the first waiter asleep", func() bool { return g.asleep() == 1 })
		}
		outs = append(outs, out)
	}
	for i, out := range outs {
		g.advance(time.Minute)
		select {
		case o := <-out:
			if o.err != nil || o.ls.ID() != "u1" {
				t.Fatalf("WaitAcquire %d: %+v, %v", i, o.ls, o.err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("WaitAcquire %d never ended: the line stalled", i)
		}
		if i < len(outs)-1 {
			eventually(t, "the next waiter asleep", func() bool { return g.asleep() == 1 })
		}
	}
	if calls := store.tries.Load(); calls != 1+2*3 {
		t.Errorf("%d store calls, want 7", calls)
	}
}

// Two rules of one use type count in one state, but their waiters wait in
// two lines: a Wait on the looser rule is not held behind a waiter on the
// stricter one, and is allowed at once where there is room for it.
func TestRulesOfOneUseTypeWaitInTwoLines(t *testing.T) {
	ctx := context.Background()
	l, _, g := lineLimiter(t)
	strict := countlimit.Rule{UseType: "post.create", Limit: 1, Window: countlimit.Fixed(time.Hour)}
	loose := countlimit.Rule{UseType: "post.create", Limit: 2, Window: countlimit.Fixed(time.Hour)}
	if _, err := l.Allow(ctx, strict, "u1"); err != nil {
		t.Fatal(err)
	}
	b := goWait(t, ctx, l, strict, 1, 1)
	eventually(t, "the strict rule's waiter asleep", func() bool { return g.asleep() == 1 })
	if res, err := l.Wait(ctx, loose, "u1"); err != nil || !res.Allowed || res.Used != 2 {
		t.Errorf("Wait on the looser rule: %+v, %v; want allowed at once, Used 2", res, err)
	}
	if lines, in := countlimit.WaitLines(l, strict, "u1"); lines != 1 || in != 1 {
		t.Errorf("%d lines, %d waiters on the strict rule; want 1 and 1", lines, in)
	}
	g.advance(time.Hour)
	if o := receive(t, b); o.err != nil || !o.res.Allowed {
		t.Errorf("the strict rule's waiter: %+v, %v", o.res, o.err)
	}
}

// leftContext's deadline is always left away: a deadline that does not
// come closer while a test runs slowly.
type leftContext struct {
	context.Context
	left time.Duration
}

func (c leftContext) Deadline() (time.Time, bool) { return time.Now().Add(c.left), true }

// A waiter sleeps past its RetryAfter by a jitter below a twentieth of
// it and below 5 ms, and never past its context's deadline; the jitter
// drawn is random below that bound.
func TestWaitJitterIsBounded(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		what  string
		rule  countlimit.Rule
		left  time.Duration // the context's time left; 0: no deadline
		retry time.Duration // the denial's RetryAfter
		most  time.Duration // the jitter's bound
	}{
		{"a 30 s wait", countlimit.Rule{UseType: "a", Limit: 1, Window: countlimit.Fixed(time.Minute)}, 0, 30 * time.Second, 5 * time.Millisecond},
		{"a 50 ms wait", countlimit.Rule{UseType: "a", Limit: 20, Window: countlimit.Smooth(time.Second, 1)}, 0, 50 * time.Millisecond, 2500 * time.Microsecond},
		{"a 30 s wait 2 ms short of the deadline", countlimit.Rule{UseType: "a", Limit: 1, Window: countlimit.Fixed(time.Minute)}, 30*time.Second + 2*time.Millisecond, 30 * time.Second, 2 * time.Millisecond},
	} {
		l, ft := fakeLimiter(t)
		var bounds []time.Duration
		countlimit.SetJitter(l, func(most time.Duration) time.Duration {
			bounds = append(bounds, most)
			return most - 1
		})
		if _, err := l.Allow(ctx, tc.rule, "u1"); err != nil {
			t.Fatal(err)
		}
		wctx := context.Context(ctx)
		if tc.left > 0 {
			wctx = leftContext{ctx, tc.left}
		}
		if res, err := l.Wait(wctx, tc.rule, "u1"); err != nil || !res.Allowed {
			t.Fatalf("%s: Wait: %+v, %v", tc.what, res, err)
		}
		switch {
		case len(bounds) != 1 || bounds[0] <= 0 || bounds[0] > tc.most:
			t.Errorf("%s: jitters drawn below %v, want one below at most %v", tc.what, bounds, tc.most)
		case tc.left == 0 && bounds[0] != tc.most:
			t.Errorf("%s: a jitter drawn below %v, want below %v", tc.what, bounds[0], tc.most)
		case len(ft.slept) != 1 || ft.slept[0] != tc.retry+bounds[0]-1:
			t.Errorf("%s: slept %s, want [%v] and the jitter drawn", tc.what, ft.sleeps(), tc.retry)
		}
	}
	seen := map[time.Duration]bool{}
	for range 100 {
		j := countlimit.RandJitter(5 * time.Millisecond)
		if j < 0 || j >= 5*time.Millisecond {
			t.Fatalf("a jitter of %v drawn below 5ms", j)
		}
		seen[j] = true
	}
	if len(seen) < 50 {
		t.Errorf("100 jitters drawn below 5ms took %d values", len(seen))
	}
}

// allowCounter counts the events a store allowed.
type allowCounter struct {
	driver.Store
	allowed atomic.Int64
}

func (s *allowCounter) Do(ctx context.Context, r *driver.Request) error {
	err := s.Store.Do(ctx, r)
	if err == nil && r.Op == driver.OpAllow && r.Checks[0].State.Allowed {
		s.allowed.Add(1)
	}
	return err
}

// Many waiters, on the wall clock, whose contexts are cancelled or run
// out at random while they wait in line or sleep first: every wait ends,
// the store counted exactly the events the waits returned as allowed
// (none for a wait that gave up), and no line is left behind.
func TestWaitLinesUnderCancellation(t *testing.T) {
	store := &allowCounter{Store: memstore.New(memstore.WithJanitorInterval(0))}
	l := countlimit.New(store)
	r := countlimit.Rule{UseType: "partner.api", Limit: 1000, Window: countlimit.Smooth(time.Second, 1)}
	var admitted, gaveUp, plain atomic.Int64 // plain: waits without an end
	var wg sync.WaitGroup
	for g := range 100 {
		wg.Go(func() {
			for i := range 5 {
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				switch after := time.Duration((g*5+i)%20) * time.Millisecond / 4; (g + i) % 3 {
				case 0:
					plain.Add(1)
				case 1:
					ctx, cancel = context.WithCancel(ctx)
					time.AfterFunc(after, cancel)
				case 2:
					ctx, cancel = context.WithTimeout(ctx, after)
				}
				res, err := l.Wait(ctx, r, "u1")
				cancel()
				switch {
				case err == nil && res.Allowed:
					admitted.Add(1)
				case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
					gaveUp.Add(1)
				default:
					t.Errorf("Wait: %+v, %v", res, err)
				}
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("waits never ended: a line stalled")
	}
	if got := store.allowed.Load(); got != admitted.Load() {
		t.Errorf("the store allowed %d events, the waits returned %d allowed (%d gave up)", got, admitted.Load(), gaveUp.Load())
	}
	if admitted.Load() < plain.Load() || gaveUp.Load() == 0 {
		t.Errorf("%d waits allowed, %d gave up: want at least the %d without an end allowed, and some given up", admitted.Load(), gaveUp.Load(), plain.Load())
	}
	if lines, _ := countlimit.WaitLines(l, r, "u1"); lines != 0 {
		t.Errorf("%d lines left after every wait ended", lines)
	}
}
