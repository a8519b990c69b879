package countlimit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/testkit/tally"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

var errDown = errors.New("connection refused")

// flaky is a store that fails while down is set, and otherwise passes calls
// to a memstore. It counts the calls that reached it, and can hold them
// until their context ends (a stalled store).
type flaky struct {
	mem      *memstore.Store
	down     atomic.Bool
	stall    atomic.Bool
	calls    atomic.Int64
	inFlight atomic.Int64
	maxIn    atomic.Int64 // the most calls in flight at once while down
	hold     chan struct{}
}

func newFlaky(t *testing.T) *flaky {
	mem := memstore.New(memstore.WithJanitorInterval(0))
	t.Cleanup(func() { mem.Close() })
	return &flaky{mem: mem}
}

func (f *flaky) Do(ctx context.Context, r *driver.Request) error {
	f.calls.Add(1)
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	if f.down.Load() {
		for {
			m := f.maxIn.Load()
			if n <= m || f.maxIn.CompareAndSwap(m, n) {
				break
			}
		}
	}
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
		}
	}
	switch {
	case f.stall.Load():
		<-ctx.Done()
		return driver.Unavailable(ctx.Err())
	case f.down.Load():
		return driver.Unavailable(errDown)
	}
	return f.mem.Do(ctx, r)
}

// stubClock is a settable clock.
type stubClock struct{ ns atomic.Int64 }

