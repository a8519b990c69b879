package memstore_test

import (
	"context"
	"testing"

	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/internal/testkit/model"

	"github.com/countlimit/countlimit/internal/testkit/modeltest"
)

// TestModel holds memstore to the reference model (internal/testkit/modeltest).
func TestModel(t *testing.T) {
	s := memstore.New(memstore.WithJanitorInterval(0))
	defer s.Close()
	modeltest.Run(t, []modeltest.Path{{
		Name: "memstore",
		Do:   modeltest.Each(s.Do),
		Read: func(_ context.Context, ut, id string) (model.Key, error) {
			return memstore.KeyForTest(s, ut, id), nil
		},
	}})
}

// TestContract runs storetest's contract cases on memstore: seeded state,
// one request, and the stored state compared with model.Apply's.
func TestContract(t *testing.T) {
	s := memstore.New(memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() }) // after the parallel cases
	modeltest.RunContract(t, s, modeltest.Inspector{
		Read: func(_ context.Context, ut, id string) (model.Key, error) { return memstore.KeyForTest(s, ut, id), nil },
		Seed: func(_ context.Context, ut, id string, k model.Key) error {
			memstore.SeedForTest(s, ut, id, k)
			return nil
		},
	})
}

// FuzzAllowAll holds memstore to the reference model over fuzzed runs:
// AllowAll of any number of rules of every kind, limit and penalty,
// beside weighted AllowN, Peek, Refund and Reset (modeltest.Fuzz).
func FuzzAllowAll(f *testing.F) {
	// Three rules (the panic of issue 32), then 12 of every kind.
	f.Add([]byte{0, 1, 2, 0, 3, 2, 4, 2, 2, 1, 0, 3, 2})
	f.Add([]byte{1, 10, 11, 5, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5, 6, 6, 6, 7, 7, 7, 8, 1, 8, 10, 2, 9, 11, 3, 4, 12, 4, 0, 0, 0})
	// A weighted allow, then the clock past Amman's second midnight.
	f.Add([]byte{4, 0, 3, 2, 5, 1, 3, 0, 200, 1, 0, 4, 3, 4})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := memstore.New(memstore.WithJanitorInterval(0))
		defer s.Close()
		modeltest.Fuzz(t, modeltest.Path{
			Name: "memstore",
			Do:   modeltest.Each(s.Do),
			Read: func(_ context.Context, ut, id string) (model.Key, error) {
				return memstore.KeyForTest(s, ut, id), nil
			},
		}, data)
	})
}
