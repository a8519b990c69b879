package memstore_test

import (
	"context"
	"testing"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"

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
