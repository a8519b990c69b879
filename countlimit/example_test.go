package countlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// clockAt returns a stubbed clock for deterministic examples, and a func to
// move it.
func clockAt(t time.Time) (func() time.Time, func(time.Time)) {
	return func() time.Time { return t }, func(nt time.Time) { t = nt }
}

// A user may change the password 3 times per natural day in Shanghai.
func Example() {
	store := memstore.New()
	defer store.Close()
	shanghai, _ := time.LoadLocation("Asia/Shanghai")
	now, _ := clockAt(time.Date(2026, 5, 11, 21, 0, 0, 0, shanghai))
	limiter := countlimit.New(store, countlimit.WithClock(now))

	rule := countlimit.Rule{UseType: "password.change", Limit: 3, Window: countlimit.Calendar(countlimit.Day, shanghai)}
	for i := 0; i < 4; i++ {
		res, err := limiter.Allow(context.Background(), rule, "user-42")
		if err != nil {
			panic(err)
		}
		fmt.Printf("change %d: allowed=%v remaining=%d retry in %v\n", i+1, res.Allowed, res.Remaining, res.RetryAfter)
	}
	// Output:
	// change 1: allowed=true remaining=2 retry in 0s
	// change 2: allowed=true remaining=1 retry in 0s
	// change 3: allowed=true remaining=0 retry in 0s
	// change 4: allowed=false remaining=0 retry in 3h0m0s
}

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

// Bronze members may post 3 times an hour, silver 5, gold 8: one UseType,
// the limit chosen per call.
func ExampleRule_tiers() {
	store := memstore.New()
	defer store.Close()
	limiter := countlimit.New(store)
	limits := map[string]int64{"bronze": 3, "silver": 5, "gold": 8}
	post := func(tier string) countlimit.Rule {
		return countlimit.Rule{UseType: "post.create", Limit: limits[tier], Window: countlimit.Fixed(time.Hour)}
	}
	allowed := 0
	for i := 0; i < 10; i++ {
		if res, _ := limiter.Allow(context.Background(), post("silver"), "member-1"); res.Allowed {
			allowed++
		}
	}
	fmt.Println("silver posts allowed:", allowed)
	// Output:
	// silver posts allowed: 5
}

// CheckLimit is the classic model: a natural day is "beginTime = today's
// midnight, duration = 24h".
func ExampleLimiter_CheckLimit() {
	store := memstore.New()
	defer store.Close()
	now, _ := clockAt(time.Date(2026, 5, 11, 15, 0, 0, 0, time.UTC))
	limiter := countlimit.New(store, countlimit.WithClock(now))
	midnight := time.Date(2026, 5, 11, 0, 0, 0, 0, time.UTC)
	for i := 0; i < 3; i++ {
		ok, _ := limiter.CheckLimit(context.Background(), "article.pin", "user-1", 2, 24*time.Hour, midnight)
		fmt.Println(ok)
	}
	// Output:
	// true
	// true
	// false
}
