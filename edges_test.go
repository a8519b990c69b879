package countlimit_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/testkit/tally"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/leaseforge"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestTimesOutsideTheRangeAreInvalid: an instant that no store keeps
// exactly (a CheckLimit beginTime, a clock reading) is ErrInvalid naming
// its field, on every store: nothing is counted or written, and the circuit
// breaker does not see a store failure.
func TestTimesOutsideTheRangeAreInvalid(t *testing.T) {
	for _, b := range testbackend.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			store := b.Open(t)
			ctx := context.Background()
			clock := storetest.NewClock(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
			var tl, farTally tally.Tally
			l := countlimit.New(store, countlimit.WithClock(clock.Now), countlimit.WithObserver(tl.Observer()),
				countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 3, CoolDown: time.Hour, OnChange: tl.BreakerChanged}))
			ut := storetest.UseType(t, "edge.begin")
			for _, begin := range []time.Time{
				time.Date(292278, 12, 1, 0, 0, 0, 0, time.UTC), // its microseconds overflow int64
				time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC),
				time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC),
				time.Date(2150, 1, 1, 0, 0, 0, 0, time.UTC), // the first instant past the range
				time.Date(1969, 12, 31, 23, 59, 59, 999999000, time.UTC),
			} {
				id := "u" + strconv.Itoa(begin.Year())
				allowed := 0
				for i := range 12 {
					ok, err := l.CheckLimit(ctx, ut, id, 10, time.Hour, begin)
					if ok {
						allowed++
					}
					if !errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), "beginTime") {
						t.Fatalf("CheckLimit #%d with beginTime %v = %v, %v; want ErrInvalid naming beginTime", i+1, begin, ok, err)
					}
				}
				if allowed > 0 {
					t.Errorf("beginTime %v: %d of 12 allowed with limit 10", begin, allowed)
				}
				res, err := l.Peek(ctx, countlimit.Rule{UseType: ut, Limit: 10, Window: countlimit.Lifetime()}, id)
				if err != nil || res.Used != 0 {
					t.Errorf("beginTime %v: Peek afterwards = %+v, %v; want nothing counted", begin, res, err)
				}
			}
			// The edges of the range are good.
			for _, begin := range []time.Time{time.Unix(0, 0), time.Date(2149, 12, 31, 23, 59, 59, 999999000, time.UTC)} {
				if ok, err := l.CheckLimit(ctx, ut, "edge"+strconv.Itoa(begin.Year()), 10, expose.MaxDuration, begin); err != nil || !ok {
					t.Errorf("CheckLimit with beginTime %v and the longest duration = %v, %v; want allowed", begin, ok, err)
				}
			}

			// A clock that reads outside the range.
			far := countlimit.New(store, countlimit.WithClock(func() time.Time { return time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC) }),
				countlimit.WithObserver(farTally.Observer()),
				countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 1, CoolDown: time.Hour, OnChange: farTally.BreakerChanged}))
			rule := countlimit.Rule{UseType: ut, Limit: 10, Window: countlimit.Fixed(time.Hour)}
			if res, err := far.Allow(ctx, rule, "clock"); !errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), "clock") {
				t.Errorf("Allow on a clock in year 300000 = %+v, %v; want ErrInvalid naming the clock", res, err)
			}
			if st := farTally.Counts(); st.Failures != 0 || st.BreakerOpenings != 0 {
				t.Errorf("after a bad clock reading: %+v; want no store failure, breaker closed", st)
			}

			if st := tl.Counts(); st.Failures != 0 || st.BreakerOpenings != 0 {
				t.Errorf("after 60 bad beginTimes: %+v; want no store failure, breaker closed", st)
			}
			if res, err := l.Allow(ctx, rule, "another"); err != nil || !res.Allowed {
				t.Errorf("Allow of another id afterwards = %+v, %v; want allowed", res, err)
			}
		})
	}
}

// TestLeaseLivesByItsRule: the holder of an unsigned lease string cannot
// make the lease outlive its rule's ttl by editing the string, on every
// store.
func TestLeaseLivesByItsRule(t *testing.T) {
	for _, b := range testbackend.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			store := b.Open(t)
			ctx := context.Background()
			clock := storetest.NewClock(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
			l := countlimit.New(store, countlimit.WithClock(clock.Now))
			rule := countlimit.Rule{UseType: storetest.UseType(t, "edge.lease"), Limit: 1, Window: countlimit.Concurrent(10 * time.Second)}
			ls, res, err := l.Acquire(ctx, rule, "holder")
			if err != nil || !res.Allowed {
				t.Fatalf("Acquire = %+v, %v", res, err)
			}
			forged := leaseforge.WithTTL(ls.String(), 100*365*24*time.Hour)
			if forged == "" {
				t.Fatalf("lease string %q is not an unsigned lease string", ls.String())
			}
			if fl, err := l.ParseLease(forged, rule); err == nil {
				// Today's code takes it: the extend below is what the forgery buys.
				clock.Set(clock.Now().Add(5 * time.Second))
				if err := fl.Extend(ctx); err != nil {
					t.Fatalf("Extend of the forged lease: %v", err)
				}
			} else if !errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), "ttl") {
				t.Errorf("ParseLease of a lease whose ttl was edited = %v; want ErrInvalid naming the ttl", err)
			}
			// Past the rule's ttl from the last real grant, the slot is free.
			clock.Set(clock.Now().Add(11 * time.Second))
			if res, err := l.Peek(ctx, rule, "holder"); err != nil || res.Used != 0 {
				t.Errorf("Peek 16 s after a 10 s lease was taken (its string edited to 100 years and extended) = %+v, %v; want the slot free", res, err)
			}
			// The genuine string still parses, and lives by the rule.
			if _, err := l.ParseLease(ls.String(), rule); err != nil {
				t.Errorf("ParseLease of the genuine string: %v", err)
			}
			other := rule
			other.Window = countlimit.Concurrent(time.Hour)
			if _, err := l.ParseLease(ls.String(), other); !errors.Is(err, countlimit.ErrInvalid) {
				t.Errorf("ParseLease with a rule of another ttl = %v; want ErrInvalid", err)
			}
		})
	}
}