func newStubClock() *stubClock {
	c := new(stubClock)
	c.ns.Store(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *stubClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *stubClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

var perMinute = countlimit.Rule{UseType: "api.call", Limit: 3, Window: countlimit.Fixed(time.Minute)}

func TestStoreTimeoutEndsAStall(t *testing.T) {
	t.Parallel()
	f := newFlaky(t)
	f.stall.Store(true)
	var tl tally.Tally
	l := countlimit.New(f, countlimit.WithStoreTimeout(20*time.Millisecond), countlimit.WithObserver(tl.Observer()))
	// The caller's own context would wait for a minute: the timeout is what
	// ends the call.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := l.Allow(ctx, perMinute, "u1")
	if !errors.Is(err, countlimit.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Allow on a stalled store = %+v, %v; want ErrUnavailable wrapping DeadlineExceeded", res, err)
	}
	if !strings.Contains(err.Error(), "store timeout of 20ms") {
		t.Errorf("error %q does not say which bound ran out", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the caller's context ended: the test proves nothing")
	}
	if s := tl.Counts(); s.Timeouts != 1 || s.Failures != 1 {
		t.Errorf("counts = %+v, want 1 timeout, 1 failure", s)
	}
	f.stall.Store(false)
	if res, err := l.Allow(ctx, perMinute, "u1"); err != nil || !res.Allowed {
		t.Fatalf("Allow after the stall = %+v, %v; want allowed", res, err)
	}
}

func TestStoreTimeoutLeavesCallerCancellationAlone(t *testing.T) {
	t.Parallel()
	f := newFlaky(t)
	f.stall.Store(true)
	var tl tally.Tally
	l := countlimit.New(f, countlimit.WithStoreTimeout(time.Minute), countlimit.WithObserver(tl.Observer()),
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 1, OnChange: tl.BreakerChanged}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Allow(ctx, perMinute, "u1"); !errors.Is(err, countlimit.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Allow with a cancelled context = %v, want ErrUnavailable wrapping Canceled", err)
	}
	if s := tl.Counts(); s.Timeouts != 0 || s.Failures != 0 || s.Breaker != countlimit.BreakerClosed {
		t.Errorf("counts = %+v: a caller giving up is not a store failure", s)
	}
}

func TestCircuitBreaker(t *testing.T) {
	t.Parallel()
	f := newFlaky(t)
	clock := newStubClock()
	var mu sync.Mutex
	var changes []string
	var tl tally.Tally
	l := countlimit.New(f, countlimit.WithClock(clock.now), countlimit.WithObserver(tl.Observer()), countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{
		Failures: 3,
		CoolDown: 2 * time.Second,
		OnChange: func(from, to countlimit.BreakerState) {
			mu.Lock()
			changes = append(changes, from.String()+"→"+to.String())
			mu.Unlock()
			tl.BreakerChanged(from, to)
		},
	}))
	ctx := context.Background()
	allow := func(step string, wantErr error, wantCalls int64) {
		t.Helper()
		before := f.calls.Load()
		_, err := l.Allow(ctx, perMinute, "u1")
		if (wantErr == nil) != (err == nil) || wantErr != nil && !errors.Is(err, wantErr) {
			t.Fatalf("%s: Allow = %v, want %v", step, err, wantErr)
		}
		if got := f.calls.Load() - before; got != wantCalls {
			t.Fatalf("%s: the store was called %d times, want %d", step, got, wantCalls)
		}
	}

	allow("up", nil, 1)
	f.down.Store(true)
	allow("failure 1", errDown, 1)
	allow("failure 2", errDown, 1)
	if s := tl.Counts(); s.Breaker != countlimit.BreakerClosed {
		t.Fatalf("after 2 failures the breaker is %v, want closed", s.Breaker)
	}
	allow("failure 3 opens", errDown, 1)
	allow("open", countlimit.ErrCircuitOpen, 0)
	clock.advance(1999 * time.Millisecond)
	allow("still open", countlimit.ErrCircuitOpen, 0)
	clock.advance(time.Millisecond)
	allow("probe fails", errDown, 1)
	allow("open again", countlimit.ErrCircuitOpen, 0)
	f.down.Store(false)
	allow("open even though the store is back", countlimit.ErrCircuitOpen, 0)
	clock.advance(2 * time.Second)
	allow("probe succeeds", nil, 1)
	allow("closed", nil, 1)

	// A success while closed forgets earlier failures.
	f.down.Store(true)
	allow("failure 1 of a new run", errDown, 1)
	allow("failure 2 of a new run", errDown, 1)
	f.down.Store(false)
	allow("success", nil, 1)
	f.down.Store(true)
	allow("failure 1 after the success", errDown, 1)
	allow("failure 2 after the success", errDown, 1)
	allow("still closed", errDown, 1)
	allow("opened by the third in a row", countlimit.ErrCircuitOpen, 0)

	s := tl.Counts()
	if s.Breaker != countlimit.BreakerOpen || s.BreakerOpenings != 3 || s.Rejected != 5 || s.Failures != 9 {
		t.Errorf("counts = %+v, want open, 3 openings, 5 rejected, 9 failures", s)
	}
	want := []string{
		"closed→open", "open→half-open", "half-open→open", "open→half-open", "half-open→closed", "closed→open",
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(changes, want) {
		t.Errorf("OnChange saw %q, want %q", changes, want)
	}
}

// While open, 64 goroutines never reach the store; when the cool-down ends
// exactly one of them probes it, however many arrive at once.
func TestCircuitBreakerOneProbeUnderLoad(t *testing.T) {
	t.Parallel()
	f := newFlaky(t)
	f.down.Store(true)
	clock := newStubClock()
	l := countlimit.New(f, countlimit.WithClock(clock.now),
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 1, CoolDown: time.Second}))
	// Bounded, so that a breaker letting many calls into the held store
	// fails the test instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.Allow(ctx, perMinute, "u"); !errors.Is(err, errDown) {
		t.Fatalf("first Allow = %v, want the store's error", err)
	}
	run := func() (rejected int64) {
		var wg sync.WaitGroup
		var n atomic.Int64
		for g := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					_, err := l.Allow(ctx, perMinute, fmt.Sprintf("u%d-%d", g, i))
					switch {
					case errors.Is(err, countlimit.ErrCircuitOpen):
						n.Add(1)
					case !errors.Is(err, errDown):
						t.Errorf("Allow = %v, want ErrCircuitOpen or the store's error", err)
					}
				}
			}()
		}
		wg.Wait()
		return n.Load()
	}
	before := f.calls.Load()
	if got := run(); got != 64*50 {
		t.Fatalf("%d of %d calls rejected while open, want all", got, 64*50)
	}
	if f.calls.Load() != before {
		t.Fatalf("the open breaker let %d calls through", f.calls.Load()-before)
	}

	// The probe is held in the store until every other goroutine has run.
	clock.advance(time.Second)
	f.hold = make(chan struct{})
	probeDone := make(chan error)
	go func() {
		_, err := l.Allow(ctx, perMinute, "probe")
		probeDone <- err
	}()
	for f.inFlight.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if got := run(); got != 64*50 {
		t.Fatalf("%d of %d calls rejected while the probe is out, want all", got, 64*50)
	}
	close(f.hold)
	if err := <-probeDone; !errors.Is(err, errDown) {
		t.Fatalf("probe = %v, want the store's error", err)
	}
	if got := f.maxIn.Load(); got != 1 {
		t.Errorf("%d calls were in the store at once while half-open, want 1", got)
	}
	if got := f.calls.Load() - before; got != 1 {
		t.Errorf("the store saw %d calls while open and half-open, want 1 (the probe)", got)
	}
}

