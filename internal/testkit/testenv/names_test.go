package testenv_test

import (
	"os"
	"strings"
	"testing"

	"github.com/countlimit/countlimit/internal/testkit/testenv"
)

// The public helpers' package docs name the variables testenv reads.
func TestPublicDocsNameTheVariables(t *testing.T) {
	for file, names := range map[string][]string{
		"../../../countlimit/pgstore/pgstoretest/pgstoretest.go":          {testenv.EnvPostgres, testenv.EnvPostgresImage, testenv.EnvRequire},
		"../../../countlimit/redisstore/redisstoretest/redisstoretest.go": {testenv.EnvRedis, testenv.EnvRedisImage, testenv.EnvRequire},
	} {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		doc, _, _ := strings.Cut(string(src), "\npackage ")
		for _, n := range names {
			if !strings.Contains(doc, n) {
				t.Errorf("%s: the package doc does not name %s, which testenv reads", file, n)
			}
		}
	}
}
