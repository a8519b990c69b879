package memstore_test

import (
	"context"
	"testing"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/storetest"

	"github.com/countlimit/countlimit/internal/modeltest"
)

// TestModel holds memstore to the reference model (internal/modeltest).
func TestModel(t *testing.T) {
	s := memstore.New(memstore.WithJanitorInterval(0))
	defer s.Close()
	modeltest.Run(t, []modeltest.Path{{
		Name: "memstore",
		Do:   modeltest.Each(s.Do),
		Read: func(_ context.Context, ut, id string) (driver.Key, error) {
			return memstore.KeyForTest(s, ut, id), nil
		},
	}})
}

// TestContract runs storetest's contract cases on memstore: seeded state,
// one request, and the stored state compared with driver.Apply's.
func TestContract(t *testing.T) {
	s := memstore.New(memstore.WithJanitorInterval(0))
	t.Cleanup(func() { s.Close() }) // after the parallel cases
	storetest.RunContract(t, s, storetest.Inspector{
		Read: func(_ context.Context, ut, id string) (driver.Key, error) { return memstore.KeyForTest(s, ut, id), nil },
		Seed: func(_ context.Context, ut, id string, k driver.Key) error {
			memstore.SeedForTest(s, ut, id, k)
			return nil
		},
	})
}
