package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/httplimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// stalledStore stands in for a database that has stopped answering.
type stalledStore struct{}

func (stalledStore) Do(ctx context.Context, _ *driver.Request) error {
	<-ctx.Done()
	return driver.Unavailable(ctx.Err())
}

// When the store stalls or fails, the Limiter's failure options decide how
// the middleware behaves: WithStoreTimeout turns a stall into a fast
// ErrUnavailable, WithCircuitBreaker stops calling a store that keeps
// failing, and WithFallback keeps limiting per process with a memstore
// (otherwise FailOpen or the default 503 applies).
func ExampleMiddleware_storeFailures() {
	local := memstore.New()
	defer local.Close()
	var timeouts, fallbacks atomic.Int64      // what an Observer sees of the failure options
	limiter := countlimit.New(stalledStore{}, // pgstore.New(pool) in real life
		countlimit.WithStoreTimeout(50*time.Millisecond),
		countlimit.WithCircuitBreaker(countlimit.CircuitBreaker{
			Failures: 2,
			CoolDown: time.Second,
			OnChange: func(from, to countlimit.BreakerState) { fmt.Printf("store breaker %v → %v\n", from, to) },
		}),
		countlimit.WithFallback(local),
		countlimit.WithObserver(countlimit.Observer{StoreCalled: func(c countlimit.StoreCall) {
			if c.TimedOut {
				timeouts.Add(1)
			}
			if c.Fallback && c.Err == nil {
				fallbacks.Add(1)
			}
		}}),
	)
	// Rolling: the minute starts at the first call, so a run that crosses a
	// clock minute still sees all three calls in one window.
	perMinute := countlimit.Rule{UseType: "api", Limit: 2, Window: countlimit.Rolling(time.Minute)}
	limit := httplimit.Middleware(limiter, httplimit.ClientIP(), httplimit.Rules(perMinute))
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))

	for range 3 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Println(rec.Code)
	}
	fmt.Printf("timeouts %d, answered by the fallback %d\n", timeouts.Load(), fallbacks.Load())
	// Output:
	// 200
	// store breaker closed → open
	// 200
	// 429
	// timeouts 2, answered by the fallback 3
}