func TestFallback(t *testing.T) {
	t.Parallel()
	f := newFlaky(t)
	local := memstore.New(memstore.WithJanitorInterval(0))
	defer local.Close()
	clock := newStubClock()
	var tl tally.Tally
	l := countlimit.New(f, countlimit.WithClock(clock.now), countlimit.WithFallback(local), countlimit.WithObserver(tl.Observer()),
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 2, CoolDown: time.Second, OnChange: tl.BreakerChanged}))
	ctx := context.Background()

	if res, err := l.Allow(ctx, perMinute, "u1"); err != nil || res.Used != 1 {
		t.Fatalf("Allow while up = %+v, %v; want used 1 in the store", res, err)
	}
	f.down.Store(true)
	// The fallback counts on its own, from zero: per-process limits.
	for i := 1; i <= 4; i++ {
		res, err := l.Allow(ctx, perMinute, "u1")
		if err != nil {
			t.Fatalf("Allow %d while down = %v, want the fallback's answer", i, err)
		}
		if want := i <= 3; res.Allowed != want || res.Used != int64(min(i, 3)) {
			t.Fatalf("Allow %d while down = %+v, want allowed %v, used %d", i, res, want, min(i, 3))
		}
	}
	if res, err := l.Peek(ctx, perMinute, "u1"); err != nil || res.Allowed || res.Used != 3 {
		t.Fatalf("Peek while down = %+v, %v; want the fallback's full window", res, err)
	}
	if ok, err := l.CheckLimit(ctx, "pin", "u1", 1, time.Hour, time.Time{}); err != nil || !ok {
		t.Fatalf("CheckLimit while down = %v, %v; want the fallback's answer", ok, err)
	}
	if _, err := l.AllowAll(ctx, "u2", perMinute, countlimit.Rule{UseType: "api.day", Limit: 10, Window: countlimit.Fixed(24 * time.Hour)}); err != nil {
		t.Fatalf("AllowAll while down = %v, want the fallback's answer", err)
	}
	// Operator actions never fall back.
	if _, err := l.Refund(ctx, perMinute, "u1", 1); !errors.Is(err, countlimit.ErrUnavailable) {
		t.Errorf("Refund while down = %v, want ErrUnavailable", err)
	}
	if err := l.Reset(ctx, perMinute, "u1"); !errors.Is(err, countlimit.ErrUnavailable) {
		t.Errorf("Reset while down = %v, want ErrUnavailable", err)
	}
	// Bad input is still bad input.
	if _, err := l.Allow(ctx, countlimit.Rule{UseType: "x", Limit: -1, Window: countlimit.Fixed(time.Minute)}, "u1"); !errors.Is(err, countlimit.ErrInvalid) {
		t.Errorf("Allow with Limit -1 while down = %v, want ErrInvalid", err)
	}
	s := tl.Counts()
	if s.Fallbacks != 7 || s.Breaker != countlimit.BreakerOpen {
		t.Errorf("counts = %+v, want 7 fallbacks and the breaker open", s)
	}

	// Back up: after the cool-down the store decides again, with its own
	// count.
	f.down.Store(false)
	clock.advance(time.Second)
	if res, err := l.Allow(ctx, perMinute, "u1"); err != nil || !res.Allowed || res.Used != 2 {
		t.Fatalf("Allow after recovery = %+v, %v; want used 2 in the store", res, err)
	}
	if got := tl.Counts().Fallbacks; got != 7 {
		t.Errorf("Fallbacks = %d after recovery, want still 7", got)
	}
}

