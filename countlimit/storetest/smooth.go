package storetest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
)

// smoothTests are Run's tests of Smooth windows.
var smoothTests = []struct {
	name string
	fn   func(*testing.T, func(*testing.T) driver.Store)
}{
	{"SmoothRateAndBurst", testSmoothRateAndBurst},
	{"SmoothIntervalRoundsUp", testSmoothIntervalRoundsUp},
	{"SmoothRefund", testSmoothRefund},
	{"SmoothPenalty", testSmoothPenalty},
	{"SmoothLimitZero", testSmoothLimitZero},
	{"SmoothDenialOfANewKeyKeepsNoInstant", testSmoothDenialOfANewKey},
	{"SmoothReset", testSmoothReset},
	{"SmoothKindChanged", testSmoothKindChanged},
	{"WindowKindChanged", testWindowKindChanged},
	{"KindsTakeTurns", testKindsTakeTurns},
	{"SmoothAllowAll", testSmoothAllowAll},
	{"SmoothConcurrentExactlyBurst", testSmoothConcurrentExactlyBurst},
	{"SmoothRealClockNeverAboveTheRate", testSmoothRealClock},
}

// smoothOK and smoothNo build expected Results of a Smooth rule: Remaining
// is burst - used, ResetAt when the key is drained.
func smoothOK(limit, burst, used int64, drained time.Time) countlimit.Result {
	return countlimit.Result{Allowed: true, Limit: limit, Used: used, Remaining: burst - used, ResetAt: drained}
}

func smoothNo(limit, burst, used int64, drained time.Time, retry time.Duration) countlimit.Result {
	return countlimit.Result{Limit: limit, Used: used, Remaining: burst - used, ResetAt: drained, RetryAfter: retry}
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// testSmoothRateAndBurst: 10 a second with bursts of 3, one every 100ms.
// A fresh key takes its burst at once; then one fits every interval, and
// RetryAfter is exactly when the call's weight fits.
func testSmoothRateAndBurst(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "smooth"), Limit: 10, Window: countlimit.Smooth(time.Second, 3)}
	e.run(rule, "a", []step{
		{at: at(0), op: peek, want: smoothOK(10, 3, 0, at(0))},
		{at: at(0), want: smoothOK(10, 3, 1, at(ms(100)))},
		{at: at(0), want: smoothOK(10, 3, 2, at(ms(200)))},
		{at: at(0), want: smoothOK(10, 3, 3, at(ms(300)))},
		{at: at(0), want: smoothNo(10, 3, 3, at(ms(300)), ms(100))},
		{at: at(0), op: peek, want: smoothNo(10, 3, 3, at(ms(300)), ms(100))},
		{at: at(ms(50)), want: smoothNo(10, 3, 3, at(ms(300)), ms(50))},
		// Exactly when one unit has drained.
		{at: at(ms(100)), want: smoothOK(10, 3, 3, at(ms(400)))},
		{at: at(ms(250)), n: 2, want: smoothNo(10, 3, 2, at(ms(400)), ms(50))},
		{at: at(ms(300)), n: 2, want: smoothOK(10, 3, 3, at(ms(600)))},
		// More than the burst never fits.
		{at: at(ms(300)), n: 4, want: smoothNo(10, 3, 3, at(ms(600)), -1)},
		{at: at(sec(5)), n: 4, want: smoothNo(10, 3, 0, at(sec(5)), -1)},
		// Rested, the whole burst fits again, at once.
		{at: at(sec(5)), n: 3, want: smoothOK(10, 3, 3, at(sec(5)+ms(300)))},
	})
}

// testSmoothIntervalRoundsUp: 3 a second is one every 333334µs, never
// more often.
func testSmoothIntervalRoundsUp(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "smoothround"), Limit: 3, Window: countlimit.Smooth(time.Second, 1)}
	iv := 333334 * time.Microsecond
	e.run(rule, "a", []step{
		{at: at(0), want: smoothOK(3, 1, 1, at(iv))},
		{at: at(iv - time.Microsecond), want: smoothNo(3, 1, 1, at(iv), time.Microsecond)},
		{at: at(iv), want: smoothOK(3, 1, 1, at(2*iv))},
		{at: at(3 * iv), want: smoothOK(3, 1, 1, at(4*iv))},
	})
}

// testSmoothRefund: a refund moves the key's instant back by its weight's
// intervals, never before now.
func testSmoothRefund(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "smoothrefund"), Limit: 10, Window: countlimit.Smooth(time.Second, 3)}
	e.run(rule, "a", []step{
		{at: at(0), n: 3, want: smoothOK(10, 3, 3, at(ms(300)))},
		{at: at(ms(10)), op: refund, n: 1, want: smoothOK(10, 3, 2, at(ms(200)))},
		{at: at(ms(20)), want: smoothOK(10, 3, 3, at(ms(300)))},
		{at: at(ms(30)), op: refund, n: 5, want: smoothOK(10, 3, 0, at(ms(30)))},
		{at: at(ms(30)), n: 3, want: smoothOK(10, 3, 3, at(ms(330)))},
		// A drained key stays drained.
		{at: at(sec(1)), op: refund, n: 2, want: smoothOK(10, 3, 0, at(sec(1)))},
	})
}

