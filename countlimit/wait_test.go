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

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// fakeTime is a clock that moves only when a Wait sleeps.
type fakeTime struct {
	mu     sync.Mutex
	now    time.Time
	slept  []time.Duration
	cancel bool // the next sleep ends with context.Canceled instead
}

func (f *fakeTime) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeTime) sleep(_ context.Context, d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slept = append(f.slept, d)
	if f.cancel {
		return context.Canceled
	}
	f.now = f.now.Add(d)
	return nil
}

// sleeps shows the first sleeps of a Wait that slept more than it should.
func (f *fakeTime) sleeps() string {
	if len(f.slept) > 3 {
		return fmt.Sprintf("%v... (%d sleeps)", f.slept[:3], len(f.slept))
	}
	return fmt.Sprint(f.slept)
}

func fakeLimiter(t *testing.T) (*countlimit.Limiter, *fakeTime) {
	t.Helper()
	ft := &fakeTime{now: time.Date(2026, 11, 27, 10, 0, 30, 0, time.UTC)}
	l := countlimit.New(memstore.New(), countlimit.WithClock(ft.Now))
	countlimit.SetSleep(l, ft.sleep)
	countlimit.SetJitter(l, nil)
	return l, ft
}

// Each kind that counts events: Wait returns at once while there is room,
// then sleeps exactly the RetryAfter the denial gave, once, and is counted.
func TestWaitSleepsTheRetryAfterItWasTold(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		window countlimit.Window
		sleep  time.Duration // from 10:00:30 with two events counted at once
		used   int64         // after the third
	}{
		{countlimit.Fixed(time.Minute), 30 * time.Second, 1},
		{countlimit.Rolling(time.Minute), time.Minute, 1},
		{countlimit.Calendar(countlimit.Day, time.UTC), 13*time.Hour + 59*time.Minute + 30*time.Second, 1},
		{countlimit.Sliding(time.Minute), time.Minute, 1},
		// 2 a minute, bursts of 2: the burst drains one every 30 s, and the
		// third fits once one has drained; two are undrained after it.
		{countlimit.Smooth(time.Minute, 2), 30 * time.Second, 2},
	} {
		t.Run(tc.window.String(), func(t *testing.T) {
			l, ft := fakeLimiter(t)
			r := countlimit.Rule{UseType: "report.export", Limit: 2, Window: tc.window}
			for range 2 {
				if res, err := l.Wait(ctx, r, "u1"); err != nil || !res.Allowed {
					t.Fatalf("Wait with room: %+v, %v", res, err)
				}
			}
			if len(ft.slept) != 0 {
				t.Fatalf("Wait slept %s with room", ft.sleeps())
			}
			res, err := l.Wait(ctx, r, "u1")
			if err != nil || !res.Allowed || res.Used != tc.used {
				t.Fatalf("third Wait: %+v, %v; want allowed with Used %d", res, err, tc.used)
			}
			if len(ft.slept) != 1 || ft.slept[0] != tc.sleep {
				t.Errorf("third Wait slept %s, want [%v]", ft.sleeps(), tc.sleep)
			}
		})
	}
}

// A penalty is waited out too: the sleep is the later of its end and room.
func TestWaitSitsOutAPenalty(t *testing.T) {
	ctx := context.Background()
	l, ft := fakeLimiter(t)
	r := countlimit.Rule{UseType: "login.fail", Limit: 1, Window: countlimit.Fixed(time.Minute), Block: 10 * time.Minute}
	if _, err := l.Allow(ctx, r, "u1"); err != nil {
		t.Fatal(err)
	}
	if res, _ := l.Allow(ctx, r, "u1"); res.Allowed || res.BlockedUntil.IsZero() {
		t.Fatalf("second Allow: %+v, want denied into a penalty", res)
	}
	res, err := l.Wait(ctx, r, "u1")
	if err != nil || !res.Allowed {
		t.Fatalf("Wait: %+v, %v", res, err)
	}
	if len(ft.slept) != 1 || ft.slept[0] != 10*time.Minute {
		t.Errorf("Wait slept %s, want [10m0s] (the penalty)", ft.sleeps())
	}
}

// A wait that is cancelled counts nothing and says why.
func TestCancelledWaitCountsNothing(t *testing.T) {
	ctx := context.Background()
	l, ft := fakeLimiter(t)
	r := countlimit.Rule{UseType: "report.export", Limit: 3, Window: countlimit.Fixed(time.Minute)}
	if _, err := l.AllowN(ctx, r, "u1", 2); err != nil {
		t.Fatal(err)
	}
	ft.cancel = true
	res, err := l.WaitN(ctx, r, "u1", 2)
	if !errors.Is(err, context.Canceled) || res.Allowed {
		t.Fatalf("cancelled WaitN: %+v, %v; want denied with context.Canceled", res, err)
	}
	if res.RetryAfter != 30*time.Second {
		t.Errorf("cancelled WaitN's Result: RetryAfter %v, want the denial's 30s", res.RetryAfter)
	}
	if p, _ := l.Peek(ctx, r, "u1"); p.Used != 2 {
		t.Errorf("after a cancelled WaitN: Used %d, want 2", p.Used)
	}
}