func TestFallbackFailingToo(t *testing.T) {
	t.Parallel()
	primary, second := newFlaky(t), newFlaky(t)
	primary.down.Store(true)
	second.down.Store(true)
	l := countlimit.New(primary, countlimit.WithFallback(second))
	_, err := l.Allow(context.Background(), perMinute, "u1")
	if !errors.Is(err, countlimit.ErrUnavailable) || !strings.Contains(err.Error(), "the fallback store failed too") {
		t.Fatalf("Allow with both stores down = %v, want ErrUnavailable naming both", err)
	}
}

// clockStore is a memstore whose StoreTime runs skew ahead of the clock
// the test gives the Limiter.
type clockStore struct {
	*memstore.Store
	local *stubClock
	skew  atomic.Int64
	fail  atomic.Bool
	reads atomic.Int64
}

func (c *clockStore) StoreTime(context.Context) (time.Time, error) {
	c.reads.Add(1)
	if c.fail.Load() {
		return time.Time{}, driver.Unavailable(errDown)
	}
	return c.local.now().Add(time.Duration(c.skew.Load())), nil
}

func TestStoreClock(t *testing.T) {
	t.Parallel()
	local := newStubClock()
	cs := &clockStore{Store: memstore.New(memstore.WithJanitorInterval(0)), local: local}
	defer cs.Close()
	cs.skew.Store(int64(90 * time.Second))
	l := countlimit.New(cs, countlimit.WithClock(local.now), countlimit.WithStoreClock(time.Minute))
	ctx := context.Background()

	// Local 10:00:00, store 10:01:30: the window is the store's minute.
	res, err := l.Allow(ctx, perMinute, "u1")
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 11, 23, 10, 2, 0, 0, time.UTC); !res.ResetAt.Equal(want) {
		t.Fatalf("ResetAt = %v, want %v (the store's clock)", res.ResetAt.UTC(), want)
	}
	if got := expose.Now(l).Sub(local.now()); got != 90*time.Second {
		t.Errorf("Now() is %v off the local clock, want 1m30s", got)
	}
	// Within the resync period the store is not asked again.
	for range 10 {
		if _, err := l.Allow(ctx, perMinute, "u2"); err != nil {
			t.Fatal(err)
		}
	}
	if got := cs.reads.Load(); got != 1 {
		t.Fatalf("the store's clock was read %d times, want 1", got)
	}
	// After it, one call reads it again and the new offset applies.
	cs.skew.Store(int64(-30 * time.Second))
	local.advance(time.Minute)
	if _, err := l.Allow(ctx, perMinute, "u3"); err != nil {
		t.Fatal(err)
	}
	if got := cs.reads.Load(); got != 2 {
		t.Fatalf("the store's clock was read %d times, want 2", got)
	}
	if got := expose.Now(l).Sub(local.now()); got != -30*time.Second {
		t.Errorf("Now() is %v off the local clock, want -30s", got)
	}
	// A failed refresh keeps the last offset and does not fail the call.
	cs.fail.Store(true)
	local.advance(time.Minute)
	if _, err := l.Allow(ctx, perMinute, "u4"); err != nil {
		t.Fatalf("Allow with a failed refresh = %v, want the old offset used", err)
	}
	if got := expose.Now(l).Sub(local.now()); got != -30*time.Second {
		t.Errorf("after a failed refresh Now() is %v off, want -30s kept", got)
	}
}

