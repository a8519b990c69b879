package countlimit_test

import (
	"context"
	"testing"
	"time"

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
	rule := countlimit.Rule{UseType: "api", Limit: countlimit.MaxLimit, Window: countlimit.Fixed(time.Hour)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := l.Allow(ctx, rule, "user-1"); err != nil {
			b.Fatal(err)
		}
	}
}
