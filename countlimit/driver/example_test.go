package driver_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
)

// countingStore is a Store that counts the requests of each operation and
// hands them to another Store: a Store is anything with Do.
type countingStore struct {
	driver.Store
	mu  sync.Mutex
	ops map[driver.Op]int
}

func (s *countingStore) Do(ctx context.Context, r *driver.Request) error {
	s.mu.Lock()
	s.ops[r.Op]++
	s.mu.Unlock()
	return s.Store.Do(ctx, r)
}

// A Limiter takes any Store; storetest.Run is how a new one proves it
// meets the contract.
func Example_store() {
	store := &countingStore{Store: memstore.New(), ops: map[driver.Op]int{}}
	limiter := countlimit.New(store)
	trial := countlimit.Rule{UseType: "trial.start", Limit: 1, Window: countlimit.Lifetime()}
	for range 2 {
		res, err := limiter.Allow(context.Background(), trial, "user-42")
		fmt.Println(res.Allowed, res.Used, err)
	}
	fmt.Println(store.ops[driver.OpAllow], "requests of", driver.OpAllow)
	// Output:
	// true 1 <nil>
	// false 1 <nil>
	// 2 requests of allow
}