func TestStoreClockFirstReadFails(t *testing.T) {
	t.Parallel()
	local := newStubClock()
	cs := &clockStore{Store: memstore.New(memstore.WithJanitorInterval(0)), local: local}
	defer cs.Close()
	cs.fail.Store(true)
	l := countlimit.New(cs, countlimit.WithClock(local.now), countlimit.WithStoreClock(0))
	if _, err := l.Allow(context.Background(), perMinute, "u1"); !errors.Is(err, countlimit.ErrUnavailable) {
		t.Fatalf("Allow when the store's clock cannot be read = %v, want ErrUnavailable", err)
	}
	if cs.Len() != 0 {
		t.Error("something was counted although the call failed")
	}

	fallback := memstore.New(memstore.WithJanitorInterval(0))
	defer fallback.Close()
	l = countlimit.New(cs, countlimit.WithClock(local.now), countlimit.WithStoreClock(0), countlimit.WithFallback(fallback))
	if res, err := l.Allow(context.Background(), perMinute, "u1"); err != nil || !res.Allowed {
		t.Fatalf("Allow with a fallback when the store's clock cannot be read = %+v, %v; want allowed on the local clock", res, err)
	}
	if cs.Len() != 0 || fallback.Len() != 1 {
		t.Errorf("store holds %d counters, fallback %d; want the fallback alone to count while the store's clock is unknown", cs.Len(), fallback.Len())
	}
	// Until the next read is due, calls fail (or fall back) at once, without
	// reading the clock again; then it is read again.
	reads := cs.reads.Load()
	if _, err := l.Allow(context.Background(), perMinute, "u2"); err != nil || cs.reads.Load() != reads {
		t.Errorf("a second call within the second: %v, %d more clock reads; want the fallback's answer and none", err, cs.reads.Load()-reads)
	}
	cs.fail.Store(false)
	local.advance(time.Second)
	if _, err := l.Allow(context.Background(), perMinute, "u3"); err != nil || cs.reads.Load() != reads+1 || cs.Len() != 1 {
		t.Errorf("a call a second later: %v, %d more clock reads, store holds %d; want one read and the store counting", err, cs.reads.Load()-reads, cs.Len())
	}
}

func TestStoreClockNeedsAClock(t *testing.T) {
	t.Parallel()
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "StoreClock") {
			t.Errorf("New(store without a clock, WithStoreClock) panicked with %v, want a message naming StoreClock", r)
		}
	}()
	countlimit.New(newFlaky(t), countlimit.WithStoreClock(0))
}

// nowStore records the Now of every request it is given.
type nowStore struct {
	*clockStore
	mu   sync.Mutex
	nows []time.Time
}

func (s *nowStore) Do(ctx context.Context, r *driver.Request) error {
	s.mu.Lock()
	s.nows = append(s.nows, r.Now)
	s.mu.Unlock()
	return s.clockStore.Do(ctx, r)
}

