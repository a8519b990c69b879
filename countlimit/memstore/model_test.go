package memstore_test

import (
	"context"
	"testing"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/internal/model"
	"github.com/countlimit/countlimit/internal/modeltest"
)

// TestModel holds memstore to the reference model (internal/modeltest).
func TestModel(t *testing.T) {
	s := memstore.New(memstore.WithJanitorInterval(0))
	defer s.Close()
	modeltest.Run(t, []modeltest.Path{{
		Name: "memstore",
		Do:   s.Do,
		Read: func(_ context.Context, ut countlimit.UseType, id string) (model.Key, error) {
			return memstore.KeyForTest(s, ut, id), nil
		},
	}})
}