// testSmoothPenalty: a denial puts the id in the penalty box; the wait is
// the later of its end and the rate's.
func testSmoothPenalty(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "smoothblock"), Limit: 1, Window: countlimit.Smooth(10*time.Second, 1), Block: time.Minute}
	e.run(rule, "a", []step{
		{at: at(0), want: smoothOK(1, 1, 1, at(sec(10)))},
		{at: at(sec(1)), want: blocked(smoothNo(1, 1, 1, at(sec(10)), sec(60)), at(sec(61)))},
		// Drained, but still in the box, which a denial does not extend.
		{at: at(sec(30)), want: blocked(smoothNo(1, 1, 0, at(sec(30)), sec(31)), at(sec(61)))},
		{at: at(sec(61)), want: smoothOK(1, 1, 1, at(sec(71)))},
	})
}

// testSmoothLimitZero: a rate of nothing allows nothing, and no wait helps.
func testSmoothLimitZero(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "smoothzero"), Limit: 0, Window: countlimit.Smooth(time.Second, 5)}
	e.run(rule, "a", []step{
		{at: at(0), want: countlimit.Result{ResetAt: at(0), RetryAfter: -1}},
		{at: at(sec(1)), op: peek, want: countlimit.Result{ResetAt: at(sec(1)), RetryAfter: -1}},
	})
}

// testSmoothDenialOfANewKey: a denied call on a key never allowed leaves
// no instant behind, not even its own now: a call whose clock reads
// earlier (read before it, sent after) finds the whole burst.
func testSmoothDenialOfANewKey(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "smoothnewdenied"), Limit: 10, Window: countlimit.Smooth(time.Second, 3)}
	e.run(rule, "a", []step{
		{at: at(ms(100)), n: 4, want: smoothNo(10, 3, 0, at(ms(100)), -1)},
		{at: at(ms(60)), n: 3, want: smoothOK(10, 3, 3, at(ms(360)))},
	})
}

// testSmoothReset: Reset forgets the key's instant and its penalty.
func testSmoothReset(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	rule := countlimit.Rule{UseType: UseType(t, "smoothreset"), Limit: 1, Window: countlimit.Smooth(time.Hour, 2), Block: time.Hour}
	e.run(rule, "a", []step{
		{at: at(0), n: 2, want: smoothOK(1, 2, 2, at(2*time.Hour))},
		{at: at(sec(1)), want: blocked(smoothNo(1, 2, 2, at(2*time.Hour), time.Hour), at(sec(1)+time.Hour))},
		{at: at(sec(2)), op: reset},
		{at: at(sec(2)), n: 2, want: smoothOK(1, 2, 2, at(sec(2)+2*time.Hour))},
	})
}

// testSmoothKindChanged: a rule changed to Smooth starts from a drained
// key, and its first event drops the window the other kind counted in; a
// rule changed from Smooth starts a fresh window, and its first event
// drops the key's instant.
func testSmoothKindChanged(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	fixed := countlimit.Rule{UseType: UseType(t, "smoothkind"), Limit: 5, Window: countlimit.Fixed(time.Hour)}
	smooth := fixed
	smooth.Window = countlimit.Smooth(time.Minute, 2) // one every 12 s
	hour := at(time.Hour)
	e.run(fixed, "a", []step{
		{at: at(0), n: 3, want: ok(5, 3, hour)},
		// Three counted: more than the burst, so the smooth rule is full
		// until the fixed window ends.
		{at: at(sec(1)), rule: &smooth, op: peek, want: smoothNo(5, 2, 2, at(sec(25)), time.Hour-sec(1))},
		{at: at(sec(1)), rule: &smooth, want: smoothNo(5, 2, 2, at(sec(25)), time.Hour-sec(1))},
		{at: at(sec(2)), want: ok(5, 4, hour)},
		{at: at(time.Hour), rule: &smooth, n: 2, want: smoothOK(5, 2, 2, at(time.Hour+sec(24)))},
		// The fixed rule joins the smooth key's window until it drains.
		{at: at(time.Hour + sec(1)), want: ok(5, 3, at(time.Hour+sec(24)))},
	})
	sliding := fixed
	sliding.Window = countlimit.Sliding(time.Minute)
	e.run(smooth, "b", []step{
		{at: at(0), n: 2, want: smoothOK(5, 2, 2, at(sec(24)))},
		// Two units, drained at 24 s: two events that leave the log then.
		{at: at(sec(1)), rule: &sliding, n: 5, want: no(5, 2, at(sec(24)), sec(23))},
		{at: at(sec(1)), rule: &sliding, n: 3, want: ok(5, 5, at(sec(24)))},
		// The log's five events are carried over: a full burst.
		{at: at(sec(2)), n: 2, want: smoothNo(5, 2, 2, at(sec(26)), sec(59))},
		{at: at(sec(3)), rule: &sliding, op: peek, want: no(5, 5, at(sec(24)), sec(21))},
	})
}

