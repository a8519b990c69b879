package testenv_test

import (
	"testing"

	"github.com/countlimit/countlimit/countlimit/pgstore/pgstoretest"
	"github.com/countlimit/countlimit/countlimit/redisstore/redisstoretest"
	"github.com/countlimit/countlimit/internal/testenv"
)

// The public helpers document the variables testenv reads under their own
// names.
func TestPublicNamesAgree(t *testing.T) {
	for _, c := range []struct{ public, here string }{
		{pgstoretest.EnvURL, testenv.EnvPostgres},
		{pgstoretest.EnvImage, testenv.EnvPostgresImage},
		{pgstoretest.EnvRequire, testenv.EnvRequire},
		{redisstoretest.EnvURL, testenv.EnvRedis},
		{redisstoretest.EnvImage, testenv.EnvRedisImage},
		{redisstoretest.EnvRequire, testenv.EnvRequire},
	} {
		if c.public != c.here {
			t.Errorf("public name %q, testenv reads %q", c.public, c.here)
		}
	}
}