// TestClockReadingsAreMicroseconds: whatever the clock given to WithClock
// returns (nanoseconds, a monotonic reading) and whatever offset the
// store's clock adds (nanoseconds too), the time a store is given and
// Limiter.Now are whole microseconds without a monotonic reading.
func TestClockReadingsAreMicroseconds(t *testing.T) {
	t.Parallel()
	local := newStubClock()
	local.advance(123_456_789 * time.Nanosecond)
	clocks := map[string]func() time.Time{"stub": local.now, "time.Now": time.Now}
	for name, clock := range clocks {
		for _, skew := range []time.Duration{0, 90*time.Second + 789, -30*time.Second - 789} {
			cs := &clockStore{Store: memstore.New(memstore.WithJanitorInterval(0)), local: local}
			cs.skew.Store(int64(skew))
			ns := &nowStore{clockStore: cs}
			opts := []countlimit.Option{countlimit.WithClock(clock)}
			if skew != 0 {
				opts = append(opts, countlimit.WithStoreClock(time.Minute))
			}
			l := countlimit.New(ns, opts...)
			for range 3 {
				if _, err := l.Allow(context.Background(), perMinute, "u1"); err != nil {
					t.Fatal(err)
				}
				local.advance(1001 * time.Nanosecond)
			}
			ns.nows = append(ns.nows, expose.Now(l))
			for _, got := range ns.nows {
				if got != got.Truncate(time.Microsecond) || got != got.Round(0) {
					t.Errorf("%s clock, store skew %v: a time of %v, want whole microseconds and no monotonic reading", name, skew, got)
				}
			}
			cs.Close()
		}
	}
}

// lockedStore answers every call as pgstore does for a row another
// transaction holds: it waits until the call's context ends, then fails
// with ErrLocked.
type lockedStore struct{}

func (lockedStore) Do(ctx context.Context, _ *driver.Request) error {
	<-ctx.Done()
	return fmt.Errorf("%w: %w", countlimit.ErrLocked, ctx.Err())
}

// TestLockedIsNoStoreFailure: calls that wait out the store timeout on
// another transaction's lock fail with ErrLocked (an ErrUnavailable), but
// never open the breaker, count as failures or timeouts, or go to the
// fallback store.
func TestLockedIsNoStoreFailure(t *testing.T) {
	t.Parallel()
	fallback := memstore.New(memstore.WithJanitorInterval(0))
	defer fallback.Close()
	var tl tally.Tally
	l := countlimit.New(lockedStore{}, countlimit.WithStoreTimeout(time.Millisecond), countlimit.WithObserver(tl.Observer()),
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 2, OnChange: tl.BreakerChanged}), countlimit.WithFallback(fallback))
	for i := range 5 {
		res, err := l.Allow(context.Background(), perMinute, "u1")
		if !errors.Is(err, countlimit.ErrLocked) || !errors.Is(err, countlimit.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || res.Allowed {
			t.Fatalf("call %d: %+v, %v; want ErrLocked within the store timeout", i+1, res, err)
		}
	}
	if s := tl.Counts(); s.Breaker != countlimit.BreakerClosed || s.BreakerOpenings != 0 || s.Failures != 0 || s.Timeouts != 0 || s.Fallbacks != 0 || s.Locked != 5 {
		t.Errorf("counts = %+v; want the breaker closed, no failure, timeout or fallback, 5 locked", s)
	}
	if fallback.Len() != 0 {
		t.Errorf("the fallback store holds %d counters, want none", fallback.Len())
	}
}

