package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
)

// A Store on a go-redis client; a *redis.ClusterClient works the same way.
// ContextTimeoutEnabled makes the client honour context deadlines.
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
