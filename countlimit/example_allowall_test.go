package countlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// At most 10 new conversations per hour AND 50 per day: when either rule
// denies, neither counts.
func ExampleLimiter_AllowAll() {
	store := memstore.New()
	defer store.Close()
	now, _ := clockAt(time.Date(2026, 5, 11, 9, 30, 0, 0, time.UTC))
	limiter := countlimit.New(store, countlimit.WithClock(now))
	hourly := countlimit.Rule{UseType: "conversation.hour", Limit: 10, Window: countlimit.Fixed(time.Hour)}
	daily := countlimit.Rule{UseType: "conversation.day", Limit: 50, Window: countlimit.Calendar(countlimit.Day, time.UTC)}

	var res []countlimit.Result
	for i := 0; i < 11; i++ {
		res, _ = limiter.AllowAll(context.Background(), "user-7", hourly, daily)
	}
	fmt.Printf("11th: allowed=%v hourly used=%d daily used=%d retry in %v\n", res[0].Allowed, res[0].Used, res[1].Used, res[0].RetryAfter)
	// Output:
	// 11th: allowed=false hourly used=10 daily used=10 retry in 30m0s
}
