package redisstoretest_test

import (
	"testing"

	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

// Examples cannot skip: where there is no Redis they are left out, as the
// tests skip.
func TestMain(m *testing.M) { testenv.MainNeeding(m, "Redis", testenv.FindRedis) }
