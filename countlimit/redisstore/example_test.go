package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/redisstore/redisstoretest"
	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

// A Store on a go-redis client; a *redis.ClusterClient works the same way.
// ContextTimeoutEnabled makes the client honour context deadlines. (This
// example needs Redis at that address, so it is compiled, not run;
// ExampleNew runs.)
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close() // a Store has no Close of its own
	limiter := countlimit.New(redisstore.New(client), countlimit.WithStoreTimeout(200*time.Millisecond))

	sms := countlimit.Rule{UseType: "sms.code", Limit: 2, Window: countlimit.Sliding(5 * time.Minute)}
	res, err := limiter.Allow(context.Background(), sms, "18500000000")
	if err != nil {
		log.Fatal(err) // ErrUnavailable: Redis failed or did not answer in time
	}
	fmt.Println(res.Allowed, res.Remaining)
}

// SMS codes for one phone, 2 per 5 minutes (a sliding window), on a
// database of its own (redisstoretest; in your code, the client of the
// Example above): the third is denied until the first is 5 minutes old.
func ExampleNew() {
	t := testenv.ExampleTB() // in a test of yours: its *testing.T
	ctx := context.Background()
	at := time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC)
	now := func() time.Time { return at }
	limiter := countlimit.New(redisstore.New(redisstoretest.Client(t)), countlimit.WithClock(now))
	sms := countlimit.Rule{UseType: "sms.code", Limit: 2, Window: countlimit.Sliding(5 * time.Minute)}

	for _, min := range []int{0, 1, 2, 5} {
		at = time.Date(2026, 5, 11, 9, min, 0, 0, time.UTC)
		res, err := limiter.Allow(ctx, sms, "18500000000")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("09:%02d allowed=%v remaining=%d retry after %v\n", min, res.Allowed, res.Remaining, res.RetryAfter)
	}
	// Output:
	// 09:00 allowed=true remaining=1 retry after 0s
	// 09:01 allowed=true remaining=0 retry after 0s
	// 09:02 allowed=false remaining=0 retry after 3m0s
	// 09:05 allowed=true remaining=0 retry after 0s
}

// At start, and in a health check, ask whether Redis may evict counters: a
// Redis whose maxmemory-policy is not noeviction drops keys when its
// memory is full, and ids whose counters went are allowed anew. (Compiled,
// not run: it needs Redis at that address.)
func ExampleStore_CheckEviction() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	store := redisstore.New(client)

	switch err := store.CheckEviction(context.Background()); {
	case errors.Is(err, redisstore.ErrEvictionPolicy):
		log.Printf("unsafe: %v", err) // names the policy; fail the health check
	case errors.Is(err, redisstore.ErrPolicyUnknown):
		log.Printf("make sure Redis runs with maxmemory-policy noeviction: %v", err) // CONFIG refused
	case err != nil:
		log.Printf("Redis did not answer: %v", err)
	}
}

// At start, and in a health check, ask whether Redis keeps counts across a
// restart: one that persists nothing comes back empty and admits every id
// anew. Whether that is acceptable is yours to decide, so warn rather than
// fail. (Compiled, not run: it needs Redis at that address.)
func ExampleStore_CheckPersistence() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer client.Close()
	store := redisstore.New(client)

	switch err := store.CheckPersistence(context.Background()); {
	case errors.Is(err, redisstore.ErrNoPersistence):
		log.Printf("warning: %v", err) // a restart forgets every count
	case errors.Is(err, redisstore.ErrPolicyUnknown):
		log.Printf("make sure Redis persists (AOF or snapshots) if counts must outlive a restart: %v", err) // CONFIG refused
	case err != nil:
		log.Printf("Redis did not answer: %v", err)
	}
}
