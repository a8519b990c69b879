package countlimit_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testbackend"
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
			l := countlimit.New(store, countlimit.WithClock(clock.Now),
				countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 3, CoolDown: time.Hour}))
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
				if ok, err := l.CheckLimit(ctx, ut, "edge"+strconv.Itoa(begin.Year()), 10, countlimit.MaxDuration, begin); err != nil || !ok {
					t.Errorf("CheckLimit with beginTime %v and the longest duration = %v, %v; want allowed", begin, ok, err)
				}
			}

			// A clock that reads outside the range.
			far := countlimit.New(store, countlimit.WithClock(func() time.Time { return time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC) }),
				countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{Failures: 1, CoolDown: time.Hour}))
			rule := countlimit.Rule{UseType: ut, Limit: 10, Window: countlimit.Fixed(time.Hour)}
			if res, err := far.Allow(ctx, rule, "clock"); !errors.Is(err, countlimit.ErrInvalid) || !strings.Contains(err.Error(), "clock") {
				t.Errorf("Allow on a clock in year 300000 = %+v, %v; want ErrInvalid naming the clock", res, err)
			}
			if st := far.Stats(); st.Failures != 0 || st.Breaker != countlimit.BreakerClosed {
				t.Errorf("after a bad clock reading: %+v; want no store failure, breaker closed", st)
			}

			if st := l.Stats(); st.Failures != 0 || st.Breaker != countlimit.BreakerClosed {
				t.Errorf("after 60 bad beginTimes: %+v; want no store failure, breaker closed", st)
			}
			if res, err := l.Allow(ctx, rule, "another"); err != nil || !res.Allowed {
				t.Errorf("Allow of another id afterwards = %+v, %v; want allowed", res, err)
			}
		})
	}
}
