package countlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// An API key may call 10 times a second, evenly, with bursts of up to 20:
// a fresh key takes 20 at once, then one more every 100ms. RetryAfter is
// exact.
func ExampleSmooth() {
	store := memstore.New()
	defer store.Close()
	now, set := clockAt(time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC))
	limiter := countlimit.New(store, countlimit.WithClock(now))
	ctx := context.Background()
	api := countlimit.Rule{UseType: "api.call", Limit: 10, Window: countlimit.Smooth(time.Second, 20)}

	allowed := 0
	for range 25 {
		if res, _ := limiter.Allow(ctx, api, "key-1"); res.Allowed {
			allowed++
		}
	}
	res, _ := limiter.Allow(ctx, api, "key-1")
	fmt.Println("at once:", allowed, "allowed; retry in", res.RetryAfter, "; drained at", res.ResetAt.Format("15:04:05.000"))

	set(now().Add(250 * time.Millisecond))
	res, _ = limiter.AllowN(ctx, api, "key-1", 2)
	fmt.Println("250ms later, 2 more:", res.Allowed, "remaining", res.Remaining)
	res, _ = limiter.AllowN(ctx, api, "key-1", 21)
	fmt.Println("more than the burst:", res.Allowed, "retry", res.RetryAfter)
	// Output:
	// at once: 20 allowed; retry in 100ms ; drained at 09:00:02.000
	// 250ms later, 2 more: true remaining 0
	// more than the burst: false retry -1ns
}
