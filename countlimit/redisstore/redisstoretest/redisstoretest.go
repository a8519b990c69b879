// Package redisstoretest hands your integration tests a Redis client on a
// clean keyspace of their own: a logical database (SELECT n) leased to the
// test, empty when handed over and flushed when the test ends.
//
//	func TestSignup(t *testing.T) {
//		rdb := redisstoretest.Client(t)
//		limiter := countlimit.New(redisstore.New(rdb))
//		// ... your code and limiter, on real Redis
//	}
//
//	func TestMain(m *testing.M) { redisstoretest.Main(m) }
//
// The server comes from, in order:
//
//  1. the URL in COUNTLIMIT_TEST_REDIS_URL, e.g. redis://127.0.0.1:6379/0;
//  2. else a server on the default local port that answers PING without a
//     password (redis://127.0.0.1:6379/0);
//  3. else a container started with testcontainers-go, where a Docker engine
//     answers, of the image in COUNTLIMIT_TEST_REDIS_IMAGE (default
//     redis:7-alpine, or any image that behaves like the official one);
//  4. else the test is skipped with a message naming both variables and
//     what was tried; with COUNTLIMIT_REQUIRE_BACKENDS=1 (for CI) it fails
//     instead.
//
// Leases: the databases handed out are 1 to N-1 (N is the server's
// "databases" setting, 16 by default), except the one the URL names, which
// is left to whoever else uses the server, and any that holds keys no test
// wrote: a database is handed out only when it is empty, or when a test
// claimed it before and died before giving it back. Two keys per database
// in use live in database 0: the lease "redisstoretest:lease:<n>", kept
// alive while the test runs and expiring a minute after its process dies,
// so parallel tests and test binaries sharing one server never share a
// database, and the claim "redisstoretest:claimed:<n>", which says the
// database was empty when a test took it; both go when the test ends and
// its database is flushed. A test waits (up to a minute) when every
// database is leased or someone else's. The server must be a single Redis,
// not a Cluster, which has only database 0.
//
// The container is started once per test binary and shared by its tests;
// Main removes it when they end. Without Main, Ryuk (testcontainers' reaper)
// removes it, where its image is present; where it is absent the helper
// disables Ryuk, so call Main, or remove leftovers by their label:
// docker rm -f $(docker ps -aq --filter label=org.countlimit.test).
// Only this package, not redisstore, imports testcontainers-go.
package redisstoretest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/internal/testkit/testenv"
	"github.com/countlimit/countlimit/internal/testkit/testenv/redisdb"
)

// Client returns a client on a logical database leased to t, empty. When t
// ends the client is closed, the database flushed and the lease released.
// Client skips t when no server is found (see the package comment).
func Client(t testing.TB) *redis.Client {
	t.Helper()
	c := lease(t).Client()
	t.Cleanup(func() { c.Close() })
	return c
}

// URL returns the URL of a logical database leased to t, empty, for code
// under test that opens its own client. When t ends the database is flushed
// and the lease released. URL skips t when no server is found.
func URL(t testing.TB) string {
	t.Helper()
	return lease(t).URL()
}

// Main runs the tests of a package (call it from TestMain), then removes
// the containers this package and pgstoretest started, and exits.
func Main(m *testing.M) { testenv.Main(m) }

// lease leases t a database, flushed, and registers its release.
func lease(t testing.TB) *redisdb.Lease {
	t.Helper()
	server := testenv.RedisURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := redisdb.Acquire(ctx, server)
	if err != nil {
		t.Fatalf("redisstoretest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Release(ctx); err != nil {
			t.Errorf("redisstoretest: %v", err)
		}
	})
	return l
}
