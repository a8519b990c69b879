package model_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/testkit/model"
)

// Apply decides a request over the state a store keeps for each of its
// checks: it changes the Key in place and writes the check's State.
// Here 2 SMS codes per fixed 5 minutes, asked for 3 times.
func ExampleApply() {
	t0 := time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC)
	var key model.Key // nothing stored yet for ("sms.code", "+8618500000000")
	for i := range 3 {
		r := &driver.Request{
			Op:  driver.OpAllow,
			ID:  "+8618500000000",
			Now: t0.Add(time.Duration(i) * time.Minute),
			N:   1,
			Checks: []driver.Check{{
				UseType: "sms.code", Limit: 2, Kind: "fixed",
				Begin: t0, End: t0.Add(5 * time.Minute), // the window a counted event opens
			}},
		}
		model.Apply(r, []*model.Key{&key})
		st := r.Checks[0].State
		fmt.Printf("allowed %v, used %d; stored count %d, denied %d\n", st.Allowed, st.Used, key.Count, key.Denied)
	}
	// Output:
	// allowed true, used 1; stored count 1, denied 0
	// allowed true, used 2; stored count 2, denied 0
	// allowed false, used 2; stored count 2, denied 1
}

// mapStore is the smallest Store: its keys in a map under one lock, each
// request decided by Apply. A real store also keeps its keys beyond the
// process and drops those whose windows are over.
type mapStore struct {
	mu   sync.Mutex
	keys map[[2]string]*model.Key // by use type and id
}

func (s *mapStore) Do(_ context.Context, r *driver.Request) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]*model.Key, len(r.Checks))
	for i, c := range r.Checks {
		k := s.keys[[2]string{c.UseType, r.ID}]
		if k == nil {
			k = new(model.Key)
			s.keys[[2]string{c.UseType, r.ID}] = k
		}
		keys[i] = k
	}
	model.Apply(r, keys)
	return nil
}

// A Store that keeps its state and decides with Apply is a store a Limiter
// can use; storetest.Run is how a real one proves it meets the contract.
func Example_store() {
	limiter := countlimit.New(&mapStore{keys: map[[2]string]*model.Key{}})
	trial := countlimit.Rule{UseType: "trial.start", Limit: 1, Window: countlimit.Lifetime()}
	for range 2 {
		res, err := limiter.Allow(context.Background(), trial, "user-42")
		fmt.Println(res.Allowed, res.Used, err)
	}
	// Output:
	// true 1 <nil>
	// false 1 <nil>
}
