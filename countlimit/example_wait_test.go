package countlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// A batch job may call a partner's API 2 times per 50 ms: Wait slows the
// loop down to that instead of failing it.
func ExampleLimiter_Wait() {
	store := memstore.New()
	defer store.Close()
	limiter := countlimit.New(store)
	api := countlimit.Rule{UseType: "partner.api", Limit: 2, Window: countlimit.Rolling(50 * time.Millisecond)}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	for i := range 3 {
		res, err := limiter.Wait(ctx, api, "batch-7")
		if err != nil {
			fmt.Println("wait:", err)
			return
		}
		fmt.Printf("call %d: allowed %v, used %d\n", i+1, res.Allowed, res.Used)
	}
	fmt.Println("the third waited for the next window:", time.Since(start) >= 50*time.Millisecond)
	// Output:
	// call 1: allowed true, used 1
	// call 2: allowed true, used 2
	// call 3: allowed true, used 1
	// the third waited for the next window: true
}