// testSmoothAllowAll: a Smooth rule beside other kinds in AllowAll is all
// or nothing: the rate's denial counts nothing anywhere, and another
// rule's denial moves no instant.
func testSmoothAllowAll(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	smooth := countlimit.Rule{UseType: UseType(t, "allsmooth"), Limit: 6, Window: countlimit.Smooth(time.Minute, 2)}
	fixed := countlimit.Rule{UseType: UseType(t, "allfixed"), Limit: 3, Window: countlimit.Fixed(time.Hour)}
	want := func(step int, got []countlimit.Result, allowed bool, smoothUsed, fixedUsed int64, retry time.Duration) {
		t.Helper()
		if got[0].Allowed != allowed || got[1].Allowed != allowed || got[0].Used != smoothUsed || got[1].Used != fixedUsed ||
			got[0].RetryAfter != retry || got[1].RetryAfter != retry {
			t.Errorf("step %d: AllowAll(smooth, fixed) = %+v, want allowed %v, used %d and %d, RetryAfter %v", step, got, allowed, smoothUsed, fixedUsed, retry)
		}
	}
	e.clock.Set(at(0))
	want(1, e.allowAll("a", smooth, fixed), true, 1, 1, 0)
	want(2, e.allowAll("a", smooth, fixed), true, 2, 2, 0)
	// The burst is spent: the rate denies, the fixed window counts nothing.
	want(3, e.allowAll("a", smooth, fixed), false, 2, 2, sec(10))
	e.clock.Set(at(sec(10)))
	want(4, e.allowAll("a", smooth, fixed), true, 2, 3, 0)
	// The fixed window is full: the instant does not move.
	e.clock.Set(at(sec(40)))
	want(5, e.allowAll("a", smooth, fixed), false, 0, 3, time.Hour-sec(40))
	e.run(smooth, "a", []step{{at: at(sec(40)), op: peek, want: smoothOK(6, 2, 0, at(sec(40)))}})
}

// testSmoothConcurrentExactlyBurst: many callers on one key at one
// instant get exactly its burst.
func testSmoothConcurrentExactlyBurst(t *testing.T, newStore func(*testing.T) driver.Store) {
	clock := NewClock(t0)
	ls := []*countlimit.Limiter{
		countlimit.New(newStore(t), countlimit.WithClock(clock.Now)),
		countlimit.New(newStore(t), countlimit.WithClock(clock.Now)),
	}
	rule := countlimit.Rule{UseType: UseType(t, "smoothstorm"), Limit: 10, Window: countlimit.Smooth(time.Hour, 100)}
	allowed := hammer(t, 64, 8, func(g int) (bool, error) {
		r, err := ls[g%2].Allow(context.Background(), rule, "hot-key")
		return r.Allowed, err
	})
	if allowed != 100 {
		t.Errorf("%d allowed, want exactly the burst, 100", allowed)
	}
	r, err := ls[0].Peek(context.Background(), rule, "hot-key")
	if err != nil {
		t.Fatal(err)
	}
	if r.Used != 100 || !r.ResetAt.Equal(at(100*6*time.Minute)) {
		t.Errorf("after the storm: Used %d, ResetAt %s; want 100, %s", r.Used, fmtTime(r.ResetAt), fmtTime(at(100*6*time.Minute)))
	}
}

// testSmoothRealClock: callers of weight 1 and 2 on the wall clock, two
// Limiters, never get more than the rate allows over the time they ran:
// burst + the intervals from the first clock read to the last. (How much
// less depends on the machine's speed: no lower bound is asserted.)
func testSmoothRealClock(t *testing.T, newStore func(*testing.T) driver.Store) {
	ls := []*countlimit.Limiter{countlimit.New(newStore(t)), countlimit.New(newStore(t))}
	rule := countlimit.Rule{UseType: UseType(t, "smoothreal"), Limit: 1000, Window: countlimit.Smooth(time.Second, 10)} // one a millisecond
	var weight atomic.Int64
	begin := expose.Now(ls[0])
	hammer(t, 16, 50, func(g int) (bool, error) {
		n := int64(1 + g%2)
		r, err := ls[g%2].AllowN(context.Background(), rule, "hot-key", n)
		if r.Allowed {
			weight.Add(n)
		}
		return r.Allowed, err
	})
	elapsed := expose.Now(ls[0]).Sub(begin)
	if most := 10 + int64(elapsed/time.Millisecond) + 1; weight.Load() > most {
		t.Errorf("%d allowed in %v, more than the burst of 10 and one a millisecond allow (%d)", weight.Load(), elapsed, most)
	}
	if weight.Load() < 10 {
		t.Errorf("%d allowed, fewer than the burst of 10 a fresh key takes at once", weight.Load())
	}
}