// TestStoreClockOutOfRangeIsAStoreFailure: a store whose clock reads a time
// no store keeps exactly (before 1970, from 2150 on) has failed: its first
// reading is ErrUnavailable, not the caller's ErrInvalid, so the fallback
// answers; and a later reading out of range keeps the offset before it.
func TestStoreClockOutOfRangeIsAStoreFailure(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{200 * 365 * 24 * time.Hour, -60 * 365 * 24 * time.Hour} {
		local := newStubClock()
		cs := &clockStore{Store: memstore.New(memstore.WithJanitorInterval(0)), local: local}
		defer cs.Close()
		cs.skew.Store(int64(skew))
		l := countlimit.New(cs, countlimit.WithClock(local.now), countlimit.WithStoreClock(0))
		_, err := l.Allow(context.Background(), perMinute, "u1")
		if !errors.Is(err, countlimit.ErrUnavailable) || errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), "clock") {
			t.Fatalf("Allow when the store's clock reads %v = %v; want ErrUnavailable naming the store's clock", local.now().Add(skew).Year(), err)
		}
		fallback := memstore.New(memstore.WithJanitorInterval(0))
		defer fallback.Close()
		l = countlimit.New(cs, countlimit.WithClock(local.now), countlimit.WithStoreClock(0), countlimit.WithFallback(fallback))
		if res, err := l.Allow(context.Background(), perMinute, "u1"); err != nil || !res.Allowed {
			t.Fatalf("Allow with a fallback when the store's clock reads %v = %+v, %v; want the fallback's answer", local.now().Add(skew).Year(), res, err)
		}
		if cs.Len() != 0 || fallback.Len() != 1 {
			t.Errorf("store holds %d counters, fallback %d; want the fallback alone to count", cs.Len(), fallback.Len())
		}
	}

	// A good first reading, then one out of range: the old offset stays.
	local := newStubClock()
	cs := &clockStore{Store: memstore.New(memstore.WithJanitorInterval(0)), local: local}
	defer cs.Close()
	cs.skew.Store(int64(time.Second))
	l := countlimit.New(cs, countlimit.WithClock(local.now), countlimit.WithStoreClock(time.Minute))
	if _, err := l.Allow(context.Background(), perMinute, "u1"); err != nil {
		t.Fatal(err)
	}
	cs.skew.Store(int64(200 * 365 * 24 * time.Hour))
	local.advance(time.Minute)
	if res, err := l.Allow(context.Background(), perMinute, "u2"); err != nil || !res.Allowed {
		t.Fatalf("Allow after a refresh read 2226 = %+v, %v; want the old offset used", res, err)
	}
	if got := expose.Now(l).Sub(local.now()); got != time.Second {
		t.Errorf("after a refresh out of range Now() is %v off, want 1s kept", got)
	}
}

// refusingStore refuses every request as a store refuses a kind of window
// it does not support.
type refusingStore struct{}

func (refusingStore) Do(context.Context, *driver.Request) error {
	return fmt.Errorf("refusing: %w: smooth windows are not supported by this store yet", countlimit.ErrInvalid)
}

// TestRefusalIsNoStoreFailure: a store that refuses a request (an error
// wrapping countlimit.ErrInvalid) answered: the caller gets ErrInvalid, not
// ErrUnavailable; the breaker counts no failure and stays closed, and the
// fallback does not answer in its place.
func TestRefusalIsNoStoreFailure(t *testing.T) {
	t.Parallel()
	fallback := memstore.New(memstore.WithJanitorInterval(0))
	defer fallback.Close()
	smooth := countlimit.Rule{UseType: "api.smooth", Limit: 10, Window: countlimit.Smooth(time.Second, 5)}
	var plain, guarded tally.Tally
	for _, l := range []struct {
		*countlimit.Limiter
		tl *tally.Tally
	}{
		{countlimit.New(refusingStore{}, countlimit.WithObserver(plain.Observer())), &plain},
		{countlimit.New(refusingStore{}, countlimit.WithObserver(guarded.Observer()),
			countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 2, OnChange: guarded.BreakerChanged}), countlimit.WithFallback(fallback)), &guarded},
	} {
		for i := range 4 {
			res, err := l.Allow(context.Background(), smooth, "u1")
			if !errors.Is(err, countlimit.ErrInvalid) || errors.Is(err, countlimit.ErrUnavailable) || res.Allowed {
				t.Fatalf("call %d: %+v, %v; want ErrInvalid alone", i+1, res, err)
			}
		}
		if s := l.tl.Counts(); s.Breaker != countlimit.BreakerClosed || s.BreakerOpenings != 0 || s.Failures != 0 || s.Fallbacks != 0 {
			t.Errorf("counts = %+v; want the breaker closed, no failure or fallback", s)
		}
	}
	if fallback.Len() != 0 {
		t.Errorf("the fallback store holds %d counters, want none", fallback.Len())
	}
}
