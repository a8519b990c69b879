package countlimit_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// An Observer of your own, for a metrics system other than Prometheus
// (package promlimit is the Prometheus one): count denials, and the store
// calls that failed.
func ExampleWithObserver() {
	store := memstore.New()
	defer store.Close()
	var denied, failed atomic.Int64 // the funcs run concurrently, on the callers' goroutines
	limiter := countlimit.New(store, countlimit.WithObserver(countlimit.Observer{
		Decided: func(d countlimit.Decision) {
			if !d.Allowed {
				denied.Add(1) // a real one would count by d.UseType, never by id
			}
		},
		StoreCalled: func(c countlimit.StoreCall) {
			if c.Failed {
				failed.Add(1)
			}
		},
	}))
	sms := countlimit.Rule{UseType: "sms.code", Limit: 2, Window: countlimit.Sliding(5 * time.Minute)}
	for range 5 {
		limiter.Allow(context.Background(), sms, "18500000000")
	}
	fmt.Println("denied:", denied.Load(), "store failures:", failed.Load())
	// Output:
	// denied: 3 store failures: 0
}
