package countlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// A phone number may receive 2 SMS codes per 5 minutes, in any 5 minutes
// (an exact sliding log). When sending fails, the code is refunded.
func ExampleLimiter_Refund() {
	store := memstore.New()
	defer store.Close()
	now, set := clockAt(time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC))
	limiter := countlimit.New(store, countlimit.WithClock(now))
	ctx := context.Background()
	sms := countlimit.Rule{UseType: "sms.code", Limit: 2, Window: countlimit.Sliding(5 * time.Minute)}

	res, _ := limiter.Allow(ctx, sms, "+8618500000000")
	fmt.Println("first code:", res.Allowed)
	// The SMS gateway failed: give the attempt back.
	res, _ = limiter.Refund(ctx, sms, "+8618500000000", 1)
	fmt.Println("after refund, used:", res.Used)

	set(now().Add(time.Minute))
	limiter.Allow(ctx, sms, "+8618500000000")
	limiter.Allow(ctx, sms, "+8618500000000")
	res, _ = limiter.Allow(ctx, sms, "+8618500000000")
	fmt.Println("third code within 5 minutes:", res.Allowed, "retry in", res.RetryAfter)
	// Output:
	// first code: true
	// after refund, used: 0
	// third code within 5 minutes: false retry in 5m0s
}
