package redisstoretest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/redisstore/redisstoretest"
	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

// A test of yours gets a Redis database of its own, empty, on real Redis:
// here, that a phone may receive 2 SMS codes in any 5 minutes.
func ExampleClient() {
	t := testenv.ExampleTB() // in your test: its *testing.T
	ctx := context.Background()

	rdb := redisstoretest.Client(t)
	now := func() time.Time { return time.Date(2026, 5, 11, 21, 0, 0, 0, time.UTC) }
	limiter := countlimit.New(redisstore.New(rdb), countlimit.WithClock(now))
	rule := countlimit.Rule{UseType: "sms.code", Limit: 2, Window: countlimit.Sliding(5 * time.Minute)}
	for i := range 3 {
		res, err := limiter.Allow(ctx, rule, "18500000000")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("code %d: allowed=%v retry in %v\n", i+1, res.Allowed, res.RetryAfter)
	}
	// Output:
	// code 1: allowed=true retry in 0s
	// code 2: allowed=true retry in 0s
	// code 3: allowed=false retry in 5m0s
}

// Code under test that opens its own client gets a URL of an empty
// database.
func ExampleURL() {
	t := testenv.ExampleTB() // in your test: its *testing.T
	ctx := context.Background()

	opts, err := redis.ParseURL(redisstoretest.URL(t)) // as the code under test would
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	keys, err := rdb.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("keys:", keys)
	// Output: keys: 0
}
