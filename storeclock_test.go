package countlimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

// TestStoreClocks reads every store's own clock (PostgreSQL's
// clock_timestamp(), Redis's TIME) and checks a Limiter that takes "now"
// from it. The servers run on this machine, so their clocks agree with
// this process's to well within a second.
func TestStoreClocks(t *testing.T) {
	for _, b := range testbackend.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			store := b.Open(t)
			sc, ok := store.(driver.StoreClock)
			if !ok {
				t.Fatalf("%T does not implement driver.StoreClock", store)
			}
			ctx := context.Background()
			before := time.Now()
			got, err := sc.StoreTime(ctx)
			after := time.Now()
			if err != nil {
				t.Fatalf("StoreTime: %v", err)
			}
			if got.Before(before.Add(-time.Second)) || got.After(after.Add(time.Second)) {
				t.Errorf("StoreTime = %v, want between %v and %v (± 1s)", got, before, after)
			}
			if got != got.Truncate(time.Microsecond) {
				t.Errorf("StoreTime = %v, want microseconds at most", got)
			}

			l := countlimit.New(store, countlimit.WithStoreClock(0))
			rule := countlimit.Rule{UseType: countlimit.UseType("clock." + t.Name()), Limit: 1, Window: countlimit.Fixed(time.Hour)}
			id := time.Now().Format(time.RFC3339Nano)
			res, err := l.Allow(ctx, rule, id)
			if err != nil || !res.Allowed {
				t.Fatalf("Allow on the store's clock = %+v, %v; want allowed", res, err)
			}
			if res, err := l.Allow(ctx, rule, id); err != nil || res.Allowed || res.RetryAfter <= 0 || res.RetryAfter > time.Hour {
				t.Fatalf("second Allow on the store's clock = %+v, %v; want denied, RetryAfter within the hour", res, err)
			}
		})
	}
}
