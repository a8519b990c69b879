package countlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

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
