package countlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// After 5 failed logins in 15 minutes, lock the IP out for 30 minutes.
// Support can unlock it with Reset.
func ExampleRule_block() {
	store := memstore.New()
	defer store.Close()
	now, set := clockAt(time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC))
	limiter := countlimit.New(store, countlimit.WithClock(now))
	ctx := context.Background()
	login := countlimit.Rule{UseType: "login.failed", Limit: 5, Window: countlimit.Rolling(15 * time.Minute), Block: 30 * time.Minute}

	for i := 0; i < 6; i++ {
		limiter.Allow(ctx, login, "203.0.113.9")
	}
	set(now().Add(20 * time.Minute)) // the window is over; the penalty is not
	res, _ := limiter.Allow(ctx, login, "203.0.113.9")
	fmt.Println("allowed:", res.Allowed, "blocked until:", res.BlockedUntil.Format("15:04"), "retry in", res.RetryAfter)

	limiter.Reset(ctx, login, "203.0.113.9")
	res, _ = limiter.Allow(ctx, login, "203.0.113.9")
	fmt.Println("after Reset:", res.Allowed)
	// Output:
	// allowed: false blocked until: 09:30 retry in 10m0s
	// after Reset: true
}
