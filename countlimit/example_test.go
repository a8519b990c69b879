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

// A batch larger than the limit never fits: no wait helps, and RetryAfter
// says so.
func ExampleRetryNever() {
	store := memstore.New()
	defer store.Close()
	limiter := countlimit.New(store)
	rule := countlimit.Rule{UseType: "export.rows", Limit: 1000, Window: countlimit.Fixed(time.Hour)}
	res, err := limiter.AllowN(context.Background(), rule, "user-42", 5000)
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Allowed, res.RetryAfter == countlimit.RetryNever)
	// Output: false true
}
