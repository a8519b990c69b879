package pgstoretest_test

import (
	"testing"

	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

// Examples cannot skip: where there is no PostgreSQL they are left out, as
// the tests skip.
func TestMain(m *testing.M) { testenv.MainNeeding(m, "PostgreSQL", testenv.FindPostgres) }
