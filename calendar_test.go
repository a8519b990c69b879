package countlimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/storetest"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestCalendarDayBeginsAtTheFirstMidnight: on 2021-10-29 Amman's clocks
// went back from 01:00 to 00:00, so midnight happened twice (21:00 and
// 22:00 UTC). The 29th begins at the first: a call at 00:30 local, between
// the two, is on a new day, on every store.
func TestCalendarDayBeginsAtTheFirstMidnight(t *testing.T) {
	amman, err := time.LoadLocation("Asia/Amman")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range testbackend.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			clock := storetest.NewClock(time.Date(2021, 10, 28, 20, 0, 0, 0, time.UTC)) // 23:00 local on the 28th
			l := countlimit.New(b.Open(t), countlimit.WithClock(clock.Now))
			rule := countlimit.Rule{UseType: storetest.UseType(t, "cal.amman"), Limit: 1, Window: countlimit.Calendar(countlimit.Day, amman)}
			first := time.Date(2021, 10, 28, 21, 0, 0, 0, time.UTC)
			if res, err := l.Allow(ctx, rule, "u"); err != nil || !res.Allowed || !res.ResetAt.Equal(first) {
				t.Fatalf("Allow at 23:00 on the 28th = %+v, %v; want allowed, ResetAt %v (the first midnight)", res, err, first)
			}
			clock.Set(time.Date(2021, 10, 28, 21, 30, 0, 0, time.UTC)) // 00:30 local on the 29th, before the second midnight
			next := time.Date(2021, 10, 29, 22, 0, 0, 0, time.UTC)
			if res, err := l.Allow(ctx, rule, "u"); err != nil || !res.Allowed || res.Used != 1 || !res.ResetAt.Equal(next) {
				t.Fatalf("Allow at 00:30 on the 29th = %+v, %v; want allowed on a new day, Used 1, ResetAt %v", res, err, next)
			}
		})
	}
}