// A deadline that comes before the room is told at once, without sleeping,
// as x/time/rate does; a context already done never reaches the store.
func TestWaitPastTheDeadlineReturnsAtOnce(t *testing.T) {
	l, ft := fakeLimiter(t)
	r := countlimit.Rule{UseType: "report.export", Limit: 1, Window: countlimit.Fixed(time.Minute)}
	if _, err := l.Allow(context.Background(), r, "u1"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := l.Wait(ctx, r, "u1")
	if !errors.Is(err, context.DeadlineExceeded) || res.Allowed || res.RetryAfter != 30*time.Second {
		t.Fatalf("Wait with 10 s left for a 30 s wait: %+v, %v; want the denial and DeadlineExceeded", res, err)
	}
	if len(ft.slept) != 0 {
		t.Errorf("Wait slept %s past its deadline", ft.sleeps())
	}
	done, stop := context.WithCancel(context.Background())
	stop()
	if _, err := l.Wait(done, r, "u2"); !errors.Is(err, countlimit.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Errorf("Wait on a done context: %v, want the store's ErrUnavailable wrapping context.Canceled", err)
	}
	if p, _ := l.Peek(context.Background(), r, "u2"); p.Used != 0 {
		t.Errorf("Wait on a done context counted: Used %d", p.Used)
	}
}

// What no wait can fit is ErrInvalid at once: a cost above the limit, a
// full Lifetime window, a Concurrent window of no slots.
func TestWaitThatCanNeverFit(t *testing.T) {
	ctx := context.Background()
	l, ft := fakeLimiter(t)
	over := countlimit.Rule{UseType: "report.export", Limit: 3, Window: countlimit.Fixed(time.Minute)}
	if _, err := l.WaitN(ctx, over, "u1", 4); !errors.Is(err, countlimit.ErrInvalid) {
		t.Errorf("WaitN(4) on a limit of 3: %v, want ErrInvalid", err)
	}
	life := countlimit.Rule{UseType: "trial.start", Limit: 1, Window: countlimit.Lifetime()}
	if _, err := l.Wait(ctx, life, "u1"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Wait(ctx, life, "u1"); !errors.Is(err, countlimit.ErrInvalid) {
		t.Errorf("Wait on a full Lifetime window: %v, want ErrInvalid", err)
	}
	none := countlimit.Rule{UseType: "export.slot", Limit: 0, Window: countlimit.Concurrent(time.Minute)}
	if _, _, err := l.WaitAcquire(ctx, none, "u1"); !errors.Is(err, countlimit.ErrInvalid) {
		t.Errorf("WaitAcquire on 0 slots: %v, want ErrInvalid", err)
	}
	if _, err := l.Wait(ctx, countlimit.Rule{UseType: "export.slot", Limit: 1, Window: countlimit.Concurrent(time.Minute)}, "u1"); !errors.Is(err, countlimit.ErrInvalid) {
		t.Errorf("Wait on a Concurrent window: %v, want ErrInvalid (slots are taken by WaitAcquire)", err)
	}
	if len(ft.slept) != 0 {
		t.Errorf("slept %s on calls no wait helps", ft.sleeps())
	}
}

// WaitAcquire sleeps until the earliest lease expires and then holds a slot.
func TestWaitAcquireWaitsForTheEarliestLease(t *testing.T) {
	ctx := context.Background()
	l, ft := fakeLimiter(t)
	r := countlimit.Rule{UseType: "export.slot", Limit: 1, Window: countlimit.Concurrent(time.Minute)}
	if _, _, err := l.WaitAcquire(ctx, r, "u1"); err != nil {
		t.Fatal(err)
	}
	ls, res, err := l.WaitAcquire(ctx, r, "u1")
	if err != nil || !res.Allowed || ls.ID() != "u1" {
		t.Fatalf("second WaitAcquire: %+v, %+v, %v", ls, res, err)
	}
	if len(ft.slept) != 1 || ft.slept[0] != time.Minute {
		t.Errorf("second WaitAcquire slept %s, want [1m0s]", ft.sleeps())
	}
}

// tryCounter counts the calls that reach the store, and fails them with
// an unavailable store's error while failing is set.
type tryCounter struct {
	driver.Store
	tries   atomic.Int64
	failing atomic.Bool
}

func (s *tryCounter) Do(ctx context.Context, r *driver.Request) error {
	s.tries.Add(1)
	if s.failing.Load() {
		return driver.Unavailable(errors.New("connection refused"))
	}
	return s.Store.Do(ctx, r)
}

// Many callers waiting on one key on the wall clock: every event is
// allowed in the end, no window ever holds more than the limit, and the
// callers ask the store about once per window they sleep through, never
// in a loop.
func TestConcurrentWaitsKeepTheLimit(t *testing.T) {
	const (
		callers = 16
		each    = 5
		limit   = 10
		window  = 100 * time.Millisecond
	)
	store := &tryCounter{Store: memstore.New()}
	l := countlimit.New(store)
	r := countlimit.Rule{UseType: "report.export", Limit: limit, Window: countlimit.Fixed(window)}
	var (
		mu       sync.Mutex
		perEnd   = map[time.Time]int64{}
		maxUsed  int64
		failures []error
	)
	start := time.Now()
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range each {
				res, err := l.Wait(context.Background(), r, "u1")
				mu.Lock()
				if err != nil || !res.Allowed {
					failures = append(failures, err)
				} else {
					perEnd[res.ResetAt]++
					maxUsed = max(maxUsed, res.Used)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if len(failures) > 0 {
		t.Fatalf("%d Waits failed, the first: %v", len(failures), failures[0])
	}
	var total int64
	for end, n := range perEnd {
		total += n
		if n > limit {
			t.Errorf("window ending %v allowed %d, limit %d", end, n, limit)
		}
	}
	if total != callers*each || maxUsed > limit {
		t.Errorf("allowed %d (want %d), largest Used %d (limit %d)", total, callers*each, maxUsed, limit)
	}
	// Each caller tries once per success and at most once per window it
	// sleeps through (it sleeps to the window's end, then tries again), plus
	// one: anything more is polling.
	windows := int64(elapsed/window) + 1
	if tries, most := store.tries.Load(), int64(callers*each)+callers*(windows+1); tries > most {
		t.Errorf("%d tries in %v (%d windows), want at most %d: Wait polls", tries, elapsed.Round(time.Millisecond), windows, most)
	}
}

// decisions keeps what an Observer's Decided is told.
type decisions struct {
	mu   sync.Mutex
	seen []countlimit.Decision
}

func (d *decisions) observer() countlimit.Observer {
	return countlimit.Observer{Decided: func(dec countlimit.Decision) {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.seen = append(d.seen, dec)
	}}
}

// since returns the decisions told after the first from.
func (d *decisions) since(from int) []countlimit.Decision {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.seen[from:])
}

// A Wait is one decision, however many times it asked the store: one that
// slept five times, as another process took the room each time it woke,
// is told once, allowed and Waited, and not as five denials; one that
// gives up is one denial, Waited when it slept first.
func TestAWaitIsOneDecision(t *testing.T) {
	ctx := context.Background()
	ft := &fakeTime{now: time.Date(2026, 11, 27, 10, 0, 30, 0, time.UTC)}
	store := memstore.New()
	var seen decisions
	l := countlimit.New(store, countlimit.WithClock(ft.Now), countlimit.WithObserver(seen.observer()))
	other := countlimit.New(store, countlimit.WithClock(ft.Now))
	r := countlimit.Rule{UseType: "report.export", Limit: 1, Window: countlimit.Fixed(time.Minute)}
	takes := 0 // how many times other takes the room a Wait woke for
	countlimit.SetSleep(l, func(ctx context.Context, d time.Duration) error {
		if err := ft.sleep(ctx, d); err != nil {
			return err
		}
		if takes > 0 {
			takes--
			if res, err := other.Allow(ctx, r, "u1"); err != nil || !res.Allowed {
				t.Errorf("the other process's Allow: %+v, %v", res, err)
			}
		}
		return nil
	})
	countlimit.SetJitter(l, nil)
	allowed := func(waited bool) countlimit.Decision {
		return countlimit.Decision{UseType: r.UseType, Allowed: true, Waited: waited}
	}
	denied := func(waited bool) countlimit.Decision {
		return countlimit.Decision{UseType: r.UseType, Waited: waited}
	}
	for _, step := range []struct {
		what  string
		takes int
		ctx   func() (context.Context, context.CancelFunc)
		err   error
		want  countlimit.Decision
	}{
		{"a Wait with room", 0, nil, nil, allowed(false)},
		{"a Wait that slept five times", 4, nil, nil, allowed(true)},
		{"a Wait whose deadline comes first", 0, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, 10*time.Second)
		}, context.DeadlineExceeded, denied(false)},
		{"a Wait cancelled in its second sleep", 0, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(ctx)
			calls := 0
			countlimit.SetSleep(l, func(sctx context.Context, d time.Duration) error {
				if calls++; calls == 2 {
					cancel()
					return sctx.Err()
				}
				if err := ft.sleep(sctx, d); err != nil {
					return err
				}
				if res, err := other.Allow(sctx, r, "u1"); err != nil || !res.Allowed {
					t.Errorf("the other process's Allow: %+v, %v", res, err)
				}
				return nil
			})
			return ctx, cancel
		}, context.Canceled, denied(true)},
	} {
		from := len(seen.since(0))
		takes = step.takes
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if step.ctx != nil {
			wctx, cancel = step.ctx()
		}
		slept := len(ft.slept)
		res, err := l.Wait(wctx, r, "u1")
		cancel()
		if !errors.Is(err, step.err) || res.Allowed != (step.err == nil) {
			t.Fatalf("%s: %+v, %v; want the error %v", step.what, res, err, step.err)
		}
		if got := seen.since(from); len(got) != 1 || got[0] != step.want {
			t.Errorf("%s (it slept %v): told %+v, want one decision %+v", step.what, ft.slept[slept:], got, step.want)
		}
	}
}
