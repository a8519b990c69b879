package storetest_test

import (
	"testing"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/countlimit/memstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
)

// A store's own test runs the suite on it; every Store newStore returns
// must share its state with the others (the same in-process store, or a
// second client on the same server). (Compiled, not run: Run needs a
// test's *testing.T; memstore's, pgstore's and redisstore's tests run it.)
func ExampleRun() {
	_ = func(t *testing.T) {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		storetest.Run(t, func(*testing.T) driver.Store { return s })
	}
}
