package memstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// A store of its own per process: the counters live in memory, bounded in
// bytes, and expired ones are dropped by the janitor, which Close stops.
func Example() {
	store := memstore.New(memstore.WithMaxBytes(64 << 20))
	defer store.Close()
	limiter := countlimit.New(store)

	pin := countlimit.Rule{UseType: "article.pin", Limit: 1, Window: countlimit.Fixed(30 * 24 * time.Hour)}
	for range 2 {
		res, err := limiter.Allow(context.Background(), pin, "author-7")
		fmt.Println(res.Allowed, err)
	}
	fmt.Println(store.Len(), "counter")
	// Output:
	// true <nil>
	// false <nil>
	// 1 counter
}
