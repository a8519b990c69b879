package storetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
)

// testWindowKindChanged pins what a rule whose Window changes kind sees
// (Rule's doc says it): one count per use type and id, carried over until
// the window that holds it ends. A window of a kind that counts in windows
// is joined while it is current, a sliding log's and a smooth key's
// included; a Sliding rule reads another kind's count as that many events
// logged at the latest instant that lets them leave when that window ends
// (never after now); a Smooth rule as that many units taken now, a full
// burst at the most, and, denied, room when that window ends.
func testWindowKindChanged(t *testing.T, newStore func(*testing.T) driver.Store) {
	e := newEnv(t, newStore)
	sliding := countlimit.Rule{UseType: UseType(t, "kind"), Limit: 5, Window: countlimit.Sliding(time.Minute)}
	fixed := sliding
	fixed.Window = countlimit.Fixed(time.Hour)
	e.run(sliding, "a", []step{
		{at: at(0), want: ok(5, 1, at(time.Minute))},
		// The sliding log is a window to the fixed rule, current until its
		// last event leaves: the fixed rule counts in it.
		{at: at(sec(1)), rule: &fixed, want: ok(5, 2, at(time.Minute))},
		// Back to a log: two events that leave when that window ends.
		{at: at(sec(2)), op: peek, want: ok(5, 2, at(time.Minute))},
		{at: at(sec(3)), n: 3, want: ok(5, 5, at(time.Minute))},
		{at: at(sec(4)), rule: &fixed, want: no(5, 5, at(sec(3)+time.Minute), time.Minute-sec(1))},
	})
	e.run(sliding, "b", []step{
		{at: at(0), want: ok(5, 1, at(time.Minute))},
		{at: at(sec(1)), want: ok(5, 2, at(time.Minute))},
		{at: at(sec(2)), op: refund, n: 1, want: ok(5, 1, at(time.Minute))},
		{at: at(sec(3)), rule: &fixed, op: peek, want: ok(5, 1, at(time.Minute))},
	})
	// A rule changed to Sliding keeps what the other kind counted until
	// its window ends: here the hour's end, beyond the log's span, so the
	// events are logged at the change and the wait is to the hour's end.
	e.run(fixed, "c", []step{
		{at: at(0), n: 3, want: ok(5, 3, at(time.Hour))},
		{at: at(sec(1)), rule: &sliding, op: peek, want: ok(5, 3, at(sec(1)+time.Minute))},
		{at: at(sec(2)), rule: &sliding, n: 3, want: no(5, 3, at(sec(2)+time.Minute), time.Hour-sec(2))},
		{at: at(sec(2)), rule: &sliding, n: 2, want: ok(5, 5, at(sec(2)+time.Minute))},
		{at: at(sec(3)), op: peek, want: no(5, 5, at(sec(2)+time.Minute), time.Minute-sec(1))},
		{at: at(sec(62)), rule: &sliding, want: ok(5, 1, at(sec(62)+time.Minute))},
	})
	// A rule changed to Smooth: the count becomes that many units taken
	// at the change, which drain at the rule's rate (12 minutes each).
	smooth := fixed
	smooth.Window = countlimit.Smooth(time.Hour, 5)
	unit := 12 * time.Minute
	e.run(fixed, "d", []step{
		{at: at(0), n: 4, want: ok(5, 4, at(time.Hour))},
		{at: at(sec(1)), rule: &smooth, want: smoothOK(5, 5, 5, at(sec(1)+5*unit))},
		{at: at(sec(2)), rule: &smooth, want: smoothNo(5, 5, 5, at(sec(1)+5*unit), unit-sec(1))},
		// Back to the fixed rule: it joins the smooth key's window, with
		// the units it had when last counted, until it is drained.
		{at: at(sec(3)), rule: &fixed, want: no(5, 5, at(sec(1)+5*unit), 5*unit-sec(2))},
		{at: at(sec(1) + unit), rule: &smooth, want: smoothOK(5, 5, 5, at(sec(1)+unit+5*unit))},
	})
	// A count above the smooth rule's burst fills it until the window
	// that holds the count ends, and RetryAfter says so.
	narrow := fixed
	narrow.Window = countlimit.Smooth(time.Hour, 2)
	e.run(fixed, "e", []step{
		{at: at(0), n: 4, want: ok(5, 4, at(time.Hour))},
		{at: at(sec(1)), rule: &narrow, want: smoothNo(5, 2, 2, at(sec(1)+2*unit), time.Hour-sec(1))},
		{at: at(time.Hour), rule: &narrow, want: smoothOK(5, 2, 1, at(time.Hour+unit))},
	})
	// A lifetime count never ends: no wait helps the Sliding rule.
	lifetime := fixed
	lifetime.Window = countlimit.Lifetime()
	e.run(lifetime, "f", []step{
		{at: at(0), n: 5, want: ok(5, 5, time.Time{})},
		{at: at(sec(1)), rule: &sliding, want: no(5, 5, at(sec(1)+time.Minute), -1)},
	})
}

// testKindsTakeTurns: two rules of different kinds for one use type, one
// call a second by turns, as two processes whose rule files differ send
// them during a rolling change: within the window the id is allowed the
// larger of the two limits at most, and at least the smaller, for every
// pair of kinds that count events.
func testKindsTakeTurns(t *testing.T, newStore func(*testing.T) driver.Store) {
	kinds := []countlimit.Window{
		countlimit.Fixed(time.Hour),
		countlimit.Rolling(time.Hour),
		countlimit.Calendar(countlimit.Day, time.UTC),
		countlimit.Lifetime(),
		countlimit.Sliding(time.Hour),
		countlimit.Smooth(time.Hour, 5),
	}
	clock := NewClock(t0)
	l := countlimit.New(newStore(t), countlimit.WithClock(clock.Now))
	for i, a := range kinds {
		for _, b := range kinds[i+1:] {
			for _, limits := range [][2]int64{{5, 5}, {5, 8}, {8, 5}} {
				ut := UseType(t, "turns")
				rules := [2]countlimit.Rule{
					{UseType: ut, Limit: limits[0], Window: a},
					{UseType: ut, Limit: limits[1], Window: b},
				}
				if expose.WindowOf(rules[1].Window).Smooth {
					rules[1].Window = countlimit.Smooth(time.Hour, limits[1])
				}
				allowed := 0
				for k := range 40 {
					clock.Set(at(sec(k)))
					res, err := l.Allow(context.Background(), rules[k%2], "u1")
					if err != nil {
						t.Fatalf("%v then %v, call %d: %v", rules[0].Window, rules[1].Window, k, err)
					}
					if res.Allowed {
						allowed++
					}
				}
				lo, hi := min(limits[0], limits[1]), max(limits[0], limits[1])
				if int64(allowed) > hi || int64(allowed) < lo {
					t.Errorf("%s limit %d and %s limit %d by turns, 40 calls a second apart: %d allowed, want %d to %d",
						kindName(rules[0].Window), limits[0], kindName(rules[1].Window), limits[1], allowed, lo, hi)
				}
			}
		}
	}
}

// kindName is a window's kind: its String up to the first space.
func kindName(w countlimit.Window) string {
	k, _, _ := strings.Cut(w.String(), " ")
	return k
}
