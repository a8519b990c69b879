package countlimit_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countlimit/countlimit/internal/expose"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
)

// nopStore allows everything and keeps nothing: what the Limiter costs on
// its own around a store.
type nopStore struct{}

func (nopStore) Do(_ context.Context, r *driver.Request) error {
	for i := range r.Checks {
		c := &r.Checks[i]
		c.State = driver.State{Allowed: true, Used: 1, Begin: c.Begin, End: c.End}
	}
	return nil
}

// BenchmarkLimiterOverhead is Allow on a store that does nothing:
// validation, the clock, the window's bounds and the Result.
func BenchmarkLimiterOverhead(b *testing.B) {
	l := countlimit.New(nopStore{})
	ctx := context.Background()
	rule := countlimit.Rule{UseType: "api", Limit: expose.MaxLimit, Window: countlimit.Fixed(time.Hour)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Allow(ctx, rule, "user-1"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWaitWithRoom is Wait where Allow would be allowed, against
// Allow, on a store that does nothing: what taking a turn in the line for
// the rule and id costs when nobody waits, serially and from every CPU on
// ids of their own.
func BenchmarkWaitWithRoom(b *testing.B) {
	l := countlimit.New(nopStore{})
	rule := countlimit.Rule{UseType: "api", Limit: expose.MaxLimit, Window: countlimit.Fixed(time.Hour)}
	for _, side := range []struct {
		name string
		call func(context.Context, countlimit.Rule, string) (countlimit.Result, error)
	}{{"allow", l.Allow}, {"wait", l.Wait}} {
		b.Run(side.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := side.call(ctx, rule, "user-1"); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(side.name+"/parallel", func(b *testing.B) {
			var next atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				id := "user-" + strconv.FormatInt(next.Add(1), 10)
				for pb.Next() {
					if _, err := side.call(ctx, rule, id); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
